"""The harness's known failures (``conformance/known-failures.json``) applied to the live client cases.

A live case is a (backend, case, flavour) triple, the same names the harness reports. When an entry
holds for it (one for that backend, else one for every backend: ``conformance._gate.for_backend``),
the case is marked ``xfail(strict=True)`` with the entry's reason: it still runs, and a pass fails
the run, so a fixed failure's entry is removed instead of lingering.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from conformance._cases import Case
from conformance._gate import KnownFailure, for_backend, load_known_failures

__all__ = ["known_failure", "mark_known_failures"]


def known_failure(known: Iterable[KnownFailure], backend: str, case: str, flavour: str) -> KnownFailure | None:
    """The entry that holds for ``case`` in ``flavour`` on ``backend``, or None."""
    for entry in for_backend(known, backend):
        if (entry.case, entry.flavour) == (case, flavour):
            return entry
    return None


def mark_known_failures(items: Iterable[pytest.Item], known: Iterable[KnownFailure] | None = None) -> int:
    """Mark every live case (``backend_server``, ``flavour``, ``case`` parameters) an entry holds for; how many."""
    entries = tuple(load_known_failures() if known is None else known)
    marked = 0
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        backend, flavour, case = params.get("backend_server"), params.get("flavour"), params.get("case")
        if not (isinstance(backend, str) and isinstance(flavour, str) and isinstance(case, Case)):
            continue
        entry = known_failure(entries, backend, case.name, flavour)
        if entry is not None:
            where = entry.backend or "every backend"
            reason = f"known failure on {where} (conformance/known-failures.json): {entry.reason}"
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
            marked += 1
    return marked
