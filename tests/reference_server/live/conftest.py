"""The real reference server (TLS, crun sandboxes) as a process of its own, for the official clients.

The server runs ``e2b-compat serve`` exactly as the README says, configured only through its
documented environment variables, in a process group of its own; the clients get nothing but
the four variables the server prints (``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE``,
``NODE_EXTRA_CA_CERTS``). The crash tests stop it with SIGKILL and start it again on the same
data directory; at the end every sandbox it made is gone and nothing is left mounted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from conformance._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from conformance._endpoint import ManagedServer
from conformance._scenarios import SCENARIOS as ALL_SCENARIOS
from conformance._scenarios import ScenarioRunner
from tests.servers import managed_server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server's crun sandboxes need root")

SCENARIOS = ALL_SCENARIOS / "sandbox"
LiveServer = ManagedServer


@pytest.fixture(scope="package")
def live_server() -> Iterator[LiveServer]:
    with managed_server(
        "compat-server",
        {"E2B_COMPAT_SERVER_REAPER_INTERVAL_SECONDS": "0.5", "E2B_COMPAT_SERVER_METRICS_INTERVAL_SECONDS": "1"},
    ) as server:
        yield server


@pytest.fixture(scope="session")
def python_clients() -> PythonClients:
    return ensure_python_clients()


@pytest.fixture(scope="session")
def node_clients() -> NodeClients:
    return ensure_node_clients()


@pytest.fixture(scope="package")
def server_scenario(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> ScenarioRunner:
    """The agent's envd scenarios, now through the server: real sandboxes, TLS, the edge and proxy."""
    return ScenarioRunner(
        python_clients, node_clients, env=live_server.clients_env(), workdir=lambda name: "/home/user"
    )


@pytest.fixture(scope="package")
def lifecycle(live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients) -> ScenarioRunner:
    """Control-plane scenarios (``scenarios/``): create, list, pause, snapshot, ... per client flavour."""
    second = live_server.issue_key("second-owner")
    return ScenarioRunner(
        python_clients,
        node_clients,
        env=live_server.clients_env(SECOND_API_KEY=second),
        workdir=lambda name: "/home/user",
        scripts=SCENARIOS,
    )
