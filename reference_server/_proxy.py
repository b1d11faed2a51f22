"""The data plane: one client request, relayed to one port of one sandbox, and its answer back.

The edge decides where a request goes and calls ``SandboxProxy.forward`` with the upstream's
address; the proxy only moves bytes and never looks inside them.

- **Streaming both ways.** The request body goes upstream as it arrives and the response comes
  back chunk by chunk, each chunk sent to the client at once: uploads and downloads can be
  gigabytes, and envd's Connect server streams send small frames minutes apart that a client
  must see immediately. Bodies are raw bytes (gzip passes through untouched); the only headers
  changed are hop-by-hop ones, which describe one connection and so are never relayed.
- **No read timeout.** A stream lasts as long as its client wants (a command that runs for an
  hour may be an hour of silence). An exchange ends when the client leaves, which closes the
  upstream connection at once so the agent stops the stream, or when the upstream fails, which
  leaves the client's response unfinished so it sees an error, never a silently truncated body.
  TCP keepalive notices a sandbox that vanished without a word.
- **502** (``{"code": 502, "message": ...}``) means the sandbox's port could not be reached: the
  connection was refused, found no route or timed out (``connect_timeout``), or it closed before
  answering. Messages name the port and the kind of failure, never addresses or header values.
- **WebSockets** are relayed message by message (ASGI has no frames), with the subprotocol the
  upstream chose and close codes carried both ways.

Connections to sandboxes are pooled and kept alive across requests; ``max_connections`` bounds
the pool, ``max_websockets`` the open WebSockets. The pool is shared, so each sandbox gets a share:
at most ``sandbox_max_requests`` requests in flight (each holds one pooled connection while it
lasts) and ``sandbox_max_websockets`` WebSockets. One more is refused at once with **429**
``{"code": 429, ...}``, which both clients read as a rate limit (envd HTTP status and Connect
``resource_exhausted`` alike), rather than queued: a sandbox with many slow streams then never
holds the connections other sandboxes need.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass
from http.client import HTTPResponse
from http.cookiejar import CookieJar
from typing import Any
from urllib.request import Request as UrllibRequest

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.types import Receive, Scope, Send
from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.frames import EXTERNAL_CLOSE_CODES, CloseCode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import WebSocketURI

__all__ = ["SandboxProxy", "Upstream"]

logger = logging.getLogger(__name__)

Headerlist = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1; "proxy-*" (Proxy-Authorization, Proxy-Connection...) is matched by prefix.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# Expect: the edge's server already answered "100-continue". X-Forwarded-*: set here, see _upstream_headers.
_NOT_FORWARDED = frozenset({b"expect", b"x-forwarded-for", b"x-forwarded-proto"})
# The upstream handshake makes its own key, version and offers; Host goes in separately (_Handshake).
_WS_REQUEST = frozenset(
    {b"host", b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions", b"sec-websocket-protocol"}
)
# The edge's server writes these itself into its handshake answer, from what it was given.
_WS_ANSWER = frozenset(
    {b"content-length", b"sec-websocket-accept", b"sec-websocket-extensions", b"sec-websocket-protocol"}
)
# Pooled connections are dropped after 4 s idle, under the 5 s keep-alive of uvicorn and Node's http:
# reusing a connection just as the server times it out would fail the request with no answer.
_KEEPALIVE_EXPIRY = 4.0
# With no read timeout, TCP notices a sandbox that vanished (killed, its veth gone): first probe
# after 30 s of silence, dead after 3 unanswered probes 10 s apart.
_SOCKET_OPTIONS = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
]
_WS_MAX_MESSAGE = 16 * 1024 * 1024  # uvicorn's default ws_max_size: the same limit both ways
_WS_CLOSE_GRACE = 2.0  # seconds an interrupted relay waits for the upstream to answer its close


@dataclass(frozen=True)
class Upstream:
    """Where the sandbox's port is reachable from this host."""

    host: str  # IPv4/IPv6 literal or name
    port: int
    sandbox_id: str = ""  # whose share of the limits the request takes; "" shares by host

    @property
    def share(self) -> str:
        return self.sandbox_id or self.host


class _DiscardCookies(CookieJar):
    """httpx keeps every Set-Cookie it sees; a proxy must not collect all sandboxes' cookies."""

    def extract_cookies(self, response: HTTPResponse, request: UrllibRequest) -> None:
        return None


class SandboxProxy:
    """Relays ASGI ``http`` and ``websocket`` requests to sandboxes over one shared pool."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        max_connections: int = 1000,
        max_websockets: int = 1000,
        sandbox_max_requests: int = 256,
        sandbox_max_websockets: int = 128,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._max_websockets = max_websockets
        self._websockets = 0
        self._requests = _Shares(sandbox_max_requests)
        self._sandbox_websockets = _Shares(sandbox_max_websockets)
        # httpx, not h11 by hand: it streams a request body from an async generator and a response
        # with aiter_raw (undecoded), and pools. Requests go through send(), never build_request(),
        # so the client adds no headers of its own (Accept-Encoding, User-Agent, cookies).
        self._transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=max_connections, keepalive_expiry=_KEEPALIVE_EXPIRY),
            socket_options=_SOCKET_OPTIONS,
        )
        self._client = httpx.AsyncClient(
            transport=self._transport,
            timeout=httpx.Timeout(connect=connect_timeout, read=None, write=None, pool=connect_timeout),
            cookies=_DiscardCookies(),
            follow_redirects=False,
            trust_env=False,  # no HTTP_PROXY detour: sandboxes are reached directly
        )

    async def forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        upstream: Upstream,
        *,
        drop_request_headers: Collection[str] = (),
    ) -> None:
        """Relay this request to ``upstream`` and its answer back; returns when both are done."""
        drop = frozenset(name.lower().encode("latin-1") for name in drop_request_headers)
        if scope["type"] == "http":
            if not self._requests.take(upstream.share):
                message = f"Too many concurrent requests to this sandbox (at most {self._requests.limit})"
                await _answer(send, "http", 429, *_json(429, message))
                return
            try:
                await self._forward_http(scope, receive, send, upstream, drop)
            finally:
                self._requests.give(upstream.share)
        elif scope["type"] == "websocket":
            await self._forward_websocket(scope, receive, send, upstream, drop)
        else:
            raise ValueError(f"cannot proxy an ASGI {scope['type']!r} scope")

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()

    async def forget(self, host: str) -> None:
        """Close the idle pooled connections to ``host`` (every port); those in use finish as they go.

        For an address whose processes stopped: whatever boots there next does not know them. The
        pool has no public way to do this; ``tests/reference_server/test_proxy.py`` checks that the
        next request opens a new connection.
        """
        wanted = host.encode("ascii")
        for connection in list(self._transport._pool.connections):
            origin = getattr(connection, "_origin", None)
            if origin is not None and origin.host == wanted and connection.is_idle():
                await connection.aclose()

    async def _forward_http(
        self, scope: Scope, receive: Receive, send: Send, upstream: Upstream, drop: frozenset[bytes]
    ) -> None:
        names = {name for name, _ in scope["headers"]}
        # HTTP/1.1: a request has a body exactly when it says how that body is delimited.
        has_body = b"content-length" in names or b"transfer-encoding" in names
        chunks_in, chunks_out = anyio.create_memory_object_stream[bytes]()  # unbuffered: backpressure
        with chunks_in, chunks_out:
            try:
                request = httpx.Request(
                    scope["method"],
                    httpx.URL(scheme="http", host=upstream.host, port=upstream.port, raw_path=_target(scope)),
                    headers=_upstream_headers(scope, drop),
                    content=_body(chunks_out) if has_body else None,
                )
            except httpx.InvalidURL:
                await _answer(send, "http", 400, *_json(400, "Invalid request target"))
                return
            async with anyio.create_task_group() as group:
                group.start_soon(_read_client, receive, chunks_in if has_body else None, group.cancel_scope)
                await self._exchange(request, send, upstream.port)
                group.cancel_scope.cancel()

    async def _exchange(self, request: httpx.Request, send: Send, port: int) -> None:
        try:
            response = await self._client.send(request, stream=True)
        except httpx.PoolTimeout:
            await _answer(send, "http", 503, *_json(503, "Too many open connections to sandboxes"))
            return
        except httpx.TransportError as exc:
            await _answer(send, "http", 502, *_json(502, _unreachable(exc, port)))
            return
        try:
            headers = _without_hop_by_hop(response.headers.raw)
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.TransportError as exc:
            # Returning with the response unfinished makes the server close the client's connection:
            # the client sees a broken transfer, not a complete-looking truncated body.
            logger.warning("sandbox port %d broke off a response: %s", port, type(exc).__name__)
        except OSError:
            pass  # the client left (an ASGI 2.4 server's send raises); closing below tells the sandbox
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()  # if unfinished, closes the connection: the sandbox sees the end

    async def _forward_websocket(
        self, scope: Scope, receive: Receive, send: Send, upstream: Upstream, drop: frozenset[bytes]
    ) -> None:
        if (await receive())["type"] != "websocket.connect":
            return  # the client left before its handshake reached us
        if self._websockets >= self._max_websockets:
            await _refuse_websocket(scope, send, 503, *_json(503, "Too many open WebSockets to sandboxes"))
            return
        if not self._sandbox_websockets.take(upstream.share):
            message = f"Too many open WebSockets to this sandbox (at most {self._sandbox_websockets.limit})"
            await _refuse_websocket(scope, send, 429, *_json(429, message))
            return
        self._websockets += 1
        try:
            await self._websocket(scope, receive, send, upstream, drop)
        finally:
            self._websockets -= 1
            self._sandbox_websockets.give(upstream.share)

    async def _websocket(
        self, scope: Scope, receive: Receive, send: Send, upstream: Upstream, drop: frozenset[bytes]
    ) -> None:
        try:
            connection = await self._open_websocket(scope, upstream, drop)
        except InvalidStatus as exc:  # the upstream answered with a plain HTTP response: relay it
            refusal = exc.response
            headers = _without_hop_by_hop(_latin1(refusal.headers.raw_items()), _WS_ANSWER)
            await _refuse_websocket(scope, send, refusal.status_code, headers, bytes(refusal.body))
            return
        except (OSError, TimeoutError, WebSocketException) as exc:
            message = f"The sandbox is not accepting WebSocket connections on port {upstream.port}"
            logger.info("%s: %s", message, type(exc).__name__)
            await _refuse_websocket(scope, send, 502, *_json(502, message))
            return
        try:
            answer = _latin1(connection.response.headers.raw_items()) if connection.response else []
            headers = _without_hop_by_hop(answer, _WS_ANSWER)
            await send({"type": "websocket.accept", "subprotocol": connection.subprotocol, "headers": headers})
            await _relay_websocket(receive, send, connection)
        except OSError:
            pass  # the client left before the accept; the upstream is closed below
        finally:
            # Normally closed by now. After a cancellation (server shutdown) or a client that left,
            # close politely (1001: going away), but never hold a shutdown for long.
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + _WS_CLOSE_GRACE):
                await connection.close(CloseCode.GOING_AWAY)
            if connection.state is not State.CLOSED:
                connection.transport.abort()

    async def _open_websocket(self, scope: Scope, upstream: Upstream, drop: frozenset[bytes]) -> ClientConnection:
        """The upstream WebSocket, connected and past its handshake within ``connect_timeout``.

        Opened by hand rather than with ``websockets.connect``, which would follow redirects, read
        proxy settings from the environment, and derive Host and the target from a URI.
        """
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in _upstream_headers(scope, drop | _WS_REQUEST)]
        protocol = _Handshake(
            WebSocketURI(False, upstream.host, upstream.port, "/", ""),
            target=_target(scope).decode("ascii"),
            host=next((v.decode("latin-1") for n, v in scope["headers"] if n == b"host"), None),
            subprotocols=[Subprotocol(name) for name in scope.get("subprotocols", [])] or None,
            max_size=_WS_MAX_MESSAGE,  # and no compression: the upstream is on this host
        )
        loop = asyncio.get_running_loop()
        with anyio.fail_after(self._connect_timeout):
            _, connection = await loop.create_connection(
                lambda: ClientConnection(protocol), upstream.host, upstream.port
            )
            try:
                await connection.handshake(headers, user_agent_header=None)
            except BaseException:
                connection.transport.abort()
                raise
        connection.start_keepalive()  # pings notice an upstream that vanished, as TCP keepalive does for HTTP
        return connection


class _Shares:
    """How many of something each sandbox holds, up to ``limit`` each (one event loop: no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def take(self, key: str) -> bool:
        held = self._held.get(key, 0)
        if held >= self.limit:
            return False
        self._held[key] = held + 1
        return True

    def give(self, key: str) -> None:
        held = self._held.pop(key, 0) - 1
        if held > 0:  # a sandbox holding nothing has no entry: the table does not grow with every sandbox seen
            self._held[key] = held


class _Handshake(ClientProtocol):
    """websockets' client handshake, with the client's own request target and Host."""

    def __init__(self, uri: WebSocketURI, *, target: str, host: str | None, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._target = target
        self._host = host

    def connect(self) -> Request:
        request = super().connect()
        if self._host is None:
            return Request(self._target, request.headers)
        headers = Headers([("Host", self._host)])
        headers.update((n, v) for n, v in request.headers.raw_items() if n.lower() != "host")
        return Request(self._target, headers)


async def _read_client(
    receive: Receive, body: MemoryObjectSendStream[bytes] | None, exchange: anyio.CancelScope
) -> None:
    """The only reader of ``receive``: hands on the body, then waits for the client to leave.

    One reader for the whole exchange, so that a client leaving is noticed at any moment (while
    the upload waits on the sandbox, while the sandbox thinks, while the response streams) and
    ends the exchange, which closes the upstream connection.
    """
    if body is not None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # The body stream is left open: an upload cut short must not look complete upstream.
                exchange.cancel()
                return
            if chunk := message.get("body", b""):
                await body.send(chunk)
            if not message.get("more_body", False):
                body.close()
                break
    while (await receive())["type"] != "http.disconnect":
        pass  # more of a body the upstream answered without reading
    exchange.cancel()


async def _body(chunks: MemoryObjectReceiveStream[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk


async def _relay_websocket(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    """Messages both ways at once until one side closes; the close goes on to the other side."""
    client_gone = False

    async def client_to_upstream() -> None:
        nonlocal client_gone
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                client_gone = True
                code = _close_code(message.get("code", CloseCode.NORMAL_CLOSURE), lost=CloseCode.GOING_AWAY)
                await upstream.close(code, message.get("reason") or "")
                group.cancel_scope.cancel()
                return
            data = message.get("bytes")
            with contextlib.suppress(ConnectionClosed):  # the upstream's close reaches the client below
                await upstream.send((message.get("text") or "") if data is None else data)

    async def upstream_to_client() -> None:
        try:
            while True:
                data = await upstream.recv()
                await send({"type": "websocket.send", "text" if isinstance(data, str) else "bytes": data})
        except ConnectionClosed as closed:
            if client_gone:
                return  # client_to_upstream is relaying the client's close
            if closed.rcvd is not None:
                code, reason = _close_code(closed.rcvd.code, lost=CloseCode.BAD_GATEWAY), closed.rcvd.reason
            else:
                code, reason = CloseCode.BAD_GATEWAY, "The sandbox's WebSocket broke off"
            with contextlib.suppress(OSError):
                await send({"type": "websocket.close", "code": code, "reason": reason})
        except OSError:
            return  # the client left (an ASGI 2.4 server's send raises): its disconnect comes to receive
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(client_to_upstream)
        group.start_soon(upstream_to_client)


def _close_code(code: int, *, lost: int) -> int:
    """A close code that may go on the wire: "none given" (1005) becomes 1000, other reserved ones ``lost``."""
    if code in EXTERNAL_CLOSE_CODES or 3000 <= code < 5000:
        return code
    return CloseCode.NORMAL_CLOSURE if code == CloseCode.NO_STATUS_RCVD else lost


def _without_hop_by_hop(headers: Iterable[tuple[bytes, bytes]], drop: Collection[bytes] = ()) -> Headerlist:
    """Lowercased headers without hop-by-hop ones, those the Connection header names, and ``drop``."""
    lowered = [(name.lower(), value) for name, value in headers]
    named = {token.strip().lower() for name, value in lowered if name == b"connection" for token in value.split(b",")}
    return [
        (name, value)
        for name, value in lowered
        if name not in _HOP_BY_HOP and not name.startswith(b"proxy-") and name not in named and name not in drop
    ]


def _upstream_headers(scope: Scope, drop: frozenset[bytes]) -> Headerlist:
    """The client's headers for the upstream, Host included, with X-Forwarded-For and -Proto set.

    Set, not appended to: the edge is the first hop, so what a client claims there is hearsay
    (behind a load balancer, uvicorn's proxy_headers has already put the real client in the scope).
    """
    headers = _without_hop_by_hop(scope["headers"], drop | _NOT_FORWARDED)
    if client := scope.get("client"):
        headers.append((b"x-forwarded-for", str(client[0]).encode("latin-1")))
    headers.append((b"x-forwarded-proto", b"https" if scope.get("scheme") in ("https", "wss") else b"http"))
    return headers


def _target(scope: Scope) -> bytes:
    """The request target as the client wrote it, with bytes a URL may not hold percent-encoded."""
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    query: bytes = scope.get("query_string", b"")
    target = raw_path + b"?" + query if query else raw_path
    return re.sub(rb"[^\x21-\x7e]|#", lambda match: b"%%%02X" % match[0][0], target)


def _unreachable(exc: httpx.TransportError, port: int) -> str:
    """The 502 message: the kind of failure only, as exception texts carry the sandbox's address."""
    if isinstance(exc, httpx.ConnectTimeout):
        reason = "timed out connecting"
    elif isinstance(exc, httpx.ConnectError):
        # The OSError that says what happened is a few causes down (httpx <- httpcore <- anyio).
        errnos: set[int | None] = set()
        cause: BaseException | None = exc
        for _ in range(8):  # bounded: causes could form a loop
            if cause is None:
                break
            errnos.add(getattr(cause, "errno", None))
            cause = cause.__cause__ or cause.__context__
        if errno.ECONNREFUSED in errnos:
            reason = "connection refused"
        elif errnos & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
            reason = "no route to it"
        else:
            reason = "could not connect"
    else:
        reason = "the connection closed without an answer"
    if reason == "connection refused":
        # Python e2b from 2.53.1 reads "port is not open" as "running, but that port has nothing
        # listening" (SandboxUnreachableException with that explanation); "was not found" would
        # say the sandbox is gone, which only the edge can know.
        return f"The sandbox is running but the port is not open: nothing listens on port {port}"
    return f"The sandbox is not reachable on port {port}: {reason}"


def _latin1(headers: Iterable[tuple[str, str]]) -> Headerlist:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def _json(status: int, message: str) -> tuple[Headerlist, bytes]:
    body = json.dumps({"code": status, "message": message}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


async def _answer(send: Send, kind: str, status: int, headers: Headerlist, body: bytes) -> None:
    """A whole response: ``kind`` is "http", or "websocket.http" to refuse a handshake."""
    await send({"type": f"{kind}.response.start", "status": status, "headers": headers})
    await send({"type": f"{kind}.response.body", "body": body, "more_body": False})


async def _refuse_websocket(scope: Scope, send: Send, status: int, headers: Headerlist, body: bytes) -> None:
    """Refuse a handshake with an HTTP answer if the server can send one, else by closing (the server says 403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        await _answer(send, "websocket.http", status, headers, body)
    else:
        await send({"type": "websocket.close", "code": CloseCode.BAD_GATEWAY})
