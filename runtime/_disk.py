"""A sandbox's own disk: a sparse ext4 image, loop-mounted, holding the overlay's writable layer.

The kernel enforces the size: a write past it fails inside the sandbox with ENOSPC (the agent
answers an upload that meets it with 507), and nothing a sandbox writes lands on the host
filesystem beyond its image. The image is sparse and mounted with ``discard``, so it takes on
the host only what the sandbox holds now, never more than its size.

Why a loop image: the store's filesystem is whatever the operator has (ext4 here), so XFS
project quotas are not there to rely on; an ext4 image without a journal is made in about
15 ms and mounted in about 20 ms. ``mount -o loop`` takes a free loop device through the
kernel's loop-control (a device already bound makes the bind fail, and mount retries), so
parallel creates of one or several servers never share a device; it also sets the device to
detach itself on the last unmount.

Every function here is idempotent: ``ensure`` makes what is missing (never reformats an image
that exists: it holds the sandbox's files), ``release`` undoes what is there.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from . import _hostfs

DEFAULT_MB = 2048  # a sandbox's disk when neither the request nor the server names one
MIN_MB = 16  # ext4's own structures need a few MiB; below this a sandbox could not start
MOUNT_OPTIONS = "loop,nodev,nosuid,discard"


def make_image(image: Path, size_mb: int) -> None:
    """A new empty filesystem of ``size_mb`` MiB at ``image``, which appears only once complete."""
    if size_mb < MIN_MB:
        raise ValueError(f"a disk of {size_mb} MiB is too small (at least {MIN_MB} MiB)")
    building = image.with_name(image.name + ".new")
    with open(building, "wb") as handle:
        handle.truncate(size_mb << 20)  # sparse: blocks come as the sandbox writes
    # No journal (a sandbox's disk does not outlive a host crash's consistency needs more than
    # fsck would give), lazy inode tables (made on first use), no reserved blocks: the sandbox's
    # root is not the filesystem's root and could never use them.
    _hostfs.run(
        "mkfs.ext4",
        "-F",
        "-q",
        "-m",
        "0",
        "-b",
        "4096",
        "-O",
        "^has_journal",
        "-E",
        "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
        str(building),
    )
    os.replace(building, image)


def ensure(image: Path, mount_point: Path, size_mb: int) -> None:
    """The image exists (made if missing) and is mounted at ``mount_point``; safe to repeat."""
    if not image.exists():
        make_image(image, size_mb)
    mount_point.mkdir(parents=True, exist_ok=True)
    if not _hostfs.is_mount(str(mount_point)):
        _hostfs.run("mount", "-o", MOUNT_OPTIONS, str(image), str(mount_point))


def release(image: Path, mount_point: Path) -> None:
    """Unmount and detach every loop device still bound to ``image``; the image file stays."""
    _hostfs.unmount(str(mount_point))
    # A crash between binding a loop device and mounting it leaves the device bound: find it by file.
    if image.exists():
        bound = _hostfs.run("losetup", "-n", "-O", "NAME", "-j", str(image), check=False).stdout.split()
        for device in bound:
            _hostfs.run("losetup", "-d", device, check=False)
    with contextlib.suppress(FileNotFoundError):
        image.with_name(image.name + ".new").unlink()


def usage(mount_point: Path) -> tuple[int, int]:
    """(bytes used, bytes in all) of the mounted disk, as its filesystem counts them."""
    stat = os.statvfs(mount_point)
    total = stat.f_blocks * stat.f_frsize
    return total - stat.f_bfree * stat.f_frsize, total
