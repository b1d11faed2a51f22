"""Telling the runtime that the agent listens, without being polled for it.

A runtime that can hand the agent a file descriptor (crun's ``--preserve-fds``) gives it the write
end of a pipe and names it in ``E2B_COMPAT_READY_FD``. Once every listening socket is open (and
the template's services are up: they start first), the agent writes one byte to it and closes it.
The runtime waits on the read end instead of probing ``/health`` on a backoff, which left up to a
probe interval between a started agent and the first request.

The byte only says "probe now": the runtime still asks ``/health``, so a tenant process that
writes to the pipe (PID 1 keeps a copy, and the sandbox's root can open it) gains nothing.
Without the variable, or with a descriptor that is not a pipe, nothing happens and the runtime
polls as before.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import MutableMapping

READY_FD_ENV = "E2B_COMPAT_READY_FD"


def take_ready_fd(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """The pipe named by ``E2B_COMPAT_READY_FD``, made private to this process; None without one.

    The variable is removed, and the descriptor made non-inheritable, before anything is started:
    no service or command may hold the pipe open (or signal in the agent's place).
    """
    text = environ.pop(READY_FD_ENV, None)
    if text is None or not text.isdigit():
        return None
    fd = int(text)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        os.set_inheritable(fd, False)
    except OSError:
        return None
    return fd


def signal_ready(fd: int | None) -> None:
    """Write the byte and close the pipe; a runtime that stopped listening is no error."""
    if fd is None:
        return
    with contextlib.suppress(OSError):  # EPIPE: the runtime gave up waiting and probes instead
        os.write(fd, b"1")
    with contextlib.suppress(OSError):
        os.close(fd)
