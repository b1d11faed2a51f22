"""Host-side file and command helpers of the OCI backends: the mount table, layer sizes, logs.

Everything here runs on the host, as the backend's own user (root). Commands that fail raise
``BackendError`` with the command's own error output; nothing here is specific to one OCI runtime.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

from .backend import BackendError

LOG_LIMIT = 4 << 20  # bytes kept per sandbox log
LOG_CHUNK = LOG_LIMIT // 4  # the writer rotates at this size; the log and its one old part stay below the limit

# The log writer (``log_writer``): reads the container's output from its stdin and appends it to
# $1 in parts of $2 bytes (head unbuffered: each read is written as it comes); before each part,
# a log at that size or more becomes $1.1, replacing the older one. So the current file stays
# below 2 parts, and the old one too. A failed write
# (the folder removed by a kill, a full host disk) never stalls or kills the sandbox: the rest
# is drained. It ends when every writer of the pipe is gone (the container and crun exited).
_LOG_WRITER = """
while :; do
  [ "$(wc -c 2>/dev/null <"$1" || echo 0)" -lt "$2" ] || mv -f "$1" "$1.1" || break
  stdbuf -o0 head -c "$2" >>"$1" || break
  [ "$(wc -c 2>/dev/null <"$1" || echo 0)" -ge "$2" ] || exit 0
done
exec cat >/dev/null
"""


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a host command; with ``check``, a non-zero exit is a ``BackendError`` quoting its stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise BackendError(f"{' '.join(args[:3])}… failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return proc


# The sandbox's root filesystem, as mounted on the host: no device nodes and no setuid (a setuid
# program a tenant planted in its layer runs as nobody special from the host side). The sandbox
# itself needs setuid (``sudo`` for the sandbox user, as E2B's templates have), and a host mount's
# nosuid would be locked into the sandbox's user namespace: so the runtime creates the container
# from a mount namespace of its own where this one mount is made setuid again
# (``SUID_ROOT_SCRIPT``); the host's mount table never holds a setuid view of a sandbox's files.
OVERLAY_OPTIONS = "nodev,nosuid"

# $1 is a mount of ours, in a mount namespace of the caller's own (``unshare --mount``): setuid
# again there only (a bind remount changes that one view; libmount keeps the options not named,
# so suid is named and nodev stays), then exec the rest.
SUID_ROOT_SCRIPT = 'mount -o remount,bind,suid,nodev -- "$1" && shift && exec "$@"'


def with_setuid_root(
    rootfs: Path,
    argv: list[str],
    *,
    propagation: str = "private",
    fd3: int | None = None,
    fixed_layout: bool = False,
) -> list[str]:
    """``argv`` run in a mount namespace of its own in which the nosuid mount at ``rootfs`` allows setuid.

    What ``argv`` makes there (a container's namespaces, cloned from this one) keeps that view;
    the host's view stays nosuid, and the namespace itself ends with ``argv``. ``slave``: mounts
    the host makes later under a shared mount still reach the namespace (Docker's volume views).
    ``fd3``: a pipe the caller passes on (``pass_fds``) that ``argv`` also gets as its 3, the
    first number a runtime's ``--preserve-fds`` hands on (which closes the others). Reopened
    through ``/proc``: dash redirects only descriptors 0 to 9. ``fixed_layout``: ``argv`` and
    what it starts run without address randomisation (``setarch -R``).
    """
    own = ["unshare", "--mount", "--propagation", propagation, "--"]
    if fixed_layout:
        own += ["setarch", platform.machine(), "--addr-no-randomize"]
    script = SUID_ROOT_SCRIPT
    if fd3 is not None and fd3 != 3:
        script = f"exec 3>/proc/self/fd/{int(fd3)} && {script}"
    return [*own, "sh", "-c", script, "sh", str(rootfs), *argv]


def ensure_nosuid(mount_point: str) -> None:
    """The host's view at ``mount_point`` is nosuid and nodev (one mounted by an earlier version may not be).

    A bind remount changes this one view: a container made from it holds views of its own.
    """
    if not {"nosuid", "nodev"} <= mount_options(mount_point):
        run("mount", "-o", "remount,bind,nosuid,nodev", mount_point)


def ensure_shared(folder: Path) -> None:
    """``folder`` is a shared mount (a bind of itself): what is mounted under it reaches its slaves."""
    folder.mkdir(mode=0o711, parents=True, exist_ok=True)
    if not is_mount(str(folder)):
        run("mount", "--bind", str(folder), str(folder))
    run("mount", "--make-shared", str(folder))


def mount_overlay(lowers: list[str], upper: Path, work: Path, target: Path) -> None:
    run(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"{OVERLAY_OPTIONS},lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}",
        str(target),
    )


def mount_sysfs(netns_path: str, target: Path) -> None:
    """A read-only sysfs at ``target`` whose network views (class/net, devices/*/net) are those of ``netns_path``.

    sysfs takes the network namespace of the process that mounts it; only the mount runs in it.
    """
    run(
        "nsenter",
        f"--net={netns_path}",
        "--",
        "mount",
        "-t",
        "sysfs",
        "-o",
        "ro,nosuid,nodev,noexec",
        "sysfs",
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


def mount_options(path: str) -> set[str]:
    """The options of the mount at ``path`` (the last one mounted there); empty when nothing is."""
    found: set[str] = set()
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 3 and fields[1].replace("\\040", " ") == path.rstrip("/"):
                found = set(fields[3].split(","))
    return found


def mounts_under(folder: Path) -> list[str]:
    prefix = str(folder).rstrip("/") + "/"
    return [point for point in mount_points() if point.startswith(prefix)]


def remove_tree(folder: Path) -> None:
    """``rm -rf`` that never reaches through a mount: what is mounted under ``folder`` is unmounted first.

    A sandbox's folder may hold a view of a volume shared with other sandboxes; deleting through
    it would delete the volume's files. A mount that stays (busy even lazily) stops the removal.
    """
    for point in sorted(mounts_under(folder), key=len, reverse=True):  # the deepest first
        unmount(point)
    still = mounts_under(folder)
    if still:
        raise OSError(f"{folder}: still mounted, not deleting: {', '.join(still)}")
    shutil.rmtree(folder, ignore_errors=True)


def check_traversable(folder: Path) -> None:
    """The sandbox's root is an unprivileged host uid: it must be able to walk to its bundle."""
    for part in [folder, *folder.parents]:
        if part.exists() and not part.stat().st_mode & 0o001:
            raise BackendError(
                f"{part} is not searchable by other users (mode {part.stat().st_mode & 0o777:o}); "
                "sandboxes run as an unprivileged uid and need to reach their bundles"
            )


def write_whole(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never a part.

    For every file read while it may be written again: records, registries, CRIU's option
    files and action script (another backend on the same state folder rewrites them), the
    files a sandbox reads in ``/run/e2b``. The temporary name carries the pid, so two processes
    writing at once each rename a whole file.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


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


def read_int(path: str) -> int:
    """The first number in a (cgroup) file; 0 when it is missing or says something else."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def tail(log: Path) -> str:
    data = read_log(log, 800)
    return data.decode(errors="replace") if data else "(no log)"


def read_log(log: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of a log the writer rotates: its old part (``<log>.1``) then the current one."""
    data = b""
    for part in (log.with_name(log.name + ".1"), log):
        with contextlib.suppress(FileNotFoundError), part.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - limit))
            data = (data + handle.read())[-limit:]
    return data


def _writer_lock(log: Path) -> Path:
    return log.with_name(f".{log.name}.writer")


def log_writer(log: Path, chunk: int = LOG_CHUNK) -> int:
    """Start the rotating writer of ``log`` (``_LOG_WRITER``); returns the pipe's write end, the caller's to close.

    The writer is a small shell loop of its own session, detached (``setsid -f``): sandboxes outlive
    the server, and so must the reader of their output, or a sandbox writing to it would fail. The
    pipe carries back-pressure, so however fast a sandbox prints, the host holds at most the limit.
    It holds a lock on a file next to the log while it runs (``wait_log_writer``).
    """
    read_end, write_end = os.pipe()
    lock = os.open(_writer_lock(log), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # Locked here, before the writer exists, and handed to it: the lock is the open file's, so
        # it is held from now until the writer's last process ends, with no gap for a waiter to miss.
        fcntl.flock(lock, fcntl.LOCK_EX)
        argv = ["setsid", "-f", "sh", "-c", _LOG_WRITER, "sh", str(log), str(chunk)]
        subprocess.run(
            argv,
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(lock,),
            cwd="/",
            check=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
        os.close(lock)
    return write_end


def wait_log_writer(log: Path, timeout: float) -> bool:
    """Wait until no writer of ``log`` runs any more (it wrote everything); False when ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    try:
        handle = _writer_lock(log).open("rb")
    except FileNotFoundError:
        return True
    with handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)


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
