"""A small JSON state file shared by every server on the host, changed only under an exclusive ``flock``.

The host-wide registries (``_addresses`` for sandbox subnets, ``_idranges`` for subordinate id
ranges) keep their leases here::

    <folder>/<name>.json   the state, replaced atomically on every change
    <folder>/<name>.lock   the lock (flock: released by the kernel if the holder dies)

A lock file of its own is opened per call: flock locks belong to an open file description,
so two threads of one process exclude each other as two processes do. A damaged state file
is never guessed at (a guess could hand out a leased resource): ``damaged`` names the error.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ._hostfs import write_whole

__all__ = ["LockedState"]


class LockedState:
    def __init__(self, folder: Path, name: str, damaged: Callable[[str], Exception], *keys: str) -> None:
        self.folder = folder
        self.name = name
        self._damaged = damaged
        self._keys = keys  # top-level entries that are always there (as empty objects)

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The state, read under the host-wide lock and written back (atomically) when the block succeeds."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.folder / f"{self.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            state = self._read()
            yield state
            self._write(state)
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self) -> dict[str, Any]:
        path = self.folder / f"{self.name}.json"
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            state = {}
        except ValueError as exc:
            raise self._damaged(
                f"{path} is damaged ({exc}); remove it only when no sandbox runs on this host"
            ) from None
        for key in self._keys:
            state.setdefault(key, {})
        return dict(state)

    def _write(self, state: dict[str, Any]) -> None:
        write_whole(self.folder / f"{self.name}.json", json.dumps(state, indent=1, sort_keys=True), 0o600)
