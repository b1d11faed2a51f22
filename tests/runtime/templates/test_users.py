"""Pruning never removes a template a sandbox record or snapshot manifest of a registered backend names."""

from __future__ import annotations

import json
import os
from pathlib import Path

from runtime.templates import list_templates, prune_templates, register_template_user
from runtime.templates._users import USERS, lowers_in_use


def _templates(cache: Path, count: int) -> list[Path]:
    rootfs = []
    for index in range(count):
        folder = cache / "templates" / f"base-{index:016x}"
        (folder / "rootfs").mkdir(parents=True)
        meta = folder / "template.json"
        meta.write_text(json.dumps({"name": "base", "key": f"{index:064x}", "agent_command": ["x"]}))
        os.utime(meta, (1_000_000 + index, 1_000_000 + index))
        rootfs.append(folder / "rootfs")
    return rootfs


def _write(path: Path, lowers: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"lowers": lowers}))


def test_prune_keeps_templates_that_stopped_sandboxes_and_snapshots_use(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rootfs = _templates(cache, 5)
    state = tmp_path / "server-data"
    # A filesystem-paused sandbox (nothing mounted), a snapshot, and a sandbox set aside after a restart.
    _write(state / "sandboxes" / "a" / "record.json", [str(rootfs[0])])
    _write(state / "snapshots" / "snap-1" / "manifest.json", [str(state / "snapshots/snap-1/upper"), str(rootfs[1])])
    _write(state / "quarantine" / "b" / "record.json", [str(rootfs[2])])
    register_template_user(cache / "templates", state)
    removed = prune_templates(cache, keep=1)
    assert [p.name for p in removed] == ["base-0000000000000003"]
    assert [t.path.name for t in list_templates(cache)] == [f"base-{i:016x}" for i in (0, 1, 2, 4)]


def test_without_the_users_pruning_would_remove_them(tmp_path: Path) -> None:
    """The same cache with nobody registered: the old templates go (the mount check alone sees nothing)."""
    cache = tmp_path / "cache"
    _templates(cache, 3)
    assert len(prune_templates(cache, keep=1)) == 2


def test_a_user_whose_folder_is_gone_is_forgotten(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rootfs = _templates(cache, 2)
    state = tmp_path / "deleted-data"
    _write(state / "sandboxes" / "a" / "record.json", [str(rootfs[0])])
    register_template_user(cache / "templates", state)
    register_template_user(cache / "templates", state)  # registering again changes nothing
    assert len(list((cache / "templates" / USERS).iterdir())) == 1
    (state / "sandboxes" / "a" / "record.json").unlink()
    (state / "sandboxes" / "a").rmdir()
    (state / "sandboxes").rmdir()
    state.rmdir()
    assert lowers_in_use(cache / "templates") == set()
    assert list((cache / "templates" / USERS).iterdir()) == []
    assert [p.name for p in prune_templates(cache, keep=1)] == ["base-0000000000000000"]


def test_an_unreadable_record_prunes_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _templates(cache, 3)
    state = tmp_path / "server-data"
    (state / "sandboxes" / "a").mkdir(parents=True)
    (state / "sandboxes" / "a" / "record.json").write_text("{not json")
    register_template_user(cache / "templates", state)
    assert lowers_in_use(cache / "templates") is None
    assert prune_templates(cache, keep=1) == []
    assert len(list_templates(cache)) == 3


def test_templates_a_live_server_serves_are_kept_until_it_ends(tmp_path: Path) -> None:
    """A server with no sandboxes yet still serves its templates: another build must not prune them."""
    cache = tmp_path / "cache"
    rootfs = _templates(cache, 3)
    state = tmp_path / "server-data"
    (state / "sandboxes").mkdir(parents=True)
    register_template_user(cache / "templates", state, serving=[str(rootfs[0])])
    assert lowers_in_use(cache / "templates") == {os.path.realpath(rootfs[0])}
    assert [p.name for p in prune_templates(cache, keep=1)] == ["base-0000000000000001"]
    # The same entry written by a process that has ended: its templates are no longer served.
    entry = next((cache / "templates" / USERS).iterdir())
    value = json.loads(entry.read_text())
    entry.write_text(json.dumps({**value, "started": -1}))
    assert lowers_in_use(cache / "templates") == set()
    assert [p.name for p in prune_templates(cache, keep=1)] == ["base-0000000000000000"]
