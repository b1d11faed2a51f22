"""``POST /init`` against fake agents on loopback: a refusal, a 1 GiB answer, an answer that never ends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from reference_server._agent_init import HttpAgentInitializer, agent_answers
from runtime.backend import BackendError

pytestmark = pytest.mark.anyio

GIB = 1024 * 1024 * 1024
BODY = {"accessToken": "secret-token", "envVars": {}}


@dataclass
class FakeAgent:
    port: int
    sent: int = 0  # body bytes the agent managed to write


Answer = Callable[[FakeAgent, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def fake_agent(answer: Answer) -> AsyncIterator[FakeAgent]:
    agent = FakeAgent(port=0)
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            head = await reader.readuntil(b"\r\n\r\n")
            lengths = [
                int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")
            ]
            length = lengths[0] if lengths else 0
            await reader.readexactly(length)
            await answer(agent, writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    agent.port = server.sockets[0].getsockname()[1]
    try:
        yield agent
    finally:
        server.close()
        for task in handlers:  # an agent that never stops writing
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def huge(agent: FakeAgent, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % GIB)
    piece = b"x" * 65536
    while agent.sent < GIB:
        writer.write(piece)
        await writer.drain()  # blocks once the reader stops: what was sent is what was read, plus buffers
        agent.sent += len(piece)


async def dribble(agent: FakeAgent, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100000\r\n\r\n")
    while True:  # a byte now and then: no single read ever times out
        writer.write(b"x")
        await writer.drain()
        agent.sent += 1
        await asyncio.sleep(0.1)


async def refuse(agent: FakeAgent, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 9\r\n\r\nbad token")


async def accept(agent: FakeAgent, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")


async def test_a_204_initializes() -> None:
    initializer = HttpAgentInitializer(timeout_s=5.0)
    async with fake_agent(accept) as agent:
        await initializer("127.0.0.1", agent.port, BODY)
    await initializer.aclose()


async def test_a_refusal_carries_the_agents_short_reason_and_not_the_token() -> None:
    initializer = HttpAgentInitializer(timeout_s=5.0)
    async with fake_agent(refuse) as agent:
        with pytest.raises(BackendError, match="refused /init: 401 bad token") as error:
            await initializer("127.0.0.1", agent.port, BODY)
    assert "secret-token" not in str(error.value)
    await initializer.aclose()


async def test_a_gigabyte_answer_is_read_only_a_little_way() -> None:
    initializer = HttpAgentInitializer(timeout_s=10.0)
    async with fake_agent(huge) as agent:
        started = time.monotonic()
        with pytest.raises(BackendError, match="refused /init: 500") as error:
            await initializer("127.0.0.1", agent.port, BODY)
        assert time.monotonic() - started < 5.0
    # 64 KiB read; the rest never left the agent beyond the kernel's socket buffers.
    assert agent.sent < 64 * 1024 * 1024, agent.sent
    assert len(str(error.value)) < 400, "the reason is cut short"
    await initializer.aclose()


async def test_an_answer_that_never_ends_fails_within_the_timeout() -> None:
    initializer = HttpAgentInitializer(timeout_s=1.0)
    async with fake_agent(dribble) as agent:
        started = time.monotonic()
        with pytest.raises(BackendError, match="did not finish /init within 1 s"):
            await asyncio.wait_for(initializer("127.0.0.1", agent.port, BODY), 10.0)
        assert time.monotonic() - started < 2.0
        assert agent.sent > 0, "the agent was dribbling"
    await initializer.aclose()


async def test_agent_answers_is_a_success_from_health_within_its_timeout() -> None:
    """The probe a strict pause (``requireHealthyGuest``) makes before it pauses."""
    async with fake_agent(accept) as agent:
        assert await agent_answers("127.0.0.1", agent.port) is True
    async with fake_agent(refuse) as agent:
        assert await agent_answers("127.0.0.1", agent.port) is False, "a refusal is not health"

    async def silent(agent: FakeAgent, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async with fake_agent(silent) as agent:
        async with asyncio.timeout(30):  # an agent that never answers does not hold the pause
            assert await agent_answers("127.0.0.1", agent.port, timeout_s=0.5) is False
    async with fake_agent(accept) as agent:
        closed = agent.port
    assert await agent_answers("127.0.0.1", closed) is False, "nothing listening"
