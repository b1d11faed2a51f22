"""Regeneration from the pinned artifacts reproduces the committed contract, and drift is caught."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from contract import (
    CONTRACT_DIR,
    ArtifactDigestError,
    ArtifactStore,
    DriftError,
    check,
    compare,
    generate,
    load_lock,
)
from contract._derive import HAND_KEPT, MANIFEST
from contract._drift import OUTPUTS

pytestmark = pytest.mark.artifacts


@pytest.fixture(scope="module")
def fresh(store: ArtifactStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One regeneration from the verified artifacts, shared by the tests below."""
    out = tmp_path_factory.mktemp("fresh")
    generate(out, store=store)
    return out


@pytest.fixture
def committed_copy(tmp_path: Path) -> Path:
    """A scratch copy of the committed contract folder that a test may damage."""
    copy = tmp_path / "contract"
    copy.mkdir()
    for name in (*HAND_KEPT, *OUTPUTS):
        source = CONTRACT_DIR / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)  # newest/ holds a hand-kept lock
            shutil.copy2(source, copy / name)
    return copy


def test_committed_contract_is_what_the_artifacts_produce(fresh: Path) -> None:
    assert compare(fresh, CONTRACT_DIR) == ""


def test_generation_is_deterministic(fresh: Path, store: ArtifactStore, tmp_path: Path) -> None:
    generate(tmp_path, store=store)
    assert compare(fresh, tmp_path) == ""


def test_changed_inventory_entry_is_reported_with_a_diff(fresh: Path, committed_copy: Path) -> None:
    inventory = committed_copy / "derived" / "inventory.json"
    data = json.loads(inventory.read_text())
    entry = next(e for e in data["operations"] if e["id"] == "envd.process.Start")
    entry["streaming"] = "unary"
    inventory.write_text(json.dumps(data, indent=2) + "\n")
    report = compare(fresh, committed_copy)
    assert "changed: derived/inventory.json" in report
    assert '-      "streaming": "unary",' in report
    assert '+      "streaming": "server-stream",' in report


def test_changed_descriptor_is_reported_as_readable_text(fresh: Path, committed_copy: Path) -> None:
    path = committed_copy / "derived" / "envd.descriptor-set.binpb"
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(path.read_bytes())
    process = next(f for f in fds.file if f.name == "process/process.proto")
    start = next(m for m in process.service[0].method if m.name == "Start")
    start.server_streaming = False
    path.write_bytes(fds.SerializeToString(deterministic=True))
    report = compare(fresh, committed_copy)
    assert "changed: derived/envd.descriptor-set.binpb" in report
    assert "+      server_streaming: true" in report


def test_a_changed_newest_tuple_is_drift_too(fresh: Path, committed_copy: Path) -> None:
    path = committed_copy / "newest" / "derived" / "envd-additions.json"
    data = json.loads(path.read_text())
    data["additions"] = data["additions"][:1]
    path.write_text(json.dumps(data, indent=2) + "\n")
    report = compare(fresh, committed_copy)
    assert "changed: newest/derived/envd-additions.json" in report
    assert '+    "field filesystem.EntryInfo.is_symlink = 12"' in report


def test_check_raises_on_drift_and_names_the_files(store: ArtifactStore, committed_copy: Path) -> None:
    names = json.loads((committed_copy / "operation_ids.json").read_text())
    names["control"]["POST /sandboxes"] = "control.sandboxes.make"
    (committed_copy / "operation_ids.json").write_text(json.dumps(names))
    (committed_copy / "generated" / "process" / "stray.py").write_text("")
    with pytest.raises(DriftError) as info:
        check(contract_dir=committed_copy, store=store)
    report = info.value.report
    assert "changed: derived/inventory.json" in report
    assert '"id": "control.sandboxes.make"' in report
    assert "changed: derived/control-plane.openapi.json" in report
    assert "unexpected: generated/process/stray.py" in report
    assert f"changed: {MANIFEST}" in report


def test_tampered_artifact_stops_generation(store: ArtifactStore, tmp_path: Path) -> None:
    lock = load_lock()
    tampered = ArtifactStore(root=tmp_path / "cache", downloaders={})
    for artifact in lock.artifacts.values():
        target = tampered.path_for(artifact)
        target.parent.mkdir(parents=True)
        shutil.copy2(store.fetch(artifact), target)
    victim = tampered.path_for(lock.artifact("js-e2b"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(ArtifactDigestError) as info:
        generate(tmp_path / "out", store=tampered)
    assert info.value.artifact == "js-e2b"
    assert info.value.expected == lock.artifact("js-e2b").sha256
    assert not (tmp_path / "out" / "derived").exists(), "nothing is derived from an unverified artifact"
