"""The hand-kept lock file: which official artifacts are pinned, by what digest."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ._errors import LockFileError

LOCK_PATH = Path(__file__).with_name("upstream.lock.json")

Registry = Literal["pypi", "npm"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_SRI512 = re.compile(r"^sha512-[A-Za-z0-9+/]{86}==$")


@dataclass(frozen=True)
class SourceCommit:
    """The upstream repository commit an artifact was released from."""

    key: str
    repository: str
    commit: str


@dataclass(frozen=True)
class Artifact:
    """One pinned registry artifact."""

    key: str
    registry: Registry
    name: str
    version: str
    filename: str
    sha256: str
    integrity: str | None
    source: str | None  # the key of its source commit; None in a lock that records none

    def manifest_entry(self) -> dict[str, str]:
        """How a manifest records the artifact: registry, name, version, file and digests."""
        entry = {"registry": self.registry, "name": self.name, "version": self.version}
        entry |= {"filename": self.filename, "sha256": self.sha256}
        return entry | ({"integrity": self.integrity} if self.integrity else {})

    @property
    def spec(self) -> str:
        """The requirement the registry client is asked for (exact version)."""
        return f"{self.name}=={self.version}" if self.registry == "pypi" else f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Lock:
    """The parsed lock file."""

    sources: dict[str, SourceCommit]
    artifacts: dict[str, Artifact]

    def artifact(self, key: str) -> Artifact:
        try:
            return self.artifacts[key]
        except KeyError:
            raise LockFileError(f"no artifact {key!r} in the lock file") from None


def _field(obj: dict[str, Any], name: str, where: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise LockFileError(f"{where}: field {name!r} must be a non-empty string")
    return value


def parse_lock(data: dict[str, Any]) -> Lock:
    """Validate and parse the lock file's JSON content."""
    if data.get("schema") != 1:
        raise LockFileError("unsupported lock file schema (expected 1)")
    sources: dict[str, SourceCommit] = {}
    for key, raw in sorted(data.get("sources", {}).items()):
        commit = _field(raw, "commit", f"sources.{key}")
        if not _HEX40.match(commit):
            raise LockFileError(f"sources.{key}: commit must be 40 lowercase hex digits")
        sources[key] = SourceCommit(key, _field(raw, "repository", f"sources.{key}"), commit)
    artifacts: dict[str, Artifact] = {}
    for key, raw in sorted(data.get("artifacts", {}).items()):
        where = f"artifacts.{key}"
        registry = _field(raw, "registry", where)
        if registry not in ("pypi", "npm"):
            raise LockFileError(f"{where}: registry must be 'pypi' or 'npm'")
        sha256 = _field(raw, "sha256", where)
        if not _HEX64.match(sha256):
            raise LockFileError(f"{where}: sha256 must be 64 lowercase hex digits")
        integrity = raw.get("integrity")
        if registry == "npm" and (not isinstance(integrity, str) or not _SRI512.match(integrity)):
            raise LockFileError(f"{where}: npm artifacts need a sha512 'integrity' value")
        # A lock with no sources (the newest tuple: its releases record no commit) names none.
        source = _field(raw, "source", where) if sources or "source" in raw else None
        if source is not None and source not in sources:
            raise LockFileError(f"{where}: unknown source {source!r}")
        artifacts[key] = Artifact(
            key=key,
            registry=registry,  # type: ignore[arg-type]  # checked above
            name=_field(raw, "name", where),
            version=_field(raw, "version", where),
            filename=_field(raw, "filename", where),
            sha256=sha256,
            integrity=integrity,
            source=source,
        )
    if not artifacts:
        raise LockFileError("the lock file pins no artifacts")
    return Lock(sources, artifacts)


def load_lock(path: Path = LOCK_PATH) -> Lock:
    """Read and parse a lock file (the committed one by default)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LockFileError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise LockFileError(f"{path}: expected a JSON object")
    return parse_lock(data)
