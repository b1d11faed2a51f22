"""The end of a PTY's output: on Linux (EIO on the master) and on a kernel that never says so (gVisor's).

gVisor's master stays empty after the last holder of the terminal closed it: no EIO, no POLLHUP. The
tests below make Linux behave so by turning the master's EIO into "nothing to read yet", and check
that the session still ends, but only once nothing holds the terminal any more.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.agent import _processes
from runtime.agent._processes import Event, Exit, Output, ProcessTable, Spec
from runtime.agent._users import User

# The test process itself: starting a process as ME changes no ids.
ME = User("me", os.getuid(), os.getgid(), "/tmp", tuple(os.getgroups()))


def pty_spec(command: str) -> Spec:
    return Spec("/bin/sh", ("-c", command), dict(os.environ), "/tmp", ME, False, (80, 24), None, None)


async def session(command: str, limit_s: float = 10.0) -> tuple[bytes, Exit, float]:
    """Output and end of a PTY process, and how long it took."""
    began = time.monotonic()
    _, queue = await ProcessTable().start(pty_spec(command), None)
    output = b""
    while True:
        event: Event = await asyncio.wait_for(queue.get(), limit_s)
        if isinstance(event, Output):
            output += event.data
        else:
            return output, event, time.monotonic() - began


@pytest.fixture
def quiet_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """The master as gVisor's kernel keeps it: a hang-up reads as an empty terminal, never EIO."""
    real_read: Callable[[int, int], bytes] = os.read

    def read(fd: int, size: int) -> bytes:
        try:
            return real_read(fd, size)
        except OSError as exc:
            if exc.errno == errno.EIO:
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable") from None
            raise

    monkeypatch.setattr(os, "read", read)  # os.read everywhere: the agent reads its master with it


def test_a_pty_session_ends_with_its_process_on_linux() -> None:
    output, end, _ = asyncio.run(session("echo linux-end; exit 3"))
    assert b"linux-end" in output
    assert (end.exit_code, end.exited) == (3, True)


@pytest.mark.usefixtures("quiet_master")
def test_a_pty_session_ends_when_the_kernel_never_reports_the_hang_up() -> None:
    output, end, took = asyncio.run(session("echo gvisor-end; exit 3"))
    assert b"gvisor-end" in output, "what the process wrote before it ended is still delivered"
    assert (end.exit_code, end.exited) == (3, True)
    assert took < 5


@pytest.mark.usefixtures("quiet_master")
def test_without_the_hang_up_a_background_holder_still_keeps_the_output_open() -> None:
    # As on Linux: the shell is gone, but a job it left holds the terminal and writes later.
    output, end, took = asyncio.run(session("trap '' HUP; (sleep 1; echo late-line) & exit 0"))
    assert b"late-line" in output
    assert end.exit_code == 0
    assert took >= 1


def test_nobody_holds_a_terminal_that_no_process_has_open() -> None:
    master, slave = os.openpty()
    name = os.ttyname(slave)
    try:
        assert _processes._terminal_held(name), "this process has it open"
        os.close(slave)
        slave = -1
        assert not _processes._terminal_held(name)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


async def _run(spec: Spec) -> tuple[int, bytes, bytes]:
    """The exit code, stdout and stderr of a process run to its end."""
    _, queue = await ProcessTable().start(spec, None)
    streams = {"stdout": b"", "stderr": b"", "pty": b""}
    while True:
        event: Event = await asyncio.wait_for(queue.get(), 10)
        if isinstance(event, Output):
            streams[event.stream] += event.data
        else:
            assert isinstance(event, Exit)
            return event.exit_code, streams["stdout"], streams["stderr"]


def _plain(cmd: str, *args: str) -> Spec:
    return Spec(cmd, args, dict(os.environ), "/tmp", ME, False, None, None, None)


@pytest.mark.parametrize(
    ("cmd", "code", "says"),
    [
        ("no-such-command-e2b", 127, b"not found"),
        ("/no/such/path-e2b", 127, b"not found"),
        ("/etc", 126, b"ermission denied"),  # a directory: execve's EACCES, as sh reports it
    ],
)
def test_a_command_that_cannot_be_executed_starts_and_ends_as_a_shell_says(cmd: str, code: int, says: bytes) -> None:
    exit_code, stdout, stderr = asyncio.run(_run(_plain(cmd, "arg")))
    assert (exit_code, stdout) == (code, b"")
    assert says in stderr, stderr


def test_a_script_without_an_interpreter_line_runs_as_a_shell_script(tmp_path: Path) -> None:
    script = tmp_path / "plain-script"
    script.write_text('echo "ran with $1"\n')
    script.chmod(0o755)
    exit_code, stdout, _ = asyncio.run(_run(_plain(str(script), "its-argument")))
    assert (exit_code, stdout) == (0, b"ran with its-argument\n")


def test_sh_is_asked_only_about_a_command_that_cannot_be_executed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that can run is executed as it is: the second exec through sh costs every command."""
    monkeypatch.setattr(_processes, "_SHELL_EXEC", ("/no/such/shell-e2b",))
    code = "import os; print(os.getpid())"

    async def go() -> None:
        managed, queue = await ProcessTable().start(_plain(sys.executable, "-c", code), None)
        out = b""
        while not isinstance(event := await asyncio.wait_for(queue.get(), 10), Exit):
            if isinstance(event, Output):
                out += event.data
        assert int(out) == managed.pid, "the reported pid is the command's own"
        with pytest.raises(_processes.ProcessError, match="no-such-command-e2b"):
            await ProcessTable().start(_plain("no-such-command-e2b"), None)

    asyncio.run(go())


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a process's ids needs root")
@pytest.mark.parametrize("mechanism", ["setpriv", "python"])
def test_a_process_gets_its_users_ids_and_groups(mechanism: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mechanism == "python":
        monkeypatch.setattr(_processes, "_setpriv", lambda: None)
    else:
        assert _processes._setpriv() is not None, "util-linux's setpriv is on every Debian host"
    nobody = User("nobody", 65534, 65534, "/tmp", (65534, 100))
    spec = Spec("id", ("-u",), {"PATH": "/usr/bin:/bin"}, "/tmp", nobody, False, None, None, None)
    exit_code, stdout, _ = asyncio.run(_run(spec))
    assert (exit_code, stdout) == (0, b"65534\n")
    for flag, expected in (("-g", b"65534\n"), ("-G", b"65534 100\n")):
        spec = Spec("id", (flag,), {"PATH": "/usr/bin:/bin"}, "/tmp", nobody, False, None, None, None)
        assert asyncio.run(_run(spec))[1] == expected
    missing = Spec("no-such-command-e2b", (), {"PATH": "/usr/bin:/bin"}, "/tmp", nobody, False, None, None, None)
    exit_code, _, stderr = asyncio.run(_run(missing))
    assert exit_code == 127
    assert b"not found" in stderr, stderr


def test_a_setpriv_that_is_not_util_linuxs_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BusyBox's setpriv takes other options: with it, Python changes the ids itself."""
    fake = tmp_path / "setpriv"
    fake.write_text("#!/bin/sh\necho 'BusyBox v1.36.1 multi-call binary.'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(_processes, "_setpriv_checked", False)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: str(fake))
    assert _processes._setpriv() is None
    monkeypatch.setattr(_processes, "_setpriv_checked", False)
    fake.write_text("#!/bin/sh\necho 'setpriv from util-linux 2.38.1'\n")
    assert _processes._setpriv() == str(fake)
