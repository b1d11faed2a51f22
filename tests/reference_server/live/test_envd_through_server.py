"""The agent's envd scenarios, run by the official clients against real sandboxes on the server.

The same scenario scripts and checks as ``tests/runtime/agent`` (debug mode against a bare
agent), now configured only by the server's client environment: each scenario creates its own
sandbox through the control plane, then reaches envd through TLS, the host-routed edge and the
streaming proxy into the sandbox's network namespace. The working folder is ``/home/user``.
"""

from __future__ import annotations

import pytest

from conformance._cases import Case, cases
from conformance._scenarios import ScenarioRunner

from .conftest import check_case

pytestmark = [pytest.mark.artifacts]

# Cases whose checks describe the bare agent's host rather than a sandbox.
HOST_ONLY = {"envd/commands/user-and-env"}


@pytest.mark.parametrize(
    ("flavour", "case"),
    [
        pytest.param(f, case, id=f"{f}:{case.name}")
        for case in cases("envd")
        if case.name not in HOST_ONLY
        for f in case.flavours
    ],
)
def test_envd_scenario_through_the_server(
    request: pytest.FixtureRequest, server_scenario: ScenarioRunner, flavour: str, case: Case
) -> None:
    check_case(request, server_scenario, flavour, case)


def test_a_large_file_streams_through_the_edge(server_scenario: ScenarioRunner) -> None:
    result = server_scenario("py-sync", "files/large", timeout=600)
    assert result["size"] == 100 * 1024 * 1024
    assert result["sha_equal"] is True
