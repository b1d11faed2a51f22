"""Idmapped mounts: template files owned by root appear owned by an unprivileged host uid.

Sandboxes run in a user namespace whose root is host uid ``base`` (100000 by default), so
a process that escapes its namespaces is nobody on the host. The template's files belong
to host root, though, and would look like ``nobody`` inside. An idmapped bind mount of the
template (kernel ≥ 5.12, ext4/xfs/btrfs/tmpfs) shifts what the overlay sees by ``base``
without touching the template: one template serves every sandbox, and the writable layer
is created by the sandbox's root, i.e. owned by host uid ``base``.

util-linux in Debian 12 predates ``X-mount.idmap``, so the three system calls are made here
(``open_tree``, ``mount_setattr``, ``move_mount``; the same numbers on every architecture).
The mapping is carried by a user namespace: a short-lived ``unshare --user`` child gets
its maps written by us, and a descriptor of its namespace outlives it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from dataclasses import dataclass

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOUNT_ATTR_RDONLY = 0x00000001
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


def idmapped_bind(source: str, target: str, ns_fd: int) -> None:
    """Bind ``source`` at ``target`` with the ownership shift of the namespace ``ns_fd``."""
    tree = _check(
        _libc.syscall(
            _SYS_OPEN_TREE, _AT_FDCWD, source.encode(), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
        ),
        f"open_tree {source}",
    )
    try:
        # Read-only as well: nothing may ever write to a template through this view.
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, ns_fd)
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
