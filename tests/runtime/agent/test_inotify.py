"""The inotify watcher reports what envd's WatchDir reports, on a real filesystem."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import inotify_simple
import pytest

from runtime.agent._inotify import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    OVERFLOW_MESSAGE,
    DirectoryWatcher,
    EventKind,
    WatcherError,
    WatchEvent,
    event_kinds,
)

T = TypeVar("T")
Seen = list[tuple[str, str]]

CREATE, WRITE, REMOVE, RENAME, CHMOD = "CREATE", "WRITE", "REMOVE", "RENAME", "CHMOD"
QUIET = 0.3  # no event for this long: the burst is over
TEST_TIMEOUT = 30.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one scenario; a hung one fails instead of hanging the suite."""
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT))


def _pair(event: WatchEvent) -> tuple[str, str]:
    return event.kind.name, event.name


async def drain(watcher: DirectoryWatcher, quiet: float = QUIET) -> Seen:
    """Every event until none has come for ``quiet`` seconds."""
    seen: Seen = []
    while True:
        try:
            seen.append(_pair(await asyncio.wait_for(watcher.__anext__(), quiet)))
        except TimeoutError:
            return seen


def squash(seen: Seen) -> Seen:
    """Collapse back-to-back duplicates (the kernel may or may not merge them)."""
    return [pair for i, pair in enumerate(seen) if i == 0 or seen[i - 1] != pair]


async def watch_and_do(root: Path, action: Callable[[], object], *, recursive: bool = False) -> Seen:
    async with DirectoryWatcher(str(root), recursive=recursive) as watcher:
        action()
        return await drain(watcher)


def test_event_kinds_order_and_unsubscribed_bits() -> None:
    everything = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_ATTRIB | IN_MODIFY | IN_DELETE | IN_DELETE_SELF
    assert event_kinds(everything | IN_ISDIR) == [
        EventKind.CREATE,
        EventKind.RENAME,
        EventKind.CHMOD,
        EventKind.WRITE,
        EventKind.REMOVE,
    ]
    assert event_kinds(IN_MOVED_TO) == [EventKind.CREATE]
    assert event_kinds(IN_DELETE_SELF) == [EventKind.REMOVE]
    assert event_kinds(IN_MODIFY | IN_ATTRIB) == [EventKind.CHMOD, EventKind.WRITE]
    flags = inotify_simple.flags
    opens_and_reads = flags.OPEN | flags.ACCESS | flags.CLOSE_WRITE | flags.CLOSE_NOWRITE
    assert event_kinds(opens_and_reads) == []
    assert event_kinds(flags.Q_OVERFLOW | flags.IGNORED) == []


def test_create_and_write(tmp_path: Path) -> None:
    seen = run(watch_and_do(tmp_path, lambda: (tmp_path / "f").write_text("hi")))
    assert squash(seen) == [(CREATE, "f"), (WRITE, "f")]


def test_remove(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("hi")
    assert run(watch_and_do(tmp_path, (tmp_path / "f").unlink)) == [(REMOVE, "f")]


def test_rename_reports_old_then_new_name(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("hi")
    seen = run(watch_and_do(tmp_path, lambda: (tmp_path / "a").rename(tmp_path / "b")))
    assert seen == [(RENAME, "a"), (CREATE, "b")]


def test_chmod_and_touch(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("hi")
    assert run(watch_and_do(tmp_path, lambda: (tmp_path / "f").chmod(0o600))) == [(CHMOD, "f")]
    assert run(watch_and_do(tmp_path, lambda: os.utime(tmp_path / "f", (1, 1)))) == [(CHMOD, "f")]
    assert run(watch_and_do(tmp_path, lambda: tmp_path.chmod(0o700))) == [(CHMOD, ".")]


def test_open_read_close_and_listing_are_silent(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_text("hi")
    (tmp_path / "g").write_text("hi")

    def read_everything() -> None:
        for path in (tmp_path / "g", tmp_path / "sub" / "f"):
            with path.open("rb") as handle:
                handle.read()
        with (tmp_path / "g").open("r+b"):  # opened for writing, nothing written
            pass
        os.listdir(tmp_path)
        os.listdir(tmp_path / "sub")
        os.stat(tmp_path / "g")

    assert run(watch_and_do(tmp_path, read_everything, recursive=True)) == []


def test_recursive_names_are_relative_to_the_root(tmp_path: Path) -> None:
    (tmp_path / "sub" / "inner").mkdir(parents=True)

    def act() -> None:
        (tmp_path / "sub" / "f.txt").write_text("x")
        (tmp_path / "sub" / "inner" / "g").write_text("y")

    seen = squash(run(watch_and_do(tmp_path, act, recursive=True)))
    assert seen == [(CREATE, "sub/f.txt"), (WRITE, "sub/f.txt"), (CREATE, "sub/inner/g"), (WRITE, "sub/inner/g")]


def test_non_recursive_reports_direct_children_only(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()

    def act() -> None:
        (tmp_path / "sub" / "deep").mkdir()
        (tmp_path / "sub" / "f").write_text("x")
        (tmp_path / "sub" / "f").unlink()
        (tmp_path / "direct").mkdir()
        (tmp_path / "direct" / "grandchild").write_text("x")

    assert run(watch_and_do(tmp_path, act)) == [(CREATE, "direct")]


def test_mkdir_p_is_caught_up(tmp_path: Path) -> None:
    async def scenario() -> tuple[Seen, Seen]:
        async with DirectoryWatcher(str(tmp_path), recursive=True) as watcher:
            os.makedirs(tmp_path / "a" / "b" / "c")
            made = await drain(watcher)
            (tmp_path / "a" / "b" / "c" / "f").write_text("x")
            return made, await drain(watcher)

    made, written = run(scenario())
    assert made[0] == (CREATE, "a")
    assert {kind for kind, _ in made} == {CREATE}
    assert {name for _, name in made} == {"a", "a/b", "a/b/c"}  # duplicates allowed, nothing missing
    assert squash(written) == [(CREATE, "a/b/c/f"), (WRITE, "a/b/c/f")]


def test_directory_moved_in_reports_its_contents(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    (outside / "s" / "t").mkdir(parents=True)
    (outside / "s" / "file").write_text("x")
    (outside / "top").write_text("x")

    async def scenario() -> tuple[Seen, Seen]:
        async with DirectoryWatcher(str(root), recursive=True) as watcher:
            outside.rename(root / "in")
            moved = await drain(watcher)
            (root / "in" / "s" / "t" / "new").write_text("x")
            return moved, await drain(watcher)

    moved, written = run(scenario())
    assert moved[0] == (CREATE, "in")
    assert {kind for kind, _ in moved} == {CREATE}
    assert {name for _, name in moved} == {"in", "in/s", "in/s/t", "in/s/file", "in/top"}
    assert squash(written) == [(CREATE, "in/s/t/new"), (WRITE, "in/s/t/new")]


def test_directory_moved_away_is_forgotten(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub" / "deeper").mkdir(parents=True)

    async def scenario() -> tuple[Seen, Seen]:
        async with DirectoryWatcher(str(root), recursive=True) as watcher:
            (root / "sub").rename(tmp_path / "away")
            moved = await drain(watcher)
            (tmp_path / "away" / "f").write_text("x")
            (tmp_path / "away" / "deeper" / "g").write_text("x")
            (tmp_path / "away" / "deeper").chmod(0o700)
            shutil.rmtree(tmp_path / "away")
            return moved, await drain(watcher)

    moved, after = run(scenario())
    assert moved == [(RENAME, "sub")]
    assert after == []


def test_directory_renamed_inside_the_tree_is_followed(tmp_path: Path) -> None:
    (tmp_path / "a" / "x").mkdir(parents=True)

    async def scenario() -> tuple[Seen, Seen]:
        async with DirectoryWatcher(str(tmp_path), recursive=True) as watcher:
            (tmp_path / "a").rename(tmp_path / "b")
            moved = await drain(watcher)
            (tmp_path / "b" / "x" / "f").write_text("x")
            return moved, await drain(watcher)

    moved, written = run(scenario())
    assert moved[:2] == [(RENAME, "a"), (CREATE, "b")]
    assert set(moved[2:]) == {(CREATE, "b/x")}
    assert squash(written) == [(CREATE, "b/x/f"), (WRITE, "b/x/f")]


def test_recursive_delete_then_root_removed_then_silence(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_text("x")

    async def scenario() -> tuple[Seen, bool]:
        async with DirectoryWatcher(str(root), recursive=True) as watcher:
            shutil.rmtree(root)
            seen = await drain(watcher)
            root.mkdir()  # a new directory at the same path is not the watched one
            (root / "g").write_text("x")
            try:
                await asyncio.wait_for(watcher.__anext__(), QUIET)
            except TimeoutError:
                return seen, True  # still open, silent: neither an end nor an error
            return seen, False

    seen, silent = run(scenario())
    assert seen == [(REMOVE, "sub/f"), (REMOVE, "sub"), (REMOVE, ".")]
    assert silent


def test_names_that_are_not_utf8(tmp_path: Path) -> None:
    raw = b"bad\xff"
    (tmp_path / "moved").mkdir()
    os.close(os.open(os.fsencode(tmp_path / "moved") + b"/" + raw, os.O_CREAT | os.O_WRONLY))
    root = tmp_path / "root"
    root.mkdir()

    def act() -> None:
        fd = os.open(os.fsencode(root) + b"/" + raw, os.O_CREAT | os.O_WRONLY)
        os.write(fd, b"x")
        os.close(fd)
        (tmp_path / "moved").rename(root / "d")

    seen = squash(run(watch_and_do(root, act, recursive=True)))
    name = os.fsdecode(raw)
    assert os.fsencode(name) == raw
    assert seen == [(CREATE, name), (WRITE, name), (CREATE, "d"), (CREATE, f"d/{name}")]


def test_close_is_idempotent_and_ends_iteration(tmp_path: Path) -> None:
    def inotify_fds() -> int:
        fds = os.listdir("/proc/self/fd")
        links = []
        for fd in fds:
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
        return sum(link == "anon_inode:inotify" for link in links)

    async def scenario() -> tuple[int, int, int, list[WatchEvent]]:
        before = inotify_fds()
        watcher = DirectoryWatcher(str(tmp_path), recursive=True)
        await watcher.start()
        during = inotify_fds()
        waiting = asyncio.ensure_future(anext(watcher, None))
        await asyncio.sleep(0.05)
        await watcher.close()
        await watcher.close()
        assert await waiting is None  # a pending __anext__ ends the iteration
        (tmp_path / "f").write_text("x")
        rest = [event async for event in watcher]
        return before, during, inotify_fds(), rest

    before, during, after, rest = run(scenario())
    assert during == before + 1
    assert after == before
    assert rest == []
    run(DirectoryWatcher(str(tmp_path), recursive=False).close())  # never started: fine too


def test_queue_overflow_raises_and_stays_failed(tmp_path: Path) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 200_000:
        pytest.skip(f"max_queued_events is {limit}: too many events to produce in a test")
    files = [tmp_path / "a", tmp_path / "b"]
    for path in files:
        path.write_text("x")

    async def scenario() -> tuple[int, list[str]]:
        async with DirectoryWatcher(str(tmp_path), recursive=False) as watcher:
            # No await in between: the loop cannot read, so the kernel queue overflows.
            # Alternating names keeps the kernel from merging the events.
            for i in range(limit + 100):
                os.utime(files[i % 2], (i, i))
            delivered = 0
            errors: list[str] = []
            try:
                async for _event in watcher:
                    delivered += 1
            except WatcherError as exc:
                errors.append(str(exc))
            with pytest.raises(WatcherError) as again:
                await asyncio.wait_for(watcher.__anext__(), 1)
            errors.append(str(again.value))
            return delivered, errors

    delivered, errors = run(scenario())
    assert errors == [OVERFLOW_MESSAGE, OVERFLOW_MESSAGE]
    assert OVERFLOW_MESSAGE.startswith("watcher error: ")
    assert 0 < delivered <= limit  # the events queued before the overflow come first


def test_start_validates_the_root(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError):
        run(DirectoryWatcher(str(tmp_path / "missing"), recursive=True).start())
    with pytest.raises(NotADirectoryError):
        run(DirectoryWatcher(str(tmp_path / "file"), recursive=True).start())


class _FailingINotify(inotify_simple.INotify):  # type: ignore[misc]
    """A real inotify fd whose add_watch fails for chosen directory names."""

    failures: dict[str, int] = {}  # noqa: RUF012  (set per test through monkeypatch)

    def add_watch(self, path: str, mask: int) -> int:
        code = self.failures.get(os.path.basename(path))
        if code is not None:
            raise OSError(code, os.strerror(code))
        return int(super().add_watch(path, mask))


def test_watch_setup_failure_is_a_watcher_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.setattr(_FailingINotify, "failures", {"sub": errno.ENOSPC})
    monkeypatch.setattr(inotify_simple, "INotify", _FailingINotify)
    with pytest.raises(WatcherError, match=r"^watcher error: .*inotify watch limit is reached"):
        run(DirectoryWatcher(str(tmp_path), recursive=True).start())


def test_unreadable_subdirectories_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "locked").mkdir()
    (tmp_path / "open").mkdir()
    monkeypatch.setattr(_FailingINotify, "failures", {"locked": errno.EACCES, "late": errno.EACCES})
    monkeypatch.setattr(inotify_simple, "INotify", _FailingINotify)

    def act() -> None:
        (tmp_path / "locked" / "f").write_text("x")
        (tmp_path / "late").mkdir()
        (tmp_path / "late" / "f").write_text("x")
        (tmp_path / "open" / "f").write_text("x")

    seen = squash(run(watch_and_do(tmp_path, act, recursive=True)))
    assert seen == [(CREATE, "late"), (CREATE, "open/f"), (WRITE, "open/f")]
