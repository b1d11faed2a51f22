"""What needs which backend feature (``conformance._backend_features``), and known failures per backend."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conformance import CASES
from conformance._backend_features import (
    FeatureNeed,
    FeaturesFileError,
    apply_missing_features,
    explain_missing,
    load_feature_needs,
    managed_features,
)
from conformance._coverage import coverage
from conformance._gate import KnownFailure, PolicyError, apply_known_failures, for_backend, load_known_failures
from conformance._model import Outcome, Target
from conformance._report import to_markdown
from contract import load_inventory
from runtime.backend import DEFAULT_FEATURES, Feature
from tests.conformance.test_report import gate_of, make_run, result

INVENTORY = {operation.id for operation in load_inventory()}
PAUSE = FeatureNeed(
    "pause-memory", ("sandbox/pause-memory-*",), ("control.sandboxes.pause",), "no freezer", 501, "nope"
)
ALL_BUT_PAUSE = tuple(sorted(f.value for f in Feature if f is not Feature.PAUSE_MEMORY))


def test_the_committed_file_names_every_runtime_feature_and_only_inventory_operations() -> None:
    needs = load_feature_needs()
    assert {need.feature for need in needs} == {feature.value for feature in Feature}
    for need in needs:
        assert set(need.operations) <= INVENTORY, need.feature
        assert need.reason
        assert need.upstream_status >= 400


def test_every_case_pattern_names_cases_that_exist() -> None:
    names = [case.name for case in CASES]
    for need in load_feature_needs():
        for pattern in need.cases:
            assert any(need.covers_case(name) for name in names), f"{need.feature}: {pattern} matches no case"


def test_a_file_missing_a_feature_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "backend-features.json"
    entry = {"cases": [], "operations": [], "reason": "r", "upstream": {"status": 501, "meaning": "m"}}
    path.write_text(json.dumps({"schema": 1, "features": {"metrics": entry}}), encoding="utf-8")
    with pytest.raises(FeaturesFileError, match="missing"):
        load_feature_needs(path)


def test_a_refused_case_on_a_backend_lacking_its_feature_becomes_unsupported() -> None:
    declared = result("sandbox/pause-memory-connect", "js", Outcome.FAIL, "control.sandboxes.pause", detail="got 501")
    other_answer = result("sandbox/pause-memory-connect", "py-sync", Outcome.FAIL, "x", detail="got 500")
    unrelated = result("envd/commands/foreground", "js", Outcome.FAIL, "envd.process.Start", detail="got 501")
    results = [declared, other_answer, unrelated]
    rewritten = apply_missing_features(results, "gvisor", ALL_BUT_PAUSE, [PAUSE])
    assert rewritten[0].outcome is Outcome.UNSUPPORTED
    assert rewritten[0].reason == "backend gvisor lacks pause-memory: no freezer"
    assert rewritten[0].upstream == "501: nope"
    assert rewritten[1:] == [other_answer, unrelated], "another answer, or another case, stays a failure"
    # The feature provided, or unknown (a foreign endpoint): nothing is rewritten.
    assert apply_missing_features(results, "crun", [f.value for f in Feature], [PAUSE]) == results
    assert apply_missing_features(results, "unknown", None, [PAUSE]) == results


def test_a_missing_feature_explains_the_cases_and_operations_that_need_it() -> None:
    assert explain_missing(ALL_BUT_PAUSE, case="sandbox/pause-memory-connect", needs=[PAUSE]) == [PAUSE]
    assert explain_missing(ALL_BUT_PAUSE, operation="control.sandboxes.pause", needs=[PAUSE]) == [PAUSE]
    assert explain_missing(ALL_BUT_PAUSE, case="sandbox/metrics", needs=[PAUSE]) == []
    assert explain_missing(None, case="sandbox/pause-memory-connect", needs=[PAUSE]) == []


def test_a_managed_backend_lists_what_the_table_says() -> None:
    assert managed_features("fake") == tuple(sorted(feature.value for feature in DEFAULT_FEATURES))


def test_the_report_shows_the_backend_features_or_unknown() -> None:
    run = make_run(result("envd/commands/foreground", "js", Outcome.PASS, "envd.process.Start"))
    cov = coverage(run.results, load_inventory())
    listed = dataclasses.replace(run, target=Target("s", "d", "base", "gvisor", ALL_BUT_PAUSE))
    markdown = to_markdown(listed, cov, gate_of(listed))
    assert "- backend features: `disk-limit`" in markdown
    assert "; lacks `pause-memory`" in markdown
    assert "- backend features: unknown" in to_markdown(run, cov, gate_of(run))


# --- known failures per backend ---


def test_an_entry_for_one_backend_holds_only_on_that_backend(tmp_path: Path) -> None:
    path = tmp_path / "known-failures.json"
    entries = [
        {"case": "sandbox/metrics", "flavour": "js", "reason": "runsc reports no pids", "backend": "gvisor"},
        {"case": "sandbox/metrics", "flavour": "js", "reason": "everywhere"},
        {"case": "sandbox/metrics", "flavour": "py-sync", "reason": "gvisor py", "backend": "gvisor"},
    ]
    path.write_text(json.dumps({"schema": 1, "known_failures": entries}), encoding="utf-8")
    known = load_known_failures(path)
    assert known[0] == KnownFailure("sandbox/metrics", "js", "runsc reports no pids", "gvisor")
    failing = [
        result("sandbox/metrics", flavour, Outcome.FAIL, "control.sandboxes.metrics") for flavour in ("js", "py-sync")
    ]
    on_gvisor = apply_known_failures(failing, for_backend(known, "gvisor")).results
    assert [(r.outcome, r.reason) for r in on_gvisor] == [
        (Outcome.KNOWN_FAIL, "runsc reports no pids"),  # its own entry before the one for every backend
        (Outcome.KNOWN_FAIL, "gvisor py"),
    ]
    on_crun = apply_known_failures(failing, for_backend(known, "crun")).results
    assert [(r.outcome, r.reason) for r in on_crun] == [(Outcome.KNOWN_FAIL, "everywhere"), (Outcome.FAIL, "")]


def test_the_same_entry_twice_for_one_backend_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "known-failures.json"
    entry = {"case": "a", "flavour": "js", "reason": "r", "backend": "docker"}
    path.write_text(json.dumps({"schema": 1, "known_failures": [entry, entry]}), encoding="utf-8")
    with pytest.raises(PolicyError, match=r"a \(js\) on docker is listed twice"):
        load_known_failures(path)
