"""The docker backend's disk pool and remapped ids: a btrfs image for the data root, one id range for root.

**Disk.** Our dockerd keeps its data root on a btrfs filesystem of its own, a sparse image file
loop-mounted by the engine's preparation (``ensure_pool``; re-mounted after a host restart)::

    /var/lib/e2b-compat/docker-pool.img   the pool: sparse, so it takes on the host what it holds
    /var/lib/e2b-compat/docker-pool/      its mount point (``loop,nodev,nosuid,discard=async``)
    /var/lib/e2b-compat/docker-pool/data/ the daemon's data root (``--storage-driver=btrfs``)

So the host filesystem never holds more of the daemon's data than the pool's size, whatever the
sandboxes write; the pool's size is fixed when it is made: ``$E2B_COMPAT_DOCKER_POOL_GB`` (a
larger value later grows it), by default half the host's free space, at most 64 GiB and at least
4 GiB. ``discard=async`` gives deleted blocks back to the host. The pool counts with btrfs
*simple* quotas (``ensure_simple_quotas``, Linux 6.7 or later): an extent counts for the
subvolume that wrote it, so a container's subvolume, a snapshot of its image's layer, starts
at zero and counts only the sandbox's own writes. Each container gets a qgroup limit on it:
Docker's ``size`` storage option (kept by Docker and applied again at each start), set to the
sandbox's disk size, so ``disk_mb`` is the room for the sandbox's own writes, as crun's
writable layer. A write past it fails inside with **EDQUOT** ("Disk quota
exceeded", where an ext4 disk says "No space left on device"); the agent answers an upload that
meets either with 507. ``df`` inside shows the pool, not the sandbox's limit. The limits are not
reserved room: sandboxes whose limits add up past the pool share what is left, and a full pool
is ENOSPC for all of them (never for the host).

The host's mount of the pool is ``nosuid`` too, so a setuid program a sandbox planted in its
subvolume runs with its caller's ids from the host side. The daemon runs in a mount namespace of
its own (``runtime._docker_engine``) where the pool is remounted ``suid,nodev``: a container's
root is a bind of its subvolume and inherits that view, so ``sudo`` works inside. The data root
below the mount is 0710, root and the remapped root's group only, besides.

**Ids.** The daemon remaps every container's ids (``--userns-remap``, daemon-wide in Docker
20.10) onto one range of 65536 host ids, leased once from the host-wide ``runtime._idranges``
registry and written as the one ``/etc/subuid`` and ``/etc/subgid`` entry of the system user
``e2b-compat-docker`` (``usermod``; Docker reads the range from there). Being a subid entry,
``_idranges`` avoids it for crun's per-sandbox ranges from then on, after a host restart too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from . import _hostfs
from ._idranges import RANGE_SIZE, SUBID_FILES, IdRangeRegistry
from .backend import BackendError
from .host import HostNotReadyError

__all__ = [
    "DEFAULT_POOL_GB",
    "MIN_POOL_GB",
    "POOL_SIZE_VARIABLE",
    "REMAP_USER",
    "Usage",
    "ensure_pool",
    "ensure_remap_range",
    "ensure_simple_quotas",
    "pool_bytes",
    "quota_mode",
    "remap_entries",
    "subvolume_id",
    "usage",
]

POOL_SIZE_VARIABLE = "E2B_COMPAT_DOCKER_POOL_GB"
DEFAULT_POOL_GB = 64
MIN_POOL_GB = 4
MOUNT_OPTIONS = "loop,nodev,nosuid,discard=async"
REMAP_USER = "e2b-compat-docker"
_GIB = 1 << 30

Usage = tuple[int, int]  # (referenced bytes, limit in bytes) of one subvolume's qgroup


def pool_bytes(folder: Path, environ: Mapping[str, str] = os.environ) -> int:
    """The pool's size: the operator's setting, else half the free space of ``folder``'s filesystem, bounded."""
    setting = environ.get(POOL_SIZE_VARIABLE, "").strip()
    if setting:
        try:
            size = int(setting)
        except ValueError:
            raise HostNotReadyError(f"{POOL_SIZE_VARIABLE}={setting!r} is not a whole number of GiB") from None
        if size < MIN_POOL_GB:
            raise HostNotReadyError(f"{POOL_SIZE_VARIABLE}={size}: the pool needs at least {MIN_POOL_GB} GiB")
        return size * _GIB
    free = shutil.disk_usage(folder).free
    size = min(DEFAULT_POOL_GB * _GIB, free // 2 // _GIB * _GIB)
    if size < MIN_POOL_GB * _GIB:
        raise HostNotReadyError(
            f"{folder} has {free / _GIB:.1f} GiB free: too little for the docker pool's default "
            f"(half of it, at least {MIN_POOL_GB} GiB); set {POOL_SIZE_VARIABLE} to the pool's size in GiB"
        )
    return size


def ensure_pool(image: Path, mount_point: Path, say: Callable[[str], None]) -> None:
    """The pool image exists (made when missing, grown to a larger setting) and is mounted; idempotent."""
    image.parent.mkdir(parents=True, exist_ok=True)
    if not image.exists():
        size = pool_bytes(image.parent)
        say(f"making the docker pool: a sparse btrfs image of {size // _GIB} GiB at {image}")
        building = image.with_name(image.name + ".new")
        with open(building, "wb") as handle:
            handle.truncate(size)
        _hostfs.run("mkfs.btrfs", "-q", "-f", str(building))
        os.replace(building, image)
    mount_point.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _hostfs.is_mount(str(mount_point)):
        say(f"mounting the docker pool {image} on {mount_point}")
        _hostfs.run("mount", "-o", MOUNT_OPTIONS, str(image), str(mount_point))
    else:
        _hostfs.ensure_nosuid(str(mount_point))  # mounted before the pool was nosuid
    wanted = pool_bytes(image.parent) if os.environ.get(POOL_SIZE_VARIABLE, "").strip() else 0
    if wanted > image.stat().st_size:
        say(f"growing the docker pool to {wanted // _GIB} GiB")
        os.truncate(image, wanted)
        device = _hostfs.run("findmnt", "-n", "-o", "SOURCE", str(mount_point)).stdout.strip()
        _hostfs.run("losetup", "-c", device)
        _hostfs.run("btrfs", "filesystem", "resize", "max", str(mount_point))
    ensure_simple_quotas(mount_point, say)


# BTRFS_IOC_QUOTA_CTL is _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args { u64 cmd; u64 status; });
# command 4 turns on simple quotas (Linux 6.7): btrfs-progs before 6.7 has no option for it.
_IOC_QUOTA_CTL = 0xC0109428
_QUOTA_CTL_ENABLE_SIMPLE = 4


def quota_mode(mount_point: Path) -> str:
    """``squota``, ``qgroup`` (full accounting) or ``disabled``, as the kernel reports the pool's quotas."""
    folder = Path(f"/sys/fs/btrfs/{fs_uuid(mount_point)}/qgroups")
    if not folder.is_dir():
        return "disabled"
    try:
        return (folder / "mode").read_text().strip()
    except FileNotFoundError:  # a kernel before simple quotas: only full accounting
        return "qgroup"


def ensure_simple_quotas(mount_point: Path, say: Callable[[str], None]) -> None:
    """The pool counts with simple quotas; a pool on full qgroups is switched (Docker sets limits again).

    Full accounting made the pool slower with every sandbox: dropping a removed container's
    subvolume walks its shared extents, and with a few hundred removals behind it a burst of
    32 creates waited past the clients' 60 s request timeout (all of them; measured here).
    Simple quotas count an extent for the subvolume that wrote it, so a container counts only
    its own writes from zero, and a drop costs what it frees. Docker sees quotas on and keeps
    setting its limits; the limits of existing containers come back at their next start.
    """
    mode = quota_mode(mount_point)
    if mode == "squota":
        return
    if mode != "disabled":
        say(f"switching the docker pool {mount_point} from full qgroups to simple quotas")
        _hostfs.run("btrfs", "quota", "disable", str(mount_point))
    fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, _IOC_QUOTA_CTL, struct.pack("QQ", _QUOTA_CTL_ENABLE_SIMPLE, 0))
    except OSError as exc:
        raise HostNotReadyError(
            f"the docker pool needs btrfs simple quotas (Linux 6.7 or later), and enabling them failed: {exc}"
        ) from exc
    finally:
        os.close(fd)


def fs_uuid(folder: Path) -> str:
    """The uuid of the btrfs filesystem holding ``folder`` (its folder under ``/sys/fs/btrfs``)."""
    # ``btrfs filesystem show`` takes a mount point: the daemon's root is one only in its namespace.
    mount_point = _hostfs.run("findmnt", "-n", "-o", "TARGET", "--target", str(folder)).stdout.strip()
    out = _hostfs.run("btrfs", "filesystem", "show", mount_point).stdout
    for word in out.split():
        if word.count("-") == 4 and len(word) == 36:
            return word
    raise BackendError(f"no btrfs filesystem uuid found for {mount_point}: {out.strip()[:200]}")


def remap_entries(user: str = REMAP_USER, files: Iterable[Path] = SUBID_FILES) -> list[tuple[int, int] | None]:
    """Per subid file, the user's one ``(start, count)`` entry, or None when it has none."""
    found: list[tuple[int, int] | None] = []
    for path in files:
        entries = []
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[0] == user and parts[1].isdigit() and parts[2].isdigit():
                    entries.append((int(parts[1]), int(parts[2])))
        if len(entries) > 1:
            raise HostNotReadyError(f"{path} has {len(entries)} entries for {user}; keep one (or none)")
        found.append(entries[0] if entries else None)
    return found


def ensure_remap_range(say: Callable[[str], None], registry: IdRangeRegistry | None = None) -> int:
    """The remap user and its one subuid/subgid entry of ``RANGE_SIZE`` ids (made when missing): its start."""
    try:
        pwd.getpwnam(REMAP_USER)
    except KeyError:
        say(f"adding the system user {REMAP_USER} (its subordinate ids are the docker sandboxes' ids)")
        _hostfs.run(
            "useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
            "--shell", "/usr/sbin/nologin", REMAP_USER,
        )  # fmt: skip
    uid_entry, gid_entry = remap_entries()
    for entry in (uid_entry, gid_entry):
        if entry is not None and entry[1] != RANGE_SIZE:
            raise HostNotReadyError(f"{REMAP_USER}'s subid entry {entry} is not {RANGE_SIZE} ids; remove it")
    if uid_entry is not None and gid_entry is not None:
        if uid_entry != gid_entry:
            raise HostNotReadyError(f"{REMAP_USER}'s subuid {uid_entry} and subgid {gid_entry} differ; remove both")
        return uid_entry[0]
    if uid_entry is not None or gid_entry is not None:  # a set-up cut short between the two files
        start = (uid_entry or gid_entry or (0, 0))[0]
    else:
        # Leased first, so no crun sandbox gets it before the entry is written; the entry keeps it after.
        start = (registry or IdRangeRegistry()).allocate(f"docker-engine:{REMAP_USER}", "userns-remap")
    span = f"{start}-{start + RANGE_SIZE - 1}"
    say(f"giving {REMAP_USER} the subordinate ids {span} (the docker sandboxes' root is {start} on the host)")
    argv = ["usermod"]
    argv += ["--add-subuids", span] if uid_entry is None else []
    argv += ["--add-subgids", span] if gid_entry is None else []
    _hostfs.run(*argv, REMAP_USER)
    return start


def subvolume_id(path: Path) -> int:
    """The btrfs subvolume id of the subvolume at ``path`` (its level-0 qgroup is ``0/<id>``)."""
    return int(_hostfs.run("btrfs", "inspect-internal", "rootid", str(path)).stdout.strip())


def usage(uuid: str, subvolume: int) -> Usage:
    """Referenced bytes and the limit of a subvolume's qgroup, as the kernel counts them (at each commit)."""
    folder = Path(f"/sys/fs/btrfs/{uuid}/qgroups/0_{subvolume}")
    return _hostfs.read_int(str(folder / "referenced")), _hostfs.read_int(str(folder / "max_referenced"))
