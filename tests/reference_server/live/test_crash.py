"""SIGKILL the server in the middle of create, pause and kill, restart it, and account for everything.

After each restart every sandbox is either usable (running: its envd answers through the edge;
paused: connect resumes it) or cleanly gone (no record, no runtime sandbox); a sandbox whose
create was answered is never lost, and the runtime holds nothing the store does not know but the
sandboxes the restarted server's warm pool has started since (those of the killed one are gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from runtime.crun import CrunBackend

from .conftest import LiveServer

pytestmark = [pytest.mark.artifacts]

ROUNDS = 2  # per operation; each round costs a server restart


class Api:
    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=server.client_env["SSL_CERT_FILE"])
        self.key = {"X-API-Key": server.client_env["E2B_API_KEY"]}

    def client(self) -> httpx.Client:
        return httpx.Client(verify=self.context, timeout=60, trust_env=False)

    def url(self, path: str) -> str:
        return f"https://api.{self.server.domain}{path}"


def in_background(work: Callable[[], Any]) -> threading.Thread:
    """Run ``work`` in a thread whose failure (the server vanished mid-request) is expected."""

    def target() -> None:
        with contextlib.suppress(httpx.HTTPError):
            work()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def runtime_ids(server: LiveServer) -> set[str]:
    backend = CrunBackend(server.data_dir / "runtime")
    return {info.sandbox_id for info in asyncio.run(backend.list())}


def account(api: Api, answered: set[str], killed: set[str], left: set[str]) -> dict[str, str]:
    """Check the invariants after a restart; returns the surviving sandboxes and their states.

    ``left``: what the runtime held when the server was killed. Whatever of it the store does not
    know must be gone now; sandboxes the new server's warm pool started since have new ids.
    """
    with api.client() as http:
        listed = http.get(api.url("/v2/sandboxes"), headers=api.key)
        assert listed.status_code == 200
        states = {item["sandboxID"]: item["state"] for item in listed.json()}
        lost = answered - killed - set(states)
        assert not lost, f"sandboxes whose create was answered are gone: {lost}"
        orphans = (runtime_ids(api.server) & left) - set(states)
        assert not orphans, f"the runtime holds sandboxes the store does not know: {orphans}"
        for sandbox_id, state in states.items():
            if state == "paused":
                resumed = http.post(api.url(f"/sandboxes/{sandbox_id}/connect"), json={"timeout": 120}, headers=api.key)
                assert resumed.status_code == 201, resumed.text
            health = http.get(f"https://49983-{sandbox_id}.{api.server.domain}/health")
            assert health.status_code == 204, f"{sandbox_id} ({state}) is listed but not usable"
    return states


def crash_during(api: Api, operation: Callable[[httpx.Client], None], rng: random.Random) -> set[str]:
    """SIGKILL the server during ``operation`` and start it again; returns what the runtime held then."""

    def work() -> None:
        with api.client() as http:
            operation(http)

    thread = in_background(work)
    time.sleep(rng.uniform(0.05, 1.5))
    api.server.stop(signal.SIGKILL)
    thread.join(60)
    left = runtime_ids(api.server)
    api.server.start()
    return left


def test_crashes_lose_nothing_and_leak_nothing(live_server: LiveServer) -> None:
    api = Api(live_server)
    rng = random.Random(20261130)
    answered: set[str] = set()
    killed: set[str] = set()

    def create(http: httpx.Client) -> None:
        for _ in range(3):
            response = http.post(api.url("/sandboxes"), json={"templateID": "base", "timeout": 300}, headers=api.key)
            if response.status_code == 201:
                answered.add(response.json()["sandboxID"])

    def pause_all(http: httpx.Client) -> None:
        for sandbox_id in sorted(answered - killed):
            http.post(api.url(f"/sandboxes/{sandbox_id}/pause"), json={"memory": True}, headers=api.key)

    def kill_all(http: httpx.Client) -> None:
        for sandbox_id in sorted(answered - killed):
            killed.add(sandbox_id)  # asked: it may or may not be gone after the crash
            http.delete(api.url(f"/sandboxes/{sandbox_id}"), headers=api.key)

    for round_ in range(ROUNDS):
        for operation in (create, pause_all, create, kill_all):
            left = crash_during(api, operation, rng)
            states = account(api, answered, killed, left)
            # A kill that was asked for and did not happen before the crash may be repeated.
            killed -= set(states)
        assert live_server.starts >= 1 + 4 * (round_ + 1)
    with api.client() as http:
        for sandbox_id in list(account(api, answered, killed, left)):
            assert http.delete(api.url(f"/sandboxes/{sandbox_id}"), headers=api.key).status_code == 204
    live_server.stop()  # a clean stop kills the warm pool's sandboxes too
    assert runtime_ids(live_server) == set()
    live_server.start()
