"""Memory snapshots on crun: new sandboxes that continue a snapshot's processes; checkpoints in parallel.

Real sandboxes, as root, with the checkpoint tools (CI builds them; elsewhere ``e2b-compat host
prepare`` does). Each test kills what it made and checks that nothing is left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from contract.protocol import ENVD_PORT
from runtime.backend import Feature, Limits, SandboxSpec, State, TransitionError
from runtime.crun import CrunBackend

from .test_crun import _holder, _leftovers, _needs_checkpoints, backend, crun_backend, run, shell, started, state_dir

__all__ = ["backend", "state_dir"]  # the fixtures, shared with test_crun

pytestmark = [
    pytest.mark.artifacts,
    pytest.mark.skipif(os.geteuid() != 0, reason="crun sandboxes need root (namespaces, mounts, cgroups)"),
]

_IDENTITY = "cat /run/e2b/.E2B_SANDBOX_ID; echo; hostname; grep -c . /etc/hosts; head -c 22 /proc/self/uid_map"


def _uid_map_base(out: str) -> int:
    return int(out.split()[1])


def test_a_memory_snapshot_continues_its_processes_in_each_new_sandbox(backend: CrunBackend, state_dir: Path) -> None:
    _needs_checkpoints()
    assert Feature.SNAPSHOT_MEMORY in backend.features
    host = started(backend, "ms1")
    pid = _holder(host, "holder-ms1")
    assert shell(host, "echo on-disk > /root/disk.txt")[0] == 0
    snapshot = run(backend.snapshot("ms1", memory=True))
    # The source runs on where it was: same address, same process, its network back.
    assert run(backend.inspect("ms1")).state is State.RUNNING
    assert shell(host, f"kill -0 {pid} && echo up", fresh_connection=True) == (0, b"up\n", b"")
    hosts = {}
    for sandbox_id in ("ms2", "ms3"):
        run(backend.create(SandboxSpec(sandbox_id, snapshot, limits=Limits(cpu_count=1, memory_mb=256, pids=128))))
        hosts[sandbox_id] = run(backend.start(sandbox_id)).host or ""
    assert len({host, *hosts.values()}) == 3, "each its own address"
    bases = set()
    for sandbox_id, address in hosts.items():
        code, out, err = shell(
            address, f"kill -0 {pid} && cat /tmp/ram.txt /root/disk.txt && {_IDENTITY}", fresh_connection=True
        )
        assert code == 0, err
        lines = out.decode().split("\n")
        # The process and the tmpfs file came from memory, the disk file from the snapshot's files.
        assert lines[:2] == ["in-ram", "on-disk"]
        # Its own identity: /run/e2b, hostname, /etc/hosts from its own bundle; its own id range.
        assert lines[2:4] == [sandbox_id, sandbox_id]
        base = _uid_map_base(lines[5])
        assert base == backend._record(sandbox_id).ids
        bases.add(base)
        assert not (backend._home(sandbox_id) / "memory").exists(), "the copy of the images goes once restored"
    assert len(bases | {backend._record("ms1").ids}) == 3
    # Three sandboxes, three processes: ending one leaves the others.
    assert shell(hosts["ms2"], f"kill {pid}")[0] == 0
    assert shell(hosts["ms3"], f"kill -0 {pid}")[0] == 0
    assert shell(host, f"kill -0 {pid}")[0] == 0
    # A released snapshot goes once the last sandbox standing on it goes.
    folder = state_dir / "snapshots" / snapshot
    run(backend.release_snapshot(snapshot))
    assert folder.is_dir(), "sandboxes stand on its files"
    assert not (folder / "memory").exists(), "nobody continues its processes again"
    for sandbox_id in ("ms2", "ms3"):
        assert run(backend.kill(sandbox_id))
    assert not folder.exists()
    assert run(backend.kill("ms1"))
    assert _leftovers(state_dir, ["ms1", "ms2", "ms3"]) == []


def test_a_memory_snapshot_needs_a_running_sandbox_and_a_failed_one_stores_nothing(
    backend: CrunBackend, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_checkpoints()
    host = started(backend, "ms4")
    run(backend.pause("ms4", memory=False))
    with pytest.raises(TransitionError):
        run(backend.snapshot("ms4", memory=True))
    run(backend.resume("ms4"))
    host = run(backend.inspect("ms4")).host or host
    before = sorted(p.name for p in (state_dir / "snapshots").iterdir())
    # CRIU refusing the dump: the snapshot fails, nothing of it stays, the sandbox runs on.
    bad = state_dir / "bad-criu.conf"
    bad.write_text("no-such-option\n")
    monkeypatch.setattr(backend, "_checkpoint_config", bad)
    with pytest.raises(Exception, match="checkpoint"):
        run(backend.snapshot("ms4", memory=True))
    assert sorted(p.name for p in (state_dir / "snapshots").iterdir()) == before
    assert run(backend.inspect("ms4")).state is State.RUNNING
    assert shell(host, "echo still", fresh_connection=True) == (0, b"still\n", b"")
    assert run(backend.kill("ms4"))
    assert _leftovers(state_dir, ["ms4"]) == []


def test_memory_pauses_and_resumes_in_parallel(backend: CrunBackend, state_dir: Path) -> None:
    """Each checkpoint is its own crun and CRIU on its own files: several at once all keep their processes."""
    _needs_checkpoints()
    ids = ["mp1", "mp2", "mp3"]
    pids = {sandbox_id: _holder(started(backend, sandbox_id), f"holder-{sandbox_id}") for sandbox_id in ids}

    async def all_of(action: str) -> list[object]:
        if action == "pause":
            return await asyncio.gather(*(backend.pause(i, memory=True) for i in ids))
        return await asyncio.gather(*(backend.resume(i) for i in ids))

    run(all_of("pause"))
    for sandbox_id in ids:
        assert backend._record(sandbox_id).memory is not None, "written to disk, not frozen"
    infos = run(all_of("resume"))
    for sandbox_id, info in zip(ids, infos, strict=True):
        host = getattr(info, "host", None) or ""
        assert shell(host, f"kill -0 {pids[sandbox_id]} && cat /tmp/ram.txt", fresh_connection=True) == (
            0,
            b"in-ram\n",
            b"",
        )
        assert httpx.get(f"http://{host}:{ENVD_PORT}/health", timeout=5).status_code == 204
    for sandbox_id in ids:
        assert run(backend.kill(sandbox_id))
    assert _leftovers(state_dir, ids) == []


def test_two_servers_fork_at_once(backend: CrunBackend, state_dir: Path) -> None:
    """Two backends on their own folders (two servers on one host): snapshots and their new sandboxes at once.

    Addresses and id ranges come from the host's registries, so all six sandboxes differ in both;
    each new sandbox continues its own source's process under its own identity.
    """
    _needs_checkpoints()
    other_dir = Path(tempfile.mkdtemp(prefix="e2b-compat-crun-", dir="/var/tmp"))
    other_dir.chmod(0o755)
    other = crun_backend(other_dir)
    servers = {"tf1": backend, "tf2": other}
    try:
        sources = {i: started(b, i) for i, b in servers.items()}
        pids = {i: _holder(host, f"holder-{i}") for i, host in sources.items()}

        async def snapshots() -> list[str]:
            return await asyncio.gather(*(b.snapshot(i, memory=True) for i, b in servers.items()))

        taken = dict(zip(servers, run(snapshots()), strict=True))
        forks = {f"{i}-{n}": (servers[i], taken[i], i) for i in servers for n in ("a", "b")}

        async def made() -> list[str]:
            async def one(sandbox_id: str, server: CrunBackend, snapshot: str) -> str:
                await server.create(SandboxSpec(sandbox_id, snapshot, limits=Limits(cpu_count=1, memory_mb=256)))
                return (await server.start(sandbox_id)).host or ""

            return await asyncio.gather(*(one(f, b, snap) for f, (b, snap, _) in forks.items()))

        hosts = dict(zip(forks, run(made()), strict=True))
        assert len({*hosts.values(), *sources.values()}) == 6, "each its own address"
        bases = {servers[i]._record(i).ids for i in servers}
        for fork, (server, _, source) in forks.items():
            code, out, err = shell(hosts[fork], f"kill -0 {pids[source]} && {_IDENTITY}", fresh_connection=True)
            assert code == 0, err
            lines = out.decode().split("\n")
            assert lines[:2] == [fork, fork]
            assert _uid_map_base(lines[3]) == server._record(fork).ids
            bases.add(server._record(fork).ids)
        assert len(bases) == 6, "each its own id range"
        for sandbox_id in sources:
            assert shell(sources[sandbox_id], f"kill -0 {pids[sandbox_id]}", fresh_connection=True)[0] == 0
    finally:
        for folder, server in ((state_dir, backend), (other_dir, other)):
            for info in run(server.list()):
                run(server.kill(info.sandbox_id))
            for snapshot in (folder / "snapshots").glob("snap-*"):
                run(server.delete_snapshot(snapshot.name))
        left = _leftovers(state_dir, ["tf1", "tf1-a", "tf1-b"]) + _leftovers(other_dir, ["tf2", "tf2-a", "tf2-b"])
        if not left:
            shutil.rmtree(other_dir)
    assert left == []


def test_a_forks_snapshot_left_by_a_crash_is_released_at_reconcile(state_dir: Path) -> None:
    """A server that stopped between a fork's snapshot and its release: the next reconcile releases it."""
    _needs_checkpoints()
    first = crun_backend(state_dir)
    started(first, "ms5")
    snapshot = run(first.snapshot("ms5", memory=True, transient=True))
    run(first.create(SandboxSpec("ms6", snapshot, limits=Limits(cpu_count=1, memory_mb=256, pids=128))))
    run(first.start("ms6"))
    folder = state_dir / "snapshots" / snapshot
    assert (folder / "memory").is_dir()
    # The server stops here (its release never ran); the next one reconciles.
    second = crun_backend(state_dir)
    run(second.reconcile())
    assert folder.is_dir(), "ms6 stands on its files"
    assert not (folder / "memory").exists(), "its memory is released"
    assert run(second.kill("ms6"))
    assert not folder.exists()
    assert run(second.kill("ms5"))
    assert _leftovers(state_dir, ["ms5", "ms6"]) == []


# A process holding an flock; real newlines in its program (python3 -c takes them as lines).
_LOCKER_PY = (
    "import fcntl, time\nf = open('/tmp/held.lock', 'w')\nfcntl.flock(f, fcntl.LOCK_EX)\nwhile True: time.sleep(1)"
)
_LOCKER = f'nohup python3 -c "{_LOCKER_PY}" >/dev/null 2>&1 & echo $!'


def test_a_process_holding_a_file_lock_is_written_to_disk_with_it(backend: CrunBackend, state_dir: Path) -> None:
    """Jupyter's kernels hold file locks: a memory pause and a memory snapshot keep them, never fall back."""
    _needs_checkpoints()
    host = started(backend, "ms7")
    code, out, _ = shell(host, _LOCKER)
    assert code == 0
    pid = out.decode().split()[0]
    held = f"kill -0 {pid} && ! flock -n /tmp/held.lock true && echo held"
    taken = f"for i in $(seq 100); do {held} && exit 0; sleep 0.05; done; exit 1"  # once Python has started
    assert shell(host, taken) == (0, b"held\n", b"")
    run(backend.pause("ms7", memory=True))
    assert backend._record("ms7").memory is not None, "written to disk, not frozen instead"
    host = run(backend.resume("ms7")).host or ""
    assert shell(host, held, fresh_connection=True) == (0, b"held\n", b"")
    snapshot = run(backend.snapshot("ms7", memory=True))
    run(backend.create(SandboxSpec("ms8", snapshot, limits=Limits(cpu_count=1, memory_mb=256, pids=128))))
    assert shell(run(backend.start("ms8")).host or "", held, fresh_connection=True) == (0, b"held\n", b"")
    for sandbox_id in ("ms8", "ms7"):
        assert run(backend.kill(sandbox_id))
    run(backend.delete_snapshot(snapshot))
    assert _leftovers(state_dir, ["ms7", "ms8"]) == []
