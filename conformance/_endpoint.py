"""The endpoint under test: our reference server started here, or any E2B-compatible service.

A harness run needs only what a user of the official clients has: ``E2B_API_KEY``,
``E2B_DOMAIN`` and, for a private CA, ``SSL_CERT_FILE`` / ``NODE_EXTRA_CA_CERTS``. A second
owner's key is optional (the owner-isolation case is skipped without it, saying so).

``ManagedServer`` runs ``e2b-compat serve`` on a data folder of its own, in a process group of
its own, configured only through its documented variables, and can be stopped with any signal
and started again (the crash tests do that). ``ExternalEndpoint`` is anything else.

This is the harness's one door to the runtime (only our own server has a backend): the serving
backends, their feature lists and their host preparation are read here, from ``runtime.backends``.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CLIENT_VARIABLES",
    "Endpoint",
    "ExternalEndpoint",
    "ManagedServer",
    "backend_features",
    "free_port",
    "prepare_backend_host",
    "read_env_file",
    "runtime_features",
    "serving_backends",
]

CLIENT_VARIABLES = ("E2B_API_KEY", "E2B_DOMAIN", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS")
READY_LINE = "e2b-compat server ready"  # printed by reference_server._server once it listens
START_TIMEOUT_S = 900  # a cold start builds the base template (debootstrap) first
REPO = Path(__file__).resolve().parent.parent


class EndpointError(RuntimeError):
    """The endpoint could not be started or is not usable; the message says why."""


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


def serving_backends() -> tuple[str, ...]:
    """The backends our server can run on (``runtime.backends``), in the table's order."""
    from runtime.backends import serving_backends as serving  # noqa: PLC0415 - the table is cheap to import

    return serving()


def runtime_features() -> tuple[str, ...]:
    """Every feature a backend may lack (``runtime.backend.Feature`` values), sorted."""
    from runtime.backend import Feature  # noqa: PLC0415

    return tuple(sorted(feature.value for feature in Feature))


def backend_features(name: str) -> tuple[str, ...]:
    """What the table says backend ``name`` provides, sorted, without opening it."""
    from runtime.backends import backend_entry  # noqa: PLC0415

    return tuple(sorted(feature.value for feature in backend_entry(name).features()))


def prepare_backend_host(name: str, say: Callable[[str], None]) -> None:
    """Install and check what backend ``name`` needs (as ``e2b-compat host prepare --backend``)."""
    from runtime.backend import SandboxRuntimeError  # noqa: PLC0415
    from runtime.backends import backend_entry  # noqa: PLC0415

    try:
        backend_entry(name).prepare_host(say)
    except SandboxRuntimeError as exc:
        raise EndpointError(f"the host is not ready for {name}: {exc}") from exc


def read_env_file(path: Path) -> dict[str, str]:
    """The ``export NAME=value`` lines of a sourceable file (what ``serve`` writes to client.env)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            found[name] = value
    return found


def _clean_environment() -> dict[str, str]:
    """The host's environment without anything that could configure a client or an interpreter."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON", "NODE_"))}


@dataclass
class ExternalEndpoint:
    client_env: dict[str, str]
    second_api_key: str | None = None
    server: str = "external"
    backend: str = "unknown"
    template: str = "base"

    def clients_env(self, **extra: str) -> dict[str, str]:
        return {**_clean_environment(), **self.client_env, **extra}

    @property
    def domain(self) -> str:
        return self.client_env["E2B_DOMAIN"]


@dataclass
class ManagedServer:
    """One data folder, and the ``e2b-compat serve`` process currently serving it."""

    data_dir: Path
    log: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[str] | None = None
    client_env: dict[str, str] = field(default_factory=dict)
    starts: int = 0
    second_api_key: str | None = None
    server: str = "e2b-compat reference server"
    backend: str = "crun"
    template: str = "base"

    @property
    def domain(self) -> str:
        return f"e2b.localhost:{self.port}"

    def server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON"))}
        env.update(
            E2B_COMPAT_SERVER_DATA_DIR=str(self.data_dir),
            E2B_COMPAT_SERVER_PORT=str(self.port),
            E2B_COMPAT_SERVER_BACKEND=self.backend,
        )
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            raise EndpointError("the server is already running")
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
                raise EndpointError(f"the server did not start:\n{self.log.read_text()[-5000:]}")
        self.client_env = read_env_file(self.data_dir / "client.env")
        if set(self.client_env) != set(CLIENT_VARIABLES):
            raise EndpointError(f"client.env holds {sorted(self.client_env)}, not {list(CLIENT_VARIABLES)}")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, sig)  # the group start() created, and nothing else
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def clients_env(self, **extra: str) -> dict[str, str]:
        """The environment the official clients run in: the host's, minus E2B_*, plus the four variables."""
        return {**_clean_environment(), **self.client_env, **extra}

    def issue_key(self, owner: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "e2b_compat", "keys", "issue", "--owner", owner, "--data-dir", str(self.data_dir)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    def release_everything(self) -> None:
        """After the server stopped: kill every sandbox its runtime still has (nothing may leak)."""
        import asyncio  # noqa: PLC0415

        # Only a managed server has a runtime here: the one its backend setting named.
        from runtime.backends import BackendOptions, open_backend  # noqa: PLC0415

        backend = open_backend(self.backend, BackendOptions(state_dir=self.data_dir / "runtime"))

        async def kill_all() -> None:
            for info in await backend.list():
                await backend.kill(info.sandbox_id)
            # What the server's own kills left to finish (docker: containers its reaper had not removed).
            await backend.reconcile()

        asyncio.run(kill_all())
        # Volumes stay mounted while the host runs (a second mount of an image would corrupt it);
        # with nothing of this server's left running, they are unmounted too.
        from runtime.volumes import VolumeStorage  # noqa: PLC0415

        VolumeStorage(self.data_dir / "volumes").release_all()


Endpoint = ExternalEndpoint | ManagedServer
