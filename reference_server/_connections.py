"""Client connections at the edge: how many may be open, and how long a request head may take.

uvicorn's h11 protocol bounds neither: it arms its keep-alive timer only after a first response
and any byte cancels it, so a client that opens a connection and sends nothing, or a header byte
now and then, holds it forever (slow-loris). The listener's TLS is asyncio's, whose handshake
timeout is a fixed 60 s, and uvicorn sees a connection only once its handshake is done, so
connections still in their handshake are neither counted nor capped. ``edge_protocols`` builds
the protocol classes the edge runs instead:

- **TLS is started by the protocol** (``loop.start_tls``), not by the listener: a connection is
  counted from accept, one over ``max_connections`` is closed at once, before any handshake work
  (the cheapest refusal, and the connections already open never notice), and the handshake is
  bounded by the head timeout.
- **Request heads**: the first must be complete within ``head_timeout`` of accept (the handshake
  included), each later one within ``head_timeout`` of its first byte; the connection is then
  dropped without an answer. Bodies are not timed: uploads and streams may be slow by nature.
- **Idle keep-alive** between requests stays uvicorn's (``KEEPALIVE_S``, 640 s): clients keep
  pooled connections that long, and a server that closed them sooner would race their reuse.
- A WebSocket upgrade hands the connection to uvicorn's WebSocket protocol; the subclass here
  gives the connection's slot back when it ends.

``raise_open_file_limit`` lifts the soft ``RLIMIT_NOFILE`` to the hard one at start, and the
default connection cap is derived from it (``connection_limit``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import time
from typing import Any, ClassVar, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from runtime.agent import NoDelayH11Protocol

__all__ = ["ConnectionGate", "connection_limit", "edge_protocols", "raise_open_file_limit"]

log = logging.getLogger(__name__)

# Open files kept for everything but client connections: the store, sandboxes' logs and pipes, crun.
_RESERVED_FILES = 1024
# Each client connection may hold two descriptors: its own socket and one to a sandbox.
_FILES_PER_CONNECTION = 2
# Past this many, memory (TLS and parser buffers, tasks) runs out before descriptors do.
_MAX_DERIVED_CONNECTIONS = 16384
_MIN_DERIVED_CONNECTIONS = 64
_WARN_EVERY_S = 10.0  # a flood of refusals logs one line per interval, with the count


def raise_open_file_limit() -> int:
    """Lift the soft open-file limit to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        # An unlimited hard limit cannot be a soft one on Linux (capped by fs.nr_open): keep what we have.
        target = hard if hard != resource.RLIM_INFINITY else soft
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_limit(configured: int) -> int:
    """``configured``, or when it is 0 the cap the current open-file limit allows."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_DERIVED_CONNECTIONS
    derived = (soft - _RESERVED_FILES) // _FILES_PER_CONNECTION
    return max(_MIN_DERIVED_CONNECTIONS, min(_MAX_DERIVED_CONNECTIONS, derived))


class ConnectionGate:
    """The client connections open at one server, from accept to close; refuses past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[object, asyncio.Transport] = {}
        self.refused = 0
        self.timed_out = 0
        self._unreported = 0
        self._last_warning = 0.0

    @property
    def count(self) -> int:
        return len(self._open)

    def enter(self, key: object, transport: asyncio.Transport) -> bool:
        if len(self._open) >= self.limit:
            self.refused += 1
            self._unreported += 1
            now = time.monotonic()
            if now - self._last_warning >= _WARN_EVERY_S:
                log.warning(
                    "refused %d client connection(s): %d open, the limit (max_connections)",
                    self._unreported,
                    self.limit,
                )
                self._unreported, self._last_warning = 0, now
            return False
        self._open[key] = transport
        return True

    def leave(self, key: object) -> None:
        self._open.pop(key, None)  # idempotent: a connection may be seen closing twice

    def close_all(self) -> None:
        """Drop what is still open (handshakes, WebSockets) once the server has stopped serving."""
        for transport in list(self._open.values()):
            transport.abort()
        self._open.clear()


class _EdgeHttp(NoDelayH11Protocol):
    gate: ClassVar[ConnectionGate]
    tls: ClassVar[ssl.SSLContext | None]
    head_timeout: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._raw: asyncio.Transport | None = None
        self._ready = False  # uvicorn's connection_made has run: its state exists
        self._early: list[bytes] = []  # decrypted bytes that came with the end of the handshake
        self._first_flight: list[bytes] = []  # raw bytes read before the TLS layer was in (uvloop)
        self._head_timer: asyncio.TimerHandle | None = None
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = cast(asyncio.Transport, transport)
        if not self.gate.enter(self, raw):
            raw.abort()
            return
        self._raw = raw
        self._arm_head()
        if self.tls is None:
            self._become_ready(raw)
            return
        self._handshake = self.loop.create_task(self._start_tls(raw, self.tls))

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        tls = asyncio.ensure_future(
            self.loop.start_tls(raw, self, context, server_side=True, ssl_handshake_timeout=self.head_timeout)
        )
        # start_tls's first step pauses reading, puts its TLS layer in, then schedules the layer's
        # connection_made and the resumption of reading; two hops later, the hand-over runs right
        # after those two, before anything more is read.
        self.loop.call_soon(self.loop.call_soon, self._hand_over_first_flight, raw)
        try:
            transport = await tls
        except (OSError, RuntimeError):  # refused, broken off, or too slow (ConnectionAbortedError)
            raw.abort()
            self.gate.leave(self)
            return
        if transport is None or raw.is_closing():
            self.gate.leave(self)
            return
        self._become_ready(transport)

    def _hand_over_first_flight(self, raw: asyncio.Transport) -> None:
        """The client's bytes read before the TLS layer was in, given to that layer, in order.

        asyncio adds an accepted connection's reader in the same pass as ``connection_made``, so
        the task that starts TLS runs before its first read. uvloop reads from ``connection_made``
        on, and a pause there does not stop it, so the client's first flight (its hello) can reach
        this protocol before ``start_tls`` has run. It was held (``data_received``).
        """
        flight, self._first_flight = self._first_flight, []
        layer = raw.get_protocol()
        if not flight or layer is self or raw.is_closing():
            return
        buffered = cast(asyncio.BufferedProtocol, layer)  # both loops' TLS layers are buffered protocols
        view = memoryview(b"".join(flight))
        while view:
            buffer = memoryview(buffered.get_buffer(len(view)))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            buffered.buffer_updated(size)
            view = view[size:]

    def _become_ready(self, transport: asyncio.Transport) -> None:
        self._ready = True
        super().connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if not self._ready:
            if self.tls is not None and self._raw is not None and self._raw.get_protocol() is self:
                # Raw bytes, read before start_tls put its TLS layer in: held for that layer.
                self._raw.pause_reading()
                self._first_flight.append(data)
                return
            # asyncio hands over the bytes read with the handshake's last flight before start_tls returns.
            self._early.append(data)
            return
        if self.conn.their_state is h11.IDLE:
            self._arm_head()  # the first byte of a head (already armed for the first request)
        super().data_received(data)
        self._head_progress()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Part of the next head may already be buffered (pipelining): its clock runs from now.
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm_head()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm_head()
        super().handle_websocket_upgrade(event)
        protocol = self.transport.get_protocol()
        if isinstance(protocol, _EdgeWebSocket):
            protocol.edge_slot = (self.gate, self)
        else:  # not ours: the slot cannot follow the connection
            self.gate.leave(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        self.gate.leave(self)
        if self._ready:
            super().connection_lost(exc)

    def _head_progress(self) -> None:
        if self.conn.their_state is not h11.IDLE:  # a whole head arrived (or the connection failed)
            self._disarm_head()

    def _arm_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self.gate.timed_out += 1
        log.debug("closed a client connection: no complete request head within %g s", self.head_timeout)
        if self._raw is not None:
            self._raw.abort()  # not close(): a client that does not read must not hold it open


class _EdgeWebSocket(WebSocketsSansIOProtocol):
    edge_slot: tuple[ConnectionGate, object] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            if self.edge_slot is not None:
                gate, key = self.edge_slot
                gate.leave(key)


def edge_protocols(
    gate: ConnectionGate, tls: ssl.SSLContext | None, *, head_timeout: float
) -> tuple[type[H11Protocol], type[WebSocketsSansIOProtocol]]:
    """uvicorn's ``http`` and ``ws`` classes for one server: its gate, its TLS context, its head timeout."""
    http = type("EdgeHttpProtocol", (_EdgeHttp,), {"gate": gate, "tls": tls, "head_timeout": head_timeout})
    return cast(type[H11Protocol], http), _EdgeWebSocket
