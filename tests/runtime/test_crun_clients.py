"""The official Python client against our agent *inside* a crun sandbox.

The client's debug mode talks to ``localhost:49983``; a small relay on the host forwards that
port to the sandbox's agent, so the same scenario scripts as the agent tests run unchanged,
now through the sandbox's user namespace, seccomp profile and cgroup limits, with ``/init``
making ``user`` the default user as E2B's control plane does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conformance._checks import envd_foreground
from conformance._clients import ensure_python_clients
from conformance._scenarios import parse as _parse
from contract.protocol import ENVD_PORT
from runtime.backend import Limits, SandboxSpec
from runtime.crun import CrunBackend
from runtime.host import prepare as prepare_host
from runtime.templates import ensure_template

from .agent.conftest import SCENARIOS, _client_env

pytestmark = [
    pytest.mark.artifacts,
    pytest.mark.skipif(os.geteuid() != 0, reason="crun sandboxes need root (namespaces, mounts, cgroups)"),
]

PORT = ENVD_PORT  # the official clients' debug mode reaches envd at localhost:49983


class Relay:
    """Forwards connections to 127.0.0.1:49983 to the sandbox's agent (threads; stops on close)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", PORT))
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self._target, timeout=10) as upstream:
            upstream.settimeout(None)
            back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
            back.start()
            self._pump(client, upstream)
            back.join()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)  # pass the end of the stream on

    def close(self) -> None:
        self._closed.set()
        self._listener.close()


@pytest.fixture(scope="module")
def sandbox_host() -> Iterator[str]:
    prepare_host(say=lambda msg: print(f"host set-up: {msg}"))
    ensure_template("base")
    folder = Path(tempfile.mkdtemp(prefix="e2b-compat-clients-", dir="/var/tmp"))
    folder.chmod(0o755)
    backend = CrunBackend(folder)
    relay: Relay | None = None
    try:
        asyncio.run(backend.create(SandboxSpec("clients1", "base", limits=Limits(2, 1024, 512))))
        host = asyncio.run(backend.start("clients1")).host or ""
        init = httpx.post(f"http://{host}:49983/init", json={"defaultUser": "user", "envVars": {"FROM_INIT": "yes"}})
        assert init.status_code == 204
        relay = Relay((host, 49983))
        yield host
    finally:
        if relay is not None:
            relay.close()
        asyncio.run(backend.kill("clients1"))
        shutil.rmtree(folder)


def scenario(name: str, work: str) -> dict[str, Any]:
    clients = ensure_python_clients()
    proc = subprocess.run(
        [str(clients.python), "-I", str(SCENARIOS / "py_sync.py"), name, work],
        env=_client_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return _parse(proc, f"py-sync in a sandbox:{name}")


def test_commands_run_as_the_default_user_in_the_sandbox(sandbox_host: str) -> None:
    work = "/home/user/w"
    assert scenario("files/make-dir-rename-remove", work)["first"] is True  # also creates the folder
    envd_foreground(scenario("commands/foreground", work), work)  # the harness's own check
    identity = scenario("commands/user-and-env", work)["lines"]
    assert identity == ["root", "/root", "root", "true"], "user='root' is honoured (sudo-less switch)"


def test_files_and_pty_through_the_sandbox(sandbox_host: str) -> None:
    result = scenario("files/text-bytes-stream", "/home/user/f")
    assert result["relative"] == "/home/user/relative-from-home.txt", "relative to the default user's home"
    assert result["bytes_equal"]
    assert result["stream_equal"]
    assert result["gzip_equal"]
    pty = scenario("pty/session", "/home/user")
    assert "MARK-42" in pty["output"]
    assert "30 100" in pty["output"]
    owner = httpx.post(
        f"http://{sandbox_host}:{ENVD_PORT}/filesystem.Filesystem/Stat",
        json={"path": "/home/user/relative-from-home.txt"},
        headers={"connect-protocol-version": "1"},
    ).json()["entry"]
    assert (owner["owner"], owner["group"]) == ("user", "user"), "files are created as the user, inside the sandbox"
