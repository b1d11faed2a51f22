"""Running the build's commands on the host and inside a rootfs, and removing what they leave.

Every failure becomes a ``TemplateError`` naming the command and ending with the tail
of its output, never a bare traceback. Removal is careful about mounts: debootstrap
mounts ``/proc`` inside its target and only unmounts it if it exits normally, and a tree
removed with a mount still inside it would be removed *through* that mount. So nothing
under a build folder is deleted while anything is mounted below it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["TemplateError", "disk_usage", "in_root", "mounts_below", "remove_tree", "replace_file", "run"]

_TAIL_LINES = 20

# Commands inside a rootfs see this environment and nothing of the host's (the host's
# PIP_* settings, for one, name files that do not exist in there).
CHROOT_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}

_OCTAL = re.compile(r"\\([0-7]{3})")


class TemplateError(Exception):
    """A template could not be built or read; the message says which command failed and why."""


def _ignore(_line: str) -> None:
    return None


def run(
    cmd: Sequence[str],
    what: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    detail: Callable[[str], None] = _ignore,
) -> str:
    """Run ``cmd``, passing each output line to ``detail``; return the output (stderr joined in)."""
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream, so the tail keeps the tool's order of events
            text=True,
            errors="replace",
            env=None if env is None else dict(env),
            cwd=cwd,
        )
    except OSError as exc:
        raise TemplateError(f"{what}: could not start {shlex.join(cmd)}: {exc}") from exc
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            lines.append(line)
            if line.strip():
                detail(line.strip())
        returncode = proc.wait()
    finally:
        # Interrupted while it runs: end the one process we started, and wait for it, so
        # that its own clean-up (debootstrap unmounts /proc on exit) happens before ours.
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if returncode != 0:
        tail = "\n".join(line for line in lines[-_TAIL_LINES:])
        raise TemplateError(f"{what} failed (exit {returncode}): {shlex.join(cmd)}\n{tail}")
    return "\n".join(lines)


def in_root(rootfs: Path, cmd: Sequence[str], what: str, *, detail: Callable[[str], None] = _ignore) -> str:
    """Run ``cmd`` with ``rootfs`` as its root directory and a clean environment.

    Nothing the build runs in there needs ``/proc`` (useradd, visudo, venv, pip install,
    the import check), so nothing is mounted: there is no mount to leak on failure.
    """
    return run(["chroot", str(rootfs), *cmd], what, env=CHROOT_ENV, detail=detail)


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as \ooo.
    return _OCTAL.sub(lambda m: chr(int(m[1], 8)), field)


def mounts_below(path: Path) -> list[Path]:
    """Mount points at or below ``path`` in this mount namespace, deepest first."""
    top = os.path.realpath(path)
    found: set[str] = set()
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as mountinfo:
        for line in mountinfo:
            fields = line.split(" ")
            if len(fields) > 4:
                point = _unescape(fields[4])
                if point == top or point.startswith(top.rstrip("/") + "/"):
                    found.add(point)
    return [Path(p) for p in sorted(found, key=lambda p: p.count("/"), reverse=True)]


def unmount_below(path: Path) -> None:
    """Unmount everything at or below ``path``; raise if something stays mounted."""
    for _ in range(8):  # stacked mounts on one point need one round each
        points = mounts_below(path)
        if not points:
            return
        for point in points:
            done = subprocess.run(["umount", str(point)], capture_output=True, check=False)
            if done.returncode != 0:
                # Busy (a process still has its cwd in there): detach it now, freed when idle.
                subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)
    left = mounts_below(path)
    if left:
        shown = ", ".join(str(p) for p in left)
        raise TemplateError(f"could not unmount {shown}; unmount it and remove {path} by hand")


def remove_tree(path: Path) -> None:
    """Remove ``path`` after unmounting whatever is mounted below it; never removes through a mount."""
    if not path.exists() and not path.is_symlink():
        return
    unmount_below(path)
    try:
        shutil.rmtree(path)  # does not follow symlinks (a rootfs is full of absolute ones)
    except OSError as exc:
        raise TemplateError(f"could not remove {path}: {exc}") from exc


def replace_file(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` as a new regular file, first removing what is there (a symlink is not followed)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)  # the umask must not decide it
    finally:
        os.close(fd)


def disk_usage(path: Path) -> dict[str, int]:
    """Entries, apparent bytes and allocated bytes under ``path``; hard links are counted once."""
    seen: set[tuple[int, int]] = set()
    entries = apparent = allocated = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            info = os.lstat(os.path.join(dirpath, name))
            entries += 1
            if info.st_nlink > 1:
                inode = (info.st_dev, info.st_ino)
                if inode in seen:
                    continue
                seen.add(inode)
            apparent += info.st_size
            allocated += info.st_blocks * 512
    return {"entries": entries, "bytes": apparent, "disk_bytes": allocated}
