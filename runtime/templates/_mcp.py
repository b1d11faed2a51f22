"""The ``mcp`` layer and the ``mcp-gateway`` template built from it and ``base``.

``mcp`` holds the MCP SDK's locked environment in ``/opt/e2b-compat/mcp`` (``mcp-gateway.in`` and
its lock, installed with ``--require-hashes``), installed on an overlay over ``os`` and kept as
the overlay's upper folder (``_layers``), so it is built once per lock. ``mcp-gateway`` is a copy
of ``base`` with that layer on it, the gateway package copied from the agent's installed sources
into the SDK's environment (so it runs with the SDK's locked dependencies, not the agent's), and
``/usr/local/bin/mcp-gateway``, the command the clients run. The template's agent is ``base``'s.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from . import _keys
from ._commands import TemplateError, in_root, remove_tree, replace_file, run
from ._layers import apply_marks, settle_upper
from ._progress import Progress, step

__all__ = ["build_layer", "build_template"]

_WHEELHOUSE = "/tmp/e2b-compat-wheelhouse"  # noqa: S108 (inside the rootfs, removed again)
_CHECK = f"import {_keys.MCP_PACKAGE}._gateway, {_keys.MCP_PACKAGE}._cli"
_SOURCE = "runtime/mcp_gateway"


def _site_packages(rootfs: Path, venv: str) -> Path:
    found = sorted((rootfs / venv.lstrip("/")).glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise TemplateError(f"expected one site-packages folder in {venv}, found {len(found)}")
    return found[0]


def build_layer(tmp: Path, os_rootfs: Path, wheelhouse: Path, progress: Progress) -> dict[str, object]:
    """The MCP SDK's venv, installed from the locked wheels on an overlay over ``os``; the upper folder is kept."""
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "merged"
    for folder in (upper, work, merged):
        folder.mkdir()
    upper.chmod(0o755)
    venv = _keys.MCP_VENV
    options = f"lowerdir={os_rootfs},upperdir={upper},workdir={work}"
    run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], "mounting an overlay over the os layer")
    try:
        with step(progress, f"creating {venv}"):
            in_root(merged, ["python3", "-m", "venv", venv], "creating the MCP SDK's virtualenv")
        inside = merged / _WHEELHOUSE.lstrip("/")
        shutil.copytree(wheelhouse, inside)
        wheels = sorted(path.name for path in inside.glob("*.whl"))
        with step(progress, f"installing {len(wheels)} locked wheels into {venv} (--require-hashes)") as out:
            install = [f"{venv}/bin/pip", "install", "--no-index", "--find-links", _WHEELHOUSE, "--require-hashes"]
            flags = ["--only-binary=:all:", "--no-cache-dir", "--no-input", "--disable-pip-version-check"]
            in_root(
                merged,
                [*install, *flags, "-r", f"{_WHEELHOUSE}/kernels.lock"],
                "pip install of the MCP lock",
                detail=out,
            )
            shutil.rmtree(inside)
        in_root(merged, [f"{venv}/bin/python", "-c", "import mcp.server.lowlevel, uvicorn"], "importing the MCP SDK")
    finally:
        remove_tree(merged)  # unmounts first
    marks = settle_upper(upper)
    remove_tree(work)
    upper.rename(tmp / "rootfs")
    return {"mcp_wheels": wheels, **marks}


def _command() -> bytes:
    return f'#!/bin/sh\nexec {_keys.MCP_VENV}/bin/python -m {_keys.MCP_PACKAGE} "$@"\n'.encode()


def build_template(tmp: Path, base_rootfs: Path, layer_rootfs: Path, layer_metadata: Path, progress: Progress) -> None:
    """``mcp-gateway``: ``base``, the ``mcp`` layer, the gateway package and its command."""
    rootfs = tmp / "rootfs"
    with step(progress, "copying base, then the mcp layer onto it"):
        run(["cp", "-a", "--reflink=auto", str(base_rootfs), str(rootfs)], "copying the base layer")
        run(["cp", "-a", "--reflink=auto", f"{layer_rootfs}/.", str(rootfs)], "copying the mcp layer")
        apply_marks(rootfs, layer_rootfs, layer_metadata)
    with step(progress, f"adding the gateway ({_keys.MCP_PACKAGE}) and {_keys.MCP_COMMAND}"):
        source = _site_packages(rootfs, _keys.VENV) / _SOURCE
        if not (source / "__main__.py").is_file():
            raise TemplateError(f"the base layer's agent has no {_SOURCE} package")
        target = _site_packages(rootfs, _keys.MCP_VENV) / _keys.MCP_PACKAGE
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        replace_file(rootfs / _keys.MCP_COMMAND.lstrip("/"), _command(), 0o755)
        in_root(rootfs, [f"{_keys.MCP_VENV}/bin/python", "-c", _CHECK], "importing the gateway with the MCP SDK")
        in_root(rootfs, [_keys.MCP_COMMAND, "--help"], "running mcp-gateway --help")
