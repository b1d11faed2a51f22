"""Which templates of a cache are still in use: pruning must never take a layer from under a sandbox.

A mount check alone is not enough: a filesystem-paused sandbox, one whose mounts a host restart
took, and a snapshot (whose manifest names its template) all need the template while nothing is
mounted, and an idmapped bind hides the template's path from the mount table anyway. So every
backend that takes templates from a cache registers its state folder there::

    <cache>/templates/.users/<sha256 of the state folder, 16 hex>
        {"state_dir": <absolute path>, "serving": [<rootfs>...], "pid": N, "started": <ticks>}

and pruning reads, for every registered folder, the overlay lowers its sandbox records
(``sandboxes/*/record.json``, ``quarantine/*/record.json``) and snapshot manifests
(``snapshots/*/manifest.json``) name, which is the layout of ``runtime._oci_backend``. This covers
every server and test on the host that shares the cache, not only one data folder. A registered
folder that no longer exists is unregistered; a file that cannot be read makes the answer "cannot
tell" (None), and then nothing is pruned.

A server with no sandboxes yet still needs the templates it serves: the entry also names them
(``serving``) with the process that serves them (pid and its start time, so a reused pid is not
taken for it), and they count as used while that process lives. An entry of a plain path (the
older form) is read as a folder serving nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from runtime.host import process_start_time

__all__ = ["USERS", "lowers_in_use", "register_user"]

USERS = ".users"
_LAYOUT = ("sandboxes/*/record.json", "quarantine/*/record.json", "snapshots/*/manifest.json")


def register_user(templates_folder: Path, state_dir: Path, serving: Iterable[str] = ()) -> None:
    """Record that the backend keeping its state in ``state_dir`` uses templates of ``templates_folder``.

    ``serving``: the rootfs paths this process serves now (kept from pruning while it runs).
    """
    owner = str(state_dir.absolute())
    entry_value = {
        "state_dir": owner,
        "serving": sorted(serving),
        "pid": os.getpid(),
        "started": process_start_time(os.getpid()),
    }
    folder = templates_folder / USERS
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / hashlib.sha256(owner.encode()).hexdigest()[:16]
    text = json.dumps(entry_value, sort_keys=True)
    if entry.is_file() and entry.read_text(encoding="utf-8") == text:
        return
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, entry)  # atomic: a reader never sees half an entry


def _read_entry(entry: Path) -> tuple[Path, list[str]]:
    """An entry's state folder and the rootfs paths its live process serves."""
    text = entry.read_text(encoding="utf-8")
    if not text.startswith("{"):
        return Path(text), []
    value = json.loads(text)
    pid, started = value.get("pid"), value.get("started")
    alive = isinstance(pid, int) and started is not None and process_start_time(pid) == started
    return Path(value["state_dir"]), [str(path) for path in value.get("serving", [])] if alive else []


def lowers_in_use(templates_folder: Path) -> set[str] | None:
    """Every overlay lower a registered user's sandboxes, snapshots and live servers name (real paths).

    None: cannot tell.
    """
    folder = templates_folder / USERS
    if not folder.is_dir():
        return set()
    found: set[str] = set()
    try:
        for entry in folder.iterdir():
            if entry.name.startswith("."):
                continue
            state_dir, serving = _read_entry(entry)
            found.update(os.path.realpath(path) for path in serving)
            if not state_dir.is_dir():  # a deleted data folder (a test's): nothing of it uses a template
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
                continue
            for pattern in _LAYOUT:
                for path in state_dir.glob(pattern):
                    with contextlib.suppress(FileNotFoundError):  # killed or deleted meanwhile
                        lowers = json.loads(path.read_text(encoding="utf-8"))["lowers"]
                        found.update(os.path.realpath(str(lower)) for lower in lowers)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found
