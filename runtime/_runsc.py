"""gVisor's ``runsc`` command line, and the pinned Debian package that provides it.

``RunscCommand`` is crun's command (``runtime.crun.CrunCommand``) with runsc's global flags and
``start`` run another way. One quirk of this runsc on newer kernels is worked around here:
before taking a network namespace's interfaces, runsc decides whether it is the host's by asking
whether ``/proc/sys/net/core/rmem_default`` exists, a file only the host's namespace had on older
kernels; on this host's kernel every namespace has it, and runsc refuses to start ("cannot run
with network enabled in root network namespace"). ``start`` therefore runs runsc in a mount
namespace of its own with an empty tmpfs over ``/proc/sys/net``: the probe finds nothing, and
nothing else changes (the sandbox's processes were made by ``create``, in the host's namespace).

``install_pinned`` installs the pinned runsc .deb: downloaded with apt, its sha256 checked against
``RUNSC_DEB_SHA256`` before dpkg sees it, skipped when that version is already installed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path

from .crun import CrunCommand
from .host import HostNotReadyError

__all__ = ["PLATFORM", "RUNSC_DEB_SHA256", "RUNSC_VERSION", "RunscCommand", "install_pinned", "installed_version"]

# Debian bookworm's runsc: the newest any registry offers (PyPI's ``gvisor`` wheels carry bindings, no runsc).
RUNSC_VERSION = "0.0~20221219.0-2+b3"
RUNSC_DEB_SHA256 = {"amd64": "7183537aca11632026e71d4b2140f463c8e9a433e6cf8ea81e73f82710aabcd8"}
PLATFORM = "ptrace"  # works without KVM; this runsc has ptrace and kvm (no systrap yet)
DEB_CACHE = Path("/var/cache/e2b-compat/debs")

# An empty tmpfs over /proc/sys/net, then runsc: its root-namespace probe finds no rmem_default.
_HIDE_NET_SYSCTLS = 'mount -t tmpfs -o size=4k,mode=0555 e2b-runsc /proc/sys/net && exec "$@"'


class RunscCommand(CrunCommand):
    """``runsc --root <root> --platform=ptrace --network=sandbox …``: crun's verbs, ``start`` past the probe."""

    def __init__(self, root: Path, *, executable: str = "runsc", extra_args: tuple[str, ...] = ()) -> None:
        # overlay2=none: writes go to the bundle's rootfs (the sandbox's disk), not to sandbox memory.
        flags = (f"--platform={PLATFORM}", "--network=sandbox", "--overlay2=none", "--oci-seccomp", *extra_args)
        super().__init__(executable, root, global_args=flags)

    def _hidden_net_sysctls(self, *args: str) -> list[str]:
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _HIDE_NET_SYSCTLS, "sh", *args]

    async def start(self, container: str) -> None:
        await self._run_checked(self._hidden_net_sysctls(*self.argv("start", container)), f"start {container}")


def installed_version() -> str | None:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status} ${Version}", "runsc"], capture_output=True, text=True, check=False
    )
    status, _, version = proc.stdout.rpartition(" ")
    return version if proc.returncode == 0 and status.endswith("installed") and version else None


def _arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_pinned(say: Callable[[str], None], cache: Path = DEB_CACHE) -> None:
    """Install Debian's runsc at ``RUNSC_VERSION``, its .deb checked by sha256; nothing when it is installed."""
    if installed_version() == RUNSC_VERSION:
        return
    arch = _arch()
    expected = RUNSC_DEB_SHA256.get(arch)
    if expected is None:
        raise HostNotReadyError(f"no pinned runsc package hash for {arch}; install runsc={RUNSC_VERSION} by hand")
    cache.mkdir(parents=True, exist_ok=True)
    deb = cache / f"runsc_{RUNSC_VERSION.replace(':', '%3a')}_{arch}.deb"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not deb.exists() or sha256(deb) != expected:
        say(f"downloading Debian's runsc {RUNSC_VERSION} ({arch}) into {cache} …")
        deb.unlink(missing_ok=True)
        _step(["apt-get", "update", "-qq"], env, cache)
        _step(["apt-get", "download", "-qq", f"runsc={RUNSC_VERSION}"], env, cache)
    found = sha256(deb) if deb.exists() else "nothing downloaded"
    if found != expected:
        deb.unlink(missing_ok=True)
        raise HostNotReadyError(f"runsc package {deb.name}: sha256 {found}, expected {expected}; not installed")
    say(f"installing runsc {RUNSC_VERSION} (sha256 {expected[:12]}… checked)")
    _step(["apt-get", "install", "-y", "-qq", "--allow-downgrades", str(deb)], env, cache)


def _step(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    try:
        subprocess.run(argv, check=True, env=env, cwd=cwd)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise HostNotReadyError(f"{' '.join(argv[:2])} failed ({exc}); install runsc={RUNSC_VERSION} by hand") from exc
