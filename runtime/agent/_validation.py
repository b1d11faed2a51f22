"""Refuse undecodable Connect requests as ``invalid_argument``, as connect-go does.

connect-python reports a request message that does not decode as ``unknown`` (HTTP 500);
envd (connect-go) answers ``invalid_argument`` (HTTP 400, or an end-of-stream error on a
stream). This layer decodes each request message once, with the method's own input type,
before the service sees it, and answers the upstream way when it does not decode. The
body is then handed on unchanged. The refusal is the one any ``AgentError`` of kind
``INVALID_ARGUMENT`` gets (``_errors``), written here because connect-python never sees it.

It also bounds what a request makes the agent hold (``_limits``): a request of a single
message (every method but the client streams) is refused with ``resource_exhausted`` as soon
as it is longer than ``MAX_MESSAGE_BYTES``, before the rest is read, and gzip is inflated only
up to that size. A client stream's envelopes are checked as they arrive: one that announces
more is refused before it is buffered. connect-python compares sizes only after reading and
inflating a whole message.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import DecodeError, Message
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from contract.protocol import (
    CONNECT_CONTENT_ENCODING_HEADER,
    CONNECT_JSON,
    CONNECT_STREAM_JSON,
    CONNECT_STREAM_PREFIX,
    ENVELOPE_HEADER_SIZE,
    FLAG_END_STREAM,
    Envelope,
    encode_envelope,
    split_envelope,
)

from ._errors import AgentError, ErrorKind, connect_error, connect_error_body
from ._limits import MAX_MESSAGE_BYTES, MESSAGE_TOO_LARGE, InflateLimitError, inflate

# A single-message body: the message and its envelope (streams), nothing more.
_MAX_BODY = MAX_MESSAGE_BYTES + ENVELOPE_HEADER_SIZE


def input_types(*files: FileDescriptor) -> dict[str, type[Message]]:
    """``/package.Service/Method`` → request message class, for every method of ``files``."""
    out: dict[str, type[Message]] = {}
    for file in files:
        for service in file.services_by_name.values():
            for method in service.methods:
                out[f"/{service.full_name}/{method.name}"] = message_factory.GetMessageClass(method.input_type)
    return out


def client_streaming(*files: FileDescriptor) -> frozenset[str]:
    """The paths of the methods whose request is a stream of messages (``StreamInput``)."""
    return frozenset(
        f"/{service.full_name}/{method.name}"
        for file in files
        for service in file.services_by_name.values()
        for method in service.methods
        if method.client_streaming
    )


def _decode(kind: type[Message], data: bytes, is_json: bool) -> str | None:
    try:
        if is_json:
            json_format.Parse(data.decode("utf-8"), kind(), ignore_unknown_fields=True)
        else:
            kind().ParseFromString(data)
    except (json_format.ParseError, DecodeError, UnicodeDecodeError, ValueError) as exc:
        return f"unmarshal into {kind.DESCRIPTOR.full_name}: {exc}"
    return None


class RequestValidation:
    def __init__(self, app: ASGIApp, types: dict[str, type[Message]], streams: Iterable[str] = ()) -> None:
        self._app = app
        self._types = types
        self._streams = frozenset(streams)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = self._types.get(scope["path"])
        if scope["type"] != "http" or scope["method"] != "POST" or kind is None:
            await self._app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        streaming = content_type.startswith(CONNECT_STREAM_PREFIX)
        if scope["path"] in self._streams:
            await self._app(scope, _bounded_envelopes(receive), send)
            return
        body, more, consumed = await _read(receive)
        if more and consumed[-1]["type"] == "http.request":
            await _refuse(send, AgentError(ErrorKind.RESOURCE_EXHAUSTED, MESSAGE_TOO_LARGE), streaming)
            return
        if not more and content_type.endswith(("json", "proto")):
            error: AgentError | None = None
            try:
                problem = _check(kind, body, content_type.endswith("json"), streaming, headers)
            except InflateLimitError:
                error = AgentError(ErrorKind.RESOURCE_EXHAUSTED, MESSAGE_TOO_LARGE)
            else:
                error = None if problem is None else AgentError(ErrorKind.INVALID_ARGUMENT, problem)
            if error is not None:
                await _refuse(send, error, streaming)
                return
        await self._app(scope, _replay(consumed, receive), send)


def _bounded_envelopes(receive: Receive) -> Receive:
    """``receive`` that fails with ``resource_exhausted`` once an envelope announces too much.

    Only the headers are looked at (the body passes through as it came), so the check holds
    however the body is split into chunks. connect-python answers the error on the stream.
    """
    header = bytearray()  # of the envelope being read
    skip = 0  # payload bytes of the current envelope still to pass

    async def bounded() -> AsgiMessage:
        nonlocal skip
        message = await receive()
        if message["type"] != "http.request":
            return message
        view = memoryview(message.get("body", b""))
        while view:
            if skip:
                step = min(skip, len(view))
                skip -= step
                view = view[step:]
                continue
            need = ENVELOPE_HEADER_SIZE - len(header)
            header.extend(view[:need])
            view = view[need:]
            if len(header) < ENVELOPE_HEADER_SIZE:
                break
            skip = int.from_bytes(header[1:], "big")
            header.clear()
            if skip > MAX_MESSAGE_BYTES:
                raise ConnectError(Code.RESOURCE_EXHAUSTED, MESSAGE_TOO_LARGE)
        return message

    return bounded


async def _read(receive: Receive) -> tuple[bytes, bool, list[AsgiMessage]]:
    """Up to ``_MAX_BODY`` of the body; ``more`` is True when it is longer (or the client left)."""
    consumed: list[AsgiMessage] = []
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        consumed.append(message)
        if message["type"] != "http.request":
            return b"", True, consumed
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False, consumed
        if size > _MAX_BODY:
            return b"", True, consumed


def _replay(consumed: list[AsgiMessage], receive: Receive) -> Receive:
    pending = list(consumed)

    async def replay() -> AsgiMessage:
        return pending.pop(0) if pending else await receive()

    return replay


def _check(kind: type[Message], body: bytes, is_json: bool, streaming: bool, headers: dict[str, str]) -> str | None:
    name = CONNECT_CONTENT_ENCODING_HEADER if streaming else "Content-Encoding"
    encoding = headers.get(name.lower(), "identity").lower()
    if not streaming:
        if encoding == "gzip":
            try:
                body = inflate(body, MAX_MESSAGE_BYTES)
            except (EOFError, zlib.error):
                return None  # the app reports bad compression itself
        return _decode(kind, body, is_json)
    while body:
        envelope, rest = split_envelope(body)
        if envelope is None:
            if len(body) < ENVELOPE_HEADER_SIZE:
                return None
            # A last message shorter than its envelope says is still checked, as far as it goes.
            envelope, rest = Envelope(body[0], body[ENVELOPE_HEADER_SIZE:]), b""
        body = rest
        payload = envelope.payload
        if envelope.compressed and encoding == "gzip":
            try:
                payload = inflate(payload, MAX_MESSAGE_BYTES)
            except (EOFError, zlib.error):
                return None
        if not envelope.end_stream and (problem := _decode(kind, payload, is_json)) is not None:
            return problem
    return None


async def _refuse(send: Send, error: AgentError, streaming: bool) -> None:
    """Connect's answer to ``error``: a unary error body, or a stream that is only its error end."""
    wire = connect_error_body(connect_error(error))
    if streaming:
        body = encode_envelope(json.dumps({"error": wire}).encode(), flags=FLAG_END_STREAM)
        status, content_type = 200, CONNECT_STREAM_JSON
    else:
        body, status, content_type = json.dumps(wire).encode(), error.kind.status, CONNECT_JSON
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
