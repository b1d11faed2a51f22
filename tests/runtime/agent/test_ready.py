"""The agent's ready signal: one byte on the runtime's pipe once it listens, held by nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from runtime.agent._app import create_app
from runtime.agent._ready import READY_FD_ENV, signal_ready, take_ready_fd
from runtime.agent._server import _SignallingServer, bind

from .conftest import REPO, free_port


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):  # closed by the code under test
            os.close(fd)


def test_the_named_pipe_is_taken_made_private_and_the_variable_removed(pipe: tuple[int, int]) -> None:
    _, write_fd = pipe
    os.set_inheritable(write_fd, True)
    environ = {READY_FD_ENV: str(write_fd), "OTHER": "kept"}
    assert take_ready_fd(environ) == write_fd
    assert environ == {"OTHER": "kept"}
    assert not os.get_inheritable(write_fd)


@pytest.mark.parametrize("value", ["", "x", "-1", "3 ", "999999"])
def test_a_malformed_or_closed_descriptor_is_ignored(value: str) -> None:
    environ = {READY_FD_ENV: value}
    assert take_ready_fd(environ) is None
    assert environ == {}


def test_a_descriptor_that_is_no_pipe_is_ignored_and_left_alone(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "file", os.O_CREAT | os.O_WRONLY)
    try:
        assert take_ready_fd({READY_FD_ENV: str(fd)}) is None
        os.fstat(fd)  # still open: not ours to close
    finally:
        os.close(fd)


def test_without_the_variable_there_is_nothing_to_signal() -> None:
    assert take_ready_fd({}) is None
    signal_ready(None)  # a no-op


def test_the_signal_is_one_byte_then_the_end(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    signal_ready(write_fd)
    assert os.read(read_fd, 16) == b"1"
    assert os.read(read_fd, 16) == b""


def test_a_runtime_that_stopped_waiting_is_no_error(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.close(read_fd)
    signal_ready(write_fd)  # EPIPE swallowed, descriptor closed
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(write_fd)


def test_a_real_agent_signals_once_it_listens_and_its_services_never_hold_the_pipe() -> None:
    """The byte comes when /health already answers; then the end of file: nobody else has the pipe.

    The agent runs a template service (started before it listens), which would keep the pipe
    open, and the end of file away, had it inherited the descriptor.
    """
    read_fd, write_fd = os.pipe()
    port, service_port = free_port(), free_port()
    service = f"{service_port}={sys.executable} -m http.server --bind 127.0.0.1 {service_port}"
    with tempfile.TemporaryDirectory() as folder, open(Path(folder) / "agent.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.agent", "--host", "127.0.0.1", "--port", str(port), "--service", service],
            cwd=REPO,
            env={**os.environ, READY_FD_ENV: str(write_fd)},
            pass_fds=(write_fd,),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.close(write_fd)
        try:
            readable, _, _ = select.select([read_fd], [], [], 60)
            assert readable, "no signal within 60 s"
            assert os.read(read_fd, 16) == b"1"
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 204
            assert httpx.get(f"http://127.0.0.1:{service_port}/", timeout=5).status_code == 200
            readable, _, _ = select.select([read_fd], [], [], 10)
            assert readable, "another process holds the pipe"
            assert os.read(read_fd, 16) == b""
            assert proc.poll() is None
        finally:
            os.close(read_fd)
            os.killpg(proc.pid, signal.SIGTERM)  # the group we created: the agent and its service
            proc.wait(20)


def test_the_agent_loads_without_the_cyclic_collector_and_listens_with_it() -> None:
    """``python -m runtime.agent`` turns the collector off for its imports; the listening server turns it back on."""
    # Run as ``python -m runtime.agent`` runs it, up to the call that would serve.
    probe = (
        "import gc, runpy, runtime.agent._server as server\n"
        "server.serve = lambda *args, **kwargs: print(gc.isenabled())\n"
        "runpy.run_module('runtime.agent', run_name='__main__', alter_sys=True)\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout == "False\n"
    imported = "import gc, runtime.agent.__main__; print(gc.isenabled())"
    kept = subprocess.run([sys.executable, "-c", imported], cwd=REPO, capture_output=True, text=True, check=True)
    assert kept.stdout == "True\n", "a process that only imports the module keeps its collector"

    async def serve_briefly() -> bool:
        config = uvicorn.Config(create_app(), lifespan="on", log_level="warning")
        server = _SignallingServer(config, ready_fd=None)
        sock = bind("127.0.0.1", 0)
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            while not server.started and not serving.done():
                await asyncio.sleep(0.01)
            return gc.isenabled()
        finally:
            server.should_exit = True
            await serving
            sock.close()

    gc.disable()
    try:
        assert asyncio.run(serve_briefly()) is True
    finally:
        gc.enable()
