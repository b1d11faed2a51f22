"""The HTTP surface (docs/PROTOCOL-NOTES.md, Code Interpreter): ``/health``, ``/contexts`` and the ``/execute`` stream.

One route of our own, ``/startup``, is not upstream's: 503 while the startup languages' default
kernels are starting, 200 once they have (or failed to). The server's warm pool asks it before it
offers a sandbox of this template, so a claimed sandbox's first run finds its kernel up.

Requests are parsed and checked here, then handed to ``Contexts`` / ``Run``; answers follow
upstream's shapes: JSON on success, plain-text bodies for 400/404/500. CORS is open to every
origin, method and header; the server does no authentication of its own (the edge checks
the traffic token before a request reaches the sandbox).

``RunResponse`` writes a run's lines as they come, a keepalive line after every
``keepalive_interval`` seconds of silence (writing is how a vanished peer is noticed), and
watches the ASGI ``receive`` channel for ``http.disconnect``: a client that leaves abandons
its run, which interrupts the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from contract.protocol import ACCESS_TOKEN_HEADER

from . import _languages, _messages
from ._contexts import Context, ContextClosedError, Contexts, Settings, TooManyContextsError
from ._execution import Run
from ._kernels import KernelStartError
from ._limits import MAX_REQUEST_BODY

logger = logging.getLogger(__name__)


class BadRequestError(Exception):
    """A body that is not what the route expects (answered 422, as FastAPI upstream does)."""


class BodyTooLargeError(Exception):
    """A body over ``MAX_REQUEST_BODY`` (answered 413, text); the rest of it is not read."""


class RunResponse(Response):
    """The streamed body of ``POST /execute``."""

    media_type = "application/x-ndjson"

    def __init__(self, run: Run, keepalive_interval: float) -> None:
        # Response.__init__ would render a body (and a Content-Length) we do not have.
        self.status_code = 200
        self.background = None
        self.init_headers()
        self._run = run
        self._keepalive = keepalive_interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self._run
        run.start()
        gone = asyncio.create_task(_disconnected(receive), name="execute-disconnect")
        finished = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            while True:
                getter = asyncio.create_task(run.next_line())
                done, _ = await asyncio.wait({getter, gone}, timeout=self._keepalive, return_when="FIRST_COMPLETED")
                if getter in done:
                    line = getter.result()
                    if line is None:
                        break
                    await send({"type": "http.response.body", "body": line, "more_body": True})
                    continue
                getter.cancel()
                if gone in done:
                    logger.info("context %s: client disconnected during an execution", run.context.id)
                    return
                await send(
                    {"type": "http.response.body", "body": _messages.encode(_messages.KEEPALIVE), "more_body": True}
                )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            finished = True
        except OSError:  # servers that raise on a closed connection instead of dropping the write
            logger.info("context %s: client connection failed during an execution", run.context.id)
        finally:
            gone.cancel()
            if not finished:
                run.abandon()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _text(status: int, text: str) -> Response:
    return PlainTextResponse(text, status_code=status)


async def _read_body(request: Request) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_REQUEST_BODY:
            raise BodyTooLargeError(f"Request body is larger than {MAX_REQUEST_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await _read_body(request)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise BadRequestError(f"body is not JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadRequestError("body is not a JSON object")
    return data


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise BadRequestError(f"{key} must be a string")
    return value


def _env_vars(body: Mapping[str, Any]) -> dict[str, str]:
    value = body.get("env_vars")
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise BadRequestError("env_vars must be an object of strings")
    return value


class Handlers:
    """The routes; ``contexts`` is set by the app's lifespan."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._contexts: Contexts | None = None

    @property
    def contexts(self) -> Contexts:
        assert self._contexts is not None, "used outside the app's lifespan"
        return self._contexts

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # A private runtime folder (0700) for connection files and ipc sockets.
        with tempfile.TemporaryDirectory(prefix="e2bci-") as runtime_dir:
            self._contexts = Contexts(self.settings, Path(runtime_dir))
            self._contexts.start_default()  # in the background: the port is open right away
            try:
                yield
            finally:
                await self._contexts.close_all()
                self._contexts = None

    async def health(self, request: Request) -> Response:
        return JSONResponse("OK")

    async def startup(self, request: Request) -> Response:
        if self.contexts.starting_defaults():
            return _text(503, "default kernels are starting")
        return JSONResponse("OK")

    async def create_context(self, request: Request) -> Response:
        body = await _json_body(request)
        language = _languages.normalize_language(_optional_str(body, "language"))
        cwd = _optional_str(body, "cwd") or self.settings.cwd
        if not _languages.is_supported(language):
            return _text(500, _languages.unsupported_message(language))
        try:
            context = await self.contexts.create(language, cwd)
        except TooManyContextsError as exc:
            return _text(429, str(exc))
        except KernelStartError as exc:
            return _text(500, f"Failed to create context: {exc}")
        return JSONResponse(context.describe())

    async def list_contexts(self, request: Request) -> Response:
        return JSONResponse([context.describe() for context in self.contexts.list()])

    async def remove_context(self, request: Request) -> Response:
        context_id = request.path_params["context_id"]
        if not await self.contexts.remove(context_id):
            return _text(404, f"Context {context_id} not found")
        return JSONResponse(None)

    async def restart_context(self, request: Request) -> Response:
        context_id = request.path_params["context_id"]
        context = self.contexts.get(context_id)
        if context is None:
            return _text(404, f"Context {context_id} not found")
        try:
            await context.restart()
        except ContextClosedError:
            return _text(404, f"Context {context_id} not found")
        except KernelStartError as exc:
            logger.error("context %s: restart failed: %s", context_id, exc)
            return _text(500, f"Failed to restart context {context_id}")
        return JSONResponse(None)

    async def execute(self, request: Request) -> Response:
        body = await _json_body(request)
        code = body.get("code")
        if not isinstance(code, str):
            raise BadRequestError("code is required and must be a string")
        context_id = _optional_str(body, "context_id")
        language = _optional_str(body, "language")
        env_vars = _env_vars(body)
        # Upstream tests truthiness: an empty context_id or language counts as absent.
        if context_id and language:
            return _text(400, "Only one of context_id or language can be provided")
        context: Context | None
        try:
            if language:
                normalized = _languages.normalize_language(language)
                if not _languages.is_supported(normalized):
                    return _text(500, _languages.unsupported_message(normalized))
                context = await self.contexts.default_for(normalized)
            elif context_id:
                context = self.contexts.get(context_id)
                if context is None:
                    return _text(404, f"Context {context_id} not found")
            else:
                context = await self.contexts.default_for("python")
            # Before the 200: a kernel that cannot start is a 500, not a broken stream.
            await context.ensure_started()
        except TooManyContextsError as exc:  # a first run in a language makes its default context
            return _text(429, str(exc))
        except KernelStartError as exc:
            return _text(500, f"Failed to start the context's kernel: {exc}")
        except ContextClosedError:
            return _text(404, f"Context {context_id or language or 'python'} not found")
        logger.debug("context %s: executing %d characters", context.id, len(code))
        run = Run(context, code, env_vars=env_vars, access_token=request.headers.get(ACCESS_TOKEN_HEADER))
        return RunResponse(run, self.settings.keepalive_interval)


async def _bad_request(request: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": str(exc)}, status_code=422)


async def _too_large(request: Request, exc: Exception) -> Response:
    return _text(413, str(exc))


def create_app(settings: Settings | None = None) -> Starlette:
    """The interpreter's ASGI app; kernels start and stop with its lifespan."""
    handlers = Handlers(settings or Settings())
    return Starlette(
        routes=[
            Route("/health", handlers.health, methods=["GET"]),
            Route("/startup", handlers.startup, methods=["GET"]),
            Route("/contexts", handlers.create_context, methods=["POST"]),
            Route("/contexts", handlers.list_contexts, methods=["GET"]),
            Route("/contexts/{context_id}", handlers.remove_context, methods=["DELETE"]),
            Route("/contexts/{context_id}/restart", handlers.restart_context, methods=["POST"]),
            Route("/execute", handlers.execute, methods=["POST"]),
        ],
        middleware=[Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])],
        exception_handlers={BadRequestError: _bad_request, BodyTooLargeError: _too_large},
        lifespan=handlers.lifespan,
    )
