"""The real reference server (TLS, crun sandboxes) as a process of its own, for the official clients.

The server runs ``e2b-compat serve`` exactly as the README says, configured only through its
documented environment variables, in a process group of its own; the clients get nothing but
the four variables the server prints (``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE``,
``NODE_EXTRA_CA_CERTS``). The crash tests stop it with SIGKILL and start it again on the same
data directory; at the end every sandbox it made is gone and nothing is left mounted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from reference_server._server import READY_LINE
from tests.runtime.agent.conftest import ScenarioRunner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server's crun sandboxes need root")

REPO = Path(__file__).resolve().parents[3]
SCENARIOS = Path(__file__).parent / "scenarios"
CLIENT_VARIABLES = ("E2B_API_KEY", "E2B_DOMAIN", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS")
START_TIMEOUT_S = 900  # a cold start builds the base template (debootstrap) first


def free_port() -> int:
    """A port free on both loopback addresses (the server listens on 127.0.0.1 and ::1)."""
    while True:
        with socket.socket() as four:
            four.bind(("127.0.0.1", 0))
            port: int = four.getsockname()[1]
            with socket.socket(socket.AF_INET6) as six:
                try:
                    six.bind(("::1", port))
                except OSError:
                    continue
            return port


def read_env_file(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            found[name] = value
    return found


class LiveServer:
    """One data directory, and the server process currently serving it (start, kill, restart)."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.log = log
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None
        self.client_env: dict[str, str] = {}
        self.starts = 0

    @property
    def domain(self) -> str:
        return f"e2b.localhost:{self.port}"

    def server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON"))}
        env.update(
            E2B_COMPAT_SERVER_DATA_DIR=str(self.data_dir),
            E2B_COMPAT_SERVER_PORT=str(self.port),
            E2B_COMPAT_SERVER_REAPER_INTERVAL_SECONDS="0.5",
            E2B_COMPAT_SERVER_METRICS_INTERVAL_SECONDS="1",
        )
        return env

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None
        self.starts += 1
        process = subprocess.Popen(
            [sys.executable, "-m", "e2b_compat", "serve"],
            cwd=REPO,
            env=self.server_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: stopping it never reaches anything else
        )
        self.process = process
        ready = threading.Event()

        def pump() -> None:
            assert process.stdout is not None
            with process.stdout, self.log.open("a") as out:
                out.write(f"--- start {self.starts} (pid {process.pid}) ---\n")
                for line in process.stdout:
                    out.write(line)
                    out.flush()
                    if line.strip() == READY_LINE:
                        ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.wait(0.1):
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the server did not start:\n{self.log.read_text()[-5000:]}")
        self.client_env = read_env_file(self.data_dir / "client.env")
        assert set(self.client_env) == set(CLIENT_VARIABLES), self.client_env

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, sig)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def clients_env(self, **extra: str) -> dict[str, str]:
        """The environment the official clients run in: the host's, minus E2B_*, plus the four variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON", "NODE_"))}
        return {**env, **self.client_env, **extra}

    def issue_key(self, owner: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "e2b_compat", "keys", "issue", "--owner", owner, "--data-dir", str(self.data_dir)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()


def release_everything(data_dir: Path) -> None:
    """After the server is stopped: kill every sandbox its runtime still has (nothing may leak)."""
    from runtime._crun import CrunBackend

    backend = CrunBackend(data_dir / "runtime")

    async def kill_all() -> None:
        for info in await backend.list():
            await backend.kill(info.sandbox_id)

    asyncio.run(kill_all())


@pytest.fixture(scope="package")
def live_server() -> Iterator[LiveServer]:
    # Not under pytest's private temp root: idmapped sandbox users must traverse to their layers.
    data_dir = Path(tempfile.mkdtemp(prefix="e2b-compat-server-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    server = LiveServer(data_dir, data_dir.with_suffix(".log"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        release_everything(data_dir)
        leftovers = [line for line in Path("/proc/mounts").read_text().splitlines() if str(data_dir) in line]
        assert not leftovers, f"mounts left behind: {leftovers}"
        with contextlib.suppress(OSError):
            shutil.rmtree(data_dir)


@pytest.fixture(scope="session")
def python_clients() -> PythonClients:
    return ensure_python_clients()


@pytest.fixture(scope="session")
def node_clients() -> NodeClients:
    return ensure_node_clients()


@pytest.fixture(scope="package")
def server_scenario(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> ScenarioRunner:
    """The agent's envd scenarios, now through the server: real sandboxes, TLS, the edge and proxy."""
    return ScenarioRunner(
        python_clients, node_clients, env=live_server.clients_env(), workdir=lambda name: "/home/user"
    )


@pytest.fixture(scope="package")
def lifecycle(live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients) -> ScenarioRunner:
    """Control-plane scenarios (``scenarios/``): create, list, pause, snapshot, ... per client flavour."""
    second = live_server.issue_key("second-owner")
    return ScenarioRunner(
        python_clients,
        node_clients,
        env=live_server.clients_env(SECOND_API_KEY=second),
        workdir=lambda name: "/home/user",
        scripts=SCENARIOS,
    )
