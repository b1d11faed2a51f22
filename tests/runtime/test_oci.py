"""The OCI configuration of a sandbox: the kernel surface it leaves open and the limits it sets."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

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


def test_the_hook_sets_the_user_namespace_inotify_limits() -> None:
    (hook,) = _oci.config(plan())["hooks"]["createRuntime"]
    assert hook["path"] == sys.executable
    assert hook["args"][-2:] == [str(_oci.INOTIFY_INSTANCES), str(_oci.INOTIFY_WATCHES)]
    # Run against a process that is not there: the hook fails (the runtime then refuses to create).
    proc = subprocess.run(
        [hook["path"], *hook["args"][1:]],
        input=json.dumps({"pid": 2**22 + 1}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
