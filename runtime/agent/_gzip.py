"""A gzip stream for downloads that compresses only the pieces where compressing pays.

envd answers a download with ``Content-Encoding: gzip`` whenever the request accepts gzip, and
httpx (so the Python SDK) accepts it on every request by default (docs/PROTOCOL-NOTES.md). zlib
at its fastest level costs ~35 ms per MiB of incompressible data, which held every download of
such data (archives, images, models, random bytes) to ~30 MB/s while shrinking nothing.

So the stream is gzip (RFC 1952) around deflate (RFC 1951) built piece by piece. Each piece (a
read of the file, up to 1 MiB) is probed: its first ``SAMPLE`` bytes are deflated at level 1,
and only when that shrinks them below ``WORTH`` of their size is the piece deflated, ending with a
full flush; otherwise it goes out as *stored* blocks (the bytes as they are, behind a 5-byte
header per 64 KiB). Both end on a byte boundary with no reference back past their start (the
full flush resets the window), so the two kinds can follow each other in any order. The end is
an empty final stored block and the trailer (CRC-32, size mod 2^32). Any gzip reader takes it:
the kinds of block are deflate's own.

The same probe decides a whole download first (``pays_to_deflate`` on its first read): when
the start of the file does not deflate, the agent answers without any encoding (``_files``).

Sans-IO: ``GzipEncoder`` turns bytes into bytes; the caller reads the file and sends.
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["SAMPLE", "WORTH", "GzipEncoder", "pays_to_deflate"]

SAMPLE = 32 * 1024  # bytes of each piece deflated to decide: ~1 ms for incompressible data
WORTH = 0.9  # deflate a piece only when its sample shrinks below this share of its size

# ID1 ID2, CM deflate, no flags, no mtime, XFL 0, OS unknown (the bytes envd's Go gzip writes too).
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_STORED_MAX = 0xFFFF  # a stored block holds at most this many bytes
# An empty stored block with BFINAL set: header bits 1,00 padded to a byte, LEN 0, NLEN ~0.
_FINAL_BLOCK = b"\x01\x00\x00\xff\xff"


def _stored(data: bytes) -> bytes:
    """``data`` as non-final stored blocks, starting and ending on a byte boundary."""
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    for start in range(0, len(view), _STORED_MAX):
        piece = view[start : start + _STORED_MAX]
        parts += (struct.pack("<BHH", 0, len(piece), len(piece) ^ 0xFFFF), piece)
    return b"".join(parts)  # the one copy of the bytes


def pays_to_deflate(piece: bytes) -> bool:
    """Whether deflating ``piece`` would shrink it enough: its first ``SAMPLE`` bytes, at level 1."""
    sample = piece[:SAMPLE]
    probe = zlib.compressobj(1, zlib.DEFLATED, -15)
    return len(probe.compress(sample) + probe.flush()) < len(sample) * WORTH


class GzipEncoder:
    """Encodes a stream of pieces as one gzip member: ``header``, ``encode`` each, ``finish``."""

    header = _HEADER

    def __init__(self) -> None:
        self._crc = 0
        self._size = 0
        # Raw deflate (no zlib or gzip wrapper of its own): the wrapper is written here, around
        # blocks of both kinds, and the CRC covers every byte whichever kind carried it.
        self._deflate = zlib.compressobj(1, zlib.DEFLATED, -15)

    def encode(self, piece: bytes) -> bytes:
        """The deflate blocks for ``piece`` (stored where compressing would not pay)."""
        if not piece:
            return b""
        self._crc = zlib.crc32(piece, self._crc)
        self._size += len(piece)
        if pays_to_deflate(piece):
            return self._deflate.compress(piece) + self._deflate.flush(zlib.Z_FULL_FLUSH)
        return _stored(piece)

    def finish(self) -> bytes:
        """The final block and the trailer; the encoder is spent."""
        return _FINAL_BLOCK + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)
