"""Admission control as the official Python client sees it: a refused create is its RateLimitException.

A server of its own, configured (through its documented variables only) to let an owner run one
sandbox at a time: the second create must raise ``RateLimitException`` carrying our message,
and after the first is killed a create works again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from conformance._clients import PythonClients
from conformance._endpoint import ManagedServer
from tests.servers import managed_server

pytestmark = [pytest.mark.artifacts]

SCRIPT = """
from e2b import RateLimitException, Sandbox
first = Sandbox.create(timeout=120)
try:
    second = Sandbox.create(timeout=120)
except RateLimitException as exc:
    print("refused:", exc, flush=True)
else:
    second.kill()
    first.kill()
    raise SystemExit("the second create was admitted")
first.kill()
again = Sandbox.create(timeout=120)
print("again:", again.commands.run("echo ok").stdout.strip(), flush=True)
again.kill()
print("left:", len(Sandbox.list().next_items()), flush=True)
"""


@pytest.fixture(scope="module")
def one_at_a_time() -> Iterator[ManagedServer]:
    with managed_server(
        "compat-admission", {"E2B_COMPAT_SERVER_OWNER_MAX_RUNNING": "1", "E2B_COMPAT_SERVER_TEMPLATES": "base"}
    ) as server:
        yield server


def test_the_python_client_raises_rate_limit_exception(
    one_at_a_time: ManagedServer, python_clients: PythonClients
) -> None:
    result = subprocess.run(
        [str(python_clients.python), "-I", "-c", SCRIPT],
        env=one_at_a_time.clients_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    refused = next(line for line in lines if line.startswith("refused:"))
    assert "429" in refused
    assert "Concurrent sandbox limit reached: 1 of at most 1 running" in refused
    assert "again: ok" in lines
    assert "left: 0" in lines
