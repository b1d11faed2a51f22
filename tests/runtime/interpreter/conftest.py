"""A real interpreter server (``python -m runtime.interpreter``) with real kernels, and a fake envd.

The server runs as a process in a session of its own, with this environment's interpreter as
the kernel python (it has ipykernel and bash_kernel). Its private folders live under a short
scratch folder (unix socket paths are short), so teardown can prove that stopping the server
stopped every kernel: no process may still name that folder on its command line.

The fake envd answers ``GET /envs`` only with the right ``X-Access-Token`` and records the
tokens it was sent. A fake ``e2b_charts`` package on the kernels' path lets the chart
formatter be tested without matplotlib.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
KEEPALIVE_S = 0.5
ENVD_TOKEN = "envd-secret-token"
SANDBOX_ENV = {"SANDBOX_GLOBAL": "from-envd", "SHARED_NAME": "global-value"}
FAKE_CHARTS = """
def chart_figure_to_dict(figure):
    return {"type": "line", "title": figure.title, "elements": []}
"""


@dataclass
class FakeEnvd:
    url: str
    tokens: list[str | None] = field(default_factory=list)


@dataclass
class Interpreter:
    base: str
    cwd: Path
    envd: FakeEnvd
    log: Path

    def client(self, timeout: float = 60) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=timeout)

    def execute(
        self, code: str, *, headers: Mapping[str, str] | None = None, timeout: float = 60, **fields: Any
    ) -> list[dict[str, Any]]:
        """Run code to its end; the lines (keepalives included), checked to end the stream."""
        with (
            self.client(timeout) as client,
            client.stream("POST", "/execute", json={"code": code, **fields}, headers=headers) as response,
        ):
            body = response.read()
            assert response.status_code == 200, body
        assert body.endswith(b"\n"), body
        assert b"\n\n" not in body, body
        lines = [json.loads(raw) for raw in body.decode().split("\n")[:-1]]
        assert lines[-1] == {"type": "end_of_execution"}, lines
        assert all(line["type"] != "end_of_execution" for line in lines[:-1]), lines
        return lines

    def new_context(self, **body: Any) -> str:
        with self.client() as client:
            response = client.post("/contexts", json=body)
        assert response.status_code == 200, response.text
        context_id: str = response.json()["id"]
        return context_id


def content(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines a client acts on (no keepalives, no end marker)."""
    return [line for line in lines if line["type"] not in ("keepalive", "end_of_execution")]


def of_type(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["type"] == kind]


def main_text(lines: list[dict[str, Any]]) -> str | None:
    for line in of_type(lines, "result"):
        if line["is_main_result"]:
            text: str | None = line.get("text")
            return text
    return None


def stdout(lines: list[dict[str, Any]]) -> str:
    return "".join(line["text"] for line in of_type(lines, "stdout"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def fake_envd() -> Iterator[FakeEnvd]:
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            token = self.headers.get("X-Access-Token")
            seen.append(token)
            if self.path != "/envs" or token != ENVD_TOKEN:
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps(SANDBOX_ENV).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeEnvd(f"http://127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _processes_naming(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="session")
def interpreter(fake_envd: FakeEnvd) -> Iterator[Interpreter]:
    scratch = Path(tempfile.mkdtemp(prefix="ci-", dir="/tmp"))
    (scratch / "tmp").mkdir()
    (scratch / "cwd").mkdir()
    (scratch / "fakes" / "e2b_charts").mkdir(parents=True)
    (scratch / "fakes" / "e2b_charts" / "__init__.py").write_text(FAKE_CHARTS)
    env = {
        **os.environ,
        "TMPDIR": str(scratch / "tmp"),
        "IPYTHONDIR": str(scratch / "ipython"),
        "PYTHONPATH": str(scratch / "fakes"),
    }
    port = _free_port()
    log = scratch / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime.interpreter",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--kernel-python",
                sys.executable,
                "--envd-url",
                fake_envd.url,
                "--cwd",
                str(scratch / "cwd"),
                "--keepalive-interval",
                str(KEEPALIVE_S),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield Interpreter(base, scratch / "cwd", fake_envd, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        time.sleep(0.2)  # a kernel told to stop by its parent may take a moment to exit
        leftovers = _processes_naming(str(scratch))
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        server_log = log.read_text(errors="replace")
        shutil.rmtree(scratch, ignore_errors=True)
        assert not leftovers, f"kernels outlived the server: {leftovers}\n{server_log[-4000:]}"
