"""The filesystem service's polling watchers, apart from inotify: what a poll answers, event by event."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from contract.generated.filesystem import filesystem_pb2 as pb
from runtime.agent._filesystem_service import FilesystemService, PollingWatcher
from runtime.agent._inotify import DirectoryWatcher
from runtime.agent._state import AgentState


class _Events:
    """A watcher's event stream fed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> str:
        return await self.queue.get()

    async def close(self) -> None:
        return None


def test_an_event_whose_entry_is_read_while_a_poll_answers_is_in_the_next_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> list[list[str]]:
        state = SimpleNamespace(user_from_basic=lambda header: None)
        service = FilesystemService(cast(AgentState, state))
        stream = _Events()
        polling = PollingWatcher(cast(DirectoryWatcher, stream))
        stat_done = asyncio.Event()

        async def message_after_a_stat(root: str, event: Any, include_entry: bool, user: Any) -> pb.FilesystemEvent:
            await stat_done.wait()  # the entry's stat, on a thread, while a poll comes in
            return pb.FilesystemEvent(name=event, type=pb.EVENT_TYPE_CREATE)

        monkeypatch.setattr(service, "_event_message", message_after_a_stat)
        service._watchers["w1"] = polling
        polling.task = asyncio.create_task(service._collect(polling, "/watched", True, cast(Any, None)))
        ctx = cast(Any, SimpleNamespace(request_headers=dict))
        request = pb.GetWatcherEventsRequest(watcher_id="w1")
        polls = []
        await stream.queue.put("d")
        await asyncio.sleep(0.01)
        polls.append([e.name for e in (await service.get_watcher_events(request, ctx)).events])
        stat_done.set()
        await asyncio.sleep(0.01)
        polls.append([e.name for e in (await service.get_watcher_events(request, ctx)).events])
        await service.shutdown()
        return polls

    assert asyncio.run(scenario()) == [[], ["d"]]
