"""The newest tuple: a superset of the pinned envd descriptors, its additions listed, its outputs fingerprinted."""

from __future__ import annotations

import hashlib
import json

import pytest
from google.protobuf import descriptor_pb2

from contract import CONTRACT_DIR, ExtractionError, load_lock
from contract._newest import ADDITIONS, DESCRIPTORS, LOCK, MANIFEST, additions


def _set(rel: str) -> descriptor_pb2.FileDescriptorSet:
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString((CONTRACT_DIR / rel).read_bytes())
    return fds


def _pinned() -> descriptor_pb2.FileDescriptorSet:
    return _set("derived/envd.descriptor-set.binpb")


def _message(fds: descriptor_pb2.FileDescriptorSet, file: str, name: str) -> descriptor_pb2.DescriptorProto:
    proto = next(f for f in fds.file if f.name == file)
    return next(m for m in proto.message_type if m.name == name)


def test_the_committed_newest_set_adds_the_symlink_marks_and_nothing_else() -> None:
    found = additions(_pinned(), _set(DESCRIPTORS))
    assert found == [
        "enum value filesystem.FileType.FILE_TYPE_SYMLINK = 3",
        "field filesystem.EntryInfo.is_symlink = 12",
    ]
    listed = json.loads((CONTRACT_DIR / ADDITIONS).read_text())
    assert listed["additions"] == found
    assert listed["from"] == load_lock(CONTRACT_DIR / LOCK).artifact("py-e2b").version


def test_an_identical_set_adds_nothing() -> None:
    assert additions(_pinned(), _pinned()) == []


def test_a_renumbered_field_is_refused() -> None:
    newest = _pinned()
    entry = _message(newest, "filesystem/filesystem.proto", "EntryInfo")
    next(f for f in entry.field if f.name == "symlink_target").number = 99
    with pytest.raises(ExtractionError, match=r"field filesystem\.EntryInfo\.symlink_target: changed"):
        additions(_pinned(), newest)


def test_a_dropped_field_enum_value_or_method_is_refused() -> None:
    newest = _pinned()
    entry = _message(newest, "filesystem/filesystem.proto", "EntryInfo")
    del entry.field[0]
    proto = next(f for f in newest.file if f.name == "filesystem/filesystem.proto")
    del proto.enum_type[0].value[-1]
    del proto.service[0].method[0]
    with pytest.raises(ExtractionError) as refused:
        additions(_pinned(), newest)
    message = str(refused.value)
    assert "field filesystem.EntryInfo.name: dropped" in message
    assert "enum value filesystem.FileType." in message
    assert "method filesystem.Filesystem/" in message


def test_a_retyped_field_is_refused() -> None:
    newest = _pinned()
    entry = _message(newest, "filesystem/filesystem.proto", "EntryInfo")
    next(f for f in entry.field if f.name == "size").type = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    with pytest.raises(ExtractionError, match="size: changed"):
        additions(_pinned(), newest)


def test_the_newest_lock_pins_the_newest_clients_by_digest() -> None:
    lock = load_lock(CONTRACT_DIR / LOCK)
    assert {key: a.version for key, a in lock.artifacts.items()} == {
        "py-e2b": "2.63.0",
        "py-e2b-code-interpreter": "2.11.5",
        "js-e2b": "2.51.0",
        "js-e2b-code-interpreter": "2.8.0",
    }
    assert lock.sources == {}, "the releases record no source commit"
    assert all(a.source is None for a in lock.artifacts.values())


def test_the_newest_manifest_fingerprints_its_outputs_and_its_lock() -> None:
    manifest = json.loads((CONTRACT_DIR / MANIFEST).read_text())
    assert set(manifest["derived"]) == {DESCRIPTORS, ADDITIONS}
    for rel, digest in [*manifest["derived"].items(), *manifest["inputs"].items()]:
        assert hashlib.sha256((CONTRACT_DIR / rel).read_bytes()).hexdigest() == digest, rel
    lock = load_lock(CONTRACT_DIR / LOCK)
    assert {key: entry["sha256"] for key, entry in manifest["artifacts"].items()} == {
        key: a.sha256 for key, a in lock.artifacts.items()
    }


def test_the_newest_tuple_is_the_sweep_s_newest_clients() -> None:
    """The same releases, by the same digests, as the newest committed client locks the sweep runs."""
    lock = load_lock(CONTRACT_DIR / LOCK)
    clients = CONTRACT_DIR.parent / "conformance" / "clients"
    requirements = (clients / f"python-{lock.artifact('py-e2b').version}.requirements.txt").read_text()
    for key in ("py-e2b", "py-e2b-code-interpreter"):
        artifact = lock.artifact(key)
        assert f"{artifact.name}=={artifact.version} \\\n    --hash=sha256:{artifact.sha256}" in requirements, key
    packages = json.loads((clients / f"node-{lock.artifact('js-e2b').version}" / "package-lock.json").read_text())
    for key in ("js-e2b", "js-e2b-code-interpreter"):
        artifact = lock.artifact(key)
        locked = packages["packages"][f"node_modules/{artifact.name}"]
        assert (locked["version"], locked["integrity"]) == (artifact.version, artifact.integrity), key
