"""Cases run side by side keep the selection's order in the run, and every result is reported once."""

from __future__ import annotations

import threading
import time

import pytest

from conformance import _harness
from conformance._cases import Case
from conformance._endpoint import ExternalEndpoint
from conformance._harness import ClientSet, RunPlan, run_cases
from conformance._model import CaseResult, Outcome


@pytest.mark.parametrize("jobs", [1, 3])
def test_results_keep_the_selection_order(monkeypatch: pytest.MonkeyPatch, jobs: int) -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def fake_run_one(plan: RunPlan, clients: ClientSet, case: Case, flavour: str) -> CaseResult:
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
