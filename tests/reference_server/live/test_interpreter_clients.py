"""The code interpreter driven by the pinned official interpreter clients, unchanged, on real sandboxes.

The cases are the conformance harness's own (``conformance._cases``, family ``interpreter``): each
scenario creates a ``code-interpreter-v1`` sandbox (the clients' default template) through the
live server, and one check per result says what must hold for every client flavour. The edge's
traffic-token rule on port 49999 is shown once more here with our server's exact refusal.
"""

from __future__ import annotations

import json

import pytest

from conformance._cases import Case, cases
from conformance._clients import NodeClients, PythonClients
from conformance._scenarios import SCENARIOS, ScenarioRunner

from .conftest import LiveServer, check_case

pytestmark = [pytest.mark.artifacts]


@pytest.fixture(scope="module")
def interpreter(backend_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients) -> ScenarioRunner:
    """Interpreter scenarios (``scenarios/interpreter``) per client flavour, through the live server of each backend."""
    return ScenarioRunner(
        python_clients,
        node_clients,
        env=backend_server.clients_env(),
        workdir=lambda name: "/home/user",
        scripts=SCENARIOS / "interpreter",
    )


@pytest.mark.parametrize(
    ("flavour", "case"),
    [pytest.param(f, case, id=f"{f}:{case.name}") for case in cases("interpreter") for f in case.flavours],
)
def test_interpreter_scenario(
    request: pytest.FixtureRequest, interpreter: ScenarioRunner, flavour: str, case: Case
) -> None:
    check_case(request, interpreter, flavour, case)


def test_the_edge_requires_the_traffic_token_on_the_interpreter_port(interpreter: ScenarioRunner) -> None:
    """A sandbox made by the official Python client with ``allow_public_traffic`` off, probed with httpx:
    port 49999 answers 403 without ``E2B-Traffic-Access-Token`` and the interpreter's 200 with it."""
    result = interpreter("py-sync", "interpreter/network/private-traffic")
    assert result["has_token"] is True
    assert result["without"] == 403
    refusal = json.loads(result["without_body"])  # the edge's own refusal, before any proxying
    assert refusal["code"] == 403
    assert isinstance(refusal["message"], str)
    assert refusal["message"]
    assert result["with"] == 200
    assert json.loads(result["with_body"]) == "OK"
    assert result["run"] == "2", "run_code sends the token itself"
