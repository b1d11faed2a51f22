"""Layers that hold only what an installation added on ``os``: the upper folder of an overlay.

A layer such as ``kernels`` or ``mcp`` is installed on an overlay over the ``os`` layer, and its
upper folder is kept: copying it onto a copy of ``base`` takes seconds, where installing again
after every change of the project's code would take minutes. ``settle_upper`` turns the upper
folder into a plain tree (its whiteouts and opaque marks become lists in the layer's metadata),
and ``apply_marks`` replays those removals on the copy it is put on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

__all__ = ["apply_marks", "settle_upper"]

_WHITEOUT = 0  # an overlay upper folder marks a removed lower file as a 0:0 character device
_OPAQUE = "trusted.overlay.opaque"


def settle_upper(upper: Path) -> dict[str, list[str]]:
    """Turn an overlay upper folder into a plain tree: whiteouts and opaque marks become lists."""
    deleted: list[str] = []
    opaque: list[str] = []
    for dirpath, dirnames, filenames in os.walk(upper):
        here = Path(dirpath)
        with contextlib.suppress(OSError):
            if os.getxattr(here, _OPAQUE, follow_symlinks=False) == b"y":
                opaque.append("/" + str(here.relative_to(upper)))
                os.removexattr(here, _OPAQUE, follow_symlinks=False)
        for name in (*filenames, *dirnames):
            path = here / name
            info = os.lstat(path)
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == _WHITEOUT:
                deleted.append("/" + str(path.relative_to(upper)))
                path.unlink()
    return {"deleted": sorted(deleted), "opaque": sorted(opaque)}


def apply_marks(rootfs: Path, layer: Path, metadata: Path) -> None:
    """What a layer (its rootfs ``layer``, its ``template.json``) removed from ``os``, removed from ``rootfs`` too."""
    meta = json.loads(metadata.read_text(encoding="utf-8"))
    for path in meta.get("deleted", []):
        target = rootfs / str(path).lstrip("/")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    for path in meta.get("opaque", []):  # a folder made anew: only what the layer has stays
        relative = str(path).lstrip("/")
        keep = {entry.name for entry in (layer / relative).iterdir()}
        for entry in (rootfs / relative).iterdir():
            if entry.name not in keep:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
