"""Snapshot copies of a writable layer that share unchanged files with the sandbox's previous snapshot.

A snapshot is a full copy of ``upper/``; taken again and again, unchanged files would be stored
once per snapshot. ``copy_layer`` copies like ``cp -a`` (owners, modes, times, extended
attributes, so the overlay's whiteouts and opaque folders, hard links, holes of sparse files) but
hard-links a regular file from the previous snapshot when the source file has not changed
since: snapshot layers are read-only lowers, so two of them may share an inode. N snapshots of
a sandbox that changed little cost about one copy, not N.

"Unchanged" is decided without reading data: every copy writes ``files.json``, the source's
inode number, change time (ctime, which no process can set) and size per path. A file is shared
when all three are the same now and its ctime was well before the previous copy began: a write
changes ctime, but to a clock tick that may equal a ctime read just before, hence the margin.
The writable layer sits on the sandbox's own disk, so inode numbers stay the same across pauses.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

INDEX = "files.json"
_CTIME_MARGIN_NS = 2_000_000_000  # more than the kernel's coarse clock tick, with room for a slow copy start


def copy_layer(source: Path, target: Path, previous: Path | None = None) -> int:
    """Copy the tree ``source`` to ``target`` (which must not exist); returns the bytes shared, not copied.

    ``previous`` is an earlier ``copy_layer`` target of the same source; its index (``files.json``
    next to it) says which of its files may be shared. The new index is written next to ``target``.
    """
    started = time.time_ns()
    old = _load_index(previous)
    taken: int = old.get("taken_ns", 0)
    old_files: dict[str, list[int]] = old.get("files", {})
    files: dict[str, list[int]] = {}
    copied_inodes: dict[tuple[int, int], str] = {}  # hard links inside the source stay links
    shared = 0
    target.parent.mkdir(parents=True, exist_ok=True)
    stack: list[tuple[str, os.stat_result]] = [("", os.lstat(source))]
    dirs: list[tuple[str, os.stat_result]] = []
    while stack:
        rel, info = stack.pop()
        src, dst = os.path.join(source, rel), os.path.join(target, rel)
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(dst, 0o700)
            dirs.append((rel, info))
            with os.scandir(src) as entries:
                stack.extend((os.path.join(rel, e.name), e.stat(follow_symlinks=False)) for e in entries)
            continue
        if stat.S_ISREG(mode):
            key = (info.st_dev, info.st_ino)
            mine = [info.st_ino, info.st_ctime_ns, info.st_size]
            files[rel] = mine
            if info.st_nlink > 1 and key in copied_inodes:
                os.link(os.path.join(target, copied_inodes[key]), dst)
                continue
            copied_inodes[key] = rel
            if previous is not None and old_files.get(rel) == mine and info.st_ctime_ns < taken - _CTIME_MARGIN_NS:
                try:
                    os.link(os.path.join(previous, rel), dst)
                    shared += info.st_blocks * 512
                    continue
                except OSError:
                    pass  # gone or different there: copy it
            _copy_file(src, dst, info.st_size)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(src), dst)
        else:  # whiteouts (0:0 character devices), fifos, sockets, device nodes
            os.mknod(dst, mode, info.st_rdev)
        _copy_metadata(src, dst, info)
    for rel, info in reversed(dirs):  # children first: filling a folder changes its times
        _copy_metadata(os.path.join(source, rel), os.path.join(target, rel), info)
    index = {"taken_ns": started, "files": files}
    _index_path(target).write_text(json.dumps(index, separators=(",", ":")))
    return shared


def _index_path(layer: Path) -> Path:
    return layer.parent / INDEX


def _load_index(layer: Path | None) -> dict[str, Any]:
    if layer is None:
        return {}
    try:
        loaded = json.loads(_index_path(layer).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _copy_file(src: str, dst: str, size: int) -> None:
    """Copy a regular file's data, keeping holes: a sparse file must not become a dense one on the host."""
    source = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        target = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            offset = 0
            while offset < size:
                try:
                    data = os.lseek(source, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                end = os.lseek(source, data, os.SEEK_HOLE)
                _copy_range(source, target, data, end)
                offset = end
            os.ftruncate(target, size)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _copy_range(source: int, target: int, start: int, end: int) -> None:
    while start < end:
        try:
            sent = os.copy_file_range(source, target, end - start, start, start)
        except OSError as exc:  # another filesystem type, or a kernel without it: plain reads and writes
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            chunk = os.pread(source, min(end - start, 1 << 20), start)
            sent = os.pwrite(target, chunk, start) if chunk else 0
        if sent == 0:  # the file shrank under us (never while frozen): keep what there is
            return
        start += sent


def _copy_metadata(src: str, dst: str, info: os.stat_result) -> None:
    for name in os.listxattr(src, follow_symlinks=False):
        try:
            os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP):  # e.g. a user xattr on a symlink
                raise
    os.chown(dst, info.st_uid, info.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(info.st_mode):  # after chown, which clears set-id bits
        os.chmod(dst, stat.S_IMODE(info.st_mode))
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
