"""The checkpoint tools' pins, cache folder and fetch checks (the build itself runs in test_crun via host prepare)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
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


# -- CRIU's kernel facts ------------------------------------------------------------------

_needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the probe runs in a mount namespace of its own (root)")


def _fake_criu(folder: Path, writes: str) -> CheckpointTools:
    """Tools whose ``criu check`` writes ``writes`` to /run/criu.kdat, with the type of /run it saw."""
    (folder / "sbin").mkdir(parents=True)
    script = folder / "sbin" / "criu"
    script.write_text(f'#!/bin/sh\n[ "$1" = check ] || exit 2\n{writes}\n')
    script.chmod(0o755)
    return CheckpointTools(folder)


@_needs_root
def test_the_kernel_facts_are_probed_under_a_tmpfs_of_their_own_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_checkpoint_tools, "_is_tmpfs", lambda folder: False)  # as /run on this kind of host
    tools = _fake_criu(tmp_path / "tools", 'printf "facts on %s" "$(stat -f -c %T /run)" > /run/criu.kdat')
    target = tmp_path / "run" / "criu.kdat"
    target.parent.mkdir()
    host_run = sorted(os.listdir("/run"))
    assert _checkpoint_tools.keep_kernel_facts(tools, target)
    assert target.read_text() == "facts on tmpfs", "CRIU saw a tmpfs at /run, so it wrote its facts"
    assert sorted(os.listdir("/run")) == host_run, "the host's /run never saw the probe"
    assert os.listdir(target.parent) == ["criu.kdat"], "no partial file left"
    assert target.stat().st_mode & 0o777 == 0o600
    # From this boot: kept as it is.
    assert not _checkpoint_tools.keep_kernel_facts(tools, target)
    # Older than the boot (a host restarted with /run on disk) or empty: probed again.
    os.utime(target, (0, 0))
    assert _checkpoint_tools.keep_kernel_facts(tools, target)
    target.write_bytes(b"")
    assert _checkpoint_tools.keep_kernel_facts(tools, target)
    assert target.read_text() == "facts on tmpfs"


@_needs_root
def test_a_probe_that_writes_nothing_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint_tools, "_is_tmpfs", lambda folder: False)
    tools = _fake_criu(tmp_path / "tools", "exit 1")
    target = tmp_path / "run" / "criu.kdat"
    target.parent.mkdir()
    assert not _checkpoint_tools.keep_kernel_facts(tools, target)
    assert os.listdir(target.parent) == []


def test_where_the_folder_is_a_tmpfs_criu_keeps_its_facts_itself(tmp_path: Path) -> None:
    assert _checkpoint_tools._is_tmpfs(Path("/dev/shm"))
    assert not _checkpoint_tools._is_tmpfs(tmp_path / "missing")
    tools = _fake_criu(tmp_path / "tools", "echo facts > /run/criu.kdat")
    assert not _checkpoint_tools.keep_kernel_facts(tools, Path("/dev/shm/e2b-compat-test-criu.kdat"))
    assert not Path("/dev/shm/e2b-compat-test-criu.kdat").exists()


@_needs_root
def test_the_built_criu_loads_the_facts_kept_for_it(tmp_path: Path) -> None:
    """The real tools (CI builds them): after a backend's open, CRIU starts from the kept facts."""
    tools = _checkpoint_tools.find()
    if tools is None:
        pytest.skip("the checkpoint tools are not built on this host (e2b-compat host prepare builds them)")
    if not _checkpoint_tools._is_tmpfs(_checkpoint_tools.KERNEL_FACTS.parent):
        _checkpoint_tools.KERNEL_FACTS.unlink(missing_ok=True)  # what the open must put back
    # Not under pytest's private temp root: a backend's folder must be searchable by sandbox uids.
    state = Path(tempfile.mkdtemp(prefix="e2b-compat-kdat-", dir="/var/tmp"))
    try:
        state.chmod(0o755)
        crun.CrunBackend(state, checkpoint_tools=tools)
    finally:
        shutil.rmtree(state)
    for _ in range(2):  # where /run is a tmpfs CRIU writes them at its first run
        log = tmp_path / "check.log"
        proc = subprocess.run(
            [str(tools.criu), "check", "-v4", "--log-file", str(log)], env=tools.env(), capture_output=True, check=False
        )
    assert proc.returncode == 0, proc.stderr
    assert f"Loaded kdat cache from {_checkpoint_tools.KERNEL_FACTS}" in log.read_text()
