"""Which live cases the harness's known failures mark as expected to fail (no server needed)."""

from __future__ import annotations

from typing import cast

import pytest

from conformance._cases import Case, cases
from conformance._gate import KnownFailure, load_known_failures

from ._items import CallSpec, Item
from ._known_failures import known_failure, mark_known_failures

PTY = "envd/pty/session"
ENTRIES = (
    KnownFailure(PTY, "py-sync", "runsc answers differently", backend="gvisor"),
    KnownFailure("envd/files/metadata", "js", "every backend"),
    KnownFailure("envd/files/metadata", "js", "docker's own reason", backend="docker"),
)


def test_an_entry_for_another_backend_does_not_apply() -> None:
    assert known_failure(ENTRIES, "gvisor", PTY, "py-sync") == ENTRIES[0]
    assert known_failure(ENTRIES, "crun", PTY, "py-sync") is None
    assert known_failure(ENTRIES, "docker", PTY, "py-sync") is None
    assert known_failure(ENTRIES, "gvisor", PTY, "js") is None, "nor one for another flavour"


def test_an_entry_for_every_backend_applies_unless_the_backend_has_its_own() -> None:
    assert known_failure(ENTRIES, "crun", "envd/files/metadata", "js") == ENTRIES[1]
    assert known_failure(ENTRIES, "docker", "envd/files/metadata", "js") == ENTRIES[2]


def _case(name: str) -> Case:
    return next(
        case for family in ("envd", "sandbox", "interpreter", "volume") for case in cases(family) if case.name == name
    )


def test_only_the_listed_backend_s_case_is_a_strict_xfail() -> None:
    pty = _case(PTY)
    items = [
        Item(CallSpec({"backend_server": backend, "flavour": "py-sync", "case": pty}))
        for backend in ("crun", "gvisor", "docker")
    ]
    items.append(Item(CallSpec({"flavour": "py-sync", "case": pty})))  # not a live case: no backend
    assert mark_known_failures(cast(list[pytest.Item], items), ENTRIES) == 1
    assert [len(item.markers) for item in items] == [0, 1, 0, 0]
    (mark,) = items[1].markers
    assert mark.name == "xfail"
    assert mark.kwargs["strict"] is True
    assert "gvisor" in mark.kwargs["reason"]
    assert "runsc answers differently" in mark.kwargs["reason"]


def test_every_listed_case_is_one_the_live_tests_run() -> None:
    """An entry naming no case of these families would mark nothing here (the harness calls it stale)."""
    names = {
        case.name: case.flavours for family in ("envd", "sandbox", "interpreter", "volume") for case in cases(family)
    }
    for entry in load_known_failures():
        assert entry.flavour in names.get(entry.case, ()), f"{entry.case} ({entry.flavour}) is not a live case"
