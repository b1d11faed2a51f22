"""The runtime's wait for a started sandbox's ``/health``, against fake agents on loopback.

What answers on the agent's port is the sandbox's to replace, so each probe must end on time
however the answer dribbles in, and no answer body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from runtime import _health
from runtime.backend import BackendError

GIB = 1024 * 1024 * 1024
Answer = Callable[[asyncio.StreamWriter, list[int]], Awaitable[None]]


@contextlib.asynccontextmanager
async def fake_agent(answer: Answer) -> AsyncIterator[tuple[str, list[int]]]:
    sent = [0]
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            await reader.readuntil(b"\r\n\r\n")
            await answer(writer, sent)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/health", sent
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def dribbled_head(writer: asyncio.StreamWriter, sent: list[int]) -> None:
    writer.write(b"HTTP/1.1 204 No Content\r\n")
    while True:  # header bytes every 0.2 s: no single read waits a second, the head never ends
        writer.write(b"X")
        await writer.drain()
        sent[0] += 1
        await asyncio.sleep(0.2)


async def huge_body(writer: asyncio.StreamWriter, sent: list[int]) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % GIB)
    piece, mine = b"x" * 65536, 0
    try:
        while mine < GIB:
            writer.write(piece)
            await writer.drain()  # blocks once the prober stops reading
            mine += len(piece)
    finally:
        sent[0] = max(sent[0], mine)  # the most one probe's connection took


async def healthy(writer: asyncio.StreamWriter, sent: list[int]) -> None:
    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(_health, "TIMEOUT_S", 1.5)
    return 1.5


def test_a_healthy_agent_is_seen(tmp_path: Path, short_deadline: float) -> None:
    async def check() -> None:
        async with fake_agent(healthy) as (url, _):
            await _health.wait_healthy(url, tmp_path / "log")

    asyncio.run(check())


# What the last probe met, in the error: a head that never ends times out (asyncio's or httpx's
# deadline, whichever fires first); a head read whole may answer its status before the body stalls.
GAVE_UP_WAITING = r"did not become healthy .*\(last probe: (TimeoutError|ReadTimeout)"
GAVE_UP_READING = r"did not become healthy .*\(last probe: (status 200|TimeoutError|ReadTimeout)"


def test_a_head_that_never_ends_fails_by_the_deadline(tmp_path: Path, short_deadline: float) -> None:
    async def check() -> None:
        async with fake_agent(dribbled_head) as (url, sent):
            started = time.monotonic()
            with pytest.raises(BackendError, match=GAVE_UP_WAITING):
                await asyncio.wait_for(_health.wait_healthy(url, tmp_path / "log"), 10.0)
            assert time.monotonic() - started < short_deadline + 1.5
            assert sent[0] > 0

    asyncio.run(check())


def test_a_gigabyte_answer_is_not_read(tmp_path: Path, short_deadline: float) -> None:
    async def check() -> None:
        async with fake_agent(huge_body) as (url, sent):
            with pytest.raises(BackendError, match=GAVE_UP_READING):
                await asyncio.wait_for(_health.wait_healthy(url, tmp_path / "log"), 10.0)
            assert sent[0] < 64 * 1024 * 1024, sent[0]  # each probe drops its connection unread

    asyncio.run(check())


@pytest.fixture
def slow_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pauses between probes long enough that only the ready signal can end a wait in time."""
    monkeypatch.setattr(_health, "FIRST_PAUSE_S", 120.0)
    monkeypatch.setattr(_health, "LAST_PAUSE_S", 120.0)


def test_the_ready_signal_ends_the_pause_between_probes(tmp_path: Path, slow_backoff: None) -> None:
    async def scenario() -> None:
        with _health.ready_signal(True) as ready:
            assert ready is not None
            port_free = await _free_port()
            url = f"http://127.0.0.1:{port_free}/health"
            task = asyncio.create_task(_health.wait_healthy(url, tmp_path / "log", ready))
            await asyncio.sleep(0.3)  # the first probe was refused: the prober sleeps 120 s
            server = await asyncio.start_server(_answer_healthy, "127.0.0.1", port_free)
            try:
                os.write(ready.write_fd, b"1")
                await asyncio.wait_for(task, 20.0)
            finally:
                server.close()
                await server.wait_closed()

    asyncio.run(scenario())


def test_the_end_of_the_pipe_also_wakes_and_later_pauses_are_whole(slow_backoff: None) -> None:
    async def scenario() -> None:
        with _health.ready_signal(True) as ready:
            assert ready is not None
            ready.close_write_end()  # every writer gone (the init ended): readable at once, for good
            started = time.monotonic()
            await asyncio.wait_for(ready.sleep(60.0), 5.0)
            assert time.monotonic() - started < 5.0
            with pytest.raises(TimeoutError):  # no busy loop on a pipe that stays readable
                await asyncio.wait_for(ready.sleep(60.0), 0.3)

    asyncio.run(scenario())


def test_without_a_runtime_that_passes_it_there_is_no_signal() -> None:
    with _health.ready_signal(False) as ready:
        assert ready is None


async def _answer_healthy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        await reader.readuntil(b"\r\n\r\n")
        await healthy(writer, [0])
        await writer.drain()
    writer.close()


async def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_probes_load_no_certificate_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain HTTP to the sandbox: loading the store cost ~28 ms of the event loop per create."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a certificate store was loaded")

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", refused)

    async def scenario() -> None:
        async with fake_agent(healthy) as (url, _sent):
            await _health.wait_healthy(url, tmp_path / "log")

    asyncio.run(scenario())
