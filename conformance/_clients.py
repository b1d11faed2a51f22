"""Install the official E2B clients, unchanged, into isolated cached environments.

The conformance harness runs scripts with the real clients, never with our own code, so
each language gets an environment holding exactly the locked packages (``clients/``):

- Python: a virtualenv installed from ``python-<e2b version>.requirements.txt`` with
  ``pip install --require-hashes --no-deps --only-binary=:all:``, so every file comes
  from a wheel whose sha256 is committed and nothing is resolved or built on the spot;
- Node: ``node-<e2b version>/`` installed with ``npm ci --ignore-scripts``, so every tarball
  is checked against its committed integrity and no package code runs while installing.

The pin (``python-2.32.0``, ``node-2.33.0``) is what ``version=None`` means; the other
committed lock files are the points of an SDK-version sweep, installed the same way.

Cache layout (each folder is keyed by the bytes it was built from, so a change of pin
builds a new one and checkouts can share them)::

    <cache>/clients/python/<sha256[:16] of the requirements>-py<major.minor>/
    <cache>/clients/node/<sha256[:16] of package.json + package-lock.json>/

A folder is built beside its final place and renamed into it as the last step: a
folder under its final name is complete and is reused as it is.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract import default_cache_root

__all__ = [
    "ClientEnvironmentError",
    "NodeClients",
    "PythonClients",
    "available_node_versions",
    "available_python_versions",
    "ensure_node_clients",
    "ensure_python_clients",
    "verify_node_clients",
    "verify_python_clients",
    "version_order",
]

CLIENTS_DIR = Path(__file__).resolve().parent / "clients"
PYTHON_REQUIREMENTS = CLIENTS_DIR / "python-2.32.0.requirements.txt"
NODE_PROJECT = CLIENTS_DIR / "node-2.33.0"
NODE_MANIFESTS = ("package.json", "package-lock.json")

# The official packages whose installed files ``verify_*`` checks (those of them that a lock
# file holds); their dependencies are only as trustworthy as the hashes that installed them.
PYTHON_CLIENTS = ("e2b", "e2b-code-interpreter")
NODE_CLIENTS = ("e2b", "@e2b/code-interpreter")

_TAIL_LINES = 20
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
# A version as it appears in a lock file's name; digits first, so no name reaches outside CLIENTS_DIR.
_PYTHON_LOCK = re.compile(r"python-(\d[0-9A-Za-z.+-]*)\.requirements\.txt")
_NODE_LOCK = re.compile(r"node-(\d[0-9A-Za-z.+-]*)")


class ClientEnvironmentError(Exception):
    """A client environment could not be built or checked; the message ends with the tool's output."""


@dataclass(frozen=True)
class PythonClients:
    """A virtualenv holding one lock file's official Python clients and nothing else."""

    python: Path
    site_packages: Path
    version: str  # of the ``e2b`` package; names the lock file it was built from
    packages: tuple[tuple[str, str], ...] = ()  # (official client, version) as locked, e.g. e2b-code-interpreter


@dataclass(frozen=True)
class NodeClients:
    """A folder whose ``node_modules`` holds one lock's official JS clients; run node with it as cwd."""

    root: Path
    version: str  # of the ``e2b`` package; names the lock folder it was built from
    packages: tuple[tuple[str, str], ...] = ()  # (official client, version) as locked, e.g. @e2b/code-interpreter


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    # stderr joins stdout so the tail in the error keeps the tool's own order of events.
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    except OSError as exc:
        raise ClientEnvironmentError(f"{what}: could not start {cmd[0]}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-_TAIL_LINES:])
        raise ClientEnvironmentError(f"{what} failed ({Path(cmd[0]).name} exit {proc.returncode}):\n{tail}")


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise ClientEnvironmentError("npm is needed for the JS clients but is not on PATH")
    return npm


def _materialize(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, first building it with ``build(tmp)`` in a sibling folder if it is absent."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Same parent, so the rename below is atomic and never copies across file systems.
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.build-", dir=final.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp made it private; the environment is as readable as its cache
        try:
            tmp.rename(final)
        except OSError:
            # Another process finished the same key first. Both were built from the same
            # pinned bytes, so the one in place is as good as ours; anything else is real.
            if not final.is_dir():
                raise
    finally:
        # After a failure, or after losing the race: nothing half-built stays behind.
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _key(*parts: bytes) -> str:
    return hashlib.sha256(b"".join(parts)).hexdigest()[:16]


def version_order(version: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key for version texts: numeric where numeric, so 2.9.0 sorts before 2.10.0."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"[.+-]", version))


def available_python_versions() -> list[str]:
    """The ``e2b`` versions that have a committed Python lock file, oldest first."""
    found = [m[1] for m in (_PYTHON_LOCK.fullmatch(p.name) for p in CLIENTS_DIR.iterdir() if p.is_file()) if m]
    return sorted(found, key=version_order)


def available_node_versions() -> list[str]:
    """The ``e2b`` versions that have a committed JS lock folder, oldest first."""
    found = [
        m[1]
        for m in (_NODE_LOCK.fullmatch(p.name) for p in CLIENTS_DIR.iterdir())
        if m and all((CLIENTS_DIR / m[0] / name).is_file() for name in NODE_MANIFESTS)
    ]
    return sorted(found, key=version_order)


def _python_lock(version: str | None) -> Path:
    if version is None:
        return PYTHON_REQUIREMENTS
    # Only a committed file: the version is never spliced into a path unchecked.
    if version not in available_python_versions():
        committed = ", ".join(available_python_versions())
        raise ClientEnvironmentError(f"no Python lock file for e2b {version} (committed: {committed})")
    return CLIENTS_DIR / f"python-{version}.requirements.txt"


def _node_lock(version: str | None) -> Path:
    if version is None:
        return NODE_PROJECT
    if version not in available_node_versions():
        committed = ", ".join(available_node_versions())
        raise ClientEnvironmentError(f"no JS lock folder for e2b {version} (committed: {committed})")
    return CLIENTS_DIR / f"node-{version}"


def _e2b_pin(pinned: dict[str, str], where: Path, asked: str | None) -> str:
    found = pinned.get("e2b")
    if found is None:
        raise ClientEnvironmentError(f"{where} pins no e2b version")
    # A renamed or hand-edited lock must not pass for the version a sweep asked for.
    if asked is not None and found != asked:
        raise ClientEnvironmentError(f"{where} pins e2b {found}, not {asked}")
    return found


def _python_env(root: Path, version: str, pins: dict[str, str] | None = None) -> PythonClients:
    # The POSIX venv layout; the interpreter is addressed through the venv so that
    # pyvenv.cfg makes it see this site-packages and no other.
    lib = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = tuple((name, pins[name]) for name in PYTHON_CLIENTS if name in pins) if pins else ()
    return PythonClients(
        python=root / "bin" / "python",
        site_packages=root / "lib" / lib / "site-packages",
        version=version,
        packages=packages,
    )


def ensure_python_clients(version: str | None = None, cache_root: Path | None = None) -> PythonClients:
    """The virtualenv of the Python clients locked for e2b ``version`` (None: the pin), built on first use."""
    lock = _python_lock(version)
    requirements = lock.read_bytes()
    pins = _pins(requirements.decode("utf-8"))
    e2b_version = _e2b_pin(pins, lock, version)
    # A venv is tied to its interpreter's major.minor, so that is part of the key.
    key = f"{_key(requirements)}-py{sys.version_info.major}.{sys.version_info.minor}"
    final = (cache_root if cache_root is not None else default_cache_root()) / "clients" / "python" / key

    def build(tmp: Path) -> None:
        _run([sys.executable, "-m", "venv", str(tmp)], tmp.parent, "creating the client virtualenv")
        # Install from the very bytes the key was computed from, kept beside the venv.
        (tmp / "requirements.txt").write_bytes(requirements)
        # The build folder is renamed afterwards, so the absolute paths pip writes into bin/
        # scripts go stale: the environment is only ever used through its interpreter.
        install = [
            str(_python_env(tmp, e2b_version).python),
            "-m",
            "pip",
            "install",
            "--require-hashes",
            "--no-deps",
            "--only-binary=:all:",
            "--no-input",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "-r",
            str(tmp / "requirements.txt"),
        ]
        _run(install, tmp, f"installing the Python clients of e2b {e2b_version}")

    return _python_env(_materialize(final, build), e2b_version, pins)


def ensure_node_clients(version: str | None = None, cache_root: Path | None = None) -> NodeClients:
    """The ``node_modules`` of the JS clients locked for e2b ``version`` (None: the pin), built on first use."""
    project = _node_lock(version)
    manifests = {name: (project / name).read_bytes() for name in NODE_MANIFESTS}
    dependencies = json.loads(manifests["package.json"])["dependencies"]
    e2b_version = _e2b_pin(dependencies, project / "package.json", version)
    final = (cache_root if cache_root is not None else default_cache_root()) / "clients" / "node"
    final /= _key(*manifests.values())

    def build(tmp: Path) -> None:
        npm = _npm()  # checked inside the build so a cached environment needs no npm
        for name, data in manifests.items():
            (tmp / name).write_bytes(data)
        cmd = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier"]
        _run(cmd, tmp, f"installing the JS clients of e2b {e2b_version}")

    packages = tuple((name, str(dependencies[name])) for name in NODE_CLIENTS if name in dependencies)
    return NodeClients(root=_materialize(final, build), version=e2b_version, packages=packages)


def _pins(requirements: str) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by lower-case name."""
    return {m[1].lower(): m[2] for m in map(_PIN.match, requirements.splitlines()) if m}


def _record_digest(data: bytes) -> str:
    # RECORD's form: urlsafe base64 without padding (the wheel specification).
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def verify_python_clients(env: PythonClients) -> list[str]:
    """Paths (relative to site-packages) of the clients' installed files that differ or are missing."""
    pins = _pins(_python_lock(env.version).read_text(encoding="utf-8"))
    problems: list[str] = []
    for name in (name for name in PYTHON_CLIENTS if name in pins):
        record = f"{name.replace('-', '_')}-{pins[name]}.dist-info/RECORD"
        try:
            rows = list(csv.reader(io.StringIO((env.site_packages / record).read_text(encoding="utf-8"))))
        except OSError:
            problems.append(record)
            continue
        for row in rows:
            # RECORD lists itself and the .pyc files pip compiled without a hash: those are
            # not from the wheel, so there is nothing to compare them with.
            if len(row) < 2 or not row[1]:
                continue
            try:
                data = (env.site_packages / row[0]).read_bytes()
            except OSError:
                problems.append(row[0])
                continue
            if _record_digest(data) != row[1]:
                problems.append(row[0])
    return problems


def _sri_sha512(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def _compare_tarball(tarball: bytes, installed: Path, shown_as: str) -> list[str]:
    problems: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        for member in archive:
            if not member.isfile():
                continue
            # npm drops the first path component ("package/" by convention) on install.
            relative = member.name.split("/", 1)[-1]
            source = archive.extractfile(member)
            expected = source.read() if source is not None else b""
            try:
                same = (installed / relative).read_bytes() == expected
            except OSError:
                same = False
            if not same:
                problems.append(f"{shown_as}/{relative}")
    return problems


def verify_node_clients(env: NodeClients) -> list[str]:
    """Paths (relative to ``env.root``) of the clients' installed files that differ or are missing.

    Each client's registry tarball is fetched again with ``npm pack`` and must match the
    committed integrity before its files are compared with the installed ones.
    """
    lock = json.loads((_node_lock(env.version) / "package-lock.json").read_text(encoding="utf-8"))
    clients = [name for name in NODE_CLIENTS if f"node_modules/{name}" in lock["packages"]]
    npm = _npm()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="e2b-compat-npm-pack-") as tmp:
        for index, name in enumerate(clients):
            entry = lock["packages"][f"node_modules/{name}"]
            spec = f"{name}@{entry['version']}"
            dest = Path(tmp) / str(index)  # one folder each: the single .tgz in it is the one
            dest.mkdir()
            _run(
                [npm, "pack", spec, "--pack-destination", str(dest), "--silent", "--ignore-scripts"],
                dest,
                f"npm pack {spec}",
            )
            tarballs = sorted(dest.glob("*.tgz"))
            if len(tarballs) != 1:
                raise ClientEnvironmentError(f"npm pack {spec} produced {[p.name for p in tarballs]}")
            data = tarballs[0].read_bytes()
            if _sri_sha512(data) != entry["integrity"]:
                raise ClientEnvironmentError(
                    f"npm pack {spec} gave {_sri_sha512(data)}, not the locked {entry['integrity']}"
                )
            problems += _compare_tarball(data, env.root / "node_modules" / name, f"node_modules/{name}")
    return problems
