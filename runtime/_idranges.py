"""Subordinate uid/gid ranges for sandboxes, one per sandbox, from one registry for the whole host.

Each sandbox's user namespace maps its ids 0..65535 onto a range of host ids of its own, so a
process that escapes one sandbox owns nothing of another's (files, processes, signals), and the
range belongs to no host user: ranges never overlap an entry of ``/etc/subuid`` or
``/etc/subgid`` (the ranges the host has given its users for their own containers) and start
above ``FIRST_ID`` (2**20), far from the ids of real users and system accounts.

Like ``_addresses``, the leases live in one flock-guarded file per host (``_hostregistry``), so
several servers on one host and the worker threads of one server never share a range::

    <folder>/idranges.json   {"next": <index>, "leases": {<base>: {"owner", "key"}},
                              "cooling": {<base>: <released at, unix seconds>}}

- ``allocate(owner, key)`` hands out the next free range (next fit, wrapping around), skipping
  leased ones, ones released less than ``cool_down_s`` ago (a process of the old sandbox that
  outlived it briefly must not meet the new one's files), and any that overlaps a subid entry.
- ``release(base, owner, key)`` ends that owner's lease and starts the range's cool-down.
- ``leases(owner)`` lists one owner's leases, for a backend's reconciliation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from . import _addresses
from ._hostregistry import LockedState
from .backend import BackendError

__all__ = ["FIRST_ID", "RANGE_SIZE", "IdLease", "IdRangeError", "IdRangeRegistry", "subid_ranges"]

FIRST_ID = 1 << 20
RANGE_SIZE = 65_536
RANGES = 4096  # 2**20 + 4096 * 65536 stays below 2**29: well inside uid_t, clear of (uid_t)-1
COOL_DOWN_S = 60.0
SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))


class IdRangeError(BackendError):
    """No id range is free, or the registry cannot be read."""


@dataclass(frozen=True)
class IdLease:
    base: int
    owner: str
    key: str


def subid_ranges(paths: Iterable[Path] = SUBID_FILES) -> list[range]:
    """The ranges of ``name:start:count`` lines in subid files (missing files and odd lines: none)."""
    found = []
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            parts = line.strip().split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                found.append(range(int(parts[1]), int(parts[1]) + int(parts[2])))
    return found


class IdRangeRegistry:
    def __init__(
        self,
        folder: Path | None = None,  # default: the host's registry folder, shared with _addresses
        *,
        size: int = RANGE_SIZE,
        first: int = FIRST_ID,
        count: int = RANGES,
        subid_files: Iterable[Path] = SUBID_FILES,
        cool_down_s: float = COOL_DOWN_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.size = size
        self._first = first
        self._count = count
        self._subid_files = tuple(subid_files)
        self._cool_down_s = cool_down_s
        self._clock = clock
        self._state = LockedState(
            folder if folder is not None else _addresses.DEFAULT_REGISTRY, "idranges", IdRangeError, "leases", "cooling"
        )

    def allocate(self, owner: str, key: str) -> int:
        """The first id of a range of ``size`` ids leased to ``owner`` for ``key``."""
        reserved = subid_ranges(self._subid_files)  # read on every call: the host may add users
        with self._state.locked() as state:
            now = self._clock()
            cooling = {base: at for base, at in state["cooling"].items() if now - float(at) < self._cool_down_s}
            state["cooling"] = cooling
            taken = {int(base) for base in (*state["leases"], *cooling)}
            start = int(state.get("next", 0)) % self._count
            for step in range(self._count):
                index = (start + step) % self._count
                base = self._first + index * self.size
                if base in taken or any(base < r.stop and r.start < base + self.size for r in reserved):
                    continue
                state["leases"][str(base)] = {"owner": owner, "key": key}
                state["next"] = index + 1
                return base
            raise IdRangeError(
                f"no free id range of {self.size} ids left ({len(state['leases'])} leased, "
                f"{len(cooling)} cooling down, {len(reserved)} subid entries avoided)"
            )

    def claim(self, base: int, owner: str, key: str) -> bool:
        """Lease the range at ``base`` again (a sandbox kept across a host restart); False when another holds it.

        A subid entry made while the registry was empty (it lives in /run) may cover it now: refused too.
        """
        if any(base < r.stop and r.start < base + self.size for r in subid_ranges(self._subid_files)):
            return False
        with self._state.locked() as state:
            held = state["leases"].get(str(base))
            if held is not None:
                return bool(held == {"owner": owner, "key": key})
            state["leases"][str(base)] = {"owner": owner, "key": key}
            state["cooling"].pop(str(base), None)
            return True

    def release(self, base: int, owner: str, key: str) -> bool:
        """End ``owner``'s lease of the range at ``base`` for ``key``; False when it holds none."""
        with self._state.locked() as state:
            if state["leases"].get(str(base)) != {"owner": owner, "key": key}:
                return False
            del state["leases"][str(base)]
            state["cooling"][str(base)] = self._clock()
            return True

    def leases(self, owner: str | None = None) -> list[IdLease]:
        with self._state.locked() as state:
            return [
                IdLease(int(base), lease["owner"], lease["key"])
                for base, lease in sorted(state["leases"].items(), key=lambda item: int(item[0]))
                if owner is None or lease["owner"] == owner
            ]
