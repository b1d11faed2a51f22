"""The contract package's exceptions.

ContractError
├── LockFileError            upstream.lock.json is malformed
├── ArtifactError
│   ├── ArtifactFetchError   the registry client could not produce the file
│   └── ArtifactDigestError  bytes do not match the pinned digest
├── ExtractionError          a pinned artifact does not have the expected shape
└── DriftError               regenerated output differs from what is committed
"""

from __future__ import annotations


class ContractError(Exception):
    """Base class of every error raised by the contract pipeline."""


class LockFileError(ContractError):
    """The hand-kept lock file is missing a field or has a malformed value."""


class ArtifactError(ContractError):
    """A pinned artifact could not be obtained or trusted."""


class ArtifactFetchError(ArtifactError):
    """The registry client failed, or did not produce the expected file."""


class ArtifactDigestError(ArtifactError):
    """The bytes of an artifact are not the pinned ones."""

    def __init__(self, artifact: str, algorithm: str, expected: str, actual: str, where: str) -> None:
        self.artifact = artifact
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual
        self.where = where
        super().__init__(
            f"artifact {artifact!r} ({where}) failed verification: "
            f"expected {algorithm} {expected}, got {actual}; refusing to use it"
        )


class ExtractionError(ContractError):
    """A pinned artifact lacks something the extraction relies on."""


class DriftError(ContractError):
    """Regenerated contract files differ from the committed ones."""

    def __init__(self, report: str) -> None:
        self.report = report
        super().__init__(report)
