"""Hostile tenants: a disk filler, a fork bomb, a memory hog and an inotify hog, each in a sandbox of its own.

A sentinel sandbox (another tenant) and the host are checked before each act, while it holds
what it took where the act allows (``sentinel_is_fine``: forks, a file round trip and a folder
watch; ``host_is_fine``: fork, allocate, an inotify instance, a file), and after. Every act is
bounded in count and time, so that without the limit it tests it stops by itself (and fails).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conformance._endpoint import ManagedServer

from ._harness import Api, Envd, Ran, free_bytes, host_is_fine, requests_made, sentinel_is_fine
from .conftest import SETTINGS, report

pytestmark = [pytest.mark.artifacts]

DISK_LIMIT_MB = int(SETTINGS["disk_mb"])  # each sandbox's disk on the reliability servers
SLACK_MB = 512  # other writers of the host filesystem meanwhile, ext4's own blocks
HOLD_S = 10  # how long a hog keeps what it took while the others are checked
# The kernel's refusal of a write past the sandbox's disk: ENOSPC on a loop disk (crun, runsc),
# EDQUOT on a btrfs qgroup (docker's pool); the agent answers an upload 507 for either.
KERNEL_REFUSALS = ("No space left on device", "Disk quota exceeded")


class Tenants:
    def __init__(self, server: ManagedServer) -> None:
        self.server = server
        self.api = Api(server)
        self.sentinel = self.api.envd(self.api.created(timeout=900))

    def hog(self) -> Envd:
        return self.api.envd(self.api.created(timeout=300))

    def bystanders_are_fine(self) -> float:
        host_is_fine(self.server.data_dir)
        assert self.api.request("GET", "/health").status_code == 200, "the server's /health failed"
        return sentinel_is_fine(self.sentinel)


@pytest.fixture(scope="module")
def tenants(shared_server: ManagedServer) -> Iterator[Tenants]:
    made = Tenants(shared_server)
    yield made
    made.api.kill(made.sentinel.sandbox_id)
    made.api.close()


def _during(hog: Envd, script: str, status: str, timeout: float) -> tuple[dict[str, Any], str]:
    """Run ``script`` (python) in ``hog`` in the background; return once it wrote ``status`` (its figures)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["ran"] = hog.run(f"python3 - <<'EOF'\n{script}\nEOF", timeout=timeout)
        except httpx.HTTPError as exc:  # the hog's stream broke: _finish says so
            outcome["ran"] = Ran(-1, "", "", f"the stream broke: {exc!r}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and thread.is_alive():
        read = _read_quietly(hog, status)
        if read:
            outcome["thread"] = thread
            return outcome, read
        time.sleep(0.5)
    thread.join(5)
    outcome["thread"] = thread
    return outcome, ""


def _read_quietly(hog: Envd, path: str) -> str:
    try:
        read = hog.read(path)
    except Exception:  # noqa: BLE001 - the hog's agent may be starved for a moment: ask again
        return ""
    return read.text if read.status_code == 200 else ""


def _finish(outcome: dict[str, Any]) -> Ran:
    outcome["thread"].join(120)
    ran = outcome.get("ran")
    assert isinstance(ran, Ran), "the hog's command never ended"
    return ran


def test_disk_filler_gets_enospc_and_spares_the_host(tenants: Tenants) -> None:
    began, requests_before = time.monotonic(), requests_made()
    tenants.bystanders_are_fine()
    hog = tenants.hog()
    try:
        host_free = free_bytes(tenants.server.data_dir)
        cap = DISK_LIMIT_MB + SLACK_MB  # dd stops there even where nothing stops it
        if host_free >> 20 < 2 * cap:
            pytest.skip(f"only {host_free >> 20} MiB free on the host: the filler could fill it without a disk limit")
        ran = hog.run(
            f"dd if=/dev/zero of=/home/user/fill bs=1M count={cap} 2>&1; stat -c %s /home/user/fill", timeout=300
        )
        dropped_mb = (host_free - free_bytes(tenants.server.data_dir)) >> 20
        written_mb = int(ran.stdout.split()[-1]) >> 20
        refusal = next((said for said in KERNEL_REFUSALS if said in ran.stdout), "")
        assert refusal, f"the filler wrote {written_mb} MiB without ENOSPC or EDQUOT: {ran.stdout[-300:]}"
        assert dropped_mb <= DISK_LIMIT_MB + SLACK_MB, f"the host filesystem lost {dropped_mb} MiB to one sandbox"
        upload = hog.write("/home/user/more", b"x" * (1 << 20))
        assert upload.status_code == 507, f"an upload to a full sandbox answered {upload.status_code}: {upload.text}"
        held_s = tenants.bystanders_are_fine()
        again = hog.run("rm /home/user/fill && echo ok > /home/user/after && cat /home/user/after")
        assert again.stdout.strip() == "ok", f"the filler's sandbox did not recover: {again}"
    finally:
        tenants.api.kill(hog.sandbox_id)
    tenants.bystanders_are_fine()
    report(
        "disk-filler",
        tenants.server.backend,
        written_mib=written_mb,
        host_free_dropped_mib=dropped_mb,
        refusal=refusal,
        upload_status=upload.status_code,
        sentinel_check_seconds=round(held_s, 1),
        requests=requests_made() - requests_before,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )


# posix_spawn (vfork): the children copy no memory, so the memory limit cannot stop the bomb first.
FORK_BOMB = f"""
import os, signal, time
deadline, kids, error = time.time() + 30, [], ""
while time.time() < deadline and len(kids) < 20000:
    try:
        kids.append(os.posix_spawn("/bin/sleep", ["sleep", "60"], {{}}))
    except OSError as exc:
        error = exc.strerror
        break
open("/home/user/bomb-status", "w").write(f"{{len(kids)}}|{{error}}")
time.sleep({HOLD_S})
for pid in kids:
    os.kill(pid, signal.SIGKILL)
for pid in kids:
    os.waitpid(pid, 0)
print(f"{{len(kids)}}|{{error}}")
"""


def test_fork_bomb_is_stopped_by_the_pids_limit(tenants: Tenants) -> None:
    began, requests_before = time.monotonic(), requests_made()
    tenants.bystanders_are_fine()
    hog = tenants.hog()
    try:
        outcome, status = _during(hog, FORK_BOMB, "/home/user/bomb-status", 90)
        assert status, "the fork bomb never said how far it got"
        forks, error = status.split("|")
        assert error, f"{forks} forks and no refusal: no pids limit stopped the bomb"
        held_s = tenants.bystanders_are_fine()  # while the bomb holds every pid it got
        ran = _finish(outcome)
        assert ran.exit_code == 0, ran
        after = hog.run("echo alive")
        assert after.stdout.strip() == "alive", f"the bomb's sandbox did not recover: {after}"
    finally:
        tenants.api.kill(hog.sandbox_id)
    tenants.bystanders_are_fine()
    report(
        "fork-bomb",
        tenants.server.backend,
        forks_before_refusal=int(forks),
        refusal=error,
        sentinel_check_seconds=round(held_s, 1),
        requests=requests_made() - requests_before,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )


def test_memory_hog_is_oom_killed_inside(tenants: Tenants) -> None:
    began, requests_before = time.monotonic(), requests_made()
    tenants.bystanders_are_fine()
    hog = tenants.hog()
    try:
        # Four times the sandbox's memory, written (a calloc'd block would stay unbacked).
        script = "chunks = []\nfor _ in range(128):\n    chunks.append(b'x' * (16 << 20))\nprint('survived')"
        ran = hog.run(f"python3 - <<'EOF'\n{script}\nEOF", timeout=120)
        assert "survived" not in ran.stdout, "2 GiB fit in a sandbox of 512 MiB: no memory limit"
        assert ran.exit_code != 0, ran
        held_s = tenants.bystanders_are_fine()
        assert hog.health() == 204, "the hog's agent died with the hog"
        after = hog.run("echo alive")
        assert after.stdout.strip() == "alive", f"the hog's sandbox did not recover: {after}"
    finally:
        tenants.api.kill(hog.sandbox_id)
    tenants.bystanders_are_fine()
    report(
        "memory-hog",
        tenants.server.backend,
        asked_mib=2048,
        limit_mib=512,
        hog_exit_code=ran.exit_code,
        sentinel_check_seconds=round(held_s, 1),
        requests=requests_made() - requests_before,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )


INOTIFY_HOG = f"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds, error = [], ""
while len(fds) < 8192:
    fd = libc.inotify_init1(0)
    if fd < 0:
        error = os.strerror(ctypes.get_errno())
        break
    fds.append(fd)
watches, watch_error = 0, ""
os.makedirs("/home/user/w", exist_ok=True)
for fd in fds[:4]:
    for i in range(5000):
        path = f"/home/user/w/{{i}}"
        if fd == fds[0]:
            open(path, "w").close()
        if libc.inotify_add_watch(fd, path.encode(), 0x100) < 0:
            watch_error = os.strerror(ctypes.get_errno())
            break
        watches += 1
open("/home/user/inotify-status", "w").write(f"{{len(fds)}}|{{error}}|{{watches}}|{{watch_error}}")
time.sleep({HOLD_S})
print(len(fds), error, watches, watch_error)
"""


def test_inotify_hog_leaves_others_their_watches(tenants: Tenants) -> None:
    began, requests_before = time.monotonic(), requests_made()
    tenants.bystanders_are_fine()
    hog = tenants.hog()
    try:
        outcome, status = _during(hog, INOTIFY_HOG, "/home/user/inotify-status", 120)
        assert status, "the inotify hog never said how far it got"
        instances, error, watches, watch_error = status.split("|")
        assert error, f"{instances} inotify instances and no refusal"
        held_s = tenants.bystanders_are_fine()  # the sentinel's watch, the host's inotify_init1
        _finish(outcome)
    finally:
        tenants.api.kill(hog.sandbox_id)
    tenants.bystanders_are_fine()
    report(
        "inotify-hog",
        tenants.server.backend,
        instances_before_refusal=int(instances),
        refusal=error,
        watches=int(watches),
        watch_refusal=watch_error,
        sentinel_check_seconds=round(held_s, 1),
        requests=requests_made() - requests_before,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )
