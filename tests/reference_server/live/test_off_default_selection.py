"""Which live cases run off the default backend (``conftest.one_run_off_the_default``; no server needed)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from conformance._backend_features import explain_missing, managed_features
from conformance._cases import Case, cases
from conformance._gate import load_known_failures
from runtime.backends import DEFAULT_BACKEND, serving_backends

from ._default_run import chosen_backend, chosen_flavour
from ._items import CallSpec, Item
from ._known_failures import known_failure
from .conftest import one_run_off_the_default

FAMILIES = ("envd", "sandbox", "interpreter", "volume")


@dataclass
class _Hook:
    deselected: list[Any] = field(default_factory=list)

    def pytest_deselected(self, *, items: list[Any]) -> None:
        self.deselected.extend(items)


@dataclass
class _Config:
    hook: _Hook = field(default_factory=_Hook)


def _every_run() -> list[Item]:
    """One item per case, flavour and serving backend: what the live tests collect, and more."""
    return [
        Item(CallSpec({"backend_server": backend, "flavour": flavour, "case": case}))
        for family in FAMILIES
        for case in cases(family)
        for flavour in sorted(case.flavours)
        for backend in serving_backends()
    ]


def _selected(monkeypatch: pytest.MonkeyPatch) -> tuple[set[tuple[str, str, str]], _Config, int]:
    monkeypatch.delenv("E2B_COMPAT_LIVE_EVERY_FLAVOUR", raising=False)
    items = _every_run()
    config = _Config()
    one_run_off_the_default(cast(pytest.Config, config), cast(list[pytest.Item], items))
    kept = {
        (i.callspec.params["backend_server"], i.callspec.params["flavour"], i.callspec.params["case"].name)
        for i in items
    }
    return kept, config, len(_every_run())


def _declared(backend: str, case: Case, flavour: str) -> bool:
    return known_failure(load_known_failures(), backend, case.name, flavour) is not None or bool(
        explain_missing(managed_features(backend), case=case.name)
    )


def test_the_default_backend_keeps_every_case_in_every_flavour(monkeypatch: pytest.MonkeyPatch) -> None:
    kept, _, _ = _selected(monkeypatch)
    for family in FAMILIES:
        for case in cases(family):
            for flavour in case.flavours:
                assert (DEFAULT_BACKEND, flavour, case.name) in kept


def test_off_the_default_each_case_runs_once_in_one_flavour_unless_a_backend_declares_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept, config, total = _selected(monkeypatch)
    others = [name for name in serving_backends() if name != DEFAULT_BACKEND]
    if not others:
        pytest.skip("only the default backend serves here")
    assert len(kept) + len(config.hook.deselected) == total, "every item is kept or reported deselected"
    for family in FAMILIES:
        for case in cases(family):
            flavour = chosen_flavour(case)
            runs = {backend for backend, f, name in kept if name == case.name and backend != DEFAULT_BACKEND}
            assert all(f == flavour for b, f, n in kept if n == case.name and b != DEFAULT_BACKEND)
            assert chosen_backend(case, others) in runs
            for backend in others:
                if _declared(backend, case, flavour):
                    assert backend in runs, f"{case.name}: what {backend} declares of it must be checked there"
                elif backend != chosen_backend(case, others):
                    assert backend not in runs


def test_every_backend_off_the_default_gets_a_share_of_every_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotation spreads: no backend is left without the cases of a family (a hash that
    sent one family's cases all one way would leave that backend untested there)."""
    kept, _, _ = _selected(monkeypatch)
    others = [name for name in serving_backends() if name != DEFAULT_BACKEND]
    family_of = {case.name: family for family in FAMILIES for case in cases(family)}
    shares = Counter((backend, family_of[name]) for backend, _, name in kept if backend != DEFAULT_BACKEND)
    for backend in others:
        for family in FAMILIES:
            assert shares[(backend, family)] >= 2, f"{backend} runs {shares[(backend, family)]} {family} cases"


def test_every_flavour_and_backend_is_the_whole_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_COMPAT_LIVE_EVERY_FLAVOUR", "1")
    items = _every_run()
    config = _Config()
    one_run_off_the_default(cast(pytest.Config, config), cast(list[pytest.Item], items))
    assert len(items) == len(_every_run())
    assert config.hook.deselected == []
