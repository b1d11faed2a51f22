"""CRIU and a crun that calls it, built from pinned Debian sources and cached by content hash.

A memory pause that frees the sandbox's RAM writes its processes to disk with CRIU (through
``crun checkpoint``/``restore``). Debian 12 packages neither a CRIU this kernel can use nor a
crun built with CRIU (docs/ARCHITECTURE.md, *Memory checkpoints*), so both are built here:

- **CRIU 4.2.1**: the least version that dumps TCP sockets on kernels from 6.16 and reads the
  split vDSO of kernels from 6.13.
- **crun 1.21** configured against that CRIU's ``libcriu`` (which crun opens with ``dlopen``;
  the binary's run path names the cache folder, so no system library is replaced).

The sources are Debian's ``.orig`` tarballs, downloaded from Debian's archive and checked
against the SHA-256 that Debian's source index lists. The result lives in
``<cache>/tools/checkpoint-<hash>``, where the hash covers the pins and this module's build
recipe; a ``complete`` file is written last, so a build cut short is redone, never used. Parallel
servers (or CI and a server) build once: the build holds an ``flock`` on the tools folder.

Nothing is installed system-wide but the Debian build packages (``BUILD_PACKAGES``) and CRIU's
own cache of kernel facts, ``/run/criu.kdat`` (``keep_kernel_facts``): CRIU probes the kernel at
every start (spawning ``iptables`` among others: 30 to 60 ms of each checkpoint and restore here)
unless that file holds the answers, and it writes the file itself only where ``/run`` is a tmpfs
(so a reboot drops it). Where ``/run`` is not, as on this kind of host, the file is made here, in
a mount namespace of its own with a tmpfs over ``/run``, and is made again once older than the boot.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from contract import default_cache_root

__all__ = [
    "BUILD_PACKAGES",
    "CRIU_SOURCE",
    "CRUN_SOURCE",
    "CheckpointTools",
    "ToolsError",
    "ensure",
    "find",
    "keep_kernel_facts",
    "tools_dir",
]

_ARCHIVE = "http://deb.debian.org/debian/pool/main/c"


@dataclass(frozen=True)
class Source:
    name: str
    version: str
    url: str
    sha256: str  # as Debian's source index (dists/<suite>/main/source/Sources) lists it


CRIU_SOURCE = Source(
    "criu",
    "4.2.1",
    f"{_ARCHIVE}/criu/criu_4.2.1.orig.tar.xz",
    "29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9",
)
CRUN_SOURCE = Source(
    "crun",
    "1.21",
    f"{_ARCHIVE}/crun/crun_1.21.orig.tar.gz",
    "4bfb700e764a4804a4de3ecf07753f4c391005356d60356df65d80ae0914c486",
)

# What both builds need from Debian 12 (the headers and generators; nothing of it runs later).
BUILD_PACKAGES = (
    "build-essential",
    "pkgconf",
    "libprotobuf-c-dev",
    "protobuf-c-compiler",
    "libprotobuf-dev",
    "protobuf-compiler",
    "libnl-3-dev",
    "libnet1-dev",
    "libcap-dev",
    "libbsd-dev",
    "libgnutls28-dev",
    "libnftables-dev",
    "uuid-dev",
    "python3-protobuf",
    "libyajl-dev",
    "libseccomp-dev",
    "autoconf",
    "automake",
    "libtool",
    "gperf",
)

# Bumped when the steps below change what they produce.
RECIPE_VERSION = 1
_COMPLETE = "complete"


class ToolsError(Exception):
    """The tools could not be fetched, built or checked; the message says which step and why."""


@dataclass(frozen=True)
class CheckpointTools:
    """A built CRIU and crun: ``env()`` is what a ``crun`` call needs to reach that CRIU."""

    root: Path

    @property
    def crun(self) -> Path:
        return self.root / "bin" / "crun"

    @property
    def criu(self) -> Path:
        return self.root / "sbin" / "criu"

    def env(self) -> dict[str, str]:
        """The environment of a ``crun`` call: libcriu starts ``criu`` from ``PATH`` (this one first)."""
        return {**os.environ, "PATH": f"{self.root / 'sbin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}


# Where CRIU, run as root, reads and writes its kernel facts (its KERNDAT_CACHE_FILE).
KERNEL_FACTS = Path("/run/criu.kdat")
_TMPFS_MAGIC = 0x01021994
# CRIU's probes, run where /run is a fresh tmpfs (so CRIU writes the facts), then the file printed.
_PROBE_SCRIPT = (
    'mount -t tmpfs -o size=1m,mode=0755 e2b-criu-kdat /run && "$1" check >/dev/null 2>&1; cat /run/criu.kdat'
)


def keep_kernel_facts(tools: CheckpointTools, target: Path = KERNEL_FACTS) -> bool:
    """``target`` holds CRIU's kernel facts from this boot; True when it was (re)written now.

    Nothing is done where ``target``'s folder is a tmpfs (CRIU keeps the file there itself) or
    where the file is newer than the boot. A probe that fails leaves things as they are: the
    cache only saves time, each CRIU run probes for itself without it. Written through a file
    of this process's own and a rename, so parallel servers never show a half-written one.
    """
    if _is_tmpfs(target.parent) or _from_this_boot(target):
        return False
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _PROBE_SCRIPT, "sh", str(tools.criu)],
        capture_output=True,
        env=tools.env(),
        check=False,
        timeout=60,
    )
    if proc.returncode != 0 or not proc.stdout:
        return False
    partial = target.with_name(f".{target.name}.e2b-{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(proc.stdout)
    os.replace(partial, target)
    return True


def _is_tmpfs(folder: Path) -> bool:
    try:
        return _statfs_type(folder) == _TMPFS_MAGIC
    except OSError:
        return False


def _statfs_type(folder: Path) -> int:
    """The file system type of ``folder`` (statfs's f_type), as ``stat -f`` prints it."""
    proc = subprocess.run(["stat", "-f", "-c", "%t", str(folder)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OSError(proc.stderr.strip())
    return int(proc.stdout.strip(), 16)


def _from_this_boot(path: Path) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_size > 0 and info.st_mtime >= _boot_time()


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return float("inf")  # unknown: every file counts as older


def _digest() -> str:
    pins = "\n".join(f"{s.name} {s.version} {s.url} {s.sha256}" for s in (CRIU_SOURCE, CRUN_SOURCE))
    return hashlib.sha256(f"{pins}\nrecipe {RECIPE_VERSION}\n".encode()).hexdigest()


def tools_dir(cache_root: Path | None = None) -> Path:
    return (cache_root if cache_root is not None else default_cache_root()) / "tools" / f"checkpoint-{_digest()[:16]}"


def find(cache_root: Path | None = None) -> CheckpointTools | None:
    """The built tools, or None when they were never built (or a build did not finish)."""
    root = tools_dir(cache_root)
    return CheckpointTools(root) if (root / _COMPLETE).is_file() else None


def ensure(say: Callable[[str], None] = print, cache_root: Path | None = None) -> CheckpointTools:
    """The built tools, building them first when needed (about a minute on two cores)."""
    found = find(cache_root)
    if found is not None:
        return found
    root = tools_dir(cache_root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with _locked(root.parent / ".checkpoint.lock"):
        found = find(cache_root)  # another process built them while this one waited
        if found is not None:
            return found
        say(f"building CRIU {CRIU_SOURCE.version} and crun {CRUN_SOURCE.version} for memory checkpoints …")
        _install_build_packages(say)
        if root.exists():
            shutil.rmtree(root)  # a build cut short
        with tempfile.TemporaryDirectory(prefix="e2b-compat-checkpoint-") as scratch:
            _build(root, Path(scratch))
        (root / _COMPLETE).write_text(_digest() + "\n")
    return CheckpointTools(root)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _install_build_packages(say: Callable[[str], None]) -> None:
    missing = [package for package in BUILD_PACKAGES if not _installed(package)]
    if not missing:
        return
    say(f"installing {', '.join(missing)} (Debian packages, to build CRIU and crun) …")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], env=env)
    _run(["apt-get", "install", "-y", "-qq", *missing], env=env)


def _installed(package: str) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True, text=True, check=False)
    return proc.stdout.strip() == "install ok installed"


def _fetch(source: Source, folder: Path) -> Path:
    """The source tree of ``source``, unpacked in ``folder``, after its tarball's hash is checked."""
    target = folder / Path(source.url).name
    try:
        with urllib.request.urlopen(source.url, timeout=120) as response, open(target, "wb") as out:  # noqa: S310 - a pinned http(s) URL
            shutil.copyfileobj(response, out)
    except OSError as exc:
        raise ToolsError(f"downloading {source.url} failed: {exc}") from exc
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != source.sha256:
        raise ToolsError(f"{target.name}: sha256 {digest}, expected {source.sha256}")
    with tarfile.open(target) as archive:
        archive.extractall(folder, filter="data")
    tree = folder / f"{source.name}-{source.version}"
    if not tree.is_dir():
        raise ToolsError(f"{target.name} holds no {tree.name}/")
    return tree


def _build(root: Path, scratch: Path) -> None:
    jobs = str(max(1, os.cpu_count() or 1))
    lib = root / "lib"
    criu = _fetch(CRIU_SOURCE, scratch)
    # No Python bindings, no manual pages: the binary, libcriu and its headers.
    install = [f"PREFIX={root}", f"LIBDIR={lib}", "SKIP_PIP_INSTALL=1"]
    _run(["make", "-j", jobs, "criu", "lib"], cwd=criu)
    _run(["make", "install-criu", "install-lib", *install], cwd=criu)
    crun = _fetch(CRUN_SOURCE, scratch)
    env = {
        **os.environ,
        "PKG_CONFIG_PATH": str(lib / "pkgconfig"),
        # Before /usr/include, where a Debian libcriu-dev's older criu.h may be.
        "CPPFLAGS": f"-I{root / 'include'}",
        # crun opens libcriu.so.2 with dlopen, which searches the executable's run path.
        "LDFLAGS": f"-Wl,-rpath,{lib}",
    }
    _run(["./configure", f"--prefix={root}", "--disable-systemd"], cwd=crun, env=env)
    _run(["make", "git-version.h", ".version"], cwd=crun, env=env)
    _run(["make", "-j", jobs, "crun"], cwd=crun, env=env)
    (root / "bin").mkdir(exist_ok=True)
    shutil.copy2(crun / "crun", root / "bin" / "crun")
    version = _run([str(root / "bin" / "crun"), "--version"])
    if "+CRIU" not in version:
        raise ToolsError(f"the crun built lacks CRIU support: {version.strip()!r}")


def _run(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-2000:]
        raise ToolsError(f"{' '.join(argv[:3])} failed ({proc.returncode}): {tail}")
    return proc.stdout
