"""Host preparation for the crun backend: what must be true before a sandbox can start.

On this kind of machine the cgroup set-up is hybrid: v1 controllers, plus a cgroup2
mount that holds only ``hugetlb``. crun refuses hybrid set-ups with controllers on the v2
side ("cgroups in hybrid mode not supported"); mounting a v1 ``hugetlb`` hierarchy moves
that controller over and crun starts. The fix changes host state, so it is applied only
when asked (the serve and test set-up ask), and it is said out loud.

Kernel limits charged to host root: inotify instances and watches made in a sandbox are counted
up the user-namespace tree against the uid that created its namespace, host root, for every
sandbox alike. Each sandbox's namespace gets a bound of its own (``_oci.INOTIFY_INSTANCES`` and
``_oci.INOTIFY_WATCHES``); ``prepare`` raises the host's per-user limits, when lower, so that
``HOST_SANDBOXES`` sandboxes at their bound still leave root (and other sandboxes) room.

Moves into cgroups (every start and restore makes some) are made cheap with the cgroup2 mount's
``favordynmods`` where the kernel has it (``_cgroup_moves``): without it, the first move after a
quiet spell waits for an RCU grace period, 7-23 ms here.

Memory committed to sandboxes is counted for the whole host (``MemoryLedger``): several servers
on one host share one budget, each publishing what it committed under the host-wide lock that
the address and id-range registries use; a server that ended (its pid gone, or another process
under that pid) no longer counts.

``runtime.backends`` names ``prepare`` as the crun backend's host set-up. Exceptions::

    HostNotReadyError   (a runtime.backend.BackendError) what is missing and how to fix it
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from ._addresses import DEFAULT_REGISTRY
from ._cgroup_moves import favor_cgroup_moves
from ._hostregistry import LockedState
from ._oci import INOTIFY_INSTANCES, INOTIFY_WATCHES
from .backend import BackendError

__all__ = [
    "CGROUP_ROOT",
    "KSM_ROOT",
    "HostNotReadyError",
    "MemoryLedger",
    "ksm_counters",
    "ksmd_cpu_seconds",
    "prepare",
    "problems",
    "process_start_time",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
SYSCTL_ROOT = Path("/proc/sys")
HOST_SANDBOXES = 1024  # sandboxes the limits below leave room for, each at its bound (max_sandboxes: 1000)
_HOST_HEADROOM = 1024  # inotify instances left for the host's own services


def host_limits() -> dict[str, int]:
    """The least each host-wide per-user kernel limit must be (sysctl path under /proc/sys → value)."""
    return {
        "fs/inotify/max_user_instances": HOST_SANDBOXES * INOTIFY_INSTANCES + _HOST_HEADROOM,
        "fs/inotify/max_user_watches": HOST_SANDBOXES * INOTIFY_WATCHES + _HOST_HEADROOM * 64,
    }


def raise_limits(say: Callable[[str], None] = print, root: Path = SYSCTL_ROOT) -> None:
    """Raise the host's per-user kernel limits to ``host_limits()`` where they are lower; never lower one."""
    for name, least in host_limits().items():
        path = root / name
        try:
            current = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError) as exc:
            raise HostNotReadyError(f"cannot read {path}: {exc}") from exc
        if current < least:
            say(f"raising {name.replace('/', '.')} from {current} to {least} (room for {HOST_SANDBOXES} sandboxes)")
            try:
                path.write_text(f"{least}\n")
            except OSError as exc:
                raise HostNotReadyError(f"could not raise {path} to {least}: {exc}; set it by hand") from exc


class HostNotReadyError(BackendError):
    """The host cannot run crun sandboxes; the message says what is missing and how to fix it."""


# Debian package → the command (or file) that shows it is installed.
_PACKAGES = {
    "crun": "crun",
    "nftables": "nft",
    "debootstrap": "debootstrap",
    "iproute2": "ip",
    "e2fsprogs": "/usr/sbin/mkfs.ext4",  # sandbox disks (runtime._disk); not on a non-root PATH
    "skopeo": "skopeo",  # from_image template builds: registry pulls (runtime.templates._images)
    "umoci": "umoci",  # … and unpacking the pulled layers
    "debian-archive-keyring": "/usr/share/keyrings/debian-archive-keyring.gpg",
}


def _present(tool: str) -> bool:
    return Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None


def _hugetlb_on_v2_side(root: Path) -> bool:
    controllers = root / "unified" / "cgroup.controllers"
    try:
        return "hugetlb" in controllers.read_text().split()
    except OSError:
        return False


def problems(root: Path = CGROUP_ROOT) -> list[str]:
    found = []
    found += [
        f"{tool} is not installed (Debian package '{package}')"
        for package, tool in _PACKAGES.items()
        if not _present(tool)
    ]
    if (root / "memory").is_dir() and _hugetlb_on_v2_side(root):
        found.append("hugetlb is attached to the cgroup2 mount of a hybrid set-up, which crun refuses")
    if os.geteuid() != 0:
        found.append("the crun backend needs root (namespaces, overlay mounts, cgroups)")
    return found


def prepare(say: Callable[[str], None] = print, root: Path = CGROUP_ROOT) -> None:
    """Install crun, apply the hugetlb fix when needed, make cgroup moves cheap; raise if anything is still missing."""
    if os.geteuid() != 0:
        raise HostNotReadyError("the crun backend needs root (namespaces, overlay mounts, cgroups)")
    missing = [package for package, tool in _PACKAGES.items() if not _present(tool)]
    if missing:
        say(f"installing {', '.join(missing)} (Debian packages) …")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _step(["apt-get", "update", "-qq"], env, f"install {', '.join(missing)} by hand")
        _step(["apt-get", "install", "-y", "-qq", *missing], env, f"install {', '.join(missing)} by hand")
    if (root / "memory").is_dir() and _hugetlb_on_v2_side(root):
        say(f"mounting a cgroup v1 hugetlb hierarchy at {root / 'hugetlb'} so crun accepts the hybrid cgroup set-up")
        try:
            (root / "hugetlb").mkdir(exist_ok=True)
        except OSError as exc:
            raise HostNotReadyError(f"could not make {root / 'hugetlb'}: {exc}") from exc
        _step(["mount", "-t", "cgroup", "-o", "hugetlb", "cgroup", str(root / "hugetlb")], None, "mount it by hand")
    favor_cgroup_moves(say)  # a speed-up only: a host without it runs sandboxes all the same
    raise_limits(say)
    left = problems(root)
    if left:
        raise HostNotReadyError("; ".join(left))


def _step(argv: list[str], env: dict[str, str] | None, fix: str) -> None:
    """Run one set-up command (its output goes to the terminal); a failure says what failed and how to go on."""
    try:
        subprocess.run(argv, check=True, env=env)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise HostNotReadyError(f"{' '.join(argv[:2])} failed ({exc}); {fix}") from exc


def process_start_time(pid: int) -> int | None:
    """The process's start in clock ticks since boot (``/proc/<pid>/stat`` field 22); None when it is gone.

    With the pid it names one process for good: a pid reused after a crash has another start.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])  # the command name may hold spaces and parentheses


class MemoryLedger:
    """What every server on the host has committed to its sandboxes, in MiB.

    ``committing(server)`` takes the host-wide lock and yields what the *other* live servers
    committed, and a function to publish this server's new total; a server checks its budget and
    publishes within that one block, so two servers admitting at once cannot both take the
    last room.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self._state = LockedState(folder or DEFAULT_REGISTRY, "memory", _damaged, "servers")

    @contextlib.contextmanager
    def committing(self, server: str) -> Iterator[tuple[int, Callable[[int], None]]]:
        with self._state.locked() as state:
            servers: dict[str, dict[str, int]] = state["servers"]
            for key in [k for k, entry in servers.items() if not _alive(entry)]:
                del servers[key]  # a server that ended commits nothing
            elsewhere = sum(entry["mb"] for key, entry in servers.items() if key != server)

            def publish(committed_mb: int) -> None:
                me = os.getpid()
                servers[server] = {"mb": committed_mb, "pid": me, "started": process_start_time(me) or 0}

            yield elsewhere, publish


def _alive(entry: dict[str, int]) -> bool:
    return process_start_time(int(entry.get("pid", 0))) == entry.get("started")


def _damaged(message: str) -> BackendError:
    return BackendError(message)


KSM_ROOT = Path("/sys/kernel/mm/ksm")


def ksm_counters(root: Path = KSM_ROOT) -> dict[str, int]:
    """The same-page merging counters (``pages_shared``, ``pages_sharing``, ``full_scans``); empty without KSM."""
    counters = {}
    for name in ("pages_shared", "pages_sharing", "full_scans"):
        with contextlib.suppress(OSError, ValueError):
            counters[name] = int((root / name).read_text())
    return counters


def ksmd_cpu_seconds(proc: Path = Path("/proc")) -> float | None:
    """CPU time the kernel's ksmd thread has used, seconds; None when there is none."""
    for entry in proc.glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (entry / "comm").read_text().strip() == "ksmd":
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return None
