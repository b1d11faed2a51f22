"""Filesystem operations behind ``filesystem.Filesystem`` (docs/PROTOCOL-NOTES.md, envd filesystem).

Every function here is blocking and is meant to run through ``_credentials.as_user`` so the
kernel checks permissions as the requesting user. They return protobuf ``EntryInfo``
messages because that is the only shape the callers need.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator

from google.protobuf.timestamp_pb2 import Timestamp

from contract.generated.filesystem import filesystem_pb2 as pb

from ._errors import AgentError, ErrorKind
from ._limits import MAX_LIST_ENTRIES
from ._paths import ensure_parents
from ._users import UserDatabase

METADATA_PREFIX = "user.e2b."

# Go's FileMode letters, in the order envd prints them, for the bits Linux has.
_SPECIAL: tuple[tuple[str, Callable[[int], bool]], ...] = (
    ("d", stat.S_ISDIR),
    ("L", stat.S_ISLNK),
    ("D", lambda m: stat.S_ISBLK(m) or stat.S_ISCHR(m)),
    ("p", stat.S_ISFIFO),
    ("S", stat.S_ISSOCK),
    ("u", lambda m: bool(m & stat.S_ISUID)),
    ("g", lambda m: bool(m & stat.S_ISGID)),
    ("c", stat.S_ISCHR),
    ("t", lambda m: bool(m & stat.S_ISVTX)),
)


class FsError(AgentError):
    """Filesystem work the kernel or envd's rules refused; ``kind`` is the wire code."""


def wire_text(name: str) -> str:
    """A file name as a protobuf string: bytes that are not UTF-8 become U+FFFD.

    Linux names are bytes; protobuf strings must be UTF-8. The agent reports such names
    lossily rather than failing the whole listing or watch.
    """
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def permissions(mode: int) -> str:
    prefix = "".join(letter for letter, test in _SPECIAL if test(mode)) or "-"
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return prefix + bits


def read_metadata(path: str) -> dict[str, str]:
    """The ``user.e2b.*`` extended attributes (through symlinks), without the prefix."""
    out: dict[str, str] = {}
    try:
        names = os.listxattr(path)
    except OSError:
        return out
    for name in names:
        if not name.startswith(METADATA_PREFIX):
            continue
        try:
            value = os.getxattr(path, name).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out[name[len(METADATA_PREFIX) :]] = value
    return out


def entry_info(path: str, users: UserDatabase, listed_path: str | None = None) -> pb.EntryInfo:
    """EntryInfo from ``lstat(path)``; a symlink has ``is_symlink`` and its fully resolved target's type and mode."""
    info = os.lstat(path)
    entry = pb.EntryInfo(
        name=wire_text(os.path.basename(path.rstrip("/")) or "/"),
        path=wire_text(listed_path if listed_path is not None else path),
        size=info.st_size,
        permissions=permissions(info.st_mode),
        owner=wire_text(users.user_name(info.st_uid)),
        group=wire_text(users.group_name(info.st_gid)),
    )
    if info.st_mtime_ns:
        stamp = Timestamp()
        stamp.FromNanoseconds(info.st_mtime_ns)
        entry.modified_time.CopyFrom(stamp)
    target_mode: int | None = info.st_mode
    if stat.S_ISLNK(info.st_mode):
        # The link itself is marked (newer clients show it as a symlink); ``type`` is its target's.
        entry.is_symlink = True
        try:
            resolved = os.path.realpath(path, strict=True)
            target_mode = os.stat(resolved).st_mode
            entry.symlink_target = wire_text(resolved)
        except (OSError, RuntimeError):
            entry.symlink_target = wire_text(path)  # dangling or looping: type UNSPECIFIED, mode 0
            target_mode = None
    if target_mode is not None:
        if stat.S_ISREG(target_mode):
            entry.type = pb.FILE_TYPE_FILE
        elif stat.S_ISDIR(target_mode):
            entry.type = pb.FILE_TYPE_DIRECTORY
        entry.mode = target_mode & 0o777
    for key, value in read_metadata(path).items():
        entry.metadata[key] = value
    return entry


def stat_entry(path: str, users: UserDatabase) -> pb.EntryInfo:
    try:
        return entry_info(path, users)
    except FileNotFoundError:
        raise FsError(ErrorKind.NOT_FOUND, f"file not found: lstat {path}: no such file or directory") from None
    except OSError as exc:
        raise FsError(ErrorKind.INTERNAL, f"error getting file info: {exc}") from None


def list_dir(requested: str, resolved: str, depth: int, users: UserDatabase) -> list[pb.EntryInfo]:
    """Depth-first pre-order, entries sorted by name bytes; symlinks listed, never descended.

    The walk keeps its own stack, so any depth the request names and any tree depth are fine;
    an answer of more than ``MAX_LIST_ENTRIES`` entries is ``resource_exhausted``.
    """
    depth = max(depth, 1)
    try:
        root = os.path.realpath(resolved, strict=True) if os.path.islink(resolved) else resolved
        if not os.path.isdir(root):
            if not os.path.lexists(root):
                raise FsError(ErrorKind.NOT_FOUND, f"directory not found: {resolved}")
            raise FsError(ErrorKind.INVALID_ARGUMENT, f"path is not a directory: {resolved}")
    except RuntimeError:
        raise FsError(ErrorKind.FAILED_PRECONDITION, f"cyclic symlink or chain >255 links at {resolved}") from None
    except FileNotFoundError:
        raise FsError(ErrorKind.NOT_FOUND, f"directory not found: {resolved}") from None
    out: list[pb.EntryInfo] = []

    def names_of(real_dir: str, shown_dir: str) -> Iterator[str]:
        try:
            return iter(sorted(os.listdir(real_dir), key=os.fsencode))
        except OSError as exc:
            raise FsError(ErrorKind.INTERNAL, f"error reading directory {shown_dir}: {exc}") from None

    # (names left, real dir, shown dir, level of its entries)
    stack: list[tuple[Iterator[str], str, str, int]] = [(names_of(root, requested), root, requested, 1)]
    while stack:
        names, real_dir, shown_dir, level = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            continue
        real = os.path.join(real_dir, name)
        shown = os.path.join(shown_dir, name)
        try:
            entry = entry_info(real, users, listed_path=shown)
            is_dir = stat.S_ISDIR(os.lstat(real).st_mode)
        except FileNotFoundError:
            continue  # vanished during the walk
        if len(out) >= MAX_LIST_ENTRIES:
            raise FsError(
                ErrorKind.RESOURCE_EXHAUSTED,
                f"directory {requested} has more than {MAX_LIST_ENTRIES} entries within depth {depth}: "
                "list it with a smaller depth",
            )
        out.append(entry)
        if is_dir:
            children = names_of(real, shown)  # the last level's contents are read (errors count)
            if level < depth:  # but not reported
                stack.append((children, real, shown, level + 1))
    return out


def make_dir(path: str, users: UserDatabase) -> pb.EntryInfo:
    try:
        existing = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # a file on the way: ensure_parents names it
        existing = None
    if existing is not None:
        if stat.S_ISDIR(existing.st_mode):
            raise FsError(ErrorKind.ALREADY_EXISTS, f"directory already exists: {path}")
        raise FsError(ErrorKind.INVALID_ARGUMENT, f"path already exists but it is not a directory: {path}")
    try:
        ensure_parents(path)
        os.mkdir(path, 0o755)
    except FileExistsError:
        raise FsError(ErrorKind.ALREADY_EXISTS, f"directory already exists: {path}") from None
    except NotADirectoryError as exc:
        raise FsError(ErrorKind.INTERNAL, str(exc)) from None
    except OSError as exc:
        raise FsError(ErrorKind.INTERNAL, f"error creating directory: {exc}") from None
    return entry_info(path, users)


def move(source: str, destination: str, users: UserDatabase) -> pb.EntryInfo:
    if not os.path.lexists(source):
        raise FsError(ErrorKind.NOT_FOUND, f"source file not found: {source}")
    try:
        ensure_parents(destination)
        os.rename(source, destination)
    except FileNotFoundError:
        raise FsError(ErrorKind.NOT_FOUND, f"source file not found: {source}") from None
    except OSError as exc:
        raise FsError(ErrorKind.INTERNAL, f"error renaming: {exc}") from None
    return entry_info(destination, users)


def remove(path: str) -> None:
    """``rm -rf``: recursive, does not follow symlinks, a missing path is fine."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise FsError(ErrorKind.INTERNAL, f"error removing file or directory: {exc}") from None


def check_watchable(path: str, allow_network_mounts: bool) -> None:
    """WatchDir/CreateWatcher validation: a directory, and not a network mount unless allowed."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FsError(ErrorKind.NOT_FOUND, f"path {path} not found") from None
    except OSError as exc:
        raise FsError(ErrorKind.INTERNAL, f"error statting path {path}: {exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise FsError(ErrorKind.INVALID_ARGUMENT, f"path {path} not a directory")
    if not allow_network_mounts and _on_network_mount(path):
        raise FsError(
            ErrorKind.INVALID_ARGUMENT, f"path {path} is on a network mount; set allow_network_mounts to watch it"
        )


_NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb", "smb2", "smb3"})


def _on_network_mount(path: str) -> bool:
    # statfs magic is not exposed by Python; the mount table gives the same answer.
    best, fstype = "", ""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3:
                    point = fields[1].replace("\\040", " ")
                    if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                        best, fstype = point, fields[2]
    except OSError:
        return False
    return fstype in _NETWORK_FS or fstype.startswith("fuse")


def is_enospc(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)
