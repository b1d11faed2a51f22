"""The gVisor backend: the shared OCI backend driving ``runsc`` (``runtime._runsc``).

The same templates, agent, bundle, per-sandbox network namespace, veth and nftables policy,
disk and cgroup limits as crun (``runtime._oci_backend``); what differs is the kernel the
sandbox's processes talk to: gVisor's, a user-space kernel (the "sentry", on the ``ptrace``
platform here: no KVM needed). runsc's netstack takes over the interfaces of the network
namespace named in the bundle, so the host-side veth and nftables rules are crun's. runsc keeps
its state under ``<state>/runsc`` (``runsc --root``).

What of crun's bundle runsc takes, found by trying it (runsc 0.0~20221219, Linux 6.18):

- user namespace and id mappings: none (``id_mapping=None``, so no idmapped lowers either).
  gVisor's kernel is the boundary: root inside is root of the sentry, never of the host
  kernel. On the host the sentry runs as ``nobody`` in a user namespace runsc makes, with no
  capabilities in the host's; its file server (the gofer) is host root, confined by runsc to the
  bundle's rootfs, and writes files with the owners the sandbox asked for (0-based, as
  templates are). So a snapshot's layer needs no shifting, and no sandbox has a host id range.
- seccomp: runsc applies the bundle's filter inside its kernel only with ``--oci-seccomp``,
  which it is given, so a process inside meets the same refusals as under crun.
- the createRuntime hook (inotify bounds per user namespace): left out; inotify is the sentry's.
- the sysfs bind of the sandbox's namespace: refused by the gofer (EINVAL on every path); the
  sandbox gets gVisor's own sysfs, which shows no host device either.
- rlimits, cgroup limits (memory, pids, cpu on the cgroup runsc makes from ``cgroupsPath``),
  hostname, the bound /etc/hosts and resolv.conf, the overlay rootfs on the ext4 disk: taken.

After each container runsc leaves the sandbox's end of the veth without its address and routes
(its netstack took them), so every boot puts them back first (``_address_sandbox_end``).

All of a sandbox's memory is the sentry's, so at the memory limit the host's OOM killer ends the
sentry, and every process inside with it (crun's ends one process). ``inspect`` and ``list`` look
at a running sandbox's container and record one whose sentry is gone as STOPPED, as reconcile
records a sandbox whose processes ended: files kept, a resume boots it afresh.

Memory pause is runsc's ``pause`` (the cgroup freezer), as crun's without the checkpoint tools:
the sandbox stays in RAM.
runsc's own checkpoint/restore would write it to disk, but this runsc cannot checkpoint a sandbox
whose agent waits on its listening socket: the save panics with "endpoint still has waiters upon
save" (a TCP listener under epoll) and the container is lost. So no ``PAUSE_MEMORY_ON_DISK``.

Differences from crun a user can see, all from gVisor's kernel: ``uname -r`` says 4.4.0 and
``dmesg`` is gVisor's; routes are copied into the netstack at boot, so an egress change by
``update_network`` reaches the host firewall at once but the sandbox's default route only at its
next boot; this runsc answers ``statx`` with ``AT_NO_AUTOMOUNT`` (what coreutils 9's ``ls`` and
``stat`` pass) with EINVAL, so those commands fail on every path while Python's ``os.stat`` and
the agent's file API work; ``/proc/<pid>/limits`` and ``/proc/<pid>/task`` are missing. Seccomp
cannot mend that (both tried): this runsc ignores a rule's ``errnoRet`` (EPERM, never ENOSYS), and
a TRACE rule's ENOSYS makes glibc fall back to ``fstatat`` with the same flag, refused alike. The
root file system (9p to the gofer) refuses ``user.*`` extended attributes (ENOTSUP; ``/tmp``, a
tmpfs, keeps them), so the agent keeps no file metadata there. A PTY's master never reports that the
last holder of the terminal left (no EIO, no POLLHUP); the agent finds that out itself
(``runtime.agent._processes``), so a PTY session still ends with its shell.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from . import _network, _oci, host
from ._addresses import AddressRegistry
from ._oci_backend import OciBackend, Record, _policy, _reported
from ._runsc import PLATFORM, RUNSC_VERSION, RunscCommand, install_pinned
from .backend import DEFAULT_FEATURES, BackendError, Feature, SandboxInfo, State

if TYPE_CHECKING:
    from .backends import BackendOptions
    from .templates import Template

__all__ = ["FEATURES", "PLATFORM", "RUNSC_VERSION", "GvisorBackend", "open_backend", "prepare_host"]

_log = logging.getLogger(__name__)
# What ``runsc state`` says of a container whose sentry still runs (``created``: a boot in progress).
_ALIVE = ("created", "running", "paused")
_RECHECK_S = 0.5  # before a sandbox runsc did not call alive is settled as dead


class GvisorBackend(OciBackend):
    """Sandboxes as gVisor containers: ``OciBackend`` on ``runsc`` with the bundle as runsc takes it."""

    name = "gvisor"
    # No host id range of its own (see the module's docstring); memory pause is the freezer.
    features: frozenset[Feature] = DEFAULT_FEATURES - {Feature.OWN_ID_RANGE}

    def __init__(
        self,
        state_dir: Path,
        *,
        pool: _network.AddressPool | None = None,
        templates_root: Path | None = None,
        runsc: str = "runsc",
        templates: Iterable[Template] = (),
        addresses: AddressRegistry | None = None,
    ) -> None:
        self._runsc = RunscCommand(state_dir / "runsc", executable=runsc)
        super().__init__(
            state_dir,
            self._runsc,
            pool=pool,
            templates_root=templates_root,
            id_mapping=None,
            templates=templates,
            addresses=addresses,
        )

    # -- the bundle as runsc takes it ------------------------------------------------------

    def _mount_sysfs(self, record: Record, net: _network.SandboxNetwork) -> Path | None:
        return None  # the gofer refuses the bind; gVisor's own sysfs shows no host device

    def _container_plan(self, plan: _oci.ContainerPlan) -> _oci.ContainerPlan:
        # An absolute cgroup path: runsc reads a relative one under its caller's own cgroup, per controller.
        cgroup = "/" + plan.cgroup_path.lstrip("/")
        return dataclasses.replace(plan, userns_limits_hook=False, enosys_rules=False, cgroup_path=cgroup)

    # -- booting -----------------------------------------------------------------------------

    async def _boot(self, record: Record) -> None:
        await asyncio.to_thread(self._address_sandbox_end, record)
        await super()._boot(record)

    def _address_sandbox_end(self, record: Record) -> None:
        """The sandbox's end of the veth configured again (a container before took it); idempotent."""
        assert record.network is not None
        net = _network.SandboxNetwork.from_record(record.network)
        lines = (
            "link set dev lo up\n"
            f"addr replace {net.sandbox_ip}/{net.subnet.prefixlen} dev {net.sandbox_if}\n"
            f"link set dev {net.sandbox_if} up\n"
        )
        proc = subprocess.run(
            ["ip", "-n", net.netns, "-batch", "-"], input=lines, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise BackendError(f"addressing the network of {record.sandbox_id}: {proc.stderr.strip()[-300:]}")
        # The default route (and the firewall's view) as the record's egress rules want them.
        _network.set_policy(net, egress=bool(record.spec["egress"]), policy=_policy(record.spec))

    # -- a sandbox whose sentry died --------------------------------------------------------

    async def inspect(self, sandbox_id: str) -> SandboxInfo:
        await self._settle_if_dead(sandbox_id)
        return await super().inspect(sandbox_id)

    async def list(self) -> list[SandboxInfo]:
        infos = await super().list()
        running = [info.sandbox_id for info in infos if info.state is State.RUNNING]
        if [sandbox_id for sandbox_id in running if await self._settle_if_dead(sandbox_id)]:
            infos = await super().list()
        return infos

    async def _settle_if_dead(self, sandbox_id: str) -> bool:
        """A running sandbox whose sentry is gone becomes STOPPED, as reconcile records one; True if it did.

        All of a sandbox's memory is its sentry's, so the host's OOM killer, acting on the sandbox's
        memory limit, ends the sentry and with it every process inside (under crun it ends one
        process). The files stay; a resume boots the sandbox afresh on them.
        """
        lock = self._lock(sandbox_id)
        if lock.locked():
            return False  # an operation in flight settles the state itself
        with _reported(f"inspecting sandbox {sandbox_id}"):
            async with lock:
                record = self._record(sandbox_id)
                if record.state != State.RUNNING.value or record.container is None or record.releasing:
                    return False
                # Asked twice: one unanswered ``runsc state`` (busy, say, while other sandboxes start on
                # a loaded host) must not end a sandbox that lives; a sentry that died stays dead.
                first = await asyncio.to_thread(self._runtime.status, record.container)
                if first in _ALIVE:
                    return False
                await asyncio.sleep(_RECHECK_S)
                second = await asyncio.to_thread(self._runtime.status, record.container)
                if second in _ALIVE:
                    _log.info("sandbox %s: runsc answered %r, then %r: kept", sandbox_id, first, second)
                    return False
                _log.warning(
                    "sandbox %s: its gVisor kernel is gone (out of memory?; runsc says %r); recorded stopped",
                    sandbox_id,
                    second,
                )
                await self._stop_container(record)  # runsc's state and any gofer left
                record.state = State.STOPPED.value
                self._save(record)
                return True


# What the ``gvisor`` entry provides, read by reports and benchmarks without opening a backend.
FEATURES: frozenset[Feature] = GvisorBackend.features


def open_backend(options: BackendOptions) -> GvisorBackend:
    """The ``gvisor`` entry of ``runtime.backends``."""
    return GvisorBackend(options.state_dir, templates_root=options.templates_root, templates=options.templates)


def prepare_host(say: Callable[[str], None]) -> None:
    """What crun's host needs (nftables, iproute2, disks, cgroups: ``runtime.host.prepare``) plus the pinned runsc."""
    host.prepare(say=say)
    install_pinned(say)
    if not shutil.which("runsc"):
        raise host.HostNotReadyError(f"runsc is not on PATH after installing {RUNSC_VERSION}")
