"""The crun backend: the shared OCI backend (``runtime._oci_backend``) driving the ``crun`` command.

Only what is crun's own lives here: its command line and how it reports state. crun keeps its
state under ``<state>/crun`` (``crun --root``), so nothing here mixes with other users of crun
on the host, and ``reconcile()`` can compare both views. Records, network, layers, bundles,
snapshots and crash recovery are ``OciBackend``'s (see its docstring and docs/ARCHITECTURE.md).

The commands: ``create --bundle``, ``start``, ``pause``/``resume`` (the cgroup freezer),
``kill``/``delete --force`` and ``state`` (JSON with a ``status``), each after ``--root``.
gVisor's ``runsc`` takes the same ones, so a runsc backend is ``CrunCommand("runsc", root,
global_args=...)`` under an ``OciBackend`` subclass of its own, in a module like this one.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import _hostfs, _idmap, _ksm, _network, host
from ._addresses import AddressRegistry
from ._oci_backend import CGROUP_PARENT, OciBackend
from .backend import BackendError, Feature

if TYPE_CHECKING:
    from .backends import BackendOptions
    from .templates import Template

__all__ = ["CGROUP_PARENT", "FEATURES", "CrunBackend", "CrunCommand", "open_backend", "prepare_host"]

_DELETE_TIMEOUT_S = 10.0


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
    ) -> None:
        self.executable = executable
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
        out = await asyncio.to_thread(_hostfs.log_writer, log)
        passed = ("--preserve-fds", "1") if ready_fd is not None else ()
        argv = self.argv("create", *passed, "--bundle", str(bundle), container)
        try:
            proc = await asyncio.create_subprocess_exec(
                # The root is nosuid on the host: the container is made from a view where it is not.
                *_hostfs.with_setuid_root(bundle / "rootfs", argv, fd3=ready_fd, fixed_layout=self.fixed_layout),
                pass_fds=() if ready_fd is None else (ready_fd,),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                # The container's init inherits this session: in the caller's, a signal to the
                # caller's process group (Ctrl-C, a supervisor stopping the server) would reach
                # every sandbox. Sandboxes outlive the server; startup reconciliation adopts them.
                start_new_session=True,
            )
        finally:
            os.close(out)
        code = await proc.wait()
        if code != 0:
            # No container holds the pipe: the writer ends as soon as it has written crun's error.
            await asyncio.to_thread(_hostfs.wait_log_writer, log, _DELETE_TIMEOUT_S)
            raise BackendError(f"{self.name} create failed for {container}: {_hostfs.tail(log)}")

    async def start(self, container: str) -> None:
        await self._checked("start", container)

    async def freeze(self, container: str) -> None:
        await self._checked("pause", container)

    async def thaw(self, container: str) -> None:
        await self._checked("resume", container)

    def delete(self, container: str) -> None:
        # SIGKILL reaches every process in the container's pid namespace through PID 1's death.
        _hostfs.run(*self.argv("kill", container, "KILL"), check=False)
        deadline = time.monotonic() + _DELETE_TIMEOUT_S
        while time.monotonic() < deadline:
            if _hostfs.run(*self.argv("delete", "--force", container), check=False).returncode == 0:
                return
            if "does not exist" in _hostfs.run(*self.argv("state", container), check=False).stderr:
                return
            time.sleep(0.05)
        raise BackendError(f"could not delete container {container}")

    def status(self, container: str) -> str | None:
        proc = subprocess.run(self.argv("state", container), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return None
        status: str = json.loads(proc.stdout).get("status", "")
        return status

    async def _checked(self, *args: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self.argv(*args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            message = err.decode(errors="replace")[-500:]
            raise BackendError(f"{self.name} {' '.join(args)} failed ({proc.returncode}): {message}")


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
    ) -> None:
        share = share_agent_memory and _ksm.ensure_running()
        super().__init__(
            state_dir,
            CrunCommand(crun, state_dir / "crun", passes_ready_fd=True, fixed_layout=share),
            pool=pool,
            templates_root=templates_root,
            id_mapping=id_mapping,
            templates=templates,
            addresses=addresses,
            share_agent_memory=share,
        )


# What the ``crun`` entry provides, read by reports and benchmarks without opening a backend.
FEATURES: frozenset[Feature] = CrunBackend.features


def open_backend(options: BackendOptions) -> CrunBackend:
    """The ``crun`` entry of ``runtime.backends``."""
    return CrunBackend(
        options.state_dir,
        templates_root=options.templates_root,
        templates=options.templates,
        share_agent_memory=options.share_agent_memory,
    )


def prepare_host(say: Callable[[str], None]) -> None:
    """Install crun, nftables, debootstrap, iproute2 and apply the cgroup fix (``runtime.host.prepare``)."""
    host.prepare(say=say)
