"""The OCI configuration of a sandbox: the kernel surface it leaves open and the limits it sets."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import _oci
from runtime.backend import Limits


def plan(**changes: Any) -> _oci.ContainerPlan:
    fields: dict[str, Any] = {
        "rootfs": "/b/rootfs",
        "netns_path": "/run/netns/x",
        "hostname": "sb",
        "hosts_file": "/b/hosts",
        "resolv_file": "/b/resolv.conf",
        "cgroup_path": "e2b-compat/sb",
        "command": ("/bin/agent",),
        "env": {},
        "limits": Limits(cpu_count=1, memory_mb=256, pids=64),
        "id_mapping": [{"containerID": 0, "hostID": 1 << 20, "size": 65536}],
        "sysfs": "/b/sys",
        "open_files": 4096,
    }
    return _oci.ContainerPlan(**{**fields, **changes})


def test_namespace_making_clone_clone3_and_io_uring_are_refused() -> None:
    rules = _oci.config(plan())["linux"]["seccomp"]["syscalls"]
    plain = {name: rule["errnoRet"] for rule in rules if "args" not in rule for name in rule["names"]}
    assert {name: plain[name] for name in ("unshare", "setns", "mount", "bpf")} == dict.fromkeys(
        ("unshare", "setns", "mount", "bpf"), 1
    ), "the earlier refusals stay"
    assert {plain[name] for name in ("io_uring_setup", "io_uring_enter", "io_uring_register")} == {1}
    assert plain["clone3"] == 38, "ENOSYS, so that libc falls back to clone"
    clone = [rule for rule in rules if rule["names"] == ["clone"]]
    refused = set()
    for rule in clone:
        (arg,) = rule["args"]
        assert (arg["index"], arg["op"], arg["value"], rule["errnoRet"]) == (
            0,
            "SCMP_CMP_MASKED_EQ",
            arg["valueTwo"],
            1,
        )
        refused.add(arg["value"])
    new_user, new_net, new_ns = 0x10000000, 0x40000000, 0x00020000
    assert {new_user, new_net, new_ns} <= refused
    sigchld, clone_vm, clone_thread = 17, 0x100, 0x10000
    assert not any((sigchld | clone_vm | clone_thread) & flag for flag in refused), "fork and threads pass"


def test_open_files_sysfs_and_masks() -> None:
    config = _oci.config(plan())
    assert config["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "soft": 4096, "hard": 4096}]
    sys_mount = next(m for m in config["mounts"] if m["destination"] == "/sys")
    assert (sys_mount["type"], sys_mount["source"]) == ("bind", "/b/sys")
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(sys_mount["options"])
    assert "/sys/devices/virtual/powercap" in config["linux"]["maskedPaths"]
    assert "sysctl" not in config["linux"], "crun refuses user.* sysctls as not namespaced"


def test_masked_directories_can_be_bound_to_an_empty_folder_instead() -> None:
    masked = _oci.config(plan())
    assert masked["linux"]["maskedPaths"] == list(_oci.MASKED_PATHS), "by default the runtime masks them all"
    assert not [m for m in masked["mounts"] if m["destination"] == "/sys/firmware"]
    bound = _oci.config(plan(masked_dirs=("/sys/firmware", "/proc/scsi"), empty_dir="/s/empty"))
    binds = [m for m in bound["mounts"] if m["source"] == "/s/empty"]
    assert [m["destination"] for m in binds] == ["/sys/firmware", "/proc/scsi"]
    assert all(m["type"] == "bind" and {"ro", "nosuid", "nodev", "noexec"} <= set(m["options"]) for m in binds)
    destinations = [m["destination"] for m in bound["mounts"]]
    assert destinations.index("/sys/firmware") > destinations.index("/sys"), "over the sysfs, not under it"
    assert destinations.index("/proc/scsi") > destinations.index("/proc")
    assert "/sys/firmware" not in bound["linux"]["maskedPaths"], "masked once, by the bind"
    assert "/proc/kcore" in bound["linux"]["maskedPaths"], "files stay the runtime's"
    assert "/sys/devices/virtual/powercap" in bound["linux"]["maskedPaths"], "a directory not bound stays masked"
    no_folder = _oci.config(plan(masked_dirs=("/sys/firmware",)))
    assert no_folder["linux"]["maskedPaths"] == list(_oci.MASKED_PATHS), "no folder given: nothing unmasked"


def test_a_namespace_the_runtime_makes_and_the_device_binds_a_checkpoint_needs() -> None:
    joined = _oci.config(plan())
    assert {"type": "network", "path": "/run/netns/x"} in joined["linux"]["namespaces"]
    assert not [m for m in joined["mounts"] if m["destination"] == "/dev/null"], "the runtime's own binds"
    made = _oci.config(plan(netns_path=None, sysfs=None, device_binds=True))
    namespaces = made["linux"]["namespaces"]
    assert {"type": "network"} in namespaces, "no path: the runtime makes it"
    assert {"type": "user"} in namespaces, "inside the sandbox's user namespace"
    binds = {
        m["destination"]: m for m in made["mounts"] if m["type"] == "bind" and m["destination"].startswith("/dev/")
    }
    assert sorted(binds) == sorted(f"/dev/{node}" for node in _oci.DEVICE_NODES)
    assert all(m["source"] == m["destination"] and "nosuid" in m["options"] for m in binds.values())
    (sysfs,) = [m for m in made["mounts"] if m["destination"] == "/sys"]
    assert sysfs["type"] == "sysfs", "its own sysfs: the namespace is the sandbox's"
    # Device binds come after /dev's tmpfs, or the tmpfs would hide them.
    order = [m["destination"] for m in made["mounts"]]
    assert order.index("/dev") < min(order.index(d) for d in binds)


def _run_hook(state: str) -> subprocess.CompletedProcess[str]:
    (hook,) = _oci.config(plan())["hooks"]["createRuntime"]
    return subprocess.run([hook["path"], *hook["args"][1:]], input=state, capture_output=True, text=True, check=False)


def _userns_limits(pid: int) -> list[str]:
    names = ("/proc/sys/user/max_inotify_instances", "/proc/sys/user/max_inotify_watches")
    argv = ["nsenter", "--user", "--preserve-credentials", "--target", str(pid), "cat", *names]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


def test_the_hook_is_a_shell_with_the_limits_as_arguments() -> None:
    (hook,) = _oci.config(plan())["hooks"]["createRuntime"]
    assert hook["path"] == "/bin/sh"
    assert hook["args"][-2:] == [str(_oci.INOTIFY_INSTANCES), str(_oci.INOTIFY_WATCHES)]
    assert "hooks" not in _oci.config(plan(userns_limits_hook=False))


def _run_restore_script(action: str, init_pid: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CRTOOLS_SCRIPT_ACTION": action, "CRTOOLS_INIT_PID": init_pid}
    script = _oci.restore_limits_script()
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=False)


@pytest.fixture
def unbounded_init() -> Iterator[int]:
    """A process in a user namespace of its own, mapped as the runtime maps a sandbox's, with no limits set."""
    init = subprocess.Popen(["unshare", "--user", "sleep", "60"])
    try:
        for _ in range(100):  # until unshare has made the namespace
            if os.readlink(f"/proc/{init.pid}/ns/user") != os.readlink("/proc/self/ns/user"):
                break
            time.sleep(0.01)
        # As the runtime maps it: the namespace's root is an unprivileged host uid, host root is not mapped.
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{init.pid}/{name}").write_text("0 1000000 65536\n")
        assert _userns_limits(init.pid) != [str(_oci.INOTIFY_INSTANCES), str(_oci.INOTIFY_WATCHES)]
        yield init.pid
    finally:
        init.kill()
        init.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="joins another process's user namespace: root only")
@pytest.mark.parametrize(
    "layout",
    [
        '{{"ociVersion":"1.0.0","id":"e2b-x","pid":{pid},"status":"created"}}',
        '{{"id": "e2b-x", "pid" :\t {pid}, "status": "created"}}',
    ],
    ids=["compact", "spaced"],
)
def test_the_hook_sets_the_user_namespace_inotify_limits(layout: str, unbounded_init: int) -> None:
    """The hook finds the init's pid in the runtime's state (compact or spaced) and bounds its user namespace."""
    done = _run_hook(layout.format(pid=unbounded_init))
    assert (done.returncode, done.stderr) == (0, "")
    assert _userns_limits(unbounded_init) == [str(_oci.INOTIFY_INSTANCES), str(_oci.INOTIFY_WATCHES)]


@pytest.mark.skipif(os.geteuid() != 0, reason="joins another process's user namespace: root only")
def test_the_restore_script_sets_the_limits_before_the_restored_tree_resumes_and_only_then(
    unbounded_init: int,
) -> None:
    before = _userns_limits(unbounded_init)
    for action in ("pre-dump", "post-dump", "pre-restore", "setup-namespaces", "post-restore", "post-resume"):
        assert _run_restore_script(action, str(unbounded_init)).returncode == 0, action
    assert _userns_limits(unbounded_init) == before, "no stage but pre-resume touches the namespace"
    done = _run_restore_script("pre-resume", str(unbounded_init))
    assert (done.returncode, done.stderr) == (0, "")
    assert _userns_limits(unbounded_init) == [str(_oci.INOTIFY_INSTANCES), str(_oci.INOTIFY_WATCHES)]


@pytest.mark.skipif(os.geteuid() != 0, reason="joins another process's user namespace: root only")
def test_the_backend_bounds_a_restored_namespace_as_the_hook_does(unbounded_init: int) -> None:
    subprocess.run(_oci.userns_limits_argv(unbounded_init), check=True)
    assert _userns_limits(unbounded_init) == [str(_oci.INOTIFY_INSTANCES), str(_oci.INOTIFY_WATCHES)]


@pytest.mark.parametrize("init_pid", ["", "0", "12x", "4194305"])
def test_the_restore_script_fails_without_a_live_init_so_criu_fails_the_restore(init_pid: str) -> None:
    assert _run_restore_script("pre-resume", init_pid).returncode != 0


@pytest.mark.parametrize("state", ['{"id": "e2b-x"}', '{"pid": 0}', '{"pid": "12"}', '{"pid": 4194305}', ""])
def test_the_hook_fails_without_a_live_pid_so_the_runtime_refuses_to_create(state: str) -> None:
    assert _run_hook(state).returncode != 0
