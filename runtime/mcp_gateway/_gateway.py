"""The gateway's MCP endpoint: the upstream servers' offers as one streamable-HTTP server.

The MCP SDK's low-level server does the protocol (sessions, both protocol eras, SSE); the
handlers here only look up which upstream owns a name and forward the request to it. In front
of it, ``BearerToken`` lets through requests carrying the access token and answers every other
HTTP request 401, as a gateway reachable from outside the sandbox must.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from starlette.types import ASGIApp, Receive, Scope, Send

from ._config import StdioServer
from ._repos import GatewayError, working_copy
from ._upstreams import Upstreams

__all__ = ["BearerToken", "build_server", "serve"]

NAME = "e2b-compat-mcp-gateway"
PATH = "/mcp"


class BearerToken:
    """ASGI middleware: HTTP requests need ``Authorization: Bearer <token>``; the rest pass."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = json.dumps({"error": "unauthorized", "message": "a valid bearer token is required"}).encode()
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="mcp-gateway"'),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self._app(scope, receive, send)


def build_server(upstreams: Upstreams) -> Server[Any]:
    """The low-level MCP server whose handlers forward to ``upstreams``."""

    async def list_tools(_ctx: Any, _params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool for _session, tool in upstreams.tools.values()])

    async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        entry = upstreams.tools.get(params.name)
        if entry is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        return await entry[0].call_tool(params.name, params.arguments)

    async def list_prompts(_ctx: Any, _params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[prompt for _session, prompt in upstreams.prompts.values()])

    async def get_prompt(_ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        entry = upstreams.prompts.get(params.name)
        if entry is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown prompt {params.name!r}")
        return await entry[0].get_prompt(params.name, params.arguments)

    async def list_resources(_ctx: Any, _params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[resource for _session, resource in upstreams.resources.values()])

    async def read_resource(_ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        entry = upstreams.resources.get(str(params.uri))
        if entry is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {str(params.uri)!r}")
        return await entry[0].read_resource(str(params.uri))

    return Server(
        NAME,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


def listen(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound before anything starts so a taken port fails first."""
    try:
        return socket.create_server((host, port), family=socket.AF_INET)
    except OSError as exc:
        raise GatewayError(f"cannot listen on {host}:{port} (is a gateway already running?): {exc}") from exc


async def serve(
    servers: Sequence[StdioServer],
    *,
    sock: socket.socket,
    root: Path,
    token: str,
    env: Mapping[str, str],
    errlog: TextIO,
    ready: Callable[[], None],
) -> None:
    """Start every server, serve the endpoint on ``sock``, call ``ready`` once it serves; return on SIGTERM."""
    async with AsyncExitStack() as stack:
        upstreams = Upstreams()
        for server in servers:
            await upstreams.connect(stack, server, working_copy(root, server), errlog=errlog, env=env)
        # Bound to every address of the sandbox: the SDK's DNS-rebinding guard (on for loopback
        # hosts only) would refuse the edge's Host header, and the token guards the endpoint.
        app = build_server(upstreams).streamable_http_app(streamable_http_path=PATH, host="0.0.0.0")  # noqa: S104
        config = uvicorn.Config(BearerToken(app, token), log_level="warning", lifespan="on", access_log=False)
        http = uvicorn.Server(config)
        serving = asyncio.create_task(http.serve(sockets=[sock]))
        while not http.started:
            if serving.done():
                serving.result()
                raise GatewayError("the HTTP server stopped before it served")
            await asyncio.sleep(0.02)
        ready()
        await serving
