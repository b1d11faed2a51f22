"""The host-wide id-range registry: one subordinate range per sandbox, clear of subid entries and real ids."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest

from runtime._idranges import FIRST_ID, IdRangeError, IdRangeRegistry, subid_ranges

SIZE = 65_536


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(
    folder: Path, subids: list[Path] | None = None, clock: Clock | None = None, count: int = 8
) -> IdRangeRegistry:
    return IdRangeRegistry(folder, count=count, subid_files=subids or [], clock=clock or Clock(), cool_down_s=60)


def test_parallel_allocations_never_share_or_touch_real_ids(tmp_path: Path) -> None:
    # Two registries on one folder stand for two servers on one host; threads for one server's creates.
    regs = [registry(tmp_path, count=64), registry(tmp_path, count=64)]
    got: list[int] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        base = regs[n % 2].allocate(f"server-{n % 2}", f"sb{n}")
        with lock:
            got.append(base)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(got)) == 40
    spans = sorted(got)
    assert all(b - a >= SIZE for a, b in itertools.pairwise(spans)), "ranges overlap"
    assert min(got) >= FIRST_ID, "a range reaches the ids of the host's real users"


def test_ranges_avoid_every_subuid_and_subgid_entry(tmp_path: Path) -> None:
    subuid = tmp_path / "subuid"
    subgid = tmp_path / "subgid"
    # The second and fourth ranges are some host user's; a malformed line is ignored.
    subuid.write_text(f"alice:{FIRST_ID + SIZE + 5}:10\n# comment\nbroken line\n")
    subgid.write_text(f"bob:{FIRST_ID + 3 * SIZE}:{SIZE}\n")
    reg = registry(tmp_path / "reg", subids=[subuid, subgid, tmp_path / "missing"])
    bases = [reg.allocate("srv", f"sb{n}") for n in range(3)]
    assert bases == [FIRST_ID, FIRST_ID + 2 * SIZE, FIRST_ID + 4 * SIZE]
    reserved = subid_ranges([subuid, subgid])
    for base in bases:
        assert not any(base < r.stop and r.start < base + SIZE for r in reserved)


def test_a_claim_after_a_restart_is_refused_where_a_subid_entry_now_lies(tmp_path: Path) -> None:
    # The registry (in /run) was empty after a host restart and a subid entry (docker's remap range) took the range.
    subuid = tmp_path / "subuid"
    subuid.write_text(f"e2b-compat-docker:{FIRST_ID + SIZE}:{SIZE}\n")
    reg = registry(tmp_path / "reg", subids=[subuid])
    assert reg.claim(FIRST_ID, "srv", "kept")
    assert not reg.claim(FIRST_ID + SIZE, "srv", "other"), "a range overlapping a subid entry is never leased"
    assert [lease.base for lease in reg.leases()] == [FIRST_ID]


def test_release_is_the_owners_and_the_range_cools_down(tmp_path: Path) -> None:
    clock = Clock()
    reg = registry(tmp_path, clock=clock, count=2)
    first = reg.allocate("srv", "a")
    assert not reg.release(first, "other-server", "a"), "another owner's lease is left alone"
    assert not reg.release(first, "srv", "b")
    assert reg.release(first, "srv", "a")
    second = reg.allocate("srv", "b")
    assert second != first
    with pytest.raises(IdRangeError, match="1 leased, 1 cooling down"):
        reg.allocate("srv", "c")
    clock.now += 61
    assert reg.allocate("srv", "c") == first, "reused after the cool-down"
    assert [(lease.base, lease.key) for lease in reg.leases("srv")] == sorted([(first, "c"), (second, "b")])


def test_a_damaged_registry_is_refused_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "idranges.json").write_text("{not json")
    with pytest.raises(IdRangeError, match="damaged"):
        registry(tmp_path).allocate("srv", "a")
