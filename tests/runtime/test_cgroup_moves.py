"""Cheap cgroup moves: which mount gets ``favordynmods``, with which options kept, and what is said.

The parse and the argv are checked on mountinfo texts of the host kinds met (hybrid, as here;
systemd's v2-only); ``favor_cgroup_moves`` on files in a temporary folder with a recording
runner, so nothing here remounts anything. The host's own state is checked live, as root, in CI.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from runtime import _cgroup_moves
from runtime._cgroup_moves import OPTION, favor_cgroup_moves, parse_cgroup2_mounts, remount_argv

HYBRID = """\
24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup rw,relatime shared:9 - tmpfs tmpfs rw,mode=755
32 31 0:27 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
40 31 0:35 / /sys/fs/cgroup/unified rw,relatime shared:18 - cgroup2 cgroup2 rw
41 31 0:36 / /sys/fs/cgroup/hugetlb rw,relatime shared:19 - cgroup cgroup rw,hugetlb
"""
SYSTEMD = (
    "25 22 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2"
    " rw,nsdelegate,memory_recursiveprot\n"
)
FEATURES = "nsdelegate\nfavordynmods\nmemory_localevents\nmemory_recursiveprot\n"


def test_the_cgroup2_mounts_are_read_with_both_kinds_of_options() -> None:
    (mount,) = parse_cgroup2_mounts(HYBRID)
    assert mount.point == "/sys/fs/cgroup/unified"
    assert (mount.mount_options, mount.super_options) == (("rw", "relatime"), ("rw",))
    assert not mount.favors_moves
    (systemd,) = parse_cgroup2_mounts(SYSTEMD)
    assert systemd.super_options == ("rw", "nsdelegate", "memory_recursiveprot")
    with_option = SYSTEMD.replace("memory_recursiveprot", "memory_recursiveprot,favordynmods")
    assert parse_cgroup2_mounts(with_option)[0].favors_moves


def test_optional_fields_and_escaped_paths_do_not_shift_the_fields() -> None:
    line = "50 31 0:40 / /srv/cg\\040two rw,relatime shared:30 master:2 - cgroup2 none rw,nsdelegate\n"
    (mount,) = parse_cgroup2_mounts(line + "garbage line\n51 31 0:41 / /x rw - cgroup2\n")
    assert mount.point == "/srv/cg two"
    assert mount.super_options == ("rw", "nsdelegate")


def test_the_remount_keeps_every_option_the_mount_has() -> None:
    # A cgroup2 remount sets the superblock's flags to exactly the ones given: a dropped
    # nsdelegate would change how a systemd host delegates.
    (systemd,) = parse_cgroup2_mounts(SYSTEMD)
    assert remount_argv(systemd) == [
        "mount",
        "-o",
        f"remount,rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot,{OPTION}",
        "/sys/fs/cgroup",
    ]
    (hybrid,) = parse_cgroup2_mounts(HYBRID)
    assert remount_argv(hybrid) == ["mount", "-o", f"remount,rw,relatime,{OPTION}", "/sys/fs/cgroup/unified"]


class Host:
    """mountinfo and features files, and a ``mount`` that rewrites mountinfo as the kernel would."""

    def __init__(self, folder: Path, mountinfo: str, features: str = FEATURES, fails: str | None = None) -> None:
        self.mountinfo = folder / "mountinfo"
        self.features = folder / "features"
        self.mountinfo.write_text(mountinfo)
        self.features.write_text(features)
        self.fails = fails
        self.ran: list[list[str]] = []
        self.said: list[str] = []

    def run(self, argv: Sequence[str]) -> str | None:
        self.ran.append(list(argv))
        if self.fails is not None:
            return self.fails
        point = argv[-1]
        lines = []
        for line in self.mountinfo.read_text().splitlines():
            remounted = f" {point} " in line and " - cgroup2 " in line
            lines.append(f"{line},{OPTION}" if remounted else line)
        self.mountinfo.write_text("\n".join(lines) + "\n")
        return None

    def favor(self) -> bool:
        return favor_cgroup_moves(self.said.append, mountinfo=self.mountinfo, features=self.features, run=self.run)


def test_the_option_is_turned_on_once_and_said(tmp_path: Path) -> None:
    host = Host(tmp_path, HYBRID)
    assert host.favor()
    assert host.ran == [["mount", "-o", f"remount,rw,relatime,{OPTION}", "/sys/fs/cgroup/unified"]]
    assert len(host.said) == 1
    assert "/sys/fs/cgroup/unified" in host.said[0]
    assert OPTION in host.said[0]
    assert host.favor()
    assert len(host.ran) == 1, "already on: no second remount"
    assert len(host.said) == 1, "and nothing said"


@pytest.mark.parametrize(
    ("mountinfo", "features", "why"),
    [
        (HYBRID, "nsdelegate\nmemory_localevents\n", "this kernel has no"),
        (HYBRID.replace("cgroup2 cgroup2", "cgroup cgroup"), FEATURES, "no cgroup2 mount"),
    ],
    ids=["kernel-without-the-option", "v1-only-host"],
)
def test_a_host_that_cannot_have_it_is_told_why_and_left_alone(
    tmp_path: Path, mountinfo: str, features: str, why: str
) -> None:
    host = Host(tmp_path, mountinfo, features)
    assert not host.favor()
    assert host.ran == []
    assert len(host.said) == 1
    assert why in host.said[0]


def test_a_failed_remount_is_said_and_not_raised(tmp_path: Path) -> None:
    host = Host(tmp_path, SYSTEMD, fails="mount: permission denied")
    assert not host.favor()
    assert len(host.ran) == 1
    assert "permission denied" in host.said[-1]


def test_a_remount_the_kernel_did_not_take_is_not_taken_for_one(tmp_path: Path) -> None:
    host = Host(tmp_path, HYBRID)
    host.run = lambda argv: host.ran.append(list(argv))  # type: ignore[method-assign]
    assert not host.favor()
    assert "does not show" in host.said[-1]


def test_unreadable_files_are_not_fatal(tmp_path: Path) -> None:
    said: list[str] = []
    assert not favor_cgroup_moves(said.append, mountinfo=tmp_path / "none", features=tmp_path / "none")
    assert "cannot read" in said[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="the host's own mounts: remounted only as root")
def test_this_host_has_cheap_cgroup_moves_once_prepared() -> None:
    """CI prepares the host first (every backend's set-up); where this kernel knows the option, it is on."""
    if os.environ.get("CI") != "true":
        pytest.skip("outside CI the host is prepared by `e2b-compat host prepare`, maybe not yet")
    known = _cgroup_moves.FEATURES.read_text().split() if _cgroup_moves.FEATURES.exists() else []
    mounts = parse_cgroup2_mounts(_cgroup_moves.MOUNTINFO.read_text())
    if OPTION not in known or not mounts:
        pytest.skip(f"this kernel or host cannot have {OPTION}: cgroup moves wait for RCU here")
    assert any(mount.favors_moves for mount in mounts)
