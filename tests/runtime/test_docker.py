"""Real sandboxes on our own Docker Engine: the daemon, isolation, limits, pause, snapshots, reconcile, leaks.

Needs root (CI runs these as root). The module starts our daemon through the backend's host
preparation when it does not answer, and stops it again at the end (only one it started). The
host's network state (links, iptables rules, ``ip_forward``) is compared before and after.
The lifecycle conformance is the shared state machine's (test_backend_conformance.py[docker]).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from contract.protocol import ENVD_PORT
from runtime import _docker_engine, _docker_pool, _hostfs, _network, _oci
from runtime._addresses import AddressRegistry
from runtime._docker_reaper import REAPING
from runtime._idranges import IdRangeRegistry
from runtime.backend import BackendError, Limits, SandboxSpec, State, TransitionError
from runtime.docker import CGROUP_PARENT, FEATURES, SNAPSHOT_REPO, DockerBackend
from runtime.templates import ensure_template

from .test_crun import shell
from .test_kernel_surface import uid_when_run_from_the_host

pytestmark = [
    pytest.mark.artifacts,
    pytest.mark.skipif(os.geteuid() != 0, reason="our own Docker Engine and its containers need root"),
]

T = TypeVar("T")
SMALL = Limits(cpu_count=1, memory_mb=256, pids=128)
# crun's capability set (runtime._oci.CAPABILITIES) as the kernel's bit mask, which is also Docker's default.
CRUN_CAPABILITIES = 0xA80425FB
# clone, unshare, io_uring_setup, clone3 (x86_64, aarch64)
_NUMBERS = {"x86_64": (56, 272, 425, 435), "aarch64": (220, 97, 425, 435)}
_CLONE_NEWUSER, _CLONE_NEWNET, _SIGCHLD = 0x10000000, 0x40000000, 17


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def host_network_state() -> dict[str, str]:
    """What Docker is known to change on a host: links (docker0), iptables rules, forwarding."""
    links = sorted(name for name in os.listdir("/sys/class/net") if not name.startswith(_network.HOST_IF_PREFIX))
    state = {"links": " ".join(links), "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text()}
    for tool in ("iptables-save", "ip6tables-save"):
        if shutil.which(tool):
            out = subprocess.run([tool], capture_output=True, text=True, check=False).stdout
            state[tool] = "\n".join(line for line in out.splitlines() if not line.startswith("#"))
    return state


def stop_engine_if_started_here() -> None:
    """Tests restore what they changed: the daemon goes again when this process started it."""
    engine = _docker_engine.default_engine()
    if engine.pidfile in _docker_engine.STARTED_HERE:
        engine.stop()
        _docker_engine.STARTED_HERE.discard(engine.pidfile)


def owned_images(folder: Path) -> list[str]:
    client = _docker_engine.default_engine().client()
    label = f"{_docker_engine.LABEL_OWNER}={folder.absolute()}"
    return [str(image.id) for image in client.images.list(filters={"label": label})]


def remove_owned_images(folder: Path) -> None:
    """Snapshots a test left (the state machine keeps its snapshots): children before their parents."""
    client = _docker_engine.default_engine().client()
    for _ in range(20):
        images = owned_images(folder)
        if not images:
            return
        for image in images:
            with contextlib.suppress(Exception):
                client.images.remove(image, force=True)


def docker_leftovers(folder: Path) -> list[str]:
    """Containers, snapshot images, namespaces and leases of the backend on ``folder`` that still exist.

    Killed sandboxes' containers are removed by the reaper after the kill returned: waited for (a
    bounded while) first, whichever backend object on ``folder`` killed them.
    """
    reaping = folder / REAPING
    deadline = time.monotonic() + 180
    while reaping.is_dir() and any(reaping.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for manifest in (folder / "snapshots").glob("snap-*/manifest.json"):
        shutil.rmtree(manifest.parent)
    remove_owned_images(folder)
    client = _docker_engine.default_engine().client()
    label = f"{_docker_engine.LABEL_OWNER}={folder.absolute()}"
    found = [f"container {c.name}" for c in client.containers.list(all=True, filters={"label": label})]
    found += [f"image {image}" for image in owned_images(folder)]
    found += [f"lease {lease.key}" for lease in AddressRegistry().leases(str(folder.absolute()))]
    found += [
        f"{kind} folder {p.name}"
        for kind in ("sandboxes", REAPING)
        if (folder / kind).is_dir()
        for p in (folder / kind).iterdir()
    ]
    return found


@pytest.fixture(scope="module")
def prepared() -> Iterator[dict[str, str]]:
    before = host_network_state()
    _docker_engine.prepare_host(lambda msg: print(f"host set-up: {msg}"))
    ensure_template("base")
    yield before
    stop_engine_if_started_here()
    assert host_network_state() == before, "the host's network state changed"


@pytest.fixture
def state_dir(prepared: dict[str, str]) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="e2b-compat-docker-", dir="/var/tmp"))
    yield folder
    backend = DockerBackend(folder)
    for info in run(backend.list()):
        run(backend.kill(info.sandbox_id))
    assert docker_leftovers(folder) == []
    shutil.rmtree(folder)


@pytest.fixture
def backend(state_dir: Path) -> DockerBackend:
    return DockerBackend(state_dir)


def started(backend: DockerBackend, sandbox_id: str, template: str = "base", limits: Limits = SMALL) -> str:
    run(backend.create(SandboxSpec(sandbox_id, template, limits=limits)))
    info = run(backend.start(sandbox_id))
    assert info.host is not None
    return info.host


def init_pid(backend: DockerBackend, sandbox_id: str) -> int:
    container = backend._container(backend._record(sandbox_id))
    assert container is not None
    return int(container.attrs["State"]["Pid"])


def test_our_daemon_answers_and_the_host_network_is_unchanged(prepared: dict[str, str], backend: DockerBackend) -> None:
    engine = _docker_engine.default_engine()
    assert engine.answers()
    pid = engine.pid()
    assert pid is not None
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    for flag in (b"--iptables=false", b"--ip6tables=false", b"--ip-forward=false", b"--bridge=none"):
        assert flag in argv
    assert f"--host={engine.url}".encode() in argv
    assert os.getsid(pid) != os.getsid(0), "the daemon runs in a session of its own"
    assert not Path("/var/run/docker.sock").exists(), "the host's default daemon socket is never made"
    started(backend, "dn1")
    assert host_network_state() == prepared, "a running sandbox changed the host's links, rules or forwarding"


def test_agent_answers_with_crun_s_kernel_surface(backend: DockerBackend) -> None:
    assert backend.features == FEATURES
    host = started(backend, "ks1")
    assert httpx.get(f"http://{host}:{ENVD_PORT}/health").status_code == 204
    assert shell(host, "hostname")[1] == b"ks1\n"
    assert shell(host, "echo $E2B_SANDBOX $E2B_SANDBOX_ID $E2B_TEMPLATE_ID")[1] == b"true ks1 base\n"
    assert len(shell(host, "ps -e -o pid=")[1].split()) < 10, "host processes are not visible"
    clone, unshare, io_uring_setup, clone3 = _NUMBERS[platform.machine()]
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def errno(*args):\n"
        "    if libc.syscall(*args) == 0: os._exit(0)\n"
        "    return ctypes.get_errno()\n"
        f"print(errno({clone}, {_CLONE_NEWUSER | _SIGCHLD}, 0, 0, 0, 0),"
        f" errno({clone}, {_CLONE_NEWNET | _SIGCHLD}, 0, 0, 0, 0), errno({unshare}, {_CLONE_NEWUSER}),"
        f" errno({io_uring_setup}, 1, 0), errno({clone3}, 0, 0))\n"
    )
    code, out, err = shell(host, f"python3 -c '{probe}'")
    assert (code, out) == (0, b"1 1 1 1 38\n"), err  # EPERM four times (io_uring too), ENOSYS for clone3
    for attempt in ("mount -t tmpfs none /mnt", "unshare --mount true"):
        assert shell(host, attempt)[0] != 0, f"{attempt!r} succeeded inside the sandbox"
    bounding = next(line for line in shell(host, "cat /proc/1/status")[1].splitlines() if line.startswith(b"CapBnd"))
    assert int(bounding.split()[1], 16) == CRUN_CAPABILITIES, "capabilities no wider than crun's"
    assert shell(host, "su user -c 'sudo -n true' && echo sudo")[1] == b"sudo\n", "setuid sudo still works"
    names = set(shell(host, "ls /sys/class/net")[1].split())
    assert names == {
        b"lo",
        _network.SandboxNetwork.from_record(backend._record("ks1").network or {}).sandbox_if.encode(),
    }
    assert b"e2b-compat" not in shell(host, "cat /proc/self/cgroup")[1], "a cgroup namespace of its own"


def test_a_full_disk_is_the_kernel_s_limit_and_never_reaches_the_host(backend: DockerBackend) -> None:
    """The qgroup stops a filler at the disk size (EDQUOT), an upload gets 507, the pool shields the host."""
    small_disk = Limits(cpu_count=1, memory_mb=256, pids=128, disk_mb=64)
    full, neighbour = started(backend, "dk1", limits=small_disk), started(backend, "dk2", limits=small_disk)
    before = shutil.disk_usage(_docker_engine.default_engine().pool_image.parent).free
    code, _, err = shell(full, "dd if=/dev/zero of=/home/user/big bs=1M count=1024 conv=fsync")
    grown = before - shutil.disk_usage(_docker_engine.default_engine().pool_image.parent).free
    assert code != 0
    assert b"Disk quota exceeded" in err, err  # btrfs's EDQUOT, where ext4 says ENOSPC
    written = int(shell(full, "stat -c %s /home/user/big")[1])
    assert 48 << 20 < written <= 64 << 20, f"the filler stopped at {written >> 20} MiB of a 64 MiB disk"
    assert grown < 400 << 20, f"the host lost {grown >> 20} MiB to a 64 MiB disk"  # others write too: no tighter
    shell(full, "sync")  # the qgroup counts at each commit
    metrics = run(backend.metrics("dk1"))
    assert metrics.disk_total_bytes == 64 << 20
    assert metrics.disk_used_bytes > 48 << 20
    upload = httpx.post(
        f"http://{full}:{ENVD_PORT}/files",
        params={"path": "/home/user/upload", "username": "user"},
        content=b"u" * (32 << 20),
        headers={"content-type": "application/octet-stream"},
        timeout=60,
    )
    assert upload.status_code == 507, upload.text
    # The disk is full: btrfs refuses even the new file's metadata (EDQUOT at open), where ext4 fails the write.
    assert upload.json()["code"] == 507
    assert upload.json()["message"] in (
        "not enough disk space available",
        "not enough inodes available: Disk quota exceeded",
    )
    assert shell(neighbour, "head -c 32M /dev/zero > /home/user/f && stat -c %s /home/user/f")[1] == b"33554432\n"
    shell(full, "rm /home/user/big /home/user/upload; sync")
    assert shell(full, "echo fits > /home/user/small && cat /home/user/small")[1] == b"fits\n", "space comes back"
    pool = _docker_engine.default_engine().pool_image
    assert pool.stat().st_blocks * 512 <= pool.stat().st_size, "the pool is sparse and bounded"


def test_sandbox_root_is_the_remapped_host_uid(backend: DockerBackend, tmp_path: Path) -> None:
    base = _docker_pool.remap_entries()[0]
    assert base is not None
    assert base[1] == 65536
    uid = base[0]
    host = started(backend, "ur1")
    pid = init_pid(backend, "ur1")
    assert Path(f"/proc/{pid}/uid_map").read_text().split() == ["0", str(uid), "65536"]
    status = Path(f"/proc/{pid}/status").read_text()
    assert f"Uid:\t{uid}\t" in status, "the sandbox's root is an unprivileged host uid"
    shell(host, "echo x > /root/by-root && su user -c 'echo y > /home/user/by-user'")
    layer = backend._subvolume(str(backend._record("ur1").container_id))
    assert (layer / "root/by-root").stat().st_uid == uid
    assert (layer / "home/user/by-user").stat().st_uid == uid + 1000
    secret = layer / "root/host-secret"  # a host root file, as a bind-mounted host file would be
    secret.write_text("host only\n")
    os.chmod(secret, 0o600)
    secret_path = "/root/host-secret"
    tries = f"cat {secret_path} && echo read; chmod 644 {secret_path} && echo changed; stat -c %u {secret_path}"
    assert shell(host, tries)[1] == b"65534\n", "root inside has no power over a host root file (it is nobody there)"
    assert shell(host, "su user -c 'sudo -n id -u'")[1] == b"0\n", "sudo still works inside"
    # ... while the host's view of the pool is nosuid: a planted setuid program is no way up there.
    assert {"nosuid", "nodev"} <= _hostfs.mount_options(str(backend._engine.pool))
    assert backend._engine.in_own_namespace(), "the daemon's suid view of the pool is its own namespace's"
    assert shell(host, "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id")[0] == 0
    assert shell(host, "su user -c '/usr/local/bin/suid-id -u'")[1] == b"0\n", "setuid applies inside"
    assert uid_when_run_from_the_host(layer / "usr/local/bin/suid-id") == "65534"
    # The remap range is a subid entry: crun's per-sandbox ranges never take it.
    ids = IdRangeRegistry(tmp_path, first=uid - 65536, count=3)
    assert [ids.allocate("t", "a"), ids.allocate("t", "b")] == [uid - 65536, uid + 65536]


def test_network_isolation_is_crun_s(backend: DockerBackend) -> None:
    server = socket.socket()
    server.bind(("0.0.0.0", 0))  # a host service on every address
    server.listen()
    port = server.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        a, b = started(backend, "nia"), started(backend, "nib")
        net = _network.SandboxNetwork.from_record(backend._record("nia").network or {})
        for target in ("127.0.0.1", str(net.host_ip)):
            assert shell(a, f"curl -s -m 2 -o /dev/null http://{target}:{port}/")[0] != 0, f"host reached at {target}"
        assert shell(a, "ip route | grep -c default || true")[1].strip() == b"0", "no default route: no egress"
        shell(a, "nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 &")
        for _ in range(50):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://{a}:8000/", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the host cannot reach a port inside the sandbox")
        assert shell(b, f"curl -s -m 2 -o /dev/null http://{a}:8000/")[0] != 0, "sandboxes reach each other"
    finally:
        server.close()
    assert not accepted


def test_network_policy_is_applied_updated_and_survives_a_stop(backend: DockerBackend) -> None:
    run(backend.create(SandboxSpec("np1", "base", limits=SMALL, deny_out=("203.0.113.0/24",))))
    host = run(backend.start("np1")).host or ""
    net = _network.SandboxNetwork.from_record(backend._record("np1").network or {})

    def table() -> str:
        argv = ["nft", "list", "table", "inet", _network.FIREWALL_TABLE]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    assert "ip daddr 203.0.113.0/24" in table()
    run(backend.pause("np1", memory=False))
    assert not any(_network.exists(net).values()), "a stopped sandbox has no veth"
    run(backend.update_network("np1", allow_internet_access=True, allow_out=(), deny_out=()))
    host = run(backend.resume("np1")).host or ""
    assert f"p_{net.host_if}" not in table()
    assert shell(host, "ip route | grep -c default || true")[1].strip() == b"1", "egress on: a default route"
    run(backend.update_network("np1", allow_internet_access=False, allow_out=(), deny_out=("198.51.100.0/24",)))
    assert "ip daddr 198.51.100.0/24" in table(), "changed live"
    assert shell(host, "ip route | grep -c default || true")[1].strip() == b"0"
    run(backend.kill("np1"))
    assert net.host_if not in table()


def test_limits(backend: DockerBackend) -> None:
    host = started(backend, "lim1", limits=Limits(cpu_count=1, memory_mb=256, pids=64))
    code, out, _ = shell(host, "python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'")
    assert (code != 0, out) == (True, b""), "a 1 GiB allocation fails inside a 256 MiB sandbox"
    open_files = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    assert shell(host, "ulimit -n")[1].strip() == str(open_files).encode()
    cid = backend._record("lim1").container_id
    cgroup = Path("/sys/fs/cgroup/cpu") / CGROUP_PARENT / str(cid)
    assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "100000", "one CPU"
    shell(host, "setsid bash -c 'bomb() { bomb | bomb & }; bomb' >/dev/null 2>&1 </dev/null &")
    time.sleep(3)
    metrics = run(backend.metrics("lim1"))
    assert 0 < metrics.pids <= 64
    assert 0 < metrics.memory_bytes <= metrics.memory_limit_bytes == 256 << 20
    assert httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=5).status_code == 204, "the agent survived"
    run(backend.pause("lim1", memory=False))  # ends every process
    host = run(backend.resume("lim1")).host or ""
    assert shell(host, "echo recovered")[1] == b"recovered\n"


def test_pause_resume_memory_and_filesystem(backend: DockerBackend) -> None:
    host = started(backend, "pz1")
    shell(host, "nohup sleep 6123 >/dev/null 2>&1 &")  # found by its argument: pids restart in a new boot
    shell(host, "echo kept > /home/user/kept.txt")
    assert run(backend.pause("pz1", memory=True)).state is State.PAUSED
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=1)
    run(backend.resume("pz1"))
    assert shell(host, "pgrep -x sleep")[0] == 0, "a memory pause keeps processes"
    first_pid = init_pid(backend, "pz1")
    assert run(backend.pause("pz1", memory=False)).state is State.STOPPED
    host = run(backend.resume("pz1")).host or ""
    assert init_pid(backend, "pz1") != first_pid, "booted afresh, in a new network namespace"
    assert shell(host, "pgrep -x sleep")[0] != 0, "a filesystem pause ends processes"
    assert shell(host, "cat /home/user/kept.txt")[1] == b"kept\n", "but keeps files"


def test_snapshot_is_a_template_and_in_use_until_its_sandboxes_go(backend: DockerBackend, state_dir: Path) -> None:
    host = started(backend, "sn1")
    shell(host, "echo data > /home/user/snap.txt && chown 1000:1000 /home/user/snap.txt && rm /etc/issue")
    snapshot = run(backend.snapshot("sn1"))
    assert snapshot.startswith("snap-")
    assert run(backend.inspect("sn1")).state is State.RUNNING
    restored = started(backend, "sn2", template=snapshot)
    seen = shell(restored, "stat -c %u /home/user/snap.txt; cat /home/user/snap.txt; test -e /etc/issue || echo gone")
    assert seen[1] == b"1000\ndata\ngone\n"
    with pytest.raises(TransitionError):
        run(backend.delete_snapshot(snapshot))
    run(backend.kill("sn2"))
    assert owned_images(state_dir), "the snapshot's image outlives its sandboxes"
    assert run(backend.delete_snapshot(snapshot)) is True
    assert owned_images(state_dir) == [], "deleting a snapshot removes its image"
    assert run(backend.delete_snapshot(snapshot)) is False


def test_reconcile_after_a_server_crash(state_dir: Path) -> None:
    first = DockerBackend(state_dir)
    host = started(first, "rc1")
    run(first.create(SandboxSpec("rc2", "base", limits=SMALL)))
    stray = first._docker.containers.create(
        first._record("rc1").image, ["true"], name=f"e2b-stray-{os.getpid()}", labels=first._labels("sandbox", "gone")
    )
    second = DockerBackend(state_dir)  # a new server process
    report = run(second.reconcile())
    assert set(report.adopted) == {"rc1", "rc2"}
    assert str(stray.name) in report.cleaned, "a container of ours that no record names is removed"
    assert shell(host, "echo still")[1] == b"still\n", "a running sandbox is kept running"
    assert {i.sandbox_id: i.state for i in run(second.list())} == {"rc1": State.RUNNING, "rc2": State.CREATED}
    assert run(second.start("rc2")).host


def test_a_daemon_restart_stops_sandboxes_and_keeps_their_files(state_dir: Path) -> None:
    backend = DockerBackend(state_dir)
    host = started(backend, "hr1")
    shell(host, "echo survived > /home/user/file")
    started(backend, "hr2")
    run(backend.pause("hr2", memory=True))
    engine = _docker_engine.default_engine()
    pidfile_was_ours = engine.pidfile in _docker_engine.STARTED_HERE
    engine.stop()  # what a host restart does to the daemon: every container exits
    net = _network.SandboxNetwork.from_record(backend._record("hr1").network or {})
    engine.start(lambda msg: None)
    if not pidfile_was_ours:
        _docker_engine.STARTED_HERE.discard(engine.pidfile)
    backend = DockerBackend(state_dir)
    report = run(backend.reconcile())
    assert set(report.stopped) == {"hr1", "hr2"}
    assert not _network.exists(net)["netns"], "the name of the namespace that ended is gone"
    host = run(backend.resume("hr1")).host or ""
    assert shell(host, "cat /home/user/file")[1] == b"survived\n"
    assert run(backend.resume("hr2")).state is State.RUNNING


def test_a_daemon_of_ours_in_the_hosts_namespace_is_restarted_into_its_own(state_dir: Path) -> None:
    """As one started before daemons had a namespace of their own: refused by the backend, restarted by start."""
    engine = _docker_engine.default_engine()
    pidfile_was_ours = engine.pidfile in _docker_engine.STARTED_HERE
    engine.stop()
    with open(engine.log, "ab") as log:  # the old way: in this (the host's) namespace, as is
        old_way = ["setsid", "--fork", *engine.argv()]
        subprocess.run(old_way, stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True)
    engine._wait_answering()
    assert not engine.in_own_namespace()
    with pytest.raises(BackendError, match="host's mount namespace"):
        DockerBackend(state_dir)
    said: list[str] = []
    assert engine.start(said.append), "restarted"
    if not pidfile_was_ours:
        _docker_engine.STARTED_HERE.discard(engine.pidfile)
    assert any("older settings" in line for line in said), said
    assert engine.in_own_namespace()
    assert _hostfs.mounts_under(engine.pool) == [], "nothing of the daemon's is mounted in the host's namespace"
    host = started(DockerBackend(state_dir), "ns1")
    assert shell(host, "su user -c 'sudo -n id -u'")[1] == b"0\n"


def test_kill_leaves_nothing(state_dir: Path) -> None:
    backend = DockerBackend(state_dir)
    ids = [f"lk{i}" for i in range(8)]
    containers: list[str] = []

    async def churn() -> None:
        for index, sandbox_id in enumerate(ids):
            await backend.create(SandboxSpec(sandbox_id, "base", limits=SMALL))
            containers.append(str(backend._record(sandbox_id).container_id))
            if index % 4 == 0:
                start = asyncio.ensure_future(backend.start(sandbox_id))
                await asyncio.sleep(0.05)  # killed mid-start
                await backend.kill(sandbox_id)
                await asyncio.gather(start, return_exceptions=True)
                continue
            if index % 4 != 1:
                await backend.start(sandbox_id)
            if index % 4 == 2:
                await backend.pause(sandbox_id, memory=True)
            if index % 4 == 3:
                await backend.pause(sandbox_id, memory=False)
            await backend.kill(sandbox_id)

    run(churn())
    run(backend.reconcile())
    assert docker_leftovers(state_dir) == []
    names = set(_network.list_owned())
    assert not {_network.NETNS_PREFIX + sandbox_id for sandbox_id in ids} & names, "network namespaces left"
    mounts = Path("/proc/mounts").read_text()
    assert not [sandbox_id for sandbox_id in ids if f"/run/netns/{_network.NETNS_PREFIX}{sandbox_id} " in mounts]
    cgroups = [c for c in containers if Path(f"/sys/fs/cgroup/memory/{CGROUP_PARENT}/{c}").exists()]
    assert cgroups == [], "cgroups left"


def test_snapshot_images_are_not_left_by_a_crash_before_the_manifest(backend: DockerBackend, state_dir: Path) -> None:
    started(backend, "cm1")
    snapshot = run(backend.snapshot("cm1"))
    shutil.rmtree(state_dir / "snapshots" / snapshot)  # as if the server died between commit and manifest
    assert owned_images(state_dir)
    run(backend.reconcile())
    assert owned_images(state_dir) == []
    client = _docker_engine.default_engine().client()
    assert not client.images.list(name=f"{SNAPSHOT_REPO}:{snapshot}")


def test_the_seccomp_profile_is_docker_s_default_with_crun_s_refusals_on_top(prepared: dict[str, str]) -> None:
    default = json.loads(_docker_engine.default_engine().profile.read_text())
    merged = _docker_engine.seccomp_profile(default)
    refused = set(_oci.DENIED_SYSCALLS) | set(_oci.IO_URING_SYSCALLS)
    allowed = {name for rule in merged["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}
    assert not allowed & refused, "no allow rule (of any condition) names a refused call"
    assert {"io_uring_setup", "keyctl", "bpf"} <= {
        name for rule in merged["syscalls"] if rule.get("errnoRet") == 1 for name in rule["names"]
    }
    kept = {name for rule in default["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}
    assert allowed == kept - refused, "everything else Docker allows stays allowed"
    assert merged["defaultAction"] == default["defaultAction"] == "SCMP_ACT_ERRNO", "still an allow-list"
