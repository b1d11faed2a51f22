"""The crun backend: the shared OCI backend (``runtime._oci_backend``) driving the ``crun`` command.

Only what is crun's own lives here: its command line and how it reports state. crun keeps its
state under ``<state>/crun`` (``crun --root``), so nothing here mixes with other users of crun
on the host, and ``reconcile()`` can compare both views. Records, network, layers, bundles,
snapshots and crash recovery are ``OciBackend``'s (see its docstring and docs/ARCHITECTURE.md).

The commands: ``create --bundle``, ``start``, ``pause``/``resume`` (the cgroup freezer),
``kill``/``delete --force``, ``state`` (JSON with a ``status`` and the init's ``pid``), and with
the checkpoint tools (``runtime._checkpoint_tools``: CRIU and a crun built against it)
``checkpoint``/``restore --detach`` with CRIU's own options in ``CRIU_OPTIONS``; each after ``--root``.
gVisor's ``runsc`` takes the same ones, so a runsc backend is ``CrunCommand("runsc", root,
global_args=...)`` under an ``OciBackend`` subclass of its own, in a module like this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import _checkpoint_tools, _hostfs, _idmap, _ksm, _network, host
from ._addresses import AddressRegistry
from ._checkpoint_tools import CheckpointTools
from ._oci_backend import CGROUP_PARENT, OciBackend
from .backend import BackendError, Feature

if TYPE_CHECKING:
    from .backends import BackendOptions
    from .templates import Template

__all__ = [
    "CGROUP_PARENT",
    "CRIU_OPTIONS",
    "FEATURES",  # noqa: F822 - the module's __getattr__ gives it
    "CrunBackend",
    "CrunCommand",
    "host_checkpoint_tools",
    "open_backend",
    "prepare_host",
]

_T = TypeVar("_T")

_DELETE_TIMEOUT_S = 10.0
# How long a runtime command may take before it is ended (its process group killed). Far above
# what a healthy one takes (a create or a freeze: tens of ms; a checkpoint or a restore writes or
# reads the sandbox's memory: seconds for GiBs): only a hung one reaches them.
_COMMAND_TIMEOUT_S = 120.0
_MEMORY_TIMEOUT_S = 600.0
# How long a delete waits for a checkpoint left running by a server that was killed (it ends the
# container itself in well under a second; only a hung one makes the delete go on regardless).
_ORPHAN_CHECKPOINT_WAIT_S = 60.0


class CrunCommand:
    """``crun --root <root> …`` as the OCI backend's ``ContainerRuntime`` (any CLI-compatible runtime)."""

    def __init__(
        self,
        executable: str,
        root: Path,
        *,
        global_args: Sequence[str] = (),
        passes_ready_fd: bool = False,
        fixed_layout: bool = False,
        env: Mapping[str, str] | None = None,  # the runtime's environment (None: the server's)
        checkpoints: bool = False,  # checkpoints with CRIU (crun built with it): deletes wait for one
    ) -> None:
        self.executable = executable
        self.env = dict(env) if env is not None else None
        self.checkpoints = checkpoints
        self.name = Path(executable).name
        self.root = root
        self.global_args = tuple(global_args)
        self.passes_ready_fd = passes_ready_fd  # takes ``create --preserve-fds``
        # The container's init, and so the agent, start without address randomisation, which
        # the agent restores for what it starts (``runtime.agent._memory``): the agents' start-up
        # pages are then the same bytes, for the host's same-page merging.
        self.fixed_layout = fixed_layout

    def argv(self, *args: str) -> list[str]:
        return [self.executable, "--root", str(self.root), *self.global_args, *args]

    async def create(self, bundle: Path, container: str, log: Path, *, ready_fd: int | None = None) -> None:
        # The container's init inherits crun's stdout and stderr: a pipe to the log's rotating
        # writer, so a sandbox printing without end holds the host to the log's bounded size.
        if ready_fd is not None and not self.passes_ready_fd:
            raise ValueError(f"{self.name} is not asked to pass descriptors on")
        passed = ("--preserve-fds", "1") if ready_fd is not None else ()
        argv = self.argv("create", *passed, "--bundle", str(bundle), container)
        await self._spawn_container(bundle, argv, log, f"create of {container}", ready_fd=ready_fd)

    async def restore(self, bundle: Path, container: str, log: Path, images: Path, *, config: Path) -> int:
        """The container of ``images`` (a ``checkpoint``) running again, its processes where they were.

        ``config`` is CRIU's option file. The restored init's standard streams are the ones this
        call gives (crun re-attaches the pipes it recorded): the log's writer, as at create.
        Returns the restored init's pid, as the host sees it (from crun's pid file, which saves
        asking ``crun state`` for it afterwards).
        """
        pid_file = images / "restored.pid"
        argv = self.argv(
            "restore",
            "--detach",
            "--file-locks",
            "--pid-file",
            str(pid_file),
            "--image-path",
            str(images),
            "--bundle",
            str(bundle),
            container,
        )
        await self._spawn_container(bundle, argv, log, f"restore of {container}", config=config)
        try:
            pid = int(pid_file.read_text().strip() or "0")
        except (OSError, ValueError):
            pid = 0
        if pid <= 0:
            raise BackendError(f"restore of {container}: crun wrote no pid")
        return pid

    async def checkpoint(self, container: str, images: Path, *, config: Path, leave_running: bool = False) -> None:
        """The container's processes and memory written to ``images``; the container is gone after.

        ``leave_running``: it stays, in the state it was (a frozen one stays frozen).
        """
        kept = ("--leave-running",) if leave_running else ()
        # --file-locks on the command line: crun sets CRIU's flag from it, over the option file's.
        await self._checked(
            "checkpoint",
            *kept,
            "--file-locks",
            "--image-path",
            str(images),
            container,
            config=config,
            timeout=_MEMORY_TIMEOUT_S,
        )

    def pid(self, container: str) -> int:
        """The container's init, as the host sees it (BackendError when the runtime knows none)."""
        proc = self._call("state", container)
        pid = json.loads(proc.stdout).get("pid", 0) if proc.returncode == 0 else 0
        if not isinstance(pid, int) or pid <= 0:
            raise BackendError(f"{self.name} state {container}: no process ({proc.stderr.strip()[-300:]})")
        return pid

    async def _spawn_container(
        self,
        bundle: Path,
        argv: list[str],
        log: Path,
        what: str,
        *,
        ready_fd: int | None = None,
        config: Path | None = None,
    ) -> None:
        out = await asyncio.to_thread(_hostfs.log_writer, log)
        # Standard input is a pipe already closed at its other end: reads see its end, as with
        # /dev/null, and a checkpoint can record it (a host file outside the container it cannot).
        stdin, closed = os.pipe()
        os.close(closed)
        try:
            proc = await asyncio.create_subprocess_exec(
                # The root is nosuid on the host: the container is made from a view where it is not.
                *_hostfs.with_setuid_root(bundle / "rootfs", argv, fd3=ready_fd, fixed_layout=self.fixed_layout),
                pass_fds=() if ready_fd is None else (ready_fd,),
                stdin=stdin,
                stdout=out,
                stderr=out,
                env=self._env(config),
                # The container's init inherits this session: in the caller's, a signal to the
                # caller's process group (Ctrl-C, a supervisor stopping the server) would reach
                # every sandbox. Sandboxes outlive the server; startup reconciliation adopts them.
                start_new_session=True,
            )
        finally:
            os.close(out)
            os.close(stdin)
        timeout = _COMMAND_TIMEOUT_S if config is None else _MEMORY_TIMEOUT_S
        code = await _finished(proc, proc.wait(), timeout, f"{self.name} {what}")
        if code != 0:
            # No container holds the pipe: the writer ends as soon as it has written crun's error.
            await asyncio.to_thread(_hostfs.wait_log_writer, log, _DELETE_TIMEOUT_S)
            raise BackendError(f"{self.name} {what} failed: {_hostfs.tail(log)}")

    def _env(self, config: Path | None = None) -> dict[str, str] | None:
        if config is None:
            return self.env
        return {**(self.env if self.env is not None else os.environ), "CRIU_CONFIG_FILE": str(config)}

    async def start(self, container: str) -> None:
        await self._checked("start", container)

    async def freeze(self, container: str) -> None:
        await self._checked("pause", container)

    async def thaw(self, container: str) -> None:
        await self._checked("resume", container)

    def delete(self, container: str) -> None:
        if self.checkpoints:
            self._wait_for_criu(container)
        # SIGKILL reaches every process in the container's pid namespace through PID 1's death.
        self._call("kill", container, "KILL")
        deadline = time.monotonic() + _DELETE_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._call("delete", "--force", container).returncode == 0:
                return
            if "does not exist" in self._call("state", container).stderr:
                return
            time.sleep(0.05)
        raise BackendError(f"could not delete container {container}")

    def _wait_for_criu(self, container: str) -> None:
        """Return once no CRIU holds the container's init (within a bound).

        Killed while CRIU dumps it, a container and CRIU can wait for each other for good (see
        ``_finished``). A checkpoint this server runs holds the sandbox's lock, so this is for one
        a server that was killed left running: the next server's reconcile, or a harness
        releasing what a stopped server left, waits for it to end instead (it ends the container).
        """
        try:
            pid = self.pid(container)
        except BackendError:  # gone already, or no process: nothing to wait for
            return
        deadline = time.monotonic() + _ORPHAN_CHECKPOINT_WAIT_S
        while _held_by_criu(pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _call(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, check=False, env=self.env)

    def container_names(self) -> list[str]:
        proc = self._call("list", "--quiet")
        if proc.returncode != 0:
            raise BackendError(f"{self.name} list failed: {proc.stderr.strip()[-300:]}")
        return [line.strip() for line in proc.stdout.splitlines() if line.strip()]

    def status(self, container: str) -> str | None:
        proc = self._call("state", container)
        if proc.returncode != 0:
            return None
        status: str = json.loads(proc.stdout).get("status", "")
        return status

    async def _checked(self, *args: str, config: Path | None = None, timeout: float = _COMMAND_TIMEOUT_S) -> None:
        await self._run_checked(self.argv(*args), " ".join(args), config=config, timeout=timeout)

    async def _run_checked(
        self, argv: list[str], what: str, *, config: Path | None = None, timeout: float = _COMMAND_TIMEOUT_S
    ) -> None:
        """``argv`` (the runtime's command, maybe wrapped) run to its end; ``BackendError`` unless it succeeds."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(config),
            # A group of its own, as the container's: a signal to the server's group (Ctrl-C, a
            # supervisor stopping it) must not cut a checkpoint in half; ``_finished`` ends it.
            start_new_session=True,
        )
        _, err = await _finished(proc, proc.communicate(), timeout, f"{self.name} {what}")
        if proc.returncode != 0:
            message = err.decode(errors="replace")[-500:]
            raise BackendError(f"{self.name} {what} failed ({proc.returncode}): {message}")


def _held_by_criu(pid: int) -> bool:
    """Whether CRIU, a process of the host's pid namespace (not one a sandbox named so), ptraces ``pid``."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        tracer = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("TracerPid:"))
        if tracer <= 0 or Path(f"/proc/{tracer}/comm").read_text().strip() != "criu":
            return False
        return os.readlink(f"/proc/{tracer}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except (OSError, StopIteration, ValueError, IndexError):
        return False  # gone, or its tracer is


async def _finished(proc: asyncio.subprocess.Process, ending: Awaitable[_T], timeout: float, what: str) -> _T:
    """What ``ending`` (the wait for ``proc``, a runtime command in a session of its own) gives.

    A caller cancelled meanwhile (a server stopping, a request given up) still waits for the
    command, within the same bound, before the cancellation goes on: the command acts on a
    sandbox whose lock the caller holds, and what the caller does next (a kill, a reconcile)
    must not overlap it. A container killed while CRIU dumps it can leave both hung (seen for
    minutes): CRIU waits for the tasks it seized, the container's init for its children, which
    CRIU holds. A command still running at ``timeout`` is ended with its whole group (crun and
    the CRIU it started): ``BackendError``. A second cancellation while it waits is not held.
    """
    job = asyncio.ensure_future(ending)
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        await asyncio.wait({job}, timeout=timeout)  # a cancellation interrupts the wait, not the job
    except asyncio.CancelledError:
        await asyncio.wait({job}, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        if not job.done():
            await _ended(proc, job)
        raise
    if not job.done():
        await _ended(proc, job)
        raise BackendError(f"{what} did not finish within {timeout:g} s: ended")
    return job.result()


async def _ended(proc: asyncio.subprocess.Process, job: asyncio.Future[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await job


class CrunBackend(OciBackend):
    """Sandboxes as crun containers: ``OciBackend`` with crun's state under ``<state_dir>/crun``."""

    name = "crun"

    def __init__(
        self,
        state_dir: Path,
        *,
        pool: _network.AddressPool | None = None,
        templates_root: Path | None = None,
        crun: str = "crun",
        id_mapping: _idmap.Mapping | None = _idmap.DEFAULT_MAPPING,  # None: sandbox root is host root
        templates: Iterable[Template] = (),  # already built: used as they are, never looked up again
        addresses: AddressRegistry | None = None,  # default: the host's one registry
        share_agent_memory: bool = False,  # the agents' start-up pages merged by the host (``_ksm``)
        checkpoint_tools: CheckpointTools | None = None,  # CRIU and its crun: a memory pause frees the RAM
        boot_images: bool = False,  # first starts restore the template's booted agent (needs the tools)
    ) -> None:
        share = share_agent_memory and _ksm.ensure_running()
        config = None
        if checkpoint_tools is not None:
            crun = str(checkpoint_tools.crun)
            state_dir.mkdir(parents=True, exist_ok=True)
            config = state_dir / "criu.conf"
            _hostfs.write_whole(config, CRIU_OPTIONS)
            _checkpoint_tools.keep_kernel_facts(checkpoint_tools)  # 30-60 ms of every checkpoint and restore
            self.features = self.features | {Feature.PAUSE_MEMORY_ON_DISK, Feature.SNAPSHOT_MEMORY}
        super().__init__(
            state_dir,
            CrunCommand(
                crun,
                state_dir / "crun",
                passes_ready_fd=True,
                fixed_layout=share,
                env=checkpoint_tools.env() if checkpoint_tools is not None else None,
                checkpoints=checkpoint_tools is not None,
            ),
            pool=pool,
            templates_root=templates_root,
            id_mapping=id_mapping,
            templates=templates,
            addresses=addresses,
            share_agent_memory=share,
            runtime_netns=checkpoint_tools is not None,
            checkpoint_config=config,
            boot_images=boot_images,
        )


# CRIU's options for a sandbox's checkpoint and restore, beyond what crun passes:
# - tcp-close: connections are not kept (a paused E2B sandbox keeps none either), so neither the
#   host's nor the peers' side must be frozen meanwhile; listening sockets are kept;
# - network-lock skip: with no connection kept there is nothing to lock (and no iptables needed);
# - skip-in-flight: a connection half-open at that moment is dropped, its client retries;
# - file-locks: flock/fcntl locks held inside the sandbox are kept (without it CRIU refuses them);
#   crun also passes its own flag for it (``--file-locks``), which wins over this file.
# Restores add theirs (``OciBackend._replay_config`` and its siblings).
CRIU_OPTIONS = "tcp-close\nnetwork-lock skip\nskip-in-flight\nfile-locks\n"


def __getattr__(name: str) -> frozenset[Feature]:
    """``FEATURES``: what the ``crun`` entry provides on this host, read without opening a backend.

    Looked up each time: memory written to disk depends on whether this host built the
    checkpoint tools, which ``prepare_host`` may do after this module was imported.
    """
    if name == "FEATURES":
        on_disk = {Feature.PAUSE_MEMORY_ON_DISK, Feature.SNAPSHOT_MEMORY}
        return CrunBackend.features | (on_disk if _checkpoint_tools.find() is not None else set())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def host_checkpoint_tools() -> CheckpointTools | None:
    """The checkpoint tools this host built (``prepare_host``), or None: what ``open_backend`` passes."""
    return _checkpoint_tools.find()


def open_backend(options: BackendOptions) -> CrunBackend:
    """The ``crun`` entry of ``runtime.backends``: with the checkpoint tools when this host built them."""
    return CrunBackend(
        options.state_dir,
        templates_root=options.templates_root,
        templates=options.templates,
        share_agent_memory=options.share_agent_memory,
        checkpoint_tools=host_checkpoint_tools(),
        boot_images=options.boot_images,
    )


def prepare_host(say: Callable[[str], None]) -> None:
    """Install crun, nftables, debootstrap, iproute2, apply the cgroup fix, build the checkpoint tools.

    The tools are optional: a build that fails is reported, and the backend then pauses memory
    with the freezer (its features say so).
    """
    host.prepare(say=say)
    try:
        _checkpoint_tools.ensure(say)
    except _checkpoint_tools.ToolsError as exc:
        say(f"memory checkpoints are off: {exc}")
