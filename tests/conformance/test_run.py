"""The run's exit status (``conformance._run``): the gate, and every case whether gated or not."""

from __future__ import annotations

from conformance._model import CaseResult, ClientInfo, Outcome
from conformance._run import exit_status, failed_cases
from tests.conformance.test_report import make_run

PY = ClientInfo("py-sync", "e2b", "2.32.0")


def _result(case: str, outcome: Outcome) -> CaseResult:
    return CaseResult(case, PY, outcome, 0.1, ("control.sandboxes.metrics",))


def test_a_failing_case_outside_the_gate_fails_the_run() -> None:
    run = make_run(_result("sandbox/lifecycle/metrics", Outcome.FAIL), _result("envd/x", Outcome.PASS))
    assert [r.case for r in failed_cases(run)] == ["sandbox/lifecycle/metrics"]
    assert exit_status(run, gate_passed=True) == 1


def test_known_failures_and_unsupported_features_leave_it_to_the_gate() -> None:
    run = make_run(_result("a", Outcome.KNOWN_FAIL), _result("b", Outcome.UNSUPPORTED), _result("c", Outcome.PASS))
    assert failed_cases(run) == []
    assert exit_status(run, gate_passed=True) == 0
    assert exit_status(run, gate_passed=False) == 1
