"""The sandbox proxy between two real uvicorn servers: a front whose app forwards everything to an upstream.

Each server runs in a thread of its own (its own event loop); the tests drive the front with
httpx and the websockets client from the main thread, as a client on the network would.
Upstream endpoints that must be observed mid-request report through ``threading.Event``s.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import queue
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect
from websockets.typing import Origin, Subprotocol

from reference_server._config import EVENT_LOOPS
from reference_server._proxy import SandboxProxy, Upstream

TOKEN_HEADER = "e2b-traffic-access-token"
PORT_HEADER = "x-test-upstream-port"  # the front forwards to this port instead, to reach a dead one
MIB = 1024 * 1024
GZIPPED = gzip.compress(b"compressed body " * 1000)
WAIT = 5.0  # upper bound for anything that should happen at once; never slept, only waited on


@dataclass
class Probe:
    """What the upstream tells the tests, across threads."""

    release_stream: threading.Event = field(default_factory=threading.Event)
    hang_closed: threading.Event = field(default_factory=threading.Event)
    upload_started: threading.Event = field(default_factory=threading.Event)
    uploads: queue.Queue[str] = field(default_factory=queue.Queue)  # how each /upload-watch body ended
    ws_closes: queue.Queue[tuple[str, int, str]] = field(default_factory=queue.Queue)  # path, code, reason

    def ws_close(self, path: str) -> tuple[int, str]:
        """How the client of the WebSocket at ``path`` closed it, as the upstream saw it."""
        while True:
            closed_path, code, reason = self.ws_closes.get(timeout=WAIT)
            if closed_path == path:
                return code, reason


def upstream_app(probe: Probe) -> Starlette:
    async def echo(request: Request) -> Response:
        digest, length, body = hashlib.sha256(), 0, b""
        async for chunk in request.stream():
            digest.update(chunk)
            length += len(chunk)
            if length <= 1024:
                body += chunk
        raw_path: bytes = request.scope["raw_path"]
        return JSONResponse(
            {
                "method": request.method,
                "raw_path": raw_path.decode("latin-1"),
                "query": request.scope["query_string"].decode("latin-1"),
                "headers": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in request.scope["headers"]],
                "body": body.decode("latin-1"),
                "length": length,
                "sha256": digest.hexdigest(),
                "client_port": request.client.port if request.client else None,
            }
        )

    async def stream(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first\n"
            while not probe.release_stream.is_set():  # the test releases it once it holds the first chunk
                await asyncio.sleep(0.005)
            yield b"second\n"

        return StreamingResponse(chunks(), media_type="text/plain")

    async def hang(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                yield b"ready\n"
                await asyncio.Event().wait()  # a Connect stream with nothing more to say
            finally:
                probe.hang_closed.set()

        return StreamingResponse(chunks(), media_type="application/connect+json")

    async def upload_watch(request: Request) -> Response:
        try:
            async for _ in request.stream():
                probe.upload_started.set()
        except ClientDisconnect:
            probe.uploads.put("cut short")
            return Response("cut short")
        probe.uploads.put("complete")
        return Response("complete")

    async def download(request: Request) -> Response:
        size: int = request.path_params["size"]
        piece = b"d" * (256 * 1024)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(size // len(piece)):
                yield piece

        return StreamingResponse(chunks(), headers={"content-length": str(size)}, media_type="application/octet-stream")

    async def gzipped(request: Request) -> Response:
        return Response(GZIPPED, media_type="text/plain", headers={"content-encoding": "gzip"})

    async def cookies(request: Request) -> Response:
        response = Response("two cookies")
        response.set_cookie("a", "1")
        response.set_cookie("b", "2")
        return response

    async def hop(request: Request) -> Response:
        headers = {"connection": "x-private", "x-private": "1", "keep-alive": "timeout=5", "x-kept": "yes"}
        headers |= {"proxy-authenticate": "Basic", "trailer": "x-checksum"}
        return Response("hop", headers=headers)

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        # Promises 1000 bytes, sends 10 and returns: uvicorn closes the connection mid-body.
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]})
        await send({"type": "http.response.body", "body": b"0123456789", "more_body": True})

    async def ws_echo(websocket: WebSocket) -> None:
        offered: list[str] = websocket.scope["subprotocols"]
        await websocket.accept(subprotocol="proto.a" if "proto.a" in offered else None)
        headers = [[n.decode("latin-1"), v.decode("latin-1")] for n, v in websocket.scope["headers"]]
        raw_path: bytes = websocket.scope["raw_path"]
        query: bytes = websocket.scope["query_string"]
        await websocket.send_json({"raw_path": raw_path.decode(), "query": query.decode(), "headers": headers})
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                probe.ws_closes.put((raw_path.decode(), message["code"], message.get("reason") or ""))
                return
            text: str | None = message.get("text")
            if text is not None and text.startswith("close "):
                _, code, reason = text.split(" ", 2)
                await websocket.close(int(code), reason)
                return
            if text is not None:
                await websocket.send_text(text)
            else:
                await websocket.send_bytes(message["bytes"])

    async def ws_deny(websocket: WebSocket) -> None:
        await websocket.send_denial_response(Response("no entry", status_code=401, headers={"x-why": "token"}))

    return Starlette(
        routes=[
            Route("/echo/{rest:path}", echo, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
            Route("/stream", stream),
            Route("/hang", hang, methods=["POST"]),
            Route("/upload-watch", upload_watch, methods=["POST"]),
            Route("/download/{size:int}", download),
            Route("/gzip", gzipped),
            Route("/cookies", cookies),
            Route("/hop", hop),
            Mount("/broken", app=broken),
            WebSocketRoute("/ws/{rest:path}", ws_echo),
            WebSocketRoute("/ws-deny", ws_deny),
        ]
    )


def front_app(proxy: SandboxProxy, upstream_port: int) -> ASGIApp:
    """The edge reduced to its last line: every request goes to one upstream."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await proxy.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        port = next((int(v) for n, v in scope["headers"] if n == PORT_HEADER.encode()), upstream_port)
        upstream = Upstream("127.0.0.1", port)
        await proxy.forward(scope, receive, send, upstream, drop_request_headers={TOKEN_HEADER})

    return app


class ServerThread:
    """A uvicorn server on an ephemeral 127.0.0.1 port, in a thread with its own event loop."""

    def __init__(self, app: ASGIApp, **options: Any) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port: int = self.socket.getsockname()[1]
        options.setdefault("loop", "asyncio")  # unless told: uvicorn's "auto" would take uvloop, as installed
        config = uvicorn.Config(
            app, ws="websockets-sansio", lifespan="on", log_level="warning", timeout_graceful_shutdown=2, **options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT)
        self.socket.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module")
def probe() -> Probe:
    return Probe()


@pytest.fixture(scope="module")
def upstream(probe: Probe) -> Iterator[ServerThread]:
    with ServerThread(upstream_app(probe)) as server:
        yield server


@pytest.fixture(scope="module", params=EVENT_LOOPS)
def front(upstream: ServerThread, probe: Probe, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    # As the edge should be: the upstream's Date and Server pass through, so the front adds none;
    # it faces clients directly, so X-Forwarded-* from a client (here on 127.0.0.1) is not believed.
    # The proxy runs on each loop the server may run on (setting event_loop).
    options: dict[str, Any] = {"server_header": False, "date_header": False, "proxy_headers": False}
    options["loop"] = request.param
    for event in (probe.release_stream, probe.hang_closed, probe.upload_started):
        event.clear()  # set by the tests of the previous loop
    with ServerThread(front_app(SandboxProxy(), upstream.port), **options) as server:
        yield server


@pytest.fixture
def client(front: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{front.port}", timeout=WAIT) as client:
        yield client


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound but not listening: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def ws_url(front: ServerThread, path: str) -> str:
    return f"ws://127.0.0.1:{front.port}{path}"


def seen_headers(echoed: dict[str, Any]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for name, value in echoed["headers"]:
        seen.setdefault(name, []).append(value)
    return seen


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


# --- HTTP ---


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_method_path_query_and_body_round_trip(client: httpx.Client, method: str) -> None:
    body = b"" if method in ("GET", "OPTIONS") else b"hello \x00\xff"
    host = "49983-sbx1.example.test:8443"
    response = client.request(
        method,
        "/echo/a%2Fb/c?x=1&y=%20z&x=2",
        content=body,
        headers={"host": host, "x-custom": "v", "x-forwarded-for": "6.6.6.6", "x-forwarded-proto": "https"},
    )
    assert response.status_code == 200
    echoed = response.json()
    assert echoed["method"] == method
    assert echoed["raw_path"] == "/echo/a%2Fb/c"  # percent-encoding kept as sent
    assert echoed["query"] == "x=1&y=%20z&x=2"
    assert echoed["body"].encode("latin-1") == body
    headers = seen_headers(echoed)
    assert headers["host"] == [host]
    assert headers["x-custom"] == ["v"]
    assert headers["x-forwarded-for"] == ["127.0.0.1"]  # set by the proxy, whatever the client claimed
    assert headers["x-forwarded-proto"] == ["http"]
    assert "transfer-encoding" not in headers
    if body:
        assert headers["content-length"] == [str(len(body))]


def test_head_has_headers_and_no_body(client: httpx.Client) -> None:
    response = client.head("/echo/x")
    assert response.status_code == 200
    assert int(response.headers["content-length"]) > 0
    assert response.content == b""


def test_chunked_request_body_of_several_mib_arrives_intact(client: httpx.Client) -> None:
    pieces = [bytes([i % 251]) * (64 * 1024 + i) for i in range(80)]  # ~5 MiB, uneven sizes
    expected = hashlib.sha256(b"".join(pieces)).hexdigest()
    response = client.post("/echo/upload", content=iter(pieces))  # a generator body: sent chunked, no length
    echoed = response.json()
    assert echoed["length"] == sum(map(len, pieces))
    assert echoed["sha256"] == expected
    assert seen_headers(echoed)["transfer-encoding"] == ["chunked"]


def test_an_upload_cut_short_by_the_client_is_cut_short_upstream(client: httpx.Client, probe: Probe) -> None:
    def body() -> Iterator[bytes]:
        yield b"u" * 256 * 1024
        assert probe.upload_started.wait(WAIT)  # the upstream is reading the body
        raise ConnectionAbortedError("the client gives up")

    with pytest.raises(ConnectionAbortedError):
        client.post("/upload-watch", content=body())
    # Not "complete": the proxy must not end a chunked body for a client that never did.
    assert probe.uploads.get(timeout=WAIT) == "cut short"


def test_response_chunks_arrive_while_the_upstream_is_still_producing(client: httpx.Client, probe: Probe) -> None:
    with client.stream("GET", "/stream") as response:
        chunks = response.iter_raw()
        first = next(chunks)
        assert first == b"first\n"
        assert not probe.release_stream.is_set()  # the upstream cannot have finished: it waits for us
        probe.release_stream.set()
        assert first + b"".join(chunks) == b"first\nsecond\n"


def test_64_mib_download_streams_in_bounded_memory(client: httpx.Client) -> None:
    size = 64 * MIB
    assert len(client.get("/download/1048576").content) == MIB  # warm up pools and buffers
    baseline = peak = rss_kib()
    received = 0
    with client.stream("GET", f"/download/{size}") as response:
        assert response.headers["content-length"] == str(size)
        for chunk in response.iter_raw():
            received += len(chunk)
            peak = max(peak, rss_kib())
    assert received == size
    # Whole-body buffering anywhere (upstream, proxy, client) would show as 64 MiB or more.
    assert peak - baseline < 32 * 1024, f"RSS grew by {(peak - baseline) // 1024} MiB"


def test_gzip_passes_through_untouched_both_ways(client: httpx.Client) -> None:
    with client.stream("GET", "/gzip", headers={"accept-encoding": "gzip"}) as response:
        raw = b"".join(response.iter_raw())
    assert response.headers["content-encoding"] == "gzip"
    assert response.headers["content-length"] == str(len(GZIPPED))
    assert raw == GZIPPED
    echoed = client.post("/echo/gz", content=GZIPPED, headers={"content-encoding": "gzip"}).json()
    assert echoed["sha256"] == hashlib.sha256(GZIPPED).hexdigest()
    assert seen_headers(echoed)["content-encoding"] == ["gzip"]


def test_duplicate_set_cookie_headers_are_preserved(client: httpx.Client) -> None:
    response = client.get("/cookies")
    cookies = response.headers.get_list("set-cookie")
    assert [cookie.split(";")[0] for cookie in cookies] == ["a=1", "b=2"]
    assert len(response.headers.get_list("date")) == 1  # the upstream's own


def test_dropped_and_hop_by_hop_request_headers_never_reach_the_upstream(client: httpx.Client) -> None:
    headers = {
        TOKEN_HEADER: "secret-token",
        "connection": "keep-alive, x-private",
        "x-private": "named by Connection",
        "keep-alive": "timeout=5",
        "te": "trailers",
        "proxy-authorization": "Basic c2VjcmV0",
        "x-kept": "yes",
    }
    seen = seen_headers(client.get("/echo/headers", headers=headers).json())
    for name in (TOKEN_HEADER, "connection", "x-private", "keep-alive", "te", "proxy-authorization"):
        assert name not in seen, name
    assert seen["x-kept"] == ["yes"]


def test_hop_by_hop_response_headers_are_stripped(client: httpx.Client) -> None:
    response = client.get("/hop")
    for name in ("x-private", "keep-alive", "proxy-authenticate", "trailer"):
        assert name not in response.headers, name
    assert "x-private" not in response.headers.get("connection", "")
    assert response.headers["x-kept"] == "yes"


def test_unreachable_upstream_is_a_502_json_answer(client: httpx.Client, dead_port: int) -> None:
    response = client.post("/echo/x", content=b"body", headers={PORT_HEADER: str(dead_port), TOKEN_HEADER: "s3cret"})
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    message = f"The sandbox is running but the port is not open: nothing listens on port {dead_port}"
    assert answer == {"code": 502, "message": message}
    assert "port is not open" in message, "what Python e2b from 2.53.1 reads as a port with nothing listening"
    assert "was not found" not in message, "which it would read as a sandbox that is gone"
    assert "s3cret" not in response.text


def test_connect_timeout_is_a_502_answer(unanswered: Upstream) -> None:
    scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/", "query_string": b"", "headers": []}
    sent = asyncio.run(forward_once(scope, {"type": "http.request", "body": b"", "more_body": False}, unanswered))
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 502
    assert json.loads(sent[1]["body"]) == {
        "code": 502,
        "message": f"The sandbox is not reachable on port {unanswered.port}: timed out connecting",
    }


@pytest.fixture
def unanswered() -> Iterator[Upstream]:
    """A listener whose accept queue is full: Linux drops further SYNs, so connecting to it hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(address)
            yield Upstream(*address)
        finally:
            for filler in fillers:
                filler.close()


async def forward_once(
    scope: Scope, first: Message, upstream: Upstream, proxy: SandboxProxy | None = None
) -> list[Message]:
    """One request through ``proxy`` from an in-memory ASGI server: what it sent.

    Without a proxy, through one of its own (connect timeout 0.3 s), closed afterwards.
    """
    own = proxy is None
    proxy = proxy or SandboxProxy(connect_timeout=0.3)
    sent: list[Message] = []
    messages = [first]

    async def receive() -> Message:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays until the proxy is done
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    try:
        await proxy.forward(scope, receive, send, upstream)
    finally:
        if own:
            await proxy.aclose()
    return sent


def test_upstream_breaking_off_mid_response_breaks_the_client_response(client: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        client.get("/broken/")


def test_client_disconnect_closes_the_upstream_stream(client: httpx.Client, probe: Probe) -> None:
    with client.stream("POST", "/hang") as response:
        chunks = response.iter_raw()  # kept: a discarded iterator would close the response at once
        assert next(chunks) == b"ready\n"
        assert not probe.hang_closed.is_set()
    # Leaving the block closes the unfinished response, and with it the connection to the front.
    assert probe.hang_closed.wait(2.0), "the upstream stream was not closed after the client left"


# --- WebSocket ---


def open_ws(front: ServerThread, path: str, **kwargs: Any) -> ClientConnection:
    connection: ClientConnection = ws_connect(ws_url(front, path), open_timeout=WAIT, close_timeout=WAIT, **kwargs)
    return connection


def test_websocket_echo_subprotocol_and_headers(front: ServerThread) -> None:
    offered = [Subprotocol("proto.b"), Subprotocol("proto.a")]
    headers = {TOKEN_HEADER: "secret-token", "cookie": "c=1", "authorization": "Bearer x"}
    origin = Origin("https://app.example")
    with open_ws(front, "/ws/a%2Fb?q=1", subprotocols=offered, additional_headers=headers, origin=origin) as ws:
        assert ws.subprotocol == "proto.a"  # the upstream's choice
        hello = json.loads(ws.recv(timeout=WAIT))
        ws.send("hello")
        assert ws.recv(timeout=WAIT) == "hello"
        ws.send(b"\x00\xffbinary")
        assert ws.recv(timeout=WAIT) == b"\x00\xffbinary"
        ws.send(b"x" * 512 * 1024)
        assert ws.recv(timeout=WAIT) == b"x" * 512 * 1024
    assert hello["raw_path"] == "/ws/a%2Fb"
    assert hello["query"] == "q=1"
    seen = seen_headers(hello)
    assert seen["host"] == [f"127.0.0.1:{front.port}"]
    assert seen["origin"] == ["https://app.example"]
    assert seen["cookie"] == ["c=1"]
    assert seen["authorization"] == ["Bearer x"]
    assert seen["sec-websocket-protocol"] == ["proto.b, proto.a"]
    assert TOKEN_HEADER not in seen


def test_websocket_without_subprotocol(front: ServerThread) -> None:
    with open_ws(front, "/ws/plain") as ws:
        assert ws.subprotocol is None
        json.loads(ws.recv(timeout=WAIT))


def test_websocket_close_from_the_client_reaches_the_upstream(front: ServerThread, probe: Probe) -> None:
    with open_ws(front, "/ws/closed-by-client") as ws:
        ws.recv(timeout=WAIT)
        ws.close(4001, "client bye")
    assert probe.ws_close("/ws/closed-by-client") == (4001, "client bye")


def test_websocket_close_from_the_upstream_reaches_the_client(front: ServerThread) -> None:
    with open_ws(front, "/ws/close") as ws:
        ws.recv(timeout=WAIT)
        ws.send("close 4002 server bye")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=WAIT)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4002, "server bye")


def test_websocket_to_an_unreachable_upstream_is_refused_with_502(front: ServerThread, dead_port: int) -> None:
    with pytest.raises(InvalidStatus) as refused:
        open_ws(front, "/ws/x", additional_headers={PORT_HEADER: str(dead_port)})
    assert refused.value.response.status_code == 502
    answer = json.loads(refused.value.response.body)
    assert answer["code"] == 502
    assert str(dead_port) in answer["message"]


def test_websocket_refused_by_the_upstream_relays_its_answer(front: ServerThread) -> None:
    with pytest.raises(InvalidStatus) as refused:
        open_ws(front, "/ws-deny")
    assert refused.value.response.status_code == 401
    assert refused.value.response.body == b"no entry"
    assert refused.value.response.headers["x-why"] == "token"


def websocket_scope(extensions: dict[str, Any]) -> Scope:
    headers = [(b"host", b"3000-sbx1.example.test")]
    path = {"path": "/", "raw_path": b"/", "query_string": b""}
    return {"type": "websocket", **path, "headers": headers, "subprotocols": [], "extensions": extensions}


def test_websocket_connect_timeout_is_a_502_answer(unanswered: Upstream) -> None:
    scope = websocket_scope({"websocket.http.response": {}})
    sent = asyncio.run(forward_once(scope, {"type": "websocket.connect"}, unanswered))
    assert [message["type"] for message in sent] == ["websocket.http.response.start", "websocket.http.response.body"]
    assert sent[0]["status"] == 502
    assert str(unanswered.port) in json.loads(sent[1]["body"])["message"]


def test_websocket_refused_without_the_http_response_extension_is_closed(dead_port: int) -> None:
    upstream = Upstream("127.0.0.1", dead_port)
    sent = asyncio.run(forward_once(websocket_scope({}), {"type": "websocket.connect"}, upstream))
    assert sent == [{"type": "websocket.close", "code": 1014}]


def test_forget_closes_the_idle_pooled_connections_to_one_host(upstream: ServerThread) -> None:
    """A sandbox's processes stopped: the next request to its address opens a connection of its own.

    The upstream answers with the client's port, which names the connection the proxy used.
    """
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/echo/x",
        "raw_path": b"/echo/x",
        "query_string": b"",
        "headers": [(b"host", b"x")],
    }

    async def ports() -> list[int]:
        proxy = SandboxProxy()
        seen: list[int] = []

        async def one() -> None:
            first: Message = {"type": "http.request", "body": b"", "more_body": False}
            sent = await forward_once(scope, first, Upstream("127.0.0.1", upstream.port), proxy)
            body = b"".join(message.get("body", b"") for message in sent[1:])
            seen.append(int(json.loads(body)["client_port"]))

        try:
            await one()
            await one()  # kept alive: the same connection
            await proxy.forget("127.0.0.2")  # another address: nothing closed
            await one()
            await proxy.forget("127.0.0.1")
            await one()
        finally:
            await proxy.aclose()
        return seen

    first, second, third, fourth = asyncio.run(ports())
    assert first == second == third, "the pool kept its connection, and forgetting another host left it"
    assert fourth != first, "the connection to the forgotten host was reused"
