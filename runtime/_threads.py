"""Host work in a thread that a cancelled caller waits for, so that undoing it never races it.

``asyncio.to_thread`` returns to a cancelled caller at once while its thread runs on; a backend
that then releases what the thread is still making (a network, a disk) leaves half of it behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def to_thread_to_the_end(func: Callable[[], T]) -> T:
    """``func()`` in a thread; when the caller is cancelled, the cancel is raised once the thread ended."""
    work = asyncio.ensure_future(asyncio.to_thread(func))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.gather(work, return_exceptions=True)
        raise
