"""The edge's connection limits on a real server: TLS on a loopback port, the fake backend, raw clients.

A slow-loris client, a client that never starts TLS, connections over the cap, a sandbox holding
its share of streams and WebSockets: each is refused or dropped while the other clients are served.
The fake backend places every sandbox at 127.0.0.1, so ``<port>-<id>.e2b.test`` reaches the
upstream thread below through the real proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from reference_server._config import ServerConfig
from reference_server._connections import connection_limit, raise_open_file_limit
from reference_server._server import RunningServer, open_server, run
from runtime.fake import FakeBackend

from .conftest import EVERY_EVENT_LOOP, RecordingInitializer
from .test_proxy import ServerThread

pytestmark = pytest.mark.anyio


@pytest.fixture(params=EVERY_EVENT_LOOP)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


DOMAIN = "e2b.test"
WAIT = 5.0
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _slow(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"ready\n"
        await asyncio.Event().wait()  # a stream with nothing more to say, until the client leaves

    return StreamingResponse(chunks(), media_type="text/plain")


async def _fast(request: Request) -> Response:
    return Response("ok", media_type="text/plain")


async def _ws_echo(websocket: WebSocket) -> None:
    await websocket.accept()
    with contextlib.suppress(Exception):
        while True:
            await websocket.send_text(await websocket.receive_text())


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerThread]:
    app = Starlette(routes=[Route("/slow", _slow), Route("/fast", _fast), WebSocketRoute("/ws", _ws_echo)])
    with ServerThread(app) as server:
        yield server


@dataclass
class Live:
    server: RunningServer
    port: int
    tls: ssl.SSLContext

    def host(self, name: str = "api") -> str:
        return f"{name}.{DOMAIN}:{self.port}"

    async def connect(self, name: str = "api") -> Stream:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls, server_hostname=f"{name}.{DOMAIN}")

    async def create(self) -> str:
        body = json.dumps({"templateID": "base", "timeout": 300}).encode()
        stream = await self.connect()
        status, answer = await exchange(stream, "POST", "/sandboxes", self.host(), body, api_key=self.server.api_key)
        await close(stream)
        assert status == 201, answer
        sandbox_id: str = json.loads(answer)["sandboxID"]
        return sandbox_id


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **settings: Any) -> AsyncIterator[Live]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    config = ServerConfig(data_dir=tmp_path / "data", domain=DOMAIN, port=port, hosts=("127.0.0.1",), **settings)
    ready, stop = asyncio.Event(), asyncio.Event()
    async with open_server(config, backend=FakeBackend(), initialize=RecordingInitializer()) as server:
        task = asyncio.create_task(run(server, [sock], on_ready=lambda _: ready.set(), stop=stop))
        try:
            await asyncio.wait_for(ready.wait(), WAIT)
            tls = ssl.create_default_context(cafile=str(config.data_dir / "ca.pem"))
            yield Live(server, port, tls)
        finally:
            stop.set()
            await asyncio.wait_for(task, 3 * WAIT)
            sock.close()


async def exchange(
    stream: Stream, method: str, path: str, host: str, body: bytes = b"", *, api_key: str | None = None
) -> tuple[int, bytes]:
    """One request on the connection and its whole answer (Content-Length delimited)."""
    status, headers = await send_head(stream, method, path, host, body, api_key=api_key)
    length = int(headers.get("content-length", "0"))
    return status, await asyncio.wait_for(stream[0].readexactly(length), WAIT)


async def send_head(
    stream: Stream, method: str, path: str, host: str, body: bytes = b"", *, api_key: str | None = None
) -> tuple[int, dict[str, str]]:
    """Send a request; read the answer's status and headers only (a stream's body may never end)."""
    reader, writer = stream
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    if api_key is not None:
        lines.append(f"X-API-Key: {api_key}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


async def close(stream: Stream) -> None:
    stream[1].close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await stream[1].wait_closed()


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """True once the server closed the connection (EOF or reset), False if it is still open after ``within``."""
    try:
        while await asyncio.wait_for(reader.read(65536), within):
            pass
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        pass
    return True


# --- request heads and handshakes ---


async def test_a_slow_loris_is_dropped_while_another_client_is_served(tmp_path: Path) -> None:
    async with serving(tmp_path, request_head_timeout_seconds=1.0) as live:
        started = time.monotonic()
        loris = await live.connect()
        loris[1].write(f"GET /v2/sandboxes HTTP/1.1\r\nHost: {live.host()}\r\n".encode())

        async def dribble() -> None:
            with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
                while True:  # a header line every 0.2 s, never the blank line that ends the head
                    await asyncio.sleep(0.2)
                    loris[1].write(b"X-Slow: 1\r\n")
                    await loris[1].drain()

        dribbler = asyncio.create_task(dribble())
        try:
            await asyncio.sleep(0.5)
            normal = await live.connect()
            status, _ = await exchange(normal, "GET", "/v2/sandboxes", live.host())
            assert status == 401, "another client is answered while the slow one dribbles"
            assert await closed_by_server(loris[0], within=WAIT), "the slow client was never dropped"
            elapsed = time.monotonic() - started
            assert 0.9 <= elapsed < 3.0, elapsed
            status, _ = await exchange(normal, "GET", "/v2/sandboxes", live.host())
            assert status == 401, "the other client's connection is untouched"
            await close(normal)
        finally:
            dribbler.cancel()
            await asyncio.gather(dribbler, return_exceptions=True)
            await close(loris)


async def test_a_client_that_never_starts_tls_is_dropped(tmp_path: Path) -> None:
    async with serving(tmp_path, request_head_timeout_seconds=1.0) as live:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", live.port)  # plain TCP, silent
        assert await closed_by_server(reader, within=WAIT), "asyncio alone waits 60 s for a handshake"
        assert time.monotonic() - started < 3.0
        writer.close()


async def test_an_idle_keep_alive_connection_outlives_the_head_timeout(tmp_path: Path) -> None:
    async with serving(tmp_path, request_head_timeout_seconds=0.5) as live:
        stream = await live.connect()
        assert (await exchange(stream, "GET", "/v2/sandboxes", live.host()))[0] == 401
        await asyncio.sleep(1.2)  # idle between requests: the keep-alive timeout (640 s) applies, not the head's
        assert (await exchange(stream, "GET", "/v2/sandboxes", live.host()))[0] == 401
        await close(stream)


# --- the connection cap ---


async def test_connections_over_the_cap_are_closed_at_once_and_the_open_ones_served(tmp_path: Path) -> None:
    async with serving(tmp_path, max_connections=3) as live:
        held = [await live.connect() for _ in range(3)]
        started = time.monotonic()
        with pytest.raises((OSError, ssl.SSLError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(live.connect(), WAIT)  # closed before its handshake
        assert time.monotonic() - started < 2.0, "refused at once, not after a timeout"
        for stream in held:
            assert (await exchange(stream, "GET", "/v2/sandboxes", live.host()))[0] == 401
        await close(held.pop())
        await asyncio.sleep(0.2)  # the server sees the close
        again = await live.connect()
        assert (await exchange(again, "GET", "/v2/sandboxes", live.host()))[0] == 401, "a freed slot is reused"
        for stream in (*held, again):
            await close(stream)


def test_the_default_cap_follows_the_open_file_limit() -> None:
    soft = raise_open_file_limit()
    assert connection_limit(7) == 7
    assert connection_limit(0) == max(64, min(16384, (soft - 1024) // 2))


# --- each sandbox's share ---


async def test_a_sandbox_holding_its_share_of_streams_leaves_others_served(
    tmp_path: Path, upstream: ServerThread
) -> None:
    async with serving(tmp_path, sandbox_max_requests=2, max_connections=16) as live:
        first, second = await live.create(), await live.create()
        a_host, b_host = live.host(f"{upstream.port}-{first}"), live.host(f"{upstream.port}-{second}")
        streams = [await live.connect(f"{upstream.port}-{first}") for _ in range(2)]
        for stream in streams:
            assert (await send_head(stream, "GET", "/slow", a_host))[0] == 200
        over = await live.connect(f"{upstream.port}-{first}")
        status, body = await exchange(over, "GET", "/fast", a_host)
        assert status == 429
        assert json.loads(body)["code"] == 429
        other = await live.connect(f"{upstream.port}-{second}")
        started = time.monotonic()
        assert await exchange(other, "GET", "/fast", b_host) == (200, b"ok")
        assert time.monotonic() - started < 1.0, "the other sandbox is served at once"
        await close(streams.pop())
        await asyncio.sleep(0.3)  # the proxy notices the client left and gives the share back
        assert await exchange(over, "GET", "/fast", a_host) == (200, b"ok")
        for stream in (*streams, over, other):
            await close(stream)


async def test_websockets_per_sandbox_are_capped_and_give_their_connection_back(
    tmp_path: Path, upstream: ServerThread
) -> None:
    async with serving(tmp_path, sandbox_max_websockets=1, max_connections=4) as live:
        first, second = await live.create(), await live.create()

        def socket_to(sandbox_id: str) -> Any:
            uri = f"wss://{upstream.port}-{sandbox_id}.{DOMAIN}:{live.port}/ws"
            return ws_connect(uri, ssl=live.tls, host="127.0.0.1", port=live.port, proxy=None, open_timeout=WAIT)

        async def echo(ws: ClientConnection) -> None:
            await ws.send("hi")
            assert await asyncio.wait_for(ws.recv(), WAIT) == "hi"

        async with socket_to(first) as held:
            await echo(held)
            with pytest.raises(InvalidStatus) as refused:
                async with socket_to(first):
                    pass
            assert refused.value.response.status_code == 429
            assert json.loads(refused.value.response.body)["code"] == 429
            async with socket_to(second) as other:
                await echo(other)
        for _ in range(6):  # more than max_connections: each closed WebSocket gave its slot back
            # The client's close ends before the edge has let go of the slot: a moment's retry, never a leak.
            deadline = asyncio.get_running_loop().time() + WAIT
            while True:
                try:
                    async with socket_to(first) as again:
                        await echo(again)
                    break
                except InvalidStatus as exc:
                    if exc.response.status_code != 429 or asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.05)
