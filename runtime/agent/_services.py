"""Template services: long-running programs the agent starts before it serves.

A template can name services (``--service PORT=COMMAND``), as ``code-interpreter-v1``
names the interpreter server on port 49999. The agent starts each as the template's
service user, in its own session, then waits until its port accepts connections, and
only then begins to listen itself. The runtime reports a sandbox as started once the
agent answers ``/health``, so a create that returns has a working interpreter: the
first ``run_code`` is not refused because the server is still importing. Upstream gets
the same effect by snapshotting a template after its ready check.

The wait is bounded (``READY_TIMEOUT_S``): a service that fails to start is logged with
its exit status and the agent serves anyway, so the sandbox stays usable through envd.
Services are not restarted and do not appear in the process list (upstream's start
command runs outside the process API's view as well). Their output goes to the agent's
own stdout and stderr, which the runtime keeps as the sandbox's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import socket
import time
from dataclasses import dataclass

from ._users import UnknownUserError, UserDatabase

__all__ = ["READY_TIMEOUT_S", "Service", "ServiceSet", "parse_service"]

READY_TIMEOUT_S = 20.0  # below the runtime's 30 s wait for the agent's health
_POLL_S = 0.02
_STOP_GRACE_S = 3.0
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
log = logging.getLogger("e2b_compat.agent.services")


@dataclass(frozen=True)
class Service:
    port: int
    argv: tuple[str, ...]


def parse_service(text: str) -> Service:
    """``"49999=/path/python -m x --flag"`` → ``Service(49999, (...))``; raises ``ValueError``."""
    port_text, sep, command = text.partition("=")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"a service is PORT=COMMAND, not {text!r}")
    argv = tuple(shlex.split(command))
    if not argv:
        raise ValueError(f"the service on port {port_text} has no command")
    return Service(int(port_text), argv)


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class ServiceSet:
    """The template's services: started together, awaited together, stopped together."""

    def __init__(self, services: tuple[Service, ...], user: str | None, users: UserDatabase | None = None) -> None:
        self._services = services
        self._user = user
        self._users = users or UserDatabase()
        self._procs: list[asyncio.subprocess.Process] = []

    def _spawn_args(self) -> dict[str, object]:
        env = {"PATH": _PATH, "LANG": "C.UTF-8"}
        kwargs: dict[str, object] = {"start_new_session": True, "stdin": asyncio.subprocess.DEVNULL, "env": env}
        if self._user is None or os.geteuid() != 0:
            env["HOME"] = os.environ.get("HOME", "/")
            return kwargs
        try:
            user = self._users.lookup(self._user)
        except UnknownUserError:
            raise ValueError(f"the service user {self._user!r} does not exist") from None
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        cwd = user.home if os.path.isdir(user.home) else "/"  # system users' homes may not exist
        kwargs.update(user=user.uid, group=user.gid, extra_groups=list(user.groups), cwd=cwd)
        return kwargs

    async def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Start every service and wait (at most ``timeout``) until each port accepts connections."""
        if not self._services:
            return
        kwargs = self._spawn_args()
        for service in self._services:
            try:
                proc = await asyncio.create_subprocess_exec(*service.argv, **kwargs)  # type: ignore[arg-type]
            except OSError as exc:
                log.error("service on port %d could not start: %s", service.port, exc)
                continue
            self._procs.append(proc)
            log.info("service on port %d started (pid %d)", service.port, proc.pid)
        deadline = time.monotonic() + timeout
        for service, proc in zip(self._services, self._procs, strict=False):
            await self._await_ready(service, proc, deadline)

    async def _await_ready(self, service: Service, proc: asyncio.subprocess.Process, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                log.error("service on port %d exited with status %d before it listened", service.port, proc.returncode)
                return
            if await loop.run_in_executor(None, _accepts, service.port):
                return
            await asyncio.sleep(_POLL_S)
        log.error("service on port %d did not listen in time; serving without it", service.port)

    async def stop(self) -> None:
        """End every service's session (SIGTERM, then SIGKILL after a grace period)."""
        for proc in self._procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                await asyncio.wait_for(proc.wait(), _STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        self._procs.clear()
