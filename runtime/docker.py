"""The docker backend: sandboxes as containers of our own Docker Engine, driven through the Docker SDK.

The engine is ours (``runtime._docker_engine``: its own socket, data root, no bridge, no
iptables, ``ip_forward`` untouched), started by the host preparation. Per sandbox, under
``<state>/sandboxes/<id>/``::

    record.json   what the sandbox owns, written *before* each resource is made (as crun's)
    hosts, resolv.conf   bound read-only over the container's own

Templates become images: the template's root filesystem, as a tar, imported once under the
host-wide engine lock and tagged ``e2b-compat-template:<content key>`` (shared by every server).
A snapshot is the container committed to ``e2b-compat-snapshot:<snap-id>``; its manifest under
``<state>/snapshots/<snap-id>/`` names the image, the agent command and the snapshot it stems
from (in use while a sandbox or a later snapshot stems from it).

Network: the container is made with ``network_mode=none``; once it runs, its network namespace
gets our name (``ip netns attach``, ``runtime._network.create(attach_pid=…)``), the veth pair and
the nftables policy of every sandbox, so the isolation is crun's: no route to the host's
services, to other sandboxes, or out unless egress is enabled, allow/deny lists live. A stop
ends the namespace; each boot plugs the new one. The address lease is kept across stops.

Lifecycle: create = record + lease + docker create (nothing runs); start = docker start, plug,
wait for the agent's ``/health``; pause(memory) = docker pause (the cgroup freezer);
pause(filesystem) = SIGKILL, keeping the container and its writable layer; resume = unpause, or
start + plug + health; kill marks the record releasing, ends the container's processes, removes
network and lease (retried) and hands the folder to the reaper (``runtime._docker_reaper``), which
removes the container and its writable layer off the kill's path.

Disk: each container's subvolume on the engine's btrfs pool has a qgroup limit of the sandbox's
disk size; the pool counts with simple quotas (``runtime._docker_pool``), where a container's
qgroup holds only what it wrote itself, so a sandbox's own writes stop at ``disk_mb`` with
EDQUOT ("Disk quota exceeded"; the agent answers an upload with 507, as for ENOSPC) and the
host filesystem never holds more than the pool. ``metrics`` reads the qgroup.
Visible differences: a shell's ``dd`` says "Disk quota exceeded", ``df`` shows the pool, and on a
full disk btrfs refuses even a new file's metadata, so an upload's 507 may say "not enough inodes
available: Disk quota exceeded" (the open failed) rather than "not enough disk space available".

Differences from crun (declared in ``FEATURES``): a sandbox's root is an unprivileged host uid,
but one shared by every docker sandbox of the host (``OWN_ID_RANGE`` is not declared): Docker
20.10's user-namespace remapping is daemon-wide, one range for all containers. A process that
escaped one docker sandbox would own the files of the others (never the host's); capabilities,
seccomp and the per-sandbox mount, pid and network namespaces are what separate them. The
inotify bounds per user namespace are shared the same way (the host-wide limits apply).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import resource
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from contract.protocol import ENVD_PORT

from . import _addresses, _disk, _docker_pool, _hostfs, _idmap, _network, _oci
from ._docker_engine import LABEL_KIND, LABEL_OWNER, LABEL_SANDBOX, Engine, default_engine, seccomp_profile
from ._docker_engine import prepare_host as _prepare_engine
from ._docker_reaper import REAPING, Reaper
from ._docker_reconcile import reconcile
from ._health import wait_healthy
from ._idranges import RANGE_SIZE
from ._oci_backend import _policy, _reported
from ._threads import to_thread_to_the_end
from .backend import (
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
from .templates import Template, ensure_template

if TYPE_CHECKING:
    from .backends import BackendOptions

__all__ = ["CGROUP_PARENT", "FEATURES", "DockerBackend", "open_backend", "prepare_host"]

# What works and is tested here (tests/runtime/test_docker.py); see the module docstring for the rest.
FEATURES: frozenset[Feature] = frozenset(
    {Feature.PAUSE_MEMORY, Feature.SNAPSHOT, Feature.DISK_LIMIT, Feature.EGRESS_RULES, Feature.METRICS}
)

CGROUP_PARENT = "e2b-compat-docker"  # /sys/fs/cgroup/<controller>/e2b-compat-docker/<container id>
TEMPLATE_REPO = "e2b-compat-template"
SNAPSHOT_REPO = "e2b-compat-snapshot"
QUARANTINE = "quarantine"
_KILL_ATTEMPTS = 4
_KILL_BACKOFF_S = 0.25
_REMOVAL_WAIT_S = 120.0  # a removal under way (btrfs subvolume and qgroup) is waited for this long
_LOG_CONFIG = docker.types.LogConfig(type="json-file", config={"max-size": "1m", "max-file": "2"})
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Docker's names for crun's capability set (runtime._oci.CAPABILITIES), and no more.
_CAPABILITIES = [name.removeprefix("CAP_") for name in _oci.CAPABILITIES]

_log = logging.getLogger(__name__)


@dataclass
class Record:
    """What a sandbox owns; persisted before each resource is made."""

    sandbox_id: str
    template: str
    image: str
    state: str
    spec: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] | None = None
    container: str | None = None  # its name; the engine finds it by name after a crash
    container_id: str | None = None
    snapshot: str | None = None  # the snapshot it was created from
    releasing: bool = False
    disk: dict[str, int] | None = None  # its qgroup: subvolume id, bytes not its own ("base", 0), disk "size"

    @staticmethod
    def load(path: Path) -> Record:
        return Record(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        _hostfs.write_whole(path, json.dumps(self.__dict__, indent=1))


class DockerBackend:
    """A ``Backend`` on our Docker Engine (see the module docstring)."""

    name = "docker"
    features: frozenset[Feature] = FEATURES

    def __init__(
        self,
        state_dir: Path,
        *,
        engine: Engine | None = None,
        templates_root: Path | None = None,
        templates: Iterable[Template] = (),
        addresses: _addresses.AddressRegistry | None = None,
    ) -> None:
        self._dir = state_dir
        self._engine = engine or default_engine()
        self._owner = str(state_dir.absolute())
        # Container names are daemon-wide: several servers may use the same sandbox id.
        self._tag = hashlib.sha256(self._owner.encode()).hexdigest()[:8]
        self._pool = _network.AddressPool()
        self._addresses = addresses or _addresses.AddressRegistry(pool=self._pool.network)
        self._templates_root = templates_root
        self._templates: dict[str, Template] = {built.name: built for built in templates}
        self._locks: dict[str, asyncio.Lock] = {}
        self._reaper = Reaper(state_dir / REAPING, self._remove_container)
        with _reported(f"setting up the docker backend in {state_dir}"):
            for folder in ("sandboxes", "snapshots", REAPING):
                (self._dir / folder).mkdir(parents=True, exist_ok=True)
                os.chmod(self._dir / folder, 0o700)
            if not self._engine.answers():
                raise BackendError(
                    f"our Docker Engine does not answer on {self._engine.socket}: "
                    "run `e2b-compat host prepare --backend docker`"
                )
            if not self._engine.in_own_namespace():  # started before its namespace: views would not reach it
                raise BackendError(
                    "our Docker Engine runs in the host's mount namespace (started by an older version): "
                    "run `e2b-compat host prepare --backend docker`"
                )
            self._docker = self._engine.client()
            info = self._docker.info()
            if info.get("Driver") != "btrfs":
                raise BackendError(
                    f"our Docker Engine stores on {info.get('Driver')}, not its btrfs pool: "
                    "run `e2b-compat host prepare --backend docker`"
                )
            self._docker_root = Path(info["DockerRootDir"])  # <data root>/<uid>.<gid> of the remapped root
            self._pool_uuid = _docker_pool.fs_uuid(self._docker_root)
            if _docker_pool.quota_mode(self._docker_root) != "squota":  # the limits below count from zero
                raise BackendError(
                    "our Docker Engine's pool does not count with btrfs simple quotas: "
                    "run `e2b-compat host prepare --backend docker`"
                )
            self._seccomp = json.dumps(seccomp_profile(json.loads(self._engine.profile.read_text())))
            _network.ensure_host_firewall()

    # -- records --------------------------------------------------------------------

    def _home(self, sandbox_id: str) -> Path:
        if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
            raise SandboxNotFoundError(sandbox_id)
        return self._dir / "sandboxes" / sandbox_id

    def _record(self, sandbox_id: str) -> Record:
        try:
            return Record.load(self._home(sandbox_id) / "record.json")
        except FileNotFoundError:
            raise SandboxNotFoundError(sandbox_id) from None

    def _save(self, record: Record) -> None:
        record.save(self._home(record.sandbox_id) / "record.json")

    def _records(self) -> list[Record]:
        out = []
        for path in sorted((self._dir / "sandboxes").glob("*/record.json")):
            with contextlib.suppress(OSError, ValueError, TypeError):
                out.append(Record.load(path))
        return out

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def _info(self, record: Record) -> SandboxInfo:
        host = None
        if record.state == State.RUNNING.value and record.network is not None:
            host = str(_network.SandboxNetwork.from_record(record.network).sandbox_ip)
        return SandboxInfo(record.sandbox_id, record.template, State(record.state), host)

    def _labels(self, kind: str, sandbox_id: str | None = None) -> dict[str, str]:
        return {LABEL_OWNER: self._owner, LABEL_KIND: kind, **({LABEL_SANDBOX: sandbox_id} if sandbox_id else {})}

    def _container(self, record: Record) -> Container | None:
        if record.container is None:
            return None
        try:
            return self._docker.containers.get(record.container)
        except docker.errors.NotFound:
            return None

    # -- images ---------------------------------------------------------------------

    def _image(self, template: str) -> tuple[str, tuple[str, ...], str | None]:
        """The image, the agent command and the snapshot (if any) a sandbox of ``template`` is made from."""
        manifest = self._dir / "snapshots" / template / "manifest.json"
        if template.startswith("snap-") or manifest.exists():
            if "/" in template or not manifest.exists():
                raise TemplateNotFoundError(template)
            data = json.loads(manifest.read_text())
            return str(data["image"]), tuple(data["agent_command"]), template
        built = self._templates.get(template)
        if built is None:
            try:
                built = ensure_template(template, cache_root=self._templates_root)
            except Exception as exc:  # the builder's own error says what failed
                raise TemplateNotFoundError(f"{template}: {exc}") from exc
            self._templates[template] = built
        return self._import(built), tuple(built.agent_command), None

    def _import(self, built: Template) -> str:
        """The template's image, imported from its root filesystem once (host-wide lock): its reference."""
        ref = f"{TEMPLATE_REPO}:{built.key}"
        with contextlib.suppress(docker.errors.ImageNotFound):
            self._docker.images.get(ref)
            return ref
        with self._engine.locked():
            with contextlib.suppress(docker.errors.ImageNotFound):
                self._docker.images.get(ref)
                return ref
            # tar's complaints go to a file: a pipe nobody reads while the import streams could fill and stall it.
            with tempfile.TemporaryFile() as errors:
                tar = subprocess.Popen(
                    ["tar", "--numeric-owner", "--xattrs", "-C", str(built.rootfs), "-cf", "-", "."],
                    stdout=subprocess.PIPE,
                    stderr=errors,
                )
                assert tar.stdout is not None
                try:
                    self._docker.api.import_image_from_stream(
                        tar.stdout, repository=TEMPLATE_REPO, tag=built.key, changes=[f"LABEL {LABEL_KIND}=template"]
                    )
                finally:
                    tar.stdout.close()
                    tar.wait()
                if tar.returncode != 0:
                    errors.seek(0)
                    message = errors.read()[-300:].decode(errors="replace")
                    raise BackendError(f"packing template {built.name} failed: {message}")
            self._docker.images.get(ref)  # ImageNotFound (a BackendError below) when the import failed
            self._prune_template_images(built.path.parent)
        return ref

    def _prune_template_images(self, cache: Path) -> None:
        """Images of templates the cache pruned (a source change makes a new key) go too; ones in use stay.

        Removed without force: the engine refuses an image a container (any server's) still uses.
        """
        for image in self._docker.images.list(name=TEMPLATE_REPO):
            for tag in image.tags:
                key = tag.rpartition(":")[2]
                if not any(cache.glob(f"*-{key[:16]}/rootfs")):
                    with contextlib.suppress(docker.errors.APIError):
                        self._docker.images.remove(tag)

    # -- creating -------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        with _reported(f"creating sandbox {spec.sandbox_id}"), _engine_errors():
            home = self._home(spec.sandbox_id)
            if home.exists():
                raise TransitionError(f"sandbox {spec.sandbox_id} already exists")
            image, command, snapshot = await asyncio.to_thread(self._image, spec.template)
            async with self._lock(spec.sandbox_id):
                home.mkdir(parents=True)
                os.chmod(home, 0o700)
                record = Record(
                    spec.sandbox_id,
                    spec.template,
                    image,
                    State.CREATED.value,
                    spec={
                        "hostname": spec.hostname or spec.sandbox_id[:63],
                        "limits": spec.limits.__dict__,
                        "command": list(command),
                        "egress": spec.allow_internet_access,
                        "allow_out": list(spec.allow_out),
                        "deny_out": list(spec.deny_out),
                        "volumes": [{"source": v.source, "target": v.target} for v in spec.volumes],
                    },
                    snapshot=snapshot,
                )
                self._save(record)
                try:
                    with self._reaper.yielding():  # removals wait: a client waits for this
                        # A cancelled create releases once its provision ended, not while it runs on.
                        await to_thread_to_the_end(functools.partial(self._provision, record))
                except BaseException:
                    await asyncio.to_thread(self._release, record)
                    raise
            return self._info(record)

    def _provision(self, record: Record) -> None:
        # A lease whose record was never saved (a crash right here) is ended by reconcile().
        net = _network.plan(record.sandbox_id, self._addresses.allocate(self._owner, record.sandbox_id))
        record.network = net.to_record()
        self._save(record)
        self._make_container(record)

    def _make_container(self, record: Record) -> None:
        home = self._home(record.sandbox_id)
        hostname = record.spec["hostname"]
        (home / "hosts").write_text(_oci.hosts_file(hostname))
        (home / "resolv.conf").write_text(_oci.resolv_file([]))
        record.container = f"e2b-{self._tag}-{record.sandbox_id}-{secrets.token_hex(3)}"
        self._save(record)  # recorded before it exists
        limits = Limits(**record.spec["limits"])
        open_files = min(_oci.NOFILE_LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        disk = (limits.disk_mb or _disk.DEFAULT_MB) << 20
        container = self._docker.containers.create(
            record.image,
            entrypoint=["/usr/bin/tini", "--", *record.spec["command"]],
            command=[],
            name=record.container,
            hostname=hostname,
            user="0:0",
            working_dir="/",
            environment={
                "PATH": _PATH,
                "HOME": "/root",
                "E2B_SANDBOX": "true",
                "E2B_SANDBOX_ID": record.sandbox_id,
                "E2B_TEMPLATE_ID": record.template,
            },
            labels=self._labels("sandbox", record.sandbox_id),
            network_mode="none",
            mem_limit=limits.memory_mb << 20,
            memswap_limit=limits.memory_mb << 20,  # no swap
            nano_cpus=limits.cpu_count * 1_000_000_000,
            pids_limit=limits.pids,
            ulimits=[docker.types.Ulimit(name="nofile", soft=open_files, hard=open_files)],
            cap_drop=["ALL"],
            cap_add=_CAPABILITIES,
            security_opt=[f"seccomp={self._seccomp}"],  # no no-new-privileges: sudo works for the sandbox user
            cgroupns="private",
            cgroup_parent=f"/{CGROUP_PARENT}",
            ipc_mode="private",
            tmpfs={"/tmp": "rw,nosuid,nodev,mode=1777"},  # noqa: S108 - the sandbox's own /tmp, as crun's
            volumes={
                str(home / "hosts"): {"bind": "/etc/hosts", "mode": "ro"},
                str(home / "resolv.conf"): {"bind": "/etc/resolv.conf", "mode": "ro"},
                # Each volume's idmapped view (made at each boot, ``_map_volumes``), the engine's bind of it.
                **{view: {"bind": target, "mode": "rw"} for _source, target, view in self._volume_views(record)},
            },
            log_config=_LOG_CONFIG,
            storage_opt={"size": str(disk)},  # the qgroup limit, applied again at each start
        )
        record.container_id = container.id
        self._save(record)
        number = _docker_pool.subvolume_id(self._subvolume(str(container.id)))
        record.disk = {"subvolume": number, "base": 0, "size": disk}
        self._save(record)

    def _views(self, record: Record) -> Path:
        """Where this sandbox's volume views are mounted: under the engine's shared folder, which reaches
        the daemon's mount namespace (a mount in the sandbox's own folder would not)."""
        self._home(record.sandbox_id)  # the id's checks
        return self._engine.views / self._tag / record.sandbox_id

    def _volume_views(self, record: Record) -> list[tuple[str, str, str]]:
        """(volume folder, where the sandbox sees it, its idmapped view) per volume."""
        views = self._views(record)
        return [
            (str(entry["source"]), str(entry["target"]), str(views / str(index)))
            for index, entry in enumerate(record.spec.get("volumes", []))
        ]

    def _map_volumes(self, record: Record) -> None:
        """Each volume's view shifted into the engine's remapped ids (writable, nosuid, nodev); idempotent.

        Made before every start (a host restart takes mounts; the container keeps its binds' paths)
        and undone when the container's processes end (``_end``, ``_release``).
        """
        for source, _target, view in self._volume_views(record):
            if not os.path.isdir(source):  # the server mounts its volumes before it creates or reconciles
                raise BackendError(f"{record.sandbox_id}: volume folder {source} is not there")
            if _hostfs.is_mount(view):
                continue
            Path(view).mkdir(mode=0o700, parents=True, exist_ok=True)
            ns_fd = _idmap.userns_fd(_idmap.Mapping(self._remap_base(), RANGE_SIZE))
            try:
                _idmap.idmapped_bind(source, view, ns_fd, read_only=False)
            finally:
                os.close(ns_fd)

    def _unmap_volumes(self, record: Record) -> None:
        views = self._views(record)
        if views.is_dir():
            _hostfs.remove_tree(views)  # unmounts each view first; never deletes through one

    def _remap_base(self) -> int:
        """The first host id of the engine's remapped range (container root)."""
        entry = _docker_pool.remap_entries()[0]
        if entry is None:
            raise BackendError(f"{_docker_pool.REMAP_USER} has no subordinate ids: run `e2b-compat host prepare`")
        return entry[0]

    def _subvolume(self, container_id: str) -> Path:
        """The btrfs subvolume holding a container's root filesystem (its read-write layer)."""
        mount_id = (self._docker_root / "image/btrfs/layerdb/mounts" / container_id / "mount-id").read_text().strip()
        return self._docker_root / "btrfs/subvolumes" / mount_id

    # -- running --------------------------------------------------------------------

    async def start(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"starting sandbox {sandbox_id}"), _engine_errors():
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                next_state(State(record.state), Action.START)
                await self._boot(record)
                record.state = State.RUNNING.value
                self._save(record)
            return self._info(record)

    async def _boot(self, record: Record) -> None:
        with self._reaper.yielding():
            await self._boot_yielded(record)

    async def _boot_yielded(self, record: Record) -> None:
        container = await asyncio.to_thread(self._container, record)
        if container is None:
            raise BackendError(f"the container of sandbox {record.sandbox_id} is gone")
        home = self._home(record.sandbox_id)
        before = {str(home / "volumes" / str(index)) for index in range(len(record.spec.get("volumes", [])))}
        if before & {str(mount.get("Source")) for mount in container.attrs.get("Mounts", [])}:
            # Made before views moved to the engine's shared folder: its binds would show empty folders.
            raise BackendError(
                f"the container of sandbox {record.sandbox_id} binds its volumes from where an older "
                "version made their views, which the engine no longer sees: kill the sandbox and create it again"
            )
        await asyncio.to_thread(self._map_volumes, record)
        await asyncio.to_thread(container.start)
        net = await asyncio.to_thread(self._plug, record, container)
        try:
            await wait_healthy(f"http://{net.sandbox_ip}:{ENVD_PORT}/health", self._home(record.sandbox_id) / "-")
        except BackendError as exc:
            logs = await asyncio.to_thread(container.logs, tail=20)
            raise BackendError(f"{exc}; the container's output: {logs.decode(errors='replace')[-600:]}") from None

    def _plug(self, record: Record, container: Container) -> _network.SandboxNetwork:
        """Our veth and rules into the running container's namespace (a new one each boot)."""
        container.reload()
        pid = int(container.attrs["State"]["Pid"])
        if pid <= 0:
            raise BackendError(f"the container of sandbox {record.sandbox_id} is not running")
        net = self._leased(record)
        _network.destroy(net)  # what the last boot left: its name points at a namespace that ended
        _network.create(net, egress=bool(record.spec["egress"]), policy=_policy(record.spec), attach_pid=pid)
        return net

    def _leased(self, record: Record) -> _network.SandboxNetwork:
        """The sandbox's network, on a lease it still holds (after a host restart, a fresh one)."""
        if record.network is not None:
            net = _network.SandboxNetwork.from_record(record.network)
            held = {
                str(lease.subnet) for lease in self._addresses.leases(self._owner) if lease.key == record.sandbox_id
            }
            if str(net.subnet) in held:
                return net
        net = _network.plan(record.sandbox_id, self._addresses.allocate(self._owner, record.sandbox_id))
        record.network = net.to_record()
        self._save(record)
        return net

    def _plugged(self, record: Record, container: Container) -> bool:
        """Whether our name and veth are on the container's current network namespace."""
        if record.network is None:
            return False
        try:
            pid = int(container.attrs["State"]["Pid"])
        except (KeyError, ValueError):
            return False
        return _network.attached_to(_network.SandboxNetwork.from_record(record.network), pid)

    async def pause(self, sandbox_id: str, *, memory: bool) -> SandboxInfo:
        with _reported(f"pausing sandbox {sandbox_id}"), _engine_errors():
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                target = next_state(State(record.state), Action.PAUSE_MEMORY if memory else Action.PAUSE_FILESYSTEM)
                container = await asyncio.to_thread(self._container, record)
                if container is None:
                    raise BackendError(f"the container of sandbox {sandbox_id} is gone")
                await asyncio.to_thread(container.pause if memory else lambda: self._stop(record, container))
                record.state = target.value
                self._save(record)
            return self._info(record)

    def _stop(self, record: Record, container: Container) -> None:
        """Every process ends (SIGKILL, as crun's delete); the container and its writable layer stay."""
        _end_processes(container)
        if record.network is not None:
            _network.destroy(_network.SandboxNetwork.from_record(record.network))  # the lease is kept

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"resuming sandbox {sandbox_id}"), _engine_errors():
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                current = State(record.state)
                next_state(current, Action.RESUME)
                if current is State.PAUSED:
                    container = await asyncio.to_thread(self._container, record)
                    if container is None:
                        raise BackendError(f"the container of sandbox {sandbox_id} is gone")
                    await asyncio.to_thread(container.unpause)
                else:
                    await self._boot(record)
                record.state = State.RUNNING.value
                self._save(record)
            return self._info(record)

    async def discard_memory(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"discarding the memory of sandbox {sandbox_id}"), _engine_errors():
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                target = next_state(State(record.state), Action.DISCARD_MEMORY)
                container = await asyncio.to_thread(self._container, record)
                if container is None:
                    raise BackendError(f"the container of sandbox {sandbox_id} is gone")
                await asyncio.to_thread(self._stop, record, container)
                record.state = target.value
                self._save(record)
            return self._info(record)

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
                pause = _KILL_BACKOFF_S
                for attempt in range(1, _KILL_ATTEMPTS + 1):
                    try:
                        await asyncio.to_thread(self._end, record)
                        break
                    except (SandboxRuntimeError, OSError, docker.errors.DockerException) as exc:
                        if attempt == _KILL_ATTEMPTS:
                            raise BackendError(
                                f"killing sandbox {sandbox_id}: releasing it failed {attempt} times "
                                f"(kept on record for a later kill or reconcile): {exc}"
                            ) from exc
                    await asyncio.sleep(pause)
                    pause *= 2
            self._locks.pop(sandbox_id, None)
            return True

    def _end(self, record: Record) -> None:
        """A kill's part on its path: processes, network and lease end; the container goes to the reaper."""
        container = self._container(record) if record.container else None
        if container is not None:
            _end_processes(container)
        self._unmap_volumes(record)  # the processes that used the views are gone
        self._unplug(record)
        # Named apart: the same id may be killed again (a record made again after a crash) before a reap.
        folder = f"{record.sandbox_id}.{secrets.token_hex(3)}"
        os.replace(self._home(record.sandbox_id), self._dir / REAPING / folder)
        self._reaper.submit(folder)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the containers of killed sandboxes are removed (True), or ``timeout`` seconds (False)."""
        return self._reaper.wait(timeout)

    def _unplug(self, record: Record) -> None:
        if record.network:
            net = _network.SandboxNetwork.from_record(record.network)
            _network.destroy(net)
            self._addresses.release(net.subnet, self._owner, record.sandbox_id)

    def _release(self, record: Record, *, keep: Path | None = None) -> None:
        """Undo everything the record says exists, newest first; safe to repeat."""
        if record.container:
            self._remove_container(record.container)
        self._unmap_volumes(record)
        self._unplug(record)
        home = self._home(record.sandbox_id)
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            os.replace(home, keep)
            return
        _hostfs.remove_tree(home)  # never through a volume's view

    def _remove_container(self, name: str) -> None:
        """Force-remove a container; one whose removal is under way already (409) is waited for until gone.

        A kill that timed out while the engine went on removing, or a reconcile racing a kill,
        finds the engine busy with it: that is the outcome wanted, not a failure to retry.
        """
        deadline = time.monotonic() + _REMOVAL_WAIT_S
        while True:
            try:
                self._docker.api.remove_container(name, force=True)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                busy = exc.status_code == 409 and "already in progress" in str(exc)
                if not busy or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    # -- looking --------------------------------------------------------------------

    async def inspect(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"inspecting sandbox {sandbox_id}"):
            return self._info(self._record(sandbox_id))

    async def list(self) -> list[SandboxInfo]:
        with _reported("listing sandboxes"):
            return [self._info(r) for r in self._records()]

    async def metrics(self, sandbox_id: str) -> Metrics:
        with _reported(f"reading the metrics of sandbox {sandbox_id}"), _engine_errors():
            record = self._record(sandbox_id)
            limits = Limits(**record.spec["limits"])
            cgroup = f"{CGROUP_PARENT}/{record.container_id}"
            running = record.state in (State.RUNNING.value, State.PAUSED.value)
            used, total = await asyncio.to_thread(self._disk, record)

            def read(path: str) -> int:
                return _hostfs.read_int(f"/sys/fs/cgroup/{path}") if running else 0

            return Metrics(
                cpu_count=limits.cpu_count,
                cpu_usage_ns=read(f"cpuacct/{cgroup}/cpuacct.usage"),
                memory_bytes=read(f"memory/{cgroup}/memory.usage_in_bytes"),
                memory_limit_bytes=limits.memory_mb << 20,
                pids=read(f"pids/{cgroup}/pids.current"),
                disk_used_bytes=used,
                disk_total_bytes=total,
            )

    def _disk(self, record: Record) -> tuple[int, int]:
        """What the sandbox wrote (its qgroup's count: its own extents only) and its disk size."""
        if record.disk is None or self._container(record) is None:
            return 0, 0
        referenced, _ = _docker_pool.usage(self._pool_uuid, record.disk["subvolume"])
        return max(0, referenced - record.disk["base"]), record.disk["size"]

    # -- snapshots ------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, *, memory: bool = False, transient: bool = False) -> str:
        if memory:  # the engine's checkpoints need CRIU and an experimental daemon (not Feature.SNAPSHOT_MEMORY)
            raise BackendError("the docker backend keeps no memory in snapshots")
        with _reported(f"taking a snapshot of sandbox {sandbox_id}"), _engine_errors():
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                next_state(State(record.state), Action.SNAPSHOT)
                container = await asyncio.to_thread(self._container, record)
                if container is None:
                    raise BackendError(f"the container of sandbox {sandbox_id} is gone")
                snapshot_id = f"snap-{secrets.token_hex(8)}"
                # The engine pauses a running container while it commits (a consistent copy).
                image = await asyncio.to_thread(
                    container.commit, SNAPSHOT_REPO, snapshot_id, conf={"Labels": self._labels("snapshot", sandbox_id)}
                )
                folder = self._dir / "snapshots" / snapshot_id
                manifest = {
                    "image": image.id,
                    "agent_command": record.spec["command"],
                    "source": sandbox_id,
                    "template": record.template,
                    "parent": record.snapshot,
                }
                folder.mkdir()
                _hostfs.write_whole(folder / "manifest.json", json.dumps(manifest, indent=1))
            return snapshot_id

    def _manifests(self) -> dict[str, dict[str, Any]]:
        out = {}
        for path in (self._dir / "snapshots").glob("snap-*/manifest.json"):
            with contextlib.suppress(OSError, ValueError):
                out[path.parent.name] = json.loads(path.read_text())
        return out

    def snapshot_in_use(self, snapshot_id: str) -> bool:
        return any(r.snapshot == snapshot_id for r in self._records()) or any(
            m.get("parent") == snapshot_id for m in self._manifests().values()
        )

    async def release_snapshot(self, snapshot_id: str) -> None:
        # Only forks release snapshots, and they need memory snapshots, which this backend never takes.
        raise BackendError("the docker backend takes no snapshots to release (no memory snapshots)")

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        with _reported(f"deleting snapshot {snapshot_id}"), _engine_errors():
            return await asyncio.to_thread(self._delete_snapshot, snapshot_id)

    def _delete_snapshot(self, snapshot_id: str) -> bool:
        if not snapshot_id.startswith("snap-") or "/" in snapshot_id:
            return False
        folder = self._dir / "snapshots" / snapshot_id
        if not (folder / "manifest.json").exists():
            return False
        if self.snapshot_in_use(snapshot_id):
            raise TransitionError(f"snapshot {snapshot_id} is in use")
        self._reap_made_from(snapshot_id)
        with contextlib.suppress(docker.errors.ImageNotFound):
            self._docker.images.remove(f"{SNAPSHOT_REPO}:{snapshot_id}")
        shutil.rmtree(folder)
        return True

    def _reap_made_from(self, snapshot_id: str) -> None:
        """Killed sandboxes made from the snapshot hold its image until their containers go: now."""
        for folder in sorted((self._dir / REAPING).iterdir()):
            try:
                made_from = Record.load(folder / "record.json").snapshot
            except (OSError, ValueError, TypeError):
                continue  # gone meanwhile (the reaper's), or torn: not made from it as far as is known
            if made_from == snapshot_id and not self._reaper.reap_now(folder.name):
                raise BackendError(f"a killed sandbox made from snapshot {snapshot_id} still holds its image")

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
                if all(_network.exists(net).values()):  # plugged now; otherwise the next boot applies it
                    await asyncio.to_thread(_network.set_policy, net, egress=allow_internet_access, policy=policy)
                self._save(record)

    async def address(self, sandbox_id: str, port: int) -> tuple[str, int]:
        with _reported(f"looking up the address of sandbox {sandbox_id}"):
            record = self._record(sandbox_id)
            if record.state != State.RUNNING.value or record.network is None:
                raise TransitionError(f"sandbox {sandbox_id} is {record.state}")
            return str(_network.SandboxNetwork.from_record(record.network).sandbox_ip), port

    # -- after a crash --------------------------------------------------------------

    async def reconcile(self) -> ReconcileReport:
        with _reported("reconciling the sandboxes on record"), _engine_errors():
            return await asyncio.to_thread(self._reconcile)

    def _reconcile(self) -> ReconcileReport:
        report = reconcile(self)
        # The templates a server offers are imported before it serves: a first create would otherwise
        # wait for the import (a minute for a large template), past the clients' request timeout.
        for built in self._templates.values():
            self._import(built)
        return report


def open_backend(options: BackendOptions) -> DockerBackend:
    """The ``docker`` entry of ``runtime.backends``."""
    return DockerBackend(options.state_dir, templates_root=options.templates_root, templates=options.templates)


def prepare_host(say: Callable[[str], None]) -> None:
    """crun's host set-up plus Debian's docker.io (pinned) and our own dockerd (``runtime._docker_engine``)."""
    _prepare_engine(say)


@contextlib.contextmanager
def _engine_errors() -> Any:
    """The engine's refusals and failures, as the runtime's ``BackendError``."""
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise BackendError(f"an image is missing: {exc.explanation or exc}") from exc
    except docker.errors.DockerException as exc:
        raise BackendError(f"the Docker Engine failed: {getattr(exc, 'explanation', None) or exc}") from exc


def _end_processes(container: Container) -> None:
    """SIGKILL every process of ``container`` and wait for them; a paused one is unpaused after the
    signal, which its frozen cgroup holds, so no code of theirs runs again."""
    with contextlib.suppress(docker.errors.APIError):  # not running any more: fine
        container.kill()
    container.reload()
    if container.status == "paused":
        container.unpause()
    container.wait(timeout=30)
