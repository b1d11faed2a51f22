"""Templates from images: digest pinning, blob verification, and the agent's injection, safe on hostile trees.

The pure parts run everywhere with a stand-in for skopeo. As root, a real registry (``conformance._registry``)
is pulled from: the unpacked rootfs has the layers' whiteouts applied, and the injected agent
imports and runs through its own loader in a rootfs that has no Python of its own.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from runtime.templates import (
    ImageError,
    RegistryCredentials,
    RegistrySettings,
    Template,
    _images,
    ensure_template,
    import_image,
    parse_reference,
    templates_dir,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="unpacking owners and chroot need root")


class FakeSkopeo(_images._Session):
    """A session whose ``skopeo inspect --raw`` answers from a table of references → manifest bytes."""

    answers: dict[str, bytes]

    def stdout(self, *args: str, what: str) -> bytes:
        return self.answers[args[-1].removeprefix("docker://")]


def _session(tmp_path: Path, answers: dict[str, bytes]) -> FakeSkopeo:
    session = FakeSkopeo(tmp_path, {}, tmp_path / "auth.json", ("hunter2",))
    object.__setattr__(session, "answers", answers)
    return session


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}).encode()


def test_a_tag_is_pinned_to_the_digest_of_the_manifest_it_names(tmp_path: Path) -> None:
    session = _session(tmp_path, {"r.example/a:1": MANIFEST})
    assert _images._resolve(session, parse_reference("r.example/a:1")) == _digest(MANIFEST)
    # Registries often answer indented JSON ending in a newline: the digest is of those bytes.
    pretty = json.dumps(json.loads(MANIFEST), indent=3).encode() + b"\r\n"
    session = _session(tmp_path, {"r.example/a:2": pretty})
    assert _images._resolve(session, parse_reference("r.example/a:2")) == _digest(pretty)


def test_the_manifest_is_read_byte_for_byte_from_skopeo(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "skopeo"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nprintf '{\\n  \"a\": 1\\n}\\n'\necho 'a warning' >&2\n")
    tool.chmod(0o755)
    session = _images._Session(tmp_path, {"PATH": str(tool.parent)}, tmp_path / "auth.json", ())
    assert session.stdout("inspect", "--raw", "docker://r/a:1", what="reading") == b'{\n  "a": 1\n}\n'


def test_an_index_is_narrowed_to_this_platform(tmp_path: Path) -> None:
    amd64, arm64 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    index = {
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"digest": arm64, "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": amd64, "platform": {"os": "linux", "architecture": "amd64"}},
        ],
    }
    session = _session(tmp_path, {"r.example/a:1": json.dumps(index).encode()})
    assert _images._resolve(session, parse_reference("r.example/a:1")) == amd64
    index["manifests"] = index["manifests"][:1]
    session = _session(tmp_path, {"r.example/a:1": json.dumps(index).encode()})
    with pytest.raises(ImageError, match="has no image for linux/amd64"):
        _images._resolve(session, parse_reference("r.example/a:1"))


def test_a_manifest_that_is_not_the_digest_asked_for_is_refused(tmp_path: Path) -> None:
    asked = "r.example/a@sha256:" + "3" * 64
    session = _session(tmp_path, {asked: MANIFEST})
    with pytest.raises(ImageError, match="whose digest is"):
        _images._resolve(session, parse_reference(asked))


def test_errors_never_carry_the_password(tmp_path: Path) -> None:
    session = _session(tmp_path, {})
    scrubbed = session.scrub('msg="unauthorized for hunter2" Authorization: Basic xyz')
    assert "hunter2" not in scrubbed
    assert "xyz" not in scrubbed


def _layout(folder: Path, blobs: list[bytes]) -> Path:
    (folder / "blobs/sha256").mkdir(parents=True)
    for data in blobs:
        (folder / "blobs/sha256" / hashlib.sha256(data).hexdigest()).write_bytes(data)
    manifest = blobs[-1]
    index = {"manifests": [{"digest": _digest(manifest), "size": len(manifest)}]}
    (folder / "index.json").write_text(json.dumps(index))
    return folder


def test_every_blob_of_the_pulled_layout_is_hashed_again(tmp_path: Path) -> None:
    layer, manifest = b"layer bytes", json.dumps({"layers": []}).encode()
    layout = _layout(tmp_path / "layout", [layer, manifest])
    assert _images._verify_layout(layout) == {"layers": []}
    (layout / "blobs/sha256" / hashlib.sha256(layer).hexdigest()).write_bytes(b"other bytes")
    with pytest.raises(ImageError, match="holds other bytes"):
        _images._verify_layout(layout)


def test_the_agent_is_never_written_through_an_images_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "opt").symlink_to(outside)  # a hostile image: /opt leads out of the rootfs
    with pytest.raises(ImageError, match="is not a folder"):
        _images.inject_agent(rootfs, tmp_path / "no-base")
    assert list(outside.iterdir()) == []
    (rootfs / "opt").unlink()
    (rootfs / "etc").mkdir()
    (rootfs / "etc/passwd").symlink_to(outside / "passwd")
    with pytest.raises(ImageError, match="is a symlink"):
        _images._add_user(rootfs)
    assert not (outside / "passwd").exists()


def test_the_sandbox_user_is_added_once_and_only_when_missing(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    if os.geteuid() != 0:
        pytest.skip("the new home is given to uid 1000 (chown needs root)")
    _images._add_user(rootfs)
    _images._add_user(rootfs)
    assert (rootfs / "etc/passwd").read_text().splitlines() == [
        "root:x:0:0:root:/root:/bin/sh",
        "user:x:1000:1000::/home/user:/bin/sh",
    ]
    assert (rootfs / "etc/group").read_text().splitlines() == ["root:x:0:", "user:x:1000:"]
    assert (rootfs / "home/user").stat().st_uid == 1000


@needs_root
@pytest.mark.artifacts
def test_a_pulled_image_is_unpacked_with_its_whiteouts_and_runs_our_agent_without_a_python_of_its_own() -> None:
    from conformance._registry import changes_layer, local_registry, push_image, userland_layer

    # A layer of this run's own, so the pull is never answered from an earlier run's cache.
    unique = tarfile.TarInfo(f"srv/run-{uuid.uuid4().hex}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(unique, io.BytesIO(b""))
    layers = [userland_layer(ensure_template("os").rootfs), changes_layer(), buffer.getvalue()]
    with local_registry(username="u", password="p4ss") as registry:
        pushed = push_image(registry, "team/tiny", "1", layers, env={"IMAGE_VAR": "x"})
        lines: list[str] = []
        pulled = import_image(pushed.reference, credentials=RegistryCredentials("u", "p4ss"), say=lines.append)
        assert pulled.digest == pushed.digest
        assert pulled.config.env == (("IMAGE_VAR", "x"),)
        assert any("Verified 3 layer(s)" in line for line in lines)
        again = import_image(pushed.reference, credentials=RegistryCredentials("u", "p4ss"))
        assert again.cached
        assert again.name == pulled.name
        with pytest.raises(ImageError) as refused:
            import_image(pushed.reference, credentials=RegistryCredentials("u", "wrong-p4ss"))
        assert "wrong-p4ss" not in str(refused.value)
        assert "authentication required" in str(refused.value) or "unauthorized" in str(refused.value)
    template = ensure_template(pulled.name)
    try:
        _check_unpacked(template)
    finally:
        shutil.rmtree(template.path)  # this run's own image: nothing else uses it


def _check_unpacked(template: Template) -> None:
    rootfs = template.rootfs
    assert not (rootfs / "etc/motd").exists()  # the whiteout
    assert sorted(p.name for p in (rootfs / "opt/old").iterdir()) == ["kept.txt"]  # the opaque folder
    assert (rootfs / "srv/greeting.txt").stat().st_uid == 1234
    assert not (rootfs / "usr/bin/python3").exists()
    loader, *rest = template.agent_command[: template.agent_command.index("-m")]
    probe = "import runtime.agent, sys; print(sys.prefix)"
    shown = subprocess.run(
        ["/usr/sbin/chroot", str(rootfs), loader, *rest, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={},
    )
    assert shown.stdout.strip() == f"{_images.IMAGE_AGENT}/venv"
    assert template.path.parent == templates_dir()


def test_settings_default_to_no_mirrors() -> None:
    assert RegistrySettings().mirrors == {}


def test_a_failed_pull_says_skopeos_reason_without_our_command_line_or_the_password(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "skopeo"
    tool.parent.mkdir()
    tool.write_text(
        '#!/bin/sh\necho \'time="t" level=warning msg="retrying"\'\n'
        'echo \'time="t" level=fatal msg="reading manifest 1 in r/a: unauthorized: bad hunter2 \\"x\\""\'\nexit 1\n'
    )
    tool.chmod(0o755)
    session = _images._Session(tmp_path, {"PATH": str(tool.parent)}, tmp_path / "auth.json", ("hunter2",))
    with pytest.raises(ImageError) as caught:
        session.skopeo("inspect", "docker://r/a:1", what="reading r/a:1")
    assert str(caught.value) == 'reading r/a:1: reading manifest 1 in r/a: unauthorized: bad *** "x"'


def test_folders_of_killed_pulls_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    old, live = tmp_path / ".image-pull-old", tmp_path / ".image-pull-live"
    for folder in (old, live):
        (folder / "session").mkdir(parents=True)
        (folder / "session" / "auth.json").write_text("{}")
    os.utime(old, (1_000_000, 1_000_000))
    _images.sweep_pulls(tmp_path)
    assert not old.exists()
    assert live.exists()
