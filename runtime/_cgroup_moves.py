"""Cheap moves into cgroups: the host's cgroup2 mount with ``favordynmods``.

Every sandbox start moves the sandbox's first process into its cgroups (crun writes
``cgroup.procs`` in each hierarchy), and every restore of a checkpoint moves processes twice
(crun's move of its helper, then CRIU's of the restored tree). Without ``favordynmods`` each such
move takes the write side of a kernel-wide reader/writer semaphore that forks and exits read,
and the first move after a quiet spell waits for an RCU grace period: measured on this kind of
host, 7 ms p50 on an idle machine and 20-23 ms during a restore (strace: one ``close`` of
``cgroup.procs``; CRIU's log: a 19.5 ms gap at its first move), against 0.26 ms with it
(docs/BENCHMARKS.md, "Cgroup moves without a grace period"). The kernel's cgroup-v2 documentation
gives the price: forks and exits get a little more expensive.

The option is a cgroup2 mount parameter, and it acts kernel-wide (every hierarchy, v1 included),
so the one cgroup2 mount of a hybrid set-up (``/sys/fs/cgroup/unified``) or of a v2-only host
(``/sys/fs/cgroup``) is remounted with it. A cgroup2 remount replaces the superblock's flags with
the ones it is given, so the mount's current options go with it (a systemd host's ``nsdelegate``,
``memory_recursiveprot``), unchanged. On kernels with per-thread-group locking (6.18 here) the
switch is one-way until the next boot; a later remount without it clears the flag only.

Sans-IO core (``parse_cgroup2_mounts``, ``remount_argv``); ``favor_cgroup_moves`` reads the host's
files and runs ``mount``. A host where this cannot be done still runs sandboxes, only slower to
start and restore: nothing here raises.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FEATURES",
    "MOUNTINFO",
    "OPTION",
    "Cgroup2Mount",
    "favor_cgroup_moves",
    "parse_cgroup2_mounts",
    "remount_argv",
]

OPTION = "favordynmods"
MOUNTINFO = Path("/proc/self/mountinfo")
FEATURES = Path("/sys/kernel/cgroup/features")  # the cgroup2 mount options this kernel knows
# The superblock's own read-only flag is the mount's: given once, with the mount's options.
_NOT_FS_OPTIONS = frozenset({"rw", "ro"})


@dataclass(frozen=True)
class Cgroup2Mount:
    point: str
    mount_options: tuple[str, ...]  # the mount's (nosuid, relatime, ...), as mountinfo lists them
    super_options: tuple[str, ...]  # the superblock's (rw, nsdelegate, favordynmods, ...)

    @property
    def favors_moves(self) -> bool:
        return OPTION in self.super_options


def _unescape(field: str) -> str:
    # mountinfo writes a space, tab, newline and backslash in a path as octal escapes.
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def parse_cgroup2_mounts(mountinfo: str) -> list[Cgroup2Mount]:
    """The cgroup2 mounts in a ``/proc/<pid>/mountinfo`` text, in its order.

    A line: id, parent, major:minor, root, mount point, mount options, optional fields, ``-``,
    filesystem type, source, superblock options (proc(5)).
    """
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 6 or len(fields) < dash + 4 or fields[dash + 1] != "cgroup2":
            continue
        found.append(
            Cgroup2Mount(
                point=_unescape(fields[4]),
                mount_options=tuple(fields[5].split(",")),
                super_options=tuple(fields[dash + 3].split(",")),
            )
        )
    return found


def remount_argv(mount: Cgroup2Mount) -> list[str]:
    """``mount`` remounting ``mount`` with ``favordynmods``, every option it has kept as it is."""
    kept = [*mount.mount_options, *(o for o in mount.super_options if o not in _NOT_FS_OPTIONS)]
    options = [option for i, option in enumerate(kept) if option not in kept[:i]]
    return ["mount", "-o", ",".join(["remount", *options, OPTION]), mount.point]


def _run(argv: Sequence[str]) -> str | None:
    """None when ``argv`` succeeded, else why not."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit status {done.returncode}")


def favor_cgroup_moves(
    say: Callable[[str], None],
    *,
    mountinfo: Path = MOUNTINFO,
    features: Path = FEATURES,
    run: Callable[[Sequence[str]], str | None] = _run,
) -> bool:
    """Turn ``favordynmods`` on where it is off and the kernel has it, saying so; whether it is on after."""
    try:
        mounts = parse_cgroup2_mounts(mountinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        say(f"cgroup moves stay slow: cannot read {mountinfo}: {exc}")
        return False
    if any(mount.favors_moves for mount in mounts):
        return True  # kernel-wide already
    try:
        known = features.read_text(encoding="ascii", errors="replace").split()
    except OSError:
        known = []
    if OPTION not in known:
        say(f"cgroup moves stay slow: this kernel has no cgroup2 '{OPTION}' option")
        return False
    if not mounts:
        say(f"cgroup moves stay slow: no cgroup2 mount to give '{OPTION}' (a cgroup v1 remount cannot)")
        return False
    target = mounts[0]
    say(
        f"remounting {target.point} with '{OPTION}': a process moves into a sandbox's cgroups without "
        "waiting for an RCU grace period (faster starts and restores; forks and exits cost a little more)"
    )
    failure = run(remount_argv(target))
    if failure is not None:
        say(f"cgroup moves stay slow: the remount failed: {failure}")
        return False
    with contextlib.suppress(OSError):
        if any(m.favors_moves for m in parse_cgroup2_mounts(mountinfo.read_text(encoding="utf-8", errors="replace"))):
            return True
    say(f"cgroup moves stay slow: {target.point} does not show '{OPTION}' after the remount")
    return False
