"""``filesystem.Filesystem`` over Connect: the wire side of ``_filesystem`` and ``_inotify``.

Refusals are ``AgentError``s (``FsError``, ``WatcherError``, ``PathError``, ``UserError`` and the
ones raised here); ``_errors.ConnectErrors`` turns them into Connect errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import string
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from connectrpc.request import RequestContext

from contract.generated.filesystem import filesystem_pb2 as pb

from . import _filesystem as fs
from ._credentials import as_user
from ._errors import AgentError, ErrorKind
from ._inotify import OVERFLOW_MESSAGE, DirectoryWatcher, EventKind, WatcherError, WatchEvent
from ._limits import MAX_POLLED_EVENTS
from ._paths import resolve
from ._process_service import DEADLINE_MESSAGE, keepalive_interval
from ._state import AgentState
from ._users import User

_EVENT_TYPES = {
    EventKind.CREATE: pb.EVENT_TYPE_CREATE,
    EventKind.WRITE: pb.EVENT_TYPE_WRITE,
    EventKind.REMOVE: pb.EVENT_TYPE_REMOVE,
    EventKind.RENAME: pb.EVENT_TYPE_RENAME,
    EventKind.CHMOD: pb.EVENT_TYPE_CHMOD,
}
_WITH_ENTRY = frozenset({EventKind.CREATE, EventKind.WRITE, EventKind.CHMOD})
_WATCHER_ID_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(eq=False)
class PollingWatcher:
    """A CreateWatcher watcher: detached from any request, buffers events until polled."""

    watcher: DirectoryWatcher
    events: list[pb.FilesystemEvent] = field(default_factory=list)
    error: str | None = None
    task: asyncio.Task[None] | None = None


class FilesystemService:
    """Implements the generated ``Filesystem`` protocol."""

    def __init__(self, state: AgentState) -> None:
        self._state = state
        self._watchers: dict[str, PollingWatcher] = {}

    # -- helpers -------------------------------------------------------------

    def _user(self, ctx: RequestContext[Any, Any]) -> User:
        return self._state.user_from_basic(ctx.request_headers().get("authorization"))

    def _resolve(self, raw: str, user: User) -> str:
        return resolve(raw, user, self._state.default_workdir)

    async def _event_message(self, root: str, event: WatchEvent, include_entry: bool, user: User) -> pb.FilesystemEvent:
        message = pb.FilesystemEvent(name=fs.wire_text(event.name), type=_EVENT_TYPES[event.kind])
        if include_entry and event.kind in _WITH_ENTRY:
            target = os.path.normpath(os.path.join(root, event.name))
            with contextlib.suppress(OSError, fs.FsError):
                message.entry.CopyFrom(await as_user(user, lambda: fs.entry_info(target, self._state.users)))
        return message

    async def _open_watcher(
        self, path: str, recursive: bool, allow_network_mounts: bool, user: User
    ) -> DirectoryWatcher:
        await as_user(user, lambda: fs.check_watchable(path, allow_network_mounts))
        watcher = DirectoryWatcher(path, recursive=recursive)
        try:
            await watcher.start()
        except FileNotFoundError:
            raise AgentError(ErrorKind.NOT_FOUND, f"path {path} not found") from None
        except NotADirectoryError:
            raise AgentError(ErrorKind.INVALID_ARGUMENT, f"path {path} not a directory") from None
        return watcher

    # -- unary operations --------------------------------------------------------

    async def stat(self, request: pb.StatRequest, ctx: RequestContext[Any, Any]) -> pb.StatResponse:
        user = self._user(ctx)
        path = self._resolve(request.path, user)
        return pb.StatResponse(entry=await as_user(user, lambda: fs.stat_entry(path, self._state.users)))

    async def make_dir(self, request: pb.MakeDirRequest, ctx: RequestContext[Any, Any]) -> pb.MakeDirResponse:
        user = self._user(ctx)
        path = self._resolve(request.path, user)
        return pb.MakeDirResponse(entry=await as_user(user, lambda: fs.make_dir(path, self._state.users)))

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any]) -> pb.MoveResponse:
        user = self._user(ctx)
        source = self._resolve(request.source, user)
        destination = self._resolve(request.destination, user)
        entry = await as_user(user, lambda: fs.move(source, destination, self._state.users))
        return pb.MoveResponse(entry=entry)

    async def list_dir(self, request: pb.ListDirRequest, ctx: RequestContext[Any, Any]) -> pb.ListDirResponse:
        user = self._user(ctx)
        path = self._resolve(request.path, user)
        entries = await as_user(user, lambda: fs.list_dir(path, path, request.depth, self._state.users))
        return pb.ListDirResponse(entries=entries)

    async def remove(self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any]) -> pb.RemoveResponse:
        user = self._user(ctx)
        path = self._resolve(request.path, user)
        await as_user(user, lambda: fs.remove(path))
        return pb.RemoveResponse()

    # -- streaming watch ---------------------------------------------------------

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        user = self._user(ctx)
        path = self._resolve(request.path, user)
        watcher = await self._open_watcher(path, request.recursive, request.allow_network_mounts, user)
        interval = keepalive_interval(ctx)
        loop = asyncio.get_running_loop()
        remaining = ctx.timeout_ms()
        deadline = None if remaining is None else loop.time() + remaining / 1000.0
        events = aiter(watcher)
        try:
            yield pb.WatchDirResponse(start=pb.WatchDirResponse.StartEvent())
            while True:
                wait = interval if deadline is None else min(interval, deadline - loop.time())
                if wait <= 0:
                    raise AgentError(ErrorKind.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
                try:
                    event = await asyncio.wait_for(anext(events), wait)
                except TimeoutError:
                    if deadline is None or loop.time() < deadline:
                        yield pb.WatchDirResponse(keepalive=pb.WatchDirResponse.KeepAlive())
                    continue
                message = await self._event_message(path, event, request.include_entry, user)
                yield pb.WatchDirResponse(filesystem=message)
        finally:
            await watcher.close()

    # -- polling watchers ----------------------------------------------------------

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CreateWatcherResponse:
        user = self._user(ctx)
        path = self._resolve(request.path, user)
        watcher = await self._open_watcher(path, request.recursive, request.allow_network_mounts, user)
        polling = PollingWatcher(watcher)
        watcher_id = "w" + "".join(secrets.choice(_WATCHER_ID_ALPHABET) for _ in range(20))
        polling.task = asyncio.create_task(self._collect(polling, path, request.include_entry, user))
        self._watchers[watcher_id] = polling
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def _collect(self, polling: PollingWatcher, root: str, include_entry: bool, user: User) -> None:
        """Buffer events until polled; more than ``MAX_POLLED_EVENTS`` unpolled is an overflow.

        envd's list is unbounded; here a watcher nobody polls fails as inotify's own queue
        does when full: every later poll answers the error, the buffered events are dropped.
        """
        try:
            async for event in polling.watcher:
                if len(polling.events) >= MAX_POLLED_EVENTS:
                    raise WatcherError(OVERFLOW_MESSAGE)
                message = await self._event_message(root, event, include_entry, user)
                # Appended after the await: ``polling.events.append(await ...)`` binds the list first,
                # and a poll during the entry's stat swaps it out, so the event went to a list
                # already answered (seen: a watch with include_entry missing a directory's create).
                polling.events.append(message)
        except WatcherError as exc:
            polling.error = str(exc)
            polling.events = []
            await polling.watcher.close()

    def _polling(self, watcher_id: str) -> PollingWatcher:
        polling = self._watchers.get(watcher_id)
        if polling is None:
            raise AgentError(ErrorKind.NOT_FOUND, f"watcher with id {watcher_id} not found")
        return polling

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: RequestContext[Any, Any]
    ) -> pb.GetWatcherEventsResponse:
        self._user(ctx)
        polling = self._polling(request.watcher_id)
        if polling.error is not None:
            raise AgentError(ErrorKind.INTERNAL, polling.error)
        events, polling.events = polling.events, []
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.RemoveWatcherResponse:
        self._user(ctx)
        polling = self._polling(request.watcher_id)
        del self._watchers[request.watcher_id]
        await self._stop(polling)
        return pb.RemoveWatcherResponse()

    async def _stop(self, polling: PollingWatcher) -> None:
        if polling.task is not None:
            polling.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling.task
        await polling.watcher.close()

    async def shutdown(self) -> None:
        for polling in list(self._watchers.values()):
            await self._stop(polling)
        self._watchers.clear()
