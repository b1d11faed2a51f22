"""Host preparation: the per-user kernel limits are raised, never lowered; the host-wide memory ledger."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runtime import _oci
from runtime.host import HOST_SANDBOXES, HostNotReadyError, MemoryLedger, host_limits, process_start_time, raise_limits


def sysctls(root: Path, instances: int, watches: int) -> None:
    (root / "fs" / "inotify").mkdir(parents=True)
    (root / "fs" / "inotify" / "max_user_instances").write_text(f"{instances}\n")
    (root / "fs" / "inotify" / "max_user_watches").write_text(f"{watches}\n")


def test_low_inotify_limits_are_raised_to_fit_every_sandbox_at_its_bound(tmp_path: Path) -> None:
    sysctls(tmp_path, 128, 10**9)
    said: list[str] = []
    raise_limits(said.append, root=tmp_path)
    instances = int((tmp_path / "fs/inotify/max_user_instances").read_text())
    assert instances >= HOST_SANDBOXES * _oci.INOTIFY_INSTANCES + 128
    assert (tmp_path / "fs/inotify/max_user_watches").read_text() == "1000000000\n", "never lowered"
    assert len(said) == 1
    assert "max_user_instances" in said[0]
    raise_limits(said.append, root=tmp_path)
    assert len(said) == 1, "nothing to say the second time"
    assert host_limits()["fs/inotify/max_user_watches"] >= HOST_SANDBOXES * _oci.INOTIFY_WATCHES


def test_an_unreadable_limit_says_which(tmp_path: Path) -> None:
    with pytest.raises(HostNotReadyError, match="max_user_instances"):
        raise_limits(root=tmp_path)


def test_the_memory_ledger_sums_the_other_live_servers(tmp_path: Path) -> None:
    ledger = MemoryLedger(tmp_path)
    with ledger.committing("/srv/a") as (elsewhere, publish):
        assert elsewhere == 0
        publish(1024)
    with ledger.committing("/srv/b") as (elsewhere, publish):
        assert elsewhere == 1024, "another server's commitment counts"
        publish(512)
    with ledger.committing("/srv/a") as (elsewhere, publish):
        assert elsewhere == 512, "its own entry is not counted twice"
        publish(256)
    state = json.loads((tmp_path / "memory.json").read_text())
    state["servers"]["/srv/b"]["started"] = -1  # the same pid, another process: b has ended
    (tmp_path / "memory.json").write_text(json.dumps(state))
    with ledger.committing("/srv/a") as (elsewhere, _):
        assert elsewhere == 0
    assert "/srv/b" not in json.loads((tmp_path / "memory.json").read_text())["servers"], "an ended server is dropped"


def test_a_process_start_time_names_one_process() -> None:
    mine = process_start_time(os.getpid())
    assert isinstance(mine, int)
    assert process_start_time(os.getpid()) == mine
    assert process_start_time(2**22 + 1) is None  # above the kernel's pid limit: never a process
