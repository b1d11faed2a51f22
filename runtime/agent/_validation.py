"""Refuse undecodable Connect requests as ``invalid_argument``, as connect-go does.

connect-python reports a request message that does not decode as ``unknown`` (HTTP 500);
envd (connect-go) answers ``invalid_argument`` (HTTP 400, or an end-of-stream error on a
stream). This layer decodes each request message once, with the method's own input type,
before the service sees it, and answers the upstream way when it does not decode. The
body is then handed on unchanged.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import DecodeError, Message
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

_MAX_BODY = 4 * 1024 * 1024


def input_types(*files: FileDescriptor) -> dict[str, type[Message]]:
    """``/package.Service/Method`` → request message class, for every method of ``files``."""
    out: dict[str, type[Message]] = {}
    for file in files:
        for service in file.services_by_name.values():
            for method in service.methods:
                out[f"/{service.full_name}/{method.name}"] = message_factory.GetMessageClass(method.input_type)
    return out


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
    def __init__(self, app: ASGIApp, types: dict[str, type[Message]]) -> None:
        self._app = app
        self._types = types

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = self._types.get(scope["path"])
        if scope["type"] != "http" or scope["method"] != "POST" or kind is None:
            await self._app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        streaming = content_type.startswith("application/connect+")
        if content_type.endswith(("json", "proto")):
            body, more, consumed = await _read(receive)
            if not more:
                problem = _check(kind, body, content_type.endswith("json"), streaming, headers)
                if problem is not None:
                    await _refuse(send, problem, streaming)
                    return
            receive = _replay(consumed, receive)
        await self._app(scope, receive, send)


async def _read(receive: Receive) -> tuple[bytes, bool, list[AsgiMessage]]:
    """Up to ``_MAX_BODY`` of the body; ``more`` is True when it is longer (left to the app)."""
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
    encoding = headers.get("connect-content-encoding" if streaming else "content-encoding", "identity").lower()
    if not streaming:
        if encoding == "gzip":
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError, zlib.error):
                return None  # the app reports bad compression itself
        return _decode(kind, body, is_json)
    while body:  # enveloped messages: flags (1 byte), length (4 bytes), message
        if len(body) < 5:
            return None
        flags, size = body[0], struct.unpack(">I", body[1:5])[0]
        payload, body = body[5 : 5 + size], body[5 + size :]
        if flags & 0x01 and encoding == "gzip":
            try:
                payload = gzip.decompress(payload)
            except (OSError, EOFError, zlib.error):
                return None
        if not flags & 0x02 and (problem := _decode(kind, payload, is_json)) is not None:
            return problem
    return None


async def _refuse(send: Send, message: str, streaming: bool) -> None:
    error: dict[str, Any] = {"code": "invalid_argument", "message": message}
    if streaming:
        end = json.dumps({"error": error}).encode()
        body = b"\x02" + struct.pack(">I", len(end)) + end
        status, content_type = 200, b"application/connect+json"
    else:
        body, status, content_type = json.dumps(error).encode(), 400, b"application/json"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
