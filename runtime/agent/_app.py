"""The agent's ASGI application: envd HTTP routes and the two Connect services.

Request pipeline, outermost first (as envd): CORS → access-token gate → routing. The
Connect services resolve the acting user themselves so a stream can answer with an
end-of-stream error, as upstream does. Only ``GET /health``, ``GET``/``POST /files`` and
``POST /init`` pass the gate without the token. Every refusal is an ``AgentError``, answered
by ``_errors``: the HTTP routes' own form, or a Connect error (the ``ConnectErrors`` interceptor).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from contract.generated.filesystem import filesystem_pb2
from contract.generated.filesystem.filesystem_connect import FilesystemASGIApplication
from contract.generated.process import process_pb2
from contract.generated.process.process_connect import ProcessASGIApplication
from contract.protocol import ACCESS_TOKEN_HEADER, CONNECT_PROTOCOL_VERSION_HEADER

from . import _files, _http
from ._errors import AgentError, ConnectErrors, ErrorKind, HttpBody, http_response
from ._filesystem_service import FilesystemService
from ._limits import MAX_MESSAGE_BYTES, BoundedGzip
from ._metrics import MetricsCollector
from ._process_service import ProcessService
from ._processes import ProcessTable
from ._services import ServiceSet
from ._state import AgentState, UserError, basic_user
from ._validation import RequestValidation, client_streaming, input_types

_EXEMPT = frozenset({("GET", "/health"), ("GET", "/files"), ("POST", "/files"), ("POST", "/init")})
_RPC_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
_UNAUTHORIZED = "unauthorized access, please provide a valid access token or method signing if supported"


class AgentApp:
    """Token gate and dispatch between the HTTP routes and the Connect services."""

    def __init__(self, state: AgentState, routes: ASGIApp, rpc: dict[str, ASGIApp]) -> None:
        self._state = state
        self._routes = routes
        self._rpc = rpc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._routes(scope, receive, send)  # lifespan
            return
        method, path = scope["method"], scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if (method, path) not in _EXEMPT and not self._state.token_matches(headers.get(ACCESS_TOKEN_HEADER.lower())):
            refusal = AgentError(ErrorKind.UNAUTHENTICATED, _UNAUTHORIZED)
            await http_response(refusal, HttpBody.JSON)(scope, receive, send)
            return
        for prefix, app in self._rpc.items():
            if path.startswith(prefix):
                await app(scope, receive, send)
                return
        name = basic_user(headers.get("authorization"))
        if name is not None:
            try:
                self._state.user_from_basic(headers.get("authorization"))
            except UserError as exc:
                await http_response(exc, HttpBody.CONNECT_JSON)(scope, receive, send)
                return
        await self._routes(scope, receive, send)


def create_app(
    state: AgentState | None = None, metrics: MetricsCollector | None = None, services: ServiceSet | None = None
) -> ASGIApp:
    state = state or AgentState()
    table = ProcessTable()
    filesystem = FilesystemService(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # uvicorn listens only after start-up, so the template's services are up before
        # the runtime's health probe can succeed (see _services).
        if services is not None:
            await services.start()
        yield
        if services is not None:
            await services.stop()
        await filesystem.shutdown()
        await table.shutdown()

    routes = Starlette(
        routes=[
            Route("/health", _http.health, methods=["GET", "HEAD"]),
            Route("/metrics", _http.metrics, methods=["GET"]),
            Route("/envs", _http.envs, methods=["GET"]),
            Route("/init", _http.init, methods=["POST"]),
            Route("/files", _files.download, methods=["GET"]),
            Route("/files", _files.upload, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    routes.state.agent = state
    routes.state.metrics = metrics or MetricsCollector()
    types = input_types(process_pb2.DESCRIPTOR, filesystem_pb2.DESCRIPTOR)
    streams = client_streaming(process_pb2.DESCRIPTOR, filesystem_pb2.DESCRIPTOR)
    # Request messages are bounded (_limits): by RequestValidation before connect-python reads
    # them, and by connect-python itself for each message of a client stream.
    bounds: dict[str, Any] = {
        "interceptors": (ConnectErrors(),),
        "read_max_bytes": MAX_MESSAGE_BYTES,
        "compressions": (BoundedGzip(),),
    }
    rpc: dict[str, Any] = {
        _RPC_PREFIXES[0]: RequestValidation(
            ProcessASGIApplication(ProcessService(state, table), **bounds), types, streams
        ),
        _RPC_PREFIXES[1]: RequestValidation(FilesystemASGIApplication(filesystem, **bounds), types, streams),
    }
    gate = AgentApp(state, routes, rpc)
    return CORSMiddleware(
        gate,
        allow_origins=["*"],
        allow_methods=["HEAD", "GET", "POST", "PUT", "PATCH", "DELETE"],
        allow_headers=["*"],
        expose_headers=[
            "Location",
            "Cache-Control",
            "X-Content-Type-Options",
            CONNECT_PROTOCOL_VERSION_HEADER,
            "Grpc-Status",
            "Grpc-Message",
        ],
        max_age=7200,
    )
