"""Cases run side by side keep the selection's order in the run, and every result is reported once;
and cases that check one scenario share its run."""

from __future__ import annotations

import threading
import time

import pytest

from conformance import _harness
from conformance._cases import Case
from conformance._endpoint import ExternalEndpoint
from conformance._harness import ClientSet, RunPlan, run_cases
from conformance._model import CaseResult, Outcome
from conformance._scenarios import ScenarioError, ScenarioRun


@pytest.mark.parametrize("jobs", [1, 3])
def test_results_keep_the_selection_order(monkeypatch: pytest.MonkeyPatch, jobs: int) -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def fake_run_one(plan: RunPlan, clients: ClientSet, case: Case, flavour: str, runs: object = None) -> CaseResult:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        # Later cases finish first, so completion order is the reverse of the selection.
        time.sleep(0.05 if case.name.startswith("envd/commands/foreground") else 0.01)
        with lock:
            running -= 1
        return CaseResult(case.name, clients.info(flavour), Outcome.PASS, 0.0, case.operations)

    monkeypatch.setattr(_harness, "_run_one", fake_run_one)
    endpoint = ExternalEndpoint({"E2B_DOMAIN": "example.localhost:1", "E2B_API_KEY": "e2b_x"})
    plan = RunPlan(endpoint, (ClientSet(None, None, "1", "2"),), match="envd/commands/", jobs=jobs)
    selected = _harness._selected(plan)
    seen: list[str] = []
    run = run_cases(plan, on_result=lambda result: seen.append(f"{result.client.flavour}:{result.case}"))
    assert [(r.case, r.client.flavour) for r in run.results] == [(c.name, f) for _, c, f in selected]
    assert sorted(seen) == sorted(f"{f}:{c.name}" for _, c, f in selected)
    assert (most > 1) if jobs > 1 else (most == 1)


def test_a_scenario_runs_once_for_the_cases_that_share_it() -> None:
    runs = _harness._ScenarioRuns()
    made: list[str] = []
    started = threading.Event()

    def make() -> ScenarioRun:
        made.append("run")
        started.set()
        time.sleep(0.05)  # a second worker asks meanwhile, and waits
        return ScenarioRun({"items": [1]}, (), 0.1)

    other: list[ScenarioRun] = []

    def second() -> None:
        started.wait()
        other.append(runs.run(("k",), make))

    worker = threading.Thread(target=second)
    worker.start()
    first = runs.run(("k",), make)
    worker.join()
    first.result["items"].append(2)  # a check that changes its copy
    assert made == ["run"]
    assert other[0].result == {"items": [1]}
    assert runs.run(("k",), make).result == {"items": [1]}
    runs.run(("other",), make)
    assert made == ["run", "run"]


def test_a_failed_scenario_fails_every_case_that_shares_it() -> None:
    runs = _harness._ScenarioRuns()
    calls = []

    def make() -> ScenarioRun:
        calls.append(1)
        raise ScenarioError("py-sync:x failed (exit 1)")

    for _ in range(2):
        with pytest.raises(ScenarioError, match="exit 1"):
            runs.run(("k",), make)
    assert calls == [1]


def test_a_run_that_stops_drops_the_cases_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def failing_run_one(plan: RunPlan, clients: ClientSet, case: Case, flavour: str, runs: object = None) -> CaseResult:
        ran.append(case.name)
        raise KeyboardInterrupt  # what Ctrl-C raises in the worker's place

    monkeypatch.setattr(_harness, "_run_one", failing_run_one)
    endpoint = ExternalEndpoint({"E2B_DOMAIN": "example.localhost:1", "E2B_API_KEY": "e2b_x"})
    plan = RunPlan(endpoint, (ClientSet(None, None, "1", "2"),), match="envd/commands/", jobs=2)
    with pytest.raises(KeyboardInterrupt):
        run_cases(plan)
    # The two under way, and perhaps one a worker took up while the first failure reached the caller.
    assert 1 <= len(ran) <= 3, ran
    assert len(_harness._selected(plan)) > 10, "the rest were dropped"
