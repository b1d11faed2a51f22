"""The fetcher verifies every artifact on every use and never keeps or hands out bad bytes."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path

import pytest

from contract import Artifact, ArtifactDigestError, ArtifactFetchError, ArtifactStore
from contract._fetch import sri_sha512

PAYLOAD = b"pretend this is a wheel"


def _artifact(data: bytes = PAYLOAD, registry: str = "pypi") -> Artifact:
    return Artifact(
        key="py-demo",
        registry=registry,  # type: ignore[arg-type]
        name="demo",
        version="1.0",
        filename="demo-1.0-py3-none-any.whl",
        sha256=hashlib.sha256(data).hexdigest(),
        integrity=sri_sha512(data) if registry == "npm" else None,
        source="demo",
    )


class ServingDownloader:
    """Stands in for the registry client: writes chosen bytes, counts calls."""

    def __init__(self, data: bytes, filename: str | None = None) -> None:
        self.data = data
        self.filename = filename
        self.calls = 0

    def download(self, artifact: Artifact, dest: Path) -> Path:
        self.calls += 1
        target = dest / (self.filename or artifact.filename)
        target.write_bytes(self.data)
        return target


def _store(tmp_path: Path, downloader: ServingDownloader) -> ArtifactStore:
    return ArtifactStore(root=tmp_path, downloaders={"pypi": downloader, "npm": downloader})


def test_fetch_verifies_and_caches_by_digest(tmp_path: Path) -> None:
    downloader = ServingDownloader(PAYLOAD)
    store = _store(tmp_path, downloader)
    artifact = _artifact()
    verified = store.open(artifact)
    assert verified.data == PAYLOAD
    assert verified.path == tmp_path / "artifacts" / artifact.sha256 / artifact.filename
    store.open(artifact)
    assert downloader.calls == 1, "a verified cached artifact is not downloaded again"


def test_tampered_download_is_refused_and_not_cached(tmp_path: Path) -> None:
    artifact = _artifact()
    store = _store(tmp_path, ServingDownloader(b"evil bytes"))
    with pytest.raises(ArtifactDigestError) as info:
        store.open(artifact)
    err = info.value
    assert err.artifact == "py-demo"
    assert err.expected == artifact.sha256
    assert err.actual == hashlib.sha256(b"evil bytes").hexdigest()
    message = str(err)
    assert "py-demo" in message
    assert artifact.sha256 in message
    assert err.actual in message
    assert not store.path_for(artifact).exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_cache_tampered_after_download_is_detected_on_use(tmp_path: Path) -> None:
    artifact = _artifact()
    store = _store(tmp_path, ServingDownloader(PAYLOAD))
    path = store.fetch(artifact)
    path.write_bytes(PAYLOAD + b"!")
    with pytest.raises(ArtifactDigestError, match="cached at"):
        store.open(artifact)


def test_npm_integrity_is_checked_too(tmp_path: Path) -> None:
    artifact = replace(_artifact(registry="npm"), integrity=sri_sha512(b"something else"))
    store = _store(tmp_path, ServingDownloader(PAYLOAD))
    with pytest.raises(ArtifactDigestError) as info:
        store.open(artifact)
    assert info.value.algorithm == "integrity"


def test_downloader_producing_another_file_is_an_error(tmp_path: Path) -> None:
    from contract._fetch import _single_file

    (tmp_path / "other.whl").write_bytes(b"x")
    with pytest.raises(ArtifactFetchError, match=re.escape("produced ['other.whl']")):
        _single_file(tmp_path, _artifact())


def test_registry_client_failure_is_reported(tmp_path: Path) -> None:
    from contract import PipDownloader

    missing = replace(_artifact(), name="e2b", version="0.0.0.0.404")
    with pytest.raises(ArtifactFetchError, match=re.escape("could not fetch e2b==0.0.0.0.404")):
        PipDownloader().download(missing, tmp_path)
