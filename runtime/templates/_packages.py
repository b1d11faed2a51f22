"""The Debian packages of ``code-interpreter-v1``'s R and Java kernels: asked for, locked, installed.

Two committed files beside this module fix what goes in:

- ``packages.in``: the packages asked for, one name a line (R with Debian's IRkernel, a headless
  JDK for the Java kernel's JShell);
- ``packages.<suite>-<arch>.lock``: every package apt installs for them on the ``os`` layer
  (dependencies included, no recommends), one ``name=version sha256:<hex>`` line each, written by
  ``e2b-compat template lock-packages`` from the rootfs's own apt (``write_lock``).

A build (``install``) runs the rootfs's own apt: it downloads exactly the locked ``name=version``
set, checks that the downloaded ``.deb`` files are exactly the locked hashes (apt checks them
against the signed index too), installs from those files only and checks that dpkg then holds every
locked version. A version the mirror no longer serves fails the build with the command to re-lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ._commands import CHROOT_ENV, TemplateError, run

__all__ = [
    "REQUESTED",
    "install",
    "lock_path",
    "parse_lock",
    "parse_simulation",
    "parse_stanzas",
    "proc_mounted",
    "read_lock",
    "requested",
    "write_lock",
]

HERE = Path(__file__).parent
REQUESTED = HERE / "packages.in"
_APT_ENV = {**CHROOT_ENV, "DEBIAN_FRONTEND": "noninteractive"}
# Downloads as root: the rootfs's _apt user cannot write a chroot's partial/ folder everywhere.
_APT = ("apt-get", "-q", "-y", "-o", "APT::Sandbox::User=root", "--no-install-recommends")
_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ")
_LOCK_LINE = re.compile(r"^([a-z0-9][a-z0-9+.-]+)=(\S+) sha256:([0-9a-f]{64})$")


def lock_path(suite: str, arch: str) -> Path:
    return HERE / f"packages.{suite}-{arch}.lock"


def requested(path: Path = REQUESTED) -> list[str]:
    """The package names asked for (comments and blank lines skipped)."""
    names = [line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [name for name in names if name]


def read_lock(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TemplateError(
            f"no Debian package lock for this suite and machine ({path.name}); "
            "create it with `e2b-compat template lock-packages`"
        ) from None


def parse_lock(lock: bytes) -> dict[str, tuple[str, str]]:
    """``{name: (version, sha256)}``; a line that is not ``name=version sha256:<hex>`` is an error."""
    entries: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(lock.decode("utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _LOCK_LINE.fullmatch(line.strip())
        if match is None:
            raise TemplateError(f"package lock line {number} is not 'name=version sha256:<hex>': {line!r}")
        entries[match[1]] = (match[2], match[3])
    return entries


def parse_simulation(text: str) -> list[tuple[str, str]]:
    """``(name, version)`` of every ``Inst`` line of ``apt-get install -s`` (new or upgraded)."""
    return [(m[1].split(":")[0], m[2]) for m in map(_INST.match, text.splitlines()) if m is not None]


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """The fields of each stanza of ``apt-cache show`` (continuation lines dropped)."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                stanzas.append(current)
            current = {}
        elif not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            current[key] = value.strip()
    return stanzas


def _in_root(rootfs: Path, cmd: Sequence[str], what: str, detail: Callable[[str], None] | None = None) -> str:
    return run(["chroot", str(rootfs), *cmd], what, env=_APT_ENV, detail=detail or (lambda _line: None))


@contextlib.contextmanager
def proc_mounted(rootfs: Path) -> Iterator[None]:
    """``/proc`` mounted in ``rootfs`` for the block: the JDK's package scripts and its java need it
    (the loader finds libjli through ``$ORIGIN``, read from ``/proc/self/exe``)."""
    proc = rootfs / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(proc)], check=False, capture_output=True)


@contextlib.contextmanager
def apt_session(rootfs: Path) -> Iterator[None]:
    """``/proc`` mounted and the host's resolver in ``rootfs`` while apt runs; both undone after.

    The template keeps its empty ``resolv.conf`` (the runtime gives each sandbox its own), no
    package lists and no downloaded packages.
    """
    resolv = rootfs / "etc/resolv.conf"
    shutil.copyfile("/etc/resolv.conf", resolv)
    try:
        with proc_mounted(rootfs):
            _in_root(rootfs, ["apt-get", "-q", "-o", "APT::Sandbox::User=root", "update"], "apt-get update")
            yield
    finally:
        resolv.write_bytes(b"")
        for leftover in (*(rootfs / "var/lib/apt/lists").glob("*"), *(rootfs / "var/cache/apt").glob("*.bin")):
            if leftover.is_file() and not leftover.is_symlink():
                leftover.unlink()
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()


def write_lock(rootfs: Path, out: Path, names: Sequence[str]) -> Path:
    """Resolve ``names`` with the apt of ``rootfs`` (a scratch copy of the os layer) into ``out``."""
    with apt_session(rootfs):
        plan = parse_simulation(_in_root(rootfs, [*_APT, "-s", "install", *names], "resolving the Debian packages"))
        if not plan:
            raise TemplateError(f"apt plans to install nothing for {', '.join(names)}")
        shown = _in_root(rootfs, ["apt-cache", "show", *(f"{n}={v}" for n, v in plan)], "reading the packages' hashes")
    digests = {(s.get("Package"), s.get("Version")): s.get("SHA256", "") for s in parse_stanzas(shown)}
    lines = []
    for name, version in sorted(plan):
        digest = digests.get((name, version), "")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise TemplateError(f"apt-cache gives no SHA256 for {name} {version}")
        lines.append(f"{name}={version} sha256:{digest}")
    header = f"# Generated from {REQUESTED.name} by `e2b-compat template lock-packages` for {out.stem[9:]}.\n"
    out.write_text(header + "\n".join(lines) + "\n", encoding="utf-8")
    return out


def _digests(folder: Path) -> set[str]:
    return {hashlib.sha256(deb.read_bytes()).hexdigest() for deb in folder.glob("*.deb")}


def install(rootfs: Path, lock: bytes, detail: Callable[[str], None]) -> list[str]:
    """Install exactly the locked packages into ``rootfs`` (see the module docstring); their names."""
    entries = parse_lock(lock)
    pinned = [f"{name}={version}" for name, (version, _) in sorted(entries.items())]
    with apt_session(rootfs):
        try:
            _in_root(rootfs, [*_APT, "--download-only", "install", *pinned], "downloading the locked packages", detail)
        except TemplateError as exc:
            raise TemplateError(f"{exc}\n(a locked version may be gone: `e2b-compat template lock-packages`)") from None
        got = _digests(rootfs / "var/cache/apt/archives")
        wanted = {digest for _, digest in entries.values()}
        if got != wanted:
            raise TemplateError(
                f"the downloaded packages are not the locked ones: {len(got - wanted)} unexpected, "
                f"{len(wanted - got)} missing (re-lock with `e2b-compat template lock-packages`)"
            )
        _in_root(rootfs, [*_APT, "--no-download", "install", *pinned], "installing the locked packages", detail)
    listing = _in_root(rootfs, ["dpkg-query", "-W", "-f", "${Package}=${Version}\\n"], "listing dpkg's packages")
    installed = dict(line.split("=", 1) for line in listing.splitlines() if "=" in line)
    wrong = [n for n, (v, _) in entries.items() if installed.get(n) != v]
    if wrong:
        raise TemplateError(f"dpkg does not hold the locked versions of {', '.join(sorted(wrong))}")
    return sorted(entries)
