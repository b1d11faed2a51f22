"""A volume's files as the content API acts on them: paths confined to the volume, owners as asked.

Every path is resolved by the kernel inside the volume (``openat2`` with ``RESOLVE_IN_ROOT``):
``..`` stops at the volume's root and a symbolic link, absolute or relative, is followed as if
the volume were the whole filesystem, in the same system call that opens the file, so a link
swapped in during a request (a sandbox mounts the same volume) can never lead outside it.
Magic links (``/proc/self/fd/*``) and other mounts are refused on the way. The last component is
acted on relative to its parent's descriptor without following it (stat, remove, chown), so what
the API removes or reports is the link itself, as ``lstat`` would.

Paths are the API's: absolute or relative to the volume's root (``/a/b`` and ``a/b`` are one),
cleaned lexically first (``a/./b/../c`` is ``a/c``). New files and folders belong to ``uid`` and
``gid`` as asked, by default 1000:1000 (the sandboxes' ``user``), mode 0644 and 0755 unless asked.
A write goes to an unnamed file in the target's folder that takes the name only once complete,
so a reader (or a second writer) sees the old content or the new, never a part, and a failed
upload leaves nothing. Everything here blocks: the content API calls it from worker threads.

Exceptions::

    VolumeFileError (status, message)   the content API's answer: 404 missing, 409 in the way,
                                        400 a bad path, 503 not mounted, 507 full
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ParamSpec, TypeVar

__all__ = [
    "DEFAULT_DIR_MODE",
    "DEFAULT_FILE_MODE",
    "DEFAULT_OWNER",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_PATH",
    "Entry",
    "Owner",
    "VolumeFileError",
    "VolumeFiles",
]

DEFAULT_OWNER = 1000  # uid and gid: the sandboxes' ``user``
DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755
MAX_PATH = 4096  # bytes, as PATH_MAX
MAX_DEPTH = 64  # of a listing
MAX_ENTRIES = 100_000  # in one listing's answer
READ_CHUNK = 1 << 20

# openat2(2): resolve flags and the syscall's number (the same on x86_64 and arm64).
_SYS_OPENAT2 = 437
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_RESOLVE = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
_libc = ctypes.CDLL(None, use_errno=True)
P = ParamSpec("P")
R = TypeVar("R")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class VolumeFileError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Owner:
    uid: int = DEFAULT_OWNER
    gid: int = DEFAULT_OWNER


@dataclass(frozen=True)
class Entry:
    """One ``VolumeEntryStat``."""

    name: str
    type: str  # file, directory, symlink, unknown
    path: str  # absolute within the volume
    size: int
    mode: int  # permission bits, with setuid, setgid and sticky
    uid: int
    gid: int
    atime: datetime
    mtime: datetime
    ctime: datetime
    target: str | None = None  # of a symbolic link, as written


def _keep(owner: int | None) -> int:
    return -1 if owner is None else owner  # chown's "leave it as it is"


def _type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "unknown"


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def clean(path: str) -> str:
    """The path relative to the volume's root, cleaned lexically ("" is the root); 400 when it cannot be one."""
    if not isinstance(path, str) or not path:
        raise VolumeFileError(400, "path is required")
    if "\x00" in path:
        raise VolumeFileError(400, "path must not contain NUL")
    try:
        size = len(os.fsencode(path))
    except UnicodeError:
        raise VolumeFileError(400, "path is not valid text") from None
    if size > MAX_PATH:
        raise VolumeFileError(400, f"path is longer than {MAX_PATH} bytes")
    return posixpath.normpath("/" + path).lstrip("/")


def _answered(operation: Callable[P, R]) -> Callable[P, R]:
    """An ``OSError`` met anywhere in ``operation`` becomes the API's answer for its errno."""

    @functools.wraps(operation)
    def answered(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return operation(*args, **kwargs)
        except OSError as exc:
            path = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            raise _refusal(exc, path) from None

    return answered


class VolumeFiles:
    """The files of one mounted volume at ``root`` (its mount point)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- reading ---------------------------------------------------------------------------

    @_answered
    def stat(self, path: str) -> Entry:
        relative = clean(path)
        with self._root() as root, self._parent(root, relative) as (parent, name):
            return self._entry(parent, name, relative)

    @_answered
    def list_dir(self, path: str, depth: int) -> list[Entry]:
        if not 1 <= depth <= MAX_DEPTH:
            raise VolumeFileError(400, f"depth must be between 1 and {MAX_DEPTH}")
        relative = clean(path)
        found: list[Entry] = []
        with self._root() as root:
            seen = self._open(root, relative, os.O_PATH)  # no open of a FIFO or a device just to look
            try:
                if not stat.S_ISDIR(os.fstat(seen).st_mode):
                    raise VolumeFileError(400, f"Path {path} is not a directory")
            finally:
                os.close(seen)
            fd = self._open(root, relative, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self._walk(fd, relative, depth, found)
            finally:
                os.close(fd)
        return found

    def _walk(self, fd: int, relative: str, depth: int, found: list[Entry]) -> None:
        with os.scandir(fd) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            child = posixpath.join(relative, name)
            try:
                entry = self._entry(fd, name, child)
            except VolumeFileError:  # removed while listed
                continue
            found.append(entry)
            if len(found) > MAX_ENTRIES:
                raise VolumeFileError(400, f"the listing holds more than {MAX_ENTRIES} entries: ask for less depth")
            if depth > 1 and entry.type == "directory":
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:  # replaced or removed meanwhile
                    continue
                try:
                    self._walk(sub, child, depth - 1, found)
                finally:
                    os.close(sub)

    @_answered
    def read(self, path: str) -> tuple[int, int]:
        """An open descriptor of the regular file at ``path`` and its size; the caller closes it."""
        relative = clean(path)
        with self._root() as root:
            # O_NONBLOCK: a FIFO planted at the path must not hang the request; cleared for a file.
            fd = self._open(root, relative, os.O_RDONLY | os.O_NONBLOCK)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise VolumeFileError(400, f"Path {path} is not a file")
            os.set_blocking(fd, True)
            return fd, info.st_size

    @staticmethod
    def chunks(fd: int) -> Iterator[bytes]:
        while chunk := os.read(fd, READ_CHUNK):
            yield chunk

    # -- writing ---------------------------------------------------------------------------

    @_answered
    def make_dir(self, path: str, owner: Owner, mode: int | None, *, parents: bool) -> Entry:
        relative = clean(path)
        if not relative:
            if parents:
                return self.stat("/")
            raise VolumeFileError(409, "Path / already exists")
        with self._root() as root:
            if parents:
                self._make_parents(root, posixpath.dirname(relative), owner)
            with self._parent(root, relative) as (parent, name):
                try:
                    os.mkdir(name, 0o700, dir_fd=parent)
                except FileExistsError:
                    existing = self._entry(parent, name, relative)
                    if parents and existing.type == "directory":
                        return existing
                    raise VolumeFileError(409, f"Path {path} already exists") from None
                except OSError as exc:
                    raise _refusal(exc, path) from None
                self._own(parent, name, owner, DEFAULT_DIR_MODE if mode is None else mode)
                return self._entry(parent, name, relative)

    @_answered
    def write(self, path: str, chunks: Iterator[bytes], owner: Owner, mode: int | None) -> Entry:
        """Write the file whole from ``chunks`` (its folders made as needed), replacing one that was there."""
        relative = clean(path)
        if not relative:
            raise VolumeFileError(409, "Path / is a directory")
        with self._root() as root:
            self._make_parents(root, posixpath.dirname(relative), owner)
            with self._parent(root, relative) as (parent, name):
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                        raise VolumeFileError(409, f"Path {path} is a directory")
                try:
                    fd = os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=parent)
                except OSError as exc:
                    raise _refusal(exc, path) from None
                try:
                    for chunk in chunks:
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view) :]
                    os.fchown(fd, owner.uid, owner.gid)
                    os.fchmod(fd, DEFAULT_FILE_MODE if mode is None else mode)  # after chown, which clears setuid
                    self._publish(fd, parent, name)
                except OSError as exc:
                    raise _refusal(exc, path) from None
                finally:
                    os.close(fd)
                return self._entry(parent, name, relative)

    def _publish(self, fd: int, parent: int, name: str) -> None:
        """The unnamed file takes ``name``: linked under a fresh name, then renamed over the old file."""
        for _ in range(8):
            temporary = f".e2b-upload-{os.urandom(6).hex()}"
            try:
                os.link(f"/proc/self/fd/{fd}", temporary, dst_dir_fd=parent, follow_symlinks=True)
                break
            except FileExistsError:
                continue
        else:
            raise OSError(errno.EEXIST, "no free temporary name")
        try:
            os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=parent)
            raise

    @_answered
    def remove(self, path: str) -> None:
        relative = clean(path)
        if not relative:
            raise VolumeFileError(400, "the volume's root cannot be removed")
        with self._root() as root, self._parent(root, relative) as (parent, name):
            try:
                mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    shutil.rmtree(name, dir_fd=parent)  # never follows a link: removes what is inside the volume
                else:
                    os.unlink(name, dir_fd=parent)
            except OSError as exc:
                raise _refusal(exc, path) from None

    @_answered
    def update(self, path: str, uid: int | None, gid: int | None, mode: int | None) -> Entry:
        relative = clean(path)
        with self._root() as root, self._parent(root, relative) as (parent, name):
            try:
                if name:
                    if uid is not None or gid is not None:
                        os.chown(name, _keep(uid), _keep(gid), dir_fd=parent, follow_symlinks=False)
                    if mode is not None:  # through a descriptor: a link swapped in is refused, never followed
                        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
                        try:
                            os.fchmod(fd, mode)
                        finally:
                            os.close(fd)
                else:  # the volume's root: ``parent`` is the root itself, opened for its path only
                    fd = os.open(f"/proc/self/fd/{parent}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    try:
                        if uid is not None or gid is not None:
                            os.fchown(fd, _keep(uid), _keep(gid))
                        if mode is not None:
                            os.fchmod(fd, mode)
                    finally:
                        os.close(fd)
            except NotImplementedError:
                raise VolumeFileError(400, f"Path {path} is a symbolic link: its mode cannot be changed") from None
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.ELOOP):
                    raise VolumeFileError(400, f"Path {path} is a symbolic link: its mode cannot be changed") from None
                raise _refusal(exc, path) from None
            return self._entry(parent, name, relative)

    # -- the pieces ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        """The volume's root, checked to be its own mount (never the host folder under it)."""
        try:
            fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise VolumeFileError(503, "the volume is not available") from None
        try:
            if os.fstat(fd).st_dev == os.stat(self.root.parent).st_dev:
                raise VolumeFileError(503, "the volume is not available")
            yield fd
        finally:
            os.close(fd)

    def _open(self, root: int, relative: str, flags: int) -> int:
        how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE)
        fd: int = _libc.syscall(_SYS_OPENAT2, root, os.fsencode(relative or "."), ctypes.byref(how), ctypes.sizeof(how))
        if fd < 0:
            err = ctypes.get_errno()
            raise _refusal(OSError(err, os.strerror(err)), "/" + relative)
        return fd

    @contextlib.contextmanager
    def _parent(self, root: int, relative: str) -> Iterator[tuple[int, str]]:
        """The folder holding ``relative``'s last component, opened inside the volume, and that name ("": the root)."""
        head, name = posixpath.split(relative)
        fd = self._open(root, head, os.O_PATH | os.O_DIRECTORY)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def _make_parents(self, root: int, relative: str, owner: Owner) -> None:
        """Every folder of ``relative`` exists (the missing ones made with ``owner``, mode 0755)."""
        fd = os.dup(root)
        try:
            for name in [part for part in relative.split("/") if part]:
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                    self._own(fd, name, owner, DEFAULT_DIR_MODE)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise _refusal(exc, "/" + relative) from None
                try:  # a link on the way is followed inside the volume, as any path is
                    sub = self._open(fd, name, os.O_PATH | os.O_DIRECTORY)
                except VolumeFileError:
                    raise VolumeFileError(409, f"Path /{relative} is in the way: not a directory") from None
                os.close(fd)
                fd = sub
        finally:
            os.close(fd)

    @staticmethod
    def _own(parent: int, name: str, owner: Owner, mode: int) -> None:
        os.chown(name, owner.uid, owner.gid, dir_fd=parent, follow_symlinks=False)
        os.chmod(name, mode, dir_fd=parent, follow_symlinks=False)

    @staticmethod
    def _entry(parent: int, name: str, relative: str) -> Entry:
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False) if name else os.fstat(parent)
            target = os.readlink(name, dir_fd=parent) if name and stat.S_ISLNK(info.st_mode) else None
        except OSError as exc:
            raise _refusal(exc, "/" + relative) from None
        return Entry(
            name=name or "/",
            type=_type(info.st_mode),
            path="/" + relative,
            size=info.st_size,
            mode=stat.S_IMODE(info.st_mode),
            uid=info.st_uid,
            gid=info.st_gid,
            atime=_time(info.st_atime),
            mtime=_time(info.st_mtime),
            ctime=_time(info.st_ctime),
            target=target,
        )


# errno → (status, what it means); anything else is a 500 whose detail goes to the log only.
_REFUSALS: dict[int, tuple[int, str]] = {
    errno.ENOENT: (404, "Path {path} not found"),
    errno.ENOTDIR: (404, "Path {path} not found: a component is not a directory"),
    errno.EEXIST: (409, "Path {path} already exists"),
    errno.ENOTEMPTY: (409, "Path {path} is not empty"),
    errno.EISDIR: (409, "Path {path} is a directory"),
    errno.ENAMETOOLONG: (400, "Path {path}: a name is too long"),
    errno.ELOOP: (400, "Path {path}: too many symbolic links"),
    errno.EXDEV: (400, "Path {path} leads out of the volume"),
    errno.ENOSPC: (507, "not enough space left in the volume"),
    errno.EDQUOT: (507, "not enough space left in the volume"),
    errno.EINVAL: (400, "Path {path} is not valid here"),
}


def _refusal(exc: OSError, path: str) -> VolumeFileError:
    status, message = _REFUSALS.get(exc.errno or 0, (500, "the volume operation failed"))
    if status == 500:
        raise exc
    return VolumeFileError(status, message.format(path=path))
