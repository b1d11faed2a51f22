"""``to_thread_to_the_end``: a cancelled caller gets its cancel only once the thread's work ended."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime._threads import to_thread_to_the_end


def test_the_value_comes_back() -> None:
    assert asyncio.run(to_thread_to_the_end(lambda: 42)) == 42


def test_a_cancel_waits_for_the_thread() -> None:
    began, go_on = threading.Event(), threading.Event()
    done: list[str] = []

    def work() -> None:
        began.set()
        go_on.wait(10)
        done.append("ended")

    async def main() -> list[str]:
        task = asyncio.create_task(to_thread_to_the_end(work))
        await asyncio.to_thread(began.wait, 10)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for the thread
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(done)  # what the caller sees once its cancel arrived

    assert asyncio.run(main()) == ["ended"]
