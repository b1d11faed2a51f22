"""The release gate (gate.json, evaluate) and the known-failures list (apply_known_failures)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conformance._coverage import CellOutcome, coverage
from conformance._gate import (
    GATE_POLICY_PATH,
    KNOWN_FAILURES_PATH,
    KnownFailure,
    PolicyError,
    apply_known_failures,
    evaluate,
    for_backend,
    load_known_failures,
    load_policy,
)
from conformance._model import CaseResult, Outcome
from runtime.backends import DEFAULT_BACKEND, serving_backends
from tests.conformance.test_report import INVENTORY, result

POLICY = load_policy(inventory=INVENTORY)
BY_ID = {op.id: op for op in INVENTORY}


def all_green() -> list[CaseResult]:
    return [result(f"case/{op}", flavour, Outcome.PASS, op) for op, flavour in POLICY.required]


# --- the committed policy ---


def test_committed_policy_names_sdk_operations_for_the_flavours_that_call_them() -> None:
    assert POLICY.required
    for group in POLICY.groups:
        assert group.why
        for op_id in group.operations:
            op = BY_ID[op_id]
            assert op.called_by_sdk, op_id
            for flavour in group.flavours:
                if flavour == "js":
                    assert op.js_entry_points, op_id
                else:
                    # e2b's sandbox and volume modules, or e2b_code_interpreter's for the interpreter operations
                    modules = {
                        "py-sync": (".sandbox_sync.", ".code_interpreter_sync.", ".volume_sync."),
                        "py-async": (".sandbox_async.", ".code_interpreter_async.", ".volume_async."),
                    }[flavour]
                    # envd HTTP helpers are shared by both Python flavours; the rest name the flavour's module
                    assert any(m in ep for ep in op.python_entry_points for m in (*modules, ".envd.")), (op_id, flavour)


def test_committed_policy_covers_lifecycle_processes_and_filesystem() -> None:
    required = {op for op, _ in POLICY.required}
    assert {"control.sandboxes.create", "control.sandboxes.kill", "control.sandboxes.connect"} <= required
    assert {op.id for op in INVENTORY if op.id.startswith("envd.process.") and op.called_by_sdk} <= required
    assert {op.id for op in INVENTORY if op.id.startswith("envd.filesystem.") and op.called_by_sdk} <= required
    assert ("envd.filesystem.CreateWatcher", "js") not in POLICY.required  # JS streams instead of polling
    assert ("envd.filesystem.WatchDir", "py-sync") not in POLICY.required


def test_committed_policy_requires_the_interpreter_calls_of_every_client() -> None:
    called = {op.id for op in INVENTORY if op.surface == "interpreter" and op.called_by_sdk}
    assert called == {
        "interpreter.execute",
        "interpreter.contexts.create",
        "interpreter.contexts.list",
        "interpreter.contexts.remove",
        "interpreter.contexts.restart",
    }
    for flavour in ("py-sync", "py-async", "js"):
        assert {op for op, f in POLICY.required if f == flavour and op.startswith("interpreter.")} == called
    # No client calls /health, so no client flavour can make it green; a wire case covers it.
    assert not any(op == "interpreter.health" for op, _ in POLICY.required)


def test_the_policy_digest_is_of_the_file() -> None:
    assert POLICY.sha256 == hashlib.sha256(GATE_POLICY_PATH.read_bytes()).hexdigest()


def _policy_file(tmp_path: Path, groups: object) -> Path:
    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"schema": 1, "groups": groups}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"name": "g", "why": "w", "flavours": ["js"], "operations": ["control.sandboxes.craete"]}], "craete"),
        ([{"name": "g", "why": "", "flavours": ["js"], "operations": ["control.sandboxes.create"]}], "non-empty"),
        ([{"name": "g", "flavours": ["js"], "operations": ["control.sandboxes.create"]}], "exactly the keys"),
        ([{"name": "g", "why": "w", "flavours": [], "operations": ["control.sandboxes.create"]}], "non-empty"),
        ([{"name": "g", "why": "w", "flavours": ["js", "js"], "operations": ["envd.process.List"]}], "twice"),
        ("not a list", "list of groups"),
    ],
)
def test_a_malformed_policy_is_refused(tmp_path: Path, groups: object, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy(_policy_file(tmp_path, groups), inventory=INVENTORY)


# --- evaluate ---


def test_gate_passes_when_every_required_operation_is_green() -> None:
    gate = evaluate(coverage(all_green(), INVENTORY), POLICY)
    assert gate.passed
    assert gate.failures == ()
    assert gate.required == POLICY.required
    assert gate.policy_sha256 == POLICY.sha256


def test_gate_fails_and_names_a_failing_required_operation() -> None:
    results = all_green()
    results.append(
        result("sandbox/pause-twice", "js", Outcome.FAIL, "control.sandboxes.pause", detail="expected 409, got 500")
    )
    gate = evaluate(coverage(results, INVENTORY), POLICY)
    assert not gate.passed
    [failure] = gate.failures
    assert (failure.operation, failure.flavour, failure.outcome) == ("control.sandboxes.pause", "js", CellOutcome.FAIL)
    assert failure.detail == "sandbox/pause-twice: expected 409, got 500"


def test_gate_fails_on_a_gap_and_on_a_flavour_that_did_not_run() -> None:
    results = [r for r in all_green() if r.operations != ("envd.process.Update",) or r.client.flavour != "py-sync"]
    results = [r for r in results if r.client.flavour != "js"]
    gate = evaluate(coverage(results, INVENTORY), POLICY)
    assert not gate.passed
    failures = {(f.operation, f.flavour): f for f in gate.failures}
    update = failures["envd.process.Update", "py-sync"]
    assert update.outcome is CellOutcome.GAP
    assert update.detail == "no case covers it"
    create = failures["control.sandboxes.create", "js"]
    assert create.outcome is CellOutcome.GAP
    assert create.detail == "no result for this client flavour"
    assert {flavour for _, flavour in failures} == {"py-sync", "js"}


@pytest.mark.parametrize("outcome", [Outcome.KNOWN_FAIL, Outcome.UNSUPPORTED, Outcome.SKIP])
def test_known_failures_unsupported_and_skips_are_not_green(outcome: Outcome) -> None:
    results = [r for r in all_green() if (r.operations, r.client.flavour) != (("envd.process.Start",), "py-async")]
    results.append(result("commands/run", "py-async", outcome, "envd.process.Start", reason="why", upstream="400"))
    gate = evaluate(coverage(results, INVENTORY), POLICY)
    assert [(f.operation, f.flavour, f.outcome.value) for f in gate.failures] == [
        ("envd.process.Start", "py-async", outcome.value)
    ]


def test_fixed_counts_as_green() -> None:
    results = [r for r in all_green() if (r.operations, r.client.flavour) != (("envd.process.Start",), "js")]
    results.append(result("commands/run", "js", Outcome.FIXED, "envd.process.Start", reason="issue 7"))
    assert evaluate(coverage(results, INVENTORY), POLICY).passed


# --- known failures ---


def test_committed_known_failures_file_loads_and_documents_its_format() -> None:
    known = load_known_failures()
    assert for_backend(known, DEFAULT_BACKEND) == (), "the default backend fails nothing on purpose"
    assert all(entry.backend in serving_backends() for entry in known), "each names a backend that serves"
    document = json.loads(KNOWN_FAILURES_PATH.read_text(encoding="utf-8"))
    assert "reason" in document["$comment"]


def test_listed_failures_become_known_fail_and_listed_passes_become_fixed() -> None:
    known = [
        KnownFailure("sandbox/pause-twice", "js", "issue 12: pause of a paused sandbox"),
        KnownFailure("commands/run", "py-sync", "issue 7"),
        KnownFailure("network/update", "py-sync", "issue 9"),
    ]
    results = [
        result("sandbox/pause-twice", "js", Outcome.FAIL, "control.sandboxes.pause", detail="got 500"),
        result("sandbox/pause-twice", "py-sync", Outcome.FAIL, "control.sandboxes.pause", detail="got 500"),
        result("commands/run", "py-sync", Outcome.PASS, "envd.process.Start"),
        result("network/update", "py-sync", Outcome.SKIP, "control.sandboxes.update_network", reason="no node"),
    ]
    applied = apply_known_failures(results, known)
    assert applied.stale == ()
    js_pause, py_pause, run, network = applied.results
    assert (js_pause.outcome, js_pause.reason, js_pause.detail) == (
        Outcome.KNOWN_FAIL,
        "issue 12: pause of a paused sandbox",
        "got 500",  # kept: a known failure that starts failing differently stays visible
    )
    assert py_pause == results[1]  # listed for js only
    assert (run.outcome, run.reason) == (Outcome.FIXED, "issue 7")
    assert network == results[3]  # a skip says nothing about the failure


def test_entries_for_cases_that_no_longer_run_are_stale() -> None:
    known = [
        KnownFailure("renamed/away", "js", "issue 1"),  # the case is gone
        KnownFailure("commands/run", "py-async", "issue 2"),  # py-async ran, but not this case
        KnownFailure("commands/run", "js", "issue 3"),  # js did not run at all: not evidence of anything
        KnownFailure("commands/run", "py-sync", "issue 4"),  # still runs
    ]
    results = [
        result("commands/run", "py-sync", Outcome.FAIL, "envd.process.Start"),
        result("other", "py-async", Outcome.PASS, "envd.process.List"),
    ]
    applied = apply_known_failures(results, known)
    assert applied.stale == (known[0], known[1])
    assert applied.results[0].outcome is Outcome.KNOWN_FAIL


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"case": "a", "flavour": "js"}], "non-empty strings"),
        ([{"case": "a", "flavour": "js", "reason": " "}], "non-empty strings"),
        ([{"case": "a", "flavour": "js", "reason": "r", "until": "2027"}], "nothing else"),
        ([{"case": "a", "flavour": "js", "reason": "r"}, {"case": "a", "flavour": "js", "reason": "s"}], "twice"),
    ],
)
def test_a_malformed_known_failures_file_is_refused(tmp_path: Path, entries: object, message: str) -> None:
    path = tmp_path / "known-failures.json"
    path.write_text(json.dumps({"schema": 1, "known_failures": entries}), encoding="utf-8")
    with pytest.raises(PolicyError, match=message):
        load_known_failures(path)


def test_a_known_failures_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "known-failures.json"
    entry = {"case": "sandbox/pause-twice", "flavour": "js", "reason": "issue 12"}
    path.write_text(json.dumps({"$comment": "c", "schema": 1, "known_failures": [entry]}), encoding="utf-8")
    assert load_known_failures(path) == (KnownFailure("sandbox/pause-twice", "js", "issue 12"),)
