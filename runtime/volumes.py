"""Volumes' files on the host: one sparse ext4 image per volume, loop-mounted, shared by sandboxes.

Under the storage root (the server's ``<data>/volumes``)::

    <volume id>/volume.img   the volume's filesystem: a sparse ext4 image of its size (``runtime._disk``)
    <volume id>/fs/          its mount point: what the content API reads and writes, and what each
                             sandbox that mounts the volume gets a bind of (``SandboxSpec.volumes``)

Why an image per volume: the kernel enforces the size (a write past it fails with ENOSPC, in a
sandbox and through the content API alike) and nothing written to a volume lands on the
filesystem that holds the store. The image is sparse and mounted with ``discard``, so it takes
on the host what the volume holds.

Owners are the volume's own: a file the sandbox's ``user`` (uid 1000) writes is owned by host uid
1000 in the image, whatever host range the sandbox's ids map to. Each backend gives the sandbox a
view of ``fs/`` shifted into its own ids (an idmapped bind), so every sandbox sees the same owners.
The root of a new volume belongs to 1000:1000, the sandboxes' default user, mode 0755.

Mounted once for as long as the host runs: a second mount of one image (two loop devices, two
ext4 instances on one file) would corrupt it, and sandboxes keep binds of the mount across server
restarts. So ``ensure`` mounts only what is not mounted, and only ``remove`` and ``release``
(a deleted volume, a test's clean-up) unmount.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from . import _disk, _hostfs

__all__ = ["DEFAULT_MB", "MIN_MB", "ROOT_OWNER", "VolumeStorage"]

DEFAULT_MB = 1024  # a volume's size when the server names none
MIN_MB = _disk.MIN_MB
ROOT_OWNER = 1000  # uid and gid of a new volume's root: the sandboxes' default user
_IMAGE = "volume.img"
_FS = "fs"


class VolumeStorage:
    """The volumes under ``root``; every method is idempotent and blocks (call it from a thread)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mount_point(self, volume_id: str) -> Path:
        return self._home(volume_id) / _FS

    def ensure(self, volume_id: str, size_mb: int) -> Path:
        """The volume's filesystem exists (made if missing, never reformatted) and is mounted; its mount point."""
        home = self._home(volume_id)
        home.mkdir(parents=True, exist_ok=True)
        os.chmod(home, 0o700)  # only root walks in: sandboxes reach the files through their own binds
        image, mount_point = home / _IMAGE, home / _FS
        fresh = not image.exists()
        _disk.ensure(image, mount_point, size_mb)
        if fresh:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(mount_point / "lost+found")  # the sandboxes' volume starts empty
            os.chown(mount_point, ROOT_OWNER, ROOT_OWNER)
            os.chmod(mount_point, 0o755)  # noqa: S103 - the volume's root, as the sandboxes see it
        return mount_point

    def mounted(self, volume_id: str) -> bool:
        return _hostfs.is_mount(str(self.mount_point(volume_id)))

    def release(self, volume_id: str) -> None:
        """Unmount the volume (its files stay); the binds sandboxes hold keep their own view until they end."""
        home = self._home(volume_id)
        _disk.release(home / _IMAGE, home / _FS)

    def remove(self, volume_id: str) -> None:
        """The volume's files are gone: unmounted, then its folder removed."""
        self.release(volume_id)
        shutil.rmtree(self._home(volume_id), ignore_errors=True)

    def ids(self) -> set[str]:
        """The volumes that have files here (a folder with an image)."""
        if not self.root.is_dir():
            return set()
        return {entry.name for entry in self.root.iterdir() if (entry / _IMAGE).exists()}

    def release_all(self) -> None:
        for volume_id in sorted(self.ids()):
            self.release(volume_id)

    def usage(self, volume_id: str) -> tuple[int, int]:
        """(bytes used, bytes in all) of a mounted volume, as its filesystem counts them."""
        return _disk.usage(self.mount_point(volume_id))

    def _home(self, volume_id: str) -> Path:
        if not volume_id or "/" in volume_id or volume_id in (".", ".."):
            raise ValueError(f"not a volume id: {volume_id!r}")
        return self.root / volume_id
