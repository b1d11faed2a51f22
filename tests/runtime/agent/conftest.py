"""A real agent process on the clients' debug port, and runners for official-client scenarios.

The official clients' debug mode (``E2B_DEBUG=true``) talks to envd at ``localhost:49983``
without a control plane, so the agent is started as a process of its own on that port,
listening on 127.0.0.1 and ::1 (Node resolves ``localhost`` to ::1 first). Scenarios run in
the pinned clients' own environments (see ``conformance._clients``), never in this one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conformance._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from conformance._scenarios import SCENARIOS as ALL_SCENARIOS
from conformance._scenarios import ScenarioRunner
from contract.protocol import ENVD_PORT

ENVD_SCENARIOS = ALL_SCENARIOS / "envd"

PORT = ENVD_PORT
BASE = f"http://127.0.0.1:{PORT}"
SCENARIOS = ENVD_SCENARIOS
REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Agent:
    pid: int
    base: str
    workdir: Path  # a scratch folder the scenarios may use


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@contextlib.contextmanager
def running_agent(port: int, log: Path, workdir: Path, *extra: str) -> Iterator[Agent]:
    """Start ``python -m runtime.agent`` in a process group of its own; stop that group afterwards."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime.agent",
                "--host",
                "127.0.0.1",
                "--host",
                "::1",
                "--port",
                str(port),
                *extra,
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 204:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"agent did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield Agent(proc.pid, base, workdir)
        assert proc.poll() is None, f"the agent died during the tests:\n{log.read_text()}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the group we created: the agent and its children
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="package")  # frees port 49983 for the sandbox tests that follow
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """The agent on the clients' debug port, shared by the official-client scenarios."""
    if not _port_free(PORT):
        pytest.fail(f"port {PORT} is in use: the clients' debug mode needs it for the agent under test")
    folder = tmp_path_factory.mktemp("agent")
    with running_agent(PORT, folder / "agent.log", tmp_path_factory.mktemp("agent-work")) as running:
        yield running


@pytest.fixture
def private_agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent of the test's own (on a free port), for tests that change its state (token, /init)."""
    with running_agent(free_port(), tmp_path / "agent.log", tmp_path) as running:
        yield running


@pytest.fixture(scope="session")
def python_clients() -> PythonClients:
    return ensure_python_clients()


@pytest.fixture(scope="session")
def node_clients() -> NodeClients:
    return ensure_node_clients()


def _client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON", "NODE_"))}
    env["E2B_DEBUG"] = "true"
    return env


@pytest.fixture(scope="package")
def scenario(agent: Agent, python_clients: PythonClients, node_clients: NodeClients) -> ScenarioRunner:
    def workdir(name: str) -> str:
        folder = agent.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    return ScenarioRunner(python_clients, node_clients, env=_client_env(), workdir=workdir)
