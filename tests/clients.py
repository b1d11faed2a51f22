"""The official clients a test case runs with: the pinned ones, or the newest for a case newer than them.

A case whose scenario calls an API the pinned clients do not have (``Case.since``) cannot run with
them; the tests that run cases directly (not through the harness, which skips it for them) run it
with the newest committed clients instead, so the API is tested wherever the case runs.
"""

from __future__ import annotations

from conformance._cases import Case
from conformance._clients import (
    available_node_versions,
    available_python_versions,
    ensure_node_clients,
    ensure_python_clients,
)
from conformance._scenarios import ScenarioRunner

__all__ = ["newest", "predates", "runner_for"]


def predates(runner: ScenarioRunner, flavour: str, case: Case) -> bool:
    """Whether the runner's client for ``flavour`` is older than the API ``case`` calls."""
    return case.predates(runner.node.version if flavour == "js" else runner.python.version)


def newest(runner: ScenarioRunner) -> ScenarioRunner:
    """``runner`` with the newest committed clients instead of its own."""
    return ScenarioRunner(
        ensure_python_clients(available_python_versions()[-1]),
        ensure_node_clients(available_node_versions()[-1]),
        env=runner.env,
        workdir=runner.workdir,
        scripts=runner.scripts,
    )


def runner_for(runner: ScenarioRunner, flavour: str, case: Case) -> ScenarioRunner:
    """``runner``, or its newest-clients twin when its client predates ``case``."""
    return newest(runner) if predates(runner, flavour, case) else runner
