"""The agent's bounds on what one request may make it hold, and the bounded gzip it inflates with.

envd (Go) bounds little itself: connect-go reads messages of any size, a polling watcher's list
is unbounded, ListDir has no depth or entry cap (docs/PROTOCOL-NOTES.md, "Limits"). A tenant's
request must not be able to grow the agent's memory without bound or stall its event loop,
so each buffer has a cap here, chosen well above what the official clients send:

- ``MAX_MESSAGE_BYTES``: one Connect request message, after decompression. The clients' biggest
  messages are ``SendInput`` stdin chunks (the caller's data, base64 in JSON); 16 MiB is four
  times gRPC's default. Over it: ``resource_exhausted`` (connect-go's and connect-python's code).
- ``MAX_INIT_BODY``: a ``POST /init`` body (token, environment, CA bundle): 413.
- ``INFLATE_STEP``: the most one gzip step of an upload may produce; the file itself is bounded
  by the disk (507), not here, so a legitimate upload of a large compressible file still works.
- ``MAX_UPLOAD_PARTS``: parts of one multipart upload (each may be a file): 413. Part headers are
  bounded by python-multipart (about 4 KiB each, 8 per part: 400).
- ``MAX_LIST_ENTRIES``: entries of one ``ListDir`` answer: ``resource_exhausted``.
- ``MAX_POLLED_EVENTS``: undelivered events of a polling watcher, the kernel's default
  ``max_queued_events``; past it the watcher fails as an inotify queue overflow does.
- ``WATCH_SLICE``: directories a recursive watch adds per turn of the event loop.
"""

from __future__ import annotations

import zlib
from typing import Final

from connectrpc.code import Code
from connectrpc.errors import ConnectError

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
MAX_INIT_BODY: Final = 4 * 1024 * 1024
INFLATE_STEP: Final = 1024 * 1024
MAX_UPLOAD_PARTS: Final = 10_000
MAX_LIST_ENTRIES: Final = 100_000
MAX_POLLED_EVENTS: Final = 16_384
WATCH_SLICE: Final = 256

MESSAGE_TOO_LARGE: Final = f"message is larger than configured max {MAX_MESSAGE_BYTES}"


class InflateLimitError(ValueError):
    """The data inflates to more than the limit."""


def inflate(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    """gunzip ``data`` whole, refusing (``InflateLimitError``) output over ``limit`` bytes.

    Never holds more than ``limit`` + one step of output, whatever the ratio (a gzip bomb
    expands about 1000:1). Bad gzip raises ``zlib.error``/``EOFError`` as ``gzip`` does.
    """
    decompressor = zlib.decompressobj(31)
    out = decompressor.decompress(data, limit + 1)
    if len(out) > limit or decompressor.unconsumed_tail:
        raise InflateLimitError(f"inflates to more than {limit} bytes")
    if not decompressor.eof:
        raise EOFError("compressed data ended before the end-of-stream marker")
    return out


class BoundedGzip:
    """connect-python's gzip ``Compression`` with inflation capped at ``MAX_MESSAGE_BYTES``.

    connect-python inflates a whole message before it compares the size with
    ``read_max_bytes``; this one stops at the cap and answers ``resource_exhausted`` instead.
    """

    def name(self) -> str:
        return "gzip"

    def compress(self, data: bytes | bytearray | memoryview) -> bytes:
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        return compressor.compress(data) + compressor.flush()

    def decompress(self, data: bytes | bytearray | memoryview) -> bytes:
        try:
            return inflate(data, MAX_MESSAGE_BYTES)
        except InflateLimitError:
            raise ConnectError(Code.RESOURCE_EXHAUSTED, MESSAGE_TOO_LARGE) from None
        except (zlib.error, EOFError) as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"error decompressing message: {exc}") from None
