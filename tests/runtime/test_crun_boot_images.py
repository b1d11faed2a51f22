"""Boot images on crun: a template's agent booted once, checkpointed, and restored for each first start.

Real sandboxes, as root, with the checkpoint tools (CI builds them; elsewhere ``e2b-compat host
prepare`` does). Each test kills what it made and checks that nothing is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contract.protocol import ENVD_PORT
from runtime._oci import INOTIFY_INSTANCES, INOTIFY_WATCHES
from runtime._oci_backend import Record
from runtime.backend import SandboxSpec
from runtime.crun import CrunBackend

from .test_crun import (
    SMALL,
    _leftovers,
    _needs_checkpoints,
    checkpoint_spawns,
    crun_backend,
    run,
    shell,
    state_dir,
)
from .test_crun_command import _running

__all__ = ["state_dir"]  # the fixture, shared with test_crun

pytestmark = [
    pytest.mark.artifacts,
    pytest.mark.skipif(os.geteuid() != 0, reason="crun sandboxes need root (namespaces, mounts, cgroups)"),
]

_IDENTITY = "hostname; cat /run/e2b/.E2B_SANDBOX_ID; echo; head -c 22 /proc/self/uid_map"
# The sandbox's own processes, without the shell and ps this command adds.
_PROCESSES = "ps -e -o user=,args= | grep -v -e ' ps -e' -e 'bash -c'"
# A restore makes the user namespace anew: the bounds the createRuntime hook gives a booted sandbox.
_INOTIFY_BOUNDS = "cat /proc/sys/user/max_inotify_instances /proc/sys/user/max_inotify_watches"
_BOUNDED = f"{INOTIFY_INSTANCES}\n{INOTIFY_WATCHES}\n".encode()
# Its network as a process sees it: loopback up with both addresses, reaching the agent; the interfaces.
_NETWORK = (
    "cat /sys/class/net/lo/flags; grep -c ' lo$' /proc/net/if_inet6; ls /sys/class/net | wc -l; "
    "exec 3<>/dev/tcp/127.0.0.1/49983 && echo lo-reaches-the-agent"
)


@pytest.fixture
def booting(state_dir: Path) -> Iterator[CrunBackend]:
    """A backend with boot images, starting with none made."""
    _needs_checkpoints()
    shutil.rmtree(state_dir / "boot-images", ignore_errors=True)
    backend = crun_backend(state_dir, boot_images=True)
    yield backend
    for info in run(backend.list()):
        run(backend.kill(info.sandbox_id))


def _count_boots(backend: CrunBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sandboxes that boot their agent from now on (the others restore a boot image)."""
    boots: list[str] = []
    boot = backend._boot

    async def counting(record: Record) -> None:
        boots.append(record.sandbox_id)
        await boot(record)

    monkeypatch.setattr(backend, "_boot", counting)
    return boots


def _start(backend: CrunBackend, sandbox_id: str) -> str:
    """Create and start a sandbox, then wait for any boot image its start set off."""

    async def go() -> str:
        await backend.create(SandboxSpec(sandbox_id, "base", limits=SMALL))
        info = await backend.start(sandbox_id)
        await backend._boot_images_made()
        assert info.host is not None
        return info.host

    return run(go())


def _init(host: str, env: dict[str, str]) -> None:
    assert httpx.post(f"http://{host}:{ENVD_PORT}/init", json={"envVars": env}).status_code == 204


def test_a_template_boots_once_and_its_next_sandboxes_restore_its_boot_image(
    booting: CrunBackend, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boots = _count_boots(booting, monkeypatch)
    cold = _start(booting, "bi1")
    assert booting._boot_images is not None
    assert len(booting._boot_images.names()) == 1, "made after the first cold start"
    assert boots[0] == "bi1"
    maker = boots[1]
    assert maker.startswith("boot-"), boots
    assert run(booting.list())[0].sandbox_id == "bi1", "a boot image's sandbox is nobody's"
    assert _leftovers(state_dir, [maker]) == [], "its sandbox is gone once the images are kept"
    hosts = {sandbox_id: _start(booting, sandbox_id) for sandbox_id in ("bi2", "bi3")}
    assert boots == ["bi1", maker], "restored, not booted"
    assert len({cold, *hosts.values()}) == 3, "each its own address"
    code, cold_processes, _ = shell(cold, _PROCESSES)
    assert code == 0
    cold_network = shell(cold, _NETWORK)
    assert cold_network == (0, b"0x9\n1\n2\nlo-reaches-the-agent\n", b"")
    for sandbox_id, host in hosts.items():
        # What a cold start gives, as the sandbox sees it: its identity and its processes.
        code, out, err = shell(host, _IDENTITY, fresh_connection=True)
        assert code == 0, err
        hostname, published, uid_map = out.decode().split("\n")
        assert [hostname, published] == [sandbox_id, sandbox_id]
        assert int(uid_map.split()[1]) == booting._record(sandbox_id).ids, "its own id range"
        assert shell(host, _PROCESSES)[1] == cold_processes
        assert shell(host, _INOTIFY_BOUNDS) == (0, _BOUNDED, b""), "bounded as a booted sandbox"
        # CRIU made its network namespace empty, as a new one (``_boot_restore_config``): the plug set it up.
        assert shell(host, _NETWORK) == cold_network
        # /init gives a restored agent its ids (from /run/e2b) and its environment, as a booted one.
        _init(host, {"TENANT": sandbox_id})
        assert shell(host, "echo $E2B_SANDBOX_ID $TENANT")[1] == f"{sandbox_id} {sandbox_id}\n".encode()
        assert not (booting._home(sandbox_id) / "memory").exists(), "its copy of the images goes once restored"
    # The sandboxes share nothing but the template's files.
    assert shell(hosts["bi2"], "echo mine > /home/user/f.txt")[0] == 0
    assert shell(hosts["bi3"], "test -e /home/user/f.txt")[0] == 1
    for sandbox_id in ("bi1", "bi2", "bi3"):
        assert run(booting.kill(sandbox_id))
    assert _leftovers(state_dir, ["bi1", "bi2", "bi3"]) == []
    assert len(booting._boot_images.names()) == 1, "kept for the next creates"


def test_a_boot_image_that_fails_to_restore_is_dropped_and_the_sandbox_boots(
    booting: CrunBackend, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _start(booting, "bf1")
    assert booting._boot_images is not None
    (key,) = booting._boot_images.names()
    (booting._boot_images.root / key / "memory" / "inventory.img").unlink()  # CRIU cannot restore without it
    boots = _count_boots(booting, monkeypatch)
    host = _start(booting, "bf2")
    assert boots == ["bf2"], "booted after the failed restore, and no image made again"
    assert shell(host, "echo up", fresh_connection=True) == (0, b"up\n", b"")
    assert booting._boot_images.names() == []
    host = _start(booting, "bf3")
    assert boots == ["bf2", "bf3"]
    assert booting._boot_images.names() == [], "this backend never makes that image again"
    for sandbox_id in ("bf1", "bf2", "bf3"):
        assert run(booting.kill(sandbox_id))
    assert _leftovers(state_dir, ["bf1", "bf2", "bf3"]) == []


def test_an_image_gone_while_a_start_links_it_boots_that_start_and_is_not_refused(
    booting: CrunBackend, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _start(booting, "bg1")
    images = booting._boot_images
    assert images is not None
    (key,) = images.names()
    # Sandboxes that began booting before the image existed finish after it: no second image.
    booting._want_boot_image("base", key)
    assert booting._boot_making == {}, "a key with images is not made again"
    boots = _count_boots(booting, monkeypatch)
    continue_images = booting._continue_images

    async def dropped_first(record: Record, source: Path, what: str, *, boot_image: bool = False) -> None:
        images.drop(key)  # as another start's failed restore would, while this one links
        await continue_images(record, source, what, boot_image=boot_image)

    monkeypatch.setattr(booting, "_continue_images", dropped_first)
    host = _start(booting, "bg2")
    assert boots[0] == "bg2", "booted"
    assert shell(host, "echo up", fresh_connection=True) == (0, b"up\n", b"")
    assert key not in booting._boot_refused, "nothing was wrong with the image"
    assert images.names() == [], "its next cold start makes it again"
    monkeypatch.setattr(booting, "_continue_images", continue_images)
    _start(booting, "bg3")
    assert images.names() == [key]
    for sandbox_id in ("bg1", "bg2", "bg3"):
        assert run(booting.kill(sandbox_id))
    assert _leftovers(state_dir, ["bg1", "bg2", "bg3"]) == []


def test_a_make_cancelled_mid_checkpoint_lets_the_checkpoint_end_and_leaves_nothing(
    booting: CrunBackend, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopping while an image is made. The kill used to meet CRIU mid-dump: both could hang for good."""
    boots = _count_boots(booting, monkeypatch)
    checkpoints = checkpoint_spawns(monkeypatch)
    running_at_delete: list[list[int]] = []
    delete = booting._runtime.delete

    def noted_delete(container: str) -> None:
        running_at_delete.append([pid for pid in checkpoints if _running(pid)])
        delete(container)

    monkeypatch.setattr(booting._runtime, "delete", noted_delete)

    async def go() -> None:
        await booting.create(SandboxSpec("bx1", "base", limits=SMALL))
        await booting.start("bx1")
        (making,) = booting._boot_making.values()
        while not checkpoints:
            assert not making.done()
            await asyncio.sleep(0)
        making.cancel()  # just after `crun checkpoint` started: CRIU is about to seize the sandbox
        with pytest.raises(asyncio.CancelledError):
            await making

    run(go())
    hung = _runtime_commands(state_dir)
    for pid in hung:  # the test's own (through its backend): ended so that the run goes on
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert running_at_delete == [[]], "the boot sandbox was killed while its checkpoint ran"
    assert hung == [], "a runtime command left running"
    maker = boots[1]
    assert _leftovers(state_dir, [maker]) == []
    assert booting._boot_images is not None
    assert list(booting._boot_images.root.iterdir()) == [], "no images, and no build folder"
    monkeypatch.undo()
    boots = _count_boots(booting, monkeypatch)
    _start(booting, "bx2")
    assert boots[0] == "bx2"
    assert boots[1].startswith("boot-"), "the key is not refused: the next cold start makes the image"
    assert len(booting._boot_images.names()) == 1
    for sandbox_id in ("bx1", "bx2"):
        assert run(booting.kill(sandbox_id))
    assert _leftovers(state_dir, ["bx1", "bx2"]) == []


def _runtime_commands(state_dir: Path) -> list[int]:
    """The runtime commands on ``state_dir``'s containers still running, with their children (CRIU)."""
    parents: dict[int, int] = {}
    found = set()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if f"--root {state_dir}/crun ".encode() in _cmdline(int(proc.name)):
                found.add(int(proc.name))
    found |= {pid for pid, parent in parents.items() if parent in found}
    return sorted(found)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def test_reconcile_releases_what_a_crash_left_of_a_boot_image(booting: CrunBackend, state_dir: Path) -> None:
    # A crash while an image was being made: its sandbox runs on record, a build folder is half written.
    run(booting.create(SandboxSpec("boot-crashed", "base", limits=SMALL)))
    run(booting.start("boot-crashed"))
    assert booting._boot_images is not None
    (booting._boot_images.root / ".0123.build" / "memory").mkdir(parents=True)
    assert run(booting.list()) == []
    second = crun_backend(state_dir, boot_images=True)
    second._boot_sandboxes.add("boot-crashed")  # as if this backend were making an image with it now
    first = run(second.reconcile())
    assert "boot-crashed" not in first.cleaned
    assert (state_dir / "sandboxes" / "boot-crashed").is_dir(), "an image being made is left alone"
    assert ".0123.build" in first.cleaned
    second._boot_sandboxes.clear()
    assert "boot-crashed" in run(second.reconcile()).cleaned
    assert _leftovers(state_dir, ["boot-crashed"]) == []
    assert list(booting._boot_images.root.iterdir()) == []


def test_a_pause_whose_network_namespace_is_as_new_restores_it_empty_and_one_changed_replays_it(
    booting: CrunBackend, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _start(booting, "np0")  # the boot image: the new namespace the checkpoints are compared with
    hosts = {sandbox_id: _start(booting, sandbox_id) for sandbox_id in ("np1", "np2")}
    # np2's loopback gets an address of its own, from the host: a sandbox's root lacks CAP_NET_ADMIN
    # and cannot change its namespace, but were it able to, its change must survive the pause.
    netns = booting._record("np2").network or {}
    subprocess.run(["ip", "-n", netns["netns"], "addr", "add", "10.9.9.9/32", "dev", "lo"], check=True)
    configs: dict[str, Path] = {}
    restore = booting._runtime.restore

    async def recording(bundle: Path, container: str, log: Path, images: Path, *, config: Path) -> int:
        configs[bundle.parent.name] = config
        return await restore(bundle, container, log, images, config=config)

    monkeypatch.setattr(booting._runtime, "restore", recording)
    for sandbox_id, host in hosts.items():
        assert shell(host, "echo in-ram > /tmp/ram.txt")[0] == 0
        run(booting.pause(sandbox_id, memory=True))
        images = Path(booting._record(sandbox_id).memory or "")
        assert (images / ".netns-as-new").exists() == (sandbox_id == "np1")
        hosts[sandbox_id] = run(booting.resume(sandbox_id)).host or ""
        assert shell(hosts[sandbox_id], "cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")
        assert shell(hosts[sandbox_id], _INOTIFY_BOUNDS, fresh_connection=True) == (0, _BOUNDED, b"")
    assert configs["np1"] == booting._as_new_config, "made empty, as a new one"
    assert configs["np2"] == booting._replay_config, "replayed"
    assert shell(hosts["np1"], _NETWORK, fresh_connection=True) == (0, b"0x9\n1\n2\nlo-reaches-the-agent\n", b"")
    code, out, _ = shell(hosts["np2"], "ip -4 -o addr show dev lo", fresh_connection=True)
    assert code == 0
    assert b"10.9.9.9/32" in out, "the tenant's address came back"
    # A memory snapshot is compared the same way, and a sandbox made from it restores accordingly.
    snapshot = run(booting.snapshot("np1", memory=True))
    assert (state_dir / "snapshots" / snapshot / "memory" / ".netns-as-new").exists()
    run(booting.create(SandboxSpec("np3", snapshot, limits=SMALL)))
    forked = run(booting.start("np3")).host or ""
    assert configs["np3"] == booting._as_new_config
    assert shell(forked, "cat /tmp/ram.txt", fresh_connection=True) == (0, b"in-ram\n", b"")
    assert shell(forked, _INOTIFY_BOUNDS, fresh_connection=True) == (0, _BOUNDED, b"")
    run(booting.release_snapshot(snapshot))
    for sandbox_id in ("np0", "np1", "np2", "np3"):
        assert run(booting.kill(sandbox_id))
    assert _leftovers(state_dir, ["np0", "np1", "np2", "np3"]) == []
