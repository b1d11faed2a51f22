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
  namespace changes, raw I/O ports, io_uring — so a root process inside cannot touch the host
  kernel. ``clone`` is refused when its flags ask for any new namespace (one masked-equality
  rule per flag; fork and threads pass); ``clone3`` fails with ENOSYS, since its flags sit in a
  struct seccomp cannot read, and libc then falls back to ``clone``. So a sandbox's root makes
  no nested user or network namespace.
- ``/sys``: a sysfs of the sandbox's network namespace, mounted by the backend on the host and
  bound here (``plan.sysfs``), or the runtime's own when it makes the namespace itself
  (``netns_path`` None, inside the user namespace), so ``class/net`` lists the sandbox's interfaces only; the cgroup
  namespace roots ``/sys/fs/cgroup`` at the sandbox's own cgroup; firmware and power counters are masked.
- Limits: memory (hard, no swap), pids, CPU quota, set through the cgroup the runtime names;
  open files per process (``RLIMIT_NOFILE``); inotify instances and watches per sandbox user
  namespace, written by a ``createRuntime`` hook (see ``INOTIFY_INSTANCES``), and after a CRIU
  restore by its action script (``restore_limits_script``).
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

# clone(2) flags that make namespaces. CLONE_NEWTIME is left out: for clone (not clone3 or
# unshare) that bit is part of the exit signal in the low byte.
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# Calls that fail with ENOSYS rather than EPERM: clone3 passes its flags in a struct seccomp
# cannot read, and libc falls back to clone (whose flags it can) only on ENOSYS.
ENOSYS_SYSCALLS = ["clone3"]
# io_uring runs I/O from kernel workers, outside what the rules above and the LSMs see.
IO_URING_SYSCALLS = ["io_uring_enter", "io_uring_register", "io_uring_setup"]
_EPERM, _ENOSYS = 1, 38

# Per-process open files. Every descriptor is kernel memory; the pids limit times this bounds a sandbox.
NOFILE_LIMIT = 65_536
# Per sandbox user namespace: inotify instances and watches are charged up the user-namespace
# tree to the uid that created it (host root, for every sandbox), so without a bound of its own
# one sandbox could use up root's fs.inotify.max_user_instances for the host and all others.
INOTIFY_INSTANCES = 128
INOTIFY_WATCHES = 65_536

# What the hook and the restore script run as root of the sandbox's user namespace: "$1" instances, "$2" watches.
_WRITE_USERNS_LIMITS = (
    'echo "$1" > /proc/sys/user/max_inotify_instances && echo "$2" > /proc/sys/user/max_inotify_watches'
)

# The createRuntime hook: reads the container state (JSON, with the init's pid) on stdin, joins
# that process's user namespace as its root (host root, unmapped there, would lose every
# capability at the exec of the shell that writes) and sets its limits. A shell, not Python: a
# Python start was ~35 ms of every create. The state is the runtime's own (nothing of the
# tenant's has run yet), and its first "pid" key is the init's.
_USERNS_LIMITS_HOOK = r"""
state=$(cat) || exit 1
rest=${state#*\"pid\"}
if [ "$rest" = "$state" ]; then echo "no pid in the container state" >&2; exit 1; fi
rest=${rest#*:}
rest=${rest#"${rest%%[![:space:]]*}"}
pid=${rest%%[!0-9]*}
case $pid in ''|0*) echo "no pid in the container state" >&2; exit 1;; esac
exec nsenter --user --target "$pid" sh -c 'WRITE_LIMITS' sh "$1" "$2"
""".replace("WRITE_LIMITS", _WRITE_USERNS_LIMITS)


def userns_limits_argv(pid: int) -> list[str]:
    """The command, run as host root, that bounds the user namespace of ``pid`` as the hook does."""
    argv = ["nsenter", "--user", "--target", str(pid), "sh", "-c", _WRITE_USERNS_LIMITS, "sh"]
    return [*argv, str(INOTIFY_INSTANCES), str(INOTIFY_WATCHES)]


def restore_limits_script() -> str:
    """CRIU's action script that bounds inotify in a restored sandbox's user namespace.

    A restore makes the user namespace anew, with the kernel's unbounded defaults, and runs no
    createRuntime hook; so every checkpoint restored (a resume, a snapshot's sandbox, a boot
    image's) would leave its tenant free to use up host root's inotify instances. CRIU runs
    the script at each stage of a dump and a restore; at ``pre-resume`` the restored tree is
    complete and none of its processes has run yet, and ``CRTOOLS_INIT_PID`` is its init, as the
    host sees it. A failure there fails the restore, so no sandbox runs unbounded. A boot
    image's restore runs without it: the backend bounds that one (``userns_limits_argv``).
    """
    return (
        '[ "$CRTOOLS_SCRIPT_ACTION" = pre-resume ] || exit 0\n'
        'case $CRTOOLS_INIT_PID in ""|0*|*[!0-9]*) echo "no init pid from CRIU" >&2; exit 1;; esac\n'
        f"exec nsenter --user --target \"$CRTOOLS_INIT_PID\" sh -c '{_WRITE_USERNS_LIMITS}' sh"
        f" {INOTIFY_INSTANCES} {INOTIFY_WATCHES}\n"
    )


_CPU_PERIOD = 100_000
# null, zero, full, random, urandom, tty, ptmx, and every pts: what a shell session needs.
_ALLOWED_DEVICES: list[dict[str, Any]] = [
    {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}
    for major, minor in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2))
] + [{"allow": True, "type": "c", "major": 136, "access": "rwm"}]


# Hidden from the sandbox: kernel memory and keys, timing side channels, the firmware's tables,
# energy counters (a side channel on other tenants' work). A runtime masks a file with /dev/null
# and a directory with an empty read-only tmpfs; where present, a directory may instead be bound
# to an empty folder (``ContainerPlan.masked_dirs``).
MASKED_PATHS = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/proc/scsi",
)


# The device nodes a runtime gives every container (the OCI defaults); binds of the host's in a user namespace.
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")


@dataclass(frozen=True)
class ContainerPlan:
    rootfs: str  # the overlay mount point
    netns_path: str | None  # None: the runtime makes one (inside the user namespace, if any)
    hostname: str
    hosts_file: str  # bind-mounted over /etc/hosts
    resolv_file: str  # bind-mounted over /etc/resolv.conf
    cgroup_path: str  # relative, e.g. "e2b-compat/<id>"
    command: tuple[str, ...]  # the agent command (tini is put in front)
    env: dict[str, str]
    limits: Limits
    id_mapping: list[dict[str, int]] | None = None  # user namespace: container 0 → an unprivileged host uid
    volumes: tuple[tuple[str, str], ...] = ()  # (where in the sandbox, the host folder bound there), writable
    sysfs: str | None = None  # a sysfs of the sandbox's network namespace, bound at /sys (None: the runtime's)
    # RLIMIT_NOFILE, soft and hard: the runtime sets it inside the user namespace, where it cannot
    # go above the caller's own hard limit (the backend passes the smaller of the two).
    open_files: int = NOFILE_LIMIT
    # The createRuntime hook bounding inotify per sandbox user namespace (see INOTIFY_INSTANCES); off
    # where the runtime's own kernel implements inotify (gVisor), so nothing is charged to host root.
    userns_limits_hook: bool = True
    # seccomp rules that must answer ENOSYS (clone3, so libc falls back to clone); off where the
    # runtime answers every refusal with EPERM (gVisor's), which would make libc fail thread creation.
    enosys_rules: bool = True
    # The host's device nodes the runtime binds into /dev in a user namespace, listed as mounts:
    # a checkpoint refuses mounts it was not told of (CRIU's "mounts without a root").
    device_binds: bool = False
    # A folder bound read-only at /run/e2b: the sandbox's identity as envd publishes it there
    # (.E2B_SANDBOX, .E2B_SANDBOX_ID, .E2B_TEMPLATE_ID), read by the agent at each /init.
    metadata_dir: str | None = None
    # Masked directories (of ``MASKED_PATHS``) hidden by a read-only bind of this empty folder
    # instead of the runtime's read-only tmpfs: CRIU takes a bind for an external mount, where
    # each tmpfs costs a checkpoint a ``tar | gzip`` and a restore its reverse (4-6 ms each).
    masked_dirs: tuple[str, ...] = ()
    empty_dir: str | None = None


def _mount(destination: str, kind: str, source: str, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": kind, "source": source, "options": options}


def config(plan: ContainerPlan) -> dict[str, Any]:
    bound = [(folder, plan.empty_dir) for folder in plan.masked_dirs if plan.empty_dir]
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
            "rlimits": [{"type": "RLIMIT_NOFILE", "soft": plan.open_files, "hard": plan.open_files}],
        },
        "root": {"path": plan.rootfs, "readonly": False},
        # The runtime refuses user.* sysctls ("not namespaced"); a host-side hook writes them
        # into the sandbox's user namespace once it exists, before the agent runs.
        **({"hooks": _userns_limits_hooks()} if plan.userns_limits_hook else {}),
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
            *(
                _mount(f"/dev/{node}", "bind", f"/dev/{node}", ["rbind", "nosuid", "noexec"])
                for node in (DEVICE_NODES if plan.device_binds else ())
            ),
            (
                _mount("/sys", "bind", plan.sysfs, ["rbind", "nosuid", "noexec", "nodev", "ro"])
                if plan.sysfs
                else _mount("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"])
            ),
            _mount("/sys/fs/cgroup", "cgroup", "cgroup", ["nosuid", "noexec", "nodev", "relatime", "ro"]),
            *(_mount(folder, "bind", empty, ["bind", "ro", "nosuid", "nodev", "noexec"]) for folder, empty in bound),
            _mount("/etc/hosts", "bind", plan.hosts_file, ["rbind", "ro"]),
            _mount("/etc/resolv.conf", "bind", plan.resolv_file, ["rbind", "ro"]),
            *(
                [_mount("/run/e2b", "bind", plan.metadata_dir, ["rbind", "ro", "nosuid", "nodev", "noexec"])]
                if plan.metadata_dir
                else []
            ),
            _mount("/tmp", "tmpfs", "tmpfs", ["nosuid", "nodev", "mode=1777"]),  # noqa: S108 - the sandbox's own /tmp
            # Volumes last, the shallowest first: one under /tmp or under another volume stays seen.
            *(
                _mount(target, "bind", source, ["rbind", "rw", "nosuid", "nodev"])
                for target, source in sorted(plan.volumes, key=lambda volume: volume[0].count("/"))
            ),
        ],
        "linux": {
            "cgroupsPath": plan.cgroup_path,
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "cgroup"},
                {"type": "network", **({"path": plan.netns_path} if plan.netns_path else {})},
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
                "syscalls": seccomp_rules(enosys=plan.enosys_rules),
            },
            "maskedPaths": [path for path in MASKED_PATHS if path not in dict(bound)],
            "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def _userns_limits_hooks() -> dict[str, Any]:
    return {
        "createRuntime": [
            {
                "path": "/bin/sh",
                "args": ["sh", "-c", _USERNS_LIMITS_HOOK, "sh", str(INOTIFY_INSTANCES), str(INOTIFY_WATCHES)],
                "timeout": 10,
            }
        ]
    }


def seccomp_rules(*, enosys: bool = True) -> list[dict[str, Any]]:
    """Refusals on top of allow-by-default: the denied list, namespace-making clone, clone3 (``enosys``), io_uring."""
    refuse = {"action": "SCMP_ACT_ERRNO", "errnoRet": _EPERM}
    # One rule per flag (rules are or-ed): "any namespace flag set" is not one masked comparison.
    clone = [
        {
            "names": ["clone"],
            **refuse,
            "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
        }
        for flag in CLONE_NAMESPACE_FLAGS.values()
    ]
    return [
        {"names": DENIED_SYSCALLS + IO_URING_SYSCALLS, **refuse},
        *([{"names": ENOSYS_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": _ENOSYS}] if enosys else []),
        *clone,
    ]


def hosts_file(hostname: str) -> str:
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"


def resolv_file(nameservers: list[str]) -> str:
    # With egress off there is nothing to resolve against; an empty list keeps lookups failing fast.
    return "".join(f"nameserver {ns}\n" for ns in nameservers) or "# no name resolution: egress is disabled\n"
