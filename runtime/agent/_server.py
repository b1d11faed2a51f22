"""Serve the agent with uvicorn (HTTP/1.1 only, as envd: no TLS, no h2c)."""

from __future__ import annotations

import asyncio
import gc
import socket
from typing import cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from contract.protocol import ENVD_PORT

from ._app import create_app
from ._memory import randomize_children, share_startup_memory
from ._ready import signal_ready, take_ready_fd
from ._services import Service, ServiceSet
from ._state import AgentState
from ._write_batch import BatchedWrites

DEFAULT_HOSTS = ("0.0.0.0",)  # noqa: S104 - inside a sandbox the agent must be reachable from the host
DEFAULT_PORT = ENVD_PORT
KEEPALIVE_S = 640


class NoDelayH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with Nagle's algorithm off, and the small writes of a few loop passes joined.

    uvicorn writes a response's head and body separately; with Nagle on, the body waits for
    the acknowledgement of the head, which the client delays by up to 40 ms. asyncio turns
    Nagle off for the connections it accepts itself, but not for those accepted on sockets
    handed to it, which is how the agent listens (several addresses, one server). With Nagle
    off each write is a packet of its own: ``BatchedWrites`` sends the small writes of a few
    passes of the event loop as one (``_write_batch``).
    """

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(BatchedWrites(cast(asyncio.Transport, transport), self.loop))


class _SignallingServer(uvicorn.Server):
    """uvicorn's server that tells the runtime (``_ready``) once its sockets listen."""

    def __init__(self, config: uvicorn.Config, ready_fd: int | None) -> None:
        super().__init__(config)
        self._ready_fd = ready_fd

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:  # a failed lifespan startup sets it: the runtime's probe tells
            share_startup_memory()  # what start-up made is the same in every agent: offered once listening
            gc.enable()  # off while the modules loaded (``__main__``)
            signal_ready(self._ready_fd)
            self._ready_fd = None


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


def serve(
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    port: int = DEFAULT_PORT,
    *,
    default_user: str | None = None,
    services: tuple[Service, ...] = (),
    service_user: str | None = None,
    log_level: str = "warning",
) -> None:
    """Listen on every host address given (for local debugging: 127.0.0.1 and ::1, because
    Node resolves ``localhost`` to ::1 first) and serve until interrupted.

    ``services`` are started as ``service_user`` before the agent listens (``_services``)."""
    ready_fd = take_ready_fd()  # first: nothing started below may inherit it
    randomize_children()  # the runtime may start the agent without ASLR (``_memory``); its children get it
    state = AgentState()
    if default_user:
        state.default_user = default_user
    config = uvicorn.Config(
        create_app(state, services=ServiceSet(services, service_user) if services else None),
        http=NoDelayH11Protocol,
        # asyncio's, never uvloop's (uvicorn's "auto" takes it when installed): uvloop cannot start
        # a process as another user (user=, group=, extra_groups=), which every command needs.
        loop="asyncio",
        lifespan="on",
        timeout_keep_alive=KEEPALIVE_S,
        log_level=log_level,
        access_log=False,
        server_header=False,
    )
    _SignallingServer(config, ready_fd).run(sockets=[bind(host, port) for host in hosts])
