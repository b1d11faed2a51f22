"""The checkpoint tools' pins, cache folder and fetch checks (the build itself runs in test_crun via host prepare)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from runtime import _checkpoint_tools, crun
from runtime._checkpoint_tools import CheckpointTools, Source, ToolsError
from runtime.backend import Feature


def test_the_folder_names_the_pins_and_only_a_complete_build_is_found(tmp_path: Path) -> None:
    root = _checkpoint_tools.tools_dir(tmp_path)
    assert root.parent == tmp_path / "tools"
    assert root.name.startswith("checkpoint-")
    assert _checkpoint_tools.find(tmp_path) is None
    (root / "bin").mkdir(parents=True)
    assert _checkpoint_tools.find(tmp_path) is None, "a build cut short is never used"
    (root / "complete").write_text("x\n")
    assert _checkpoint_tools.find(tmp_path) == CheckpointTools(root)


def test_another_pin_is_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _checkpoint_tools.tools_dir(tmp_path)
    newer = Source("criu", "9.9", "http://example.invalid/criu.tar.xz", "0" * 64)
    monkeypatch.setattr(_checkpoint_tools, "CRIU_SOURCE", newer)
    assert _checkpoint_tools.tools_dir(tmp_path) != before


def test_the_environment_reaches_this_criu_first(tmp_path: Path) -> None:
    env = CheckpointTools(tmp_path).env()
    assert env["PATH"].split(":")[0] == str(tmp_path / "sbin")
    assert env["PATH"].split(":")[1:] == os.environ.get("PATH", "/usr/sbin:/usr/bin").split(":")


def test_crun_hands_criu_its_options_only_for_a_checkpoint_or_restore(tmp_path: Path) -> None:
    command = crun.CrunCommand("crun", tmp_path, env={"PATH": "/x"})
    assert command._env() == {"PATH": "/x"}
    assert command._env(tmp_path / "criu.conf") == {"PATH": "/x", "CRIU_CONFIG_FILE": str(tmp_path / "criu.conf")}
    assert crun.CrunCommand("crun", tmp_path)._env() is None, "without tools: the server's own environment"


def _tarball(folder: Path, top: str) -> Path:
    path = folder / "src.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo(f"{top}/README")
        data = b"source\n"
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return path


def test_a_tarball_whose_hash_differs_is_refused(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path, "criu-4.2.1")
    source = Source("criu", "4.2.1", tarball.as_uri(), "0" * 64)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ToolsError, match="sha256"):
        _checkpoint_tools._fetch(source, work)
    assert not (work / "criu-4.2.1").exists(), "nothing unpacked"


def test_a_tarball_with_the_pinned_hash_is_unpacked(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path, "crun-1.21")
    source = Source("crun", "1.21", tarball.as_uri(), hashlib.sha256(tarball.read_bytes()).hexdigest())
    work = tmp_path / "work"
    work.mkdir()
    tree = _checkpoint_tools._fetch(source, work)
    assert (tree / "README").read_text() == "source\n"


def test_the_crun_entry_offers_memory_on_disk_only_where_the_tools_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint_tools, "find", lambda cache_root=None: None)
    assert Feature.PAUSE_MEMORY_ON_DISK not in crun.FEATURES
    monkeypatch.setattr(_checkpoint_tools, "find", lambda cache_root=None: CheckpointTools(Path("/nowhere")))
    assert Feature.PAUSE_MEMORY_ON_DISK in crun.FEATURES
    assert Feature.PAUSE_MEMORY in crun.FEATURES
