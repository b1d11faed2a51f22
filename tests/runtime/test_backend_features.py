"""``BackendEntry.features``: each table entry's feature list, read without opening the backend."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import pytest

from runtime import backends
from runtime.backend import DEFAULT_FEATURES, BackendError, Feature
from runtime.backends import BACKENDS, BackendOptions, backend_entry


def _opened_features(name: str, state_dir: Path) -> frozenset[Feature]:
    return backend_entry(name).open(BackendOptions(state_dir=state_dir)).features


def test_the_fake_entry_says_what_its_backend_says(tmp_path: Path) -> None:
    assert backend_entry("fake").features() == _opened_features("fake", tmp_path)


@pytest.mark.parametrize("name", [name for name in BACKENDS if name != "fake"])
def test_every_other_entry_says_what_its_opened_backend_says(name: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("opening a real backend needs root (CI runs as root)")
    # Not under pytest's private tmp: an unprivileged sandbox uid must be able to reach it.
    state = Path(tempfile.mkdtemp(prefix="e2b-compat-features-", dir="/var/tmp"))
    try:
        state.chmod(0o755)
        declared = backend_entry(name).features()
        assert isinstance(declared, frozenset)
        assert declared == _opened_features(name, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_reading_the_list_does_not_open_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("runtime.listed_only")
    module.FEATURES = frozenset({Feature.METRICS})  # type: ignore[attr-defined]

    def never(options: BackendOptions) -> None:
        raise AssertionError("opened")

    module.open_backend = never  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "runtime.listed_only", module)
    entry = backends._entry("listed", "listed_only", "a backend listing only metrics")
    assert entry.features() == frozenset({Feature.METRICS})


def test_a_module_without_a_list_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "runtime.unlisted", types.ModuleType("runtime.unlisted"))
    entry = backends._entry("unlisted", "unlisted", "a backend that forgot its list")
    with pytest.raises(BackendError, match=r"runtime\.unlisted declares no FEATURES"):
        entry.features()


def test_an_entry_made_by_hand_provides_the_defaults() -> None:
    entry = backends.BackendEntry("other", lambda options: None, lambda say: None, "another")  # type: ignore[arg-type,return-value]
    assert entry.features() == DEFAULT_FEATURES
