"""Real sandboxes on gVisor (runsc): its kernel, the same network isolation and limits as crun,
pause, snapshots, crash recovery; and the pinned runsc package.

Needs root, runsc and the ``base`` template; CI runs these as root. The lifecycle conformance is
the shared state machine's (test_backend_conformance.py, ``[gvisor]``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from connectrpc.errors import ConnectError

from contract.protocol import ENVD_PORT
from runtime import _hostfs, _network, _oci, _runsc
from runtime._oci_backend import Record
from runtime.backend import Feature, Limits, SandboxSpec, State, TransitionError
from runtime.gvisor import FEATURES, GvisorBackend, prepare_host
from runtime.host import HostNotReadyError
from runtime.templates import ensure_template

from .test_crun import run, shell

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="gVisor sandboxes need root (namespaces, mounts, cgroups)")
SMALL = Limits(cpu_count=1, memory_mb=256, pids=128)


@pytest.fixture(scope="module")
def state_dir() -> Iterator[Path]:
    prepare_host(lambda msg: print(f"host set-up: {msg}"))
    ensure_template("base")
    folder = Path(tempfile.mkdtemp(prefix="e2b-compat-gvisor-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    leftovers = [line for line in Path("/proc/mounts").read_text().splitlines() if str(folder) in line]
    assert not leftovers, f"mounts left behind: {leftovers}"
    shutil.rmtree(folder)


@pytest.fixture
def backend(state_dir: Path) -> Iterator[GvisorBackend]:
    gvisor = GvisorBackend(state_dir)
    yield gvisor
    for info in run(gvisor.list()):
        run(gvisor.kill(info.sandbox_id))


def started(backend: GvisorBackend, sandbox_id: str, template: str = "base", limits: Limits = SMALL) -> str:
    run(backend.create(SandboxSpec(sandbox_id, template, limits=limits)))
    host = run(backend.start(sandbox_id)).host
    assert host is not None
    return host


def runsc_pids(state_dir: Path, sandbox_id: str) -> list[int]:
    """The host processes of a sandbox: runsc's sentry (runsc-sandbox) and file server (runsc-gofer)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if line.startswith("runsc-") and f"{state_dir}/sandboxes/{sandbox_id}/bundle" in line:
            found.append(int(cmdline.parent.name))
    return found


@root_only
@pytest.mark.artifacts
def test_the_kernel_inside_is_gvisors_and_refusals_hold(backend: GvisorBackend, state_dir: Path) -> None:
    host = started(backend, "gk1")
    assert httpx.get(f"http://{host}:{ENVD_PORT}/health").status_code == 204
    code, dmesg, _ = shell(host, "dmesg")
    assert code == 0
    assert b"Starting gVisor" in dmesg, "the kernel the sandbox talks to is gVisor's, not the host's"
    assert shell(host, "uname -r")[1].strip() != os.uname().release.encode()
    # The bundle's seccomp filter holds inside gVisor's kernel too; threads still start (no clone3 rule).
    for attempt in (
        "unshare --mount true",
        "python3 -c 'import ctypes, os; assert ctypes.CDLL(None, use_errno=True).syscall(175, 0, 0, 0) == 0'",
    ):
        assert shell(host, attempt)[0] != 0, f"{attempt!r} succeeded inside the sandbox"
    assert shell(host, "python3 -c 'import threading; t = threading.Thread(target=print); t.start(); t.join()'")[0] == 0
    # The host's view of the sandbox's files is nosuid, nodev; inside, setuid never raises privileges,
    # but for gVisor's own reason (no_new_privs always set: the known failure sandbox/lifecycle/sudo).
    rootfs = f"{state_dir}/sandboxes/gk1/bundle/rootfs"
    mount = next(line for line in Path("/proc/mounts").read_text().splitlines() if line.split()[1] == rootfs)
    assert {"nosuid", "nodev"} <= set(mount.split()[3].split(","))
    code, _, err = shell(host, "su user -c 'sudo -n id -u'")
    assert code != 0
    assert b"no new privileges" in err, err
    # On the host: the sentry runs as nobody, never root; no host uid range is the sandbox's.
    pids = runsc_pids(state_dir, "gk1")
    sentry = [pid for pid in pids if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"runsc-sandbox")]
    assert sentry
    uids = next(line for line in Path(f"/proc/{sentry[0]}/status").read_text().splitlines() if line.startswith("Uid:"))
    assert uids.split()[1:] == ["65534"] * 4
    assert Feature.OWN_ID_RANGE not in FEATURES
    assert backend.features == FEATURES


@root_only
@pytest.mark.artifacts
def test_the_bundle_is_crun_s_as_runsc_takes_it(backend: GvisorBackend, state_dir: Path) -> None:
    run(backend.create(SandboxSpec("gb1", "base", limits=SMALL)))
    config = json.loads((state_dir / "sandboxes" / "gb1" / "bundle" / "config.json").read_text())
    assert "hooks" not in config, "no inotify hook: gVisor's kernel has inotify of its own"
    assert {"type": "user"} not in config["linux"]["namespaces"]
    assert config["linux"]["cgroupsPath"] == "/e2b-compat/gb1", "absolute: runsc reads relative under its own"
    sys_mount = next(m for m in config["mounts"] if m["destination"] == "/sys")
    assert sys_mount["type"] == "sysfs", "gVisor's own sysfs: the gofer refuses a bound one"
    names = [name for rule in config["linux"]["seccomp"]["syscalls"] for name in rule["names"]]
    assert "clone3" not in names, "gVisor answers EPERM, never ENOSYS: libc would not fall back to clone"
    assert "mount" in names
    assert [limit["type"] for limit in config["process"]["rlimits"]] == ["RLIMIT_NOFILE"]
    # crun's bundle is unchanged by the options gVisor turns off.
    plan = _oci.ContainerPlan("/r", "/n", "h", "/hosts", "/resolv", "e2b-compat/x", ("agent",), {}, SMALL)
    crun = _oci.config(plan)
    assert "createRuntime" in crun["hooks"]
    assert any("clone3" in rule["names"] for rule in crun["linux"]["seccomp"]["syscalls"])


@root_only
@pytest.mark.artifacts
def test_network_isolation_is_crun_s(backend: GvisorBackend) -> None:
    server = socket.socket()
    server.bind(("0.0.0.0", 0))  # a host service on every address
    server.listen()
    port = server.getsockname()[1]
    accepted: list[object] = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True)
    thread.start()
    try:
        run(backend.create(SandboxSpec("gna", "base", limits=SMALL, deny_out=("203.0.113.0/24",))))
        a = run(backend.start("gna")).host or ""
        b = started(backend, "gnb")
        net = _network.SandboxNetwork.from_record(backend._record("gna").network or {})
        for target in ("127.0.0.1", str(net.host_ip)):
            code, _, _ = shell(a, f"curl -s -m 2 -o /dev/null http://{target}:{port}/")
            assert code != 0, f"a host service was reachable at {target}"
        assert shell(a, "ip route | grep -c default || true")[1].strip() == b"0", "no default route: no egress"
        shell(a, "nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 &")
        for _ in range(50):
            try:
                if httpx.get(f"http://{a}:8000/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("the host cannot reach a port inside the sandbox")
        assert shell(b, f"curl -s -m 2 -o /dev/null http://{a}:8000/")[0] != 0, "sandboxes must not reach each other"

        def table() -> str:
            return subprocess.run(
                ["nft", "list", "table", "inet", _network.FIREWALL_TABLE], capture_output=True, text=True, check=True
            ).stdout

        assert "ip daddr 203.0.113.0/24" in table(), "the egress rules reach the host firewall, as for crun's"
        run(backend.update_network("gna", allow_internet_access=False, allow_out=(), deny_out=()))
        assert f"p_{net.host_if}" not in table(), "and change there live"
    finally:
        server.close()
    assert not accepted


@root_only
@pytest.mark.artifacts
def test_limits_are_enforced(backend: GvisorBackend) -> None:
    """pids and memory are the host cgroup's, as for crun; but the sentry holds all the sandbox's memory,
    so the host's OOM killer ends the whole sandbox, not just the process that asked too much."""
    host = started(backend, "gl1", limits=Limits(cpu_count=1, memory_mb=256, pids=128))
    assert run(backend.metrics("gl1")).memory_bytes > 0, "the sandbox's cgroup is the one the backend reads"
    shell(host, "setsid bash -c 'bomb() { bomb | bomb & }; bomb' >/dev/null 2>&1 </dev/null &")
    time.sleep(3)
    assert run(backend.metrics("gl1")).pids <= 128
    # Unlike crun, the agent need not answer meanwhile: every process is the sentry's, in one CPU quota.
    run(backend.kill("gl1"))
    host = started(backend, "gl2", limits=Limits(cpu_count=1, memory_mb=256, pids=128))
    hog = "python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'"
    try:
        code, out, _ = shell(host, hog, timeout_ms=60_000)
        assert (code, out) != (0, b"1073741824\n"), "a 1 GiB allocation must fail inside a 256 MiB sandbox"
    except ConnectError:
        pass  # the sandbox was ended with it
    oom = Path("/sys/fs/cgroup/memory/e2b-compat/gl2/memory.oom_control").read_text()
    assert "oom_kill 0" not in oom, "the host cgroup's limit stopped it"
    run(backend.pause("gl2", memory=False))  # what a user does with a sandbox that died: resume it afresh
    host = run(backend.resume("gl2")).host or ""
    assert shell(host, "echo recovered")[1] == b"recovered\n"


@root_only
@pytest.mark.artifacts
def test_a_sandbox_whose_sentry_died_is_stopped_and_resumes_afresh(backend: GvisorBackend, state_dir: Path) -> None:
    host = started(backend, "gd1")
    assert shell(host, "echo kept > /home/user/kept.txt")[0] == 0
    (sentry,) = [
        p for p in runsc_pids(state_dir, "gd1") if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"runsc-sa")
    ]
    os.kill(sentry, signal.SIGKILL)  # what the host's OOM killer does to it at the memory limit
    for _ in range(100):
        if not Path(f"/proc/{sentry}").exists():
            break
        time.sleep(0.05)
    assert [info.state for info in run(backend.list()) if info.sandbox_id == "gd1"] == [State.STOPPED]
    info = run(backend.inspect("gd1"))
    assert (info.state, info.host) == (State.STOPPED, None), "never routed to as running"
    assert runsc_pids(state_dir, "gd1") == [], "what runsc left of it is gone"
    host = run(backend.resume("gd1")).host or ""
    kept = shell(host, "cat /home/user/kept.txt", fresh_connection=True)[1]
    assert kept == b"kept\n", "resumed afresh on its files"
    assert run(backend.inspect("gd1")).state is State.RUNNING


@root_only
@pytest.mark.artifacts
def test_one_unanswered_state_query_does_not_stop_a_live_sandbox(
    backend: GvisorBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = started(backend, "gt1")
    real = backend._runtime.status
    answers: list[str | None] = []

    def once_unanswered(container: str) -> str | None:
        answer = None if not answers else real(container)  # the first query fails, as a busy runsc's may
        answers.append(answer)
        return answer

    monkeypatch.setattr(backend._runtime, "status", once_unanswered)
    assert run(backend.inspect("gt1")).state is State.RUNNING
    assert answers[:2] == [None, "running"], "asked again before settling"
    assert shell(host, "true")[0] == 0, "the sandbox still runs"


@root_only
@pytest.mark.artifacts
def test_pause_memory_keeps_processes_and_filesystem_pause_keeps_files(backend: GvisorBackend) -> None:
    host = started(backend, "gp1")
    # Written aside and renamed: a read between open('w')'s truncation and the write saw an empty file.
    counter = (
        "import os, time\ni = 0\nwhile True:\n    i += 1\n    open('/tmp/n.new', 'w').write(str(i))\n"
        "    os.replace('/tmp/n.new', '/tmp/n')\n    time.sleep(0.05)\n"
    )
    shell(host, f'nohup python3 -c "{counter}" >/dev/null 2>&1 & echo kept > /home/user/kept.txt')
    time.sleep(0.5)
    assert run(backend.pause("gp1", memory=True)).state is State.PAUSED
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=1)
    run(backend.resume("gp1"))
    before = int(shell(host, "cat /tmp/n")[1])
    time.sleep(0.5)
    assert int(shell(host, "cat /tmp/n")[1]) > before, "a memory pause keeps the process, which goes on counting"
    run(backend.pause("gp1", memory=False))
    host = run(backend.resume("gp1")).host or ""
    assert shell(host, "cat /home/user/kept.txt")[1] == b"kept\n", "a filesystem pause keeps files"
    assert shell(host, "test -e /tmp/n")[0] != 0, "and ends processes (and their tmpfs)"
    assert httpx.get(f"http://{host}:{ENVD_PORT}/health").status_code == 204, "the veth was addressed again"


@root_only
@pytest.mark.artifacts
def test_snapshot_is_a_template(backend: GvisorBackend) -> None:
    host = started(backend, "gs1")
    shell(
        host, "echo data > /home/user/snap.txt && chown 1000:1000 /home/user/snap.txt && chmod 640 /home/user/snap.txt"
    )
    snapshot_id = run(backend.snapshot("gs1"))
    assert run(backend.inspect("gs1")).state is State.RUNNING
    run(backend.kill("gs1"))
    restored = started(backend, "gs2", template=snapshot_id)
    probe = "import os; s = os.stat('/home/user/snap.txt'); print(s.st_uid, s.st_gid, oct(s.st_mode & 0o777))"
    assert shell(restored, f'python3 -c "{probe}"; cat /home/user/snap.txt')[1] == b"1000 1000 0o640\ndata\n"
    with pytest.raises(TransitionError, match="in use"):
        run(backend.delete_snapshot(snapshot_id))
    run(backend.kill("gs2"))
    assert run(backend.delete_snapshot(snapshot_id))


@root_only
@pytest.mark.artifacts
def test_reconcile_after_the_server_or_runsc_state_is_lost(state_dir: Path) -> None:
    first = GvisorBackend(state_dir)
    host = started(first, "gr1")
    assert shell(host, "echo kept > /home/user/note.txt")[0] == 0
    report = run(GvisorBackend(state_dir).reconcile())  # the server restarted: the sandbox runs on
    assert "gr1" in report.adopted
    assert report.stopped == ()
    assert shell(host, "echo alive")[1] == b"alive\n"
    # A host restart: processes, mounts, network and runsc's state gone; the files stay.
    record = first._record("gr1")
    assert record.container is not None
    assert record.network is not None
    first._runtime.delete(record.container)
    shutil.rmtree(state_dir / "runsc", ignore_errors=True)
    for mount_point in reversed(_hostfs.mounts_under(first._home("gr1"))):
        subprocess.run(["umount", "-l", mount_point], check=True)
    net = _network.SandboxNetwork.from_record(record.network)
    _network.destroy(net)
    first._addresses.release(net.subnet, first._owner, "gr1")
    second = GvisorBackend(state_dir)
    report = run(second.reconcile())
    assert report.stopped == ("gr1",)
    assert run(second.inspect("gr1")).state is State.STOPPED
    info = run(second.resume("gr1"))
    assert info.host is not None
    assert shell(info.host, "cat /home/user/note.txt") == (0, b"kept\n", b"")
    assert run(second.kill("gr1"))
    assert runsc_pids(state_dir, "gr1") == []


@root_only
@pytest.mark.artifacts
def test_kill_leaves_no_runsc_process_or_cgroup(backend: GvisorBackend, state_dir: Path) -> None:
    started(backend, "gx1")
    assert runsc_pids(state_dir, "gx1"), "a sentry and a gofer run for the sandbox"
    run(backend.pause("gx1", memory=True))
    assert run(backend.kill("gx1"))
    assert runsc_pids(state_dir, "gx1") == []
    for controller in ("memory", "pids", "cpu", "freezer"):
        assert not Path(f"/sys/fs/cgroup/{controller}/e2b-compat/gx1").exists()
    assert not (state_dir / "sandboxes" / "gx1").exists()


# -- a sentry that is gone, seen without sandboxes ---------------------------------------------

NETWORK = {
    "netns": "e2b-gu1",
    "host_if": "eh-gu1",
    "sandbox_if": "es-gu1",
    "subnet": "10.250.7.0/30",
    "host_ip": "10.250.7.1",
    "sandbox_ip": "10.250.7.2",
}


@dataclass
class FakeRunsc:
    """runsc as the backend asks it: a container's status, and its deletion."""

    root: Path
    state: str | None
    deleted: list[str] = field(default_factory=list)
    name: str = "runsc"
    passes_ready_fd: bool = False

    async def create(self, bundle: Path, container: str, log: Path, *, ready_fd: int | None = None) -> None:
        raise AssertionError("nothing is started here")

    async def start(self, container: str) -> None:
        raise AssertionError("nothing is started here")

    async def freeze(self, container: str) -> None:
        raise AssertionError("nothing is frozen here")

    async def thaw(self, container: str) -> None:
        raise AssertionError("nothing is thawed here")

    def status(self, container: str) -> str | None:
        return self.state

    def container_names(self) -> list[str]:
        return []

    def delete(self, container: str) -> None:
        self.deleted.append(container)

    def pid(self, container: str) -> int:
        raise AssertionError("no process here")

    async def checkpoint(self, container: str, images: Path, *, config: Path, leave_running: bool = False) -> None:
        raise AssertionError("nothing is checkpointed here")

    async def restore(self, bundle: Path, container: str, log: Path, images: Path, *, config: Path) -> int:
        raise AssertionError("nothing is restored here")


def offline_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str | None
) -> tuple[GvisorBackend, FakeRunsc]:
    """A backend over one recorded running sandbox ``gu1``, its runsc answering ``state``; nothing is started."""
    monkeypatch.setattr(_network, "ensure_host_firewall", lambda: None)
    backend = GvisorBackend(tmp_path)
    fake = FakeRunsc(tmp_path / "runsc", state)
    backend._runtime = fake
    (tmp_path / "sandboxes" / "gu1").mkdir(parents=True)
    backend._save(Record("gu1", "base", [], State.RUNNING.value, network=NETWORK, container="e2b-gu1-abc"))
    return backend, fake


@pytest.mark.parametrize("status", ["stopped", None])
def test_a_running_sandbox_whose_sentry_is_gone_is_reported_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str | None
) -> None:
    backend, fake = offline_backend(tmp_path, monkeypatch, status)
    assert [(info.state, info.host) for info in run(backend.list())] == [(State.STOPPED, None)]
    assert fake.deleted == ["e2b-gu1-abc"], "what runsc kept of it is deleted"
    record = backend._record("gu1")
    assert (record.state, record.container) == (State.STOPPED.value, None), "recorded: a resume boots it afresh"
    assert run(backend.inspect("gu1")).state is State.STOPPED


@pytest.mark.parametrize("status", ["running", "paused", "created"])
def test_a_sandbox_whose_sentry_runs_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    backend, fake = offline_backend(tmp_path, monkeypatch, status)
    info = run(backend.inspect("gu1"))
    assert (info.state, info.host) == (State.RUNNING, "10.250.7.2")
    assert [i.state for i in run(backend.list())] == [State.RUNNING]
    assert fake.deleted == []


def test_a_sandbox_with_an_operation_in_flight_is_not_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, fake = offline_backend(tmp_path, monkeypatch, "stopped")

    async def inspect_during_an_operation() -> State:
        async with backend._lock("gu1"):  # a filesystem pause between its delete and its save
            return (await backend.inspect("gu1")).state

    assert run(inspect_during_an_operation()) is State.RUNNING
    assert fake.deleted == []


# -- the pinned package (no sandboxes) ------------------------------------------------------


def test_the_pinned_runsc_is_left_alone_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_runsc, "installed_version", lambda: _runsc.RUNSC_VERSION)
    monkeypatch.setattr(_runsc, "_step", lambda *args: pytest.fail("nothing to download or install"))
    _runsc.install_pinned(pytest.fail)


def test_a_package_with_another_hash_is_never_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    steps: list[list[str]] = []

    def step(argv: list[str], env: dict[str, str], cwd: Path) -> None:
        steps.append(argv)
        if argv[1] == "download":  # what apt would fetch, but not the pinned bytes
            (cwd / f"runsc_{_runsc.RUNSC_VERSION}_amd64.deb").write_bytes(b"not the pinned package")

    monkeypatch.setattr(_runsc, "installed_version", lambda: None)
    monkeypatch.setattr(_runsc, "_arch", lambda: "amd64")
    monkeypatch.setattr(_runsc, "_step", step)
    with pytest.raises(HostNotReadyError, match="sha256"):
        _runsc.install_pinned(lambda message: None, cache=tmp_path)
    assert [argv[1] for argv in steps] == ["update", "download"], "apt-get install never ran"
    assert list(tmp_path.iterdir()) == [], "the wrong file is not kept"


def test_runsc_start_runs_past_the_root_namespace_probe() -> None:
    command = _runsc.RunscCommand(Path("/run/x"))
    argv = command._hidden_net_sysctls(*command.argv("start", "c1"))
    assert argv[:2] == ["unshare", "--mount"]
    assert "/proc/sys/net" in argv[argv.index("-c") + 1]
    assert argv[-2:] == ["start", "c1"]
    for flag in ("--platform=ptrace", "--network=sandbox", "--oci-seccomp", "--overlay2=none"):
        assert flag in argv
