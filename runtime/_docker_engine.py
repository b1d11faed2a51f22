"""Our own Docker Engine for the docker backend: installed, started, answered, stopped.

The backend never uses the host's default daemon (``/var/run/docker.sock``) nor changes its
configuration: it starts a ``dockerd`` of its own, with every path of its own::

    /var/lib/e2b-compat/docker-pool.img  a sparse btrfs image, loop-mounted on docker-pool/
    /var/lib/e2b-compat/docker-pool/data/ the daemon's data root (images, containers' layers)
    /var/lib/e2b-compat/docker.log   the daemon's log
    /run/e2b-compat/docker.sock      its API socket (root only)
    /run/e2b-compat/docker.pid       its pid (``stop`` ends that pid, never a process found by name)
    /run/e2b-compat/docker-exec/     its exec root (and that of the containerd it starts)
    /run/e2b-compat/docker-views/    a shared mount: the volumes' idmapped views (``views``)

The daemon runs in a mount namespace of its own (``unshare --mount --propagation slave``), where
the pool is remounted ``suid``: the host's mount of it is ``nosuid`` (``runtime._docker_pool``).
Mounts the host makes later reach that namespace only under a shared mount, so each volume's
view is made under ``docker-views/``, made shared before the daemon starts. A daemon of ours
found running in the host's namespace (started before this) is restarted like one with older
settings.

Disk and ids (``runtime._docker_pool``): the data root is on a btrfs pool of bounded size, so no
sandbox can fill the host filesystem, and each container has a btrfs qgroup limit (simple quotas)
(``--storage-driver=btrfs``; overlay2's ``size`` option needs XFS project quotas, which this
kernel lacks: ``CONFIG_XFS_QUOTA`` unset). The daemon remaps ids (``--userns-remap``) onto one
range of the host-wide id registry, so a sandbox's root is an unprivileged host uid (shared by
every docker sandbox of the host: Docker 20.10 remaps daemon-wide only).

An older data root, ``/var/lib/e2b-compat/docker/`` (overlay2, no remapping), is no longer used:
``start`` restarts a daemon of ours that runs with other settings, the containers in the old data
root are not seen by the new daemon (their servers' reconcile sets such sandboxes aside as
failed, as for any lost container), and the folder is left for the operator to remove.

The host's network state stays as it was: ``--bridge=none`` (no docker0), ``--iptables=false``
and ``--ip6tables=false`` (no rules), ``--ip-forward=false`` (``net.ipv4.ip_forward`` untouched).
Sandboxes run with ``network_mode=none`` and get the same veth and nftables policy as crun's
(``runtime._network``).

Several servers on one host share the one daemon: each container and image it makes carries
the owner label (the server's state folder), and a server only ever lists, removes or reconciles
its own. Template images are shared (named by the template's content key, imported once under a
host-wide lock).

Docker's default seccomp profile is not shipped as a file with the engine; it is in Debian's
``golang-github-docker-docker-dev`` package of the same source version, whose ``.deb`` alone
(``apt-get download``, no dependencies installed) is unpacked for that one file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors

from . import _docker_pool, _hostfs, host
from ._oci import DENIED_SYSCALLS, ENOSYS_SYSCALLS, IO_URING_SYSCALLS
from .backend import BackendError
from .host import HostNotReadyError

__all__ = [
    "ENGINE_PACKAGE",
    "ENGINE_VERSION",
    "LABEL_OWNER",
    "LABEL_SANDBOX",
    "STARTED_HERE",
    "Engine",
    "default_engine",
    "seccomp_profile",
]

ENGINE_PACKAGE = "docker.io"
ENGINE_VERSION = "20.10.24+dfsg1-1+deb12u1+b6"  # Debian 12's; the profile package is the same source's
_PROFILE_PACKAGE = "golang-github-docker-docker-dev"
_PROFILE_VERSION = "20.10.24+dfsg1-1+deb12u1"
_PROFILE_IN_DEB = "usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json"

LABEL_OWNER = "org.e2b-compat.owner"  # the state folder of the server that made it
LABEL_SANDBOX = "org.e2b-compat.sandbox"
LABEL_KIND = "org.e2b-compat.kind"  # template, snapshot, sandbox

# Pidfiles of the daemons this process started: a test stops only what it started.
STARTED_HERE: set[Path] = set()
_ANSWER_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0
_EPERM = 1


class Engine:
    """One dockerd of ours, by its paths; ``start`` and ``stop`` are idempotent."""

    def __init__(self, data: Path = Path("/var/lib/e2b-compat"), run: Path = Path("/run/e2b-compat")) -> None:
        self.pool_image = data / "docker-pool.img"
        self.pool = data / "docker-pool"
        self.data_root = self.pool / "data"
        self.old_data_root = data / "docker"  # overlay2, before the pool: left for the operator
        self.log = data / "docker.log"
        self.profile = data / "docker-seccomp-default.json"
        self.socket = run / "docker.sock"
        self.pidfile = run / "docker.pid"
        self.exec_root = run / "docker-exec"
        self.views = run / "docker-views"
        self._lock = run / "docker.lock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self, timeout: float = 120.0) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, timeout=int(timeout), version="1.41")

    def answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            with contextlib.closing(self.client(timeout=5)) as client:
                return bool(client.ping())
        except (docker.errors.DockerException, OSError):
            return False

    def pid(self) -> int | None:
        """The daemon's pid from its pidfile, when that process still runs dockerd."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if cmdline and Path(cmdline[0].decode(errors="replace")).name == "dockerd" else None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Host-wide: one server at a time starts or stops the daemon (or imports a template)."""
        self._lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def argv(self) -> list[str]:
        """The daemon's command line; one of ours running with another is restarted by ``start``."""
        return [
            "dockerd",
            f"--host={self.url}",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.pidfile}",
            "--storage-driver=btrfs",
            f"--userns-remap={_docker_pool.REMAP_USER}",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
            "--userland-proxy=false",
            "--log-level=warn",
        ]

    def running_argv(self) -> list[str] | None:
        pid = self.pid()
        if pid is None:
            return None
        with contextlib.suppress(OSError):
            return [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part]
        return None

    def start(self, say: Callable[[str], None] = print) -> bool:
        """Start our daemon unless it answers already with our settings; True when this call started it."""
        with self.locked():
            running = self.running_argv()
            if running is not None and (running[1:] != self.argv()[1:] or not self.in_own_namespace()):
                say(f"our dockerd (pid {self.pid()}) runs with older settings: restarting it (its containers stop)")
                self._stop_locked()
            elif self.answers():
                return False
            elif running is not None:  # started, not answering yet (another server's start)
                self._wait_answering()
                return False
            _docker_pool.ensure_pool(self.pool_image, self.pool, say)
            _docker_pool.ensure_remap_range(say)
            if self.old_data_root.is_dir():
                say(f"{self.old_data_root} (the overlay2 data root before the pool) is no longer used: remove it")
            self.exec_root.mkdir(parents=True, exist_ok=True)
            _hostfs.ensure_shared(self.views)  # before the daemon's namespace is cloned: it is a slave of it
            # What a daemon left mounted under the pool in the host's namespace (one started before
            # daemons had a namespace of their own binds its data root there, without nosuid): no
            # daemon runs now, and the new one makes its own in its namespace.
            for point in sorted(_hostfs.mounts_under(self.pool), key=len, reverse=True):
                say(f"unmounting {point}, left in the host's namespace by an earlier dockerd")
                _hostfs.unmount(point)
            say(f"starting our own dockerd on {self.socket} (data root {self.data_root})")
            daemon = _hostfs.with_setuid_root(self.pool, self.argv(), propagation="slave")
            with open(self.log, "ab") as log:
                # setsid --fork: a session of its own (a signal to the caller's group never reaches it),
                # and not our child: it outlives this process and is never left for us to reap.
                subprocess.run(
                    ["setsid", "--fork", *daemon], stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True
                )
            self._wait_answering()
            STARTED_HERE.add(self.pidfile)
            return True

    def in_own_namespace(self) -> bool:
        """Whether our running daemon has a mount namespace other than this process's (the host's)."""
        pid = self.pid()
        try:
            return pid is not None and os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino
        except OSError:
            return False

    def _wait_answering(self) -> None:
        deadline = time.monotonic() + _ANSWER_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.answers():
                return
            time.sleep(0.1)
        raise HostNotReadyError(
            f"our dockerd did not answer on {self.socket} within {_ANSWER_TIMEOUT_S:.0f} s: {_tail(self.log)}"
        )

    def stop(self) -> bool:
        """End our daemon by its pidfile's pid; True when one ran."""
        with self.locked():
            return self._stop_locked()

    def _stop_locked(self) -> bool:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # dockerd stops its containers and its containerd
            deadline = time.monotonic() + _STOP_TIMEOUT_S
            while self.pid() == pid and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.pid() == pid:
                raise BackendError(f"dockerd (pid {pid}) did not stop within {_STOP_TIMEOUT_S:.0f} s")
        return pid is not None

    def ensure_profile(self, say: Callable[[str], None]) -> None:
        """Docker's default seccomp profile, from the Debian package of the engine's source, unpacked once."""
        if self.profile.exists():
            return
        say(f"fetching Docker's default seccomp profile ({_PROFILE_PACKAGE} {_PROFILE_VERSION}, the .deb only)")
        self.profile.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            os.chmod(folder, 0o755)  # noqa: S103 - apt's download user (_apt) writes the .deb there
            _run(["apt-get", "download", f"{_PROFILE_PACKAGE}={_PROFILE_VERSION}"], "downloading", cwd=folder)
            deb = next(Path(folder).glob("*.deb"))
            _run(["dpkg-deb", "-x", str(deb), f"{folder}/x"], "unpacking")
            profile = Path(folder) / "x" / _PROFILE_IN_DEB
            json.loads(profile.read_text())  # a damaged file fails here, not in every create
            tmp = self.profile.with_suffix(".tmp")
            shutil.copyfile(profile, tmp)
            os.replace(tmp, self.profile)


def default_engine() -> Engine:
    return Engine()


def prepare_host(say: Callable[[str], None], engine: Engine | None = None) -> None:
    """crun's host set-up (nftables, iproute2, the cgroup fix, limits), the engine, btrfs-progs and our daemon."""
    host.prepare(say=say)
    wanted = {ENGINE_PACKAGE: "/usr/sbin/dockerd", "btrfs-progs": "/usr/bin/btrfs"}
    missing = [package for package, tool in wanted.items() if not Path(tool).exists()]
    if missing:
        pinned = [f"{p}={ENGINE_VERSION}" if p == ENGINE_PACKAGE else p for p in missing]
        say(f"installing {', '.join(pinned)} (Debian packages) …")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        host._step(["apt-get", "update", "-qq"], env, f"install {', '.join(pinned)} by hand")
        host._step(["apt-get", "install", "-y", "-qq", *pinned], env, f"install {', '.join(pinned)} by hand")
    engine = engine or default_engine()
    engine.ensure_profile(say)
    engine.start(say)


def seccomp_profile(default: dict[str, Any]) -> dict[str, Any]:
    """Docker's default profile with crun's refusals on top (``runtime._oci``): the stricter of both.

    Docker's default already refuses namespace-making ``clone`` flags, ``unshare``, ``setns`` and
    ``mount`` without CAP_SYS_ADMIN and makes ``clone3`` ENOSYS; it allows io_uring and a few of
    crun's denied calls. Those are taken out of its allow rules and refused with EPERM here.
    """
    refused = set(DENIED_SYSCALLS) | set(IO_URING_SYSCALLS)
    profile: dict[str, Any] = json.loads(json.dumps(default))
    rules: list[dict[str, Any]] = []
    for rule in profile["syscalls"]:
        kept = rule
        if rule.get("action") == "SCMP_ACT_ALLOW":
            names = [name for name in rule["names"] if name not in refused]
            if not names:
                continue
            kept = {**rule, "names": names}
        rules.append(kept)
    rules.append({"names": sorted(refused), "action": "SCMP_ACT_ERRNO", "errnoRet": _EPERM})
    if not any(set(ENOSYS_SYSCALLS) <= set(r["names"]) and r.get("errnoRet") == 38 for r in rules):
        rules.append({"names": ENOSYS_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": 38})
    profile["syscalls"] = rules
    return profile


def _run(argv: list[str], what: str, cwd: str | None = None) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, cwd=cwd)
    except subprocess.CalledProcessError as exc:
        raise HostNotReadyError(f"{what} ({' '.join(argv[:2])}) failed: {exc.stderr.strip()[-300:]}") from exc
    except OSError as exc:
        raise HostNotReadyError(f"{what} ({argv[0]}) failed: {exc}") from exc


def _tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_bytes()[-600:].decode(errors="replace")
    return ""
