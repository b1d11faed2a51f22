"""Canonical form of one recorded request: what a client sent, independent of the run and machine.

See ``_recorder`` for the line format. Pure functions: headers (secrets redacted, volatile values
replaced), bodies (JSON re-serialized with sorted keys, Connect envelopes decoded, multipart
parts reduced to digests, timestamps normalized).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from email.message import Message as EmailMessage
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value
from typing import Any
from urllib.parse import parse_qsl

from contract import protocol
from contract.protocol import ACCESS_TOKEN_HEADER, API_KEY_HEADER, CONNECT_STREAM_PREFIX, TRAFFIC_TOKEN_HEADER

# Fixed values the fixture answers with: the same in every run, so the clients send the same.

__all__ = [
    "END_STREAM",
    "boundary_of",
    "canonical_body",
    "canonical_headers",
    "canonical_request",
    "decode_envelopes",
    "dumps_line",
    "encode_envelope",
    "multipart_parts",
]

_REDACTED = {
    API_KEY_HEADER.lower(): "<key>",
    ACCESS_TOKEN_HEADER.lower(): "<token>",
    TRAFFIC_TOKEN_HEADER.lower(): "<token>",
    "x-supabase-token": "<token>",
}
# Values that differ between machines or runs while the request means the same.
_VOLATILE = {"host": "<host>", "content-length": "<length>", "lang_version": "<runtime version>", "system": "<system>"}
_BOUNDARY = re.compile(r"(boundary=)(\"[^\"]*\"|[^;\s]+)", re.IGNORECASE)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")
END_STREAM = protocol.FLAG_END_STREAM


# --- canonicalization (pure) ---


def dumps_line(line: Mapping[str, Any]) -> str:
    """One canonical JSON line: sorted keys, no insignificant whitespace, UTF-8 kept readable."""
    return json.dumps(line, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _normalize(value: Any) -> Any:
    if isinstance(value, str):
        return "<timestamp>" if _TIMESTAMP.fullmatch(value) else value
    if isinstance(value, list):
        return [_normalize(item) for item in value]
    if isinstance(value, dict):
        return {key: _normalize(item) for key, item in value.items()}
    return value


def _digest(data: bytes) -> dict[str, Any]:
    return {"length": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _json(data: bytes) -> Any:
    """Parsed and normalized JSON, or the digest of bytes that are not JSON (itself drift worth seeing)."""
    try:
        return _normalize(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"not_json": _digest(data)}


def decode_envelopes(data: bytes) -> list[dict[str, Any]]:
    """Connect envelopes (``contract.protocol``) with their JSON messages parsed; a truncated end becomes a digest."""
    frames: list[dict[str, Any]] = []
    while data:
        envelope, data = protocol.split_envelope(data)
        if envelope is None:  # what is left is not a whole envelope
            if len(data) < protocol.ENVELOPE_HEADER_SIZE:
                frames.append({"truncated": _digest(data)})
            else:
                frames.append({"flags": data[0], "truncated": _digest(data[protocol.ENVELOPE_HEADER_SIZE :])})
            break
        message = envelope.payload
        if envelope.compressed:
            try:
                message = gzip.decompress(message)
            except (OSError, EOFError):
                frames.append({"flags": envelope.flags, "message": {"not_gzip": _digest(message)}})
                continue
        frames.append({"flags": envelope.flags, "message": _json(message)})
    return frames


def encode_envelope(message: bytes, flags: int = 0) -> bytes:
    """One Connect envelope around ``message``."""
    return protocol.encode_envelope(message, flags=flags)


def boundary_of(content_type: str) -> bytes | None:
    match = _BOUNDARY.search(content_type)
    return match[2].strip('"').encode("latin-1") if match else None


@dataclasses.dataclass(frozen=True)
class _Part:
    name: str | None
    filename: str | None
    content_type: str | None
    content: bytes


def _disposition(headers: EmailMessage, name: str) -> str | None:
    value = headers.get_param(name, header="content-disposition")
    return None if value is None else collapse_rfc2231_value(value)


def multipart_parts(data: bytes, boundary: bytes) -> list[_Part]:
    """The parts of a multipart body: Content-Disposition name and filename, Content-Type, content."""
    parts = []
    delimiter = b"--" + boundary
    # The first chunk is the preamble, the last starts with the closing "--".
    for chunk in data.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, content = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n").partition(b"\r\n\r\n")
        headers = BytesHeaderParser().parsebytes(head + b"\r\n\r\n")
        name, filename = _disposition(headers, "name"), _disposition(headers, "filename")
        parts.append(_Part(name, filename, headers.get("content-type"), content))
    return parts


def canonical_body(content_type: str, body: bytes, content_encoding: str = "") -> dict[str, Any] | None:
    """A body reduced to what it means (see the module docstring); ``None`` for an empty body."""
    if content_encoding.strip().lower() == "gzip":
        try:
            body = gzip.decompress(body)  # a gzip header carries a time stamp: compare what it holds
        except (OSError, EOFError):
            return {"not_gzip": _digest(body)}
    if not body:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media.startswith(CONNECT_STREAM_PREFIX):
        return {"connect": decode_envelopes(body)}
    if media == "application/json" or media.endswith("+json"):
        return {"json": _json(body)}
    boundary = boundary_of(content_type)
    if media.startswith("multipart/") and boundary:
        return {
            "multipart": [
                {
                    "name": part.name,
                    "filename": part.filename,
                    "content_type": part.content_type,
                    **_digest(part.content),
                }
                for part in multipart_parts(body, boundary)
            ]
        }
    return _digest(body)


def canonical_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Every header by lower-case name; secrets, volatile values and boundaries replaced."""
    out: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.lower()
        if name in _REDACTED:
            value = _REDACTED[name]
        elif name in _VOLATILE:
            value = _VOLATILE[name]
        elif name == "authorization":
            # The scheme is a wire fact; the credentials are not for a fixture file.
            value = raw_value.split(" ", 1)[0] + " <credentials>"
        elif name == "content-type":
            value = _BOUNDARY.sub(r"\1<boundary>", raw_value)
        else:
            value = raw_value
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def canonical_request(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    status: int | None = None,
) -> dict[str, Any]:
    """The canonical line of one request; ``target`` is the path plus ``?query`` exactly as sent."""
    path, _, query_string = target.partition("?")
    query: dict[str, list[Any]] = {}
    for key, value in parse_qsl(query_string, keep_blank_values=True):
        query.setdefault(key, []).append(_normalize(value))
    lowered = {name.lower(): value for name, value in headers}
    line: dict[str, Any] = {
        "method": method.upper(),
        "path": path,
        "query": dict(sorted(query.items())),
        "headers": canonical_headers(headers),
        "body": canonical_body(lowered.get("content-type", ""), body, lowered.get("content-encoding", "")),
    }
    if status is not None:
        line["status"] = status
    return line
