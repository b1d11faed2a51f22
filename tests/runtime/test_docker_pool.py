"""The docker pool's quotas: simple quotas on a new pool, a pool on full qgroups switched, limits from zero.

On a scratch btrfs image of its own (loop-mounted, removed afterwards), never the engine's pool.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import _docker_pool, _hostfs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mkfs.btrfs") is None,
    reason="a loop-mounted btrfs image needs root and btrfs-progs (the docker host set-up installs them)",
)


@pytest.fixture
def scratch() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="e2b-pool-test-", dir="/var/tmp"))
    image, mount_point = folder / "pool.img", folder / "mnt"
    with open(image, "wb") as handle:
        handle.truncate(1 << 30)
    _hostfs.run("mkfs.btrfs", "-q", "-f", str(image))
    mount_point.mkdir()
    _hostfs.run("mount", "-o", _docker_pool.MOUNT_OPTIONS, str(image), str(mount_point))
    try:
        yield mount_point
    finally:
        _hostfs.run("umount", str(mount_point))
        shutil.rmtree(folder)


def test_a_new_pool_counts_with_simple_quotas(scratch: Path) -> None:
    said: list[str] = []
    assert _docker_pool.quota_mode(scratch) == "disabled"
    _docker_pool.ensure_simple_quotas(scratch, said.append)
    assert _docker_pool.quota_mode(scratch) == "squota"
    assert said == [], "nothing to switch on a pool without quotas"
    _docker_pool.ensure_simple_quotas(scratch, said.append)  # idempotent
    assert _docker_pool.quota_mode(scratch) == "squota"


def test_a_pool_on_full_qgroups_is_switched_and_says_so(scratch: Path) -> None:
    said: list[str] = []
    _hostfs.run("btrfs", "quota", "enable", str(scratch))
    assert _docker_pool.quota_mode(scratch) == "qgroup"
    _docker_pool.ensure_simple_quotas(scratch, said.append)
    assert _docker_pool.quota_mode(scratch) == "squota"
    assert len(said) == 1
    assert "simple quotas" in said[0]


def test_a_snapshot_counts_its_own_writes_only_up_to_its_limit(scratch: Path) -> None:
    """What the docker backend relies on: a container's limit is the sandbox's disk, not disk plus image."""
    _docker_pool.ensure_simple_quotas(scratch, lambda line: None)
    _hostfs.run("btrfs", "subvolume", "create", str(scratch / "image"))
    (scratch / "image" / "layer").write_bytes(os.urandom(48 << 20))  # the image: more than the limit below
    _hostfs.run("btrfs", "subvolume", "snapshot", str(scratch / "image"), str(scratch / "container"))
    _hostfs.run("btrfs", "qgroup", "limit", "32M", str(scratch / "container"))
    filler = subprocess.run(
        ["dd", "if=/dev/zero", f"of={scratch / 'container' / 'big'}", "bs=1M", "count=64", "conv=fsync"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert filler.returncode != 0
    assert "Disk quota exceeded" in filler.stderr
    written = (scratch / "container" / "big").stat().st_size
    assert 16 << 20 < written <= 32 << 20, f"the snapshot wrote {written >> 20} MiB under a 32 MiB limit"
    _hostfs.run("btrfs", "filesystem", "sync", str(scratch))
    used, limit = _docker_pool.usage(_docker_pool.fs_uuid(scratch), _docker_pool.subvolume_id(scratch / "container"))
    assert limit == 32 << 20
    assert used <= 33 << 20, "the image's 48 MiB are not the container's"
