"""The configured stdio servers, each started and spoken to through the MCP SDK's client.

Each server's tools, prompts and resources are listed once, when it starts (every page), and
the gateway offers the union under their own names: two servers offering the same name are a
start-up error naming both, rather than one silently hiding the other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO, TypeVar

import mcp_types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from ._config import StdioServer
from ._repos import GatewayError, server_env

__all__ = ["Upstreams"]

Item = TypeVar("Item")
Page = Callable[[types.PaginatedRequestParams | None], Awaitable[Any]]
MAX_PAGES = 1000  # a server whose cursors never end must not hang the start
START_SECONDS = 45.0  # for a server's handshake and listings: one that never answers must not hang the start


async def _all_pages(fetch: Page, attribute: str) -> list[Any]:
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await fetch(None if cursor is None else types.PaginatedRequestParams(cursor=cursor))
        items.extend(getattr(page, attribute))
        cursor = page.next_cursor
        if not cursor:
            return items
    raise GatewayError(f"more than {MAX_PAGES} pages of {attribute}")


class Upstreams:
    """The sessions, and the index from each offered name (or resource URI) to its server."""

    def __init__(self) -> None:
        self.tools: dict[str, tuple[ClientSession, types.Tool]] = {}
        self.prompts: dict[str, tuple[ClientSession, types.Prompt]] = {}
        self.resources: dict[str, tuple[ClientSession, types.Resource]] = {}
        self._owner: dict[tuple[str, str], str] = {}  # (kind, name) -> server key

    def _claim(self, kind: str, name: str, key: str) -> None:
        other = self._owner.setdefault((kind, name), key)
        if other != key:
            raise GatewayError(f"MCP servers {other!r} and {key!r} both offer the {kind} {name!r}")

    async def connect(
        self,
        stack: AsyncExitStack,
        server: StdioServer,
        folder: Path,
        *,
        errlog: TextIO,
        env: Mapping[str, str],
        start_seconds: float = START_SECONDS,
    ) -> None:
        """Start ``server``'s runCmd in ``folder``, initialise its session and index what it offers."""
        params = StdioServerParameters(
            command="bash", args=["-c", server.run_cmd], cwd=folder, env=server_env(server, env)
        )
        # The server's own stack: a server that fails is closed here, so its transport's errors
        # (an exception group from the SDK's task group) never replace the reason given below.
        own = AsyncExitStack()
        try:
            read, write = await own.enter_async_context(stdio_client(params, errlog=errlog))
            session = await own.enter_async_context(ClientSession(read, write))
            async with asyncio.timeout(start_seconds):
                started = await session.initialize()
                offers = started.capabilities
                tools = await _all_pages(lambda p: session.list_tools(params=p), "tools") if offers.tools else []
                prompts = (
                    await _all_pages(lambda p: session.list_prompts(params=p), "prompts") if offers.prompts else []
                )
                resources = (
                    await _all_pages(lambda p: session.list_resources(params=p), "resources")
                    if offers.resources
                    else []
                )
        except Exception as exc:  # the SDK's stream, protocol and validation errors have no common base
            with contextlib.suppress(Exception):
                await own.aclose()
            if isinstance(exc, GatewayError):
                raise
            if isinstance(exc, TimeoutError):
                detail = f"it did not answer the handshake and listings within {start_seconds:g} s"
                raise GatewayError(
                    f"MCP server {server.key!r} (runCmd {server.run_cmd!r}) did not start: {detail}"
                ) from exc
            detail = str(exc) if isinstance(exc, MCPError | OSError) else f"{type(exc).__name__}: {exc}"
            raise GatewayError(
                f"MCP server {server.key!r} (runCmd {server.run_cmd!r}) did not start: {detail}"
            ) from exc
        await stack.enter_async_context(own)
        for tool in tools:
            self._claim("tool", tool.name, server.key)
            self.tools[tool.name] = (session, tool)
        for prompt in prompts:
            self._claim("prompt", prompt.name, server.key)
            self.prompts[prompt.name] = (session, prompt)
        for resource in resources:
            self._claim("resource", str(resource.uri), server.key)
            self.resources[str(resource.uri)] = (session, resource)
