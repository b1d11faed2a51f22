"""The runtime's wait for a started sandbox's ``/health``, against fake agents on loopback.

What answers on the agent's port is the sandbox's to replace, so each probe must end on time
however the answer dribbles in, and no answer body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from runtime import _oci_backend
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
    monkeypatch.setattr(_oci_backend, "_HEALTH_TIMEOUT_S", 1.5)
    return 1.5


def test_a_healthy_agent_is_seen(tmp_path: Path, short_deadline: float) -> None:
    async def check() -> None:
        async with fake_agent(healthy) as (url, _):
            await _oci_backend._wait_healthy(url, tmp_path / "log")

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
                await asyncio.wait_for(_oci_backend._wait_healthy(url, tmp_path / "log"), 10.0)
            assert time.monotonic() - started < short_deadline + 1.5
            assert sent[0] > 0

    asyncio.run(check())


def test_a_gigabyte_answer_is_not_read(tmp_path: Path, short_deadline: float) -> None:
    async def check() -> None:
        async with fake_agent(huge_body) as (url, sent):
            with pytest.raises(BackendError, match=GAVE_UP_READING):
                await asyncio.wait_for(_oci_backend._wait_healthy(url, tmp_path / "log"), 10.0)
            assert sent[0] < 64 * 1024 * 1024, sent[0]  # each probe drops its connection unread

    asyncio.run(check())
