"""A slow-loris client: many connections to the edge that never finish their request head.

48 TLS connections dribble one header byte per second and 16 plain TCP connections never even
start their TLS handshake. Meanwhile ordinary requests (the control plane's health and a sandbox
list, and a command in a sandbox) must be answered promptly, and the edge must close every
dribbler within its request-head timeout (``request_head_timeout_seconds``) plus slack.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time

import pytest

from conformance._endpoint import ManagedServer

from ._harness import Api, requests_made
from .conftest import SETTINGS, report

pytestmark = [pytest.mark.artifacts]

TLS_DRIBBLERS = 48
SILENT = 16
HEAD_TIMEOUT_S = float(SETTINGS.get("request_head_timeout_seconds", "10"))
WITHIN_S = HEAD_TIMEOUT_S + 15  # the timeout, plus a second per dribbled byte and a slow 2-core host
PROMPT_S = 3.0


def _dribbler(server: ManagedServer, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    tls = context.wrap_socket(raw, server_hostname=f"api.{server.domain.split(':')[0]}")
    tls.sendall(f"GET /health HTTP/1.1\r\nHost: api.{server.domain}\r\n".encode())
    tls.setblocking(False)
    return tls


def _closed(sock: socket.socket) -> bool:
    """The peer closed (or reset) the connection: a read is ready and gives nothing."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""
    except ssl.SSLWantReadError:
        return False
    except OSError:
        return True


def test_slow_loris_does_not_starve_others(shared_server: ManagedServer) -> None:
    began, requests_before = time.monotonic(), requests_made()
    api = Api(shared_server)
    sandbox = api.created(timeout=300)
    envd = api.envd(sandbox)
    dribblers = [_dribbler(shared_server, api.context) for _ in range(TLS_DRIBBLERS)]
    silent = [socket.create_connection(("127.0.0.1", shared_server.port), timeout=10) for _ in range(SILENT)]
    opened = time.monotonic()
    closed_at: dict[int, float] = {}
    stop = threading.Event()

    def dribble() -> None:
        while not stop.wait(1):
            for index, sock in enumerate(dribblers + silent):
                if index in closed_at:
                    continue
                if _closed(sock):
                    closed_at[index] = time.monotonic() - opened
                elif index < TLS_DRIBBLERS:
                    with contextlib.suppress(ssl.SSLWantWriteError, OSError):
                        sock.send(b"X")

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    latencies: list[float] = []
    try:
        while time.monotonic() - opened < WITHIN_S and len(closed_at) < TLS_DRIBBLERS + SILENT:
            asked = time.monotonic()
            assert api.request("GET", "/health").status_code == 200
            assert sandbox["sandboxID"] in api.states()
            assert envd.run("echo ok", timeout=30).stdout.strip() == "ok"
            latencies.append(time.monotonic() - asked)
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(5)
        for sock in dribblers + silent:
            sock.close()
        api.kill(sandbox["sandboxID"])
        api.close()
    still_open = TLS_DRIBBLERS + SILENT - len(closed_at)
    assert max(latencies) < PROMPT_S, f"ordinary requests took up to {max(latencies):.1f} s beside the dribblers"
    assert not still_open, f"{still_open} dribbling connections still open after {WITHIN_S:.0f} s"
    report(
        "slow-loris",
        shared_server.backend,
        dribbling_connections=TLS_DRIBBLERS + SILENT,
        closed_by_the_edge=len(closed_at),
        last_closed_after_s=round(max(closed_at.values()), 1),
        ordinary_rounds=len(latencies),
        slowest_ordinary_round_s=round(max(latencies), 2),
        requests=requests_made() - requests_before,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )
