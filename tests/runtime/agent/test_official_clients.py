"""The agent, driven by the pinned official clients (Python sync, Python async, JS), unchanged.

Each case (``conformance._cases``, family ``envd``) runs a scenario script in the client's own
environment (``conformance/scenarios/envd``) and checks what it observed; the same cases run
through the reference server in ``tests/reference_server/live``.
"""

from __future__ import annotations

import pytest

from conformance._cases import Case, cases
from conformance._scenarios import ScenarioRunner
from tests.clients import newest, runner_for

from .conftest import Agent

pytestmark = pytest.mark.artifacts


@pytest.mark.parametrize(
    ("flavour", "case"),
    [pytest.param(f, case, id=f"{f}:{case.scenario}") for case in cases("envd") for f in case.flavours],
)
def test_scenario(scenario: ScenarioRunner, flavour: str, case: Case) -> None:
    scenario = runner_for(scenario, flavour, case)  # the newest clients for a case newer than the pinned
    result = scenario(flavour, case.scenario)
    case.check(result, scenario.work(flavour, case.scenario))


@pytest.mark.parametrize("flavour", ["py-sync", "py-async", "js"])
def test_a_symlink_is_shown_as_one_by_the_newest_clients_that_read_is_symlink(
    scenario: ScenarioRunner, flavour: str
) -> None:
    """The newest contract's ``is_symlink``, as the newest clients read it (Python from 2.55; npm reads none)."""
    case = next(c for c in cases("envd") if c.scenario == "files/symlink")
    runner = newest(scenario)
    result = runner(flavour, case.scenario)
    case.check(result, runner.work(flavour, case.scenario))
    assert result["info"]["type"] == ("file" if flavour == "js" else "symlink")


def test_large_file_is_streamed_both_ways(scenario: ScenarioRunner, agent: Agent) -> None:
    """100 MiB up and down through the Python client; the agent's peak memory barely moves."""
    before = _peak_rss_kib(agent.pid)
    result = scenario("py-sync", "files/large", timeout=600)
    after = _peak_rss_kib(agent.pid)
    assert result["size"] == 100 * 1024 * 1024
    assert result["sha_equal"] is True
    assert after - before < 32 * 1024, f"agent peak RSS grew by {after - before} KiB for a 100 MiB round trip"


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")
