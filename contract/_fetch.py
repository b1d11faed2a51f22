"""Download pinned artifacts with the ordinary registry clients and verify them on every use.

The registry clients (``pip download``, ``npm pack``) are the transport: they already
know how this machine reaches its registries, so no registry host is named here. A
``Downloader`` is the seam; tests swap in one that serves chosen bytes.

Cache layout (content-addressed, safe to share between checkouts)::

    <cache>/artifacts/<sha256>/<filename>

A cached file is re-hashed every time it is opened; the bytes handed to callers are
the bytes that were verified, so nothing unverified is ever used.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ._errors import ArtifactDigestError, ArtifactFetchError
from ._lock import Artifact

CACHE_ENV = "E2B_COMPAT_CACHE"


def default_cache_root() -> Path:
    """``$E2B_COMPAT_CACHE``, else ``$XDG_CACHE_HOME/e2b-compat``, else ``~/.cache/e2b-compat``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "e2b-compat"


class Downloader(Protocol):
    """Puts the file of ``artifact`` into ``dest`` and returns its path."""

    def download(self, artifact: Artifact, dest: Path) -> Path: ...


def _run(cmd: list[str], artifact: Artifact, cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ArtifactFetchError(f"{cmd[0]} could not fetch {artifact.spec} (exit {proc.returncode}):\n{tail}")


def _single_file(dest: Path, artifact: Artifact) -> Path:
    expected = dest / artifact.filename
    if expected.is_file():
        return expected
    found = sorted(p.name for p in dest.iterdir())
    raise ArtifactFetchError(f"fetching {artifact.spec} produced {found}, not {artifact.filename!r}")


class PipDownloader:
    """``pip download --no-deps`` of the exact version, binary only."""

    def download(self, artifact: Artifact, dest: Path) -> Path:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--quiet",
            "--dest",
            str(dest),
            artifact.spec,
        ]
        _run(cmd, artifact, dest)
        return _single_file(dest, artifact)


class NpmDownloader:
    """``npm pack`` of the exact version (the registry tarball, unmodified)."""

    def download(self, artifact: Artifact, dest: Path) -> Path:
        npm = shutil.which("npm")
        if npm is None:
            raise ArtifactFetchError(f"npm is needed to fetch {artifact.spec} but is not on PATH")
        cmd = [npm, "pack", artifact.spec, "--pack-destination", str(dest), "--silent", "--ignore-scripts"]
        _run(cmd, artifact, dest)
        return _single_file(dest, artifact)


def registry_downloaders() -> dict[str, Downloader]:
    """The real downloaders, by registry name."""
    return {"pypi": PipDownloader(), "npm": NpmDownloader()}


def sri_sha512(data: bytes) -> str:
    """Subresource-integrity string (as npm records it) for ``data``."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def verify(artifact: Artifact, data: bytes, where: str) -> None:
    """Raise ``ArtifactDigestError`` unless ``data`` is exactly the pinned artifact."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != artifact.sha256:
        raise ArtifactDigestError(artifact.key, "sha256", artifact.sha256, actual, where)
    if artifact.integrity is not None:
        integrity = sri_sha512(data)
        if integrity != artifact.integrity:
            raise ArtifactDigestError(artifact.key, "integrity", artifact.integrity, integrity, where)


@dataclass(frozen=True)
class VerifiedArtifact:
    """The bytes of a pinned artifact, checked against the lock just now."""

    artifact: Artifact
    data: bytes
    path: Path


class ArtifactStore:
    """The content-addressed artifact cache."""

    def __init__(
        self,
        root: Path | None = None,
        downloaders: dict[str, Downloader] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.root = root if root is not None else default_cache_root()
        self._downloaders = downloaders if downloaders is not None else registry_downloaders()
        self._log = log or (lambda _msg: None)

    def path_for(self, artifact: Artifact) -> Path:
        return self.root / "artifacts" / artifact.sha256 / artifact.filename

    def fetch(self, artifact: Artifact) -> Path:
        """Make sure the artifact is in the cache (downloading it if needed) and verified."""
        target = self.path_for(artifact)
        if target.is_file():
            verify(artifact, target.read_bytes(), f"cached at {target}")
            return target
        try:
            downloader = self._downloaders[artifact.registry]
        except KeyError:
            raise ArtifactFetchError(f"no downloader for registry {artifact.registry!r}") from None
        self._log(f"fetching {artifact.spec} from {artifact.registry}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
            produced = downloader.download(artifact, Path(tmp))
            verify(artifact, produced.read_bytes(), f"downloaded by the {artifact.registry} client")
            os.replace(produced, target)  # atomic: a half-written file is never in the cache
        return target

    def open(self, artifact: Artifact) -> VerifiedArtifact:
        """Fetch if needed, then read and verify the bytes that the caller will use."""
        path = self.fetch(artifact)
        data = path.read_bytes()
        verify(artifact, data, f"cached at {path}")
        return VerifiedArtifact(artifact, data, path)
