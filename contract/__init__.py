"""The pinned E2B contract: what the official clients send and expect, derived from them.

Everything here is derived from four pinned registry artifacts (see
``upstream.lock.json``), verified by digest every time they are used:

- ``derived/*.openapi.json``: control plane, envd HTTP and volume content as OpenAPI 3.1;
- ``derived/envd.descriptor-set.binpb`` and ``generated/``: envd's protobuf contract and
  the message modules and Connect stubs generated from it;
- ``derived/interpreter.json``: Code Interpreter routes and NDJSON message types;
- ``derived/inventory.json``: every public operation with a stable id and SDK entry points;
- ``_fields``: every request field of those operations (queries, JSON bodies, Connect message
  fields, headers), enumerated from the documents above;
- ``manifest.json``: versions and digests of all of the above;
- ``newest/``: the newest tuple (``newest/upstream.lock.json``): the newest Python client's envd
  descriptors, a checked superset of the pinned ones, from which ``generated/`` is made
  (``_newest``).

Exceptions (see ``_errors``)::

    ContractError
    ├── LockFileError
    ├── ArtifactError
    │   ├── ArtifactFetchError
    │   └── ArtifactDigestError
    ├── ExtractionError
    └── DriftError
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from .lazy import lazy_getattr as _lazy_getattr

if _TYPE_CHECKING:
    from ._archive import ArtifactFiles
    from ._derive import CONTRACT_DIR, generate
    from ._drift import check, compare, write
    from ._errors import (
        ArtifactDigestError,
        ArtifactError,
        ArtifactFetchError,
        ContractError,
        DriftError,
        ExtractionError,
        LockFileError,
    )
    from ._fetch import ArtifactStore, Downloader, NpmDownloader, PipDownloader, VerifiedArtifact, default_cache_root
    from ._fields import Field, flavour_reaches, load_fields, not_sent
    from ._inventory import Operation, load_inventory
    from ._lock import Artifact, Lock, load_lock

# Loaded on first use (PEP 562): the sandbox agent imports ``contract.generated`` and must
# not pay for the derivation toolchain (tree-sitter parsers, protoc wrappers) it never uses.
_LAZY = {
    "ArtifactFiles": "_archive",
    "CONTRACT_DIR": "_derive",
    "generate": "_derive",
    "check": "_drift",
    "compare": "_drift",
    "write": "_drift",
    **dict.fromkeys(
        (
            "ArtifactDigestError",
            "ArtifactError",
            "ArtifactFetchError",
            "ContractError",
            "DriftError",
            "ExtractionError",
            "LockFileError",
        ),
        "_errors",
    ),
    **dict.fromkeys(
        ("ArtifactStore", "Downloader", "NpmDownloader", "PipDownloader", "VerifiedArtifact", "default_cache_root"),
        "_fetch",
    ),
    **dict.fromkeys(("Field", "flavour_reaches", "load_fields", "not_sent"), "_fields"),
    "Operation": "_inventory",
    "load_inventory": "_inventory",
    "Artifact": "_lock",
    "Lock": "_lock",
    "load_lock": "_lock",
}


__getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "CONTRACT_DIR",
    "Artifact",
    "ArtifactDigestError",
    "ArtifactError",
    "ArtifactFetchError",
    "ArtifactFiles",
    "ArtifactStore",
    "ContractError",
    "Downloader",
    "DriftError",
    "ExtractionError",
    "Field",
    "Lock",
    "LockFileError",
    "NpmDownloader",
    "Operation",
    "PipDownloader",
    "VerifiedArtifact",
    "check",
    "compare",
    "default_cache_root",
    "flavour_reaches",
    "generate",
    "load_fields",
    "load_inventory",
    "load_lock",
    "not_sent",
    "write",
]
