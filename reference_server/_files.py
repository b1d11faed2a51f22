"""Replacing a file atomically, with its mode (and owner) set before any byte is written.

Certificates, keys, the client environment and /etc/nsswitch.conf are all written this way: the
content goes to a new name made with O_CREAT|O_EXCL|O_NOFOLLOW at 0600 (nobody else can open it
even for a moment, and a planted file or symlink is never written through), its owner and mode
are set, it is synced and renamed over the target, and the folder is synced so the rename
survives a crash. A reader sees the old file or the complete new one, never a part.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["replace_file"]


def replace_file(path: Path, data: bytes, *, mode: int, owner: tuple[int, int] | None = None) -> None:
    temporary = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            if owner is not None:
                os.fchown(file.fileno(), *owner)
            os.fchmod(file.fileno(), mode)  # explicit: the umask could only have removed bits
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
