"""The boot images' folder and rules (``runtime._boot_images``), without sandboxes.

Restoring them in real sandboxes is test_crun_boot_images.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from runtime import _boot_images
from runtime._boot_images import BootImages, image_key, why_not_eligible

_BASE = {
    "template": "base",
    "lowers": ["/t/base-1/rootfs"],
    "command": ["python", "-m", "runtime.agent"],
    "runtime": "/c",
}


def _key(**changes: object) -> str:
    given = {**_BASE, **changes}
    options = given.pop("options", {"share_agent_memory": True})
    assert isinstance(options, dict)
    return image_key(given["template"], given["lowers"], given["command"], given["runtime"], **options)  # type: ignore[arg-type]


def test_the_key_covers_everything_the_images_depend_on(monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key()
    assert key == _key(), "the same inputs, the same images"
    assert len({key, *(_key(**{name: value}) for name, value in _changes().items())}) == 1 + len(_changes())
    monkeypatch.setattr(_boot_images, "_boot_id", lambda: "another boot")
    assert _key() != key, "a host restart makes them again"


def _changes() -> dict[str, object]:
    return {
        "template": "other",
        "lowers": ["/t/base-2/rootfs"],  # the template rebuilt
        "command": ["python", "-I", "-m", "runtime.agent"],
        "runtime": "/other-tools/crun",
        "options": {"share_agent_memory": False},
    }


@pytest.mark.parametrize(
    ("template", "command", "volumes", "why"),
    [
        ("base", ["python", "-m", "runtime.agent"], [], None),
        ("snap-0123", ["python", "-m", "runtime.agent"], [], "continues its own processes"),
        ("code-interpreter-v1", ["python", "-m", "runtime.agent", "--service", "49999=x"], [], "services"),
        ("base", ["python", "-m", "runtime.agent"], [{"source": "/v", "target": "/data"}], "volumes"),
    ],
)
def test_only_plain_agents_without_volumes_restore_boot_images(
    template: str, command: list[str], volumes: list[object], why: str | None
) -> None:
    found = why_not_eligible(template, command, volumes)
    assert found is None if why is None else why in (found or "")


def test_images_are_found_only_once_complete_and_a_new_key_replaces_the_templates_old_one(tmp_path: Path) -> None:
    images = BootImages(tmp_path)
    assert stat.S_IMODE(images.root.stat().st_mode) == 0o700, "only root reads the images"
    assert images.find("k1") is None
    building = images.build_folder("k1")
    (building / "memory").mkdir()
    (building / "memory" / "pages-1.img").write_bytes(b"x")
    assert images.find("k1") is None, "a build is never found"
    assert images.commit(building, "k1", "base") == images.root / "k1" / "memory"
    assert images.find("k1") == images.root / "k1" / "memory"
    other = images.build_folder("o1")
    (other / "memory").mkdir()
    images.commit(other, "o1", "other")
    newer = images.build_folder("k2")
    (newer / "memory").mkdir()
    images.commit(newer, "k2", "base")
    assert images.names() == ["k2", "o1"], "base's old images went, another template's stayed"
    images.drop("k2")
    assert images.find("k2") is None
    assert images.names() == ["o1"]
    images.drop("never-made")  # nothing to drop: no error


def test_complete_images_are_never_replaced_and_broken_ones_are(tmp_path: Path) -> None:
    """Starts may be linking a key's images at any moment: a second make of the key keeps the first."""
    images = BootImages(tmp_path)
    first = images.build_folder("k1")
    (first / "memory").mkdir()
    (first / "memory" / "pages-1.img").write_bytes(b"first")
    inode = (images.commit(first, "k1", "base") / "pages-1.img").stat().st_ino
    second = images.build_folder("k1")
    (second / "memory").mkdir()
    (second / "memory" / "pages-1.img").write_bytes(b"second")
    kept = images.commit(second, "k1", "base")
    assert (kept / "pages-1.img").stat().st_ino == inode, "the same files, not a replaced folder"
    assert (kept / "pages-1.img").read_bytes() == b"first"
    assert not second.exists(), "the second build went"
    (images.root / "k1" / "manifest.json").unlink()  # broken: find() never returns it, so nobody reads it
    assert images.find("k1") is None
    third = images.build_folder("k1")
    (third / "memory").mkdir()
    (third / "memory" / "pages-1.img").write_bytes(b"third")
    assert (images.commit(third, "k1", "base") / "pages-1.img").read_bytes() == b"third"
    assert [p.name for p in images.root.iterdir()] == ["k1"]


def test_what_a_crash_left_mid_way_is_removed(tmp_path: Path) -> None:
    images = BootImages(tmp_path)
    (images.build_folder("k1") / "memory").mkdir()
    (images.root / ".k0.dropped").mkdir()
    kept = images.build_folder("k2")
    (kept / "memory").mkdir()
    images.commit(kept, "k2", "base")
    (images.build_folder("k3") / "memory").mkdir()
    assert sorted(images.remove_partial(busy=["k3"])) == [".k0.dropped", ".k1.build"], "k3 is being made"
    assert images.remove_partial() == (".k3.build",)
    assert images.names() == ["k2"]
    assert [p.name for p in images.root.iterdir()] == ["k2"]
