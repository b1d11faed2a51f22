"""One request must not freeze the agent's event loop for the others, nor fill its memory.

A FIFO without a writer, an endless device, a recursive watch over tens of thousands of
directories, a process that writes faster than its client reads: while each goes on, other
calls to the same agent still answer at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contract.protocol import encode_envelope
from runtime.agent._inotify import DirectoryWatcher

from .conftest import Agent

STREAM_HEADERS = {"content-type": "application/connect+json", "connect-protocol-version": "1"}


def _health_latency(base: str) -> float:
    started = time.monotonic()
    assert httpx.get(f"{base}/health", timeout=5).status_code == 204
    return time.monotonic() - started


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    yield path
    # A writer that is still blocked in open() on our FIFO must not outlive the test.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.close(fd)


def _in_background(call: object) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001 - reported by the test's assertion
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_downloading_a_fifo_is_refused_and_freezes_nothing(private_agent: Agent, fifo: Path) -> None:
    thread, result = _in_background(
        lambda: httpx.get(f"{private_agent.base}/files", params={"path": str(fifo), "username": "root"}, timeout=5)
    )
    assert _health_latency(private_agent.base) < 1
    thread.join(10)
    response = result[0]
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 400
    assert response.json() == {"code": 400, "message": f"path '{fifo}' is not a regular file"}


def test_downloading_an_endless_device_is_refused(private_agent: Agent) -> None:
    params = {"path": "/dev/zero", "username": "root"}
    with httpx.stream("GET", f"{private_agent.base}/files", params=params, timeout=5) as response:
        head = next(response.iter_bytes(65536), b"")  # an endless body must not keep the test waiting
    assert response.status_code == 400, head[:100]
    assert json.loads(head)["message"] == "path '/dev/zero' is not a regular file"


def test_uploading_onto_a_fifo_is_refused_and_freezes_nothing(private_agent: Agent, fifo: Path) -> None:
    thread, result = _in_background(
        lambda: httpx.post(
            f"{private_agent.base}/files",
            params={"path": str(fifo), "username": "root"},
            content=b"data",
            headers={"content-type": "application/octet-stream"},
            timeout=5,
        )
    )
    assert _health_latency(private_agent.base) < 1
    thread.join(10)
    response = result[0]
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 400
    assert response.json() == {"code": 400, "message": f"path is not a regular file: {fifo}"}


def test_listing_and_stat_of_special_files_do_not_open_them(private_agent: Agent, fifo: Path) -> None:
    for method, body in (("Stat", {"path": str(fifo)}), ("ListDir", {"path": str(fifo.parent)})):
        response = httpx.post(
            f"{private_agent.base}/filesystem.Filesystem/{method}",
            json=body,
            headers={"content-type": "application/json", "connect-protocol-version": "1"},
            timeout=5,
        )
        assert response.status_code == 200, response.text
    (entry,) = [e for e in response.json()["entries"] if e["name"] == "pipe"]
    assert entry["permissions"].startswith("p"), entry


def _make_tree(root: Path, width: int, fanout: int) -> None:
    for i in range(width):
        for j in range(fanout):
            os.makedirs(root / str(i) / str(j))


def test_a_huge_recursive_watch_does_not_stall_the_loop(tmp_path: Path) -> None:
    """20 000 directories get their watches while the loop keeps turning (no gap over 0.2 s)."""
    root = tmp_path / "tree"
    _make_tree(root, 100, 200)

    async def scenario() -> tuple[float, float]:
        ticks: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        watcher = DirectoryWatcher(str(root), recursive=True)
        started = time.monotonic()
        await watcher.start()
        setup = time.monotonic() - started
        await asyncio.sleep(0.02)
        stop.set()
        await task
        await watcher.close()
        return setup, max(b - a for a, b in itertools.pairwise(ticks))

    try:
        setup, gap = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        shutil.rmtree(root)
    assert gap < 0.2, f"the loop stood still for {gap:.2f} s of a {setup:.2f} s setup"


def _inotify_fds() -> int:
    fds = os.listdir("/proc/self/fd")
    count = 0
    for fd in fds:
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


def test_a_watch_cancelled_while_it_is_set_up_releases_its_fd(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    _make_tree(root, 20, 100)
    before = _inotify_fds()

    async def scenario() -> None:
        task = asyncio.create_task(DirectoryWatcher(str(root), recursive=True).start())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert _inotify_fds() == before


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_fast_writer_with_a_slow_reader_keeps_agent_memory_bounded(private_agent: Agent) -> None:
    """512 MiB written at once to stdout, the client reads 1 MiB and stops: the agent holds a few MiB.

    The pipe stops being read once the stream's queue and the connection's buffers are full,
    so the writer blocks as on any full pipe.
    """
    baseline = _rss_kib(private_agent.pid)
    body = encode_envelope(
        json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "head -c 536870912 /dev/zero"]}}).encode()
    )
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", f"{private_agent.base}/process.Process/Start", content=body, headers=STREAM_HEADERS
        ) as response,
    ):
        received = 0
        for chunk in response.iter_raw(65536):
            received += len(chunk)
            if received > 1 << 20:
                break
        time.sleep(2)  # the process would have written it all by now, were nothing blocking it
        grown = _rss_kib(private_agent.pid) - baseline
        assert _health_latency(private_agent.base) < 1
    assert grown < 64 * 1024, f"the agent grew by {grown} KiB"
