"""Boot images: a template's agent, started once and checkpointed, restored for each new sandbox.

A create without a warm sandbox spends most of its time starting the agent (Python and some 440
modules: ~150 of the ~250 ms from ``crun create`` to ``/health``). Where the backend can restore
CRIU checkpoints, it starts one private sandbox per template (its id begins with ``BOOT_PREFIX``,
which the server's ids never do), checkpoints it once its agent answers and before anything was
asked of it, and keeps the images here. Each later first start of a sandbox of that template
continues those processes instead of booting: the images are linked into the sandbox's folder
and made its own (id range, hostname: ``_criu_images``), as a memory snapshot's are.

What the images hold is the same in every sandbox of the template: an agent that has served no
request (no token, no environment; ``/init`` brings both, and the sandbox's ids from
``/run/e2b``). Nothing of a tenant is ever in them; what stays of the private sandbox is its id
in the init's and the agent's environment (``/proc/<pid>/environ``, the sandbox's root reads it).
Only the plain agent qualifies: a template whose agent starts services (the code interpreter's
kernels, the MCP gateway) holds connections between its processes, which a checkpoint closes
(CRIU's ``tcp-close``), and a sandbox with volumes has mounts the images do not. Those boot as
before.

Per backend, under ``<state>/boot-images/``::

    <key>/manifest.json   the template's name and the key
    <key>/memory/         CRIU's images of the booted sandbox
    .<key>.build/         an image being made; renamed to <key>/ when complete (a crash leaves it)

The key hashes everything the images depend on: the template's layers and agent command, the
checkpoint tools, the kernel and its boot, and the options that change the agent's start. A
rebuilt template, new tools or a host restart make a new key; images of the same template under
another key are removed when the new ones are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["BOOT_PREFIX", "BootImages", "image_key", "why_not_eligible"]

BOOT_PREFIX = "boot-"  # the backend's own sandboxes that boot images are made from
_FOLDER = "boot-images"
_MEMORY = "memory"
_MANIFEST = "manifest.json"
_AGENT_SERVICE_FLAG = "--service"  # runtime.agent's option for a template service


def image_key(template: str, lowers: Sequence[str], command: Sequence[str], runtime: str, **options: object) -> str:
    """The images' name: a hash of what they depend on (``runtime`` names the CRIU and crun used)."""
    covered = {
        "template": template,
        "lowers": list(lowers),
        "command": list(command),
        "runtime": runtime,
        "kernel": os.uname().release,
        # The agent's timers count on the clock it was checkpointed under: after a host restart the
        # monotonic clock starts again from zero, so the images are made again for each boot.
        "boot": _boot_id(),
        "options": {name: options[name] for name in sorted(options)},
    }
    return hashlib.sha256(json.dumps(covered, sort_keys=True).encode()).hexdigest()[:24]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def why_not_eligible(template: str, command: Sequence[str], volumes: Iterable[object]) -> str | None:
    """Why a sandbox of ``template`` boots rather than restoring a boot image, or None when it may restore."""
    if template.startswith("snap-"):
        return "a snapshot continues its own processes"
    if _AGENT_SERVICE_FLAG in command:
        return "its agent starts services, whose connections a checkpoint would close"
    if any(True for _ in volumes):
        return "its volumes are mounts the images do not have"
    return None


class BootImages:
    """The backend's folder of boot images: find, make (through a build folder), drop, prune."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / _FOLDER
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # as snapshots: only root reads the images

    def find(self, key: str) -> Path | None:
        """The images under ``key`` when complete, else None."""
        images = self.root / key / _MEMORY
        return images if (self.root / key / _MANIFEST).is_file() and images.is_dir() else None

    def build_folder(self, key: str) -> Path:
        """An empty folder to make the images in (``<folder>/memory``), replacing one a failed attempt left."""
        building = self.root / f".{key}.build"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(mode=0o700)
        return building

    def commit(self, building: Path, key: str, template: str) -> Path:
        """The images in ``building`` become ``key``'s, with their manifest; other images of the template go."""
        target = self.root / key
        if self.find(key) is not None:
            # Complete images are never replaced: starts may be linking them right now.
            shutil.rmtree(building, ignore_errors=True)
            return target / _MEMORY
        (building / _MANIFEST).write_text(json.dumps({"template": template, "key": key}, indent=1))
        self.drop(key)  # a broken one (no manifest): nobody reads it
        os.rename(building, target)
        for other in self.root.iterdir():
            if other.name != key and not other.name.startswith(".") and self._template_of(other) == template:
                shutil.rmtree(other, ignore_errors=True)  # made for a template since rebuilt
        return target / _MEMORY

    def drop(self, key: str) -> None:
        """Images that failed to restore go; the next cold start of their template makes them again."""
        gone = self.root / f".{key}.dropped"
        try:
            os.rename(self.root / key, gone)
        except OSError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def remove_partial(self, busy: Iterable[str] = ()) -> tuple[str, ...]:
        """What a crash left mid-way (builds, drops): nothing reads those. ``busy``: keys being made now."""
        removed = []
        skipped = {f".{key}.build" for key in busy}
        for partial in self.root.glob(".*"):
            if partial.name in skipped:
                continue
            shutil.rmtree(partial, ignore_errors=True)
            removed.append(partial.name)
        return tuple(removed)

    def names(self) -> list[str]:
        """The keys of the images kept."""
        return sorted(p.name for p in self.root.iterdir() if not p.name.startswith("."))

    @staticmethod
    def _template_of(folder: Path) -> str | None:
        try:
            template = json.loads((folder / _MANIFEST).read_text())["template"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return template if isinstance(template, str) else None
