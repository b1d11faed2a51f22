"""Run filesystem work with a user's file-system credentials, in a worker thread.

The issue's rule is that permissions are enforced by doing the work *as the requesting
user*, never by checking path strings. Linux keeps file-system credentials (fsuid, fsgid)
and the supplementary group list per thread at the system-call level, so a worker thread
switches them, does the work, and switches back: the kernel then checks permissions,
follows symlinks and resolves ``..`` exactly as it would for that user, and files the
thread creates belong to that user. glibc broadcasts ``setgroups`` to every thread of the
process, so the raw system call is used for it. When the agent does not run as root it
cannot switch, and everything runs with its own credentials.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
from collections.abc import Callable
from typing import TypeVar

from ._users import User

T = TypeVar("T")

# Per-architecture system call numbers (not exported by Python's os module).
_SYSCALLS = {
    "x86_64": {"setgroups": 116, "setfsuid": 122, "setfsgid": 123, "setresuid": 117, "setresgid": 119},
    "aarch64": {"setgroups": 159, "setfsuid": 151, "setfsgid": 152, "setresuid": 147, "setresgid": 149},
}
_KEEP = 0xFFFFFFFF  # -1 as an id argument: leave that id as it is

_libc = ctypes.CDLL(None, use_errno=True)
_numbers = _SYSCALLS.get(platform.machine())
_PRIVILEGED = os.geteuid() == 0 and _numbers is not None
_OWN_GROUPS = tuple(os.getgroups())
_OWN_IDS = (os.geteuid(), os.getegid())  # read once: without setfsuid a switched thread's geteuid is the user's


def _syscall(name: str, *args: int | ctypes.Array[ctypes.c_uint]) -> int:
    assert _numbers is not None
    result: int = _libc.syscall(_numbers[name], *args)
    return result


# gVisor's kernel has no setfsuid (ENOSYS). There the thread's effective ids are switched instead:
# the raw setresuid/setresgid are per thread too, and the saved root id lets it switch back.
_HAS_FSUID = _numbers is not None and _syscall("setfsuid", _KEEP) != -1


def _set_thread_effective_ids(uid: int, gid: int, groups: tuple[int, ...]) -> None:
    # Root again first: setgroups and setresgid need the capabilities an unprivileged euid drops.
    for name, args in (("setresuid", (_KEEP, 0, _KEEP)), ("setgroups", None), ("setresgid", (_KEEP, gid, _KEEP))):
        if args is None:
            result = _syscall(name, len(groups), (ctypes.c_uint * max(len(groups), 1))(*groups))
        else:
            result = _syscall(name, *args)
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{name}: {os.strerror(err)}")
    if _syscall("setresuid", _KEEP, uid, _KEEP) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"could not switch the effective uid to {uid}: {os.strerror(err)}")


def _set_thread_credentials(uid: int, gid: int, groups: tuple[int, ...]) -> None:
    if not _HAS_FSUID:
        _set_thread_effective_ids(uid, gid, groups)
        return
    array = (ctypes.c_uint * max(len(groups), 1))(*groups)
    if _syscall("setgroups", len(groups), array) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setgroups: {os.strerror(err)}")
    # setfsuid/setfsgid return the previous value and cannot report failure; verify instead.
    _syscall("setfsgid", gid)
    _syscall("setfsuid", uid)
    if _syscall("setfsuid", -1 & 0xFFFFFFFF) != uid:
        raise OSError(1, f"could not switch file-system uid to {uid}")


def run_as(user: User | None, fn: Callable[[], T]) -> T:
    """Call ``fn`` in the current thread with ``user``'s file-system credentials."""
    if user is None or not _PRIVILEGED or (user.uid == 0 and user.gid == 0):
        return fn()
    try:
        _set_thread_credentials(user.uid, user.gid, user.groups)
        return fn()
    finally:  # also after a partial switch: a pooled thread must never keep a user's credentials
        _set_thread_credentials(*_OWN_IDS, _OWN_GROUPS)


async def as_user(user: User | None, fn: Callable[[], T]) -> T:
    """Run blocking filesystem work as ``user`` in a worker thread."""
    return await asyncio.to_thread(run_as, user, fn)
