"""Locked Python environments in templates: the kernels' in ``code-interpreter-v1``, the MCP gateway's.

What the kernels can import is fixed by two committed files beside this module:

- ``kernels.in``: the packages asked for (ipykernel, numpy, pandas, matplotlib, pillow,
  e2b-charts for chart results, bash_kernel), each at an exact version;
- ``kernels.<python>-<machine>.lock``: everything they need, resolved by pip for the
  rootfs's python and this machine, one ``name==version --hash=sha256:…`` line each.

``mcp-gateway.in`` and ``mcp-gateway.<python>-<machine>.lock`` do the same for the MCP SDK the
gateway in ``mcp-gateway`` runs on (``WHEEL_LOCKS`` names both).

A build installs exactly the locked wheels with ``--require-hashes``, so the bytes in a
template are the locked bytes whatever index served them. The wheels are downloaded once
per lock into ``<cache>/wheels/<name>-<lock sha256[:16]>/`` and reused by every later
build. ``write_lock`` regenerates a lock from its ``.in`` (``e2b-compat template
lock-kernels`` does both) through pip's own resolver (``pip install --dry-run --report``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ._commands import TemplateError, run

__all__ = ["MCP_LOCK", "REQUIREMENTS", "WHEEL_LOCKS", "ensure_wheelhouse", "lock_path", "read_lock", "write_lock"]

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "kernels.in"
MCP_LOCK = "mcp-gateway"
# Every wheel lock's requirements, each locked per python and machine beside this module.
WHEEL_LOCKS = (REQUIREMENTS, HERE / f"{MCP_LOCK}.in")
_PIP = (sys.executable, "-m", "pip")
_QUIET = ("--no-input", "--disable-pip-version-check", "--quiet")


def lock_path(python: str | None = None, machine: str | None = None, *, name: str = "kernels") -> Path:
    """The lock ``name`` for ``python`` (``cp311``) on ``machine`` (default: this interpreter and machine)."""
    tag = python if python is not None else f"cp{sys.version_info[0]}{sys.version_info[1]}"
    return HERE / f"{name}.{tag}-{machine if machine is not None else platform.machine()}.lock"


def read_lock(path: Path | None = None) -> bytes:
    """The lock's bytes (its sha256 is part of the template's key)."""
    lock = path if path is not None else lock_path()
    try:
        return lock.read_bytes()
    except FileNotFoundError:
        raise TemplateError(
            f"no lock {lock.name} for this python and machine; create it with `e2b-compat template lock-kernels`"
        ) from None


def _lock_lines(report: Mapping[str, object]) -> list[str]:
    lines = []
    install = report.get("install")
    if not isinstance(install, list):
        raise TemplateError("pip's resolution report has no 'install' list")
    for item in install:
        name = item["metadata"]["name"]
        version = item["metadata"]["version"]
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            raise TemplateError(f"pip's report gives no sha256 for {name} {version}")
        lines.append(f"{name.lower()}=={version} --hash=sha256:{digest}")
    return sorted(lines)


def write_lock(requirements: Path = REQUIREMENTS, out: Path | None = None) -> Path:
    """Resolve ``requirements`` with pip (wheels only) and write the hashed lock; returns its path."""
    target = out if out is not None else lock_path(name=requirements.name.removesuffix(".in"))
    with tempfile.TemporaryDirectory(prefix="e2b-compat-lock-") as tmp:
        report = Path(tmp) / "report.json"
        resolve = [*_PIP, "install", "--dry-run", "--ignore-installed", "--only-binary=:all:", *_QUIET]
        run([*resolve, "--report", str(report), "-r", str(requirements)], f"resolving {requirements.name}")
        lines = _lock_lines(json.loads(report.read_text(encoding="utf-8")))
    header = (
        f"# Generated from {requirements.name} by `e2b-compat template lock-kernels` "
        f"(pip's resolver, wheels only) for {target.name.split('.', 1)[1].removesuffix('.lock')}.\n"
    )
    target.write_text(header + "\n".join(lines) + "\n", encoding="utf-8")
    return target


def ensure_wheelhouse(cache_root: Path, lock: bytes, *, name: str = "kernels") -> Path:
    """The folder holding every wheel of ``lock``, downloaded (hash-checked by pip) if absent.

    The lock itself is inside it as ``kernels.lock`` (whatever ``name``), which the builds install from."""
    digest = hashlib.sha256(lock).hexdigest()
    final = cache_root / "wheels" / f"{name}-{digest[:16]}"
    if (final / "complete").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        (tmp / "kernels.lock").write_bytes(lock)
        download = [*_PIP, "download", "--only-binary=:all:", "--no-deps", "--require-hashes", *_QUIET]
        # The host's pip settings say how to reach an index; a constraints file there
        # would only fight the exact pins.
        env = {**os.environ, "PIP_CONSTRAINT": ""}
        run(
            [*download, "--dest", str(tmp), "-r", str(tmp / "kernels.lock")],
            f"downloading the wheels of the {name} lock",
            env=env,
        )
        (tmp / "complete").write_text(digest + "\n", encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
