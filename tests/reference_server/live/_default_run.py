"""The harness's full run on the default backend, once per test session, and each case's verdict from it.

``nox -s conformance`` is the release gate: every case in every client flavour against a server of
the default backend, signed. The live tests of that backend read their verdicts from one such run
(``full_run``; ``test_harness`` checks its signature and gate) rather than running every scenario
a second time. A verdict is the harness's own outcome for the case in that flavour, for every
pinned client version it ran. Off the default backend a live case runs in the one flavour
``chosen_flavour`` picks for its scenario, on the one backend ``chosen_backend`` picks.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance._cases import Case
from conformance._endpoint import ManagedServer as LiveServer
from conformance._run import FEATURES, RunOptions, main_run
from runtime.backends import DEFAULT_BACKEND

__all__ = ["CaseRun", "Result", "chosen_backend", "chosen_flavour", "full_run", "verdict"]

_GREEN = ("pass", "fixed")
JOBS = 3  # cases side by side: also shows that they do not disturb one another


@dataclass(frozen=True)
class Result:
    outcome: str  # conformance._model.Outcome's value
    version: str  # the client's
    detail: str


@dataclass(frozen=True)
class CaseRun:
    backend: str
    status: int  # the full run: main_run's exit status (0: every case passed, the gate held); else 0
    report_dir: Path | None  # the full run's signed report
    results: Mapping[tuple[str, str], tuple[Result, ...]]  # (case, flavour) → its results

    @property
    def report(self) -> Path:
        assert self.report_dir is not None
        return self.report_dir / "report.json"


def chosen_flavour(case: Case) -> str:
    """The one flavour a case runs in off the default backend: a hash of its scenario picks it.

    Cases that check one scenario share its run; over all scenarios every client meets every backend.
    """
    flavours = sorted(case.flavours)
    return flavours[zlib.crc32(case.scenario.encode()) % len(flavours)]


def chosen_backend(case: Case, backends: Collection[str]) -> str:
    """The one of ``backends`` (those off the default) a case runs on in the suite: a hash of its name.

    Of its name, not its scenario's as for the flavour: each test off the default backend runs its
    scenario itself, and the families with few scenarios (volumes) still spread over the backends.
    """
    ordered = sorted(backends)
    return ordered[zlib.crc32(case.name.encode()) % len(ordered)]


def full_run(server: LiveServer, folder: Path) -> CaseRun:
    """Every suite of the harness against ``server`` (the default backend), signed."""
    options = RunOptions(
        endpoint_env=dict(server.client_env),
        second_api_key=server.issue_key("harness-second"),
        python_versions=(),
        node_versions=(),
        match="",
        output=folder / "report",
        reports_root=folder,
        features=FEATURES,
        signing_key=folder / "signing-key.pem",
        server_name="e2b-compat reference server",
        backend=DEFAULT_BACKEND,
        jobs=JOBS,
        local_registry=True,  # the live server is on this host
    )
    status = main_run(options)
    report_dir = folder / "report"
    results: dict[tuple[str, str], list[Result]] = {}
    report = report_dir / "report.json"
    if report.exists():
        for entry in json.loads(report.read_text())["results"]:
            result = Result(entry["outcome"], entry["client"].get("version", ""), entry["detail"])
            results.setdefault((entry["case"], entry["client"]["flavour"]), []).append(result)
    return CaseRun(DEFAULT_BACKEND, status, report_dir, {key: tuple(found) for key, found in results.items()})


def verdict(run: CaseRun, flavour: str, case: Case) -> None:
    """Fail unless the run has the case in that flavour and every result of it is green."""
    found = run.results.get((case.name, flavour))
    if not found:
        pytest.fail(f"the harness's run on {run.backend} has no result for {case.name} in {flavour}", pytrace=False)
    for result in found:
        if result.outcome not in _GREEN:
            pytest.fail(f"{result.outcome} ({flavour} {result.version}): {result.detail}", pytrace=False)
