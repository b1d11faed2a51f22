"""Two reference servers on one host at the same time: neither's sandboxes reach or disturb the other's.

Both servers draw their sandboxes' addresses from the one host-wide registry (``runtime._addresses``).
Server A has a burst of parallel creates from two owners under way while server B starts (B's
start-up reconciliation must leave A's sandbox networks alone) and then runs a burst of its own;
every sandbox of both bursts must prove its identity (``conformance._checks``), and a sandbox A
made before B started must still answer afterwards.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from conformance._cases import cases
from conformance._clients import NodeClients, PythonClients
from conformance._endpoint import ManagedServer
from conformance._scenarios import ScenarioError, ScenarioRunner
from tests.servers import managed_server

from .conftest import SCENARIOS

pytestmark = [pytest.mark.artifacts]

CASE = next(case for case in cases("sandbox") if case.scenario == "sandbox/parallel-creates")
LONG_LIVED = """
import sys
from e2b import Sandbox
sbx = Sandbox.create(timeout=600)
print(sbx.sandbox_id, flush=True)
sys.stdin.readline()  # until told to check
print(sbx.commands.run("hostname").stdout.strip(), flush=True)
sbx.kill()
"""


@contextlib.contextmanager
def _server(name: str) -> Iterator[ManagedServer]:
    with managed_server(f"compat-{name}") as server:
        server.second_api_key = server.issue_key("second-owner")
        yield server


def _log_tail(server: ManagedServer) -> str:
    """The server log's error lines and what follows them (a traceback), at most a few thousand bytes."""
    lines = server.log.read_text(errors="replace").splitlines()
    marked = [i for i, line in enumerate(lines) if "ERROR" in line or "Traceback" in line]
    return "\n".join(lines[marked[0] : marked[0] + 60] if marked else lines[-20:])[-4000:]


def _runner(server: ManagedServer, python_clients: PythonClients, node_clients: NodeClients) -> ScenarioRunner:
    assert server.second_api_key is not None
    env = server.clients_env(SECOND_API_KEY=server.second_api_key)
    return ScenarioRunner(python_clients, node_clients, env=env, workdir=lambda name: "/home/user", scripts=SCENARIOS)


def test_two_servers_at_once_keep_their_tenants_apart(python_clients: PythonClients, node_clients: NodeClients) -> None:
    results: dict[str, Any] = {}
    errors: list[Exception] = []
    logs: dict[str, str] = {}

    def burst(label: str, runner: ScenarioRunner) -> None:
        try:
            results[label] = runner("py-sync", CASE.scenario, 300)
        except (ScenarioError, subprocess.SubprocessError) as exc:  # reported below, with the other outcome
            errors.append(exc)

    with _server("server-a") as a:
        env = a.clients_env()
        with subprocess.Popen(
            [str(python_clients.python), "-I", "-c", LONG_LIVED],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as keeper:
            assert keeper.stdout is not None
            assert keeper.stdin is not None
            try:
                kept_id = keeper.stdout.readline().strip()
                first = threading.Thread(target=burst, args=("a", _runner(a, python_clients, node_clients)))
                first.start()
                with _server("server-b") as b:  # starts (and reconciles) while A's burst runs
                    burst("b", _runner(b, python_clients, node_clients))
                    first.join()
                    if errors:  # what the servers said about it, before their logs go
                        logs = {label: _log_tail(server) for label, server in (("A", a), ("B", b))}
                keeper.stdin.write("\n")
                rest, _ = keeper.communicate(timeout=60)
                assert keeper.returncode == 0, (
                    f"server A's sandbox {kept_id}, made before server B started, failed afterwards:\n{rest[-2000:]}"
                )
                hostname = rest.strip().splitlines()[0]
            finally:
                if keeper.poll() is None:
                    keeper.kill()
    assert not errors, (errors, logs)
    for label in ("a", "b"):
        CASE.check(results[label], "/home/user")
    ids_a = {s["id"] for s in results["a"]["sandboxes"]}
    ids_b = {s["id"] for s in results["b"]["sandboxes"]}
    assert not ids_a & ids_b
    assert hostname == kept_id, "server A's sandbox made before B started no longer answers as itself"
