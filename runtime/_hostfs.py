"""Host-side file and command helpers of the OCI backends: the mount table, layer sizes and copies, logs.

Everything here runs on the host, as the backend's own user (root). Commands that fail raise
``BackendError`` with the command's own error output; nothing here is specific to one OCI runtime.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from .backend import BackendError

LOG_LIMIT = 4 << 20  # bytes kept per sandbox log


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a host command; with ``check``, a non-zero exit is a ``BackendError`` quoting its stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise BackendError(f"{' '.join(args[:3])}… failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return proc


def mount_overlay(lowers: list[str], upper: Path, work: Path, target: Path) -> None:
    run(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}",
        str(target),
    )


def unmount(mount_point: str) -> None:
    """Unmount if mounted; lazily when a plain unmount leaves it in place (something still uses it)."""
    # The mount table, not os.path.ismount: a bind from the same filesystem has the same st_dev.
    if is_mount(mount_point):
        run("umount", mount_point, check=False)
        if is_mount(mount_point):
            run("umount", "-l", mount_point)


def mount_points() -> list[str]:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return [line.split()[1].replace("\\040", " ") for line in mounts if len(line.split()) > 1]


def is_mount(path: str) -> bool:
    return path.rstrip("/") in mount_points()


def mounts_under(folder: Path) -> list[str]:
    prefix = str(folder).rstrip("/") + "/"
    return [point for point in mount_points() if point.startswith(prefix)]


def check_traversable(folder: Path) -> None:
    """The sandbox's root is an unprivileged host uid: it must be able to walk to its bundle."""
    for part in [folder, *folder.parents]:
        if part.exists() and not part.stat().st_mode & 0o001:
            raise BackendError(
                f"{part} is not searchable by other users (mode {part.stat().st_mode & 0o777:o}); "
                "sandboxes run as an unprivileged uid and need to reach their bundles"
            )


def tree_bytes(root: Path) -> int:
    """Bytes allocated under ``root`` (as du counts them), without following symlinks."""
    total = 0
    stack = [str(root)]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total


def copy_tree(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # cp -a keeps owners, modes, xattrs and overlay whiteouts (0:0 character devices).
    run("cp", "-a", "--reflink=auto", str(source), str(target))


def read_int(path: str) -> int:
    """The first number in a (cgroup) file; 0 when it is missing or says something else."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def tail(log: Path) -> str:
    try:
        return log.read_bytes()[-800:].decode(errors="replace")
    except OSError:
        return "(no log)"


def trim(log: Path) -> None:
    """Keep the log bounded: writers append (O_APPEND), so truncating under them is safe."""
    try:
        size = log.stat().st_size
    except FileNotFoundError:
        return
    if size > LOG_LIMIT:
        with log.open("r+b") as handle:
            handle.seek(size - LOG_LIMIT // 2)
            kept = handle.read()
            handle.seek(0)
            handle.write(kept)
            handle.truncate()
