"""The content API's file operations on a real mounted volume: confinement, owners, atomic writes.

The property test plants links that lead out of the volume (absolute, relative, to a folder
beside it holding a canary) and runs every operation on generated hostile paths: nothing outside
the volume may change, and every refusal is one of the API's answers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_server._volume_files import Owner, VolumeFileError, VolumeFiles
from runtime.volumes import VolumeStorage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a volume is a loop-mounted image: root only")

ANSWERS = {400, 404, 409, 507}


@pytest.fixture(scope="module")
def place() -> Iterator[tuple[VolumeStorage, Path]]:
    base = Path(tempfile.mkdtemp(prefix="e2b-volume-files-", dir="/var/tmp"))
    storage = VolumeStorage(base / "volumes")
    outside = base / "outside"
    outside.mkdir()
    (outside / "canary").write_text("untouched")
    try:
        yield storage, outside
    finally:
        storage.remove("v1")
        shutil.rmtree(base)


@pytest.fixture(scope="module")
def files(place: tuple[VolumeStorage, Path]) -> VolumeFiles:
    storage, outside = place
    root = storage.ensure("v1", 64)
    os.symlink(str(outside), root / "abs-out")
    os.symlink("../../outside", root / "rel-out")
    os.symlink("/proc/self/root/etc", root / "magic-out")
    os.mkdir(root / "d")
    os.symlink("../../../../../..", root / "d" / "up")
    return VolumeFiles(root)


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(path): (path.lstat().st_mode, path.read_bytes() if path.is_file() else b"")
        for path in sorted(folder.rglob("*"))
    }


def test_written_files_have_the_owner_and_mode_asked(files: VolumeFiles) -> None:
    entry = files.write("/w/a.txt", iter([b"one ", b"two"]), Owner(1234, 2345), 0o640)
    assert (entry.path, entry.size, entry.uid, entry.gid, entry.mode) == ("/w/a.txt", 7, 1234, 2345, 0o640)
    parent = files.stat("w")
    assert (parent.type, parent.uid, parent.gid, parent.mode) == ("directory", 1234, 2345, 0o755)
    default = files.write("w/b.txt", iter([b"x"]), Owner(), None)
    assert (default.uid, default.gid, default.mode) == (1000, 1000, 0o644)
    fd, size = files.read("/w/./x/../a.txt")
    try:
        assert (os.read(fd, 100), size) == (b"one two", 7)
    finally:
        os.close(fd)


def test_a_failed_write_leaves_the_old_content(files: VolumeFiles) -> None:
    files.write("keep.txt", iter([b"old"]), Owner(), None)

    def broken() -> Iterator[bytes]:
        yield b"new"
        raise OSError(28, "No space left on device")

    with pytest.raises(VolumeFileError) as refused:
        files.write("keep.txt", broken(), Owner(), None)
    assert refused.value.status == 507
    fd, _ = files.read("keep.txt")
    try:
        assert os.read(fd, 10) == b"old"
    finally:
        os.close(fd)
    assert not [e.name for e in files.list_dir("/", 1) if e.name.startswith(".e2b-upload-")]


def test_links_out_of_the_volume_are_followed_inside_it(files: VolumeFiles, place: tuple[VolumeStorage, Path]) -> None:
    _, outside = place
    for path in ("abs-out/canary", "rel-out/canary", "d/up/outside/canary", "magic-out/passwd", "../outside/canary"):
        with pytest.raises(VolumeFileError) as refused:
            files.read(path)
        assert refused.value.status in (400, 404), path
    link = files.stat("abs-out")
    assert (link.type, link.target) == ("symlink", str(outside))
    files.remove("rel-out")  # the link goes, never what it names
    assert (outside / "canary").read_text() == "untouched"
    os.symlink("../../outside", files.root / "rel-out")


def test_make_dir_and_remove(files: VolumeFiles) -> None:
    with pytest.raises(VolumeFileError) as missing:
        files.make_dir("m/n", Owner(), None, parents=False)
    assert missing.value.status == 404
    made = files.make_dir("m/n", Owner(), 0o700, parents=True)
    assert (made.type, made.mode) == ("directory", 0o700)
    with pytest.raises(VolumeFileError) as twice:
        files.make_dir("m/n", Owner(), None, parents=False)
    assert twice.value.status == 409
    files.remove("m")
    with pytest.raises(VolumeFileError) as gone:
        files.stat("m")
    assert gone.value.status == 404
    with pytest.raises(VolumeFileError) as root:
        files.remove("/")
    assert root.value.status == 400


NAMES = st.sampled_from(
    ["..", ".", "", "abs-out", "rel-out", "magic-out", "d", "up", "outside", "canary", "x", "é", "\ufffd", "a" * 300]
)
PATHS = st.lists(NAMES, min_size=1, max_size=8).map("/".join) | st.text(max_size=40)


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=PATHS, operation=st.sampled_from(["stat", "read", "write", "mkdir", "remove", "list", "update"]))
def test_no_generated_path_reaches_outside(
    files: VolumeFiles, place: tuple[VolumeStorage, Path], path: str, operation: str
) -> None:
    _, outside = place
    before = snapshot(outside)
    refusal: VolumeFileError | None = None
    try:
        if operation == "stat":
            files.stat(path)
        elif operation == "read":
            fd, _ = files.read(path)
            os.close(fd)
        elif operation == "write":
            files.write(path, iter([b"w"]), Owner(), None)
        elif operation == "mkdir":
            files.make_dir(path, Owner(), None, parents=True)
        elif operation == "remove":
            files.remove(path)
        elif operation == "list":
            files.list_dir(path, 2)
        else:
            files.update(path, 0, 0, 0o600)
    except VolumeFileError as exc:
        refusal = exc
    assert refusal is None or refusal.status in ANSWERS, (path, refusal.status, refusal.message)
    assert snapshot(outside) == before, f"{operation} {path!r} changed what is outside the volume"
    for name, target in (("abs-out", str(outside)), ("rel-out", "../../outside")):  # put back what a remove took
        if not os.path.lexists(files.root / name):
            os.symlink(target, files.root / name)
