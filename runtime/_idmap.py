"""Idmapped mounts: template files owned by root appear owned by an unprivileged host uid.

Sandboxes run in a user namespace whose root is host uid ``base``, the first id of a range of
the sandbox's own (``_idranges``), so a process that escapes its namespaces is nobody on the
host and owns nothing of another sandbox. The template's files belong
to host root, though, and would look like ``nobody`` inside. An idmapped bind mount of the
template (kernel ≥ 5.12, ext4/xfs/btrfs/tmpfs) shifts what the overlay sees by ``base``
without touching the template: one template serves every sandbox, and the writable layer
is created by the sandbox's root, i.e. owned by host uid ``base``. Snapshot layers are
shifted back to 0-based owners when taken (``unshift_owners``) and then idmapped the same way,
so a sandbox made from a snapshot of another sees the same owners in its own range.

util-linux in Debian 12 predates ``X-mount.idmap``, so the three system calls are made here
(``open_tree``, ``mount_setattr``, ``move_mount``; the same numbers on every architecture).
The mapping is carried by a user namespace: a short-lived ``unshare --user`` child gets
its maps written by us, and a descriptor of its namespace outlives it.
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOUNT_ATTR_RDONLY = 0x00000001
_MOUNT_ATTR_NOSUID = 0x00000002
_MOUNT_ATTR_NODEV = 0x00000004
_MOUNT_ATTR_IDMAP = 0x00100000
_MOVE_MOUNT_F_EMPTY_PATH = 0x00000004

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


DEFAULT_MAPPING: Mapping


class IdmapError(OSError):
    """An idmapped mount could not be made (old kernel, filesystem without support, not root)."""


@dataclass(frozen=True)
class Mapping:
    base: int = 100_000
    size: int = 65_536

    def oci(self) -> list[dict[str, int]]:
        return [{"containerID": 0, "hostID": self.base, "size": self.size}]


DEFAULT_MAPPING = Mapping()
# The one range every sandbox shared before each got its own (runtime._idranges); kept for old records.
LEGACY_BASE = 100_000


def userns_fd(mapping: Mapping) -> int:
    """A descriptor of a user namespace mapping 0..size to base..base+size."""
    child = subprocess.Popen(["unshare", "--user", "sleep", "30"])  # ended below, by pid
    try:
        ns_path = f"/proc/{child.pid}/ns/user"
        deadline = time.monotonic() + 5
        while os.readlink(ns_path) == os.readlink("/proc/self/ns/user"):
            if time.monotonic() > deadline:
                raise IdmapError(0, "the helper process did not enter a new user namespace")
            time.sleep(0.005)
        line = f"0 {mapping.base} {mapping.size}\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child.pid}/{name}", "w", encoding="ascii") as handle:
                handle.write(line)
        return os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        child.kill()
        child.wait()


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise IdmapError(err, f"{what}: {os.strerror(err)}")
    return result


def idmapped_bind(source: str, target: str, ns_fd: int, *, read_only: bool = True) -> None:
    """Bind ``source`` at ``target`` with the ownership shift of the namespace ``ns_fd``.

    Read-only unless asked: a template's layers must never be written through this view. A
    writable view (a volume's, shared with other sandboxes) is also nosuid and nodev: what one
    sandbox writes there never runs setuid, nor opens a device, in another.
    """
    tree = _check(
        _libc.syscall(
            _SYS_OPEN_TREE, _AT_FDCWD, source.encode(), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
        ),
        f"open_tree {source}",
    )
    try:
        flags = _MOUNT_ATTR_RDONLY if read_only else _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | flags, 0, 0, ns_fd)
        _check(
            _libc.syscall(
                _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
            ),
            f"mount_setattr idmap {source}",
        )
        _check(
            _libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
            f"move_mount {target}",
        )
    finally:
        os.close(tree)


def unshift_owners(root: Path, mapping: Mapping) -> None:
    """Owners in ``mapping``'s host range become 0-based again, in place, under ``root`` (a copied layer).

    A snapshot layer stored this way is idmapped into each sandbox made from it, like a template;
    ids outside the range (the overlay's whiteouts, owned by host root) stay as they are. chown
    clears setuid and setgid bits, so the mode is put back afterwards. File capabilities
    (``security.capability``) do not survive the chown either: a snapshot does not keep them.
    """
    span = range(mapping.base, mapping.base + mapping.size)
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            paths = [entry.path for entry in entries]
        for path in [folder, *paths] if folder == str(root) else paths:
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and path != folder:
                stack.append(path)
            uid = info.st_uid - mapping.base if info.st_uid in span else info.st_uid
            gid = info.st_gid - mapping.base if info.st_gid in span else info.st_gid
            if (uid, gid) == (info.st_uid, info.st_gid):
                continue
            os.chown(path, uid, gid, follow_symlinks=False)
            if not stat.S_ISLNK(info.st_mode):
                os.chmod(path, stat.S_IMODE(info.st_mode))
