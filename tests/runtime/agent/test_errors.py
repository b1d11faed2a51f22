"""``_errors``: one table for both transports, and the exact bytes each rendering puts on the wire.

The answers pinned here are the ones the agent gave before its refusals were one type: the token
gate's and ``/files``' JSON, ``/init``'s plain text, ``/metrics``' bare 500, the gate's Connect-style
body for an unknown Basic user, and ``_validation``'s own Connect answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from connectrpc._protocol import ConnectWireError
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from starlette.responses import Response

from runtime.agent._errors import (
    AgentError,
    ConnectErrors,
    ErrorKind,
    HttpBody,
    connect_error,
    connect_error_body,
    http_response,
)
from runtime.agent._filesystem import FsError
from runtime.agent._inotify import WatcherError
from runtime.agent._paths import PathError
from runtime.agent._processes import ProcessError
from runtime.agent._state import UserError
from runtime.agent._validation import _refuse

_HTTP_ONLY = {ErrorKind.NOT_ACCEPTABLE, ErrorKind.CONTENT_TOO_LARGE, ErrorKind.INSUFFICIENT_STORAGE}


def test_a_kind_means_the_same_status_on_both_transports() -> None:
    """Where Connect knows the kind's code, the HTTP status is Connect's own for it."""
    for kind in ErrorKind:
        if kind in _HTTP_ONLY:
            continue
        assert ConnectWireError(kind.code, "", ()).to_http_status().code == kind.status, kind


def test_the_table() -> None:
    table = {kind.name: (kind.status, kind.code.value) for kind in ErrorKind}
    assert table == {
        "INVALID_ARGUMENT": (400, "invalid_argument"),
        "FAILED_PRECONDITION": (400, "failed_precondition"),
        "UNAUTHENTICATED": (401, "unauthenticated"),
        "PERMISSION_DENIED": (403, "permission_denied"),
        "NOT_FOUND": (404, "not_found"),
        "NOT_ACCEPTABLE": (406, "invalid_argument"),
        "ALREADY_EXISTS": (409, "already_exists"),
        "CONTENT_TOO_LARGE": (413, "resource_exhausted"),
        "RESOURCE_EXHAUSTED": (429, "resource_exhausted"),
        "UNKNOWN": (500, "unknown"),
        "INTERNAL": (500, "internal"),
        "UNIMPLEMENTED": (501, "unimplemented"),
        "DEADLINE_EXCEEDED": (504, "deadline_exceeded"),
        "INSUFFICIENT_STORAGE": (507, "resource_exhausted"),
    }


def test_the_domain_errors_are_agent_errors_with_their_kinds() -> None:
    assert UserError("u").kind is ErrorKind.UNAUTHENTICATED
    assert PathError("p").kind is ErrorKind.INVALID_ARGUMENT
    assert WatcherError("watcher error: w").kind is ErrorKind.INTERNAL
    assert ProcessError(ErrorKind.NOT_FOUND, "process with pid 1 not found").kind is ErrorKind.NOT_FOUND
    assert FsError(ErrorKind.ALREADY_EXISTS, "directory already exists: /x").kind is ErrorKind.ALREADY_EXISTS
    for exc in (UserError("m"), PathError("m"), WatcherError("m"), ProcessError(ErrorKind.UNKNOWN, "m")):
        assert isinstance(exc, AgentError)
        assert str(exc) == exc.message == "m"


def _headers(response: Response) -> list[tuple[str, str]]:
    return [(k.decode(), v.decode()) for k, v in response.raw_headers]


def test_json_body_of_files_and_the_token_gate() -> None:
    message = "unauthorized access, please provide a valid access token or method signing if supported"
    response = http_response(AgentError(ErrorKind.UNAUTHENTICATED, message), HttpBody.JSON)
    body = json.dumps({"code": 401, "message": message}).encode() + b"\n"
    assert (response.status_code, response.body) == (401, body)
    assert _headers(response) == [
        ("content-type", "application/json; charset=utf-8"),
        ("x-content-type-options", "nosniff"),
        ("content-length", str(len(body))),
    ]
    missing = http_response(AgentError(ErrorKind.NOT_FOUND, "path '/x' does not exist"), HttpBody.JSON)
    assert (missing.status_code, missing.body) == (404, b'{"code": 404, "message": "path \'/x\' does not exist"}\n')
    full = http_response(AgentError(ErrorKind.INSUFFICIENT_STORAGE, "not enough disk space available"), HttpBody.JSON)
    assert (full.status_code, json.loads(bytes(full.body))["code"]) == (507, 507)


def test_connect_json_body_of_the_gates_basic_user_check() -> None:
    response = http_response(UserError("invalid username: 'ghost'"), HttpBody.CONNECT_JSON)
    body = b'{"code": "unauthenticated", "message": "invalid username: \'ghost\'"}'
    assert (response.status_code, response.body) == (401, body)
    assert dict(_headers(response))["content-type"] == "application/json; charset=utf-8"
    assert dict(_headers(response))["x-content-type-options"] == "nosniff"


def test_text_body_of_init_and_the_router() -> None:
    response = http_response(AgentError(ErrorKind.UNAUTHENTICATED, "access token reset not authorized"), HttpBody.TEXT)
    assert (response.status_code, response.body) == (401, b"access token reset not authorized")
    assert _headers(response) == [("content-length", "33"), ("content-type", "text/plain; charset=utf-8")]
    bare = http_response(AgentError(ErrorKind.INVALID_ARGUMENT, ""), HttpBody.TEXT)
    assert (bare.status_code, bare.body) == (400, b"")
    # One error may carry its own form: the router's plain text inside a JSON route.
    binding = AgentError(ErrorKind.INVALID_ARGUMENT, "Invalid format", http_body=HttpBody.TEXT)
    assert http_response(binding, HttpBody.JSON).body == b"Invalid format"


def test_empty_body_of_metrics() -> None:
    response = http_response(AgentError(ErrorKind.INTERNAL, "not sent"), HttpBody.EMPTY, {"Cache-Control": "no-store"})
    assert (response.status_code, response.body) == (500, b"")
    assert _headers(response) == [("cache-control", "no-store"), ("content-length", "0")]


def test_connect_rendering() -> None:
    error = connect_error(FsError(ErrorKind.NOT_FOUND, "directory not found: /x"))
    assert (error.code, error.message) == (Code.NOT_FOUND, "directory not found: /x")
    assert connect_error_body(error) == {"code": "not_found", "message": "directory not found: /x"}


def _refusal(streaming: bool) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(_refuse(send, AgentError(ErrorKind.INVALID_ARGUMENT, "unmarshal into x: bad"), streaming))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], sent[0]["headers"], sent[1]["body"]


def test_validation_answers_as_connect_does() -> None:
    unary = b'{"code": "invalid_argument", "message": "unmarshal into x: bad"}'
    assert _refusal(streaming=False) == (
        400,
        [(b"content-type", b"application/json"), (b"content-length", str(len(unary)).encode())],
        unary,
    )
    end = b'{"error": {"code": "invalid_argument", "message": "unmarshal into x: bad"}}'
    framed = b"\x02" + len(end).to_bytes(4, "big") + end
    assert _refusal(streaming=True) == (
        200,
        [(b"content-type", b"application/connect+json"), (b"content-length", str(len(framed)).encode())],
        framed,
    )


def test_the_interceptor_translates_every_kind_of_method() -> None:
    interceptor = ConnectErrors()
    closed: list[str] = []
    ctx: Any = None  # the interceptor hands it on untouched

    async def unary(request: str, ctx: Any) -> str:
        raise PathError("cannot expand user-specific home dir")

    async def stream(request: str, ctx: Any) -> AsyncIterator[str]:
        try:
            yield "start"
            yield "more"
            raise AgentError(ErrorKind.DEADLINE_EXCEEDED, "context deadline exceeded")
        finally:
            closed.append(request)

    async def client_stream(request: AsyncIterator[str], ctx: Any) -> str:
        raise ProcessError(ErrorKind.FAILED_PRECONDITION, "data sent before start")

    async def requests() -> AsyncIterator[str]:
        yield "x"

    async def main() -> None:
        with pytest.raises(ConnectError) as unary_error:
            await interceptor.intercept_unary(unary, "r", ctx)
        assert (unary_error.value.code, unary_error.value.message) == (
            Code.INVALID_ARGUMENT,
            "cannot expand user-specific home dir",
        )
        with pytest.raises(ConnectError) as client_error:
            await interceptor.intercept_client_stream(client_stream, requests(), ctx)
        assert client_error.value.code is Code.FAILED_PRECONDITION
        seen: list[str] = []

        async def read_all() -> None:
            async for message in interceptor.intercept_server_stream(stream, "whole", ctx):
                seen.append(message)

        with pytest.raises(ConnectError) as stream_error:
            await read_all()
        assert (seen, stream_error.value.code, closed) == (["start", "more"], Code.DEADLINE_EXCEEDED, ["whole"])
        # A client that goes away: closing the outer stream runs the service's finally at once.
        outer = interceptor.intercept_server_stream(stream, "abandoned", ctx)
        assert await anext(outer) == "start"
        await outer.aclose()  # type: ignore[attr-defined]
        assert closed == ["whole", "abandoned"]
        # Anything else is left to connect-python, as before (``unknown``).
        other = interceptor.intercept_server_stream(_boom, "x", ctx)
        with pytest.raises(RuntimeError):
            await anext(other)

    asyncio.run(main())


async def _boom(request: str, ctx: Any) -> AsyncIterator[str]:
    raise RuntimeError("not ours")
    yield request  # pragma: no cover - makes this a generator
