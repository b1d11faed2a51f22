"""Retries and idempotent creates as the newest Python client makes them (it retries by itself).

A server of its own whose create rate (through its documented variables) is one token every two
seconds: the newest committed Python client's second create is answered 429 with ``Retry-After:
2``, waits that out and succeeds, where the pinned client raises ``RateLimitException`` at once.
A create repeated with one ``Idempotency-Key`` is the same sandbox, so a retried create can never
make two.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from conformance._clients import PythonClients, available_python_versions, ensure_python_clients
from conformance._endpoint import ManagedServer
from conformance._scenarios import AT_EXIT_SIGNALS
from tests.servers import managed_server

pytestmark = [pytest.mark.artifacts]

SCRIPT = """
import sys
from e2b import RateLimitException, Sandbox
first = Sandbox.create(timeout=120, idempotency_key="retry-case-first")
again = Sandbox.create(timeout=120, idempotency_key="retry-case-first")
print("same:", again.sandbox_id == first.sandbox_id, flush=True)
print("runs:", again.commands.run("echo ok").stdout.strip(), flush=True)
try:
    second = Sandbox.create(timeout=120)  # the owner's bucket is empty now: a 429 with Retry-After
except RateLimitException as exc:
    print("refused:", exc, flush=True)
else:
    print("retried:", second.sandbox_id != first.sandbox_id, flush=True)
    second.kill()
print("listed:", sorted(s.sandbox_id for s in Sandbox.list().next_items()) == [first.sandbox_id], flush=True)
first.kill()
"""

NEWEST_PYTHON = available_python_versions()[-1]


@pytest.fixture(scope="module")
def slow_creates() -> Iterator[ManagedServer]:
    settings = {
        "E2B_COMPAT_SERVER_OWNER_CREATE_RATE": "0.5",
        "E2B_COMPAT_SERVER_OWNER_CREATE_BURST": "1",
        "E2B_COMPAT_SERVER_TEMPLATES": "base",
    }
    with managed_server("compat-retries", settings) as server:
        yield server


def run(server: ManagedServer, clients: PythonClients, script: str, last_line: str) -> list[str]:
    """The script's output lines; it must have finished (printed ``last_line``)."""
    result = subprocess.run(
        [str(clients.python), "-I", "-c", script],
        env=server.clients_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # A crash at exit after the last line is pyqwest's (conformance._scenarios.AT_EXIT_SIGNALS).
    finished = result.returncode == 0 or (result.returncode in AT_EXIT_SIGNALS and last_line in result.stdout)
    assert finished, result.stdout + result.stderr[-3000:]
    return result.stdout.splitlines()


def test_the_newest_client_waits_out_retry_after_and_creates_once_per_key(slow_creates: ManagedServer) -> None:
    lines = run(slow_creates, ensure_python_clients(NEWEST_PYTHON), SCRIPT, "listed:")
    assert "same: True" in lines, lines
    assert "runs: ok" in lines, lines
    assert "retried: True" in lines, f"e2b {NEWEST_PYTHON} did not retry the rate-limited create: {lines}"
    assert "listed: True" in lines, lines


PINNED_SCRIPT = """
import time
from e2b import RateLimitException, Sandbox
time.sleep(2.5)  # the bucket the test before emptied is full again (one token in 2 s, a burst of 1)
first = Sandbox.create(timeout=120)
try:
    second = Sandbox.create(timeout=120)
except RateLimitException as exc:
    print("refused:", exc, flush=True)
else:
    second.kill()
    print("admitted", flush=True)
first.kill()
"""


def test_the_pinned_client_does_not_retry(slow_creates: ManagedServer, python_clients: PythonClients) -> None:
    lines = run(slow_creates, python_clients, PINNED_SCRIPT, "refused:")
    refused = next((line for line in lines if line.startswith("refused:")), "")
    assert "429" in refused, f"the pinned client's second create was not refused: {lines}"
    assert "rate limit" in refused
