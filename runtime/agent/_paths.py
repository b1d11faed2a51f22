"""Path resolution and parent creation, shared by the HTTP routes and the RPC services.

Rules (envd's): an empty path is the default workdir when one is set; ``~`` and ``~/x``
expand to the user's home; ``~name`` is refused; an absolute path is used as given (not
cleaned, symlinks not resolved); a relative path is joined to the user's **home** (not the
workdir) and cleaned lexically. What the path then reaches is the kernel's business: the
work runs with the user's credentials (see ``_credentials``).
"""

from __future__ import annotations

import os
import posixpath
import stat

from ._errors import AgentError, ErrorKind
from ._users import User


class PathError(AgentError):
    """The path cannot be resolved (``invalid_argument``, HTTP 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.INVALID_ARGUMENT, message)


def resolve(raw: str, user: User, default_workdir: str | None) -> str:
    path = raw
    if path == "" and default_workdir:
        return default_workdir
    if path.startswith("~"):
        if path == "~" or path.startswith("~/"):
            return posixpath.normpath(posixpath.join(user.home, path[2:]))
        raise PathError("cannot expand user-specific home dir")
    if posixpath.isabs(path):
        return path
    return posixpath.normpath(posixpath.join(user.home, path))


def ensure_parents(path: str) -> None:
    """Create every missing ancestor of ``path`` (mode 0755 before umask).

    Runs with the requesting user's credentials, so new directories belong to that user.
    Existing components are left alone; a component that is not a directory is an error.
    """
    parent = posixpath.dirname(path)
    components = [c for c in parent.split("/") if c]
    current = "/"
    for component in components:
        current = posixpath.join(current, component)
        try:
            info = os.stat(current)
        except FileNotFoundError:
            try:
                os.mkdir(current, 0o755)
            except FileExistsError:
                info = os.stat(current)
            else:
                continue
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(f"path is a file: {current}")
