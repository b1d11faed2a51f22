"""Read files out of a verified artifact (wheel or npm tarball) without unpacking it."""

from __future__ import annotations

import io
import tarfile
import zipfile

from ._errors import ExtractionError
from ._fetch import VerifiedArtifact
from ._lock import Artifact

# npm registry tarballs keep the package under this folder.
_NPM_PREFIX = "package/"


class ArtifactFiles:
    """The member files of one artifact, by their path inside the package."""

    def __init__(self, artifact: Artifact, files: dict[str, bytes]) -> None:
        self.artifact = artifact
        self._files = dict(files)

    @classmethod
    def from_verified(cls, verified: VerifiedArtifact) -> ArtifactFiles:
        """Unpack a verified wheel (zip) or npm tarball in memory."""
        files: dict[str, bytes] = {}
        if verified.artifact.registry == "pypi":
            with zipfile.ZipFile(io.BytesIO(verified.data)) as zf:
                for info in zf.infolist():
                    if not info.is_dir():
                        files[info.filename] = zf.read(info)
        else:
            with tarfile.open(fileobj=io.BytesIO(verified.data), mode="r:gz") as tf:
                for member in tf.getmembers():
                    if member.isfile() and member.name.startswith(_NPM_PREFIX):
                        handle = tf.extractfile(member)
                        assert handle is not None  # regular files always have content
                        files[member.name[len(_NPM_PREFIX) :]] = handle.read()
        return cls(verified.artifact, files)

    def names(self) -> list[str]:
        return sorted(self._files)

    def has(self, name: str) -> bool:
        return name in self._files

    def read(self, name: str) -> bytes:
        try:
            return self._files[name]
        except KeyError:
            raise ExtractionError(f"{self.artifact.key}: no file {name!r} in {self.artifact.filename}") from None

    def text(self, name: str) -> str:
        return self.read(name).decode("utf-8")

    def under(self, prefix: str, suffix: str = "") -> list[str]:
        """Names below ``prefix`` ending in ``suffix``, sorted."""
        return [n for n in self.names() if n.startswith(prefix) and n.endswith(suffix)]
