"""Snapshot layers go back to 0-based owners: files of the sandbox's range shift down, the rest stays."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from runtime._idmap import Mapping, unshift_owners

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to other users needs root")

BASE = 1 << 21


def test_owners_in_the_range_shift_back_and_setuid_bits_stay(tmp_path: Path) -> None:
    layer = tmp_path / "upper"
    (layer / "home" / "user").mkdir(parents=True)
    mine = layer / "home" / "user" / "mine.txt"
    mine.write_text("x")
    tool = layer / "tool"
    tool.write_text("#!/bin/sh\n")
    os.mknod(layer / "gone", stat.S_IFCHR | 0o000, os.makedev(0, 0))  # an overlay whiteout: host root's
    (layer / "link").symlink_to("tool")
    for path, (uid, gid) in {
        layer: (BASE, BASE),
        layer / "home": (BASE, BASE),
        layer / "home" / "user": (BASE + 1000, BASE + 1000),
        mine: (BASE + 1000, BASE + 1000),
        tool: (BASE, BASE + 5),
        layer / "link": (BASE + 1000, BASE),
    }.items():
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(tool, 0o6755)
    unshift_owners(layer, Mapping(BASE, 65536))
    owners = {
        str(path.relative_to(tmp_path)): (path.lstat().st_uid, path.lstat().st_gid)
        for path in [layer, *sorted(layer.rglob("*"))]
    }
    assert owners == {
        "upper": (0, 0),
        "upper/gone": (0, 0),
        "upper/home": (0, 0),
        "upper/home/user": (1000, 1000),
        "upper/home/user/mine.txt": (1000, 1000),
        "upper/link": (1000, 0),
        "upper/tool": (0, 5),
    }
    assert stat.S_IMODE(tool.stat().st_mode) == 0o6755, "chown cleared setuid/setgid; put back"
