"""Waiting for a started sandbox's agent: ``/health`` probes, cut short by the agent's ready signal.

A runtime that can hand the agent a descriptor gives it a pipe (``ReadySignal``); the agent
writes one byte once it listens (``runtime.agent._ready``). The probes back off from 10 ms to
100 ms apart, and the pause between two of them ends as soon as the pipe turns readable.
What answers on the agent's port is the sandbox's to replace, so each probe ends within a
second however slowly its answer comes, and no answer body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from . import _hostfs
from .backend import BackendError

TIMEOUT_S = 30.0
FIRST_PAUSE_S, LAST_PAUSE_S = 0.01, 0.1  # between probes of a starting agent


class ReadySignal:
    """A pipe whose write end the agent gets (``runtime.agent._ready``); waited on instead of polling.

    Readable (its byte, or the end of file once every holder of the write end is gone: the agent
    and the init ended) means: probe ``/health`` now. The probes go on as without it (an agent
    that never signals costs nothing but the interval saved); this only cuts one pause short.
    """

    def __init__(self) -> None:
        self._read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._write_open = True
        self._signalled = False

    def close_write_end(self) -> None:
        if self._write_open:
            self._write_open = False
            os.close(self.write_fd)

    async def sleep(self, seconds: float) -> None:
        """Sleep, cut short the first time the pipe turns readable (it stays so: later sleeps are whole)."""
        if self._signalled:
            await asyncio.sleep(seconds)
            return
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(self._read_fd, on_readable)
        try:
            await asyncio.wait_for(readable, seconds)
            self._signalled = True
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(self._read_fd)

    def close(self) -> None:
        self.close_write_end()
        os.close(self._read_fd)


@contextlib.contextmanager
def ready_signal(wanted: bool) -> Iterator[ReadySignal | None]:
    if not wanted:
        yield None
        return
    signal = ReadySignal()
    try:
        yield signal
    finally:
        signal.close()


async def wait_healthy(url: str, log: Path, ready: ReadySignal | None = None) -> None:
    # What answers is the sandbox's to replace (its tenant is root there): each probe ends within a
    # second however slowly the answer dribbles in, and its body is never read (a 204 has none).
    deadline = time.monotonic() + TIMEOUT_S
    last = "no answer"
    # Backing off to 0.1 s: a refused connection returns at once, and a burst of creates probing
    # every 10 ms kept the server's event loop (and a core) busy while the agents started.
    pause = FIRST_PAUSE_S
    # Plain HTTP to the sandbox's address: no TLS ever, so no certificate store is loaded (with
    # one, each client cost ~28 ms of this thread's time, every create and every resume).
    async with httpx.AsyncClient(timeout=1.0, trust_env=False, verify=False) as client:  # noqa: S501 - http:// only
        while (left := deadline - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(min(1.0, left)), client.stream("GET", url) as response:
                    if response.status_code == 204:
                        return
                    last = f"status {response.status_code}"
            except (httpx.TransportError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await (ready.sleep(pause) if ready is not None else asyncio.sleep(pause))
            pause = min(pause * 1.5, LAST_PAUSE_S)
    raise BackendError(
        f"the agent did not become healthy within {TIMEOUT_S:.0f} s (last probe: {last}): {_hostfs.tail(log)}"
    )
