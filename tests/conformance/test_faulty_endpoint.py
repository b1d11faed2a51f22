"""The faulty endpoint in front of a stand-in server: it relays faithfully and injects exactly its fault.

The stand-in is a uvicorn + Starlette app on 127.0.0.1 with the reference server's certificate
layout (made by ``ensure_certificates``), answering the few calls the faults concern: a create
(201 with ``"domain": "e2b.localhost:P"``), sandbox and snapshot lists, and the
``process.Process/Start`` and ``filesystem.Filesystem/WatchDir`` Connect streams, sent chunked with
delays and split mid-envelope, or all at once with a Content-Length, and ``GetWatcherEvents``
answers (JSON or protobuf).
"""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import json
import os
import shutil
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.sync.client import connect as ws_connect

from contract.generated.filesystem import filesystem_pb2
from reference_server._tls import ensure_certificates
from tests.conformance.faulty_endpoint import Fault, FaultyEndpoint

WAIT = 10.0
CONNECT_JSON = "application/connect+json"
SANDBOX_ID = "sbx1"
MESSAGES: list[dict[str, Any]] = [
    {"event": {"start": {"pid": 7}}},
    {"event": {"data": {"stdout": base64.b64encode(b"a").decode()}}},
    {"event": {"data": {"stdout": base64.b64encode(b"b").decode()}}},
    {"event": {"end": {"exitCode": 0, "exited": True, "status": "exit status 0"}}},
]
END_OF_STREAM: dict[str, Any] = {}


def envelope(flags: int, message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


STREAM = [envelope(0, message) for message in MESSAGES] + [envelope(2, END_OF_STREAM)]
CONNECT_PROTO = "application/connect+proto"
WATCH_MESSAGES: list[dict[str, Any]] = [
    {"start": {}},
    {"keepalive": {}},
    {"filesystem": {"name": "a.txt", "type": "EVENT_TYPE_CREATE"}},
    {"filesystem": {"name": "a.txt", "type": "EVENT_TYPE_WRITE"}},
    {"keepalive": {}},
    {"filesystem": {"name": "a.txt", "type": "EVENT_TYPE_REMOVE"}},
]
WATCHER_EVENTS: list[dict[str, Any]] = [message["filesystem"] for message in WATCH_MESSAGES if "filesystem" in message]
LISTED = [{"sandboxID": f"s{i}", "metadata": {"i": str(i)}} for i in range(3)]


def proto_envelope(message: dict[str, Any]) -> bytes:
    payload = json_format.ParseDict(message, filesystem_pb2.WatchDirResponse()).SerializeToString()
    return bytes([0]) + len(payload).to_bytes(4, "big") + payload


def watch_stream(codec: str) -> list[bytes]:
    """The WatchDir stream's envelopes in ``codec``; the end-of-stream message is JSON under both."""
    encode = proto_envelope if codec == "proto" else (lambda message: envelope(0, message))
    return [encode(message) for message in WATCH_MESSAGES] + [envelope(2, END_OF_STREAM)]


def parse_stream(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    """Envelopes of a complete Connect stream; fails unless it is exactly messages then one end-of-stream."""
    found: list[tuple[int, dict[str, Any]]] = []
    offset = 0
    while offset < len(data):
        assert len(data) - offset >= 5, "a truncated envelope prefix"
        length = int.from_bytes(data[offset + 1 : offset + 5], "big")
        payload = data[offset + 5 : offset + 5 + length]
        assert len(payload) == length, "a truncated envelope"
        found.append((data[offset], json.loads(payload)))
        offset += 5 + length
    assert [flags for flags, _ in found] == [0] * (len(found) - 1) + [2]
    return found


def stand_in_app(port: int) -> Starlette:
    """What the relay's faults concern, plus probes: the Host and peer seen, uploads, a WebSocket, a silent stream."""

    def seen(request: Request) -> dict[str, str]:
        assert request.client is not None
        return {
            "x-seen-host": request.headers["host"],
            "x-seen-peer": str(request.client.port),
            "x-seen-token": request.headers.get("x-access-token", ""),
            "x-seen-sandbox-id": request.headers.get("e2b-sandbox-id", ""),
        }

    async def create(request: Request) -> Response:
        received = await request.json()
        sandbox_id = received.get("sandboxHint", SANDBOX_ID)  # the test names the sandbox it wants
        body = {
            "sandboxID": sandbox_id,
            "envdAccessToken": f"token-{sandbox_id}",
            "domain": f"e2b.localhost:{port}",
            "url": f"https://api.e2b.localhost:{port}/sandboxes/{SANDBOX_ID}",
            "notOurs": f"e2b.localhost:{port}9",  # another port that merely starts with P
            "received": received,
        }
        location = {"location": f"https://api.e2b.localhost:{port}/sandboxes/{SANDBOX_ID}"}
        return JSONResponse(body, status_code=201, headers={**seen(request), **location})

    async def start(request: Request) -> Response:
        await request.body()
        if request.headers.get("x-test-framing") == "length":
            return Response(b"".join(STREAM), media_type=CONNECT_JSON, headers=seen(request))

        async def pieces() -> AsyncIterator[bytes]:
            for item in STREAM:  # each envelope in two chunks: the relay must reassemble them
                for piece in (item[:3], item[3:]):
                    await asyncio.sleep(0.02)
                    yield piece

        return StreamingResponse(pieces(), media_type=CONNECT_JSON, headers=seen(request))

    async def listed(request: Request) -> Response:
        count = int(request.query_params.get("n", len(LISTED)))  # the test says how many it wants
        return JSONResponse(LISTED[:count], headers={**seen(request), "x-next-token": "next"})

    async def watch_dir(request: Request) -> Response:
        await request.body()
        codec = "proto" if request.headers["content-type"] == CONNECT_PROTO else "json"
        media_type = CONNECT_PROTO if codec == "proto" else CONNECT_JSON
        if request.headers.get("x-test-framing") == "length":
            return Response(b"".join(watch_stream(codec)), media_type=media_type)

        async def pieces() -> AsyncIterator[bytes]:
            for item in watch_stream(codec):
                for piece in (item[:3], item[3:]):
                    await asyncio.sleep(0.02)
                    yield piece

        return StreamingResponse(pieces(), media_type=media_type)

    async def watcher_events(request: Request) -> Response:
        await request.body()
        events = WATCHER_EVENTS[: int(request.headers["x-test-events"])]
        if request.headers["content-type"] == "application/proto":
            message = json_format.ParseDict({"events": events}, filesystem_pb2.GetWatcherEventsResponse())
            return Response(message.SerializeToString(), media_type="application/proto")
        return JSONResponse({"events": events} if events else {})  # proto3 JSON leaves an empty list out

    async def echo(request: Request) -> Response:
        return JSONResponse({"host": request.headers["host"]}, headers=seen(request))

    async def upload(request: Request) -> Response:
        digest, size = hashlib.sha256(), 0
        async for chunk in request.stream():
            digest.update(chunk)
            size += len(chunk)
        return JSONResponse({"sha256": digest.hexdigest(), "size": size}, headers=seen(request))

    async def silent(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first\n"
            await asyncio.sleep(60)  # a command that prints nothing for a long time

        return StreamingResponse(chunks(), media_type="text/plain")

    async def ws_echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(websocket.headers["host"])
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            await websocket.send_text(message.get("text") or "")

    return Starlette(
        routes=[
            Route("/sandboxes", create, methods=["POST"]),
            Route("/v2/sandboxes", create, methods=["POST"]),
            Route("/process.Process/Start", start, methods=["POST"]),
            Route("/sandboxes", listed, methods=["GET"]),
            Route("/v2/sandboxes", listed, methods=["GET"]),
            Route("/snapshots", listed, methods=["GET"]),
            Route("/filesystem.Filesystem/WatchDir", watch_dir, methods=["POST"]),
            Route("/filesystem.Filesystem/GetWatcherEvents", watcher_events, methods=["POST"]),
            Route("/echo", echo),
            Route("/upload", upload, methods=["PUT"]),
            Route("/silent", silent),
            WebSocketRoute("/ws", ws_echo),
        ]
    )


@dataclass
class StandIn:
    data_dir: Path
    port: int
    context: ssl.SSLContext  # trusts the CA, as the clients are told to


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    """The stand-in server on 127.0.0.1:P with the server's data-folder layout (tls/, ca.pem)."""
    data_dir = tmp_path_factory.mktemp("data")
    certs = ensure_certificates(data_dir / "tls", "e2b.localhost")
    shutil.copyfile(certs.ca_cert_path, data_dir / "ca.pem")  # where the server publishes its CA
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        stand_in_app(port),
        ws="websockets-sansio",
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=1,
        timeout_keep_alive=1,  # short, so that an idle upstream connection ends within a test
        ssl_certfile=str(certs.cert_path),
        ssl_keyfile=str(certs.key_path),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield StandIn(data_dir, port, ssl.create_default_context(cafile=data_dir / "ca.pem"))
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


MakeRelay = Callable[[Fault], FaultyEndpoint]


@pytest.fixture
def make_relay(stand_in: StandIn) -> Iterator[MakeRelay]:
    """Started relays in front of the stand-in; each is stopped after the test, and must leak nothing."""
    threads_before = set(threading.enumerate())
    relays: list[FaultyEndpoint] = []

    def make(fault: Fault) -> FaultyEndpoint:
        relay = FaultyEndpoint(stand_in.data_dir, stand_in.port, fault)
        relay.start()
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.stop()
    gc.collect()  # an unclosed socket or transport would warn now, and warnings are errors
    assert set(threading.enumerate()) <= threads_before


def client(stand_in: StandIn) -> httpx.Client:
    return httpx.Client(verify=stand_in.context, timeout=WAIT)


def create(http: httpx.Client, domain: str, path: str = "/sandboxes") -> httpx.Response:
    return http.post(f"https://api.{domain}{path}", json={"templateID": "base"})


def start_stream(http: httpx.Client, domain: str, framing: str) -> httpx.Response:
    url = f"https://49983-{SANDBOX_ID}.{domain}/process.Process/Start"
    headers = {"content-type": CONNECT_JSON, "x-test-framing": framing}
    return http.post(url, content=envelope(0, {"process": {"cmd": "echo"}}), headers=headers)


def direct(stand_in: StandIn) -> str:
    return f"e2b.localhost:{stand_in.port}"


# --- Fault.NONE: the control case ---


def test_none_relays_the_create_with_the_domain_rewritten(stand_in: StandIn, make_relay: MakeRelay) -> None:
    relay = make_relay(Fault.NONE)
    assert relay.domain == f"e2b.localhost:{relay.port}"
    with client(stand_in) as http:
        expected = create(http, direct(stand_in))
        got = create(http, relay.domain)
    assert (got.status_code, got.http_version) == (201, "HTTP/1.1")
    body = got.json()
    assert body == {
        **expected.json(),
        "domain": relay.domain,
        "url": f"https://api.{relay.domain}/sandboxes/{SANDBOX_ID}",
    }
    assert body["notOurs"] == f"e2b.localhost:{stand_in.port}9"
    assert body["received"] == {"templateID": "base"}
    assert got.headers["location"] == f"https://api.{relay.domain}/sandboxes/{SANDBOX_ID}"
    assert got.headers["content-length"] == str(len(got.content))
    assert relay.faults_injected == 0


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_none_relays_every_envelope(stand_in: StandIn, make_relay: MakeRelay, framing: str) -> None:
    relay = make_relay(Fault.NONE)
    with client(stand_in) as http:
        expected = start_stream(http, direct(stand_in), framing)
        got = start_stream(http, relay.domain, framing)
    assert got.status_code == expected.status_code == 200
    assert got.content == expected.content == b"".join(STREAM)
    assert got.headers["content-type"] == CONNECT_JSON
    assert got.headers.get("content-length") == expected.headers.get("content-length")
    assert relay.faults_injected == 0


def test_none_streams_without_buffering(stand_in: StandIn, make_relay: MakeRelay) -> None:
    relay = make_relay(Fault.NONE)
    url = f"https://49983-{SANDBOX_ID}.{relay.domain}/silent"
    with client(stand_in) as http, http.stream("GET", url) as response:
        started = time.monotonic()
        first = next(response.iter_raw())
        assert first == b"first\n"
        assert time.monotonic() - started < 5, "the first chunk waited for the rest of the body"


def test_none_relays_request_bodies_and_websockets(stand_in: StandIn, make_relay: MakeRelay) -> None:
    relay = make_relay(Fault.NONE)
    data = os.urandom(3 << 20)
    with client(stand_in) as http:
        got = http.put(f"https://49983-{SANDBOX_ID}.{relay.domain}/upload", content=iter([data[:1000], data[1000:]]))
    assert got.json() == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    uri = f"wss://49983-{SANDBOX_ID}.{relay.domain}/ws"
    with ws_connect(uri, ssl=stand_in.context, open_timeout=WAIT) as websocket:
        assert websocket.recv(WAIT) == f"49983-{SANDBOX_ID}.{direct(stand_in)}"
        websocket.send("ping")
        assert websocket.recv(WAIT) == "ping"


# --- Host rewriting and connections ---


@pytest.mark.parametrize("label", ["api", f"49983-{SANDBOX_ID}"])
def test_host_port_is_rewritten_for_the_server(stand_in: StandIn, make_relay: MakeRelay, label: str) -> None:
    relay = make_relay(Fault.NONE)
    with client(stand_in) as http:
        got = http.get(f"https://{label}.{relay.domain}/echo")
    assert got.headers["x-seen-host"] == f"{label}.e2b.localhost:{stand_in.port}"


def test_keep_alive_reuses_one_upstream_connection(stand_in: StandIn, make_relay: MakeRelay) -> None:
    relay = make_relay(Fault.NONE)
    with client(stand_in) as http:
        peers = {http.get(f"https://api.{relay.domain}/echo").headers["x-seen-peer"] for _ in range(3)}
        peers.add(create(http, relay.domain).headers["x-seen-peer"])
    assert len(peers) == 1


def raw_get(relay: FaultyEndpoint, stand_in: StandIn, address: str, path: str = "/echo") -> tuple[bytes, ssl.SSLSocket]:
    """The response to a GET on ``api.<relay domain>`` sent over a TLS socket to ``address``, and the open socket."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.socket(family)
    try:
        raw.settimeout(WAIT)
        raw.connect((address, relay.port))
        tls = stand_in.context.wrap_socket(raw, server_hostname=f"api.{relay.domain_name}")
    except BaseException:
        raw.close()
        raise
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: api.{relay.domain}\r\n\r\n".encode())
    return receive_until(tls, b"}"), tls


def receive_until(tls: ssl.SSLSocket, marker: bytes) -> bytes:
    """What arrives until ``marker`` (the end of a small JSON body) has; fails on EOF first."""
    received = b""
    while marker not in received:
        data = tls.recv(65536)
        assert data, f"the connection ended after {received!r}"
        received += data
    return received


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_listens_on_both_loopback_addresses(stand_in: StandIn, make_relay: MakeRelay, address: str) -> None:
    relay = make_relay(Fault.NONE)
    head, tls = raw_get(relay, stand_in, address)
    tls.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert f"x-seen-host: api.e2b.localhost:{stand_in.port}\r\n".encode() in head


def test_expect_100_continue_is_relayed(stand_in: StandIn, make_relay: MakeRelay) -> None:
    relay = make_relay(Fault.NONE)
    host = f"49983-{SANDBOX_ID}.{relay.domain}"
    with (
        socket.create_connection(("127.0.0.1", relay.port), WAIT) as raw,
        stand_in.context.wrap_socket(raw, server_hostname=host.partition(":")[0]) as tls,
    ):
        head = f"PUT /upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        tls.sendall(head.encode())
        assert tls.recv(65536).startswith(b"HTTP/1.1 100 "), "the body is sent only once the server asks for it"
        tls.sendall(b"hello")
        received = receive_until(tls, b"}")
    assert received.startswith(b"HTTP/1.1 200 ")
    assert hashlib.sha256(b"hello").hexdigest().encode() in received


def test_server_closing_an_idle_connection_closes_the_clients(stand_in: StandIn, make_relay: MakeRelay) -> None:
    relay = make_relay(Fault.NONE)
    head, tls = raw_get(relay, stand_in, "127.0.0.1")
    with tls:
        assert head.startswith(b"HTTP/1.1 200 ")
        assert tls.recv(65536) == b"", "the relay kept the connection the server closed (keep-alive 1 s)"


def test_unreachable_server_is_a_502(stand_in: StandIn) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    with FaultyEndpoint(stand_in.data_dir, closed_port) as relay, client(stand_in) as http:
        got = http.get(f"https://api.{relay.domain}/echo")
    assert got.status_code == 502
    assert "cannot reach the server" in got.text


# --- the faults ---


@pytest.mark.parametrize("path", ["/sandboxes", "/v2/sandboxes"])
def test_create_200_changes_only_the_status(stand_in: StandIn, make_relay: MakeRelay, path: str) -> None:
    control = make_relay(Fault.NONE)
    relay = make_relay(Fault.CREATE_200)
    with client(stand_in) as http:
        expected = create(http, control.domain, path)
        got = create(http, relay.domain, path)
        stream = start_stream(http, relay.domain, "chunked")
        echo = http.get(f"https://api.{relay.domain}/echo")
    assert (expected.status_code, got.status_code) == (201, 200)
    assert got.reason_phrase == "OK"
    body = got.json()
    assert body == {
        **expected.json(),
        "domain": relay.domain,
        "url": f"https://api.{relay.domain}/sandboxes/{SANDBOX_ID}",
    }
    assert (stream.status_code, stream.content) == (200, b"".join(STREAM))
    assert echo.status_code == 200
    assert relay.faults_injected == 1


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_drop_stream_event_drops_exactly_the_first_data_envelope(
    stand_in: StandIn, make_relay: MakeRelay, framing: str
) -> None:
    relay = make_relay(Fault.DROP_STREAM_EVENT)
    with client(stand_in) as http:
        got = start_stream(http, relay.domain, framing)
        second = start_stream(http, relay.domain, framing)  # each stream loses its own first data event
        created = create(http, relay.domain)
    expected = [(0, MESSAGES[0]), (0, MESSAGES[2]), (0, MESSAGES[3]), (2, END_OF_STREAM)]
    for response in (got, second):
        assert response.status_code == 200
        assert "content-length" not in response.headers  # re-framed: the body is shorter than announced
        assert response.headers["transfer-encoding"] == "chunked"
        assert parse_stream(response.content) == expected
    assert created.status_code == 201
    assert relay.faults_injected == 2


def envelopes(data: bytes) -> list[tuple[int, bytes]]:
    """The (flags, payload) of every envelope of a complete Connect stream, whatever its codec."""
    found: list[tuple[int, bytes]] = []
    offset = 0
    while offset < len(data):
        length = int.from_bytes(data[offset + 1 : offset + 5], "big")
        found.append((data[offset], data[offset + 5 : offset + 5 + length]))
        assert len(found[-1][1]) == length, "a truncated envelope"
        offset += 5 + length
    return found


def watch(http: httpx.Client, domain: str, codec: str, framing: str) -> httpx.Response:
    url = f"https://49983-{SANDBOX_ID}.{domain}/filesystem.Filesystem/WatchDir"
    headers = {"content-type": CONNECT_PROTO if codec == "proto" else CONNECT_JSON, "x-test-framing": framing}
    return http.post(url, content=envelope(0, {"path": "/w", "recursive": True}), headers=headers)


def watcher_events(http: httpx.Client, domain: str, codec: str, count: int) -> httpx.Response:
    url = f"https://49983-{SANDBOX_ID}.{domain}/filesystem.Filesystem/GetWatcherEvents"
    headers = {"content-type": f"application/{codec}", "x-test-events": str(count)}
    return http.post(url, content=b"{}" if codec == "json" else b"", headers=headers)


def decoded_events(response: httpx.Response) -> list[dict[str, Any]]:
    """A GetWatcherEvents answer's events as JSON, whatever its codec."""
    if response.headers["content-type"] == "application/proto":
        message = filesystem_pb2.GetWatcherEventsResponse.FromString(response.content)
        events: list[dict[str, Any]] = json_format.MessageToDict(message).get("events", [])
        return events
    polled: list[dict[str, Any]] = response.json().get("events", [])
    return polled


@pytest.mark.parametrize("path", ["/sandboxes", "/v2/sandboxes"])
def test_reverse_list_reverses_only_sandbox_lists_of_two_or_more(
    stand_in: StandIn, make_relay: MakeRelay, path: str
) -> None:
    control = make_relay(Fault.NONE)
    relay = make_relay(Fault.REVERSE_LIST)
    with client(stand_in) as http:
        expected = http.get(f"https://api.{control.domain}{path}?n=3")
        got = http.get(f"https://api.{relay.domain}{path}?n=3")
        pair = http.get(f"https://api.{relay.domain}{path}?n=2")
        short = [http.get(f"https://api.{relay.domain}{path}?n={n}") for n in (0, 1)]
        snapshots = http.get(f"https://api.{relay.domain}/snapshots?n=3")
        created = create(http, relay.domain, path)
        stream = start_stream(http, relay.domain, "chunked")
    assert expected.json() == LISTED
    assert got.status_code == 200
    assert got.json() == LISTED[::-1], "the items themselves are unchanged, only their order"
    assert pair.json() == LISTED[1::-1]
    assert [response.json() for response in short] == [[], LISTED[:1]]
    assert got.headers["x-next-token"] == expected.headers["x-next-token"] == "next", "the cursor is left alone"
    assert got.headers["content-length"] == str(len(got.content))
    assert snapshots.json() == LISTED, "another list is left alone"
    assert (created.status_code, created.json()["domain"]) == (201, relay.domain)
    assert (stream.status_code, stream.content) == (200, b"".join(STREAM))
    assert control.faults_injected == 0
    assert relay.faults_injected == 2


@pytest.mark.parametrize("framing", ["chunked", "length"])
@pytest.mark.parametrize("codec", ["json", "proto"])
def test_drop_watch_event_drops_each_watch_streams_first_filesystem_event(
    stand_in: StandIn, make_relay: MakeRelay, codec: str, framing: str
) -> None:
    relay = make_relay(Fault.DROP_WATCH_EVENT)
    with client(stand_in) as http:
        got = watch(http, relay.domain, codec, framing)
        second = watch(http, relay.domain, codec, framing)  # each stream loses its own first event
        process = start_stream(http, relay.domain, framing)
    full = [(item[0], item[5:]) for item in watch_stream(codec)]
    expected = full[:2] + full[3:]  # start, keepalive, then the events after CREATE a.txt
    for response in (got, second):
        assert response.status_code == 200
        assert response.headers["content-type"] == (CONNECT_PROTO if codec == "proto" else CONNECT_JSON)
        assert "content-length" not in response.headers
        assert envelopes(response.content) == expected
    assert (process.status_code, process.content) == (200, b"".join(STREAM)), "a process stream is left alone"
    assert relay.faults_injected == 2


@pytest.mark.parametrize("codec", ["json", "proto"])
def test_drop_watch_event_removes_the_first_polled_event_once(
    stand_in: StandIn, make_relay: MakeRelay, codec: str
) -> None:
    relay = make_relay(Fault.DROP_WATCH_EVENT)
    with client(stand_in) as http:
        empty = watcher_events(http, relay.domain, codec, 0)
        first = watcher_events(http, relay.domain, codec, 3)
        later = watcher_events(http, relay.domain, codec, 2)
    assert [response.status_code for response in (empty, first, later)] == [200, 200, 200]
    assert decoded_events(empty) == []
    assert decoded_events(first) == WATCHER_EVENTS[1:], "CREATE a.txt is gone, the rest is as sent"
    assert decoded_events(later) == WATCHER_EVENTS[:2], "only the first non-empty answer loses an event"
    assert first.headers["content-length"] == str(len(first.content))
    assert relay.faults_injected == 1


# --- lifecycle ---


def test_swap_sandboxes_gives_the_first_two_each_others_traffic(stand_in: StandIn, make_relay: MakeRelay) -> None:
    relay = make_relay(Fault.SWAP_SANDBOXES)
    with client(stand_in) as http:
        for hint in ("sa", "sb", "sc"):
            made = http.post(f"https://api.{relay.domain}/sandboxes", json={"templateID": "base", "sandboxHint": hint})
            assert made.json()["sandboxID"] == hint
        assert relay.swapped_pair == ("sa", "sb")
        to_a = http.get(f"https://49983-sa.{relay.domain}/echo", headers={"X-Access-Token": "token-sa"})
        to_b = http.get(f"https://8000-sb.{relay.domain}/echo")
        to_c = http.get(f"https://49983-sc.{relay.domain}/echo", headers={"X-Access-Token": "token-sc"})
        shared = http.get(f"https://sandbox.{relay.domain}/echo", headers={"E2b-Sandbox-Id": "sa"})
    assert to_a.headers["x-seen-host"] == f"49983-sb.e2b.localhost:{stand_in.port}"
    assert to_a.headers["x-seen-token"] == "token-sb", "the partner's token replaces the caller's"
    assert to_b.headers["x-seen-host"] == f"8000-sa.e2b.localhost:{stand_in.port}"
    assert to_c.headers["x-seen-host"] == f"49983-sc.e2b.localhost:{stand_in.port}"
    assert to_c.headers["x-seen-token"] == "token-sc", "a third sandbox is left alone"
    assert shared.headers["x-seen-sandbox-id"] == "sb", "header routing is swapped too"
    assert relay.faults_injected == 3


def test_stop_cuts_open_streams_and_frees_the_port(stand_in: StandIn) -> None:
    threads_before = set(threading.enumerate())
    relay = FaultyEndpoint(stand_in.data_dir, stand_in.port)
    relay.start()
    port = relay.port
    url = f"https://49983-{SANDBOX_ID}.{relay.domain}/silent"
    with client(stand_in) as http, http.stream("GET", url) as response:
        chunks = response.iter_raw()
        assert next(chunks) == b"first\n"
        started = time.monotonic()
        relay.stop()
        assert time.monotonic() - started < 5
        with pytest.raises(httpx.TransportError):
            next(chunks)
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as probe, pytest.raises(ConnectionRefusedError):
            probe.connect((address, port))
    gc.collect()
    assert set(threading.enumerate()) <= threads_before
    relay.start()  # a restart keeps Q, so clients configured with the domain still reach it
    try:
        assert relay.port == port
        with client(stand_in) as http:
            assert http.get(f"https://api.{relay.domain}/echo").status_code == 200
    finally:
        relay.stop()
    relay.stop()  # stopping twice is harmless


def test_client_env_points_only_the_domain_at_the_relay(stand_in: StandIn) -> None:
    relay = FaultyEndpoint(stand_in.data_dir, stand_in.port, port=4321)
    server_env = {
        "E2B_API_KEY": "e2b_key",
        "E2B_DOMAIN": f"e2b.localhost:{stand_in.port}",
        "SSL_CERT_FILE": "/ca.pem",
        "NODE_EXTRA_CA_CERTS": "/ca.pem",
    }
    assert relay.client_env(server_env) == {**server_env, "E2B_DOMAIN": "e2b.localhost:4321"}
    with pytest.raises(ValueError, match="E2B_DOMAIN"):
        relay.client_env({**server_env, "E2B_DOMAIN": "e2b.localhost:1"})
    with pytest.raises(RuntimeError):
        _ = FaultyEndpoint(stand_in.data_dir, stand_in.port).domain  # Q is chosen at start
