"""OCI runtime configuration for one sandbox (pure: data in, ``config.json`` dict out).

Choices, and why:

- PID 1 is ``tini``: the agent must not be PID 1, because PID 1 ignores signals it has no
  handler for and must reap orphans; tini does both and forwards signals.
- Namespaces: pid, mount, uts, ipc, cgroup, user (root inside is an unprivileged uid on the
  host; see ``_idmap``), and the network namespace the runtime prepared (joined by path, so
  the veth set-up happens before the container exists).
- Capabilities: the set container engines give by default, which the agent needs to run
  commands as other users (setuid/setgid), chown and create files for them; no
  ``no_new_privileges``, so ``sudo`` works for the sandbox user as in E2B templates.
- seccomp: allow by default and refuse (EPERM) the calls that reach past the sandbox —
  kernel modules, kexec, reboot, swap, clock setting, keyrings, bpf, perf, mount table and
  namespace changes, raw I/O ports — so a root process inside cannot touch the host kernel.
- Limits: memory (hard, no swap), pids, CPU quota; set through the cgroup the runtime names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backend import Limits

CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

DENIED_SYSCALLS = [
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "sysfs",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
    "vm86",
    "vm86old",
]

_CPU_PERIOD = 100_000
# null, zero, full, random, urandom, tty, ptmx, and every pts: what a shell session needs.
_ALLOWED_DEVICES: list[dict[str, Any]] = [
    {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}
    for major, minor in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2))
] + [{"allow": True, "type": "c", "major": 136, "access": "rwm"}]


@dataclass(frozen=True)
class ContainerPlan:
    rootfs: str  # the overlay mount point
    netns_path: str
    hostname: str
    hosts_file: str  # bind-mounted over /etc/hosts
    resolv_file: str  # bind-mounted over /etc/resolv.conf
    cgroup_path: str  # relative, e.g. "e2b-compat/<id>"
    command: tuple[str, ...]  # the agent command (tini is put in front)
    env: dict[str, str]
    limits: Limits
    id_mapping: list[dict[str, int]] | None = None  # user namespace: container 0 → an unprivileged host uid


def _mount(destination: str, kind: str, source: str, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": kind, "source": source, "options": options}


def config(plan: ContainerPlan) -> dict[str, Any]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", **plan.env}
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/usr/bin/tini", "--", *plan.command],
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "capabilities": dict.fromkeys(("bounding", "effective", "permitted"), CAPABILITIES),
            "noNewPrivileges": False,
        },
        "root": {"path": plan.rootfs, "readonly": False},
        "hostname": plan.hostname,
        "mounts": [
            _mount("/proc", "proc", "proc", ["nosuid", "noexec", "nodev"]),
            _mount("/dev", "tmpfs", "tmpfs", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
            _mount(
                "/dev/pts",
                "devpts",
                "devpts",
                ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
            ),
            _mount("/dev/shm", "tmpfs", "shm", ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),  # noqa: S108
            _mount("/dev/mqueue", "mqueue", "mqueue", ["nosuid", "noexec", "nodev"]),
            _mount("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"]),
            _mount("/sys/fs/cgroup", "cgroup", "cgroup", ["nosuid", "noexec", "nodev", "relatime", "ro"]),
            _mount("/etc/hosts", "bind", plan.hosts_file, ["rbind", "ro"]),
            _mount("/etc/resolv.conf", "bind", plan.resolv_file, ["rbind", "ro"]),
            _mount("/tmp", "tmpfs", "tmpfs", ["nosuid", "nodev", "mode=1777"]),  # noqa: S108 - the sandbox's own /tmp
        ],
        "linux": {
            "cgroupsPath": plan.cgroup_path,
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "cgroup"},
                {"type": "network", "path": plan.netns_path},
                *([{"type": "user"}] if plan.id_mapping else []),
            ],
            **({"uidMappings": plan.id_mapping, "gidMappings": plan.id_mapping} if plan.id_mapping else {}),
            "resources": {
                "memory": {"limit": plan.limits.memory_mb << 20, "swap": plan.limits.memory_mb << 20},
                "pids": {"limit": plan.limits.pids},
                "cpu": {"quota": plan.limits.cpu_count * _CPU_PERIOD, "period": _CPU_PERIOD},
                "devices": [{"allow": False, "access": "rwm"}, *_ALLOWED_DEVICES],
            },
            "seccomp": {
                "defaultAction": "SCMP_ACT_ALLOW",
                "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_AARCH64"],
                "syscalls": [{"names": DENIED_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
            },
            "maskedPaths": [
                "/proc/kcore",
                "/proc/keys",
                "/proc/latency_stats",
                "/proc/timer_list",
                "/proc/sched_debug",
                "/sys/firmware",
                "/proc/scsi",
            ],
            "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def hosts_file(hostname: str) -> str:
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"


def resolv_file(nameservers: list[str]) -> str:
    # With egress off there is nothing to resolve against; an empty list keeps lookups failing fast.
    return "".join(f"nameserver {ns}\n" for ns in nameservers) or "# no name resolution: egress is disabled\n"
