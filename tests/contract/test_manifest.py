"""The manifest pins what the contract was derived from and fingerprints every derived file."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from contract import CONTRACT_DIR, load_lock
from contract._drift import output_files
from tests.conftest import shared_dir


def _manifest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONTRACT_DIR / "manifest.json").read_text())
    return data


def test_manifest_matches_the_lock() -> None:
    manifest = _manifest()
    lock = load_lock()
    assert manifest["full_compatibility"] is False
    assert manifest["versions"] == {
        "py-e2b": "2.32.0",
        "py-e2b-code-interpreter": "2.8.1",
        "js-e2b": "2.33.0",
        "js-e2b-code-interpreter": "2.6.1",
    }
    for key, artifact in lock.artifacts.items():
        assert manifest["artifacts"][key]["sha256"] == artifact.sha256
        assert manifest["artifacts"][key].get("integrity") == artifact.integrity
    assert {k: v["commit"] for k, v in manifest["sources"].items()} == {k: s.commit for k, s in lock.sources.items()}


def test_manifest_fingerprints_every_output_and_input() -> None:
    manifest = _manifest()
    # Each manifest is derived from the rest; the newest tuple's has a test of its own (test_newest).
    manifests = ("manifest.json", "newest/manifest.json")
    files = {rel: p for rel, p in output_files(CONTRACT_DIR).items() if rel not in manifests}
    assert set(manifest["derived"]) == set(files)
    for rel, path in files.items():
        assert manifest["derived"][rel] == hashlib.sha256(path.read_bytes()).hexdigest(), rel
    for name, digest in manifest["inputs"].items():
        assert hashlib.sha256((CONTRACT_DIR / name).read_bytes()).hexdigest() == digest, name


def test_artifact_digests_equal_the_protocol_notes() -> None:
    notes = shared_dir() / "docs" / "PROTOCOL.md"
    if not notes.is_file():
        pytest.skip(f"{notes} is not present on this machine")
    table = dict(re.findall(r"^\| (\S+\.(?:whl|tgz))[^|]*\| `([0-9a-f]{64})` \|", notes.read_text(), re.M))
    assert len(table) == 4, table
    by_filename = {a["filename"]: a["sha256"] for a in _manifest()["artifacts"].values()}
    # The notes name the scoped npm tarball by its registry file name.
    assert by_filename == table
