"""A deliberately broken E2B endpoint: a TLS relay in front of the real server that injects one fault.

The harness's own tests point the official clients at it to prove that a check can fail: a check
that still passes behind ``Fault.CREATE_200``, ``Fault.DROP_STREAM_EVENT``, ``Fault.SWAP_SANDBOXES``,
``Fault.REVERSE_LIST`` or ``Fault.DROP_WATCH_EVENT`` checks nothing.
``Fault.NONE`` is the control case: the relay alone must change no outcome.

How the relay stays transparent:

- it listens on 127.0.0.1 and ::1 at port Q and presents the server's own certificate, which
  covers ``e2b.localhost`` and ``*.e2b.localhost`` whatever the port, so clients given
  ``E2B_DOMAIN=e2b.localhost:Q`` and the server's CA trust it;
- each client connection gets its own upstream connection to port P (TLS verified with the CA,
  SNI = the request's host name), opened at its first request; the Host ``name:Q`` is forwarded as
  ``name:P`` because the server routes on it;
- messages stream event by event (h11 on both sides parses and re-serialises them), so keep-alive,
  ``Expect: 100-continue`` and minutes-long Connect streams behave as they do directly; an
  upgrade (WebSocket) is spliced as raw bytes after the 101;
- control-plane JSON bodies (at most 1 MiB; larger ones pass unchanged) are buffered, to rewrite
  ``e2b.localhost:P`` to ``:Q``: the create and connect responses' ``domain`` is what clients build
  sandbox hosts from, so without it they would bypass the relay; the only other bodies buffered are
  ``GetWatcherEvents`` answers under ``Fault.DROP_WATCH_EVENT`` (same limit);
- the relay ends a client connection whenever the server ends its upstream one (an idle keep-alive
  timeout included), and the reverse, so that connection lifetimes are the server's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import json
import re
import socket
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, cast

import h11
from google.protobuf.message import DecodeError

from contract.generated.filesystem import filesystem_pb2

if TYPE_CHECKING:
    from conformance._endpoint import ManagedServer

__all__ = ["Fault", "FaultyEndpoint"]

_READ_SIZE = 65536
_MAX_REWRITE = 1 << 20  # largest control-plane body held back for rewriting
_MAX_ENVELOPE = 16 << 20  # a larger envelope is not held back: the rest of its stream passes as is
_MAX_PIPELINED = 1 << 20  # bytes of a next request read (and held by h11) while a response streams
_TIMEOUT_S = 10.0  # starting, stopping, TLS handshakes and opening the upstream connection
_CLOSE_TIMEOUT_S = 2.0  # a peer that does not answer our TLS close_notify in time is cut off
_START_PATH_SUFFIX = b"/process.Process/Start"
_CREATE_PATHS = frozenset({b"/sandboxes", b"/v2/sandboxes"})
_LIST_PATHS = _CREATE_PATHS  # GET on the same two paths lists sandboxes
_WATCH_DIR_PATH_SUFFIX = b"/filesystem.Filesystem/WatchDir"
_WATCHER_EVENTS_PATH_SUFFIX = b"/filesystem.Filesystem/GetWatcherEvents"
_ENVELOPE_PREFIX = 5  # flags byte and 4-byte big-endian length
_FLAG_COMPRESSED = 0x01
_FLAG_END_STREAM = 0x02
_REWRITTEN_HEADERS = frozenset({b"location", b"content-location"})


class Fault(enum.Enum):
    """What the relay breaks."""

    NONE = "none"
    CREATE_200 = "create-200"  # POST /sandboxes and /v2/sandboxes: 201 becomes 200, body unchanged
    DROP_STREAM_EVENT = "drop-stream-event"  # process.Process/Start: the first "data" event's envelope is dropped
    # The first two sandboxes created through the relay get each other's sandbox traffic: Host (and
    # E2b-Sandbox-Id) name the other one, and its envd token replaces the caller's, as an edge that
    # looked up the wrong sandbox would do. Everything the clients see then comes from the other one.
    SWAP_SANDBOXES = "swap-sandboxes"
    REVERSE_LIST = "reverse-list"  # GET /sandboxes and /v2/sandboxes: a JSON array of 2 or more comes reversed
    # filesystem.Filesystem/WatchDir: each stream's first envelope carrying a filesystem event is
    # dropped; GetWatcherEvents: the first non-empty ``events`` the relay sees loses its first element.
    DROP_WATCH_EVENT = "drop-watch-event"


class _PeerGoneError(Exception):
    """The client or the server ended its connection mid-exchange; the other one is ended too."""


class FaultyEndpoint:
    """A TLS relay on port Q in front of the server on port P that injects ``fault``.

    ``data_dir`` is the server's: its ``tls/cert.pem`` and ``tls/key.pem`` are presented to clients
    and its ``ca.pem`` verifies the server. ``port`` is Q (a free one by default, then kept across
    restarts); ``domain_name`` is the server's domain without its port.
    """

    def __init__(
        self,
        data_dir: Path,
        upstream_port: int,
        fault: Fault = Fault.NONE,
        *,
        port: int | None = None,
        domain_name: str = "e2b.localhost",
        upstream_host: str = "127.0.0.1",
    ) -> None:
        self.data_dir = data_dir
        self.upstream_port = upstream_port
        self.fault = fault  # read at the start of each request, so it may be changed while running
        self.domain_name = domain_name
        self.upstream_host = upstream_host
        self._port = port
        self._faults_injected = 0
        self._swapped_pair: tuple[str, str] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    @classmethod
    def for_server(cls, server: ManagedServer, fault: Fault = Fault.NONE, *, port: int | None = None) -> Self:
        """A relay in front of a started or not yet started managed server (its data folder and port)."""
        name, _, _ = server.domain.rpartition(":")
        return cls(server.data_dir, server.port, fault, port=port, domain_name=name)

    @property
    def port(self) -> int:
        """Q; known once started (or when given)."""
        if self._port is None:
            raise RuntimeError("the relay's port is chosen when it starts")
        return self._port

    @property
    def domain(self) -> str:
        """``E2B_DOMAIN`` for clients that should go through the relay."""
        return f"{self.domain_name}:{self.port}"

    @property
    def faults_injected(self) -> int:
        """How many responses the fault changed so far (0 for ``Fault.NONE``)."""
        return self._faults_injected

    @property
    def swapped_pair(self) -> tuple[str, str] | None:
        """``Fault.SWAP_SANDBOXES``: the two sandboxes given each other's traffic, once both exist."""
        return self._swapped_pair

    def client_env(self, server_client_env: Mapping[str, str]) -> dict[str, str]:
        """The server's client variables with ``E2B_DOMAIN`` pointing at the relay."""
        expected = f"{self.domain_name}:{self.upstream_port}"
        if server_client_env.get("E2B_DOMAIN") != expected:
            raise ValueError(f"E2B_DOMAIN is {server_client_env.get('E2B_DOMAIN')!r}, not the relayed {expected!r}")
        return {**server_client_env, "E2B_DOMAIN": self.domain}

    def start(self) -> None:
        """Listen on 127.0.0.1 and ::1 at Q; returns once connections are accepted."""
        if self._thread is not None:
            raise RuntimeError("the relay is already running")
        listen_context, upstream_context = self._contexts()  # missing certificates fail here, in the caller
        sockets = _listen_pair(self._port)
        self._port = sockets[0].getsockname()[1]
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        thread = threading.Thread(
            target=asyncio.run,
            args=(self._main(sockets, listen_context, upstream_context, ready),),
            name=f"faulty-endpoint-{self._port}",
            daemon=True,
        )
        thread.start()
        try:
            ready.result(_TIMEOUT_S)
        except BaseException:
            thread.join(_TIMEOUT_S)
            raise
        self._thread = thread

    def stop(self) -> None:
        """Stop listening and cut every open connection (streams included); returns when all is closed."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None or loop is None or stopping is None:
            return
        loop.call_soon_threadsafe(stopping.set)
        thread.join(_TIMEOUT_S * 2)
        if thread.is_alive():
            raise RuntimeError("the relay did not stop")
        self._thread = self._loop = self._stopping = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def _contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        listen = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        listen.minimum_version = ssl.TLSVersion.TLSv1_2
        listen.load_cert_chain(self.data_dir / "tls" / "cert.pem", self.data_dir / "tls" / "key.pem")
        listen.set_alpn_protocols(["http/1.1"])  # as the server: it speaks HTTP/1.1 only
        upstream = ssl.create_default_context(cafile=self.data_dir / "ca.pem")
        upstream.set_alpn_protocols(["http/1.1"])
        return listen, upstream

    def _count_fault(self) -> None:
        self._faults_injected += 1  # only the relay's thread writes it

    async def _main(
        self,
        sockets: list[socket.socket],
        listen_context: ssl.SSLContext,
        upstream_context: ssl.SSLContext,
        ready: concurrent.futures.Future[None],
    ) -> None:
        relay = _Relay(self, upstream_context)
        servers: list[asyncio.Server] = []
        try:
            for sock in sockets:
                servers.append(
                    await asyncio.start_server(
                        relay.accept, sock=sock, ssl=listen_context, ssl_handshake_timeout=_TIMEOUT_S
                    )
                )
            stopping = asyncio.Event()
            self._loop, self._stopping = asyncio.get_running_loop(), stopping
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it in the caller's thread
            for server in servers:
                server.close()
            for sock in sockets[len(servers) :]:
                sock.close()
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            await stopping.wait()
        finally:
            for server in servers:
                server.close()
            await relay.close_all()
            for server in servers:
                await server.wait_closed()


def _listen_pair(port: int | None) -> list[socket.socket]:
    """Listening sockets on 127.0.0.1 and ::1 at ``port``, or at one port free on both."""
    while True:
        four = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        six = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            for sock in (four, six):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart reuses Q at once
            six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            four.bind(("127.0.0.1", port or 0))
            try:
                six.bind(("::1", four.getsockname()[1]))
            except OSError:
                if port is not None:
                    raise
                four.close()
                six.close()
                continue  # the port chosen on 127.0.0.1 is taken on ::1: try another one
            for sock in (four, six):
                sock.listen(128)
                sock.setblocking(False)
        except BaseException:
            four.close()
            six.close()
            raise
        return [four, six]


@dataclass(frozen=True)
class _Plan:
    """What to change in one exchange, decided from the request alone."""

    control_plane: bool
    create_200: bool
    drop_stream_event: bool
    head: bool
    reverse_list: bool = False
    drop_watch_event: bool = False  # a WatchDir stream
    trim_watcher_events: bool = False  # a GetWatcherEvents answer


@dataclass
class _Upstream:
    """One connection to the server, for requests with host name ``sni``."""

    sni: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h11.Connection


class _Relay:
    """The relay inside its event loop: accepted connections and the settings they share."""

    def __init__(self, endpoint: FaultyEndpoint, upstream_context: ssl.SSLContext) -> None:
        self.endpoint = endpoint
        self.upstream_context = upstream_context
        self.port = str(endpoint.port)
        self.upstream_port = str(endpoint.upstream_port)
        self.control_plane_host = f"api.{endpoint.domain_name}"
        upstream_domain = f"{endpoint.domain_name}:{endpoint.upstream_port}".encode()
        self._upstream_domain = re.compile(re.escape(upstream_domain) + rb"(?![0-9])")  # :80 must not match :8000
        self._relay_domain = f"{endpoint.domain_name}:{endpoint.port}".encode()
        self._links: dict[_Link, asyncio.Task[None]] = {}
        self._closing = False
        self.tokens: dict[str, str] = {}  # sandbox id → envd token, from create/connect answers
        self._paired: list[str] = []  # the first two sandbox ids seen, under Fault.SWAP_SANDBOXES
        self.swapped: dict[str, str] = {}  # Fault.SWAP_SANDBOXES: the first two sandboxes, each to the other
        self.watcher_events_trimmed = False  # Fault.DROP_WATCH_EVENT: a GetWatcherEvents answer lost an event

    def learn(self, body: bytes) -> None:
        """Remember a sandbox's envd token from a control-plane answer; pair the first two sandboxes."""
        try:
            answer = json.loads(body)
        except ValueError:
            return
        if not isinstance(answer, dict) or not isinstance(answer.get("sandboxID"), str):
            return
        sandbox_id = answer["sandboxID"]
        if isinstance(answer.get("envdAccessToken"), str):
            self.tokens[sandbox_id] = answer["envdAccessToken"]
        paired = self._paired
        if self.endpoint.fault is Fault.SWAP_SANDBOXES and len(paired) < 2 and sandbox_id not in paired:
            paired.append(sandbox_id)
            if len(paired) == 2:
                self.swapped = {paired[0]: paired[1], paired[1]: paired[0]}
                self.endpoint._swapped_pair = (paired[0], paired[1])  # written from this loop only

    def swap(self, name: str, headers: list[tuple[bytes, bytes]]) -> tuple[str, list[tuple[bytes, bytes]]]:
        """A sandbox host name and request headers as sent for its partner (unchanged if it has none)."""
        label, dot, domain = name.partition(".")
        port, dash, sandbox_id = label.partition("-")
        header_id = _header(headers, b"e2b-sandbox-id")
        target_id = sandbox_id if dash and port.isdigit() else header_id
        partner = self.swapped.get(target_id)
        if partner is None:
            return name, headers
        self.count_fault()
        if dash and port.isdigit():
            name = f"{port}-{partner}{dot}{domain}"
        swapped = []
        for key, value in headers:
            sent = value
            if key.lower() == b"e2b-sandbox-id":
                sent = partner.encode()
            elif key.lower() == b"x-access-token" and partner in self.tokens:
                sent = self.tokens[partner].encode()
            swapped.append((key, sent))
        return name, swapped

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(self, reader, writer)
        task = asyncio.current_task()
        assert task is not None
        self._links[link] = task
        try:
            await link.run()
        except (OSError, h11.ProtocolError, _PeerGoneError):
            pass  # a peer went away or broke HTTP: the connection just ends, as it would at the server
        except asyncio.CancelledError:
            if not self._closing:
                raise
            # Cancelled by close_all: end quietly, for asyncio (3.11) logs a cancelled connection task as an error.
        finally:
            del self._links[link]

    async def close_all(self) -> None:
        self._closing = True
        links = dict(self._links)
        for link, task in links.items():
            link.abort()
            task.cancel()
        await asyncio.gather(*links.values(), return_exceptions=True)
        await asyncio.sleep(0)  # aborted transports release their sockets at the next turn of the loop

    def plan(self, request: h11.Request, host_name: str) -> _Plan:
        fault = self.endpoint.fault
        path = request.target.partition(b"?")[0]
        control_plane = host_name == self.control_plane_host
        post, get = request.method == b"POST", request.method == b"GET"
        drop_watch = fault is Fault.DROP_WATCH_EVENT and post and not control_plane
        return _Plan(
            control_plane=control_plane,
            create_200=fault is Fault.CREATE_200 and control_plane and post and path in _CREATE_PATHS,
            drop_stream_event=fault is Fault.DROP_STREAM_EVENT and post and path.endswith(_START_PATH_SUFFIX),
            head=request.method == b"HEAD",
            reverse_list=fault is Fault.REVERSE_LIST and control_plane and get and path in _LIST_PATHS,
            drop_watch_event=drop_watch and path.endswith(_WATCH_DIR_PATH_SUFFIX),
            trim_watcher_events=drop_watch and path.endswith(_WATCHER_EVENTS_PATH_SUFFIX),
        )

    def rewrite(self, data: bytes) -> bytes:
        """The server's ``domain:P`` as the relay's ``domain:Q``."""
        return self._upstream_domain.sub(self._relay_domain, data)

    def count_fault(self) -> None:
        self.endpoint._count_fault()  # the endpoint's counter, written only from this loop

    def reverse_list(self, body: bytes) -> bytes:
        """A JSON array of at least two items, reversed; anything else unchanged."""
        try:
            items = json.loads(body)
        except ValueError:
            return body
        if not isinstance(items, list) or len(items) < 2:
            return body
        self.count_fault()
        return json.dumps(items[::-1], separators=(",", ":"), ensure_ascii=False).encode()

    def trim_watcher_events(self, body: bytes, codec: str) -> bytes:
        """The first non-empty ``events`` of all GetWatcherEvents answers without its first element."""
        if self.watcher_events_trimmed:
            return body
        if codec == "proto":
            try:
                message = filesystem_pb2.GetWatcherEventsResponse.FromString(body)
            except DecodeError:
                return body
            if not message.events:
                return body
            del message.events[0]
            trimmed = message.SerializeToString()
        else:
            try:
                answer = json.loads(body)
            except ValueError:
                return body
            if not isinstance(answer, dict) or not isinstance(events := answer.get("events"), list) or not events:
                return body
            trimmed = json.dumps({**answer, "events": events[1:]}, separators=(",", ":"), ensure_ascii=False).encode()
        self.watcher_events_trimmed = True
        self.count_fault()
        return trimmed


class _Link:
    """One client connection and the upstream connection currently serving it."""

    def __init__(self, relay: _Relay, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.relay = relay
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.SERVER)
        self.upstream: _Upstream | None = None

    def abort(self) -> None:
        self.writer.transport.abort()
        if self.upstream is not None:
            self.upstream.writer.transport.abort()

    async def run(self) -> None:
        try:
            while (request := await self._next_request()) is not None:
                if not await self._exchange(request):
                    return
        finally:
            await self._close_upstream()
            await _close(self.writer)

    async def _next_request(self) -> h11.Request | None:
        """The client's next request; None once it closes, or the server closes the idle upstream connection."""
        reading = asyncio.create_task(_next_event(self.conn, self.reader))
        watching = asyncio.create_task(self.upstream.reader.read(_READ_SIZE)) if self.upstream is not None else None
        try:
            while watching is not None:
                await asyncio.wait({reading, watching}, return_when=asyncio.FIRST_COMPLETED)
                if reading.done():
                    break
                # The server ended the idle connection (or sent bytes it may not send between responses).
                await self._close_upstream()
                watching = None
                if not self.conn.trailing_data[0]:
                    return None  # nothing of a next request arrived yet: end the client's idle connection too
            event = await reading
        finally:
            for task in (reading, watching):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (reading, watching) if t is not None), return_exceptions=True)
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise _PeerGoneError(f"unexpected {event!r} before a request")
        return event

    async def _exchange(self, request: h11.Request) -> bool:
        """Relay one request and its response; True if the client connection can carry another."""
        host = _header(request.headers, b"host")
        name, port = _split_host(host)
        if port == self.relay.port:
            host = host[: -len(port)] + self.relay.upstream_port  # the server routes on the Host's port
        plan = self.relay.plan(request, name)
        raw_headers = list(request.headers.raw_items())
        if self.relay.swapped and not plan.control_plane:
            swapped_name, raw_headers = self.relay.swap(name, raw_headers)
            if swapped_name != name:
                host, name = swapped_name + host[len(name) :], swapped_name
        upstream = await self._upstream_for(name or self.relay.endpoint.domain_name)
        if upstream is None:
            return False
        headers = [(key, host.encode("latin-1") if key.lower() == b"host" else value) for key, value in raw_headers]
        await _send(
            upstream.writer, upstream.conn, h11.Request(method=request.method, target=request.target, headers=headers)
        )
        sending = asyncio.create_task(self._pump_request(upstream))
        receiving = asyncio.create_task(self._pump_response(upstream, plan))
        try:
            await asyncio.wait({sending, receiving}, return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                sending.result()  # the request side only ends by raising: the client left mid-exchange
            switch = await receiving
        finally:
            for task in (sending, receiving):
                task.cancel()
            await asyncio.gather(sending, receiving, return_exceptions=True)
        if switch is not None:
            await self._splice(upstream, switch)
            return False
        if upstream.conn.our_state is h11.DONE and upstream.conn.their_state is h11.DONE:
            upstream.conn.start_next_cycle()
        else:
            await self._close_upstream()
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            return True
        return False

    async def _upstream_for(self, sni: str) -> _Upstream | None:
        """The upstream connection for this host name; None (after answering 502) if the server cannot be reached."""
        if self.upstream is not None and self.upstream.sni != sni:
            await self._close_upstream()  # another host (and so another certificate name) than the last request's
        if self.upstream is None:
            endpoint = self.relay.endpoint
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        endpoint.upstream_host,
                        endpoint.upstream_port,
                        ssl=self.relay.upstream_context,
                        server_hostname=sni,
                        ssl_handshake_timeout=_TIMEOUT_S,
                    ),
                    _TIMEOUT_S,
                )
            except (OSError, TimeoutError) as exc:
                await self._answer_502(f"faulty endpoint: cannot reach the server: {exc}\n")
                return None
            self.upstream = _Upstream(sni, reader, writer, h11.Connection(h11.CLIENT))
        return self.upstream

    async def _answer_502(self, message: str) -> None:
        body = message.encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self._to_client(h11.Response(status_code=502, headers=headers))
        await self._to_client(h11.Data(data=body))
        await self._to_client(h11.EndOfMessage())

    async def _pump_request(self, upstream: _Upstream) -> None:
        """The request body to the server, then watch the client: leaving mid-response ends the exchange."""
        while True:
            event = await _next_event(self.conn, self.reader)
            if isinstance(event, h11.Data | h11.EndOfMessage):
                await _send(upstream.writer, upstream.conn, event)
                if isinstance(event, h11.EndOfMessage):
                    break
            else:
                raise _PeerGoneError("the client left mid-request")
        # A Connect stream may be silent for minutes: a client that leaves must be noticed now, so
        # that the server sees its connection end too, as it would without the relay.
        while True:
            data = await self.reader.read(_READ_SIZE)
            if not data:
                raise _PeerGoneError("the client left mid-response")
            self.conn.receive_data(data)  # a pipelined next request waits in h11's buffer
            if len(self.conn.trailing_data[0]) > _MAX_PIPELINED:
                await asyncio.get_running_loop().create_future()  # read no more until this response ends

    async def _pump_response(self, upstream: _Upstream, plan: _Plan) -> h11.InformationalResponse | None:
        """The response to the client, with the plan's changes; a 101 is returned unsent, for the splice."""
        held: h11.Response | None = None  # a control-plane JSON response waiting for its whole body
        body = bytearray()
        dropper: _EnvelopeDropper | None = None
        while True:
            event = await _next_event(upstream.conn, upstream.reader)
            if isinstance(event, h11.InformationalResponse):
                if event.status_code == 101:
                    return event
                await self._to_client(event)
            elif isinstance(event, h11.Response):
                response = event
                if plan.control_plane:
                    response = self._rewrite_headers(response)
                if plan.create_200 and response.status_code == 201:
                    response = _with(response, status_code=200, reason=b"OK")
                    self.relay.count_fault()
                if plan.control_plane and not plan.head and _is_plain_json(response):
                    held = response
                    continue
                if plan.trim_watcher_events and _unary_codec(response) is not None:
                    held = response
                    continue
                if plan.drop_stream_event and _is_connect_stream(response):
                    dropper = _EnvelopeDropper(self.relay.count_fault, _is_data_event)
                    response = _with(response, headers=_without_framing(response))  # h11 re-frames: chunked
                if plan.drop_watch_event and (codec := _stream_codec(response)) is not None:
                    is_event = _is_watch_event_proto if codec == "proto" else _is_watch_event_json
                    dropper = _EnvelopeDropper(self.relay.count_fault, is_event)
                    response = _with(response, headers=_without_framing(response))
                await self._to_client(response)
            elif isinstance(event, h11.Data):
                if held is not None:
                    body += event.data
                    if len(body) > _MAX_REWRITE:  # too big to hold: it passes unchanged
                        await self._to_client(held)
                        await self._to_client(h11.Data(data=bytes(body)))
                        held = None
                    continue
                data = dropper.feed(event.data) if dropper is not None else event.data
                if data:
                    await self._to_client(h11.Data(data=data))
            elif isinstance(event, h11.EndOfMessage):
                if held is not None:
                    rewritten = self._rewrite_body(plan, held, bytes(body))
                    length = [(b"content-length", str(len(rewritten)).encode())]
                    await self._to_client(_with(held, headers=_without_framing(held) + length))
                    if rewritten:
                        await self._to_client(h11.Data(data=rewritten))
                    event = h11.EndOfMessage()  # a body with a Content-Length cannot carry trailers
                elif dropper is not None and (rest := dropper.finish()):
                    await self._to_client(h11.Data(data=rest))
                await self._to_client(event)
                return None
            else:
                raise _PeerGoneError("the server left mid-response")

    def _rewrite_body(self, plan: _Plan, response: h11.Response, body: bytes) -> bytes:
        """A held body as the client gets it: the relay's domain, and the plan's fault if it answered 200."""
        if plan.control_plane:
            self.relay.learn(body)
            body = self.relay.rewrite(body)
        if response.status_code != 200:
            return body
        if plan.reverse_list:
            body = self.relay.reverse_list(body)
        if plan.trim_watcher_events and (codec := _unary_codec(response)) is not None:
            body = self.relay.trim_watcher_events(body, codec)
        return body

    def _rewrite_headers(self, response: h11.Response) -> h11.Response:
        headers = [
            (key, self.relay.rewrite(value) if key.lower() in _REWRITTEN_HEADERS else value)
            for key, value in response.headers.raw_items()
        ]
        return _with(response, headers=headers)

    async def _splice(self, upstream: _Upstream, switch: h11.InformationalResponse) -> None:
        """After a 101 both sides speak another protocol: copy bytes both ways until either side ends."""
        await self._to_client(switch)
        client_rest, client_closed = self.conn.trailing_data
        upstream_rest, upstream_closed = upstream.conn.trailing_data
        if client_rest:
            upstream.writer.write(client_rest)
        if upstream_rest:
            self.writer.write(upstream_rest)
        if client_closed or upstream_closed:
            return
        copies = {
            asyncio.create_task(_copy(self.reader, upstream.writer)),
            asyncio.create_task(_copy(upstream.reader, self.writer)),
        }
        try:
            await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in copies:
                task.cancel()
            await asyncio.gather(*copies, return_exceptions=True)

    async def _to_client(self, event: h11.Event) -> None:
        await _send(self.writer, self.conn, event)

    async def _close_upstream(self) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            await _close(upstream.writer)


class _EnvelopeDropper:
    """A Connect stream without its first uncompressed envelope that ``is_event`` picks (flags, payload)."""

    def __init__(self, on_drop: Callable[[], None], is_event: Callable[[int, bytes], bool]) -> None:
        self._on_drop = on_drop
        self._is_event = is_event
        self._buffer = bytearray()
        self._passing = False  # dropped already, or given up: everything else passes as is

    def feed(self, data: bytes) -> bytes:
        if self._passing:
            return data
        self._buffer += data
        out = bytearray()
        while not self._passing and len(self._buffer) >= _ENVELOPE_PREFIX:
            flags = self._buffer[0]
            length = int.from_bytes(self._buffer[1:_ENVELOPE_PREFIX], "big")
            if length > _MAX_ENVELOPE:
                self._passing = True
                break
            end = _ENVELOPE_PREFIX + length
            if len(self._buffer) < end:
                break  # the rest of this envelope has not arrived yet
            envelope = bytes(self._buffer[:end])
            del self._buffer[:end]
            if self._is_event(flags, envelope[_ENVELOPE_PREFIX:]):
                self._passing = True
                self._on_drop()
            else:
                out += envelope
        if self._passing:
            out += self._buffer
            self._buffer.clear()
        return bytes(out)

    def finish(self) -> bytes:
        """What is left: a truncated envelope reaches the client as the server sent it."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest


def _json_message(flags: int, payload: bytes) -> dict[str, Any] | None:
    """A message envelope's JSON object; None for the end of the stream, compressed or other payloads."""
    if flags & (_FLAG_COMPRESSED | _FLAG_END_STREAM):
        return None
    try:
        message = json.loads(payload)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _is_data_event(flags: int, payload: bytes) -> bool:
    """True for a message envelope whose JSON is ``{"event": {"data": ...}}`` (a stdout or stderr chunk)."""
    message = _json_message(flags, payload) or {}
    return isinstance(event := message.get("event"), dict) and "data" in event


def _is_watch_event_json(flags: int, payload: bytes) -> bool:
    """True for a WatchDir message envelope whose JSON is ``{"filesystem": ...}`` (not start or keepalive)."""
    message = _json_message(flags, payload) or {}
    return isinstance(message.get("filesystem"), dict)


def _is_watch_event_proto(flags: int, payload: bytes) -> bool:
    """The same for the protobuf codec: a ``WatchDirResponse`` whose ``event`` is ``filesystem``."""
    if flags & (_FLAG_COMPRESSED | _FLAG_END_STREAM):
        return False  # the end-of-stream message is JSON under either codec
    try:
        message = filesystem_pb2.WatchDirResponse.FromString(payload)
    except DecodeError:
        return False
    kind: str | None = message.WhichOneof("event")
    return kind == "filesystem"


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Event | type[h11.PAUSED]:
    """The connection's next event, reading as much as it needs (EOF becomes ``ConnectionClosed``)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return cast("h11.Event | type[h11.PAUSED]", event)  # mypy cannot narrow a sentinel class away
        conn.receive_data(await reader.read(_READ_SIZE))


async def _send(writer: asyncio.StreamWriter, conn: h11.Connection, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        writer.write(data)
        await writer.drain()  # every event goes out now: streams must not wait in a buffer


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(_READ_SIZE):
        writer.write(data)
        await writer.drain()


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close with a TLS close_notify; a peer that does not answer in time (or our cancellation) cuts it off."""
    writer.close()
    closed = False
    try:
        await asyncio.wait_for(writer.wait_closed(), _CLOSE_TIMEOUT_S)
        closed = True
    except OSError:
        closed = True  # the connection was lost with an error: closed all the same
    except TimeoutError:
        pass
    finally:
        if not closed:
            # Cut, not left half-closed: the socket is released at the loop's next turn, before it ends.
            writer.transport.abort()


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str:
    """The first value of ``name`` (a lowercase name), as text; empty if absent."""
    return next((value.decode("latin-1") for key, value in headers if key.lower() == name), "")


def _split_host(host: str) -> tuple[str, str]:
    """A Host value's lowercase name (IPv6 without brackets) and its port text ("" if none)."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = host.partition(":")
    return name.lower(), port


def _is_plain_json(response: h11.Response) -> bool:
    media_type = _header(response.headers, b"content-type").partition(";")[0].strip().lower()
    encoding = _header(response.headers, b"content-encoding").strip().lower()
    json_type = media_type == "application/json" or media_type.endswith("+json")
    return json_type and encoding in ("", "identity") and response.status_code not in (204, 304)


def _is_connect_stream(response: h11.Response) -> bool:
    media_type = _header(response.headers, b"content-type").partition(";")[0].strip().lower()
    return media_type == "application/connect+json"


def _stream_codec(response: h11.Response) -> str | None:
    """The codec ("json" or "proto") of a successful Connect stream; None for anything else."""
    media_type = _header(response.headers, b"content-type").partition(";")[0].strip().lower()
    codecs = {"application/connect+json": "json", "application/connect+proto": "proto"}
    return codecs.get(media_type) if response.status_code == 200 else None


def _unary_codec(response: h11.Response) -> str | None:
    """The codec ("json" or "proto") of an uncompressed successful Connect unary answer; None otherwise."""
    media_type = _header(response.headers, b"content-type").partition(";")[0].strip().lower()
    encoding = _header(response.headers, b"content-encoding").strip().lower()
    if response.status_code != 200 or encoding not in ("", "identity"):
        return None
    return {"application/json": "json", "application/proto": "proto"}.get(media_type)


def _without_framing(response: h11.Response) -> list[tuple[bytes, bytes]]:
    framing = (b"content-length", b"transfer-encoding")
    return [(key, value) for key, value in response.headers.raw_items() if key.lower() not in framing]


def _with(
    response: h11.Response,
    *,
    status_code: int | None = None,
    reason: bytes | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> h11.Response:
    return h11.Response(
        status_code=response.status_code if status_code is None else status_code,
        reason=response.reason if reason is None else reason,
        headers=response.headers.raw_items() if headers is None else headers,
        http_version=response.http_version,
    )
