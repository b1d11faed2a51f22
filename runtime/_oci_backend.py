"""What every OCI-runtime backend shares: records, network, layers, bundle, lifecycle, snapshots.

Per sandbox, under ``<state>/sandboxes/<id>/``::

    record.json   every resource the sandbox owns, written *before* the resource is made
    upper/ work/  the overlay's writable layer (kept across a filesystem-only pause)
    bundle/       config.json, hosts, resolv.conf, rootfs/ (the overlay mount point)
    logs/         the sandbox's output (trimmed to a bounded size)

``OciBackend`` is the whole ``Backend`` but for the container runtime's command, which it
reaches through ``ContainerRuntime``: create a container from a bundle, start, freeze, thaw,
delete it, ask for its status. ``runtime.crun`` is that seam for crun; gVisor's ``runsc``
takes the same arguments and is one more small module of the same shape.

Lifecycle: create = record + network + idmapped lowers + overlay + bundle; start = the
runtime's create and start, then wait for the agent's ``/health``; pause(memory) = freeze
(the cgroup freezer); pause(filesystem) = delete the container, keeping ``upper/``; resume =
thaw, or a fresh create + start on the same writable layer; kill releases everything in
reverse order and removes the record last.

Errors: public methods raise only the ``runtime.backend`` tree. An ``OSError``, a failed
subprocess or a malformed value met on the way comes out as ``BackendError`` saying what was
being done (``_reported``); the network's and the runtime's own errors already are ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from contract.protocol import ENVD_PORT

from . import _addresses, _hostfs, _idmap, _network, _oci
from .backend import (
    Action,
    BackendError,
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

CGROUP_PARENT = "e2b-compat"
_CGROUP_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "cpuset", "devices", "freezer", "blkio", "hugetlb")
_HEALTH_TIMEOUT_S = 30.0


class ContainerRuntime(Protocol):
    """An OCI runtime's command line, as far as the backend needs it (crun; runsc takes the same).

    ``create`` makes the container from ``bundle`` with its output appended to ``log``, and
    starts the container's init in a session of its own: in the caller's, a signal to the
    caller's process group (Ctrl-C, a supervisor stopping the server) would reach every
    sandbox. ``start`` runs the bundle's process; ``freeze`` and ``thaw`` stop and continue
    every process in the container. Those four raise ``BackendError`` when the runtime fails.
    ``delete`` kills and removes a container, and is fine with one that is already gone;
    ``status`` is the runtime's word for a container's state (``created``, ``running``,
    ``paused``, ``stopped``), or None when it does not know it. These two block: the backend
    calls them from worker threads.
    """

    name: str  # the command, for messages
    root: Path  # the runtime's own state folder (created by the backend)

    async def create(self, bundle: Path, container: str, log: Path) -> None: ...

    async def start(self, container: str) -> None: ...

    async def freeze(self, container: str) -> None: ...

    async def thaw(self, container: str) -> None: ...

    def delete(self, container: str) -> None: ...

    def status(self, container: str) -> str | None: ...


@dataclass
class Record:
    """What a sandbox owns; persisted before each resource is created (crash safety)."""

    sandbox_id: str
    template: str
    lowers: list[str]
    state: str
    network: dict[str, Any] | None = None
    idmapped: list[str] = field(default_factory=list)  # idmapped binds of template lowers
    mounted: bool = False
    container: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def load(path: Path) -> Record:
        return Record(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=1))
        os.replace(tmp, path)


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

    def __init__(
        self,
        state_dir: Path,
        container_runtime: ContainerRuntime,
        *,
        pool: _network.AddressPool | None = None,
        templates_root: Path | None = None,
        id_mapping: _idmap.Mapping | None = _idmap.DEFAULT_MAPPING,  # None: sandbox root is host root
        templates: Iterable[Template] = (),  # already built: used as they are, never looked up again
        addresses: _addresses.AddressRegistry | None = None,  # default: the host's one registry
    ) -> None:
        self._dir = state_dir
        self._runtime = container_runtime
        self._mapping = id_mapping
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
            self._userns_fd = _idmap.userns_fd(id_mapping) if id_mapping is not None else None
            if id_mapping is not None:
                _hostfs.check_traversable(state_dir)
            (self._dir / "sandboxes").mkdir(parents=True, exist_ok=True)
            (self._dir / "snapshots").mkdir(parents=True, exist_ok=True)
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
        try:
            built: Template = ensure_template(template, cache_root=self._templates_root)
        except Exception as exc:  # the builder's own error says what failed
            raise TemplateNotFoundError(f"{template}: {exc}") from exc
        self._templates[template] = ([str(built.rootfs)], tuple(built.agent_command))
        return self._templates[template]

    # -- creating -------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        with _reported(f"creating sandbox {spec.sandbox_id}"):
            home = self._home(spec.sandbox_id)
            if home.exists():
                raise TransitionError(f"sandbox {spec.sandbox_id} already exists")
            lowers, command = await asyncio.to_thread(self._lowers, spec.template)
            async with self._lock(spec.sandbox_id):
                home.mkdir(parents=True)
                for name in ("upper", "work", "bundle/rootfs", "logs"):
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
                    },
                )
                self._save(record)
                try:
                    await asyncio.to_thread(self._provision, record)
                except BaseException:
                    await asyncio.to_thread(self._release, record)
                    raise
            return self._info(record)

    def _provision(self, record: Record) -> None:
        home = self._home(record.sandbox_id)
        # A lease whose record was never saved (a crash right here) is ended by reconcile().
        net = _network.plan(record.sandbox_id, self._addresses.allocate(self._owner, record.sandbox_id))
        record.network = net.to_record()
        self._save(record)  # recorded before it exists
        _network.create(net, egress=bool(record.spec["egress"]), policy=_policy(record.spec))
        lowers = self._map_lowers(record)
        record.mounted = True
        self._save(record)
        _hostfs.mount_overlay(lowers, home / "upper", home / "work", home / "bundle" / "rootfs")
        self._write_bundle(record, net)

    def _map_lowers(self, record: Record) -> list[str]:
        """Lower layers as the overlay sees them: templates through read-only idmapped binds.

        Snapshot layers were written by a sandbox's root, so they already carry the shifted
        owners and are used as they are. The writable layer belongs to the sandbox's root.
        """
        if self._mapping is None or self._userns_fd is None:
            return record.lowers
        home = self._home(record.sandbox_id)
        snapshots = str(self._dir / "snapshots")
        mapped = []
        for index, lower in enumerate(record.lowers):
            if lower.startswith(snapshots):
                mapped.append(lower)
                continue
            target = home / "lowers" / str(index)
            target.mkdir(parents=True, exist_ok=True)
            record.idmapped.append(str(target))
            self._save(record)  # recorded before it exists
            _idmap.idmapped_bind(lower, str(target), self._userns_fd)
            mapped.append(str(target))
        for name in ("upper", "work"):
            os.chown(home / name, self._mapping.base, self._mapping.base)
        return mapped

    def _write_bundle(self, record: Record, net: _network.SandboxNetwork) -> None:
        bundle = self._home(record.sandbox_id) / "bundle"
        hostname = record.spec["hostname"]
        (bundle / "hosts").write_text(_oci.hosts_file(hostname))
        (bundle / "resolv.conf").write_text(_oci.resolv_file([]))
        plan = _oci.ContainerPlan(
            rootfs=str(bundle / "rootfs"),
            netns_path=str(net.netns_path),
            hostname=hostname,
            hosts_file=str(bundle / "hosts"),
            resolv_file=str(bundle / "resolv.conf"),
            cgroup_path=f"{CGROUP_PARENT}/{record.sandbox_id}",
            command=tuple(record.spec["command"]),
            env={"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": record.sandbox_id, "E2B_TEMPLATE_ID": record.template},
            limits=_limits(record),
            id_mapping=self._mapping.oci() if self._mapping is not None else None,
        )
        (bundle / "config.json").write_text(json.dumps(_oci.config(plan), indent=1))

    # -- running, pausing, resuming -------------------------------------------------------

    async def start(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"starting sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                next_state(State(record.state), Action.START)
                await self._boot(record)
                record.state = State.RUNNING.value
                self._save(record)
            return self._info(record)

    async def _boot(self, record: Record) -> None:
        home = self._home(record.sandbox_id)
        container = f"e2b-{record.sandbox_id}-{secrets.token_hex(3)}"
        record.container = container
        self._save(record)
        log = home / "logs" / "sandbox.log"
        await self._runtime.create(home / "bundle", container, log)
        await self._runtime.start(container)
        assert record.network is not None
        net = _network.SandboxNetwork.from_record(record.network)
        await _wait_healthy(f"http://{net.sandbox_ip}:{ENVD_PORT}/health", log)

    async def pause(self, sandbox_id: str, *, memory: bool) -> SandboxInfo:
        with _reported(f"pausing sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                target = next_state(State(record.state), Action.PAUSE_MEMORY if memory else Action.PAUSE_FILESYSTEM)
                assert record.container is not None
                if memory:
                    await self._runtime.freeze(record.container)
                else:
                    await self._stop_container(record)
                record.state = target.value
                self._save(record)
            return self._info(record)

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"resuming sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                current = State(record.state)
                next_state(current, Action.RESUME)
                if current is State.PAUSED:
                    assert record.container is not None
                    await self._runtime.thaw(record.container)
                else:
                    await self._boot(record)
                record.state = State.RUNNING.value
                self._save(record)
            return self._info(record)

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
                await asyncio.to_thread(self._release, record)
            self._locks.pop(sandbox_id, None)
            return True

    def _release(self, record: Record) -> None:
        """Undo everything the record says exists, newest first; safe to repeat."""
        home = self._home(record.sandbox_id)
        if record.container:
            self._runtime.delete(record.container)
        for mount_point in [str(home / "bundle" / "rootfs"), *reversed(record.idmapped)]:
            _hostfs.unmount(mount_point)
        if record.network:
            net = _network.SandboxNetwork.from_record(record.network)
            _network.destroy(net)
            self._addresses.release(net.subnet, self._owner, record.sandbox_id)
        for controller in _CGROUP_CONTROLLERS:
            with contextlib.suppress(OSError):
                os.rmdir(f"/sys/fs/cgroup/{controller}/{CGROUP_PARENT}/{record.sandbox_id}")
        still = _hostfs.mounts_under(home)
        if still:  # never delete through a mount: it could reach a template
            raise BackendError(f"{record.sandbox_id}: still mounted, not deleting: {', '.join(still)}")
        shutil.rmtree(home, ignore_errors=True)

    # -- looking -------------------------------------------------------------------

    async def inspect(self, sandbox_id: str) -> SandboxInfo:
        with _reported(f"inspecting sandbox {sandbox_id}"):
            return self._info(self._record(sandbox_id))

    async def list(self) -> list[SandboxInfo]:
        with _reported("listing sandboxes"):
            records = self._records()
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
        upper = self._home(record.sandbox_id) / "upper"
        used = _hostfs.tree_bytes(upper)
        limit_mb = _limits(record).disk_mb
        if limit_mb is not None:
            return used, limit_mb << 20
        stat = os.statvfs(upper)
        return used, used + stat.f_bavail * stat.f_frsize

    def log_tail(self, sandbox_id: str, limit: int = 65536) -> bytes:
        log = self._home(sandbox_id) / "logs" / "sandbox.log"
        _hostfs.trim(log)
        try:
            data = log.read_bytes()
        except FileNotFoundError:
            return b""
        return data[-limit:]

    # -- snapshots ------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str) -> str:
        with _reported(f"taking a snapshot of sandbox {sandbox_id}"):
            async with self._lock(sandbox_id):
                record = self._record(sandbox_id)
                next_state(State(record.state), Action.SNAPSHOT)
                snapshot_id = f"snap-{secrets.token_hex(8)}"
                target = self._dir / "snapshots" / snapshot_id
                freeze = record.state == State.RUNNING.value and record.container is not None
                if freeze:  # a consistent copy: nothing writes while it is taken
                    assert record.container is not None
                    await self._runtime.freeze(record.container)
                try:
                    building = target.with_name(f".{snapshot_id}.build")
                    await asyncio.to_thread(_hostfs.copy_tree, self._home(sandbox_id) / "upper", building / "upper")
                    manifest = {
                        "lowers": record.lowers,
                        "agent_command": record.spec["command"],
                        "source": sandbox_id,
                        "template": record.template,
                    }
                    (building / "manifest.json").write_text(json.dumps(manifest, indent=1))
                    os.replace(building, target)
                finally:
                    if freeze:
                        assert record.container is not None
                        await self._runtime.thaw(record.container)
            return snapshot_id

    def snapshot_in_use(self, snapshot_id: str) -> bool:
        needle = str(self._dir / "snapshots" / snapshot_id / "upper")
        return any(needle in r.lowers for r in self._records()) or any(
            needle in json.loads(m.read_text())["lowers"] for m in (self._dir / "snapshots").glob("*/manifest.json")
        )

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        with _reported(f"deleting snapshot {snapshot_id}"):
            return await asyncio.to_thread(self._delete_snapshot, snapshot_id)

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
            return await asyncio.to_thread(self._reconcile)

    def _reconcile(self) -> ReconcileReport:
        adopted, cleaned = [], []
        known_netns = set()
        kept_subnets: set[tuple[str, str]] = set()
        for record in self._records():
            alive = record.container is not None and self._runtime.status(record.container) in ("running", "paused")
            mounted = _hostfs.is_mount(str(self._home(record.sandbox_id) / "bundle" / "rootfs"))
            intact_running = record.state in (State.RUNNING.value, State.PAUSED.value) and alive and mounted
            intact_idle = record.state in (State.CREATED.value, State.STOPPED.value) and mounted and not alive
            if intact_running or intact_idle:
                adopted.append(record.sandbox_id)
                if record.network:
                    net = _network.SandboxNetwork.from_record(record.network)
                    known_netns.add(net.netns)
                    kept_subnets.add((str(net.subnet), record.sandbox_id))
                continue
            self._release(record)
            cleaned.append(record.sandbox_id)
        others = set()
        for lease in self._addresses.leases():
            if lease.owner == self._owner:  # a lease of ours that no sandbox of ours holds any more
                stale = (str(lease.subnet), lease.key) not in kept_subnets
            else:  # another backend's, whose state folder is gone (a test's, a deleted data folder)
                stale = not (Path(lease.owner) / "sandboxes").is_dir()
                if not stale:  # its sandboxes have namespaces of the same prefix: not orphans
                    others.add(_network.NETNS_PREFIX + lease.key)
            if stale:
                self._addresses.release(lease.subnet, lease.owner, lease.key)
        for netns in _network.list_owned():
            if netns not in known_netns and netns not in others:
                # Names derive from the sandbox id alone; any subnet gives the same names to remove.
                orphan = _network.plan(netns[len(_network.NETNS_PREFIX) :], self._pool.allocate(set()))
                with contextlib.suppress(_network.NetworkError, ValueError):
                    _network.destroy(orphan)
                    cleaned.append(netns)
        for leftover in (self._dir / "sandboxes").iterdir():
            if not (leftover / "record.json").exists():
                shutil.rmtree(leftover, ignore_errors=True)
                cleaned.append(leftover.name)
        return ReconcileReport(tuple(adopted), tuple(cleaned))


def _policy(spec: dict[str, Any]) -> _network.EgressPolicy | None:
    allow, deny = tuple(spec.get("allow_out", ())), tuple(spec.get("deny_out", ()))
    return _network.EgressPolicy(allow, deny) if allow or deny else None


def _limits(record: Record) -> Limits:
    return Limits(**record.spec["limits"])


async def _wait_healthy(url: str, log: Path) -> None:
    deadline = time.monotonic() + _HEALTH_TIMEOUT_S
    async with httpx.AsyncClient(timeout=1.0) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(url)).status_code == 204:
                    return
            await asyncio.sleep(0.01)
    raise BackendError(f"the agent did not become healthy within {_HEALTH_TIMEOUT_S:.0f} s: {_hostfs.tail(log)}")
