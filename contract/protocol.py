"""Protocol facts every part shares: ports, header names, Connect content types and envelopes.

The agent, the reference server, the fixture server and the harness all speak the same wire
protocol; each fact lives here once so that they cannot drift apart. ``docs/PROTOCOL-NOTES.md``
explains what each one means and where the clients rely on it. This module imports only the
standard library, so the agent inside a sandbox can use it as cheaply as its generated code.

Connect's streaming framing (what ``application/connect+json`` and ``+proto`` bodies are made
of): a sequence of envelopes, each a flags byte, a 4-byte big-endian length and that many bytes
of message. Flag ``0x01`` marks a compressed message (``Connect-Content-Encoding``), flag
``0x02`` the end-of-stream envelope, whose message is JSON (``{}`` or ``{"error": ...}``)
whatever the codec.

Exceptions::

    EnvelopeError   a streaming body that is not a whole number of well-formed envelopes
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ACCESS_TOKEN_HEADER",
    "API_KEY_HEADER",
    "CONNECT_CONTENT_ENCODING_HEADER",
    "CONNECT_JSON",
    "CONNECT_PROTO",
    "CONNECT_PROTOCOL_VERSION",
    "CONNECT_PROTOCOL_VERSION_HEADER",
    "CONNECT_STREAM_JSON",
    "CONNECT_STREAM_PREFIX",
    "CONNECT_STREAM_PROTO",
    "ENVD_PORT",
    "ENVELOPE_HEADER_SIZE",
    "FLAG_COMPRESSED",
    "FLAG_END_STREAM",
    "IDEMPOTENCY_KEY_HEADER",
    "INTERPRETER_PORT",
    "NEXT_TOKEN_HEADER",
    "RETRY_AFTER_HEADER",
    "SANDBOX_ID_HEADER",
    "SANDBOX_PORT_HEADER",
    "SHOULD_RETRY_HEADER",
    "TRAFFIC_TOKEN_HEADER",
    "Envelope",
    "EnvelopeError",
    "decode_envelopes",
    "encode_envelope",
    "split_envelope",
]

# -- ports inside every sandbox ------------------------------------------------------------
ENVD_PORT: Final = 49983  # the agent (envd): HTTP routes and the process/filesystem Connect services
INTERPRETER_PORT: Final = 49999  # the Code Interpreter server of code-interpreter templates

# -- header names (HTTP header names are case-insensitive; these are the spellings clients send) --
# (the S105 exceptions: these are names of headers that carry tokens, not tokens)
API_KEY_HEADER: Final = "X-API-Key"  # control plane: the caller's API key
NEXT_TOKEN_HEADER: Final = "x-next-token"  # noqa: S105 - control plane: the cursor of the next list page
IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"  # control plane: names a create, so a retry makes it once
SHOULD_RETRY_HEADER: Final = "Should-Retry"  # control plane answers: "true"/"false", whether a retry may help
RETRY_AFTER_HEADER: Final = "Retry-After"  # control plane answers: whole seconds to wait before that retry
ACCESS_TOKEN_HEADER: Final = "X-Access-Token"  # noqa: S105 - envd: the sandbox's envd access token
TRAFFIC_TOKEN_HEADER: Final = "E2B-Traffic-Access-Token"  # noqa: S105 - edge: user ports of private sandboxes
SANDBOX_ID_HEADER: Final = "E2b-Sandbox-Id"  # edge: which sandbox a request on the shared host is for
SANDBOX_PORT_HEADER: Final = "E2b-Sandbox-Port"  # edge: which port of it
CONNECT_PROTOCOL_VERSION_HEADER: Final = "Connect-Protocol-Version"
CONNECT_PROTOCOL_VERSION: Final = "1"
CONNECT_CONTENT_ENCODING_HEADER: Final = "Connect-Content-Encoding"  # streaming bodies' compression

# -- Connect content types ------------------------------------------------------------------
CONNECT_JSON: Final = "application/json"  # unary, JSON codec
CONNECT_PROTO: Final = "application/proto"  # unary, binary protobuf codec
CONNECT_STREAM_PREFIX: Final = "application/connect+"
CONNECT_STREAM_JSON: Final = "application/connect+json"
CONNECT_STREAM_PROTO: Final = "application/connect+proto"

# -- Connect envelopes ----------------------------------------------------------------------
FLAG_COMPRESSED: Final = 0x01
FLAG_END_STREAM: Final = 0x02
ENVELOPE_HEADER_SIZE: Final = 5
_HEADER = struct.Struct(">BI")


class EnvelopeError(ValueError):
    """A streaming body that is not a whole number of well-formed envelopes."""


@dataclass(frozen=True)
class Envelope:
    flags: int
    payload: bytes

    @property
    def end_stream(self) -> bool:
        return bool(self.flags & FLAG_END_STREAM)

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)


def encode_envelope(payload: bytes, *, flags: int = 0) -> bytes:
    """One envelope: flags, big-endian length, payload."""
    if not 0 <= flags <= 0xFF:
        raise ValueError(f"envelope flags are one byte, got {flags}")
    return _HEADER.pack(flags, len(payload)) + payload


def split_envelope(buffer: bytes) -> tuple[Envelope | None, bytes]:
    """The first whole envelope of ``buffer`` and what follows it; ``(None, buffer)`` while incomplete.

    For reading a stream as it arrives: append each chunk, split until ``None``.
    """
    if len(buffer) < ENVELOPE_HEADER_SIZE:
        return None, buffer
    flags, length = _HEADER.unpack_from(buffer)
    end = ENVELOPE_HEADER_SIZE + length
    if len(buffer) < end:
        return None, buffer
    return Envelope(flags, bytes(buffer[ENVELOPE_HEADER_SIZE:end])), bytes(buffer[end:])


def decode_envelopes(body: bytes) -> list[Envelope]:
    """Every envelope of a complete streaming body; ``EnvelopeError`` names the byte where it broke."""
    envelopes: list[Envelope] = []
    offset = 0
    while offset < len(body):
        if len(body) - offset < ENVELOPE_HEADER_SIZE:
            raise EnvelopeError(f"a truncated Connect envelope header at byte {offset} of {len(body)}")
        flags, length = _HEADER.unpack_from(body, offset)
        start, offset = offset + ENVELOPE_HEADER_SIZE, offset + ENVELOPE_HEADER_SIZE + length
        if offset > len(body):
            raise EnvelopeError(f"a truncated Connect envelope at byte {start - ENVELOPE_HEADER_SIZE} of {len(body)}")
        envelopes.append(Envelope(flags, bytes(body[start:offset])))
    return envelopes
