"""``runtime.agent._gzip``: one gzip stream, deflated only where that pays, read back by any reader."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.agent._gzip import SAMPLE, GzipEncoder

MIB = 1 << 20


def _encode(pieces: list[bytes]) -> bytes:
    encoder = GzipEncoder()
    return encoder.header + b"".join(encoder.encode(piece) for piece in pieces) + encoder.finish()


def _inflate_streaming(data: bytes) -> bytes:
    """As httpx decodes a gzip body: zlib with a gzip header, fed in small reads."""
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
    out = b"".join(decoder.decompress(data[i : i + 4096]) for i in range(0, len(data), 4096))
    out += decoder.flush()
    assert decoder.eof, "the stream ends where the trailer says"
    assert not decoder.unused_data
    return out


def test_incompressible_pieces_are_stored_and_cost_a_few_bytes_per_64_kib() -> None:
    pieces = [os.urandom(MIB) for _ in range(3)]
    encoded = _encode(pieces)
    assert gzip.decompress(encoded) == b"".join(pieces)
    # 17 stored blocks (at most 65535 bytes each) of 5 header bytes per MiB, the 10-byte header,
    # the final block and the trailer.
    assert len(encoded) == 3 * MIB + 3 * 17 * 5 + 10 + 5 + 8


def test_compressible_pieces_are_still_deflated() -> None:
    text = b"the same line of a log file, again and again\n" * 20000
    encoded = _encode([text[:MIB], text[MIB:]])
    assert gzip.decompress(encoded) == text
    assert len(encoded) < len(text) / 20


def test_stored_and_deflated_pieces_follow_each_other_in_any_order() -> None:
    # Zeros deflate; random bytes are stored: the full flush keeps the deflated pieces from
    # referring back into the stored bytes around them, which a reader would resolve wrongly.
    zeros, noise = bytes(MIB), os.urandom(MIB)
    pieces = [zeros, noise, zeros, zeros, noise, noise, zeros]
    encoded = _encode(pieces)
    assert _inflate_streaming(encoded) == b"".join(pieces)
    assert len(encoded) < 3 * MIB + 64 * 1024, "the zero pieces shrank"


def test_an_empty_stream_and_empty_pieces() -> None:
    assert gzip.decompress(_encode([])) == b""
    assert gzip.decompress(_encode([b"", b"x", b""])) == b"x"


def test_the_trailer_holds_the_crc_and_the_size() -> None:
    data = os.urandom(SAMPLE * 3)
    encoded = _encode([data])
    assert encoded[-8:-4] == zlib.crc32(data).to_bytes(4, "little")
    assert encoded[-4:] == len(data).to_bytes(4, "little")


def test_a_reader_sees_a_corrupted_stored_byte() -> None:
    data = os.urandom(100_000)
    encoded = bytearray(_encode([data]))
    encoded[50_000] ^= 0xFF  # inside the first stored block
    with pytest.raises((OSError, zlib.error)):
        gzip.decompress(bytes(encoded))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=70_000),
            st.integers(0, 200_000).map(lambda n: bytes(n % 251 for n in range(n))),
            st.integers(0, 100_000).map(os.urandom),
        ),
        max_size=6,
    )
)
def test_any_pieces_round_trip(pieces: list[bytes]) -> None:
    assert _inflate_streaming(_encode(pieces)) == b"".join(pieces)
