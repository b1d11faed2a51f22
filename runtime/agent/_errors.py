"""The agent's one error type and its two renderings: an HTTP answer and a Connect error.

Everything the agent refuses is an ``AgentError``: a kind and a message. The kind alone
decides the HTTP status of an envd HTTP route and the Connect code of an RPC (the table is
``ErrorKind`` itself); the message is sent as it is. Domain errors (``ProcessError``,
``FsError``, ``PathError``, ``UserError``, ``WatcherError``) are subclasses, so a handler lets
them propagate and the transport renders them:

- HTTP routes: ``http_response`` (routes name their body form with ``answers_errors``; the
  token gate calls it directly). The form is the route's, as envd answers it (``HttpBody``).
- Connect services: ``ConnectErrors``, an interceptor of every method, turns an
  ``AgentError`` into ``connect_error(exc)``; ``connect_error_body`` is what Connect puts on
  the wire for one (``_validation`` writes the same answer itself, ahead of connect-python).

The HTTP statuses of kinds that Connect also knows are Connect's own for their code, so a
kind means the same on both transports. ``NOT_ACCEPTABLE``, ``CONTENT_TOO_LARGE`` and
``INSUFFICIENT_STORAGE`` are answered by the HTTP routes only; their Connect codes are the nearest ones.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from starlette.requests import Request
from starlette.responses import Response

__all__ = [
    "AgentError",
    "ConnectErrors",
    "ErrorKind",
    "HttpBody",
    "answers_errors",
    "connect_error",
    "connect_error_body",
    "http_response",
]

REQ = TypeVar("REQ")
RES = TypeVar("RES")


@enum.unique
class ErrorKind(enum.Enum):
    """What went wrong, as both transports say it: ``(HTTP status, Connect code)``."""

    INVALID_ARGUMENT = (400, Code.INVALID_ARGUMENT)
    FAILED_PRECONDITION = (400, Code.FAILED_PRECONDITION)
    UNAUTHENTICATED = (401, Code.UNAUTHENTICATED)
    PERMISSION_DENIED = (403, Code.PERMISSION_DENIED)
    NOT_FOUND = (404, Code.NOT_FOUND)
    NOT_ACCEPTABLE = (406, Code.INVALID_ARGUMENT)  # /files: no acceptable Content-Encoding
    ALREADY_EXISTS = (409, Code.ALREADY_EXISTS)
    CONTENT_TOO_LARGE = (413, Code.RESOURCE_EXHAUSTED)  # HTTP routes: a body or part over a size limit
    RESOURCE_EXHAUSTED = (429, Code.RESOURCE_EXHAUSTED)  # a count or queue limit (_limits)
    UNKNOWN = (500, Code.UNKNOWN)
    INTERNAL = (500, Code.INTERNAL)
    UNIMPLEMENTED = (501, Code.UNIMPLEMENTED)
    DEADLINE_EXCEEDED = (504, Code.DEADLINE_EXCEEDED)
    INSUFFICIENT_STORAGE = (507, Code.RESOURCE_EXHAUSTED)  # /files: no space or inodes left

    def __init__(self, status: int, code: Code) -> None:
        self.status = status
        self.code = code


class HttpBody(enum.Enum):
    """The body an envd HTTP route answers an error with (each route keeps envd's own)."""

    JSON = "json"  # {"code": <status>, "message": ...} + "\n" (/files, the token gate): envd's handlers
    CONNECT_JSON = "connect-json"  # {"code": "<connect code>", "message": ...}: the gate's Basic-user check
    TEXT = "text"  # the message as text/plain (/init, envd's request binding)
    EMPTY = "empty"  # the status alone, the message is not sent (/metrics)


class AgentError(Exception):
    """A refusal: ``kind`` decides the HTTP status and the Connect code, ``message`` is sent as is.

    ``http_body`` overrides the route's body form for this one error (envd answers some
    refusals from its generated router, before the handler and in its form).
    """

    def __init__(self, kind: ErrorKind, message: str, *, http_body: HttpBody | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.http_body = http_body

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind.name}, {self.message!r})"


# -- HTTP --------------------------------------------------------------------------


_JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8", "X-Content-Type-Options": "nosniff"}


def http_response(error: AgentError, body: HttpBody, headers: Mapping[str, str] | None = None) -> Response:
    """The HTTP answer to ``error`` in ``body`` form (``error.http_body`` wins), with ``headers`` added."""
    form = error.http_body or body
    status = error.kind.status
    extra = dict(headers or {})
    if form is HttpBody.JSON:
        content = json.dumps({"code": status, "message": error.message}) + "\n"
        return Response(content, status, headers={**_JSON_HEADERS, **extra})
    if form is HttpBody.CONNECT_JSON:
        return Response(
            json.dumps(connect_error_body(connect_error(error))), status, headers={**_JSON_HEADERS, **extra}
        )
    if form is HttpBody.TEXT:
        return Response(error.message, status, media_type="text/plain; charset=utf-8", headers=extra or None)
    return Response(status_code=status, headers=extra or None)


Endpoint = Callable[[Request], Awaitable[Response]]


def answers_errors(body: HttpBody, headers: Mapping[str, str] | None = None) -> Callable[[Endpoint], Endpoint]:
    """A route decorator: an ``AgentError`` the route raises is answered by ``http_response``."""

    def decorate(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def route(request: Request) -> Response:
            try:
                return await endpoint(request)
            except AgentError as exc:
                return http_response(exc, body, headers)

        return route

    return decorate


# -- Connect -----------------------------------------------------------------------


def connect_error(error: AgentError) -> ConnectError:
    return ConnectError(error.kind.code, error.message)


def connect_error_body(error: ConnectError) -> dict[str, str]:
    """Connect's JSON for an error: a unary answer's body, or the ``error`` of a stream's end."""
    return {"code": error.code.value, "message": error.message}


class ConnectErrors:
    """Interceptor for every kind of Connect method: an ``AgentError`` leaves as ``connect_error``."""

    async def intercept_unary(
        self,
        call_next: Callable[[REQ, RequestContext[Any, Any]], Awaitable[RES]],
        request: REQ,
        ctx: RequestContext[Any, Any],
    ) -> RES:
        try:
            return await call_next(request, ctx)
        except AgentError as exc:
            raise connect_error(exc) from None

    async def intercept_client_stream(
        self,
        call_next: Callable[[AsyncIterator[REQ], RequestContext[Any, Any]], Awaitable[RES]],
        request: AsyncIterator[REQ],
        ctx: RequestContext[Any, Any],
    ) -> RES:
        try:
            return await call_next(request, ctx)
        except AgentError as exc:
            raise connect_error(exc) from None

    def intercept_server_stream(
        self,
        call_next: Callable[[REQ, RequestContext[Any, Any]], AsyncIterator[RES]],
        request: REQ,
        ctx: RequestContext[Any, Any],
    ) -> AsyncIterator[RES]:
        return _translated(call_next(request, ctx))

    def intercept_bidi_stream(
        self,
        call_next: Callable[[AsyncIterator[REQ], RequestContext[Any, Any]], AsyncIterator[RES]],
        request: AsyncIterator[REQ],
        ctx: RequestContext[Any, Any],
    ) -> AsyncIterator[RES]:
        return _translated(call_next(request, ctx))


async def _translated(stream: AsyncIterator[RES]) -> AsyncIterator[RES]:
    # The service's stream is closed with this one (connect-python closes the outer stream as
    # soon as it stops reading), so its ``finally`` blocks run as promptly as without us.
    try:
        async for message in stream:
            yield message
    except AgentError as exc:
        raise connect_error(exc) from None
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
