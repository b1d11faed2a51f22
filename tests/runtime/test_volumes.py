"""Volumes' files on the host (runtime.volumes): one image per volume, its root, its size, its removal.

Root only (loop devices, owners); the content API on top is tests/reference_server/test_volume_files.py's,
mounts in real sandboxes tests/reference_server/live/test_volume_clients.py's.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runtime import _hostfs
from runtime.volumes import MIN_MB, ROOT_OWNER, VolumeStorage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a volume is a loop-mounted image: root only")


@pytest.fixture
def storage() -> Iterator[VolumeStorage]:
    base = Path(tempfile.mkdtemp(prefix="e2b-compat-volumes-", dir="/var/tmp"))
    volumes = VolumeStorage(base / "volumes")
    try:
        yield volumes
    finally:
        volumes.release_all()
        for point in _hostfs.mounts_under(base):
            _hostfs.unmount(point)
        shutil.rmtree(base)


def _fill(path: Path) -> int:
    """Write until the volume refuses; the errno of the refusal."""
    block = b"\1" * (1 << 20)
    with path.open("wb") as handle:
        try:
            while True:
                handle.write(block)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            return exc.errno or 0


def test_a_new_volume_is_an_empty_root_of_the_sandboxes_user(storage: VolumeStorage) -> None:
    root = storage.ensure("vol-a", MIN_MB)
    assert root == storage.mount_point("vol-a")
    assert storage.mounted("vol-a")
    assert list(root.iterdir()) == [], "no lost+found or anything else: the volume starts empty"
    info = root.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (ROOT_OWNER, ROOT_OWNER, 0o755)
    home = stat.S_IMODE(root.parent.stat().st_mode)
    assert home == 0o700, f"the volume's folder on the host is {home:o}: only root may walk in"
    assert storage.ids() == {"vol-a"}


def test_ensure_never_reformats_and_keeps_owners_across_a_release(storage: VolumeStorage) -> None:
    root = storage.ensure("vol-b", MIN_MB)
    (root / "kept.txt").write_text("kept")
    os.chown(root / "kept.txt", 0, 0)
    os.chmod(root, 0o700)  # changed by a sandbox: a second ensure must not reset it
    assert storage.ensure("vol-b", MIN_MB) == root, "ensure of a mounted volume is a no-op"
    storage.release("vol-b")
    assert not storage.mounted("vol-b")
    assert not (root / "kept.txt").exists()
    storage.ensure("vol-b", MIN_MB)
    assert (root / "kept.txt").read_text() == "kept"
    assert (root / "kept.txt").stat().st_uid == 0
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_the_kernel_enforces_the_size(storage: VolumeStorage) -> None:
    root = storage.ensure("vol-c", MIN_MB)
    used, total = storage.usage("vol-c")
    assert total <= MIN_MB << 20
    assert used < total
    assert _fill(root / "big") == errno.ENOSPC
    image = storage.root / "vol-c" / "volume.img"
    assert image.stat().st_blocks * 512 <= (MIN_MB + 1) << 20, "the host holds no more than the volume's size"
    (root / "big").unlink()
    (root / "after.txt").write_text("room again")  # a full volume recovers once files go


def test_volumes_are_apart_and_made_in_parallel(storage: VolumeStorage) -> None:
    ids = [f"vol-p{i}" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        roots = list(pool.map(lambda v: storage.ensure(v, MIN_MB), ids))
    for volume_id, root in zip(ids, roots, strict=True):
        (root / "mine.txt").write_text(volume_id)
    assert [(root / "mine.txt").read_text() for root in roots] == ids
    assert storage.ids() == set(ids)
    assert len({os.stat(root).st_dev for root in roots}) == 4, "each volume is a filesystem of its own"


def test_remove_unmounts_and_deletes_and_is_idempotent(storage: VolumeStorage) -> None:
    storage.ensure("vol-d", MIN_MB)
    storage.ensure("vol-e", MIN_MB)
    storage.remove("vol-d")
    assert not storage.mounted("vol-d")
    assert not (storage.root / "vol-d").exists()
    storage.remove("vol-d")  # again: nothing left to do, no error
    assert storage.ids() == {"vol-e"}
    assert storage.mounted("vol-e")


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../escape"])
def test_a_volume_id_that_is_not_a_name_is_refused(storage: VolumeStorage, bad: str) -> None:
    with pytest.raises(ValueError, match="not a volume id"):
        storage.ensure(bad, MIN_MB)
    with pytest.raises(ValueError, match="not a volume id"):
        storage.remove(bad)
    assert not storage.root.exists() or list(storage.root.iterdir()) == []
