"""Host preparation: the per-user kernel limits every sandbox is charged against are raised, never lowered."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import _oci
from runtime.host import HOST_SANDBOXES, HostNotReadyError, host_limits, raise_limits


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
