"""Processes started through the agent: spawning, output fan-out, input, signals, PTYs.

Independent of the wire: the Connect service (``_process_service``) translates requests
into calls here and ``Output``/``Exit`` events back into protobuf messages.

Rules kept from envd (docs/PROTOCOL-NOTES.md, envd processes):

- A subscriber is registered *before* the spawn, so the first bytes are never lost (PTYs too).
- Output read while nobody is subscribed is dropped; there is no replay buffer.
- The end is reported once both output streams reach EOF and the direct child is reaped;
  after a signal sent through the agent, or once the deadline passed, only the exit is awaited
  (a background ``sleep &`` holding the pipes must not hold the end back then).
- Subscribers each get every event; a slow subscriber slows the reader (bounded queues), which
  in turn slows the process instead of growing memory without bound.
- Signals go to the one pid, never the group; every process runs in its own session.
- A PTY's output ends when no process holds its terminal any more. Linux says so by failing a
  read of the master with EIO; gVisor's kernel never does (the master just stays empty), so
  once the child is reaped and the master is quiet, the agent looks for holders itself
  (``_terminal_held``) and ends the output when there are none. On Linux the EIO comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import struct
import subprocess
import termios
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._errors import AgentError, ErrorKind
from ._users import User

STDOUT_CHUNK = 32 * 1024
PTY_CHUNK = 16 * 1024
# How long a reaped PTY child's master may stay quiet before the agent looks for holders itself.
PTY_HANGUP_POLL_S = 0.25
_QUEUE_DEPTH = 64
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A command that cannot be executed (not found, not executable, no interpreter line) is started
# through sh, so it behaves as upstream: it starts, says why on stderr and exits 127 (or 126),
# instead of failing the RPC; sh also runs a script without a ``#!`` line as a shell script.
# ``exec`` keeps the reported pid. Only then: a second exec costs every command about a millisecond.
_SHELL_EXEC = ("/bin/sh", "-c", 'exec "$0" "$@"')
# Python forks (never vforks) a child that must change its uid, gid or groups, and a fork copies
# the agent's page tables: ~3 ms a command against ~0.7 ms (measured in a sandbox, 40 MiB
# resident). So a command for another user is vforked as util-linux's setpriv, which takes the
# user's ids and executes it (~0.6 ms). Without util-linux's setpriv (an image that lacks it, or
# has BusyBox's, which takes other options) or with a PTY (whose set-up needs code in the child),
# Python changes the ids itself. Asked once, on the first command that changes ids.
_SETPRIV: str | None = None
_setpriv_checked = False


def _setpriv() -> str | None:
    global _SETPRIV, _setpriv_checked  # noqa: PLW0603 - one answer per agent process
    if not _setpriv_checked:
        _setpriv_checked = True
        found = shutil.which("setpriv", path="/usr/bin:/bin")
        if found is not None:
            try:
                said = subprocess.run([found, "--version"], capture_output=True, timeout=5, check=False).stdout
            except (OSError, subprocess.SubprocessError):
                said = b""
            _SETPRIV = found if b"util-linux" in said else None
    return _SETPRIV


class ProcessError(AgentError):
    """A request the process table cannot satisfy; ``kind`` is the wire code."""


@dataclass(frozen=True)
class Output:
    stream: str  # "stdout", "stderr" or "pty"
    data: bytes


@dataclass(frozen=True)
class Exit:
    exit_code: int
    exited: bool
    status: str

    @property
    def error(self) -> str | None:
        return None if self.exited and self.exit_code == 0 else self.status


Event = Output | Exit


def describe_exit(returncode: int) -> Exit:
    if returncode >= 0:
        return Exit(returncode, True, f"exit status {returncode}")
    number = -returncode
    try:
        name = (signal.strsignal(number) or f"signal {number}").lower()
    except ValueError:
        name = f"signal {number}"
    return Exit(-1, False, f"signal: {name}")


@dataclass(frozen=True)
class Spec:
    """What to start, already resolved (user, cwd, environment)."""

    cmd: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    user: User
    stdin: bool
    pty_size: tuple[int, int] | None  # (cols, rows)
    tag: str | None
    config: Any  # the request's ProcessConfig, as sent, for List


def env_problem(env: Mapping[str, str]) -> str | None:
    """Why ``env`` cannot be a process environment, or None. Never quotes a value (it may be a secret).

    A name with ``=`` would be split differently by every reader of ``environ``, and a NUL cannot
    pass ``execve`` at all; an empty name is no variable. Refused at the door, they can neither
    fail a later start nor reach a process altered.
    """
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            return "an environment variable name is empty or contains '=' or NUL"
        if "\0" in value:
            shown = name if name.isprintable() and len(name) <= 64 else "a variable"
            return f"the value of environment variable {shown} contains NUL"
    return None


def build_env(user: User, global_env: Mapping[str, str], request_env: Mapping[str, str]) -> dict[str, str]:
    """PATH, then HOME/USER/LOGNAME, then the global set, then the request's own (later wins)."""
    env = {"PATH": _DEFAULT_PATH, "HOME": user.home, "USER": user.name, "LOGNAME": user.name}
    env.update(global_env)
    env.update(request_env)
    return env


def _argv(spec: Spec, kwargs: dict[str, Any]) -> tuple[str, ...]:
    """What to execute for ``spec``; adds to ``kwargs`` what Python must do in the child itself."""
    argv: tuple[str, ...] = (spec.cmd, *spec.args)
    target = spec.cmd if "/" not in spec.cmd else os.path.join(spec.cwd, spec.cmd)
    if shutil.which(target, path=spec.env.get("PATH", _DEFAULT_PATH)) is None:
        argv = (*_SHELL_EXEC, *argv)  # not executable as it is: sh says why, as a shell would
    user = spec.user
    if os.geteuid() != 0 or (user.uid, user.gid, sorted(user.groups)) == (
        os.getuid(),
        os.getgid(),
        sorted(os.getgroups()),
    ):
        return argv  # no change of identity: Python vforks
    setpriv = _setpriv() if spec.pty_size is None else None
    if setpriv is None:
        _ids_by_python(spec, kwargs)
        return argv
    groups = ",".join(str(group) for group in user.groups)
    identity = ["--groups=" + groups] if groups else ["--clear-groups"]
    return (setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", *identity, "--", *argv)


def _ids_by_python(spec: Spec, kwargs: dict[str, Any]) -> None:
    if os.geteuid() == 0:
        kwargs.update(user=spec.user.uid, group=spec.user.gid, extra_groups=list(spec.user.groups))


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@dataclass(eq=False)
class ManagedProcess:
    spec: Spec
    proc: asyncio.subprocess.Process
    master_fd: int | None = None
    terminal: str | None = None  # the PTY's slave path (``/dev/pts/N``)
    reaped: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: list[asyncio.Queue[Event]] = field(default_factory=list)
    exit: Exit | None = None
    stop_waiting_for_output: asyncio.Event = field(default_factory=asyncio.Event)
    deadline_task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def subscribe(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue(_QUEUE_DEPTH)
        if self.exit is not None:
            queue.put_nowait(self.exit)  # a late subscriber still learns how it ended
        else:
            self.subscribers.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        with contextlib.suppress(ValueError):
            self.subscribers.remove(queue)

    async def publish(self, event: Event) -> None:
        for queue in list(self.subscribers):
            await queue.put(event)

    # -- input and control -------------------------------------------------

    async def write_stdin(self, data: bytes) -> None:
        if self.master_fd is not None:
            raise ProcessError(ErrorKind.INTERNAL, "error writing to stdin: process has a pty, send pty input instead")
        stream = self.proc.stdin
        if stream is None or stream.is_closing():
            raise ProcessError(ErrorKind.INTERNAL, "error writing to stdin: stdin not enabled or closed")
        try:
            stream.write(data)
            await stream.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ProcessError(ErrorKind.INTERNAL, f"error writing to stdin: {exc}") from exc

    async def write_pty(self, data: bytes) -> None:
        if self.master_fd is None:
            raise ProcessError(ErrorKind.INTERNAL, "error writing to pty: tty not assigned to process")
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.master_fd, view)
            except BlockingIOError:
                await asyncio.sleep(0.005)
                continue
            except OSError as exc:
                raise ProcessError(ErrorKind.INTERNAL, f"error writing to pty: {exc}") from exc
            view = view[written:]

    def close_stdin(self) -> None:
        if self.master_fd is not None:
            raise ProcessError(ErrorKind.UNKNOWN, f"error closing stdin: cannot close stdin for PTY process {self.pid}")
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    def send_signal(self, sig: signal.Signals) -> None:
        if self.exit is not None or self.proc.returncode is not None:
            raise ProcessError(ErrorKind.INTERNAL, "error sending signal: os: process already finished")
        self.stop_waiting_for_output.set()
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError as exc:
            raise ProcessError(ErrorKind.INTERNAL, "error sending signal: os: process already finished") from exc

    def resize(self, cols: int, rows: int) -> None:
        if self.master_fd is None:
            raise ProcessError(ErrorKind.INTERNAL, "error resizing tty: tty not assigned to process")
        _set_winsize(self.master_fd, cols, rows)


class ProcessTable:
    """Every process started through the agent and not yet finished."""

    def __init__(self) -> None:
        self._processes: dict[int, ManagedProcess] = {}

    def list(self) -> list[ManagedProcess]:
        return list(self._processes.values())

    def find(self, pid: int | None = None, tag: str | None = None) -> ManagedProcess:
        if pid is not None:
            found = self._processes.get(pid)
            if found is None:
                raise ProcessError(ErrorKind.NOT_FOUND, f"process with pid {pid} not found")
            return found
        if tag is not None:
            # A full search: every tagged process is considered (upstream stops early).
            for candidate in self._processes.values():
                if candidate.spec.tag == tag:
                    return candidate
            raise ProcessError(ErrorKind.NOT_FOUND, f"process with tag {tag} not found")
        raise ProcessError(ErrorKind.UNIMPLEMENTED, "process selector is empty")

    async def start(self, spec: Spec, deadline: float | None) -> tuple[ManagedProcess, asyncio.Queue[Event]]:
        """Spawn ``spec``; return the process and a queue subscribed before any output was read."""
        master_fd = slave_fd = None
        terminal: str | None = None
        kwargs: dict[str, Any] = {
            "env": dict(spec.env),
            "cwd": spec.cwd,
            "start_new_session": True,
        }
        argv = _argv(spec, kwargs)
        if spec.pty_size is not None:
            master_fd, slave_fd = os.openpty()
            terminal = os.ttyname(slave_fd)
            _set_winsize(master_fd, *spec.pty_size)
            os.set_blocking(master_fd, False)
            kwargs.update(stdin=slave_fd, stdout=slave_fd, stderr=slave_fd, preexec_fn=_take_controlling_tty)
        else:
            kwargs.update(
                stdin=asyncio.subprocess.PIPE if spec.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        try:
            try:
                proc = await asyncio.create_subprocess_exec(*argv, **kwargs)
            except OSError:  # sh tells it as a shell would (nothing ran, no output was read)
                _ids_by_python(spec, kwargs)
                proc = await asyncio.create_subprocess_exec(*_SHELL_EXEC, spec.cmd, *spec.args, **kwargs)
        except OSError as exc:
            if master_fd is not None:
                os.close(master_fd)
            command = " ".join((spec.cmd, *spec.args))
            raise ProcessError(ErrorKind.INVALID_ARGUMENT, f"error starting process '{command}': {exc}") from exc
        finally:
            if slave_fd is not None:
                os.close(slave_fd)
        managed = ManagedProcess(spec, proc, master_fd, terminal)
        queue = managed.subscribe()
        self._processes[managed.pid] = managed
        if deadline is not None:
            managed.deadline_task = asyncio.create_task(self._enforce_deadline(managed, deadline))
        asyncio.create_task(self._supervise(managed))  # noqa: RUF006 - kept alive by the table entry
        return managed, queue

    async def _enforce_deadline(self, managed: ManagedProcess, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
        if managed.exit is None:
            managed.stop_waiting_for_output.set()
            with contextlib.suppress(ProcessLookupError):
                os.kill(managed.pid, signal.SIGKILL)

    async def _supervise(self, managed: ManagedProcess) -> None:
        readers = []
        if managed.master_fd is not None:
            readers.append(asyncio.create_task(self._read_pty(managed)))
        else:
            for name, stream in (("stdout", managed.proc.stdout), ("stderr", managed.proc.stderr)):
                assert stream is not None
                readers.append(asyncio.create_task(self._read_pipe(managed, name, stream)))
        returncode = await managed.proc.wait()
        managed.reaped.set()
        outputs_done: asyncio.Future[Any] = asyncio.gather(*readers)
        stop: asyncio.Future[Any] = asyncio.ensure_future(managed.stop_waiting_for_output.wait())
        await asyncio.wait({outputs_done, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not outputs_done.done():
            outputs_done.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await outputs_done
        if managed.master_fd is not None:
            os.close(managed.master_fd)
            managed.master_fd = None
        if managed.deadline_task is not None:
            managed.deadline_task.cancel()
        managed.exit = describe_exit(returncode)
        await managed.publish(managed.exit)
        managed.subscribers.clear()
        self._processes.pop(managed.pid, None)

    @staticmethod
    async def _read_pipe(managed: ManagedProcess, name: str, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(STDOUT_CHUNK):
            await managed.publish(Output(name, chunk))

    @staticmethod
    async def _read_pty(managed: ManagedProcess) -> None:
        fd = managed.master_fd
        assert fd is not None
        loop = asyncio.get_running_loop()
        check_at: float | None = None  # once the child is reaped: when to look for holders next
        reaped: asyncio.Future[Any] = asyncio.ensure_future(managed.reaped.wait())
        try:
            while True:
                if reaped.done():
                    if check_at is None:
                        check_at = loop.time() + PTY_HANGUP_POLL_S  # Linux's EIO comes within this
                    elif loop.time() >= check_at:
                        if not await asyncio.to_thread(_terminal_held, managed.terminal):
                            await ProcessTable._drain_pty(managed, fd)  # nobody can write any more (docstring)
                            return
                        check_at = loop.time() + PTY_HANGUP_POLL_S
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_reader(fd, _resolve, ready)  # the wait below takes several loop turns: set once
                try:
                    timeout = None if check_at is None else max(0.0, check_at - loop.time())
                    waiters = {ready} if reaped.done() else {ready, reaped}
                    await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    loop.remove_reader(fd)
                    readable = ready.done()
                    ready.cancel()
                if not readable:
                    continue
                try:
                    chunk = os.read(fd, PTY_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:  # EIO once every holder of the terminal is gone
                    return
                if not chunk:
                    return
                await managed.publish(Output("pty", chunk))
        finally:
            reaped.cancel()

    @staticmethod
    async def _drain_pty(managed: ManagedProcess, fd: int) -> None:
        """What the master still buffers, once nobody holds the terminal (nothing more can come)."""
        while True:
            try:
                chunk = os.read(fd, PTY_CHUNK)
            except OSError:  # EAGAIN: empty; EIO: Linux's hang-up
                return
            if not chunk:
                return
            await managed.publish(Output("pty", chunk))

    async def shutdown(self) -> None:
        """Kill everything still running (agent shutdown)."""
        for managed in list(self._processes.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(managed.pid, signal.SIGKILL)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _terminal_held(terminal: str | None) -> bool:
    """Whether any process has ``terminal`` open; True when that cannot be told (an unreadable fd table)."""
    if terminal is None:
        return True
    try:
        pids = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        except OSError:
            return True  # another user's process (the agent run unprivileged): assume it may hold it
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == terminal:
                    return True
            except OSError:
                continue  # closed meanwhile
    return False


def _take_controlling_tty() -> None:
    # Runs in the child after setsid(): make the PTY (already on fd 0) the controlling terminal.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
