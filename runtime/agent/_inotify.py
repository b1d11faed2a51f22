"""Recursive directory watcher on inotify, read from the asyncio loop (envd's WatchDir semantics).

Design and why:

- **One inotify fd per watcher, read from the event loop** (``loop.add_reader`` on the
  non-blocking fd): no thread, so all bookkeeping runs on one thread without locks, and
  ``close()`` simply drops the reader and closes the fd (the kernel then drops every watch).
  ``inotify_simple`` makes the syscalls and splits the records; the rest is here.
- **Bookkeeping by relative path**: ``wd → path`` and ``path → wd``, with ``""`` for the
  root. A record's name is its watch's path joined with the record's name, so names are
  relative to the root by construction (``.`` for the root itself).
- **Recursion**: every subdirectory gets its own watch (``IN_DONT_FOLLOW``: symlinks to
  directories are entries, not subtrees). A directory that appears (``IN_CREATE`` or
  ``IN_MOVED_TO`` with ``IN_ISDIR``) is watched *before* it is listed, and what the listing
  finds is reported as synthetic CREATE events (pre-order, sorted, like upstream's walk).
  Watching first means nothing created meanwhile is lost; the price is possible duplicates,
  which upstream has too. A directory moved away or deleted loses the watches of its whole
  subtree at once (upstream keeps reporting a moved-away subtree under its old name; we don't).
- **Event mapping** follows envd 0.6.10 (e2b-dev/fsnotify): see ``event_kinds``. Self-events
  of a subdirectory are dropped except ``IN_ATTRIB``, which upstream also reports (so a chmod
  of a watched subdirectory gives CHMOD twice). The root's ``IN_DELETE_SELF`` is REMOVE ``.``,
  after which the watcher is silent. A moved root is followed silently when recursive; when not
  recursive it is RENAME ``.`` and then silence (upstream's behaviour in both cases).
- **Failures are terminal**: ``IN_Q_OVERFLOW`` (or a failed read or watch at run time) is
  delivered after the events before it, and from then on every ``__anext__`` raises it again.
- **Back-pressure like upstream's unbuffered channel**: past ``_MAX_PENDING`` undelivered
  events the fd is no longer read, so a consumer that stops reading ends up with the kernel's
  queue overflow instead of unbounded memory. A catch-up listing that alone would queue more
  than ``_HARD_CAP`` events fails the watcher the same way (a tree of millions moved in).
- **Setting up a recursive watch yields to the loop** every ``WATCH_SLICE`` entries, so other
  requests are answered while a tree of tens of thousands of directories gets its watches;
  running out of watches (``max_user_watches``) or instances is a ``WatcherError`` that says so.
- **Names** are ``str`` exactly as the ``os`` module makes them (filesystem encoding with
  ``surrogateescape``, both for kernel records and for listings): bytes that are not valid
  UTF-8 become lone surrogates and ``os.fsencode(name)`` gives the original bytes back.
- Catch-up listings of a directory that appears run on the loop thread in one go; a huge tree
  moved in blocks the loop for as long as its listing takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import os
import stat
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol

import inotify_simple

from ._errors import AgentError, ErrorKind
from ._limits import MAX_POLLED_EVENTS, WATCH_SLICE

_F = inotify_simple.flags
IN_MODIFY: Final[int] = int(_F.MODIFY)
IN_ATTRIB: Final[int] = int(_F.ATTRIB)
IN_MOVED_FROM: Final[int] = int(_F.MOVED_FROM)
IN_MOVED_TO: Final[int] = int(_F.MOVED_TO)
IN_CREATE: Final[int] = int(_F.CREATE)
IN_DELETE: Final[int] = int(_F.DELETE)
IN_DELETE_SELF: Final[int] = int(_F.DELETE_SELF)
IN_MOVE_SELF: Final[int] = int(_F.MOVE_SELF)
IN_UNMOUNT: Final[int] = int(_F.UNMOUNT)
IN_Q_OVERFLOW: Final[int] = int(_F.Q_OVERFLOW)
IN_IGNORED: Final[int] = int(_F.IGNORED)
IN_ISDIR: Final[int] = int(_F.ISDIR)

# No IN_OPEN / IN_ACCESS / IN_CLOSE_*: open, read and close produce no events.
_WATCH_MASK: Final[int] = (
    IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_ATTRIB | IN_MODIFY | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
) | int(_F.ONLYDIR)
_MAX_PENDING: Final = 4096
_HARD_CAP: Final = 4 * MAX_POLLED_EVENTS  # undelivered events, whatever produced them
# Errors that mean "this subdirectory cannot be watched (any more)": skipped silently.
_SKIPPABLE: Final = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.ELOOP})
# Upstream's text is "watcher error: fsnotify: queue or buffer overflow"; no client parses it.
OVERFLOW_MESSAGE: Final = "watcher error: event queue overflow"


class EventKind(enum.Enum):
    CREATE = "create"
    WRITE = "write"
    REMOVE = "remove"
    RENAME = "rename"
    CHMOD = "chmod"


@dataclass(frozen=True)
class WatchEvent:
    kind: EventKind
    name: str  # relative to the watched root; "." is the root itself


class WatcherError(AgentError):
    """The watcher failed (queue overflow, watch limit, ...); the message starts with ``watcher error: ``.

    ``internal``, as envd reports a failed watch.
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.INTERNAL, message)


# Upstream's order when one record carries several kinds.
_KIND_BITS: Final = (
    (EventKind.CREATE, IN_CREATE | IN_MOVED_TO),
    (EventKind.RENAME, IN_MOVED_FROM),
    (EventKind.CHMOD, IN_ATTRIB),
    (EventKind.WRITE, IN_MODIFY),
    (EventKind.REMOVE, IN_DELETE | IN_DELETE_SELF),
)


def event_kinds(mask: int) -> list[EventKind]:
    """The kinds one inotify record reports, in the order CREATE, RENAME, CHMOD, WRITE, REMOVE."""
    return [kind for kind, bits in _KIND_BITS if mask & bits]


class _Record(Protocol):
    wd: int
    mask: int
    name: str


class _INotify(Protocol):
    def fileno(self) -> int: ...
    def add_watch(self, path: str, mask: int) -> int: ...
    def rm_watch(self, wd: int) -> None: ...
    def read(self, timeout: int | None = None) -> Iterable[_Record]: ...
    def close(self) -> None: ...


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def describe_failure(exc: OSError) -> str:
    """What a failed inotify call means, in words a user can act on."""
    if exc.errno == errno.ENOSPC:  # inotify_add_watch: the per-user watch limit
        return "the inotify watch limit is reached (fs.inotify.max_user_watches)"
    if exc.errno == errno.EMFILE:  # inotify_init: the per-user instance limit
        return "too many inotify instances (fs.inotify.max_user_instances)"
    return str(exc.strerror or exc)


class DirectoryWatcher:
    """Watches ``root`` (and with ``recursive`` its whole tree); iterate for ``WatchEvent``s."""

    def __init__(self, root: str, *, recursive: bool) -> None:
        self.root = root
        self.recursive = recursive
        self._inotify: _INotify | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paths: dict[int, str] = {}  # wd → relative path ("" = root)
        self._wds: dict[str, int] = {}  # relative path → wd
        self._pending: deque[WatchEvent | WatcherError] = deque()
        self._reading = False
        self._broken = False  # an error is queued: the fd is not read any more
        self._failed: WatcherError | None = None
        self._closed = False
        self._ready = asyncio.Event()  # set when there is something for __anext__ to look at

    async def start(self) -> None:
        """Validate the root and install the watches; events are collected from then on."""
        if self._inotify is not None or self._closed:
            raise RuntimeError("a DirectoryWatcher can be started once")
        if not stat.S_ISDIR(os.stat(self.root).st_mode):  # FileNotFoundError propagates
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), self.root)
        self._loop = asyncio.get_running_loop()
        try:
            self._inotify = inotify_simple.INotify(nonblocking=True)
            self._add_watch("")
            if self.recursive:
                # Events meanwhile wait in the kernel's queue, read once the watches are in.
                for count, _ in enumerate(self._walk(""), 1):
                    if count % WATCH_SLICE == 0:
                        await asyncio.sleep(0)
        except OSError as exc:
            await self.close()
            raise WatcherError(f"watcher error: cannot watch {self.root}: {describe_failure(exc)}") from exc
        except BaseException:  # cancelled while setting up: the fd must not leak
            await self.close()
            raise
        self._resume_reading()

    async def close(self) -> None:
        """Stop watching and release the fd; idempotent. A pending ``__anext__`` ends the iteration."""
        if self._closed:
            return
        self._closed = True
        self._pause_reading()
        if self._inotify is not None:
            self._inotify.close()  # the kernel drops every watch of this fd
        self._paths.clear()
        self._wds.clear()
        self._ready.set()

    async def __aenter__(self) -> DirectoryWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __aiter__(self) -> DirectoryWatcher:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._failed is not None:
                raise WatcherError(str(self._failed))
            if self._pending:
                item = self._pending.popleft()
                if isinstance(item, WatcherError):
                    self._failed = item
                    raise item
                if len(self._pending) < _MAX_PENDING:
                    self._resume_reading()
                return item
            if self._loop is None:
                raise RuntimeError("DirectoryWatcher.start() was not awaited")
            self._ready.clear()
            await self._ready.wait()  # cancellable (wait_for timeouts) without losing anything

    # --- watches -------------------------------------------------------------------------

    def _add_watch(self, rel: str) -> bool:
        """Watch the directory at ``rel``; False when it cannot be (gone, unreadable, not a dir)."""
        assert self._inotify is not None
        path = os.path.join(self.root, rel) if rel else self.root
        mask = _WATCH_MASK if not rel else _WATCH_MASK | int(_F.DONT_FOLLOW)
        try:
            wd = self._inotify.add_watch(path, mask)
        except OSError as exc:
            if rel and exc.errno in _SKIPPABLE:
                return False
            raise
        if wd in self._paths:
            # Already watched: listed when it was added (a duplicate CREATE), or the same
            # directory under a second name (bind mount), which keeps its first name and is
            # not walked again (a bind mount of an ancestor would otherwise never end).
            return False
        self._paths[wd] = rel
        self._wds[rel] = wd
        return True

    def _scan(self, rel: str) -> Iterator[tuple[str, bool]]:
        try:
            with os.scandir(os.path.join(self.root, rel)) as it:
                entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        except OSError:
            return iter(())  # unreadable or already gone: nothing to report or watch
        return ((_join(rel, name), is_dir) for name, is_dir in entries)

    def _walk(self, rel: str) -> Iterator[str]:
        """Watch every directory below ``rel`` (pre-order); yields each entry found."""
        stack = [self._scan(rel)]
        while stack:
            entry = next(stack[-1], None)
            if entry is None:
                stack.pop()
                continue
            child, is_dir = entry
            yield child
            if is_dir and self._add_watch(child):
                stack.append(self._scan(child))

    def _forget(self, wd: int) -> None:
        rel = self._paths.pop(wd, None)
        if rel is not None and self._wds.get(rel) == wd:
            del self._wds[rel]

    def _drop_subtree(self, rel: str) -> None:
        """Remove the watches of ``rel`` and everything below it (moved away or deleted)."""
        assert self._inotify is not None
        prefix = rel + "/"
        for path, wd in [(p, w) for p, w in self._wds.items() if p == rel or p.startswith(prefix)]:
            del self._wds[path]
            self._paths.pop(wd, None)
            with contextlib.suppress(OSError):  # already removed by the kernel
                self._inotify.rm_watch(wd)

    # --- records -------------------------------------------------------------------------

    def _on_readable(self) -> None:
        assert self._inotify is not None
        try:
            records = list(self._inotify.read(timeout=0))
        except OSError as exc:
            records = []
            self._fail(f"watcher error: {describe_failure(exc)}")
        for record in records:
            try:
                self._handle(record.wd, record.mask, record.name)
            except OSError as exc:  # e.g. the watch limit reached for a new subdirectory
                self._fail(f"watcher error: {describe_failure(exc)}")
            if self._broken:
                break  # terminal: nothing after the error is delivered
        if len(self._pending) >= _MAX_PENDING:
            self._pause_reading()
        self._ready.set()

    def _fail(self, message: str) -> None:
        self._pending.append(WatcherError(message))
        self._broken = True
        self._pause_reading()

    def _handle(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self._fail(OVERFLOW_MESSAGE)
            return
        rel = self._paths.get(wd)
        if rel is None:
            return  # a watch already dropped (moved away, deleted, removed by us)
        if mask & (IN_IGNORED | IN_UNMOUNT):
            self._forget(wd)
            return
        if not name:  # an event on a watched directory itself
            if rel:
                mask &= IN_ATTRIB  # the parent reports the rest
            elif mask & IN_MOVE_SELF:
                if self.recursive:
                    return  # followed silently (the names stay relative to it)
                self._drop_subtree("")
                self._emit(EventKind.RENAME, ".")
                return
        path = _join(rel, name) if name else rel or "."
        for kind in event_kinds(mask):
            self._emit(kind, path)
        if not (self.recursive and name and mask & IN_ISDIR):
            return
        if mask & (IN_MOVED_FROM | IN_DELETE):
            self._drop_subtree(path)
        if mask & (IN_CREATE | IN_MOVED_TO) and self._add_watch(path):
            for child in self._walk(path):
                self._emit(EventKind.CREATE, child)
                if self._broken:
                    return

    def _emit(self, kind: EventKind, name: str) -> None:
        if self._broken:
            return
        if len(self._pending) >= _HARD_CAP:
            self._fail(OVERFLOW_MESSAGE)
            return
        self._pending.append(WatchEvent(kind, name))

    # --- loop plumbing -------------------------------------------------------------------

    def _resume_reading(self) -> None:
        if self._reading or self._closed or self._broken or self._inotify is None:
            return
        assert self._loop is not None
        self._loop.add_reader(self._inotify.fileno(), self._on_readable)
        self._reading = True

    def _pause_reading(self) -> None:
        if self._reading and self._loop is not None and self._inotify is not None:
            self._loop.remove_reader(self._inotify.fileno())
        self._reading = False
