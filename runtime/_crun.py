"""The crun backend: one OCI bundle per sandbox, overlay root filesystem, own netns and cgroup.

Per sandbox, under ``<state>/sandboxes/<id>/``::

    record.json   every resource the sandbox owns, written *before* the resource is made
    upper/ work/  the overlay's writable layer (kept across a filesystem-only pause)
    bundle/       config.json, hosts, resolv.conf, rootfs/ (the overlay mount point)
    logs/         the sandbox's output (trimmed to a bounded size)

crun keeps its own state under ``<state>/crun`` (``crun --root``) so nothing here mixes
with other users of crun on the host, and ``reconcile()`` can compare both views.

Lifecycle: create = record + overlay + network + ``crun create``; start = ``crun start``
then wait for the agent's ``/health``; pause(memory) = ``crun pause`` (cgroup freezer);
pause(filesystem) = ``crun kill``/``delete`` keeping ``upper/``; resume = ``crun resume``,
or a fresh ``crun create``+``start`` on the same writable layer; kill releases everything
in reverse order and removes the record last.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from . import _idmap, _network, _oci
from ._backend import (
    Action,
    BackendError,
    Limits,
    Metrics,
    ReconcileReport,
    SandboxInfo,
    SandboxNotFoundError,
    SandboxSpec,
    State,
    TemplateNotFoundError,
    TransitionError,
    next_state,
)
from .templates import Template, ensure_template

AGENT_PORT = 49983
CGROUP_PARENT = "e2b-compat"
_LOG_LIMIT = 4 << 20  # bytes kept per sandbox log
_HEALTH_TIMEOUT_S = 30.0


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


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise BackendError(f"{' '.join(args[:3])}… failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return proc


class CrunBackend:
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
    ) -> None:
        self._dir = state_dir
        self._crun = crun
        self._mapping = id_mapping
        self._userns_fd = _idmap.userns_fd(id_mapping) if id_mapping is not None else None
        if id_mapping is not None:
            _check_traversable(state_dir)
        self._pool = pool or _network.AddressPool()
        self._templates_root = templates_root
        self._locks: dict[str, asyncio.Lock] = {}
        # Templates are immutable once built; resolving one hashes the source tree, so once per name.
        self._templates: dict[str, tuple[list[str], tuple[str, ...]]] = {
            built.name: ([str(built.rootfs)], tuple(built.agent_command)) for built in templates
        }
        (self._dir / "sandboxes").mkdir(parents=True, exist_ok=True)
        (self._dir / "snapshots").mkdir(parents=True, exist_ok=True)
        (self._dir / "crun").mkdir(parents=True, exist_ok=True)
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

    def _crun_cmd(self, *args: str) -> list[str]:
        return [self._crun, "--root", str(self._dir / "crun"), *args]

    def _info(self, record: Record) -> SandboxInfo:
        host = None
        if record.state == State.RUNNING.value and record.network is not None:
            host = str(_network.SandboxNetwork.from_record(record.network).sandbox_ip)
        return SandboxInfo(record.sandbox_id, record.template, State(record.state), host)

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

    # -- lifecycle ------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
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
        used = {_network.SandboxNetwork.from_record(r.network).subnet for r in self._records() if r.network}
        net = _network.plan(record.sandbox_id, self._pool.allocate(used))
        record.network = net.to_record()
        self._save(record)  # recorded before it exists
        _network.create(net, egress=bool(record.spec["egress"]), policy=_policy(record.spec))
        lowers = self._map_lowers(record)
        record.mounted = True
        self._save(record)
        _run(
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={':'.join(lowers)},upperdir={home / 'upper'},workdir={home / 'work'}",
            str(home / "bundle" / "rootfs"),
        )
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
        home = self._home(record.sandbox_id)
        bundle = home / "bundle"
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

    async def start(self, sandbox_id: str) -> SandboxInfo:
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
        with log.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *self._crun_cmd("create", "--bundle", str(home / "bundle"), container),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                # The container's init inherits this session: in the caller's, a signal to the
                # caller's process group (Ctrl-C, a supervisor stopping the server) would reach
                # every sandbox. Sandboxes outlive the server; startup reconciliation adopts them.
                start_new_session=True,
            )
            code = await proc.wait()
        if code != 0:
            raise BackendError(f"crun create failed for {record.sandbox_id}: {_tail(log)}")
        await _checked(self._crun_cmd("start", container))
        assert record.network is not None
        net = _network.SandboxNetwork.from_record(record.network)
        await _wait_healthy(f"http://{net.sandbox_ip}:{AGENT_PORT}/health", log)

    async def pause(self, sandbox_id: str, *, memory: bool) -> SandboxInfo:
        async with self._lock(sandbox_id):
            record = self._record(sandbox_id)
            target = next_state(State(record.state), Action.PAUSE_MEMORY if memory else Action.PAUSE_FILESYSTEM)
            assert record.container is not None
            if memory:
                await _checked(self._crun_cmd("pause", record.container))
            else:
                await self._stop_container(record)
            record.state = target.value
            self._save(record)
        return self._info(record)

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        async with self._lock(sandbox_id):
            record = self._record(sandbox_id)
            current = State(record.state)
            next_state(current, Action.RESUME)
            if current is State.PAUSED:
                assert record.container is not None
                await _checked(self._crun_cmd("resume", record.container))
            else:
                await self._boot(record)
            record.state = State.RUNNING.value
            self._save(record)
        return self._info(record)

    async def _stop_container(self, record: Record) -> None:
        if record.container is None:
            return
        await asyncio.to_thread(self._delete_container, record.container)
        record.container = None
        self._save(record)

    def _delete_container(self, container: str) -> None:
        # SIGKILL reaches every process in the container's pid namespace through PID 1's death.
        _run(*self._crun_cmd("kill", container, "KILL"), check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _run(*self._crun_cmd("delete", "--force", container), check=False).returncode == 0:
                return
            if "does not exist" in _run(*self._crun_cmd("state", container), check=False).stderr:
                return
            time.sleep(0.05)
        raise BackendError(f"could not delete container {container}")

    async def kill(self, sandbox_id: str) -> bool:
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
            self._delete_container(record.container)
        rootfs = home / "bundle" / "rootfs"
        for mount_point in [str(rootfs), *reversed(record.idmapped)]:
            # The mount table, not os.path.ismount: a bind from the same filesystem has the same st_dev.
            if _is_mount(mount_point):
                _run("umount", mount_point, check=False)
                if _is_mount(mount_point):
                    _run("umount", "-l", mount_point)
        if record.network:
            _network.destroy(_network.SandboxNetwork.from_record(record.network))
        for controller in ("memory", "pids", "cpu", "cpuacct", "cpuset", "devices", "freezer", "blkio", "hugetlb"):
            with contextlib.suppress(OSError):
                os.rmdir(f"/sys/fs/cgroup/{controller}/{CGROUP_PARENT}/{record.sandbox_id}")
        still = _mounts_under(home)
        if still:  # never delete through a mount: it could reach a template
            raise BackendError(f"{record.sandbox_id}: still mounted, not deleting: {', '.join(still)}")
        shutil.rmtree(home, ignore_errors=True)

    async def inspect(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self._record(sandbox_id))

    def _records(self) -> list[Record]:
        out = []
        for path in sorted((self._dir / "sandboxes").glob("*/record.json")):
            with contextlib.suppress(OSError, ValueError, TypeError):
                out.append(Record.load(path))
        return out

    async def list(self) -> list[SandboxInfo]:
        records = self._records()
        for record in records:  # listing is the server's periodic sweep: keep logs bounded there
            _trim(self._home(record.sandbox_id) / "logs" / "sandbox.log")
        return [self._info(r) for r in records]

    async def metrics(self, sandbox_id: str) -> Metrics:
        record = self._record(sandbox_id)
        limits = _limits(record)
        cgroup = f"{CGROUP_PARENT}/{sandbox_id}"
        disk_used, disk_total = await asyncio.to_thread(self._disk, record)
        return Metrics(
            cpu_count=limits.cpu_count,
            cpu_usage_ns=_read_int(f"/sys/fs/cgroup/cpuacct/{cgroup}/cpuacct.usage"),
            memory_bytes=_read_int(f"/sys/fs/cgroup/memory/{cgroup}/memory.usage_in_bytes"),
            memory_limit_bytes=limits.memory_mb << 20,
            pids=_read_int(f"/sys/fs/cgroup/pids/{cgroup}/pids.current"),
            disk_used_bytes=disk_used,
            disk_total_bytes=disk_total,
        )

    def _disk(self, record: Record) -> tuple[int, int]:
        upper = self._home(record.sandbox_id) / "upper"
        used = _tree_bytes(upper)
        limit_mb = _limits(record).disk_mb
        if limit_mb is not None:
            return used, limit_mb << 20
        stat = os.statvfs(upper)
        return used, used + stat.f_bavail * stat.f_frsize

    async def snapshot(self, sandbox_id: str) -> str:
        async with self._lock(sandbox_id):
            record = self._record(sandbox_id)
            next_state(State(record.state), Action.SNAPSHOT)
            snapshot_id = f"snap-{secrets.token_hex(8)}"
            target = self._dir / "snapshots" / snapshot_id
            freeze = record.state == State.RUNNING.value and record.container is not None
            if freeze:  # a consistent copy: nothing writes while it is taken
                assert record.container is not None
                await _checked(self._crun_cmd("pause", record.container))
            try:
                building = target.with_name(f".{snapshot_id}.build")
                await asyncio.to_thread(_copy_tree, self._home(sandbox_id) / "upper", building / "upper")
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
                    await _checked(self._crun_cmd("resume", record.container))
        return snapshot_id

    def snapshot_in_use(self, snapshot_id: str) -> bool:
        needle = str(self._dir / "snapshots" / snapshot_id / "upper")
        return any(needle in r.lowers for r in self._records()) or any(
            needle in json.loads(m.read_text())["lowers"] for m in (self._dir / "snapshots").glob("*/manifest.json")
        )

    async def delete_snapshot(self, snapshot_id: str) -> bool:
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

    async def update_network(
        self, sandbox_id: str, *, allow_internet_access: bool, allow_out: tuple[str, ...], deny_out: tuple[str, ...]
    ) -> None:
        async with self._lock(sandbox_id):
            record = self._record(sandbox_id)
            if record.network is None:
                raise TransitionError(f"sandbox {sandbox_id} has no network yet")
            record.spec.update(egress=allow_internet_access, allow_out=list(allow_out), deny_out=list(deny_out))
            net = _network.SandboxNetwork.from_record(record.network)
            await asyncio.to_thread(_network.set_policy, net, egress=allow_internet_access, policy=_policy(record.spec))
            self._save(record)

    async def address(self, sandbox_id: str, port: int) -> tuple[str, int]:
        record = self._record(sandbox_id)
        if record.state != State.RUNNING.value or record.network is None:
            raise TransitionError(f"sandbox {sandbox_id} is {record.state}")
        return str(_network.SandboxNetwork.from_record(record.network).sandbox_ip), port

    async def reconcile(self) -> ReconcileReport:
        return await asyncio.to_thread(self._reconcile)

    def _reconcile(self) -> ReconcileReport:
        adopted, cleaned = [], []
        known_netns = set()
        for record in self._records():
            alive = record.container is not None and _container_status(self._crun_cmd, record.container) in (
                "running",
                "paused",
            )
            mounted = _is_mount(str(self._home(record.sandbox_id) / "bundle" / "rootfs"))
            intact_running = record.state in (State.RUNNING.value, State.PAUSED.value) and alive and mounted
            intact_idle = record.state in (State.CREATED.value, State.STOPPED.value) and mounted and not alive
            if intact_running or intact_idle:
                adopted.append(record.sandbox_id)
                if record.network:
                    known_netns.add(_network.SandboxNetwork.from_record(record.network).netns)
                continue
            self._release(record)
            cleaned.append(record.sandbox_id)
        for netns in _network.list_owned():
            if netns not in known_netns:
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

    def log_tail(self, sandbox_id: str, limit: int = 65536) -> bytes:
        log = self._home(sandbox_id) / "logs" / "sandbox.log"
        _trim(log)
        try:
            data = log.read_bytes()
        except FileNotFoundError:
            return b""
        return data[-limit:]


def _policy(spec: dict[str, Any]) -> _network.EgressPolicy | None:
    allow, deny = tuple(spec.get("allow_out", ())), tuple(spec.get("deny_out", ()))
    return _network.EgressPolicy(allow, deny) if allow or deny else None


def _limits(record: Record) -> Limits:
    return Limits(**record.spec["limits"])


def _container_status(cmd: Callable[..., list[str]], container: str) -> str | None:
    proc = subprocess.run(cmd("state", container), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    status: str = json.loads(proc.stdout).get("status", "")
    return status


async def _checked(cmd: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise BackendError(f"{' '.join(cmd[3:5])} failed ({proc.returncode}): {err.decode(errors='replace')[-500:]}")


async def _wait_healthy(url: str, log: Path) -> None:
    deadline = time.monotonic() + _HEALTH_TIMEOUT_S
    async with httpx.AsyncClient(timeout=1.0) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(url)).status_code == 204:
                    return
            await asyncio.sleep(0.01)
    raise BackendError(f"the agent did not become healthy within {_HEALTH_TIMEOUT_S:.0f} s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_bytes()[-800:].decode(errors="replace")
    except OSError:
        return "(no log)"


def _trim(log: Path) -> None:
    """Keep the log bounded: writers append (O_APPEND), so truncating under them is safe."""
    try:
        size = log.stat().st_size
    except FileNotFoundError:
        return
    if size > _LOG_LIMIT:
        with log.open("r+b") as handle:
            handle.seek(size - _LOG_LIMIT // 2)
            tail = handle.read()
            handle.seek(0)
            handle.write(tail)
            handle.truncate()


def _check_traversable(folder: Path) -> None:
    """The sandbox's root is an unprivileged host uid: it must be able to walk to its bundle."""
    for part in [folder, *folder.parents]:
        if part.exists() and not part.stat().st_mode & 0o001:
            raise BackendError(
                f"{part} is not searchable by other users (mode {part.stat().st_mode & 0o777:o}); "
                "sandboxes run as an unprivileged uid and need to reach their bundles"
            )


def _mount_points() -> list[str]:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return [line.split()[1].replace("\\040", " ") for line in mounts if len(line.split()) > 1]


def _is_mount(path: str) -> bool:
    return path.rstrip("/") in _mount_points()


def _mounts_under(folder: Path) -> list[str]:
    prefix = str(folder).rstrip("/") + "/"
    return [point for point in _mount_points() if point.startswith(prefix)]


def _tree_bytes(root: Path) -> int:
    """Bytes allocated under ``root`` (as du counts them), without following symlinks."""
    total = 0
    stack = [str(root)]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total


def _read_int(path: str) -> int:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _copy_tree(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # cp -a keeps owners, modes, xattrs and overlay whiteouts (0:0 character devices).
    _run("cp", "-a", "--reflink=auto", str(source), str(target))
