"""Sandbox disks (runtime._disk), snapshot copies that share files (runtime._sharing), the log writer (runtime._hostfs).

The disk tests need root and loop devices (CI runs as root), not crun; real sandboxes filling
their disk, printing without end and being snapshotted are test_crun.py's.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import _disk, _hostfs, _sharing

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts, device nodes and owners need root")


@pytest.fixture
def folder() -> Iterator[Path]:
    # Not a tmpfs: sparse files and copy_file_range behave as on the store's filesystem.
    path = Path(tempfile.mkdtemp(prefix="e2b-compat-disk-", dir="/var/tmp"))
    yield path
    for point in _hostfs.mounts_under(path):
        _hostfs.unmount(point)
    shutil.rmtree(path)


def _bound(image: Path) -> list[str]:
    found = subprocess.run(
        ["losetup", "-n", "-O", "NAME", "-j", str(image)], capture_output=True, text=True, check=False
    )
    return found.stdout.split()


def _fill(path: Path) -> int:
    """Write zeros until the disk refuses; the errno of the refusal."""
    block = b"\0" * (1 << 20)
    with path.open("wb") as handle:
        try:
            while True:
                handle.write(block)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            return exc.errno or 0


# -- disks -----------------------------------------------------------------------------------


@needs_root
def test_a_disk_is_sparse_its_size_and_full_is_enospc(folder: Path) -> None:
    image, mount_point = folder / "disk.img", folder / "disk"
    _disk.ensure(image, mount_point, 32)
    assert image.stat().st_size == 32 << 20
    assert image.stat().st_blocks * 512 < 4 << 20, "sparse: a new disk takes almost nothing on the host"
    used, total = _disk.usage(mount_point)
    assert 28 << 20 < total <= 32 << 20  # ext4's own structures take the rest
    assert used < 1 << 20
    assert _fill(mount_point / "big") == errno.ENOSPC
    assert image.stat().st_blocks * 512 <= (32 << 20) + (1 << 20), "the host holds no more than the size"
    assert _disk.usage(mount_point)[0] > 28 << 20
    (mount_point / "big").unlink()  # discard: freed blocks go back to the host
    subprocess.run(["fstrim", str(mount_point)], check=False, capture_output=True)
    _disk.release(image, mount_point)
    assert not _hostfs.is_mount(str(mount_point))
    assert _bound(image) == [], "the loop device detached with the unmount"


@needs_root
def test_ensure_is_idempotent_and_keeps_the_files_across_a_remount(folder: Path) -> None:
    image, mount_point = folder / "disk.img", folder / "disk"
    _disk.ensure(image, mount_point, 16)
    (mount_point / "kept").write_text("still here")
    _disk.ensure(image, mount_point, 16)  # already mounted: nothing happens
    assert _hostfs.mount_points().count(str(mount_point)) == 1
    _disk.release(image, mount_point)  # a host reboot: mounts gone, the image stays
    _disk.release(image, mount_point)  # and releasing twice is fine
    _disk.ensure(image, mount_point, 16)  # re-mounted, never reformatted
    assert (mount_point / "kept").read_text() == "still here"
    _disk.release(image, mount_point)


@needs_root
def test_parallel_disks_get_distinct_loop_devices(folder: Path) -> None:
    pairs = [(folder / f"d{i}.img", folder / f"d{i}") for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda pair: _disk.ensure(pair[0], pair[1], 16), pairs))
    sources = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        device, point = line.split()[:2]
        if point.startswith(str(folder) + "/"):
            sources[point] = device
    assert len(sources) == 16
    assert len(set(sources.values())) == 16, f"two disks share a loop device: {sources}"
    for image, mount_point in pairs:
        _disk.release(image, mount_point)
    assert all(_bound(image) == [] for image, _ in pairs)


@needs_root
def test_a_loop_device_bound_but_never_mounted_is_released(folder: Path) -> None:
    image = folder / "disk.img"
    _disk.make_image(image, 16)
    # What a crash between binding the device and mounting it leaves behind.
    subprocess.run(["losetup", "-f", str(image)], check=True)
    assert len(_bound(image)) == 1
    _disk.release(image, folder / "disk")
    assert _bound(image) == []


def test_a_disk_below_the_minimum_is_refused(folder: Path) -> None:
    with pytest.raises(ValueError, match="too small"):
        _disk.make_image(folder / "disk.img", 4)
    assert not (folder / "disk.img").exists()


# -- snapshot copies ----------------------------------------------------------------------------


def _layer(root: Path) -> Path:
    upper = root / "upper"
    (upper / "etc").mkdir(parents=True)
    (upper / "etc" / "config").write_text("one")
    (upper / "home").mkdir()
    (upper / "home" / "big").write_bytes(os.urandom(1 << 20))
    os.link(upper / "home" / "big", upper / "home" / "big-link")
    (upper / "home" / "link").symlink_to("big")
    with (upper / "home" / "sparse").open("wb") as handle:
        handle.truncate(1 << 30)
    os.mknod(upper / "etc" / "deleted", 0o020000, os.makedev(0, 0))  # an overlay whiteout
    os.setxattr(upper / "home", "trusted.overlay.opaque", b"y")
    os.chown(upper / "home" / "big", 100_000, 100_001)
    os.chmod(upper / "etc" / "config", 0o640)
    return upper


@needs_root
def test_a_copy_keeps_what_the_overlay_needs(folder: Path) -> None:
    upper = _layer(folder / "source")
    target = folder / "snap" / "upper"
    _sharing.copy_layer(upper, target)
    assert (target / "etc" / "config").read_text() == "one"
    assert (target / "etc" / "config").stat().st_mode & 0o777 == 0o640
    assert (target / "home" / "big").read_bytes() == (upper / "home" / "big").read_bytes()
    assert (target / "home" / "big").stat().st_uid == 100_000
    assert (target / "home" / "big").stat().st_gid == 100_001
    assert (target / "home" / "big").stat().st_ino == (target / "home" / "big-link").stat().st_ino
    assert os.readlink(target / "home" / "link") == "big"
    whiteout = (target / "etc" / "deleted").lstat()
    assert (whiteout.st_mode & 0o170000, whiteout.st_rdev) == (0o020000, os.makedev(0, 0))
    assert os.getxattr(target / "home", "trusted.overlay.opaque") == b"y"
    sparse = (target / "home" / "sparse").stat()
    assert sparse.st_size == 1 << 30
    assert sparse.st_blocks == 0, "a sparse file stays sparse: the host never holds its holes"
    assert (target / "home").stat().st_mtime_ns == (upper / "home").stat().st_mtime_ns


@needs_root
def test_a_second_copy_shares_unchanged_files_and_copies_changed_ones(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sharing, "_CTIME_MARGIN_NS", 0)  # the files here were written just now
    upper = _layer(folder / "source")
    time.sleep(0.05)
    first, second = folder / "s1" / "upper", folder / "s2" / "upper"
    _sharing.copy_layer(upper, first)
    (upper / "etc" / "config").write_text("two")
    shared = _sharing.copy_layer(upper, second, previous=first)
    assert (second / "home" / "big").stat().st_ino == (first / "home" / "big").stat().st_ino
    assert shared >= 1 << 20
    assert (second / "etc" / "config").read_text() == "two"
    assert (first / "etc" / "config").read_text() == "one", "the earlier snapshot is unchanged"
    assert (second / "etc" / "config").stat().st_ino != (first / "etc" / "config").stat().st_ino


@needs_root
def test_a_file_changed_right_after_a_copy_is_never_shared(folder: Path) -> None:
    upper = folder / "source" / "upper"
    upper.mkdir(parents=True)
    (upper / "f").write_text("aaaa")
    first, second = folder / "s1" / "upper", folder / "s2" / "upper"
    _sharing.copy_layer(upper, first)
    (upper / "f").write_text("bbbb")  # same size, maybe the same clock tick: ctime alone could not tell
    _sharing.copy_layer(upper, second, previous=first)
    assert (second / "f").read_text() == "bbbb"


# -- the log writer -----------------------------------------------------------------------------


def test_the_log_stays_bounded_while_written_and_keeps_the_latest_lines(folder: Path) -> None:
    log = folder / "logs" / "sandbox.log"
    log.parent.mkdir()
    out = _hostfs.log_writer(log)
    biggest = 0
    line = b"y" * 90 + b"\n"
    try:
        for _ in range(50):  # 50 MB, the size checked after every MB
            os.write(out, line * 11_650)
            biggest = max(biggest, sum(p.stat().st_size for p in log.parent.iterdir()))
        os.write(out, b"the last line\n")
        deadline = time.monotonic() + 10
        while not _hostfs.read_log(log, 100).endswith(b"the last line\n") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _hostfs.read_log(log, 200).endswith(line + b"the last line\n")
        assert not _hostfs.wait_log_writer(log, 0.05), "the writer runs while the pipe is open"
    finally:
        os.close(out)
    assert _hostfs.wait_log_writer(log, 10), "the writer ends when the pipe's last writer closes it"
    assert biggest < _hostfs.LOG_LIMIT
    assert len(_hostfs.read_log(log, 1 << 30)) < _hostfs.LOG_LIMIT


def test_a_log_whose_folder_is_gone_never_blocks_the_sandbox(folder: Path) -> None:
    log = folder / "logs" / "sandbox.log"
    log.parent.mkdir()
    out = _hostfs.log_writer(log, chunk=1 << 16)
    shutil.rmtree(log.parent)  # a kill removed the folder while the sandbox still printed
    try:
        os.write(out, b"z" * (8 << 20))  # blocks for good if nobody read the pipe any more
    finally:
        os.close(out)
    assert not log.parent.exists()
