"""Real sandboxes on crun: isolation, limits, pause, snapshots, crash recovery, leaks.

Needs root, crun and the ``base`` template (built once, then cached); CI runs these as root.
Each test kills what it created; the leak test checks that killing really releases all of it.
The lifecycle conformance of crun is the shared state machine's (test_backend_conformance.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pyqwest
import pytest

from contract.generated.process import process_connect
from contract.generated.process import process_pb2 as ppb
from contract.protocol import ENVD_PORT
from runtime import _checkpoint_tools, _hostfs, _ksm, _network, _oci
from runtime.backend import Feature, Limits, SandboxSpec, State, TransitionError
from runtime.crun import CGROUP_PARENT, CrunBackend, CrunCommand, _held_by_criu
from runtime.host import ksm_counters
from runtime.host import prepare as prepare_host
from runtime.templates import ensure_template

pytestmark = [
    pytest.mark.artifacts,
    pytest.mark.skipif(os.geteuid() != 0, reason="crun sandboxes need root (namespaces, mounts, cgroups)"),
]

T = TypeVar("T")
SMALL = Limits(cpu_count=1, memory_mb=256, pids=128)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _crun_executable() -> str:
    tools = _checkpoint_tools.find()
    return str(tools.crun) if tools is not None else "crun"


def crun_backend(state_dir: Path, **options: Any) -> CrunBackend:
    """The backend as a server opens it here: with the checkpoint tools when the host built them."""
    return CrunBackend(state_dir, checkpoint_tools=_checkpoint_tools.find(), **options)


@pytest.fixture(scope="module")
def state_dir() -> Iterator[Path]:
    prepare_host(say=lambda msg: print(f"host set-up: {msg}"))
    ensure_template("base")  # built (or found) once, before anything is timed or generated
    # Not under pytest's private temp root: sandbox root is an unprivileged uid and must reach its bundle.
    folder = Path(tempfile.mkdtemp(prefix="e2b-compat-crun-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    leftovers = [line for line in Path("/proc/mounts").read_text().splitlines() if str(folder) in line]
    assert not leftovers, f"mounts left behind: {leftovers}"
    shutil.rmtree(folder)


@pytest.fixture
def backend(state_dir: Path) -> Iterator[CrunBackend]:
    crun = crun_backend(state_dir)
    yield crun
    for info in run(crun.list()):
        run(crun.kill(info.sandbox_id))


def shell(
    host: str, command: str, timeout_ms: int = 20_000, *, fresh_connection: bool = False
) -> tuple[int, bytes, bytes]:
    """Run a command in the sandbox through its agent; (exit code, stdout, stderr).

    Connections are pooled across calls; ``fresh_connection`` opens a new one, as a sandbox
    whose kernel died (gVisor's netstack is in it) never closed the old ones.
    """
    http_client = pyqwest.SyncClient(pyqwest.SyncHTTPTransport()) if fresh_connection else None
    client = process_connect.ProcessClientSync(
        f"http://{host}:{ENVD_PORT}", timeout_ms=timeout_ms, http_client=http_client
    )
    out, err, code = b"", b"", None
    for response in client.start(ppb.StartRequest(process=ppb.ProcessConfig(cmd="/bin/bash", args=["-c", command]))):
        event = response.event
        if event.HasField("data"):
            out += event.data.stdout
            err += event.data.stderr
        if event.HasField("end"):
            code = event.end.exit_code
    assert code is not None
    return code, out, err


def started(backend: CrunBackend, sandbox_id: str, template: str = "base", limits: Limits = SMALL) -> str:
    run(backend.create(SandboxSpec(sandbox_id, template, limits=limits)))
    info = run(backend.start(sandbox_id))
    assert info.host is not None
    return info.host


def test_agent_answers_and_processes_are_isolated(backend: CrunBackend) -> None:
    host = started(backend, "iso1")
    assert httpx.get(f"http://{host}:{ENVD_PORT}/health").status_code == 204
    code, out, _ = shell(host, "ps -e -o pid=")
    pids = [int(p) for p in out.split()]
    assert code == 0
    assert 1 in pids
    assert os.getpid() not in pids or len(pids) < 10, "host processes are not visible"
    assert len(pids) < 10
    _, hostname, _ = shell(host, "hostname")
    assert hostname.strip() == b"iso1"
    # seccomp: even root inside cannot mount, make namespaces or load kernel modules.
    for attempt in (
        "mount -t tmpfs none /mnt",
        "unshare --mount true",
        "python3 -c 'import ctypes, os; assert ctypes.CDLL(None, use_errno=True).syscall(175, 0, 0, 0) == 0'",
    ):
        code, _, _ = shell(host, attempt)
        assert code != 0, f"{attempt!r} succeeded inside the sandbox"


def test_sandboxes_do_not_share_files_or_reach_each_other(backend: CrunBackend) -> None:
    a = started(backend, "isoa")
    b = started(backend, "isob")
    assert shell(a, "echo secret > /home/user/secret.txt")[0] == 0
    assert shell(b, "test -e /home/user/secret.txt")[0] != 0
    shell(a, "nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 &")
    for _ in range(50):
        try:
            if httpx.get(f"http://{a}:8000/", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
    else:
        pytest.fail("the host cannot reach a port inside the sandbox")
    code, _, _ = shell(b, f"curl -s -m 2 -o /dev/null http://{a}:8000/")
    assert code != 0, "one sandbox must not reach another's ports"


def test_host_services_are_unreachable(backend: CrunBackend) -> None:
    server = socket.socket()
    server.bind(("0.0.0.0", 0))  # the point is a host service on every address
    server.listen()
    port = server.getsockname()[1]
    accepted: list[object] = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True)
    thread.start()
    try:
        host = started(backend, "isoh")
        net = _network.SandboxNetwork.from_record(backend._record("isoh").network or {})
        for target in ("127.0.0.1", str(net.host_ip)):
            code, _, _ = shell(host, f"curl -s -m 2 -o /dev/null http://{target}:{port}/")
            assert code != 0, f"a host service was reachable at {target}"
        assert shell(host, "ip route | grep -c default || true")[1].strip() == b"0", "no default route: no egress"
    finally:
        server.close()
    assert not accepted


def test_fork_bomb_is_stopped_by_the_pids_limit(backend: CrunBackend) -> None:
    host = started(backend, "lim1", limits=Limits(cpu_count=1, memory_mb=256, pids=64))
    shell(host, "setsid bash -c 'bomb() { bomb | bomb & }; bomb' >/dev/null 2>&1 </dev/null &")
    time.sleep(3)
    assert run(backend.metrics("lim1")).pids <= 64
    # The agent was already running: it still answers, and the host is unaffected.
    assert httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=5).status_code == 204
    # A filesystem pause ends every process in the sandbox; it comes back healthy.
    run(backend.pause("lim1", memory=False))
    host = run(backend.resume("lim1")).host or ""
    assert shell(host, "echo recovered")[1] == b"recovered\n"


def test_memory_hog_is_stopped_by_the_memory_limit(backend: CrunBackend) -> None:
    host = started(backend, "lim2", limits=Limits(cpu_count=1, memory_mb=256, pids=128))
    code, out, _ = shell(host, "python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'")
    assert code != 0, "a 1 GiB allocation must fail inside a 256 MiB sandbox"
    assert out == b""
    assert httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=5).status_code == 204, "the agent survived"


def test_writes_never_reach_the_template(backend: CrunBackend) -> None:
    host = started(backend, "tpl1")
    assert shell(host, "echo changed > /etc/sandbox-marker && rm -f /etc/issue")[0] == 0
    lowers = backend._record("tpl1").lowers
    template_root = Path(lowers[-1])
    assert not (template_root / "etc" / "sandbox-marker").exists()
    assert (template_root / "etc" / "issue").exists()


def test_pause_resume_memory_and_filesystem(backend: CrunBackend) -> None:
    host = started(backend, "pz1")
    _, pid, _ = shell(host, "nohup sleep 600 >/dev/null 2>&1 & echo $!")
    shell(host, "echo kept > /home/user/kept.txt")
    assert run(backend.pause("pz1", memory=True)).state is State.PAUSED
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=1)
    run(backend.resume("pz1"))
    # Connections do not outlive a checkpoint (CRIU's tcp-close): a new one, as the server's proxy opens.
    assert shell(host, f"kill -0 {pid.decode().strip()}", fresh_connection=True)[0] == 0, (
        "a memory pause keeps processes"
    )
    run(backend.pause("pz1", memory=False))
    host = run(backend.resume("pz1")).host or ""
    assert shell(host, f"kill -0 {pid.decode().strip()}", fresh_connection=True)[0] != 0, (
        "a filesystem pause ends processes"
    )
    assert shell(host, "cat /home/user/kept.txt", fresh_connection=True)[1] == b"kept\n", "but keeps files"


def test_snapshot_is_a_template(backend: CrunBackend) -> None:
    host = started(backend, "sn1")
    shell(
        host, "echo data > /home/user/snap.txt && chown 1000:1000 /home/user/snap.txt && chmod 640 /home/user/snap.txt"
    )
    snapshot_id = run(backend.snapshot("sn1"))
    assert run(backend.inspect("sn1")).state is State.RUNNING, "the source keeps running"
    run(backend.kill("sn1"))
    restored = started(backend, "sn2", template=snapshot_id)
    assert (
        shell(restored, "stat -c '%u:%g:%a' /home/user/snap.txt; cat /home/user/snap.txt")[1]
        == b"1000:1000:640\ndata\n"
    )
    assert shell(restored, "echo more >> /home/user/snap.txt")[0] == 0, "writable, copy-on-write"
    assert backend.snapshot_in_use(snapshot_id)
    with pytest.raises(TransitionError, match="in use"):
        run(backend.delete_snapshot(snapshot_id))
    run(backend.kill("sn2"))
    assert run(backend.delete_snapshot(snapshot_id))
    assert not run(backend.delete_snapshot(snapshot_id))


def test_reconcile_after_a_crash(state_dir: Path) -> None:
    first = crun_backend(state_dir)
    started(first, "rc1")
    run(first.create(SandboxSpec("rc2", "base", limits=SMALL)))
    record = first._record("rc2")
    # A crash mid-create: the record says a mount exists that never was made.
    record.mounted = True
    record.container = "e2b-rc2-gone"
    first._save(record)
    subprocess.run(["umount", str(state_dir / "sandboxes" / "rc2" / "bundle" / "rootfs")], check=True)
    second = crun_backend(state_dir)  # a new server process
    report = run(second.reconcile())
    assert "rc1" in report.adopted
    # Its files are never deleted: what the record names is made again, the dead container dropped.
    assert "rc2" in report.adopted
    assert _hostfs.is_mount(str(state_dir / "sandboxes" / "rc2" / "bundle" / "rootfs"))
    assert second._record("rc2").container is None
    assert {i.sandbox_id: i.state for i in run(second.list())} == {"rc1": State.RUNNING, "rc2": State.CREATED}
    assert run(second.kill("rc1"))
    assert run(second.kill("rc2"))


def test_reconcile_deletes_a_container_no_record_names(state_dir: Path) -> None:
    """A container whose record lost it (a start or restore a killed server left): its processes
    would run on unseen, holding the sandbox's log lock against its next start."""
    first = crun_backend(state_dir)
    started(first, "uc1")
    record = first._record("uc1")
    leftover = record.container
    assert leftover is not None
    record.container = None
    first._save(record)
    with _killed_afterwards(state_dir, "uc1"):
        second = crun_backend(state_dir)  # a new server process
        assert leftover in second._runtime.container_names()
        report = run(second.reconcile())
        assert leftover in report.cleaned
        assert "uc1" in report.stopped, "its processes ended with the container"
        assert _containers(state_dir, "uc1") == []
        assert run(second.resume("uc1")).state is State.RUNNING  # afresh, on its files
        assert _containers(state_dir, "uc1") == [second._record("uc1").container]


def _reboot(backend: CrunBackend, ids: list[str]) -> None:
    """What a host restart does to these sandboxes (and nothing else's): processes, mounts, networks,
    the runtime's state and the host registries' leases (in /run) all gone; the files stay."""
    for sandbox_id in ids:
        record = backend._record(sandbox_id)
        if record.container:
            backend._runtime.delete(record.container)  # its processes die
            shutil.rmtree(backend._runtime.root / record.container, ignore_errors=True)
        for mount_point in reversed(_hostfs.mounts_under(backend._home(sandbox_id))):
            subprocess.run(["umount", "-l", mount_point], check=True)
        assert record.network is not None
        net = _network.SandboxNetwork.from_record(record.network)
        _network.destroy(net)
        backend._addresses.release(net.subnet, backend._owner, sandbox_id)
        if record.ids is not None:
            backend._ids.release(record.ids, backend._owner, sandbox_id)


def test_a_host_restart_keeps_sandboxes_and_their_files(state_dir: Path) -> None:
    first = crun_backend(state_dir)
    hosts = {name: started(first, name) for name in ("rb1", "rb2")}
    for name, host in hosts.items():
        assert shell(host, f"echo kept-by-{name} > /home/user/note.txt")[0] == 0
    run(first.pause("rb2", memory=True))
    checkpointed = first._record("rb2").memory is not None  # with the checkpoint tools: on disk
    _reboot(first, list(hosts))
    second = crun_backend(state_dir)  # the server's next start
    report = run(second.reconcile())
    ended = {"rb1"} if checkpointed else {"rb1", "rb2"}
    assert set(report.stopped) == ended, "their processes ended with the host (not those on disk)"
    assert report.failed == ()
    for name in hosts:
        assert run(second.inspect(name)).state is (State.PAUSED if name not in ended else State.STOPPED)
        info = run(second.resume(name))  # boots afresh on the kept files, network and mounts made again
        assert info.host is not None
        assert shell(info.host, "cat /home/user/note.txt") == (0, f"kept-by-{name}\n".encode(), b"")
        assert run(second.kill(name))
    assert _leftovers(state_dir, list(hosts)) == []


def test_reconcile_thaws_a_sandbox_a_crashed_snapshot_left_frozen(state_dir: Path) -> None:
    first = crun_backend(state_dir)
    host = started(first, "sn1")
    container = first._record("sn1").container
    assert container is not None
    run(first._runtime.freeze(container))  # the server died while the copy ran
    partial = state_dir / "snapshots" / ".snap-00000000deadbeef.build"
    (partial / "upper").mkdir(parents=True)
    report = run(crun_backend(state_dir).reconcile())
    assert "sn1" in report.adopted
    assert not partial.exists()
    assert first._runtime.status(container) == "running"
    assert shell(host, "echo thawed")[1] == b"thawed\n"
    assert run(first.kill("sn1"))


def _command_lines() -> list[str]:
    lines = []
    for proc in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            lines.append(proc.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines


def _containers(state_dir: Path, sandbox_id: str) -> list[str]:
    """The runtime's containers of ``sandbox_id`` under the backend's state folder."""
    listed = CrunCommand(_crun_executable(), state_dir / "crun").container_names()
    return [name for name in listed if name.startswith(f"e2b-{sandbox_id}-")]


def _delete_containers(state_dir: Path, sandbox_id: str) -> None:
    """Every container of ``sandbox_id`` deleted through the runtime, whether a record names it or not."""
    for name in _containers(state_dir, sandbox_id):
        runtime = [_crun_executable(), "--root", str(state_dir / "crun")]
        subprocess.run([*runtime, "delete", "--force", name], capture_output=True, check=False)


def _leftovers(state_dir: Path, ids: list[str]) -> list[str]:
    found = []
    mounts = Path("/proc/mounts").read_text()
    for sandbox_id in ids:
        if f"/sandboxes/{sandbox_id}/" in mounts:
            found.append(f"mount of {sandbox_id}")
        for controller in ("memory", "pids", "cpu", "cpuacct", "freezer", "devices"):
            if Path(f"/sys/fs/cgroup/{controller}/{CGROUP_PARENT}/{sandbox_id}").exists():
                found.append(f"{controller} cgroup of {sandbox_id}")
        if (state_dir / "sandboxes" / sandbox_id).exists():
            found.append(f"directory of {sandbox_id}")
        loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
        if f"/sandboxes/{sandbox_id}/" in loops:
            found.append(f"loop device of {sandbox_id}")
        if any(f"/sandboxes/{sandbox_id}/logs/" in cmdline for cmdline in _command_lines()):
            found.append(f"log writer of {sandbox_id}")
        net = _network.plan(sandbox_id, _network.AddressPool().allocate(set()))
        if any(_network.exists(net).values()):
            found.append(f"network of {sandbox_id}")
    found += [f"container {c}" for sandbox_id in ids for c in _containers(state_dir, sandbox_id)]
    return found


def test_nothing_leaks(state_dir: Path) -> None:
    backend = crun_backend(state_dir)
    ids = [f"lk{i}" for i in range(50)]

    async def churn() -> None:
        for index, sandbox_id in enumerate(ids):
            await backend.create(SandboxSpec(sandbox_id, "base", limits=SMALL))
            if index % 5 == 0:
                start = asyncio.ensure_future(backend.start(sandbox_id))
                await asyncio.sleep(0.05)  # killed mid-start
                await backend.kill(sandbox_id)
                await asyncio.gather(start, return_exceptions=True)
                continue
            if index % 5 != 1:
                await backend.start(sandbox_id)
            if index % 5 == 2:
                await backend.pause(sandbox_id, memory=True)
            if index % 5 == 3:
                await backend.pause(sandbox_id, memory=False)
            await backend.kill(sandbox_id)

    run(churn())
    run(backend.reconcile())
    assert _leftovers(state_dir, ids) == []
    print(f"50 sandboxes created and killed; python {sys.version.split()[0]}")


# The agent, not tini (PID 1, whose arguments name it too) nor this awk.
_AGENT_PID = "ps -eo pid=,args= | awk '$2 ~ /python/ && /-m runtime[.]agent/ {print $1; exit}'"


def test_agents_share_their_startup_memory_and_what_they_start_keeps_aslr(state_dir: Path) -> None:
    """With ``share_agent_memory``: the agents' layouts are the same, their start-up pages marked
    and merged by ksmd, and what they start is randomised as usual (runtime.agent._memory)."""
    if not _ksm.available():
        pytest.skip("this kernel has no KSM (CONFIG_KSM)")
    crun = crun_backend(state_dir, share_agent_memory=True)
    sharing_before = ksm_counters().get("pages_sharing", 0)
    try:
        hosts = [started(crun, f"ksm{i}") for i in range(2)]
        heaps, marked = [], []
        for host in hosts:
            code, out, err = shell(
                host, f"pid=$({_AGENT_PID}); grep -m1 heap /proc/$pid/maps; grep -c ' mg' /proc/$pid/smaps || true"
            )
            assert code == 0, err
            heap_line, count = out.decode().split("\n")[:2]
            heaps.append(heap_line.split()[0])
            marked.append(int(count))
        assert heaps[0] == heaps[1], "the agents were not started at one layout"
        assert min(marked) >= 1, "the agent marked nothing mergeable"
        # A command: randomised, and not offered for merging.
        runs = [
            shell(
                hosts[0],
                "cat /proc/self/personality; grep -m1 heap /proc/self/maps; grep -c ' mg' /proc/self/smaps || true",
            )[1]
            for _ in range(2)
        ]
        personality, heap_a, merged = runs[0].decode().split("\n")[:3]
        heap_b = runs[1].decode().split("\n")[1]
        assert not int(personality, 16) & 0x0040000
        assert heap_a != heap_b, "commands run without address randomisation"
        assert merged == "0"
        # What the runtime told the agent stays the agent's.
        assert shell(hosts[0], "env | grep -c -e PYTHONHASHSEED -e E2B_COMPAT_ || true")[1] == b"0\n"
        deadline = time.monotonic() + 90
        while ksm_counters().get("pages_sharing", 0) < sharing_before + 1000:  # 4 MiB of the agents' pages
            assert time.monotonic() < deadline, f"ksmd merged nothing: {ksm_counters()}"
            time.sleep(0.5)
    finally:
        for info in run(crun.list()):
            run(crun.kill(info.sandbox_id))


def test_sandbox_root_is_unprivileged_on_the_host(backend: CrunBackend, state_dir: Path) -> None:
    host = started(backend, "uid1")
    assert shell(host, "id -u; stat -c %u:%g /etc/passwd /home/user")[1] == b"0\n0:0\n1000:1000\n"
    shell(host, "echo x > /root/made-by-root")
    container = backend._record("uid1").container or ""
    state = subprocess.run(
        ["crun", "--root", str(state_dir / "crun"), "state", container], capture_output=True, text=True, check=True
    )
    init_pid = json.loads(state.stdout)["pid"]
    uids = next(line for line in Path(f"/proc/{init_pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    base = backend._record("uid1").ids  # the first id of the sandbox's own range (runtime._idranges)
    assert base is not None
    assert uids.split()[1:] == [str(base)] * 4, "root inside is the first id of the sandbox's range outside"
    written = state_dir / "sandboxes" / "uid1" / "disk" / "upper" / "root" / "made-by-root"
    assert (written.stat().st_uid, written.stat().st_gid) == (base, base)


def test_network_policy_is_applied_and_updated(backend: CrunBackend) -> None:
    """Egress rules reach the host firewall; no traffic leaves the host (forwarding stays off)."""
    run(backend.create(SandboxSpec("net1", "base", limits=SMALL, deny_out=("203.0.113.0/24",))))
    host = run(backend.start("net1")).host or ""
    net = _network.SandboxNetwork.from_record(backend._record("net1").network or {})

    def table() -> str:
        return subprocess.run(
            ["nft", "list", "table", "inet", _network.FIREWALL_TABLE], capture_output=True, text=True, check=True
        ).stdout

    assert "ip daddr 203.0.113.0/24" in table()
    assert shell(host, "ip route | grep -c default || true")[1].strip() == b"0"
    run(backend.update_network("net1", allow_internet_access=True, allow_out=(), deny_out=()))
    assert f"p_{net.host_if}" not in table()
    assert shell(host, "ip route | grep -c default || true")[1].strip() == b"1", "egress on: a default route"
    if _checkpoint_tools.find() is not None:
        # A memory pause unplugs the veth but keeps its entries; the resume sets them while CRIU
        # restores and plugs the veth back into the restored namespace (found by crun's pid file).
        run(backend.pause("net1", memory=True))
        assert backend._record("net1").memory is not None
        assert not any(_network.exists(net).values())
        assert net.host_if in table(), "kept while paused"
        host = run(backend.resume("net1")).host or ""
        record = backend._record("net1")
        assert backend._plugged(record, record.container or "")
        assert net.host_if in table()
        assert shell(host, "ip route | grep -c default || true", fresh_connection=True)[1].strip() == b"1"
        assert not list(backend._home("net1").glob(".memory-gone-*")), "the images' removal finished"
    run(backend.kill("net1"))
    assert net.host_if not in table()


def test_sandboxes_outlive_a_signal_to_the_callers_process_group(backend: CrunBackend, state_dir: Path) -> None:
    """Ctrl-C or a supervisor's group kill stops the server, never the sandboxes it started."""
    started(backend, "sess1")
    record = json.loads((state_dir / "sandboxes" / "sess1" / "record.json").read_text())
    state = subprocess.run(
        ["crun", "--root", str(state_dir / "crun"), "state", record["container"]],
        capture_output=True,
        text=True,
        check=True,
    )
    init_pid = json.loads(state.stdout)["pid"]
    assert os.getsid(init_pid) != os.getsid(0)
    assert os.getpgid(init_pid) != os.getpgid(0)
    run(backend.kill("sess1"))


def test_a_full_disk_is_enospc_inside_and_never_reaches_the_host(backend: CrunBackend, state_dir: Path) -> None:
    """The disk limit is the kernel's: dd ends with ENOSPC, an upload gets 507, neighbours still write."""
    small_disk = Limits(cpu_count=1, memory_mb=256, pids=128, disk_mb=64)
    full, neighbour = started(backend, "dk1", limits=small_disk), started(backend, "dk2", limits=small_disk)
    host_free = os.statvfs(state_dir)
    before = host_free.f_bavail * host_free.f_frsize
    code, _, err = shell(full, "dd if=/dev/zero of=/home/user/big bs=1M count=400 conv=fsync")
    host_free = os.statvfs(state_dir)
    grown = before - host_free.f_bavail * host_free.f_frsize
    assert code != 0
    assert b"No space left on device" in err
    assert grown < 200 << 20, f"the host lost {grown >> 20} MiB to a 64 MiB disk"  # others write too: no tighter
    metrics = run(backend.metrics("dk1"))
    assert 56 << 20 < metrics.disk_total_bytes <= 64 << 20
    assert metrics.disk_used_bytes > metrics.disk_total_bytes - (4 << 20)
    upload = httpx.post(
        f"http://{full}:{ENVD_PORT}/files",
        params={"path": "/home/user/upload", "username": "user"},
        content=b"u" * (8 << 20),
        headers={"content-type": "application/octet-stream"},
        timeout=30,
    )
    assert upload.status_code == 507, upload.text
    assert upload.json()["code"] == 507
    assert shell(neighbour, "head -c 8M /dev/zero > /home/user/f && stat -c %s /home/user/f")[1] == b"8388608\n"
    shell(full, "rm /home/user/big")
    assert shell(full, "echo fits > /home/user/small && cat /home/user/small")[1] == b"fits\n", "space comes back"
    run(backend.kill("dk1"))
    run(backend.kill("dk2"))


def test_the_log_stays_bounded_while_a_sandbox_prints(backend: CrunBackend, state_dir: Path) -> None:
    host = started(backend, "lg1")
    logs = state_dir / "sandboxes" / "lg1" / "logs"
    # /proc/1/fd/1 is the init's stdout: what reaches the sandbox's log.
    code, _, err = shell(
        host, "head -c 37500000 /dev/zero | base64 -w 99 >> /proc/1/fd/1 && echo the-last-line >> /proc/1/fd/1"
    )
    assert code == 0, err
    deadline = time.monotonic() + 10
    while b"the-last-line" not in _hostfs.read_log(logs / "sandbox.log", 64) and time.monotonic() < deadline:
        time.sleep(0.05)
    held = sum(part.stat().st_size for part in logs.iterdir())  # before log_tail, which trims old logs
    assert held < _hostfs.LOG_LIMIT, f"{held} bytes of log kept for 50 MB printed"
    assert backend.log_tail("lg1").endswith(b"the-last-line\n")
    assert run(backend.inspect("lg1")).state is State.RUNNING
    run(backend.kill("lg1"))


def test_snapshots_share_unchanged_files(backend: CrunBackend, state_dir: Path) -> None:
    host = started(backend, "sh1")
    shell(host, "head -c 8M /dev/urandom > /home/user/kept && echo one > /home/user/changed && rm /etc/issue")
    time.sleep(2.5)  # older than the sharing margin (runtime._sharing): ctime alone then tells changes apart
    first = run(backend.snapshot("sh1"))
    shell(host, "echo two > /home/user/changed")
    second = run(backend.snapshot("sh1"))
    layers = [state_dir / "snapshots" / snapshot / "upper" / "home" / "user" for snapshot in (first, second)]
    assert (layers[0] / "kept").stat().st_ino == (layers[1] / "kept").stat().st_ino, "8 MiB stored once"
    assert [(layer / "changed").read_text() for layer in layers] == ["one\n", "two\n"]
    run(backend.kill("sh1"))
    restored = started(backend, "sh2", template=second)
    seen = shell(restored, "cat /home/user/changed; test -e /etc/issue || echo whiteout-kept")[1]
    assert seen == b"two\nwhiteout-kept\n"
    run(backend.kill("sh2"))
    assert run(backend.delete_snapshot(second))
    assert run(backend.delete_snapshot(first))


# -- memory written to disk (the checkpoint tools: runtime._checkpoint_tools) ---------------

# The 64 MiB are written (zeroed) before the ready file appears: a checkpoint taken earlier
# would find the pages not yet touched, which CRIU does not write.
_HOLDER = (
    "python3 -c 'import sys, time\nheld = bytearray(64 << 20)"
    '\nopen("/tmp/" + sys.argv[1] + ".ready", "w").close()\nwhile True: time.sleep(1)\' {marker}'
)


def _needs_checkpoints() -> None:
    if _checkpoint_tools.find() is None:
        pytest.skip("the checkpoint tools are not built on this host (e2b-compat host prepare builds them)")


def test_ci_builds_the_checkpoint_tools() -> None:
    """CI prepares the host with every backend's set-up, which builds them: the tests below never skip there."""
    if os.environ.get("CI") != "true":
        pytest.skip("outside CI the tools are built by `e2b-compat host prepare`, maybe not yet")
    tools = _checkpoint_tools.find()
    assert tools is not None
    version = subprocess.run([str(tools.crun), "--version"], capture_output=True, text=True, check=True).stdout
    assert "+CRIU" in version
    assert subprocess.run([str(tools.criu), "check"], capture_output=True, check=False).returncode == 0


def _holder(host: str, marker: str) -> str:
    """A process holding 64 MiB in the sandbox (once this returns), and a file in its tmpfs: the pid."""
    code, out, _ = shell(
        host,
        f"nohup {_HOLDER.format(marker=marker)} >/dev/null 2>&1 & echo $!; "
        f"while [ ! -e /tmp/{marker}.ready ]; do sleep 0.02; done; echo in-ram > /tmp/ram.txt",
    )
    assert code == 0
    return out.decode().split()[0]


def test_a_memory_pause_writes_the_sandbox_to_disk_and_frees_its_memory(backend: CrunBackend, state_dir: Path) -> None:
    _needs_checkpoints()
    host = started(backend, "ck1", limits=Limits(cpu_count=1, memory_mb=256, pids=128))
    pid = _holder(host, "holder-ck1")
    assert any("holder-ck1" in line for line in _command_lines())
    assert run(backend.pause("ck1", memory=True)).state is State.PAUSED
    record = backend._record("ck1")
    assert record.memory is not None
    assert record.container is None, "the checkpoint ended the container"
    images = Path(record.memory)
    assert sum(f.stat().st_size for f in images.iterdir()) > 64 << 20, "the held memory is on disk"
    # Frozen before CRIU looked: CRIU freezes a thawed cgroup v1 itself, then sleeps 100 ms.
    states = re.findall(r"freezer\.state=(\w+)", (images / "dump.log").read_text())
    assert states[:1] == ["FROZEN"], states
    # Searchable by a task not yet mapped into its user namespace (CRIU's restore opens images
    # from one); reached by nobody else, through the sandbox's own folder.
    assert (images.stat().st_mode & 0o777, images.parent.stat().st_mode & 0o777) == (0o711, 0o700)
    assert not any("holder-ck1" in line for line in _command_lines()), "no process of it runs"
    assert not Path(f"/sys/fs/cgroup/memory/{CGROUP_PARENT}/ck1").exists(), "its memory is charged nowhere"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=1)
    # The masked directories are binds of one empty folder (external to CRIU, no tar of a tmpfs).
    dumped = (images / "dump.log").read_text()
    masked = [path for path in _oci.MASKED_PATHS if Path(path).is_dir()]
    assert masked, "this host has a masked directory to look at"
    info = run(backend.resume("ck1"))
    assert info.host == host, "the same address"
    assert shell(info.host, f"kill -0 {pid} && cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")
    assert not images.exists(), "the images go once restored"
    for path in masked:
        assert f"Found {path} mapping for .{path} mountpoint" in dumped, f"{path} is an external mount to CRIU"
        assert not re.search(rf"type tmpfs .* @ \.{re.escape(path)} ", dumped), f"{path} was dumped as a tmpfs"
        code, out, _ = shell(info.host, f"ls -A {path} | wc -l; touch {path}/x || echo refused", fresh_connection=True)
        assert (code, out) == (0, b"0\nrefused\n"), f"{path} is empty and read-only after a restore"
    # Twice: a restored sandbox checkpoints again.
    run(backend.pause("ck1", memory=True))
    assert shell(run(backend.resume("ck1")).host or "", f"kill -0 {pid}", fresh_connection=True)[0] == 0
    assert run(backend.kill("ck1"))
    assert _leftovers(state_dir, ["ck1"]) == []


def test_a_checkpointed_sandbox_survives_a_host_restart(state_dir: Path) -> None:
    _needs_checkpoints()
    first = crun_backend(state_dir)
    pid = _holder(started(first, "ck2"), "holder-ck2")
    run(first.pause("ck2", memory=True))
    _reboot(first, ["ck2"])
    second = crun_backend(state_dir)
    report = run(second.reconcile())
    assert "ck2" in report.adopted
    assert "ck2" not in report.stopped
    assert run(second.inspect("ck2")).state is State.PAUSED
    host = run(second.resume("ck2")).host or ""
    assert shell(host, f"kill -0 {pid} && cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")
    assert run(second.kill("ck2"))
    assert _leftovers(state_dir, ["ck2"]) == []


def test_a_checkpoint_that_fails_freezes_instead(backend: CrunBackend, tmp_path: Path) -> None:
    _needs_checkpoints()
    host = started(backend, "ck3")
    pid = _holder(host, "holder-ck3")
    bad = tmp_path / "criu.conf"
    bad.write_text("no-such-option\n")  # CRIU refuses to start: the checkpoint fails
    backend._checkpoint_config = bad
    assert run(backend.pause("ck3", memory=True)).state is State.PAUSED
    record = backend._record("ck3")
    assert record.memory is None
    assert record.container is not None
    assert backend._runtime.status(record.container) == "paused", "frozen, as without the tools"
    host = run(backend.resume("ck3")).host or ""
    assert shell(host, f"kill -0 {pid} && cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")


def test_a_kill_waits_for_a_checkpoint_that_a_killed_server_left_running(state_dir: Path) -> None:
    """A runtime command is in a group of its own, so a server killed mid-checkpoint leaves it running.

    The next server's kill (or reconcile) must wait for it: a container killed while CRIU holds it
    can leave both waiting for each other, or the dump cut off half-way.
    """
    _needs_checkpoints()
    first = crun_backend(state_dir)
    _holder(started(first, "ck7"), "holder-ck7")  # memory to write: the dump takes a while
    record = first._record("ck7")
    assert record.container is not None
    assert record.network is not None
    _network.destroy(_network.SandboxNetwork.from_record(record.network))  # as a checkpoint does first
    images = first._home("ck7") / "left-running"
    images.mkdir(mode=0o700)
    runtime = first._runtime
    assert isinstance(runtime, CrunCommand)
    init = runtime.pid(record.container)
    orphan = subprocess.Popen(
        runtime.argv("checkpoint", "--file-locks", "--image-path", str(images), record.container),
        env=runtime._env(first._checkpoint_config),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        while not _held_by_criu(init):
            assert orphan.poll() is None, "CRIU seizes the sandbox before its dump ends"
            time.sleep(0.001)
        second = crun_backend(state_dir)  # the next server
        assert run(second.kill("ck7"))
        assert orphan.wait(60) == 0, "the checkpoint ran to its end"
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)  # the group this test made: crun and its CRIU
            orphan.wait()
        orphan.communicate()
    assert _leftovers(state_dir, ["ck7"]) == []


def checkpoint_spawns(monkeypatch: pytest.MonkeyPatch, verb: str = "checkpoint") -> list[int]:
    """The pids of the ``crun <verb>`` commands spawned from now on, each noted as it starts."""
    checkpoints: list[int] = []
    spawn = asyncio.create_subprocess_exec

    async def noted_spawn(*argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await spawn(*argv, **kwargs)
        if verb in argv:
            checkpoints.append(proc.pid)
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", noted_spawn)
    return checkpoints


def cancelled_once_spawned(operation: Coroutine[Any, Any, object], spawned: list[int]) -> None:
    """Run ``operation``, cancel it on the loop turn after the first noted runtime command started
    (``checkpoint_spawns``), and see it end cancelled: a server stopping right then."""

    async def go() -> None:
        task = asyncio.ensure_future(operation)
        while not spawned:
            assert not task.done()
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go())


@contextlib.contextmanager
def _killed_afterwards(state_dir: Path, sandbox_id: str) -> Iterator[None]:
    """The sandbox goes at the end whatever the test found: a failed check must not leave it running."""
    try:
        yield
    finally:
        backend = crun_backend(state_dir)
        with contextlib.suppress(Exception):  # gone already, as a passing test leaves it
            run(backend.kill(sandbox_id))
        _delete_containers(state_dir, sandbox_id)  # one no record names: what a leak left
        run(backend.reconcile())


def test_a_memory_pause_cancelled_mid_checkpoint_is_recorded_and_resumes(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopping while a pause checkpoints: the checkpoint ends first, and the pause is recorded.

    Before, the record still said running with a container the checkpoint had ended, and its
    images were nobody's: the next start lost the processes the pause had kept.
    """
    _needs_checkpoints()
    with _killed_afterwards(state_dir, "ck8"):
        backend = crun_backend(state_dir)
        pid = _holder(started(backend, "ck8"), "holder-ck8")
        cancelled_once_spawned(backend.pause("ck8", memory=True), checkpoint_spawns(monkeypatch))
        monkeypatch.undo()
        record = backend._record("ck8")
        assert (record.state, record.container) == (State.PAUSED.value, None)
        assert record.memory is not None
        assert (Path(record.memory) / "inventory.img").is_file()
        second = crun_backend(state_dir)  # the next server
        assert "ck8" in run(second.reconcile()).adopted
        assert run(second.inspect("ck8")).state is State.PAUSED
        host = run(second.resume("ck8")).host or ""
        assert shell(host, f"kill -0 {pid} && cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")
        assert run(second.kill("ck8"))
        assert _leftovers(state_dir, ["ck8"]) == []


def _holders(marker: str) -> int:
    """How many processes on the host carry ``marker``: each copy of a sandbox's holder is one."""
    return sum(marker in line for line in _command_lines())


def test_a_resume_cancelled_mid_restore_leaves_it_paused_and_resumes_one_copy(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopping while a resume restores: the restore ends first, then its container goes.

    Before, the record stayed paused with its images beside the running restored container, and
    the next resume's restore waited for good on the log's lock, which that container's log
    writer held (without the lock, it would have run a second copy of the tenant's processes).
    """
    _needs_checkpoints()
    with _killed_afterwards(state_dir, "ck9"):
        backend = crun_backend(state_dir)
        pid = _holder(started(backend, "ck9"), "holder-ck9")
        run(backend.pause("ck9", memory=True))
        cancelled_once_spawned(backend.resume("ck9"), checkpoint_spawns(monkeypatch, "restore"))
        monkeypatch.undo()
        record = backend._record("ck9")
        assert (record.state, record.container) == (State.PAUSED.value, None)
        assert record.memory is not None
        assert (Path(record.memory) / "inventory.img").is_file(), "the images are still the sandbox's"
        assert _holders("holder-ck9") == 0, "nothing of the cut-short restore runs"
        host = run(backend.resume("ck9")).host or ""
        assert shell(host, f"kill -0 {pid} && cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")
        assert _holders("holder-ck9") == 1
        assert run(backend.kill("ck9"))
        assert _leftovers(state_dir, ["ck9"]) == []


def test_a_reconcile_ends_a_restore_that_a_killed_server_left_and_resumes_one_copy(state_dir: Path) -> None:
    """A server killed while it resumes: `crun restore` runs on in its own session, and the record
    names both the images and the restored container. The next server's reconcile stops that
    container; its resume restores the images once. Before, reconcile kept the container and
    plugged it back in, and the next resume waited for good on that container's log lock.
    """
    _needs_checkpoints()
    with _killed_afterwards(state_dir, "ck10"):
        first = crun_backend(state_dir)
        pid = _holder(started(first, "ck10"), "holder-ck10")
        run(first.pause("ck10", memory=True))
        images = first._record("ck10").memory
        assert images is not None
        aside = state_dir / "ck10-images"
        subprocess.run(["cp", "-a", images, str(aside)], check=True)
        run(first.resume("ck10"))
        # What a kill right after the restore leaves on disk: paused, its images, the restored container.
        record = first._record("ck10")
        os.replace(aside, images)
        record.state, record.memory = State.PAUSED.value, images
        first._save(record)
        assert _holders("holder-ck10") == 1
        second = crun_backend(state_dir)  # the next server
        assert "ck10" in run(second.reconcile()).adopted
        assert second._record("ck10").container is None
        assert _holders("holder-ck10") == 0
        assert run(second.inspect("ck10")).state is State.PAUSED
        host = run(second.resume("ck10")).host or ""
        assert shell(host, f"kill -0 {pid} && cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")
        assert _holders("holder-ck10") == 1
        assert run(second.kill("ck10"))
        assert _leftovers(state_dir, ["ck10"]) == []


async def _resumed_within(backend: CrunBackend, state_dir: Path, sandbox_id: str, seconds: float) -> None:
    """``resume``, failing the test after ``seconds``. A boot beside a container left running waits
    for good (its log writer on the log's lock, which the other container's writer holds, in a
    worker thread that the loop's close would wait for too): the containers go first, which frees
    the lock and lets the resume end, and then the test fails.
    """
    resuming = asyncio.ensure_future(backend.resume(sandbox_id))
    done, _ = await asyncio.wait({resuming}, timeout=seconds)
    if not done:
        _delete_containers(state_dir, sandbox_id)
        with contextlib.suppress(Exception):
            await resuming
        pytest.fail(f"resuming {sandbox_id} did not end within {seconds} s")
    await resuming


def test_a_boot_cancelled_mid_way_is_not_left_running_beside_the_next(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume that boots (after a filesystem pause), cancelled once `crun create` started: the
    container it made stays on record, and the next boot stops it first. Before, the next boot
    overwrote the name and never finished: its log writer waited on the sandbox's log lock, held
    by the first container's writer, while holding the sandbox's own lock.
    """
    with _killed_afterwards(state_dir, "bt1"):
        backend = crun_backend(state_dir)
        started(backend, "bt1")
        run(backend.pause("bt1", memory=False))
        cancelled_once_spawned(backend.resume("bt1"), checkpoint_spawns(monkeypatch, "create"))
        monkeypatch.undo()
        assert backend._record("bt1").container is not None, "the cut-short boot's container is on record"
        run(_resumed_within(backend, state_dir, "bt1", 60))
        assert len(_containers(state_dir, "bt1")) == 1
        assert run(backend.kill("bt1"))
        assert _leftovers(state_dir, ["bt1"]) == []


def test_a_restore_that_fails_boots_the_sandbox_afresh_on_its_files(backend: CrunBackend) -> None:
    _needs_checkpoints()
    host = started(backend, "ck4")
    _holder(host, "holder-ck4")
    assert shell(host, "echo on-disk > /home/user/kept.txt")[0] == 0
    run(backend.pause("ck4", memory=True))
    memory = backend._record("ck4").memory
    assert memory is not None
    for core in Path(memory).glob("core-*.img"):
        core.write_bytes(b"")  # damaged images
    host = run(backend.resume("ck4")).host or ""
    assert shell(host, "cat /home/user/kept.txt", fresh_connection=True) == (0, b"on-disk\n", b"")
    # By its marker: pids restart from 1 in a fresh boot, so the old number may be another process.
    lost = shell(host, "ps -eo args= | grep -c '[h]older-ck4'", fresh_connection=True)[1]
    assert lost == b"0\n", "its processes were lost"
    assert (backend._home("ck4") / "logs" / "restore.log").is_file(), "CRIU's account is kept for the operator"
    assert backend._record("ck4").memory is None


def test_without_the_tools_a_memory_pause_is_the_freezer(state_dir: Path) -> None:
    legacy = CrunBackend(state_dir)  # what a host that could not build them runs
    assert Feature.PAUSE_MEMORY_ON_DISK not in legacy.features
    host = started(legacy, "ck5")
    pid = _holder(host, "holder-ck5")
    run(legacy.pause("ck5", memory=True))
    record = legacy._record("ck5")
    assert record.memory is None
    assert record.container is not None
    assert legacy._runtime.status(record.container) == "paused"
    host = run(legacy.resume("ck5")).host or ""
    assert shell(host, f"kill -0 {pid} && cat /tmp/ram.txt") == (0, b"in-ram\n", b"")
    assert run(legacy.kill("ck5"))
    assert _leftovers(state_dir, ["ck5"]) == []


def test_reconcile_plugs_back_a_sandbox_a_crash_left_unplugged_and_drops_stray_images(state_dir: Path) -> None:
    _needs_checkpoints()
    first = crun_backend(state_dir)
    host = started(first, "ck6")
    record = first._record("ck6")
    assert record.network is not None
    # A crash between a checkpoint's removal of the veth and the checkpoint itself.
    _network.destroy(_network.SandboxNetwork.from_record(record.network))
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=1)
    second = crun_backend(state_dir)
    assert "ck6" in run(second.reconcile()).adopted
    assert shell(host, "echo back", fresh_connection=True) == (0, b"back\n", b"")
    # A checkpoint whose record was never saved: its processes gone, its images left behind.
    stray = second._home("ck6") / "memory"
    stray.mkdir()
    (stray / "core-1.img").write_bytes(b"cut short")
    second._runtime.delete(second._record("ck6").container or "")
    gone = second._home("ck6") / ".memory-gone-1a2b3c4d"  # a background removal a crash cut short
    gone.mkdir()
    (gone / "pages-1.img").write_bytes(b"restored already")
    assert "ck6" in run(crun_backend(state_dir).reconcile()).stopped
    assert not stray.exists()
    assert not gone.exists()
    assert run(second.kill("ck6"))
    assert _leftovers(state_dir, ["ck6"]) == []
