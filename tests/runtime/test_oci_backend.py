"""The shared OCI backend without root: an in-memory container runtime, faults injected at the host seams.

The host's network, overlay mounts and disks are replaced by stand-ins (``no_host``), so what is tested is
``OciBackend`` itself: that it keeps the lifecycle with any ``ContainerRuntime`` (the shared state
machine, through the backend table), and that every failure below it comes out as a ``BackendError``
saying what failed. Real sandboxes on crun are test_crun.py's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from runtime import _addresses, _disk, _health, _hostfs, _idmap, _network, _oci_backend
from runtime._oci_backend import OciBackend
from runtime.backend import BackendError, SandboxSpec, State, TransitionError
from runtime.backends import BACKENDS, BackendEntry, BackendOptions, open_backend
from runtime.crun import CrunBackend
from runtime.templates import Template

from .test_backend_conformance import check_backend

T = TypeVar("T")
SECRET = "hunter2-not-in-any-message"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class MemoryRuntime:
    """A ``ContainerRuntime`` keeping containers in a dict; ``fail[step]`` is raised at that step."""

    name = "memory"
    passes_ready_fd = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.containers: dict[str, str] = {}
        self.fail: dict[str, BaseException] = {}

    def _step(self, step: str) -> None:
        if step in self.fail:
            raise self.fail[step]

    async def create(self, bundle: Path, container: str, log: Path, *, ready_fd: int | None = None) -> None:
        self._step("create")
        assert (bundle / "config.json").is_file()
        self.containers[container] = "created"

    async def start(self, container: str) -> None:
        self._step("start")
        self.containers[container] = "running"

    async def freeze(self, container: str) -> None:
        self._step("freeze")
        self.containers[container] = "paused"

    async def thaw(self, container: str) -> None:
        self._step("thaw")
        self.containers[container] = "running"

    def delete(self, container: str) -> None:
        self._step("delete")
        self.containers.pop(container, None)

    def status(self, container: str) -> str | None:
        return self.containers.get(container)

    def container_names(self) -> list[str]:
        self._step("list")
        return list(self.containers)

    def pid(self, container: str) -> int:
        assert container in self.containers
        return os.getpid()

    async def checkpoint(self, container: str, images: Path, *, config: Path, leave_running: bool = False) -> None:
        self._step("checkpoint")
        (images / "core-1.img").write_text(self.containers.pop(container))

    async def restore(self, bundle: Path, container: str, log: Path, images: Path, *, config: Path) -> int:
        self._step("restore")
        self.containers[container] = "running"
        return self.pid(container)


class MemoryOciBackend(OciBackend):
    """What a backend module for another OCI runtime amounts to: a name and its runtime."""

    name = "oci-memory"

    def __init__(self, state_dir: Path, *, templates: list[Template]) -> None:
        super().__init__(state_dir, MemoryRuntime(state_dir / "memory"), id_mapping=None, templates=templates)

    @property
    def runtime(self) -> MemoryRuntime:
        assert isinstance(self._runtime, MemoryRuntime)
        return self._runtime


@pytest.fixture
def no_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No firewall, network namespaces, overlay mounts or agent: the backend's host seams do nothing."""

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    async def healthy(url: str, log: Path, ready: object = None) -> None:
        return None

    for name in ("ensure_host_firewall", "create", "destroy", "set_policy"):
        monkeypatch.setattr(_network, name, nothing)
    monkeypatch.setattr(_network, "list_owned", lambda prefix=_network.NETNS_PREFIX: [])
    mounted: set[str] = set()  # the overlay mounts, as the backend sees them through _hostfs.is_mount

    def mount_overlay(lowers: list[str], upper: Path, work: Path, target: Path) -> None:
        mounted.add(str(target))

    def ensure_disk(image: Path, mount_point: Path, size_mb: int) -> None:
        image.touch()
        mount_point.mkdir(exist_ok=True)

    monkeypatch.setattr(_hostfs, "mount_overlay", mount_overlay)
    monkeypatch.setattr(_hostfs, "unmount", mounted.discard)
    monkeypatch.setattr(_hostfs, "is_mount", lambda path: path.rstrip("/") in mounted)
    monkeypatch.setattr(_hostfs, "mount_sysfs", nothing)
    monkeypatch.setattr(_hostfs, "with_setuid_root", lambda rootfs, argv, **_: argv)  # no mount to make setuid
    monkeypatch.setattr(_hostfs, "ensure_nosuid", nothing)
    monkeypatch.setattr(_disk, "ensure", ensure_disk)
    monkeypatch.setattr(_disk, "release", nothing)
    monkeypatch.setattr(_health, "wait_healthy", healthy)
    monkeypatch.setattr(_oci_backend, "_KILL_BACKOFF_S", 0.0)  # a failing kill retries at once
    # The address registry of this test alone, not the host's.
    monkeypatch.setattr(_addresses, "DEFAULT_REGISTRY", tmp_path / "addresses")
    monkeypatch.setattr(_addresses, "host_networks", list)


@pytest.fixture
def template(tmp_path: Path) -> Template:
    rootfs = tmp_path / "template" / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "issue").write_text("a template\n")
    return Template("base", "k" * 64, rootfs.parent, rootfs, ("/bin/agent",))


@pytest.fixture
def backend(tmp_path: Path, no_host: None, template: Template) -> Iterator[MemoryOciBackend]:
    oci = MemoryOciBackend(tmp_path / "state", templates=[template])
    yield oci
    for info in run(oci.list()):
        run(oci.kill(info.sandbox_id))


def spec(sandbox_id: str) -> SandboxSpec:
    return SandboxSpec(sandbox_id, "base", env={"TOKEN": SECRET})


def test_the_shared_backend_keeps_the_lifecycle_with_any_container_runtime(
    tmp_path: Path, no_host: None, template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    def open_memory(options: BackendOptions) -> MemoryOciBackend:
        return MemoryOciBackend(options.state_dir, templates=list(options.templates))

    entry = BackendEntry("oci-memory", open_memory, lambda say: None, "the shared OCI backend, in memory")
    monkeypatch.setitem(BACKENDS, "oci-memory", entry)
    monkeypatch.setattr(_oci_backend, "ensure_template", lambda name, cache_root=None: template)
    check_backend("oci-memory", tmp_path / "machine")


@pytest.mark.parametrize(
    "failure",
    [_network.NetworkError("ip -batch - failed (2): RTNETLINK answers: File exists"), PermissionError(13, "denied")],
)
def test_a_network_set_up_failure_surfaces_as_backend_error(
    backend: MemoryOciBackend, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(_network, "create", broken)
    with pytest.raises(BackendError) as info:
        run(backend.create(spec("net1")))
    assert str(failure) in str(info.value)
    assert SECRET not in str(info.value)
    if not isinstance(failure, BackendError):
        assert str(info.value).startswith("creating sandbox net1: ")
        assert info.value.__cause__ is failure
    # What was made before the failure is released: nothing is left of the sandbox.
    assert run(backend.list()) == []
    assert not (backend._dir / "sandboxes" / "net1").exists()
    assert run(backend.kill("net1")) is False


def test_a_mount_failure_surfaces_as_backend_error(backend: MemoryOciBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "mount")

    monkeypatch.setattr(_hostfs, "mount_overlay", broken)
    with pytest.raises(BackendError, match=r"^creating sandbox m1: .*mount"):
        run(backend.create(spec("m1")))
    assert run(backend.list()) == []


def test_the_disk_is_on_record_before_it_is_made_and_released_after_a_failure(
    backend: MemoryOciBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[str | None] = []
    released: list[Path] = []

    def disk_full(image: Path, mount_point: Path, size_mb: int) -> None:
        seen.append(_oci_backend.Record.load(image.parent / "record.json").disk)  # what a crash here leaves
        assert size_mb == _disk.DEFAULT_MB, "no disk size asked for: the default"
        raise OSError(28, "No space left on device", str(image))

    monkeypatch.setattr(_disk, "ensure", disk_full)
    monkeypatch.setattr(_disk, "release", lambda image, mount_point: released.append(image))
    with pytest.raises(BackendError, match=r"^creating sandbox d1: .*No space left"):
        run(backend.create(spec("d1")))
    image = tmp_path / "state" / "sandboxes" / "d1" / "disk.img"
    assert seen == [str(image)]
    assert released == [image]
    assert run(backend.list()) == []


def test_the_disk_and_the_network_are_made_at_once_and_both_end_before_a_failure_is_raised(
    backend: MemoryOciBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []

    def slow_network(*args: object, **kwargs: object) -> None:
        events.append("network started")
        time.sleep(0.3)
        events.append("network made")

    def disk_full(image: Path, mount_point: Path, size_mb: int) -> None:
        record = _oci_backend.Record.load(image.parent / "record.json")
        assert record.disk is not None, "the disk is on record before it is made"
        assert record.network is not None, "so is the network, made meanwhile"
        events.append("disk failed")
        raise OSError(28, "No space left on device", str(image))

    monkeypatch.setattr(_network, "create", slow_network)
    monkeypatch.setattr(_network, "destroy", lambda net: events.append("network destroyed"))
    monkeypatch.setattr(_disk, "ensure", disk_full)
    with pytest.raises(BackendError, match=r"^creating sandbox p1: .*No space left"):
        run(backend.create(spec("p1")))
    assert events.index("disk failed") < events.index("network made"), "the disk did not wait for the network"
    assert events.index("network made") < events.index("network destroyed"), "released only once it was made"
    assert run(backend.list()) == []


def test_a_runtime_failure_changes_nothing(backend: MemoryOciBackend) -> None:
    run(backend.create(spec("rt1")))
    backend.runtime.fail["start"] = OSError(5, "Input/output error")
    with pytest.raises(BackendError, match=r"^starting sandbox rt1: .*Input/output error"):
        run(backend.start("rt1"))
    assert run(backend.inspect("rt1")).state is State.CREATED
    del backend.runtime.fail["start"]
    assert run(backend.start("rt1")).state is State.RUNNING
    backend.runtime.fail["freeze"] = subprocess.TimeoutExpired(["memory", "pause"], 5)
    with pytest.raises(BackendError, match=r"^pausing sandbox rt1: "):
        run(backend.pause("rt1", memory=True))
    assert run(backend.inspect("rt1")).state is State.RUNNING
    with pytest.raises(BackendError, match=r"^taking a snapshot of sandbox rt1: "):
        run(backend.snapshot("rt1"))
    assert run(backend.inspect("rt1")).state is State.RUNNING
    backend.runtime.fail["delete"] = PermissionError(1, "Operation not permitted")
    with pytest.raises(BackendError, match=r"^killing sandbox rt1: "):
        run(backend.kill("rt1"))
    del backend.runtime.fail["delete"]
    assert run(backend.kill("rt1")) is True


def test_refusals_stay_what_they_are(backend: MemoryOciBackend) -> None:
    run(backend.create(spec("ref1")))
    with pytest.raises(TransitionError):
        run(backend.resume("ref1"))
    with pytest.raises(TransitionError):
        run(backend.create(spec("ref1")))


def test_a_network_rule_failure_surfaces_as_backend_error(
    backend: MemoryOciBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(backend.create(spec("pol1")))

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(19, "No such device")

    monkeypatch.setattr(_network, "set_policy", broken)
    monkeypatch.setattr(_network, "exists", lambda net: {"netns": True, "host_if": True})  # plugged
    with pytest.raises(BackendError, match=r"^changing the network rules of sandbox pol1: .*No such device"):
        run(backend.update_network("pol1", allow_internet_access=True, allow_out=(), deny_out=()))


def test_a_missing_crun_command_surfaces_as_backend_error(tmp_path: Path, no_host: None, template: Template) -> None:
    crun = CrunBackend(tmp_path / "state", crun=str(tmp_path / "no-crun-here"), id_mapping=None, templates=[template])
    run(crun.create(spec("c1")))
    with pytest.raises(BackendError, match=r"^starting sandbox c1: .*no-crun-here"):
        run(crun.start("c1"))
    assert run(crun.inspect("c1")).state is State.CREATED
    # Without the command nothing can be released either; the record stays, so a later kill can.
    with pytest.raises(BackendError, match=r"^killing sandbox c1: .*no-crun-here"):
        run(crun.kill("c1"))
    assert run(crun.inspect("c1")).state is State.CREATED


def test_opening_a_backend_on_a_host_that_cannot_run_it_is_a_backend_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_firewall() -> None:
        raise _network.NetworkError("nft not found: install the Debian package nftables")

    monkeypatch.setattr(_network, "ensure_host_firewall", no_firewall)
    monkeypatch.setattr(_idmap, "userns_fd", lambda mapping: os.open(os.devnull, os.O_RDONLY))
    options = BackendOptions(state_dir=tmp_path / "state")
    # pytest's temporary folders are private (0700): the sandbox's unprivileged root could not reach them.
    with pytest.raises(BackendError, match="not searchable by other users"):
        open_backend("crun", options)
    monkeypatch.setattr(_hostfs, "check_traversable", lambda folder: None)
    with pytest.raises(BackendError, match="nftables"):
        open_backend("crun", options)

    def no_userns(mapping: _idmap.Mapping) -> int:
        raise _idmap.IdmapError(1, "writing uid_map: Operation not permitted")

    monkeypatch.setattr(_idmap, "userns_fd", no_userns)
    with pytest.raises(BackendError, match=r"^setting up the crun backend in .*uid_map") as info:
        open_backend("crun", options)
    assert not isinstance(info.value, OSError)


# -- addresses: one registry for every backend on the host ---------------------------------------


def _subnet(backend: OciBackend, sandbox_id: str) -> str:
    record = backend._record(sandbox_id)
    assert record.network is not None
    return str(_network.SandboxNetwork.from_record(record.network).subnet)


def test_parallel_creates_of_two_servers_get_distinct_subnets(
    tmp_path: Path, no_host: None, template: Template
) -> None:
    """Two backends (two servers on one host) create 24 sandboxes at once: no /30 is handed out twice."""
    first = MemoryOciBackend(tmp_path / "one", templates=[template])
    second = MemoryOciBackend(tmp_path / "two", templates=[template])

    async def burst() -> None:
        creates = [(first if n % 2 == 0 else second).create(SandboxSpec(f"p{n}", "base")) for n in range(12)]
        creates += [second.create(SandboxSpec(f"q{n}", "base")) for n in range(12)]
        await asyncio.gather(*creates)

    run(burst())
    subnets = [_subnet(first, f"p{n}") for n in range(0, 12, 2)]
    subnets += [_subnet(second, f"p{n}") for n in range(1, 12, 2)]
    subnets += [_subnet(second, f"q{n}") for n in range(12)]
    assert len(subnets) == len(set(subnets)) == 24
    for backend in (first, second):
        for info in run(backend.list()):
            run(backend.kill(info.sandbox_id))
    assert _addresses.AddressRegistry().leases() == [], "every kill ended its lease"


def test_reconcile_leaves_another_servers_networks_alone(
    tmp_path: Path, no_host: None, template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = MemoryOciBackend(tmp_path / "mine", templates=[template])
    theirs = MemoryOciBackend(tmp_path / "theirs", templates=[template])
    run(theirs.create(SandboxSpec("theirs1", "base")))
    registry = _addresses.AddressRegistry()
    stale = registry.allocate(mine._owner, "crashed-before-its-record")  # a lease whose record was never saved
    destroyed: list[str] = []
    owned = [_network.NETNS_PREFIX + "theirs1", _network.NETNS_PREFIX + "orphan"]
    monkeypatch.setattr(_network, "list_owned", lambda prefix=_network.NETNS_PREFIX: owned)
    monkeypatch.setattr(_network, "destroy", lambda net: destroyed.append(net.netns))
    report = run(mine.reconcile())
    assert destroyed == [_network.NETNS_PREFIX + "orphan"]
    assert _network.NETNS_PREFIX + "theirs1" not in report.cleaned
    assert [lease.key for lease in registry.leases()] == ["theirs1"]
    assert stale not in {lease.subnet for lease in registry.leases()}


def test_reconcile_spares_a_network_another_server_makes_while_it_runs(
    tmp_path: Path, no_host: None, template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another server's create takes its lease, then makes its namespace: at any moment of our sweep.

    Seen live with two servers: a sweep that read the leases before it listed the namespaces
    took a namespace made in between for an orphan, and that tenant's agent never came up.
    """
    mine = MemoryOciBackend(tmp_path / "mine", templates=[template])
    theirs = MemoryOciBackend(tmp_path / "theirs", templates=[template])
    registry = _addresses.AddressRegistry()
    owned: list[str] = []
    destroyed: list[str] = []
    real_leases = _addresses.AddressRegistry.leases

    def leases_while_they_create(self: _addresses.AddressRegistry, owner: str | None = None) -> list[Any]:
        found = real_leases(self, owner)
        if not owned:  # their create, landing between the sweep's two reads
            registry.allocate(theirs._owner, "racing")
            owned.append(_network.NETNS_PREFIX + "racing")
        return found

    monkeypatch.setattr(_addresses.AddressRegistry, "leases", leases_while_they_create)
    monkeypatch.setattr(_network, "list_owned", lambda prefix=_network.NETNS_PREFIX: list(owned))
    monkeypatch.setattr(_network, "destroy", lambda net: destroyed.append(net.netns))
    run(mine.reconcile())
    assert destroyed == []


def test_reconcile_ends_the_leases_of_a_backend_whose_folder_is_gone(
    tmp_path: Path, no_host: None, template: Template
) -> None:
    registry = _addresses.AddressRegistry()
    registry.allocate(str(tmp_path / "deleted-long-ago"), "lost")  # a server killed, its data folder removed
    mine = MemoryOciBackend(tmp_path / "mine", templates=[template])
    run(mine.reconcile())
    assert registry.leases() == []


# -- faults: a host restart, a failing kill, a crash during a snapshot ------------------------------


def _restart_host(backend: MemoryOciBackend, tmp_path: Path) -> None:
    """What a reboot leaves: no processes, no mounts, an empty /run (the address registry)."""
    backend.runtime.containers.clear()
    for record in backend._records():
        _hostfs.unmount(str(backend._home(record.sandbox_id) / "bundle" / "rootfs"))
    for registry in (tmp_path / "addresses").glob("*.json"):
        registry.unlink()


def _upper(backend: OciBackend, sandbox_id: str) -> Path:
    return backend._layer(backend._record(sandbox_id)) / "upper"


def test_a_host_restart_keeps_every_sandbox_and_its_files(backend: MemoryOciBackend, tmp_path: Path) -> None:
    for name in ("run1", "mem1", "fs1", "new1"):
        run(backend.create(spec(name)))
    for name in ("run1", "mem1", "fs1"):
        run(backend.start(name))
        (_upper(backend, name) / "note.txt").write_text(f"written in {name}\n")
    run(backend.pause("mem1", memory=True))
    run(backend.pause("fs1", memory=False))
    _restart_host(backend, tmp_path)
    report = run(backend.reconcile())
    assert report.stopped == ("mem1", "run1"), "their processes ended with the host"
    assert set(report.adopted) == {"run1", "mem1", "fs1", "new1"}
    assert report.failed == ()
    assert {i.sandbox_id: i.state for i in run(backend.list())} == {
        "run1": State.STOPPED,
        "mem1": State.STOPPED,
        "fs1": State.STOPPED,
        "new1": State.CREATED,
    }
    leases = {lease.key for lease in _addresses.AddressRegistry().leases(backend._owner)}
    assert leases == {"run1", "mem1", "fs1", "new1"}, "each got a fresh lease"
    for name in ("run1", "mem1", "fs1"):
        assert _hostfs.is_mount(str(backend._home(name) / "bundle" / "rootfs")), "the overlay is mounted again"
        assert run(backend.resume(name)).state is State.RUNNING
        assert (_upper(backend, name) / "note.txt").read_text() == f"written in {name}\n"
    assert run(backend.start("new1")).state is State.RUNNING


def test_a_resume_re_creates_what_a_reconcile_could_not(
    backend: MemoryOciBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(backend.create(spec("late1")))
    run(backend.start("late1"))
    _restart_host(backend, tmp_path)
    real = backend._restore_network

    def hiccup(record: Any) -> None:
        raise BackendError("ip netns add: a passing failure")

    monkeypatch.setattr(backend, "_restore_network", hiccup)
    report = run(backend.reconcile())
    assert report.stopped == ("late1",)
    rootfs = str(backend._home("late1") / "bundle" / "rootfs")
    assert not _hostfs.is_mount(rootfs), "the restore stopped at the network"
    monkeypatch.setattr(backend, "_restore_network", real)
    assert run(backend.resume("late1")).state is State.RUNNING
    assert _hostfs.is_mount(rootfs), "the resume made the rest"


def _with_doomed_template(tmp_path: Path, template: Template) -> tuple[MemoryOciBackend, Path]:
    """A backend serving one more template, whose rootfs the test then removes."""
    rootfs = tmp_path / "doomed" / "rootfs"
    rootfs.mkdir(parents=True)
    doomed = Template("doomed", "d" * 64, rootfs.parent, rootfs, ("/bin/agent",))
    return MemoryOciBackend(tmp_path / "state", templates=[template, doomed]), rootfs


def test_a_sandbox_that_cannot_be_recreated_is_set_aside_with_its_files(
    tmp_path: Path, no_host: None, template: Template
) -> None:
    oci, rootfs = _with_doomed_template(tmp_path, template)
    run(oci.create(SandboxSpec("lost1", "doomed")))
    run(oci.start("lost1"))
    (_upper(oci, "lost1") / "work.txt").write_text("keep me\n")
    _restart_host(oci, tmp_path)
    rootfs.rmdir()  # its template is gone
    report = run(oci.reconcile())
    assert report.failed == ("lost1",)
    assert run(oci.list()) == []
    kept = tmp_path / "state" / _oci_backend.QUARANTINE / "lost1"
    assert "doomed/rootfs" in (kept / "failed.txt").read_text()
    assert [p.read_text() for p in kept.rglob("work.txt")] == ["keep me\n"]
    assert _addresses.AddressRegistry().leases() == []
    assert run(oci.reconcile()).failed == ("lost1",), "reported until the operator removes it"


def test_a_create_cut_short_that_cannot_be_recreated_is_released_not_set_aside(
    tmp_path: Path, no_host: None, template: Template
) -> None:
    """Never started, so nothing of a tenant's is in it: a crash mid-create leaves no quarantined folder."""
    oci, rootfs = _with_doomed_template(tmp_path, template)
    run(oci.create(SandboxSpec("cut1", "doomed")))  # created, never started (the server died here)
    _restart_host(oci, tmp_path)
    rootfs.rmdir()
    report = run(oci.reconcile())
    assert report.failed == ()
    assert "cut1" in report.cleaned
    assert not (tmp_path / "state" / _oci_backend.QUARANTINE / "cut1").exists()
    assert not (tmp_path / "state" / "sandboxes" / "cut1").exists()
    assert _addresses.AddressRegistry().leases() == []


def test_a_failing_kill_is_retried_and_never_forgets_the_sandbox(
    backend: MemoryOciBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(backend.create(spec("k1")))
    run(backend.start("k1"))
    real_delete, calls = backend.runtime.delete, []

    def flaky(container: str) -> None:
        calls.append(container)
        if len(calls) < 3:
            raise BackendError("crun delete: Device or resource busy")
        real_delete(container)

    monkeypatch.setattr(backend.runtime, "delete", flaky)
    assert run(backend.kill("k1")) is True
    assert len(calls) == 3, "two failures, then the third attempt released it"
    assert run(backend.list()) == []

    run(backend.create(spec("k2")))
    run(backend.start("k2"))
    backend.runtime.fail["delete"] = BackendError("crun delete: Device or resource busy")
    with pytest.raises(BackendError, match=r"^killing sandbox k2: releasing it failed 4 times"):
        run(backend.kill("k2"))
    assert backend._record("k2").releasing, "kept on record, marked for release"
    report = run(backend.reconcile())
    assert "k2" not in report.adopted, "a half-killed sandbox is never brought back"
    assert backend._record("k2").releasing
    del backend.runtime.fail["delete"]
    assert "k2" in run(backend.reconcile()).cleaned
    assert run(backend.list()) == []


def test_reconcile_after_a_crash_during_a_snapshot(backend: MemoryOciBackend) -> None:
    """A crash while the copy runs: the sandbox stays frozen and a partial copy stays behind."""
    run(backend.create(spec("s1")))
    run(backend.start("s1"))
    container = backend._record("s1").container
    assert container is not None
    run(backend.runtime.freeze(container))
    partial = backend._dir / "snapshots" / ".snap-0123456789abcdef.build"
    (partial / "upper").mkdir(parents=True)
    report = run(backend.reconcile())
    assert backend.runtime.status(container) == "running", "thawed"
    assert run(backend.inspect("s1")).state is State.RUNNING
    assert report.adopted == ("s1",)
    assert report.stopped == ()
    assert not partial.exists()
    assert partial.name in report.cleaned


def test_a_memory_paused_sandbox_stays_frozen_through_reconcile(backend: MemoryOciBackend) -> None:
    run(backend.create(spec("p1")))
    run(backend.start("p1"))
    run(backend.pause("p1", memory=True))
    run(backend.reconcile())
    assert run(backend.inspect("p1")).state is State.PAUSED
    container = backend._record("p1").container
    assert container is not None
    assert backend.runtime.status(container) == "paused"


def test_reconcile_deletes_the_containers_no_record_names_and_nothing_else(backend: MemoryOciBackend) -> None:
    run(backend.create(spec("c1")))
    run(backend.start("c1"))
    run(backend.create(spec("c2")))  # provisioned only: no container yet
    own = backend._record("c1").container
    assert own is not None
    run(backend.create(spec("c3")))
    run(backend.start("c3"))
    releasing = backend._record("c3")
    releasing.releasing = True  # a kill a crash cut short: reconcile finishes it, container and all
    backend._save(releasing)
    (backend._dir / "sandboxes" / "bad1").mkdir()
    (backend._dir / "sandboxes" / "bad1" / "record.json").write_text("{not json")
    left = {
        "e2b-c1-0a1b2c": "running",  # a second container of c1: a start cut short
        "e2b-gone1-abcdef": "stopped",  # a sandbox whose record is gone
        "e2b-c2-123456": "created",  # c2's record names none
    }
    kept = {
        "e2b-bad1-abcdef": "running",  # its record cannot be read: the operator's to look at
        "operator-box": "running",  # not a sandbox's name
        "e2b-c1-notahex": "running",
    }
    backend.runtime.containers.update(left | kept)
    report = run(backend.reconcile())
    assert set(backend.runtime.containers) == {own, *kept}
    assert set(left) <= set(report.cleaned)
    assert "c3" in report.cleaned
    assert releasing.container not in report.cleaned, "deleted by the release, not taken for a leftover"
    assert backend.runtime.status(own) == "running"
    assert run(backend.inspect("c1")).state is State.RUNNING
    assert run(backend.inspect("c2")).state is State.CREATED
    assert run(backend.start("c2")).state is State.RUNNING


def test_reconcile_goes_on_when_the_runtime_cannot_list_or_delete(backend: MemoryOciBackend) -> None:
    run(backend.create(spec("c1")))
    run(backend.start("c1"))
    backend.runtime.containers["e2b-gone1-abcdef"] = "running"
    backend.runtime.fail["delete"] = BackendError("crun delete failed")
    report = run(backend.reconcile())
    assert "e2b-gone1-abcdef" in backend.runtime.containers, "kept, and tried again by the next reconcile"
    assert "e2b-gone1-abcdef" not in report.cleaned
    assert report.adopted == ("c1",)
    del backend.runtime.fail["delete"]
    backend.runtime.fail["list"] = BackendError("crun list failed")
    report = run(backend.reconcile())
    assert report.adopted == ("c1",)
    del backend.runtime.fail["list"]
    assert "e2b-gone1-abcdef" in run(backend.reconcile()).cleaned
    assert "e2b-gone1-abcdef" not in backend.runtime.containers


def test_a_backend_registers_as_a_user_of_its_templates(tmp_path: Path, no_host: None) -> None:
    from runtime.templates._users import lowers_in_use

    cache = tmp_path / "cache" / "templates"
    rootfs = cache / "base-0000000000000000" / "rootfs"
    rootfs.mkdir(parents=True)
    oci = MemoryOciBackend(tmp_path / "state", templates=[Template("base", "0" * 64, rootfs.parent, rootfs, ("a",))])
    served = {os.path.realpath(rootfs)}
    assert lowers_in_use(cache) == served, "served by this live process, before any sandbox uses it"
    run(oci.create(SandboxSpec("u1", "base")))
    assert lowers_in_use(cache) == served
    run(oci.kill("u1"))
    assert lowers_in_use(cache) == served


def test_a_cancelled_create_releases_after_its_provision_ended(
    backend: MemoryOciBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provision runs in a thread that a cancel does not stop: releasing before it ends would leak."""
    began, go_on = threading.Event(), threading.Event()
    order: list[str] = []
    provision, release = OciBackend._provision, OciBackend._release

    def slow_provision(self: OciBackend, record: _oci_backend.Record) -> None:
        began.set()
        go_on.wait(10)
        provision(self, record)
        order.append("provisioned")

    def recorded_release(self: OciBackend, record: _oci_backend.Record) -> None:
        order.append("released")
        release(self, record)

    monkeypatch.setattr(OciBackend, "_provision", slow_provision)
    monkeypatch.setattr(OciBackend, "_release", recorded_release)

    async def main() -> None:
        creating = asyncio.create_task(backend.create(spec("c1")))
        await asyncio.to_thread(began.wait, 10)
        creating.cancel()
        await asyncio.sleep(0.05)
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await creating

    run(main())
    assert order == ["provisioned", "released"]
    assert run(backend.list()) == []
