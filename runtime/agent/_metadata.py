"""What the runtime publishes about a sandbox in ``/run/e2b``: envd's metadata service, as files.

envd learns the sandbox's and template's ids from its VM's metadata service and writes them to
``/run/e2b`` (``.E2B_SANDBOX_ID``, ``.E2B_TEMPLATE_ID``); the same service publishes the hash of
the access token the next ``/init`` must bring. Here the runtime writes those files into a folder
it binds read-only at ``/run/e2b`` (``runtime._oci_backend``). An agent restored from another
sandbox's memory (a fork) still holds that sandbox's ids and token in its memory: at ``/init`` it
reads its new identity here, and a new token is accepted when its hash is the published one.

No folder (the Docker backend, a bare agent): nothing is published, and the agent keeps what its
environment gave it, with the rule of a runtime without a metadata service (the first ``/init``
sets the token).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

METADATA_DIR = Path("/run/e2b")
ACCESS_TOKEN_HASH_FILE = ".E2B_ACCESS_TOKEN_HASH"  # noqa: S105 - a file name; in it: lowercase hex SHA-512 of the expected token ("" for none)
_IDS = {"E2B_SANDBOX_ID": ".E2B_SANDBOX_ID", "E2B_TEMPLATE_ID": ".E2B_TEMPLATE_ID"}


def _read(name: str, folder: Path) -> str | None:
    try:
        return (folder / name).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def published_ids(folder: Path = METADATA_DIR) -> dict[str, str]:
    """The sandbox's and template's ids the runtime published (only those present and non-empty)."""
    found = {name: _read(file, folder) for name, file in _IDS.items()}
    return {name: value for name, value in found.items() if value}


def expected_token_hash(folder: Path = METADATA_DIR) -> str | None:
    """The published hash of the token the next ``/init`` must bring; None when none is published."""
    value = _read(ACCESS_TOKEN_HASH_FILE, folder)
    return value.lower() if value else None


def matches_hash(token: str | None, expected: str) -> bool:
    """Whether ``token`` (None: absent, hashed as ``""``) is the one whose hash was published."""
    digest = hashlib.sha512((token or "").encode()).hexdigest()
    return hmac.compare_digest(digest, expected)
