"""``BatchedWrites``: the small writes of a few loop passes leave as one, in order, and never wait longer.

The rules are checked on a recording transport; then, on both event loops the server and the
agent run (asyncio, uvloop), over a real loopback connection, that a held write reaches the peer
by itself, and that uvicorn's protocol behind it answers a streaming response chunk by chunk
(a message is never held for the next one) with the head and first chunk in one packet.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvicorn
import uvloop

from runtime.agent._server import NoDelayH11Protocol
from runtime.agent._write_batch import DIRECT_BYTES, HOLD_PASSES, BatchedWrites

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


class Recording(asyncio.Transport):
    """A transport that keeps what it was asked to do."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False
        self.buffered = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", b""))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("192.0.2.1", 1)}.get(name, default)


async def _passes(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def _writes(transport: Recording) -> list[bytes]:
    return [data for call, data in transport.calls if call == "write"]


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_writes_of_one_pass_leave_as_one_after_the_held_passes(loop_name: str) -> None:
    async def main() -> None:
        raw = Recording()
        batched = BatchedWrites(raw, asyncio.get_running_loop())
        batched.write(b"head")
        batched.write(b"")  # nothing to send: no empty write either
        batched.write(bytearray(b"-first"))
        await _passes(1)
        batched.write(memoryview(b"-second"))  # a writer that yielded once still joins
        assert raw.calls == []
        assert batched.get_write_buffer_size() == len(b"head-first-second")
        await _passes(HOLD_PASSES + 1)
        assert _writes(raw) == [b"head-first-second"]
        assert batched.get_write_buffer_size() == 0
        batched.write(b"later")  # a new batch starts with the next write
        await _passes(HOLD_PASSES + 1)
        assert _writes(raw) == [b"head-first-second", b"later"]

    LOOPS[loop_name](main())


def test_a_large_write_goes_at_once_after_what_was_held() -> None:
    async def main() -> None:
        raw = Recording()
        batched = BatchedWrites(raw, asyncio.get_running_loop())
        large = b"x" * DIRECT_BYTES
        batched.write(large)
        assert _writes(raw) == [large]  # nothing held: straight through, no copy
        batched.write(b"small")
        batched.write(large)
        assert _writes(raw) == [large, b"small" + large]  # in order, in one
        batched.write(b"a" * (DIRECT_BYTES // 2))
        batched.write(b"b" * (DIRECT_BYTES // 2))  # small ones that add up go at once too
        assert _writes(raw)[-1] == b"a" * (DIRECT_BYTES // 2) + b"b" * (DIRECT_BYTES // 2)
        await _passes(HOLD_PASSES + 1)
        assert len(_writes(raw)) == 3  # the scheduled flush finds nothing left

    asyncio.run(main())


def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    async def main() -> None:
        raw = Recording()
        batched = BatchedWrites(raw, asyncio.get_running_loop())
        batched.write(b"last words")
        batched.close()
        assert raw.calls == [("write", b"last words"), ("close", b"")]
        await _passes(HOLD_PASSES + 1)
        assert len(raw.calls) == 2  # the flush still scheduled sends nothing twice

        raw = Recording()
        batched = BatchedWrites(raw, asyncio.get_running_loop())
        batched.write(b"never sent")
        batched.abort()
        await _passes(HOLD_PASSES + 1)
        assert raw.calls == [("abort", b"")]

    asyncio.run(main())


def test_what_is_held_when_the_connection_goes_is_dropped_as_the_transport_would() -> None:
    async def main() -> None:
        raw = Recording()
        batched = BatchedWrites(raw, asyncio.get_running_loop())
        batched.write(b"too late")
        raw.closing = True  # the peer went away (connection_lost) before the flush
        await _passes(HOLD_PASSES + 1)
        assert raw.calls == []
        assert batched.get_write_buffer_size() == 0

    asyncio.run(main())


def test_everything_else_is_the_transports() -> None:
    async def main() -> None:
        raw = Recording()
        batched = BatchedWrites(raw, asyncio.get_running_loop())
        raw.buffered = 7
        batched.write(b"abc")
        assert batched.get_write_buffer_size() == 10
        assert batched.get_extra_info("peername") == ("192.0.2.1", 1)
        assert batched.get_extra_info("sockname", "none") == "none"
        assert not batched.is_closing()
        raw.closing = True
        assert batched.is_closing()

    asyncio.run(main())


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_held_write_reaches_the_peer_by_itself(loop_name: str) -> None:
    """Nothing else happens on the loop: the write must still leave, promptly."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answered = 0

        class Echo(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = BatchedWrites(transport, loop)  # type: ignore[arg-type]

            def data_received(self, data: bytes) -> None:
                nonlocal answered
                answered += 1
                self.transport.write(b"pong:")
                self.transport.write(data)

        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for index in range(20):
                writer.write(b"%02d" % index)
                assert await asyncio.wait_for(reader.readexactly(7), 5) == b"pong:%02d" % index
            writer.close()
            await writer.wait_closed()
        finally:
            server.close()
            await server.wait_closed()
        assert answered == 20

    LOOPS[loop_name](main())


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: a failing test stays interruptible."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Counting(asyncio.Transport):
    """A real transport, with each write it is given kept: one write is one send."""

    def __init__(self, inner: asyncio.Transport, writes: list[bytes]) -> None:
        super().__init__()
        self._inner = inner
        self._writes = writes

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._writes.append(bytes(data))
        self._inner.write(data)

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size()

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_uvicorn_behind_it_streams_each_chunk_when_it_is_made(loop_name: str) -> None:
    """The agent's protocol: the head and first chunk in one send, the next chunk only once made."""
    sends: list[bytes] = []

    class Counted(NoDelayH11Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(Counting(transport, sends))  # type: ignore[arg-type]

    async def main() -> None:
        second = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            await second.wait()
            await send({"type": "http.response.body", "body": b"second", "more_body": True})
            await asyncio.sleep(0)  # a yield between the last chunk and the end, as Connect's stream end has
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        config = uvicorn.Config(app, http=Counted, lifespan="off", log_level="warning", timeout_graceful_shutdown=2)
        server = _Server(config)
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        writer: asyncio.StreamWriter | None = None
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
            first = await asyncio.wait_for(reader.readuntil(b"5\r\nfirst\r\n"), 5)
            assert first.startswith(b"HTTP/1.1 200 OK\r\n")  # the first chunk arrived before the second was made
            assert len(sends) == 1  # with the head, in one send
            second.set()
            rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
            assert rest == b"6\r\nsecond\r\n0\r\n\r\n"
            assert sends[1:] == [rest]  # the last chunk and the end, in one send
        finally:
            second.set()
            if writer is not None:
                writer.close()
            server.should_exit = True
            await serving

    LOOPS[loop_name](main())
