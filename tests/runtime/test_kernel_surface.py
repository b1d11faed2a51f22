"""Real crun sandboxes against the kernel: calls refused, /sys views, id ranges, host folders, shared limits.

What a hostile tenant's root could reach past its own sandbox: namespace-making calls and
io_uring, the host's interfaces and other sandboxes' cgroups under /sys, another sandbox's or a
host user's ids, the sandbox's files from the host side, and the kernel limits counted per host
user (inotify instances, processes). Needs root and crun; CI runs these as root.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import subprocess
from pathlib import Path

import pytest

from contract.generated.filesystem import filesystem_connect
from contract.generated.filesystem import filesystem_pb2 as fpb
from contract.protocol import ENVD_PORT
from runtime import _hostfs, _idranges, _oci
from runtime.backend import Limits, SandboxSpec
from runtime.crun import CrunBackend

from .test_crun import backend, run, shell, started, state_dir

__all__ = ["backend", "state_dir"]  # the fixtures, shared with test_crun.py

pytestmark = [
    pytest.mark.artifacts,
    pytest.mark.skipif(os.geteuid() != 0, reason="crun sandboxes need root (namespaces, mounts, cgroups)"),
]

# clone, unshare, io_uring_setup, clone3 (x86_64, aarch64)
_NUMBERS = {"x86_64": (56, 272, 425, 435), "aarch64": (220, 97, 425, 435)}
_CLONE_NEWUSER, _CLONE_NEWNET, _SIGCHLD = 0x10000000, 0x40000000, 17


def test_namespace_calls_and_io_uring_fail_while_processes_work(backend: CrunBackend) -> None:
    clone, unshare, io_uring_setup, clone3 = _NUMBERS[platform.machine()]
    host = started(backend, "ks1")
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def errno(*args):\n"
        "    if libc.syscall(*args) == 0: os._exit(0)\n"  # a child that got made: gone at once
        "    return ctypes.get_errno()\n"
        f"print(errno({clone}, {_CLONE_NEWUSER | _SIGCHLD}, 0, 0, 0, 0),"
        f" errno({clone}, {_CLONE_NEWNET | _SIGCHLD}, 0, 0, 0, 0), errno({unshare}, {_CLONE_NEWUSER}),"
        f" errno({io_uring_setup}, 1, 0), errno({clone3}, 0, 0))\n"
    )
    code, out, err = shell(host, f"python3 -c '{probe}'")
    assert (code, out) == (0, b"1 1 1 1 38\n"), err  # EPERM four times, then ENOSYS for clone3
    ordinary = (
        "import os, subprocess, threading\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "pid = os.fork()\n"
        "os._exit(0) if pid == 0 else os.waitpid(pid, 0)\n"
        "print(subprocess.run(['true']).returncode)\n"
    )
    assert shell(host, f'python3 -c "{ordinary}"')[1] == b"0\n", "fork, threads and subprocess still work"
    assert shell(host, "su user -c 'sudo -n true' && echo sudo")[1] == b"sudo\n", "setuid sudo still works"


def test_sys_shows_only_the_sandboxs_own_interfaces_and_cgroup(backend: CrunBackend) -> None:
    a = started(backend, "ksa")
    b = started(backend, "ksb")
    own = set(shell(a, "ls /sys/class/net")[1].split())
    links = {line.split(b":")[1].strip().split(b"@")[0] for line in shell(a, "ip -o link")[1].splitlines()}
    assert own == links, "sysfs lists the sandbox's interfaces, as netlink does"
    others = {name.encode() for name in os.listdir("/sys/class/net")} | set(shell(b, "ls /sys/class/net")[1].split())
    others -= {b"lo"}
    names = " -o ".join(f"-name {name.decode()}" for name in sorted(others))
    seen = shell(a, f"find /sys/class /sys/devices \\( {names} \\) 2>/dev/null")[1]
    assert seen == b"", f"host or other sandbox interfaces under /sys: {seen!r}"
    cgroups = shell(a, "find /sys/fs/cgroup -maxdepth 3 2>/dev/null")[1]
    assert b"pids.max" in cgroups or b"pids.current" in cgroups
    assert b"ksb" not in cgroups, "another sandbox's cgroup is visible"
    assert b"e2b-compat" not in cgroups, "the cgroup view is rooted at the sandbox's own"


def test_each_sandbox_maps_onto_a_range_of_its_own(backend: CrunBackend) -> None:
    a = started(backend, "kid1")
    b = started(backend, "kid2")
    ranges = []
    for host in (a, b):
        inside, outside, size = (int(v) for v in shell(host, "cat /proc/self/uid_map")[1].split())
        assert (inside, size) == (0, 65536)
        assert shell(host, "cat /proc/self/gid_map")[1].split()[1] == str(outside).encode()
        ranges.append(range(outside, outside + size))
    assert ranges[0].stop <= ranges[1].start or ranges[1].stop <= ranges[0].start, f"overlap: {ranges}"
    reserved = _idranges.subid_ranges()
    for span in ranges:
        assert span.start >= _idranges.FIRST_ID
        assert not any(span.start < r.stop and r.start < span.stop for r in reserved), "a host user's subids"


def test_sandbox_folders_are_closed_to_other_host_users(backend: CrunBackend, state_dir: Path) -> None:
    host = started(backend, "kperm")
    shell(host, "echo private > /home/user/private.txt")
    home = state_dir / "sandboxes" / "kperm"
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for path in (home / "logs" / "sandbox.log", home / "record.json", home / "bundle" / "config.json"):
        assert path.exists()
        proc = subprocess.run([*nobody, "cat", str(path)], capture_output=True, check=False)
        assert proc.returncode != 0, f"{path} is readable by another host user"
    files = subprocess.run([*nobody, "find", str(home)], capture_output=True, text=True, check=False).stdout
    assert "private.txt" not in files
    mount = next(line for line in Path("/proc/mounts").read_text().splitlines() if f"{home}/bundle/rootfs" in line)
    assert {"nodev", "nosuid"} <= set(mount.split()[3].split(",")), "the host's view of its files is nosuid, nodev"


def test_setuid_works_inside_while_the_hosts_view_ignores_it(backend: CrunBackend, state_dir: Path) -> None:
    """A setuid-root program the sandbox's root makes runs as root inside, and as its caller from the host."""
    host = started(backend, "ksuid")
    code, _, err = shell(host, "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id")
    assert code == 0, err
    assert shell(host, "su user -c '/usr/local/bin/suid-id -u'")[1] == b"0\n", "setuid applies inside"
    rootfs = state_dir / "sandboxes" / "ksuid" / "bundle" / "rootfs"
    program = rootfs / "usr" / "local" / "bin" / "suid-id"
    assert program.stat().st_mode & 0o4000, "the bit is there on the host side"
    assert uid_when_run_from_the_host(program) == "65534", "the host's view ignores the bit"


def test_reconcile_makes_an_earlier_version_s_setuid_host_view_nosuid(backend: CrunBackend, state_dir: Path) -> None:
    host = started(backend, "ksuid2")
    rootfs = str(state_dir / "sandboxes" / "ksuid2" / "bundle" / "rootfs")
    _hostfs.run("mount", "-o", "remount,bind,suid,nodev", rootfs)  # as an earlier version mounted it
    assert "nosuid" not in _hostfs.mount_options(rootfs)
    report = run(CrunBackend(state_dir).reconcile())
    assert "ksuid2" in report.adopted
    assert {"nosuid", "nodev"} <= _hostfs.mount_options(rootfs)
    assert shell(host, "su user -c 'sudo -n id -u'")[1] == b"0\n", "the running sandbox's own view keeps setuid"


def test_a_sandbox_cannot_use_up_inotify_for_others_or_the_host(backend: CrunBackend) -> None:
    greedy = started(backend, "kino1")
    other = started(backend, "kino2")
    hog = (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "n = 0\n"
        "while libc.inotify_init() >= 0: n += 1\n"
        "open('/tmp/count', 'w').write(str(n))\n"
        "time.sleep(120)\n"
    )
    wait = "for i in $(seq 100); do test -s /tmp/count && break; sleep 0.1; done"
    shell(greedy, f'nohup python3 -c "{hog}" >/dev/null 2>&1 & {wait}')
    count = int(shell(greedy, "cat /tmp/count")[1])
    assert 0 < count <= _oci.INOTIFY_INSTANCES
    client = filesystem_connect.FilesystemClientSync(f"http://{other}:{ENVD_PORT}", timeout_ms=10_000)
    watcher = client.create_watcher(fpb.CreateWatcherRequest(path="/home/user"))
    assert watcher.watcher_id, "the other sandbox's agent can still watch a folder"
    client.remove_watcher(fpb.RemoveWatcherRequest(watcher_id=watcher.watcher_id))
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init()
    assert fd >= 0, f"the host's root cannot make an inotify instance: {os.strerror(ctypes.get_errno())}"
    os.close(fd)


def test_a_fork_bomb_leaves_other_sandboxes_and_the_host_able_to_fork(backend: CrunBackend) -> None:
    bomb = started(backend, "kfb1", limits=Limits(cpu_count=1, memory_mb=256, pids=64))
    calm = started(backend, "kfb2")
    shell(bomb, "setsid bash -c 'bomb() { bomb | bomb & }; bomb' >/dev/null 2>&1 </dev/null &")
    code, out, _ = shell(calm, "for i in $(seq 30); do sleep 1 & done; wait; echo forked")
    assert (code, out) == (0, b"forked\n")
    assert subprocess.run(["true"], check=False).returncode == 0
    assert run(backend.metrics("kfb1")).pids <= 64


def test_open_files_are_bounded(backend: CrunBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # Below any host's own limit, so that what is seen is the sandbox's bound, not the server's inherited one.
    monkeypatch.setattr(_oci, "NOFILE_LIMIT", 4000)
    host = started(backend, "knofile")
    expected = min(4000, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    assert shell(host, "ulimit -Sn; ulimit -Hn")[1] == f"{expected}\n{expected}\n".encode()


def test_a_snapshot_keeps_owners_in_a_sandbox_of_another_range(backend: CrunBackend, state_dir: Path) -> None:
    source = started(backend, "ksnap1")
    made = (
        "su user -c 'echo mine > /home/user/mine.txt' && cp /bin/true /usr/local/bin/rs && chmod 4755 /usr/local/bin/rs"
    )
    assert shell(source, made)[0] == 0
    snapshot_id = run(backend.snapshot("ksnap1"))
    kept = state_dir / "snapshots" / snapshot_id / "upper" / "home" / "user" / "mine.txt"
    assert (kept.stat().st_uid, kept.stat().st_gid) == (1000, 1000), "stored with 0-based owners"
    assert json.loads((state_dir / "snapshots" / snapshot_id / "manifest.json").read_text())["zero_based"]
    restored = started(backend, "ksnap2", template=snapshot_id)
    assert backend._record("ksnap1").ids != backend._record("ksnap2").ids
    listing = shell(restored, "stat -c '%U:%G:%a' /home/user/mine.txt /usr/local/bin/rs")[1]
    assert listing == b"user:user:644\nroot:root:4755\n"
    assert (
        shell(restored, "su user -c 'echo more >> /home/user/mine.txt' && cat /home/user/mine.txt")[1]
        == b"mine\nmore\n"
    )
    run(backend.kill("ksnap2"))
    run(backend.kill("ksnap1"))
    assert run(backend.delete_snapshot(snapshot_id))


def test_ranges_are_released_on_kill(state_dir: Path) -> None:
    crun = CrunBackend(state_dir)
    run(crun.create(SandboxSpec("krel", "base", limits=Limits(cpu_count=1, memory_mb=128, pids=32))))
    try:
        base = crun._record("krel").ids
        assert base is not None
        owner = str(state_dir.absolute())
        assert any(lease.base == base for lease in crun._ids.leases(owner))
    finally:
        run(crun.kill("krel"))
    assert not any(lease.base == base for lease in crun._ids.leases(owner))


def uid_when_run_from_the_host(program: Path) -> str:
    """``id -u`` as ``program`` prints it when host uid 65534 runs it from the host's mount of it.

    Only host root reaches a sandbox's files (0700 folders), so root opens the program and 65534
    runs it through that descriptor: a setuid bit honoured makes it its owner, nosuid keeps it 65534.
    """
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    fd = os.open(program, os.O_PATH)
    try:
        argv = [*nobody, f"/proc/self/fd/{fd}", "-u"]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, pass_fds=(fd,))
    finally:
        os.close(fd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()
