"""What every OCI-runtime backend shares: records, network, layers, bundle, lifecycle, snapshots.

Per sandbox, under ``<state>/sandboxes/<id>/``::

    record.json   every resource the sandbox owns, written *before* the resource is made
    disk.img      the sandbox's disk: a sparse ext4 image of the disk limit (``runtime._disk``)
    disk/         its mount point, holding upper/ and work/: the overlay's writable layer
                  (kept, mounted, across a filesystem-only pause)
    bundle/       config.json, hosts, resolv.conf, rootfs/ (the overlay mount point)
    logs/         the sandbox's output, rotated and bounded while it runs (``sandbox.log``, ``.1``)
    memory/       a checkpointed sandbox's processes and memory (CRIU's images), while it is paused

and ``<state>/boot-images/`` holds the templates' boot images (``_boot_images``).

``OciBackend`` is the whole ``Backend`` but for the container runtime's command, which it
reaches through ``ContainerRuntime``: create a container from a bundle, start, freeze, thaw,
delete it, ask for its status. ``runtime.crun`` is that seam for crun; gVisor's ``runsc``
takes the same arguments and is one more small module of the same shape.

Lifecycle: create = record + disk + network + id range + idmapped lowers + volume views + overlay + sysfs +
bundle; start = the
runtime's create and start, then wait for the agent's ``/health`` (``_health``: probes that the
agent's ready signal cuts short), or the restore of a memory snapshot's or the template's boot
image's processes (``_boot_images``); pause(memory) = a checkpoint to ``memory/`` where the runtime
can (``checkpoint_config``; the runtime then makes the network namespace and ``_plug`` names it),
else freeze (the cgroup freezer); pause(filesystem) = delete the container, keeping ``upper/``;
resume = restore, thaw, or a fresh create + start on the same writable layer; kill marks the record releasing,
releases everything in reverse order (retried when it fails) and removes the record last.
reconcile (after a crash or a host restart) never deletes a recorded sandbox's files: it makes
again what a sandbox lost (``_restore``), turns one whose processes are gone into STOPPED, and
moves one it cannot make again to ``<state>/quarantine/<id>/``.

Errors: public methods raise only the ``runtime.backend`` tree. An ``OSError``, a failed
subprocess or a malformed value met on the way comes out as ``BackendError`` saying what was
being done (``_reported``); the network's and the runtime's own errors already are ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import resource
import secrets
import shutil
import subprocess
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import httpx

from contract.protocol import ENVD_PORT

from . import (
    _addresses,
    _boot_images,
    _criu_images,
    _criu_netns,
    _disk,
    _health,
    _hostfs,
    _idmap,
    _idranges,
    _network,
    _oci,
    _sharing,
)
from ._threads import to_thread_to_the_end
from .agent import ACCESS_TOKEN_HASH_FILE, READY_FD_ENV, SHARE_MEMORY_ENV
from .backend import (
    DEFAULT_FEATURES,
    Action,
    BackendError,
    Feature,
    Limits,
    Metrics,
    ReconcileReport,
    SandboxInfo,
    SandboxNotFoundError,
    SandboxRuntimeError,
    SandboxSpec,
    State,
    TemplateNotFoundError,
    TransitionError,
    next_state,
)
from .templates import Template, ensure_template, register_template_user, templates_dir

CGROUP_PARENT = "e2b-compat"
_CGROUP_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "cpuset", "devices", "freezer", "blkio", "hugetlb")
_RUNTIME_CHILD_CGROUPS = (".proxy-crun",)  # crun 1.21's, left by a restore that failed
_MEMORY = "memory"  # a checkpointed sandbox's processes and memory, in its folder
_IMAGES_GONE = ".memory-gone-"  # restored images being removed in the background (``_discard_images``)
_LAST_SNAPSHOT = "last-snapshot"  # in a sandbox's folder: its newest snapshot's id, to share files with
_RELEASED = "released"  # in a snapshot's folder: nobody creates from it again; it goes once nothing stands on it
_TRANSIENT = "transient"  # in a snapshot's folder: a fork's, released after its creates or at the next reconcile
_METADATA = "e2b"  # in a bundle: the folder seen read-only at /run/e2b (the sandbox's identity)
_EMPTY = "empty"  # <state>/empty: the folder bound read-only over masked directories (``_masking``)
_KILL_ATTEMPTS = 4  # a failing release is tried this often, pausing 0.25, 0.5, 1 s between
_KILL_BACKOFF_S = 0.25
QUARANTINE = "quarantine"  # <state>/quarantine/<id>/: what reconcile could not re-create, files kept

_T = TypeVar("_T")
_U = TypeVar("_U")
_log = logging.getLogger(__name__)


class _UnrecoverableError(Exception):
    """A recorded sandbox cannot be re-created (a layer or its writable layer is gone): set it aside."""


class ContainerRuntime(Protocol):
    """An OCI runtime's command line, as far as the backend needs it (crun; runsc takes the same).

    ``create`` makes the container from ``bundle`` with its output going to ``log`` (rotated
    to ``<log>.1`` and bounded while it runs: ``_hostfs.log_writer``), with the root at
    ``bundle/rootfs`` allowing setuid inside though the host's mount of it is nosuid
    (``_hostfs.with_setuid_root``), and
    starts the container's init in a session of its own: in the caller's, a signal to the
    caller's process group (Ctrl-C, a supervisor stopping the server) would reach every
    sandbox. ``start`` runs the bundle's process; ``freeze`` and ``thaw`` stop and continue
    every process in the container. Those four raise ``BackendError`` when the runtime fails.
    ``delete`` kills and removes a container, and is fine with one that is already gone; it
    waits first for a CRIU that holds the container (a checkpoint a killed server left running);
    ``status`` is the runtime's word for a container's state (``created``, ``running``,
    ``paused``, ``stopped``), or None when it does not know it; ``container_names`` lists every
    container under its root (``BackendError`` when it cannot). These three block: the backend
    calls them from worker threads. The others run in a process group of their own and never
    outlive their caller: one cancelled meanwhile (a server stopping) waits for the command
    first, since the sandbox's lock goes with it, and a command past its bound is ended with
    its group (``BackendError``); crun's are ``runtime.crun.CrunCommand``'s.

    A runtime that ``passes_ready_fd`` gives ``create``'s ``ready_fd`` to the container's init
    as its descriptor 3 (crun's ``--preserve-fds``), which the init's child, the agent, inherits:
    the agent signals on it once it listens (``runtime.agent.READY_FD_ENV``).
    """

    name: str  # the command, for messages
    root: Path  # the runtime's own state folder (created by the backend)
    passes_ready_fd: bool

    async def create(self, bundle: Path, container: str, log: Path, *, ready_fd: int | None = None) -> None: ...

    async def start(self, container: str) -> None: ...

    async def freeze(self, container: str) -> None: ...

    async def thaw(self, container: str) -> None: ...

    def delete(self, container: str) -> None: ...

    def status(self, container: str) -> str | None: ...

    def container_names(self) -> list[str]: ...

    def pid(self, container: str) -> int: ...

    async def checkpoint(self, container: str, images: Path, *, config: Path, leave_running: bool = False) -> None: ...

    async def restore(self, bundle: Path, container: str, log: Path, images: Path, *, config: Path) -> int: ...


@dataclass
class Record:
    """What a sandbox owns; persisted before each resource is created (crash safety)."""

    sandbox_id: str
    template: str
    lowers: list[str]
    state: str
    network: dict[str, Any] | None = None
    idmapped: list[str] = field(default_factory=list)  # idmapped binds of lowers, and the sysfs view (bundle/sys)
    ids: int | None = None  # first host id of the sandbox's own id range (runtime._idranges)
    mounted: bool = False
    container: str | None = None
    disk: str | None = None  # the disk image holding upper/ and work/ (runtime._disk); None: the home's
    spec: dict[str, Any] = field(default_factory=dict)
    releasing: bool = False  # a kill began: reconcile finishes the release, never re-creates it
    memory: str | None = None  # paused with its processes written here (a checkpoint); resume restores them

    @staticmethod
    def load(path: Path) -> Record:
        return Record(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        _hostfs.write_whole(path, json.dumps(self.__dict__, indent=1))


def _derived_config(base: Path, name: str, more: str) -> Path:
    """CRIU's option file ``base`` with ``more`` options, beside it as ``<base>-<name>.conf``."""
    derived = base.with_name(f"{base.stem}-{name}.conf")
    _hostfs.write_whole(derived, base.read_text() + more)
    return derived


def _bound_user_namespace(pid: int) -> None:
    """Give the user namespace of ``pid`` the bounds the createRuntime hook gives a created sandbox."""
    _hostfs.run(*_oci.userns_limits_argv(pid))


@contextlib.contextmanager
def _reported(what: str) -> Iterator[None]:
    """The runtime's own errors pass; what the OS or a command raised becomes a BackendError saying ``what``."""
    try:
        yield
    except SandboxRuntimeError:
        raise
    except (OSError, subprocess.SubprocessError, httpx.HTTPError, ValueError) as exc:
        raise BackendError(f"{what}: {exc}") from exc


class OciBackend:
    """A ``Backend`` on an OCI runtime: everything but the runtime's command (``ContainerRuntime``)."""

    name = "oci"
    # The cgroup freezer keeps a paused sandbox in RAM: memory on disk needs the runtime's checkpoint.
    features: frozenset[Feature] = DEFAULT_FEATURES

    def __init__(
        self,
        state_dir: Path,
        container_runtime: ContainerRuntime,
        *,
        pool: _network.AddressPool | None = None,
        templates_root: Path | None = None,
        id_mapping: _idmap.Mapping | None = _idmap.DEFAULT_MAPPING,  # its size; None: sandbox root is host root
        templates: Iterable[Template] = (),  # already built: used as they are, never looked up again
        addresses: _addresses.AddressRegistry | None = None,  # default: the host's one registry
        id_ranges: _idranges.IdRangeRegistry | None = None,  # default: the host's one registry
        share_agent_memory: bool = False,  # the runtime starts the agent at a fixed layout (``runtime._ksm``)
        runtime_netns: bool = False,  # the runtime makes the network namespace (see below)
        checkpoint_config: Path | None = None,  # CRIU's options: a memory pause checkpoints (needs runtime_netns)
        boot_images: bool = False,  # first starts restore a booted agent of the template (needs checkpoint_config)
    ) -> None:
        self._dir = state_dir
        if checkpoint_config is not None and not runtime_netns:
            raise ValueError("a checkpoint needs the network namespace the runtime makes")
        self._checkpoint_config = checkpoint_config
        # Boot images (``_boot_images``): made in the background after a template's first cold
        # start, one at a time per template; a key whose images failed to restore is not made again.
        self._boot_images = _boot_images.BootImages(state_dir) if boot_images and checkpoint_config else None
        self._boot_making: dict[str, asyncio.Task[None]] = {}
        self._boot_sandboxes: set[str] = set()  # the private sandboxes of the images being made
        self._boot_refused: set[str] = set()
        # CRIU's option files for restores, beside the checkpoint's (which dumps with it as it is).
        # A restore makes the user namespace anew, unbounded, and runs no createRuntime hook:
        # processes that ran a tenant's code are bounded by CRIU's action script before they
        # resume (``_oci.restore_limits_script``; ~3 ms for each of a restore's seven stages);
        # a boot image's, which never ran anyone's, by the backend once restored, before its
        # address is published (``_bound_user_namespace``), so a create pays no stage scripts.
        # A network namespace as a new one's (a boot image's, or a checkpoint marked by
        # ``_mark_netns_as_new``) holds its loopback only: CRIU makes it empty instead of
        # restoring it (~25 ms less, spawning no ip or iptables) and the plug sets it up as at a
        # boot. Other checkpoints restore theirs, which may hold the tenant's own addresses,
        # routes and rules.
        self._replay_config: Path | None = None
        self._as_new_config: Path | None = None
        self._boot_restore_config: Path | None = None
        if checkpoint_config is not None:
            script = checkpoint_config.with_name("criu-restore-limits.sh")
            _hostfs.write_whole(script, "#!/bin/sh\n" + _oci.restore_limits_script(), mode=0o755)
            bounding = f"action-script {script}\n"
            self._replay_config = _derived_config(checkpoint_config, "restore", bounding)
            self._as_new_config = _derived_config(checkpoint_config, "restore-as-new", "empty-ns net\n" + bounding)
            if self._boot_images is not None:
                self._boot_restore_config = _derived_config(checkpoint_config, "boot-image", "empty-ns net\n")
        # With ``runtime_netns`` the runtime makes the sandbox's network namespace inside the
        # sandbox's user namespace, and the host names it and plugs the veth in between the
        # runtime's create and start (``_plug``), as for Docker's. A checkpoint needs this: CRIU
        # dumps only namespaces that belong to the sandbox's user namespace. Without it the host
        # makes the namespace first (owned by the host's user namespace) and the runtime joins it.
        self._runtime_netns = runtime_netns
        self._runtime = container_runtime
        self._share_agent_memory = share_agent_memory
        self._mapping = id_mapping
        # Each sandbox maps onto a host id range of its own, leased host-wide like its subnet.
        size = id_mapping.size if id_mapping else _idranges.RANGE_SIZE
        self._ids = id_ranges or _idranges.IdRangeRegistry(size=size)
        self._pool = pool or _network.AddressPool()
        # Subnets come from the host-wide registry, never from this backend's own records: two
        # servers on one host, or two creates of one server in worker threads, must never share one.
        self._addresses = addresses or _addresses.AddressRegistry(pool=self._pool.network)
        self._owner = str(state_dir.absolute())
        self._templates_root = templates_root
        self._locks: dict[str, asyncio.Lock] = {}
        # Templates are immutable once built; resolving one hashes the source tree, so once per name.
        self._templates: dict[str, tuple[list[str], tuple[str, ...]]] = {
            built.name: ([str(built.rootfs)], tuple(built.agent_command)) for built in templates
        }
        with _reported(f"setting up the {self.name} backend in {state_dir}"):
            if id_mapping is not None:
                # Each sandbox makes its own namespace; one now says at once whether this host can.
                os.close(_idmap.userns_fd(_idmap.Mapping(_idranges.FIRST_ID, id_mapping.size)))
                _hostfs.check_traversable(state_dir)
            # Other host users may pass through to a bundle (the sandbox's root must) but list nothing;
            # snapshots are reached only by root (through idmapped binds), so nobody else gets in.
            for folder, mode in (("sandboxes", 0o711), ("snapshots", 0o700)):
                (self._dir / folder).mkdir(parents=True, exist_ok=True)
                os.chmod(self._dir / folder, mode)
            for lowers, _command in self._templates.values():
                self._use_templates_of(Path(lowers[0]).parent.parent)
            self._runtime.root.mkdir(parents=True, exist_ok=True)
            _network.ensure_host_firewall()  # isolation rules every sandbox network relies on

    # -- paths and records ------------------------------------------------------

    def _home(self, sandbox_id: str) -> Path:
        if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
            raise SandboxNotFoundError(sandbox_id)
        return self._dir / "sandboxes" / sandbox_id

    def _record(self, sandbox_id: str) -> Record:
        path = self._home(sandbox_id) / "record.json"
        try:
            return Record.load(path)
        except FileNotFoundError:
            raise SandboxNotFoundError(sandbox_id) from None

    def _save(self, record: Record) -> None:
        record.save(self._home(record.sandbox_id) / "record.json")

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def _info(self, record: Record) -> SandboxInfo:
        host = None
        if record.state == State.RUNNING.value and record.network is not None:
            host = str(_network.SandboxNetwork.from_record(record.network).sandbox_ip)
        return SandboxInfo(record.sandbox_id, record.template, State(record.state), host)

    def _records(self) -> list[Record]:
        out = []
        for path in sorted((self._dir / "sandboxes").glob("*/record.json")):
            with contextlib.suppress(OSError, ValueError, TypeError):
                out.append(Record.load(path))
        return out

    # -- templates ------------------------------------------------------------------

    def _lowers(self, template: str) -> tuple[list[str], tuple[str, ...]]:
        """Overlay lower layers (top first) and the agent command for a template or snapshot."""
        snapshot = self._dir / "snapshots" / template / "manifest.json"
        if snapshot.exists():
            manifest = json.loads(snapshot.read_text())
            return [str(snapshot.parent / "upper"), *manifest["lowers"]], tuple(manifest["agent_command"])
        if template.startswith("snap-"):
            raise TemplateNotFoundError(template)
        if template in self._templates:
            return self._templates[template]
        self._use_templates_of(templates_dir(self._templates_root))  # before a build may prune
        try:
            built: Template = ensure_template(template, cache_root=self._templates_root)
        except Exception as exc:  # the builder's own error says what failed
            raise TemplateNotFoundError(f"{template}: {exc}") from exc
        self._templates[template] = ([str(built.rootfs)], tuple(built.agent_command))
        self._use_templates_of(templates_dir(self._templates_root))  # now serving it: keep it from pruning
        return self._templates[template]

    def _use_templates_of(self, folder: Path) -> None:
        """Tell pruning in ``folder`` to read this backend's records: it never removes a layer they name."""
        with contextlib.suppress(OSError):  # a read-only cache is never pruned by us either
            served = [lowers[0] for lowers, _command in self._templates.values()]
            register_template_user(folder, self._dir, serving=served)

    # -- creating -------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        with _reported(f"creating sandbox {spec.sandbox_id}"):
            home = self._home(spec.sandbox_id)
            if home.exists():
                raise TransitionError(f"sandbox {spec.sandbox_id} already exists")
            lowers, command = await asyncio.to_thread(self._lowers, spec.template)
            async with self._lock(spec.sandbox_id):
                home.mkdir(parents=True)
                for name in ("bundle/rootfs", "logs"):  # upper/ and work/ are made on the sandbox's disk
                    (home / name).mkdir(parents=True, exist_ok=True)
                record = Record(
                    spec.sandbox_id,
                    spec.template,
                    lowers,
                    State.CREATED.value,
                    spec={
                        "hostname": spec.hostname or spec.sandbox_id[:63],
                        "env": spec.env,
                        "limits": spec.limits.__dict__,
                        "command": list(command),
                        "egress": spec.allow_internet_access,
                        "allow_out": list(spec.allow_out),
                        "deny_out": list(spec.deny_out),
                        "volumes": [{"source": v.source, "target": v.target} for v in spec.volumes],
                        "access_token_hash": spec.access_token_hash,
                    },
                )
                self._save(record)
                try:  # a cancelled create releases once its provision ended, not while it runs on
                    await to_thread_to_the_end(functools.partial(self._provision, record))
                except BaseException:
                    await asyncio.to_thread(self._release, record)
                    raise
            return self._info(record)

    def _provision(self, record: Record) -> None:
        home = self._home(record.sandbox_id)
        record.disk = str(home / "disk.img")
        # A lease whose record was never saved (a crash right here) is ended by reconcile().
        net = _network.plan(record.sandbox_id, self._addresses.allocate(self._owner, record.sandbox_id))
        record.network = net.to_record()
        self._save(record)  # both recorded before either exists
        # The disk and the network namespace need nothing of each other (a few host commands each,
        # ~13 and ~21 ms): the namespace is made in a second thread while this one makes the disk.
        # Both have ended before anything is raised, so a release never races either.
        if self._runtime_netns:  # the runtime makes it; _boot plugs the veth in
            self._ensure_disk(record)
        else:
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="provision") as helper:
                network = helper.submit(
                    _network.create, net, egress=bool(record.spec["egress"]), policy=_policy(record.spec)
                )
                try:
                    self._ensure_disk(record)
                finally:
                    concurrent.futures.wait([network])
                network.result()
        lowers = self._map_lowers(record)
        self._map_volumes(record)
        record.mounted = True
        self._save(record)
        layer = self._layer(record)
        _hostfs.mount_overlay(lowers, layer / "upper", layer / "work", home / "bundle" / "rootfs")
        self._write_bundle(record, net)

    def _layer(self, record: Record) -> Path:
        """The folder holding the writable layer's ``upper/`` and ``work/``: the sandbox's disk when it has one."""
        home = self._home(record.sandbox_id)
        return home / "disk" if record.disk else home

    def _ensure_disk(self, record: Record) -> None:
        """The sandbox's disk exists and is mounted with ``upper/`` and ``work/`` on it; idempotent.

        Reconcile calls this after a host reboot (mounts gone, image kept); it never reformats
        an image that exists. A record without a disk (made before disks) has nothing to do.
        """
        if not record.disk:
            return
        layer = self._layer(record)
        _disk.ensure(Path(record.disk), layer, _disk_mb(record))
        for name in ("upper", "work"):
            (layer / name).mkdir(exist_ok=True)

    def _sandbox_mapping(self, record: Record) -> _idmap.Mapping | None:
        """The sandbox's id mapping; a record from before per-sandbox ranges keeps the old shared one."""
        if self._mapping is None:
            return None
        return _idmap.Mapping(record.ids if record.ids is not None else _idmap.LEGACY_BASE, self._mapping.size)

    def _idmapped(self, lower: str) -> bool:
        """Whether the overlay sees a lower through an idmapped bind: templates, and snapshots kept 0-based."""
        if not lower.startswith(str(self._dir / "snapshots")):
            return True
        with contextlib.suppress(OSError, ValueError):
            return bool(json.loads((Path(lower).parent / "manifest.json").read_text()).get("zero_based"))
        return False  # a snapshot from before per-sandbox ranges: owners already shifted

    def _map_lowers(self, record: Record) -> list[str]:
        """Lower layers as the overlay sees them: read-only binds idmapped into the sandbox's own id range.

        Leases the range first (recorded before use). Templates and snapshot layers hold 0-based
        owners (a snapshot is shifted back when taken), so one bind per lower gives this sandbox
        its own owners. The writable layer and the sandbox's folder belong to the sandbox's root.
        """
        if self._mapping is None:
            return record.lowers
        home = self._home(record.sandbox_id)
        if record.ids is None:
            # A lease whose record was never saved (a crash right here) is ended by reconcile().
            record.ids = self._ids.allocate(self._owner, record.sandbox_id)
            self._save(record)
        mapping = self._sandbox_mapping(record)
        assert mapping is not None
        mapped = []
        ns_fd = _idmap.userns_fd(mapping)
        try:
            for index, lower in enumerate(record.lowers):
                if not self._idmapped(lower):
                    mapped.append(lower)
                    continue
                target = home / "lowers" / str(index)
                target.mkdir(parents=True, exist_ok=True)
                record.idmapped.append(str(target))
                self._save(record)  # recorded before it exists
                _idmap.idmapped_bind(lower, str(target), ns_fd)
                mapped.append(str(target))
        finally:
            os.close(ns_fd)
        self._own_layer(record, mapping)
        return mapped

    def _volume_views(self, record: Record) -> list[tuple[str, str, str]]:
        """(volume folder, where the sandbox sees it, the host folder its bind mounts) per volume.

        With an id mapping the bind is of an idmapped view in the sandbox's folder (the volume's
        owners shifted into the sandbox's ids); without one (gVisor's sandbox root is host root
        inside its own kernel) it is of the volume's folder itself.
        """
        home = self._home(record.sandbox_id)
        return [
            (
                str(entry["source"]),
                str(entry["target"]),
                str(home / "volumes" / str(index)) if self._mapping is not None else str(entry["source"]),
            )
            for index, entry in enumerate(record.spec.get("volumes", []))
        ]

    def _map_volumes(self, record: Record) -> None:
        """Each volume's view in the sandbox's ids, writable (nosuid, nodev); idempotent, as reconcile needs."""
        mapping = self._sandbox_mapping(record)
        for source, _target, view in self._volume_views(record):
            if not os.path.isdir(source):  # the server mounts its volumes before it creates or reconciles
                raise BackendError(f"{record.sandbox_id}: volume folder {source} is not there")
            if mapping is None or _hostfs.is_mount(view):
                continue
            Path(view).mkdir(parents=True, exist_ok=True)
            if view not in record.idmapped:
                record.idmapped.append(view)
                self._save(record)  # recorded before it exists
            ns_fd = _idmap.userns_fd(mapping)
            try:
                _idmap.idmapped_bind(source, view, ns_fd, read_only=False)
            finally:
                os.close(ns_fd)

    def _own_layer(self, record: Record, mapping: _idmap.Mapping) -> None:
        """The writable layer is the sandbox root's; its folder is closed to other host users.

        The folder belongs to the sandbox's root (0700): it must walk to ``bundle/rootfs`` and
        nobody else may, so no other host user reaches its files or its setuid programs.
        """
        home = self._home(record.sandbox_id)
        for name in ("upper", "work"):
            os.chown(self._layer(record) / name, mapping.base, mapping.base)
        os.chown(home, mapping.base, mapping.base)
        os.chmod(home, 0o700)  # the record, logs and bundle inside are reached through it only
        with contextlib.suppress(FileNotFoundError):
            os.chmod(home / "logs", 0o700)  # root's: the sandbox's root has no business reading its own log

    def _mount_sysfs(self, record: Record, net: _network.SandboxNetwork) -> Path | None:
        """A sysfs of the sandbox's network namespace at ``bundle/sys``, bound over the sandbox's ``/sys``.

        A subclass whose runtime brings a kernel of its own (gVisor) returns None: that kernel's sysfs.

        The runtime cannot mount one itself (the namespace belongs to the host's user namespace)
        and falls back to binding the host's ``/sys``, whose ``class/net`` and ``devices/*/net``
        show the host's interfaces. Mounted by root inside the namespace, sysfs shows its own only.
        """
        if self._runtime_netns:  # the namespace is the sandbox's: the runtime mounts its sysfs
            return None
        target = self._home(record.sandbox_id) / "bundle" / "sys"
        if _hostfs.is_mount(str(target)):
            return target
        target.mkdir(exist_ok=True)
        if str(target) not in record.idmapped:
            record.idmapped.append(str(target))
            self._save(record)  # recorded before it exists
        _hostfs.mount_sysfs(str(net.netns_path), target)
        return target

    def _write_bundle(self, record: Record, net: _network.SandboxNetwork) -> None:
        bundle = self._home(record.sandbox_id) / "bundle"
        hostname = record.spec["hostname"]
        mapping = self._sandbox_mapping(record)
        sysfs = self._mount_sysfs(record, net)
        (bundle / "hosts").write_text(_oci.hosts_file(hostname))
        metadata = self._write_metadata(record)
        (bundle / "resolv.conf").write_text(_oci.resolv_file([]))
        plan = _oci.ContainerPlan(
            rootfs=str(bundle / "rootfs"),
            netns_path=None if self._runtime_netns else str(net.netns_path),
            device_binds=self._runtime_netns,
            sysfs=str(sysfs) if sysfs else None,
            hostname=hostname,
            hosts_file=str(bundle / "hosts"),
            resolv_file=str(bundle / "resolv.conf"),
            cgroup_path=f"{CGROUP_PARENT}/{record.sandbox_id}",
            command=tuple(record.spec["command"]),
            env=self._agent_env(record),
            limits=_limits(record),
            id_mapping=mapping.oci() if mapping is not None else None,
            volumes=tuple((target, view) for _source, target, view in self._volume_views(record)),
            open_files=min(_oci.NOFILE_LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
            metadata_dir=str(metadata),
            **self._masking,
        )
        (bundle / "config.json").write_text(json.dumps(_oci.config(self._container_plan(plan)), indent=1))

    @functools.cached_property
    def _masking(self) -> dict[str, Any]:
        """How masked directories are hidden: for checkpoints, binds of one empty folder (``_oci.MASKED_PATHS``).

        Only where CRIU checkpoints the sandbox (a bind is external to it, a tmpfs is dumped and
        restored through tar); the other runtimes keep their own masks. A directory the host
        lacks is left to the runtime, which skips what is not there. Host facts: looked at once.
        """
        if not self._runtime_netns:
            return {}
        empty = self._dir / _EMPTY
        if not empty.is_dir():
            empty.mkdir(mode=0o555, exist_ok=True)
        return {
            "masked_dirs": tuple(path for path in _oci.MASKED_PATHS if os.path.isdir(path)),
            "empty_dir": str(empty),
        }

    def _write_metadata(self, record: Record) -> Path:
        """The files envd keeps in /run/e2b, and the token's hash its metadata service publishes.

        The agent reads them at each /init: an agent restored from another sandbox's memory learns
        its new identity there, and a new token is accepted when its hash matches this one.
        """
        folder = self._home(record.sandbox_id) / "bundle" / _METADATA
        folder.mkdir(mode=0o755, exist_ok=True)
        files = {
            ".E2B_SANDBOX": "true",
            ".E2B_SANDBOX_ID": record.sandbox_id,
            ".E2B_TEMPLATE_ID": record.template,
            ACCESS_TOKEN_HASH_FILE: record.spec.get("access_token_hash"),
        }
        for name, value in files.items():
            path = folder / name
            if value is None:
                path.unlink(missing_ok=True)
                continue
            _hostfs.write_whole(path, value, 0o444)
        return folder

    def _agent_env(self, record: Record) -> dict[str, str]:
        env = {"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": record.sandbox_id, "E2B_TEMPLATE_ID": record.template}
        if self._runtime.passes_ready_fd:
            env[READY_FD_ENV] = "3"
        if self._share_agent_memory:
            # With a fixed hash seed the agents' dictionaries are laid out alike too (agents that
            # run with -I, those of image templates, ignore it, and share less).
            env[SHARE_MEMORY_ENV] = "1"
            env["PYTHONHASHSEED"] = "0"
        return env

    def _container_plan(self, plan: _oci.ContainerPlan) -> _oci.ContainerPlan:
        """The bundle's plan as this backend's runtime takes it; a runtime that refuses a part adapts it here."""
        return plan

    # -- running, pausing, resuming -------------------------------------------------------

    async def start(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"starting sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                next_state(State(record.state), Action.START)
                images = self._snapshot_memory(record.template)
                boot_key = self._boot_key(record)
                if images is not None:
                    await self._continue_snapshot(record, images)
                elif boot_key is not None:
                    await self._start_from_boot_image(record, boot_key)
                else:
                    await self._boot(record)
                record.state = State.RUNNING.value
                self._save(record)
            return self._info(record)

    async def _new_container(self, record: Record) -> str:
        """A new container's name for the sandbox, put on its record (not yet saved).

        What a boot or restore cut short left there (its caller cancelled once the runtime's
        command ended) is stopped first, not overwritten: its log writer holds the sandbox's log
        lock while it lives, and the new container's would wait on it for good.
        """
        await self._stop_container(record)
        record.container = _container_name(record.sandbox_id)
        return record.container

    async def _boot(self, record: Record) -> None:
        home = self._home(record.sandbox_id)
        container = await self._new_container(record)
        self._save(record)
        log = home / "logs" / "sandbox.log"
        assert record.network is not None
        net = _network.SandboxNetwork.from_record(record.network)
        with _health.ready_signal(self._runtime.passes_ready_fd) as ready:
            try:
                await self._runtime.create(
                    home / "bundle", container, log, ready_fd=None if ready is None else ready.write_fd
                )
            finally:
                if ready is not None:
                    ready.close_write_end()  # the container's init holds its own copy now
            if self._runtime_netns:
                # Side by side: the agent needs no network to start, only to be probed below.
                await _both(asyncio.to_thread(self._plug, record, container), self._runtime.start(container))
            else:
                await self._runtime.start(container)
            try:
                await _health.wait_healthy(f"http://{net.sandbox_ip}:{ENVD_PORT}/health", log, ready)
            except BackendError as exc:  # what was there when it gave up: the process, the namespace
                status = await asyncio.to_thread(self._runtime.status, container)
                netns = "present" if net.netns_path.exists() else "gone"
                raise BackendError(f"{exc} (container {status or 'gone'}, network namespace {netns})") from None

    async def pause(self, sandbox_id: str, *, memory: bool) -> SandboxInfo:
        with _reported(f"pausing sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                target = next_state(State(record.state), Action.PAUSE_MEMORY if memory else Action.PAUSE_FILESYSTEM)
                assert record.container is not None
                if memory and self._checkpoint_config is not None:
                    await self._checkpoint(record, self._checkpoint_config)
                elif memory:
                    await self._runtime.freeze(record.container)
                else:
                    await self._stop_container(record)
                record.state = target.value
                self._save(record)
            return self._info(record)

    async def _checkpoint(self, record: Record, config: Path) -> None:
        """The sandbox's processes and memory written to ``memory/`` in its folder; its RAM is freed.

        The veth pair goes first: CRIU re-creates a veth's host end only through a request this
        kernel refuses (EOPNOTSUPP), so the checkpoint holds a namespace with its loopback only
        and a restore plugs a new pair in, as a boot does. Connections are not kept (CRIU's
        ``tcp-close``); listening sockets are. When the checkpoint fails, the container runs on
        unharmed: its network is plugged back and it is frozen instead (logged), which keeps
        the memory pause's promise, not the freeing.
        """
        assert record.container is not None
        assert record.network is not None
        images = self._home(record.sandbox_id) / _MEMORY
        await asyncio.to_thread(shutil.rmtree, images, True)  # what a failed attempt left
        images.mkdir(mode=0o700)
        # Frozen here first, in a few ms: CRIU, finding a cgroup v1 freezer thawed, freezes it
        # itself and then sleeps 100 ms before it looks again, on every pause. A frozen one it
        # seizes at once, thaws to dump, and kills after (a failed dump leaves it frozen).
        await self._runtime.freeze(record.container)
        net = _network.SandboxNetwork.from_record(record.network)
        await asyncio.to_thread(functools.partial(_network.destroy, net, keep_rules=True))  # a plug sets them again
        try:
            await self._runtime.checkpoint(record.container, images, config=config)
        except BackendError as exc:
            await self._checkpoint_failed(record, images, str(exc))
            return
        except asyncio.CancelledError:
            # The checkpoint ran to its end first (``crun._finished``). The pause is settled and
            # recorded either way: the server's next start finishes the pause its record began,
            # instead of finding a running sandbox gone, or one frozen without its network.
            if await asyncio.to_thread(self._runtime.status, record.container) is None:
                self._checkpointed(record, images)
            else:
                await self._checkpoint_failed(record, images, "its pause was cancelled")
            record.state = State.PAUSED.value
            self._save(record)
            raise
        await asyncio.to_thread(self._checkpointed, record, images)

    def _checkpointed(self, record: Record, images: Path) -> None:
        """A checkpoint that succeeded (it ended the container): recorded, its images made restorable."""
        record.container = None
        record.memory = str(images)
        self._save(record)
        self._mark_netns_as_new(images)
        # The restore opens some images from a task just cloned into the new user namespace,
        # which may run before its id map is written and is then nobody to the host: it needs
        # search on this folder (CRIU writes the images 0644). Nobody else reaches it: the
        # sandbox's folder above is its root's, 0700.
        os.chmod(images, 0o711)  # noqa: S103 - search only, below a 0700 folder

    async def _checkpoint_failed(self, record: Record, images: Path, why: str) -> None:
        """The container, still there and frozen, plugged back in: frozen instead (logged)."""
        assert record.container is not None
        kept = self._home(record.sandbox_id) / "logs" / "dump.log"
        with contextlib.suppress(OSError):  # CRIU's account, for the operator: the images go
            os.replace(images / "dump.log", kept)
        _log.warning("checkpointing %s failed, frozen instead: %s%s", record.sandbox_id, why, _criu_errors(kept))
        await asyncio.to_thread(shutil.rmtree, images, True)
        await asyncio.to_thread(functools.partial(self._plug, record, record.container, rules_applied=True))
        if await asyncio.to_thread(self._runtime.status, record.container) != "paused":
            await self._runtime.freeze(record.container)

    async def _restore_memory(self, record: Record) -> None:
        """The checkpointed processes running again in a new container on the same files and address.

        After a host restart the mounts come back first (``_restore_for_boot``). A restore that
        fails boots the sandbox afresh on its files (logged): what a lost sandbox gets at
        reconcile, E2B's nearest to a resume whose memory is gone.
        """
        assert record.memory is not None
        await asyncio.to_thread(self._restore_for_boot, record)
        images = Path(record.memory)
        try:
            await self._restore_into_container(record, images, self._restore_config(images))
        except BackendError as exc:
            _log.warning("restoring %s from its checkpoint failed, booting it afresh: %s", record.sandbox_id, exc)
            await asyncio.to_thread(self._remove_cgroups, record.sandbox_id)
            await self._boot(record)
        # Running and rid of its images in one save: a record that still named images next to a
        # running container would be a restore cut short to the next reconcile (``_settle_record``).
        record.memory = None
        record.state = State.RUNNING.value
        self._save(record)
        self._discard_images(images)

    def _mark_netns_as_new(self, images: Path) -> None:
        """Mark a checkpoint whose network namespace is a new one's (``_criu_netns``): it restores faster.

        A boot image's is the new one compared with; without one, nothing is marked.
        """
        if self._boot_images is None:
            return
        for key in self._boot_images.names():
            reference = self._boot_images.find(key)
            if reference is not None:
                if _criu_netns.same_as_new(images, reference):
                    with contextlib.suppress(OSError):  # unmarked, it restores as it always did
                        (images / _criu_netns.AS_NEW_MARK).touch()
                return

    def _restore_config(self, images: Path) -> Path:
        """CRIU's options for restoring a checkpoint: an empty network namespace when theirs was a new one."""
        assert self._replay_config is not None
        assert self._as_new_config is not None
        if (images / _criu_netns.AS_NEW_MARK).exists():
            return self._as_new_config
        return self._replay_config

    def _discard_images(self, images: Path) -> None:
        """Restored images go: renamed at once, their ~26 MB removed in the background, off the resume's path.

        A removal a crash cut short is finished by reconcile (``_IMAGES_GONE``).
        """
        gone = images.with_name(f"{_IMAGES_GONE}{secrets.token_hex(4)}")
        try:
            os.rename(images, gone)
        except OSError:
            shutil.rmtree(images, ignore_errors=True)
            return
        asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, gone, True)

    async def _restore_into_container(
        self, record: Record, images: Path, config: Path, *, bound_after: bool = False
    ) -> None:
        """``images`` running in a new container of the sandbox, plugged in and answering ``/health``.

        ``bound_after``: the user namespace is bounded here, while the veth is plugged in, as
        ``config`` has no action script doing it (a boot image's: see ``_boot_restore_config``).

        A failure is a BackendError carrying CRIU's errors (its log is kept as
        ``logs/restore.log``), with no container left; what to do then is the caller's.
        """
        assert record.network is not None
        home = self._home(record.sandbox_id)
        container = await self._new_container(record)
        record.memory = str(images)
        self._save(record)
        log = home / "logs" / "sandbox.log"
        net = _network.SandboxNetwork.from_record(record.network)
        egress, policy = bool(record.spec["egress"]), _policy(record.spec)
        try:
            await asyncio.to_thread(self._remove_cgroups, record.sandbox_id)  # a failed restore's
            # The host firewall's entries name the veth, not the container: set while CRIU runs
            # (nft takes ~10 ms here), so only the veth itself waits for the restored namespace.
            restored, _ = await _together(
                self._runtime.restore(home / "bundle", container, log, images, config=config),
                asyncio.to_thread(functools.partial(_network.apply_rules, net, egress=egress, policy=policy)),
            )
            plugging = asyncio.to_thread(
                functools.partial(self._plug, record, container, pid=restored, rules_applied=True)
            )
            if bound_after:
                await _together(plugging, asyncio.to_thread(_bound_user_namespace, restored))
            else:
                await plugging
            await _health.wait_healthy(f"http://{net.sandbox_ip}:{ENVD_PORT}/health", log, None)
        except BackendError as exc:
            kept = home / "logs" / "restore.log"
            with contextlib.suppress(OSError):  # CRIU's account, for the operator: the images go
                os.replace(images / "restore.log", kept)
            await self._stop_container(record)  # what a restore cut short left
            raise BackendError(f"{exc}{_criu_errors(kept)}") from None
        except asyncio.CancelledError:
            # The restore ran to its end first (``crun._finished``). What it brought back goes, so
            # the images are again the only copy of those processes. Left running, it would hold
            # the log's lock, and the next resume's restore would wait for it for good.
            await self._stop_container(record)
            raise

    def _snapshot_memory(self, template: str) -> Path | None:
        """The processes and memory a snapshot kept (``snapshot(memory=True)``), when ``template`` is one."""
        if not template.startswith("snap-") or "/" in template:
            return None
        images = self._dir / "snapshots" / template / _MEMORY
        return images if images.is_dir() else None

    async def _continue_snapshot(self, record: Record, snapshot: Path) -> None:
        """A new sandbox's first start: the snapshot's processes go on in it, under its own identity.

        The images are copied into the sandbox's folder and made its own (``_criu_images``: its
        id range, its hostname); its mounts, address and /run/e2b come from its own bundle. No
        fallback to a fresh boot: a sandbox that was asked to continue processes and runs none
        would be the silent difference the clients are promised never to get.
        """
        if self._checkpoint_config is None:
            raise BackendError(f"{record.template} holds memory; this server cannot restore it")
        await self._continue_images(record, snapshot, f"the memory of {record.template}")

    async def _continue_images(self, record: Record, source: Path, what: str, *, boot_image: bool = False) -> None:
        """The processes in ``source`` (a snapshot's or a boot image's) running in the sandbox as its own."""
        assert record.network is not None
        home = self._home(record.sandbox_id)
        images = home / _MEMORY
        await asyncio.to_thread(shutil.rmtree, images, True)
        # Linked, not copied: the two images rewritten are replaced (new files), the rest only read.
        try:
            await asyncio.to_thread(shutil.copytree, source, images, copy_function=_link_or_copy)
        except OSError as exc:  # the source went meanwhile (a released snapshot, a dropped boot image)
            await asyncio.to_thread(shutil.rmtree, images, True)
            raise BackendError(f"{what} cannot be read: {str(exc)[:300]}") from None
        mapping = self._sandbox_mapping(record)
        try:
            await asyncio.to_thread(
                _criu_images.retarget,
                images,
                host_first=mapping.base if mapping is not None else None,
                hostname=record.spec["hostname"],
            )
        except (_criu_images.ImageError, OSError) as exc:
            await asyncio.to_thread(shutil.rmtree, images, True)
            raise BackendError(f"{what} cannot be restored here: {exc}") from None
        os.chmod(images, 0o711)  # noqa: S103 - as for a pause's images (``_checkpoint``)
        try:
            if boot_image:
                assert self._boot_restore_config is not None
                await self._restore_into_container(record, images, self._boot_restore_config, bound_after=True)
            else:
                await self._restore_into_container(record, images, self._restore_config(images))
        finally:
            self._discard_images(images)
            record.memory = None
            self._save(record)

    # -- boot images (``_boot_images``) ------------------------------------------------

    def _boot_key(self, record: Record) -> str | None:
        """The key of the boot image a first start of this sandbox may restore; None: it boots."""
        if record.sandbox_id.startswith(_boot_images.BOOT_PREFIX):
            return None
        return self._template_boot_key(
            record.template, record.lowers, record.spec["command"], record.spec.get("volumes", ())
        )

    def _template_boot_key(
        self, template: str, lowers: list[str], command: list[str], volumes: Iterable[object] = ()
    ) -> str | None:
        if self._boot_images is None or _boot_images.why_not_eligible(template, command, volumes) is not None:
            return None
        return _boot_images.image_key(
            template,
            lowers,
            command,
            getattr(self._runtime, "executable", self._runtime.name),
            share_agent_memory=self._share_agent_memory,
            ids=self._mapping.size if self._mapping is not None else None,
        )

    async def _start_from_boot_image(self, record: Record, key: str) -> None:
        """A first start from the template's boot image; without one, a boot that has one made.

        A restore that fails boots the sandbox (nothing ran in it yet, so the two cannot differ
        for its tenant) and drops the images, which this backend then never makes again.
        """
        assert self._boot_images is not None
        assert self._boot_restore_config is not None
        images = None if key in self._boot_refused else self._boot_images.find(key)
        if images is None:
            await self._boot(record)
            self._want_boot_image(record.template, key)
            return
        try:
            await self._continue_images(record, images, f"the boot image of {record.template}", boot_image=True)
        except BackendError as exc:
            if self._boot_images.find(key) != images:
                # Gone while it was being linked (dropped after another start's failed restore, or
                # replaced for a rebuilt template): nothing wrong with it, the sandbox boots.
                await asyncio.to_thread(self._remove_cgroups, record.sandbox_id)
                await self._boot(record)
                return
            _log.warning(
                "starting %s from the boot image of %s failed, booting it: %s", record.sandbox_id, record.template, exc
            )
            self._boot_refused.add(key)
            await asyncio.to_thread(self._boot_images.drop, key)
            await asyncio.to_thread(self._remove_cgroups, record.sandbox_id)
            await self._boot(record)

    async def _boot_images_made(self) -> None:
        """Wait for the boot images being made (tests, and a caller about to close the event loop)."""
        while self._boot_making:
            await asyncio.wait(list(self._boot_making.values()))

    def _want_boot_image(self, template: str, key: str) -> None:
        # Sandboxes that began booting before the image was made finish after it: they want none.
        if key in self._boot_refused or key in self._boot_making or self._has_boot_image(key):
            return
        task = asyncio.get_running_loop().create_task(self._make_boot_image(template, key))
        self._boot_making[key] = task
        task.add_done_callback(lambda _done: self._boot_making.pop(key, None))

    def _has_boot_image(self, key: str) -> bool:
        return self._boot_images is not None and self._boot_images.find(key) is not None

    async def _make_boot_image(self, template: str, key: str) -> None:
        """Boot a private sandbox of ``template``, checkpoint it before any request, keep the images.

        Off every client's path (a background task). A failure is logged and keeps the template
        booting; a crash mid-way leaves a record and a build folder that reconcile removes.
        """
        assert self._boot_images is not None
        assert self._checkpoint_config is not None
        sandbox_id = f"{_boot_images.BOOT_PREFIX}{secrets.token_hex(6)}"
        self._boot_sandboxes.add(sandbox_id)
        building: Path | None = None  # until committed
        try:
            await self.create(SandboxSpec(sandbox_id, template))
            try:
                with _reported(f"making the boot image of {template}"):
                    async with self._lock(sandbox_id):
                        record = self._record(sandbox_id)
                        await self._boot(record)
                        record.state = State.RUNNING.value
                        self._save(record)
                        if self._template_boot_key(template, record.lowers, record.spec["command"]) != key:
                            return  # the template was rebuilt meanwhile: its next cold start makes the new one
                        building = await asyncio.to_thread(self._boot_images.build_folder, key)
                        # Cancelled meanwhile (a server stopping), the checkpoint still ends first
                        # (``crun._finished``): the kill below must not meet it half-way.
                        await self._checkpoint_to(record, building / _MEMORY, self._checkpoint_config)
                        await asyncio.to_thread(self._boot_images.commit, building, key, template)
                        building = None
                _log.info("made the boot image of %s: its sandboxes start from it now", template)
            finally:
                await self.kill(sandbox_id)
                if building is not None:
                    await asyncio.to_thread(shutil.rmtree, building, True)
        except SandboxRuntimeError as exc:
            _log.warning("making the boot image of %s failed (its sandboxes boot): %s", template, exc)
            self._boot_refused.add(key)
        finally:
            self._boot_sandboxes.discard(sandbox_id)

    async def _checkpoint_to(self, record: Record, images: Path, config: Path) -> None:
        """The sandbox's processes written to ``images``; the checkpoint ends them (as a pause's does)."""
        assert record.container is not None
        assert record.network is not None
        images.mkdir(mode=0o700)
        await self._runtime.freeze(record.container)  # CRIU seizes a frozen cgroup at once (``_checkpoint``)
        net = _network.SandboxNetwork.from_record(record.network)
        await asyncio.to_thread(_network.destroy, net)
        try:
            await self._runtime.checkpoint(record.container, images, config=config)
        except BackendError as exc:
            raise BackendError(f"{exc}{_criu_errors(images / 'dump.log')}") from None
        record.container = None  # the checkpoint ended it
        self._save(record)

    def _remove_cgroups(self, sandbox_id: str) -> None:
        """The sandbox's cgroups, where no process is left in them (a runtime's own child groups first)."""
        for controller in _CGROUP_CONTROLLERS:
            group = f"/sys/fs/cgroup/{controller}/{CGROUP_PARENT}/{sandbox_id}"
            for child in _RUNTIME_CHILD_CGROUPS:
                with contextlib.suppress(OSError):
                    os.rmdir(f"{group}/{child}")
            with contextlib.suppress(OSError):
                os.rmdir(group)

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"resuming sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                current = State(record.state)
                next_state(current, Action.RESUME)
                if current is State.PAUSED and record.memory is not None:
                    if self._checkpoint_config is None:
                        raise BackendError(f"sandbox {sandbox_id} was checkpointed; this server cannot restore it")
                    await self._restore_memory(record)
                elif current is State.PAUSED:
                    assert record.container is not None
                    await self._runtime.thaw(record.container)
                else:
                    await asyncio.to_thread(self._restore_for_boot, record)
                    await self._boot(record)
                record.state = State.RUNNING.value
                self._save(record)
            return self._info(record)

    async def discard_memory(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"discarding the memory of sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                target = next_state(State(record.state), Action.DISCARD_MEMORY)
                # The runtime's delete kills a frozen container's processes before they thaw.
                await self._stop_container(record)
                if record.memory is not None:
                    await asyncio.to_thread(shutil.rmtree, record.memory, True)
                    record.memory = None
                record.state = target.value
                self._save(record)
            return self._info(record)

    def _restore_for_boot(self, record: Record) -> None:
        """What a reconcile could not re-create for a passing reason (a command that failed) is tried again.

        Every step looks before it acts, so on an intact stopped sandbox this changes nothing.
        """
        try:
            self._restore(record)
        except _UnrecoverableError as exc:
            raise BackendError(f"sandbox {record.sandbox_id} cannot be re-created: {exc}") from None

    async def _stop_container(self, record: Record) -> None:
        if record.container is None:
            return
        await asyncio.to_thread(self._runtime.delete, record.container)
        record.container = None
        self._save(record)

    # -- releasing ------------------------------------------------------------------

    async def kill(self, sandbox_id: str) -> bool:
        with _reported(f"killing sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                try:
                    record = self._record(sandbox_id)
                except SandboxNotFoundError:
                    return False
                if not record.releasing:  # from here on no reconcile brings it back
                    record.releasing = True
                    self._save(record)
                await self._release_retrying(record)
            self._locks.pop(sandbox_id, None)
            if any(f"{self._dir / 'snapshots'}/" in lower for lower in record.lowers):
                await asyncio.to_thread(self._drop_released_snapshots)  # a fork's, maybe
            return True

    async def _release_retrying(self, record: Record) -> None:
        """``_release``, retried with a doubling pause: a busy mount or a runtime hiccup often passes.

        Still failing after ``_KILL_ATTEMPTS``, the record stays (marked releasing), so the sandbox is
        never half-released and forgotten: the next kill, or the next reconcile, tries again.
        """
        pause = _KILL_BACKOFF_S
        for attempt in range(1, _KILL_ATTEMPTS + 1):
            try:
                await asyncio.to_thread(self._release, record)
                return
            except (SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
                if attempt == _KILL_ATTEMPTS:
                    raise BackendError(
                        f"killing sandbox {record.sandbox_id}: releasing it failed {attempt} times "
                        f"(kept on record for a later kill or reconcile): {exc}"
                    ) from exc
            await asyncio.sleep(pause)
            pause *= 2

    def _release(self, record: Record, *, keep: Path | None = None) -> None:
        """Undo everything the record says exists, newest first; safe to repeat.

        With ``keep``, the sandbox's folder (its files) is moved there instead of deleted.
        """
        home = self._home(record.sandbox_id)
        if record.container:
            self._runtime.delete(record.container)
        for mount_point in [str(home / "bundle" / "rootfs"), *reversed(record.idmapped)]:
            _hostfs.unmount(mount_point)
        if record.network:
            net = _network.SandboxNetwork.from_record(record.network)
            _network.destroy(net)
            self._addresses.release(net.subnet, self._owner, record.sandbox_id)
        if record.ids is not None:  # after every process and mount of the sandbox is gone
            self._ids.release(record.ids, self._owner, record.sandbox_id)
        self._remove_cgroups(record.sandbox_id)
        if record.disk:  # after the overlay that writes to it; the image file goes with the folder
            _disk.release(Path(record.disk), self._layer(record))
        still = _hostfs.mounts_under(home)
        if still:  # never delete through a mount: it could reach a template
            raise BackendError(f"{record.sandbox_id}: still mounted, not deleting: {', '.join(still)}")
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            os.replace(home, keep)
            return
        shutil.rmtree(home, ignore_errors=True)

    # -- looking -------------------------------------------------------------------

    async def inspect(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"inspecting sandbox {sandbox_id}"):
            return self._info(self._record(sandbox_id))

    async def list(self) -> list[SandboxInfo]:
        with _reported("listing sandboxes"):
            # The backend's own boot-image sandboxes are nobody's: a server never sees them.
            records = [r for r in self._records() if not r.sandbox_id.startswith(_boot_images.BOOT_PREFIX)]
            for record in records:  # listing is the server's periodic sweep: keep logs bounded there
                _hostfs.trim(self._home(record.sandbox_id) / "logs" / "sandbox.log")
            return [self._info(r) for r in records]

    async def metrics(self, sandbox_id: str) -> Metrics:
        with _reported(f"reading the metrics of sandbox {sandbox_id}"):
            record = self._record(sandbox_id)
            limits = _limits(record)
            cgroup = f"{CGROUP_PARENT}/{sandbox_id}"
            disk_used, disk_total = await asyncio.to_thread(self._disk, record)
            return Metrics(
                cpu_count=limits.cpu_count,
                cpu_usage_ns=_hostfs.read_int(f"/sys/fs/cgroup/cpuacct/{cgroup}/cpuacct.usage"),
                memory_bytes=_hostfs.read_int(f"/sys/fs/cgroup/memory/{cgroup}/memory.usage_in_bytes"),
                memory_limit_bytes=limits.memory_mb << 20,
                pids=_hostfs.read_int(f"/sys/fs/cgroup/pids/{cgroup}/pids.current"),
                disk_used_bytes=disk_used,
                disk_total_bytes=disk_total,
            )

    def _disk(self, record: Record) -> tuple[int, int]:
        layer = self._layer(record)
        if record.disk and _hostfs.is_mount(str(layer)):  # the disk's own filesystem counts exactly
            return _disk.usage(layer)
        upper = layer / "upper"
        used = _hostfs.tree_bytes(upper)
        limit_mb = _limits(record).disk_mb
        if limit_mb is not None:
            return used, limit_mb << 20
        stat = os.statvfs(upper)
        return used, used + stat.f_bavail * stat.f_frsize

    def log_tail(self, sandbox_id: str, limit: int = 65536) -> bytes:
        log = self._home(sandbox_id) / "logs" / "sandbox.log"
        _hostfs.trim(log)  # a log from before rotating writers; a rotated one never reaches the limit
        return _hostfs.read_log(log, limit)

    # -- snapshots ------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, *, memory: bool = False, transient: bool = False) -> str:
        with _reported(f"taking a snapshot of sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                next_state(State(record.state), Action.SNAPSHOT)
                if memory and self._checkpoint_config is None:
                    raise BackendError(f"{self.name} cannot keep a sandbox's memory in a snapshot here")
                if memory and (record.state != State.RUNNING.value or record.container is None):
                    raise TransitionError(f"sandbox {sandbox_id} is not running: its memory cannot be kept")
                snapshot_id = f"snap-{secrets.token_hex(8)}"
                target = self._dir / "snapshots" / snapshot_id
                freeze = record.state == State.RUNNING.value and record.container is not None
                if freeze:  # a consistent copy: nothing writes while it is taken
                    assert record.container is not None
                    await self._runtime.freeze(record.container)
                try:
                    building = target.with_name(f".{snapshot_id}.build")
                    upper = self._layer(record) / "upper"
                    previous = self._previous_snapshot(sandbox_id)  # unchanged files are shared with it
                    await asyncio.to_thread(_sharing.copy_layer, upper, building / "upper", previous)
                    mapping = self._sandbox_mapping(record)
                    if mapping is not None:  # 0-based owners: idmapped into each sandbox made from it
                        await asyncio.to_thread(_idmap.unshift_owners, building / "upper", mapping)
                    if memory:  # still frozen: the processes as the files just copied
                        assert self._checkpoint_config is not None
                        await self._checkpoint_frozen(record, building / _MEMORY, self._checkpoint_config)
                    manifest = {
                        "zero_based": mapping is not None,
                        "lowers": record.lowers,
                        "agent_command": record.spec["command"],
                        "source": sandbox_id,
                        "template": record.template,
                        "memory": memory,
                    }
                    (building / "manifest.json").write_text(json.dumps(manifest, indent=1))
                    if transient:
                        (building / _TRANSIENT).touch()
                    os.replace(building, target)
                    (self._home(sandbox_id) / _LAST_SNAPSHOT).write_text(snapshot_id)
                except BaseException:
                    await asyncio.to_thread(shutil.rmtree, building, True)
                    raise
                finally:
                    if freeze:
                        assert record.container is not None
                        await self._runtime.thaw(record.container)
            return snapshot_id

    async def _checkpoint_frozen(self, record: Record, images: Path, config: Path) -> None:
        """A frozen sandbox's processes and memory written to ``images``; it stays frozen, then runs on.

        As for a pause (``_checkpoint``) the veth goes first and a restore plugs a new pair in; it
        comes back here at once, so the sandbox keeps its address and listening sockets.
        """
        assert record.container is not None
        assert record.network is not None
        images.mkdir(mode=0o700, parents=True)
        net = _network.SandboxNetwork.from_record(record.network)
        await asyncio.to_thread(functools.partial(_network.destroy, net, keep_rules=True))
        try:
            await self._runtime.checkpoint(record.container, images, config=config, leave_running=True)
            await asyncio.to_thread(self._mark_netns_as_new, images)
        except BackendError as exc:
            raise BackendError(f"{exc}{_criu_errors(images / 'dump.log')}") from None
        finally:
            await asyncio.to_thread(functools.partial(self._plug, record, record.container, rules_applied=True))

    def _previous_snapshot(self, sandbox_id: str) -> Path | None:
        """The writable layer of this sandbox's last snapshot, when it still exists."""
        try:
            last = (self._home(sandbox_id) / _LAST_SNAPSHOT).read_text().strip()
        except FileNotFoundError:
            return None
        layer = self._dir / "snapshots" / last / "upper"
        return layer if last.startswith("snap-") and "/" not in last and layer.is_dir() else None

    def snapshot_in_use(self, snapshot_id: str) -> bool:
        needle = str(self._dir / "snapshots" / snapshot_id / "upper")
        return any(needle in r.lowers for r in self._records()) or any(
            needle in json.loads(m.read_text())["lowers"] for m in (self._dir / "snapshots").glob("*/manifest.json")
        )

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        with _reported(f"deleting snapshot {snapshot_id}"):
            return await asyncio.to_thread(self._delete_snapshot, snapshot_id)

    async def release_snapshot(self, snapshot_id: str) -> None:
        with _reported(f"releasing snapshot {snapshot_id}"):
            await asyncio.to_thread(self._release_snapshot, snapshot_id)

    def _release_snapshot(self, snapshot_id: str, *, drop: bool = True) -> None:
        target = self._dir / "snapshots" / snapshot_id
        if not snapshot_id.startswith("snap-") or "/" in snapshot_id or not target.is_dir():
            return
        (target / _RELEASED).touch()
        shutil.rmtree(target / _MEMORY, ignore_errors=True)  # nobody continues its processes again
        if drop:
            self._drop_released_snapshots()

    def _drop_released_snapshots(self) -> tuple[str, ...]:
        """Released snapshots no sandbox or snapshot stands on any more (after a kill, at reconcile)."""
        dropped = []
        for mark in (self._dir / "snapshots").glob(f"snap-*/{_RELEASED}"):
            with contextlib.suppress(TransitionError, OSError):
                if self._delete_snapshot(mark.parent.name):
                    dropped.append(mark.parent.name)
        return tuple(dropped)

    def _delete_snapshot(self, snapshot_id: str) -> bool:
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            return False
        target = self._dir / "snapshots" / snapshot_id
        if not (target / "manifest.json").exists():
            return False
        if self.snapshot_in_use(snapshot_id):
            raise TransitionError(f"snapshot {snapshot_id} is in use")
        shutil.rmtree(target)
        return True

    # -- network --------------------------------------------------------------------

    async def update_network(
        self, sandbox_id: str, *, allow_internet_access: bool, allow_out: tuple[str, ...], deny_out: tuple[str, ...]
    ) -> None:
        with _reported(f"changing the network rules of sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                if record.network is None:
                    raise TransitionError(f"sandbox {sandbox_id} has no network yet")
                record.spec.update(egress=allow_internet_access, allow_out=list(allow_out), deny_out=list(deny_out))
                net = _network.SandboxNetwork.from_record(record.network)
                policy = _policy(record.spec)
                if all(_network.exists(net).values()):  # plugged now; otherwise the next plug applies it
                    await asyncio.to_thread(_network.set_policy, net, egress=allow_internet_access, policy=policy)
                self._save(record)

    async def address(self, sandbox_id: str, port: int) -> tuple[str, int]:
        with _reported(f"looking up the address of sandbox {sandbox_id}"):
            record = self._record(sandbox_id)
            if record.state != State.RUNNING.value or record.network is None:
                raise TransitionError(f"sandbox {sandbox_id} is {record.state}")
            return str(_network.SandboxNetwork.from_record(record.network).sandbox_ip), port

    # -- after a crash ------------------------------------------------------------------

    async def reconcile(self) -> ReconcileReport:
        with _reported("reconciling the sandboxes on record"):
            await self._thaw_interrupted_snapshots()
            return await asyncio.to_thread(self._reconcile)

    async def _thaw_interrupted_snapshots(self) -> None:
        """A snapshot freezes a running sandbox while it copies; a crash then leaves it frozen."""
        for record in self._records():
            if record.state != State.RUNNING.value or record.container is None or record.releasing:
                continue
            async with self._lock(record.sandbox_id):
                status = await asyncio.to_thread(self._runtime.status, record.container)
                if status == "paused":
                    await self._runtime.thaw(record.container)

    def _reconcile(self) -> ReconcileReport:
        # Listed before any record is read: a container is named on its record before it is made,
        # so one made after this listing is not in it, and one in it has its record on disk.
        try:
            listed = self._runtime.container_names()
        except BackendError as exc:
            _log.warning("could not list the runtime's containers: %s", exc)
            listed = []
        adopted: list[str] = []
        cleaned: list[str] = [*self._remove_partial_snapshots()]
        stopped: list[str] = []
        known_netns = set()
        kept_subnets: set[tuple[str, str]] = set()
        kept_ids: set[tuple[int, str]] = set()
        self._runtime.root.mkdir(parents=True, exist_ok=True)  # a host restart may have emptied it
        if self._boot_images is not None:
            cleaned += self._boot_images.remove_partial(busy=self._boot_making)
        for record in self._records():
            # A boot image's sandbox that a crash left (never a tenant's, nor one being made now):
            # released like a kill cut short.
            left = (
                record.sandbox_id.startswith(_boot_images.BOOT_PREFIX) and record.sandbox_id not in self._boot_sandboxes
            )
            record.releasing = record.releasing or left
            if record.releasing:  # a kill that did not finish: finish it (a failure leaves it on record)
                try:
                    self._release(record)
                    cleaned.append(record.sandbox_id)
                    continue
                except (SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
                    _log.warning("releasing %s still fails: %s", record.sandbox_id, exc)
            else:
                try:
                    if self._settle_record(record):
                        stopped.append(record.sandbox_id)
                except _UnrecoverableError as exc:
                    if record.state == State.CREATED.value:
                        # A create cut short (a crash before its first start): nothing ran in it, so
                        # no tenant data can be lost. Released, never set aside.
                        self._release(record)
                        cleaned.append(record.sandbox_id)
                    else:
                        self._quarantine(record, str(exc))
                    continue
                except (SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
                    # Kept as it is: a resume fails until the next reconcile re-creates the rest.
                    _log.warning("re-creating the resources of %s failed: %s", record.sandbox_id, exc)
                adopted.append(record.sandbox_id)
            if record.network:
                net = _network.SandboxNetwork.from_record(record.network)
                known_netns.add(net.netns)
                kept_subnets.add((str(net.subnet), record.sandbox_id))
            if record.ids is not None:
                kept_ids.add((record.ids, record.sandbox_id))
        cleaned += self._delete_unnamed_containers(listed)
        for id_lease in self._ids.leases():  # as for addresses below: ours no record holds, a gone folder's
            mine = id_lease.owner == self._owner
            if (id_lease.base, id_lease.key) not in kept_ids if mine else not Path(id_lease.owner).is_dir():
                self._ids.release(id_lease.base, id_lease.owner, id_lease.key)
        cleaned += _addresses.sweep(
            self._addresses, self._owner, kept=kept_subnets, known_netns=known_netns, pool=self._pool
        )
        for gone in (self._dir / "sandboxes").glob(f"*/{_IMAGES_GONE}*"):  # a background removal a crash cut short
            shutil.rmtree(gone, ignore_errors=True)
        for leftover in (self._dir / "sandboxes").iterdir():
            if not (leftover / "record.json").exists() and not _hostfs.mounts_under(leftover):
                shutil.rmtree(leftover, ignore_errors=True)  # a create that died before its record
                cleaned.append(leftover.name)
        for mark in (self._dir / "snapshots").glob(f"snap-*/{_TRANSIENT}"):  # no create is in flight now
            self._release_snapshot(mark.parent.name, drop=False)
        cleaned += self._drop_released_snapshots()  # after the records: a quarantined sandbox's stays
        return ReconcileReport(tuple(adopted), tuple(cleaned), tuple(stopped), self._failed())

    def _delete_unnamed_containers(self, listed: Iterable[str]) -> tuple[str, ...]:
        """Delete the sandbox containers of ``listed`` that no record names; their names.

        A sandbox has at most one container, the one its record names (``_new_container`` stops
        the one before). Any other is what a start or restore left that nothing stopped: a
        server killed in the middle, a record removed while its container outlived a failed
        delete. Its processes would hold the sandbox's log lock and memory for good. Left alone:
        names that are not a sandbox's, and a sandbox whose record cannot be read (the operator's).
        """
        records = {record.sandbox_id: record for record in self._records()}
        deleted: list[str] = []
        for name in listed:
            sandbox_id = _sandbox_of_container(name)
            if sandbox_id is None:
                continue
            record = records.get(sandbox_id)
            if record is None and (self._home(sandbox_id) / "record.json").exists():
                continue
            if record is not None and record.container == name:
                continue
            if self._runtime.status(name) is None:
                continue  # gone meanwhile (a release above deleted it)
            try:
                self._runtime.delete(name)
            except (SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
                _log.warning("could not delete container %s, which no sandbox names: %s", name, exc)
                continue
            _log.info("deleted container %s, which no sandbox names", name)
            deleted.append(name)
        return tuple(deleted)

    def _remove_partial_snapshots(self) -> tuple[str, ...]:
        """A snapshot is copied into ``.snap-*.build`` and renamed when complete: a crash leaves the copy."""
        removed = []
        for partial in (self._dir / "snapshots").glob(".snap-*.build"):
            shutil.rmtree(partial, ignore_errors=True)
            removed.append(partial.name)
        return tuple(removed)

    def _settle_record(self, record: Record) -> bool:
        """Keep an intact sandbox as it is; re-create what one lost. True: its processes were gone."""
        try:
            state = State(record.state)
        except ValueError:
            raise _UnrecoverableError(f"unknown state {record.state!r} on record") from None
        status = self._runtime.status(record.container) if record.container else None
        alive = status in ("running", "paused")
        rootfs = str(self._home(record.sandbox_id) / "bundle" / "rootfs")
        mounted = _hostfs.is_mount(rootfs)
        if state is State.PAUSED and record.memory is not None and record.container is not None:
            # A resume's restore cut short: a server killed while it resumed, whose `crun restore`
            # ran on in its own session. The images are still the sandbox's own, so that container
            # goes and the next resume restores them once (kept, its log writer's lock would hold
            # that resume for good).
            self._runtime.delete(record.container)
            record.container = None
            self._save(record)
            alive = False
        if state in (State.RUNNING, State.PAUSED) and alive and mounted:
            _hostfs.ensure_nosuid(rootfs)  # mounted by a version before the host's view was nosuid
            assert record.container is not None
            if self._runtime_netns and not self._plugged(record, record.container):
                # A crash between a checkpoint's removal of the veth and the checkpoint, or in a
                # boot's plugging: the processes run on, unreachable until plugged again.
                self._plug(record, record.container)
            return False
        if state is State.PAUSED and record.memory is not None and os.path.isdir(record.memory):
            # Checkpointed: no container by design. Mounts a host restart took come back now
            # (a passing failure is tried again by its resume).
            try:
                self._restore(record)
            except (SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
                _log.warning("re-creating the resources of %s failed: %s", record.sandbox_id, exc)
            return False
        lost = state in (State.RUNNING, State.PAUSED)
        if record.container is not None:  # dead, or alive on a root that is gone: its processes end here
            self._runtime.delete(record.container)
            record.container = None
        # Images of a checkpoint cut short, or whose record was never saved: no resume reads them.
        shutil.rmtree(self._home(record.sandbox_id) / _MEMORY, ignore_errors=True)
        record.memory = None
        if lost:  # E2B's nearest is paused: the files are kept, resume boots afresh
            record.state = State.STOPPED.value
        self._save(record)
        try:
            self._restore(record)
        except (SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
            # A passing failure: kept as it is, and its resume tries the rest again (_restore_for_boot).
            _log.warning("re-creating the resources of %s failed: %s", record.sandbox_id, exc)
        return lost

    def _restore(self, record: Record) -> None:
        """Re-create what a host restart takes (network, mounts) and the sandbox lacks.

        One idempotent step per resource, in the order create makes them: each looks before it
        acts, so running it on an intact sandbox changes nothing. A resource added to create gets
        its step here (a mounted disk image, say, goes before the overlay).
        """
        missing = [lower for lower in record.lowers if not os.path.isdir(lower)]
        if record.disk and not os.path.isfile(record.disk):  # ensuring it would make an empty one
            missing.append(record.disk)
        if missing:
            raise _UnrecoverableError(f"missing {', '.join(missing)}")
        self._ensure_disk(record)
        missing = [name for name in ("upper", "work") if not (self._layer(record) / name).is_dir()]
        if missing:
            raise _UnrecoverableError(f"missing its writable layer ({', '.join(missing)})")
        steps = (self._restore_ids, self._restore_network, self._restore_lowers, self._map_volumes)
        for step in (*steps, self._restore_overlay, self._restore_bundle):
            step(record)

    def _restore_ids(self, record: Record) -> None:
        """Its id range again: the writable layer's files are owned by exactly those host ids."""
        if record.ids is None or self._mapping is None:
            return
        if not self._ids.claim(record.ids, self._owner, record.sandbox_id):
            raise _UnrecoverableError(f"its id range {record.ids} is leased to another sandbox")

    def _restore_network(self, record: Record) -> None:
        held = {str(lease.subnet) for lease in self._addresses.leases(self._owner) if lease.key == record.sandbox_id}
        if record.network is not None:
            old = _network.SandboxNetwork.from_record(record.network)
            # A namespace the runtime makes is plugged in at each boot: the lease is what must hold.
            if str(old.subnet) in held and (self._runtime_netns or all(_network.exists(old).values())):
                return
            _network.destroy(old)  # what is left of it; missing pieces are fine
            self._addresses.release(old.subnet, self._owner, record.sandbox_id)
        # A fresh lease: after a restart the host registry is empty and the old /30 may be another's.
        net = _network.plan(record.sandbox_id, self._addresses.allocate(self._owner, record.sandbox_id))
        record.network = net.to_record()
        self._save(record)  # recorded before it exists
        if not self._runtime_netns:  # otherwise the next boot or restore plugs it in
            _network.create(net, egress=bool(record.spec["egress"]), policy=_policy(record.spec))

    def _plugged(self, record: Record, container: str) -> bool:
        """Whether the sandbox's name and veth are there and the name is the container's namespace."""
        assert record.network is not None
        try:
            pid = self._runtime.pid(container)
        except BackendError:
            return False
        return _network.attached_to(_network.SandboxNetwork.from_record(record.network), pid)

    def _plug(self, record: Record, container: str, *, pid: int | None = None, rules_applied: bool = False) -> None:
        """The runtime's new network namespace gets the sandbox's name, veth pair and rules.

        What a previous boot left under the name (a namespace whose processes ended, held by the
        name alone) is removed first, so the name always points at the running container's.
        ``pid``: the container's init when the caller knows it (else the runtime is asked);
        ``rules_applied``: the host firewall's entries were set already (``_network.apply_rules``).
        """
        assert record.network is not None
        if pid is None:
            pid = self._runtime.pid(container)
        net = _network.SandboxNetwork.from_record(record.network)
        if any(_network.exists(net).values()):  # looked at without a command: a destroy costs ~25 ms
            _network.destroy(net)
            rules_applied = False  # the destroy took them with it
        _network.create(
            net,
            egress=bool(record.spec["egress"]),
            policy=_policy(record.spec),
            attach_pid=pid,
            rules_applied=rules_applied,
        )

    def _mapped(self, record: Record) -> tuple[tuple[str, str | None], ...]:
        """Each lower and where the overlay sees it: through its idmapped bind (None: as it is), as ``_map_lowers``."""
        if self._mapping is None:
            return tuple((lower, None) for lower in record.lowers)
        home = self._home(record.sandbox_id)
        return tuple(
            (lower, str(home / "lowers" / str(index)) if self._idmapped(lower) else None)
            for index, lower in enumerate(record.lowers)
        )

    def _restore_lowers(self, record: Record) -> None:
        mapping = self._sandbox_mapping(record)
        for lower, target in self._mapped(record):
            if target is None or _hostfs.is_mount(target):
                continue
            assert mapping is not None
            Path(target).mkdir(parents=True, exist_ok=True)
            if target not in record.idmapped:
                record.idmapped.append(target)
                self._save(record)  # recorded before it exists
            ns_fd = _idmap.userns_fd(mapping)
            try:
                _idmap.idmapped_bind(lower, target, ns_fd)
            finally:
                os.close(ns_fd)
        if mapping is not None:
            self._own_layer(record, mapping)

    def _restore_overlay(self, record: Record) -> None:
        home = self._home(record.sandbox_id)
        rootfs = home / "bundle" / "rootfs"
        if _hostfs.is_mount(str(rootfs)):
            _hostfs.ensure_nosuid(str(rootfs))  # mounted by a version before the host's view was nosuid
            return
        rootfs.mkdir(parents=True, exist_ok=True)
        record.mounted = True
        self._save(record)
        lowers = [target or lower for lower, target in self._mapped(record)]
        layer = self._layer(record)
        _hostfs.mount_overlay(lowers, layer / "upper", layer / "work", rootfs)

    def _restore_bundle(self, record: Record) -> None:
        # Written afresh before every boot but the first: a sandbox made while the runtime made its
        # network namespace the other way (checkpoint tools built or gone since) boots this way.
        assert record.network is not None
        self._write_bundle(record, _network.SandboxNetwork.from_record(record.network))

    def _quarantine(self, record: Record, why: str) -> None:
        """Release what a sandbox holds but keep its files under ``<state>/quarantine/`` for the operator."""
        target = self._dir / QUARANTINE / record.sandbox_id
        if target.exists():
            target = target.with_name(f"{record.sandbox_id}.{secrets.token_hex(3)}")
        try:
            self._release(record, keep=target)
        except (SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
            _log.error("could not set %s aside (%s): %s", record.sandbox_id, why, exc)
            return
        (target / "failed.txt").write_text(f"{why}\n")
        _log.error("sandbox %s could not be re-created (%s); its files are kept in %s", record.sandbox_id, why, target)

    def _failed(self) -> tuple[str, ...]:
        folder = self._dir / QUARANTINE
        if not folder.is_dir():
            return ()
        return tuple(sorted({entry.name.split(".")[0] for entry in folder.iterdir() if entry.is_dir()}))


def _container_name(sandbox_id: str) -> str:
    """A new container's name: the sandbox's, and a part of its own (a sandbox has many in its life)."""
    return f"e2b-{sandbox_id}-{secrets.token_hex(3)}"


def _sandbox_of_container(name: str) -> str | None:
    """The sandbox id in a name ``_container_name`` made, else None."""
    prefix, _, rest = name.partition("-")
    sandbox_id, _, suffix = rest.rpartition("-")
    if prefix != "e2b" or not sandbox_id or len(suffix) != 6 or not all(c in "0123456789abcdef" for c in suffix):
        return None
    return sandbox_id


async def _both(first: Awaitable[None], second: Awaitable[None]) -> None:
    """Both run to their end (neither is left running on its own); then the first failure is raised."""
    await _together(first, second)


async def _together(first: Awaitable[_T], second: Awaitable[_U]) -> tuple[_T, _U]:
    """``_both``, with their results."""
    one, two = await asyncio.gather(first, second, return_exceptions=True)
    for result in (one, two):
        if isinstance(result, BaseException):
            raise result
    return cast("_T", one), cast("_U", two)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)


def _criu_errors(log: Path, count: int = 3) -> str:
    """The last few errors CRIU's log names, for a warning (the log itself is kept beside)."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if "Error (" in line]
    except OSError:
        return ""
    return f" (CRIU: {' | '.join(lines[-count:])[:600]})" if lines else ""


def _policy(spec: dict[str, Any]) -> _network.EgressPolicy | None:
    allow, deny = tuple(spec.get("allow_out", ())), tuple(spec.get("deny_out", ()))
    return _network.EgressPolicy(allow, deny) if allow or deny else None


def _limits(record: Record) -> Limits:
    return Limits(**record.spec["limits"])


def _disk_mb(record: Record) -> int:
    return _limits(record).disk_mb or _disk.DEFAULT_MB
