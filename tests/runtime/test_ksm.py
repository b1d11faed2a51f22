"""Switching the host's same-page merging on for the agents, never against an operator's setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime import _ksm, host


def _sysfs(tmp_path: Path, run: str, pages: int) -> Path:
    (tmp_path / "run").write_text(f"{run}\n")
    (tmp_path / "pages_to_scan").write_text(f"{pages}\n")
    (tmp_path / "pages_sharing").write_text("42\n")
    return tmp_path


def test_an_idle_ksmd_is_switched_on_and_paced(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, "0", 100)
    assert _ksm.ensure_running(root)
    assert (root / "run").read_text() == "1\n"
    assert int((root / "pages_to_scan").read_text()) == _ksm.PAGES_TO_SCAN


def test_a_faster_pace_set_by_an_operator_is_kept(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, "1", 5000)
    assert _ksm.ensure_running(root)
    assert (root / "pages_to_scan").read_text() == "5000\n"


def test_an_operator_unmerging_everything_is_left_alone(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, "2", 100)
    assert not _ksm.ensure_running(root)
    assert (root / "run").read_text() == "2\n"


def test_a_kernel_without_ksm_shares_nothing(tmp_path: Path) -> None:
    assert not _ksm.available(tmp_path)
    assert not _ksm.ensure_running(tmp_path)
    assert host.ksm_counters(tmp_path) == {}


def test_a_sysfs_that_refuses_is_a_warning_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "run").write_text("1\n")
    (tmp_path / "pages_to_scan").mkdir()  # any OSError: a read-only sysfs in a container, say
    assert not _ksm.ensure_running(tmp_path)
    assert "cannot be switched on" in caplog.text


def test_counters_are_read(tmp_path: Path) -> None:
    assert host.ksm_counters(_sysfs(tmp_path, "1", 100)) == {"pages_sharing": 42}


def test_ksmd_cpu_time_is_read_from_its_stat(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "comm").write_text("systemd\n")
    (tmp_path / "39").mkdir()
    (tmp_path / "39" / "comm").write_text("ksmd\n")
    # pid (comm) state ppid ... utime is the 14th field, stime the 15th
    (tmp_path / "39" / "stat").write_text("39 (ksmd) S 2 0 0 0 -1 2129984 0 0 0 0 250 750 0 0 25 5 1 0 3 0 0\n")
    assert host.ksmd_cpu_seconds(tmp_path) == pytest.approx(1000 / os.sysconf("SC_CLK_TCK"))
    assert host.ksmd_cpu_seconds(tmp_path / "1") is None
