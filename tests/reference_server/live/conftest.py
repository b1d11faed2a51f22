"""The real reference server (TLS, crun sandboxes) as a process of its own, for the official clients.

The server runs ``e2b-compat serve`` exactly as the README says, configured only through its
documented environment variables, in a process group of its own; the clients get nothing but
the four variables the server prints (``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE``,
``NODE_EXTRA_CA_CERTS``). The crash tests stop it with SIGKILL and start it again on the same
data directory; at the end every sandbox it made is gone and nothing is left mounted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from conformance._endpoint import EndpointError, ManagedServer
from conformance._scenarios import SCENARIOS as ALL_SCENARIOS
from conformance._scenarios import ScenarioRunner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server's crun sandboxes need root")

SCENARIOS = ALL_SCENARIOS / "sandbox"
LiveServer = ManagedServer


@contextlib.contextmanager
def managed_server(prefix: str, extra_env: dict[str, str] | None = None) -> Iterator[LiveServer]:
    """A server of its own data folder under /var/tmp; afterwards its sandboxes, mounts and files are gone."""
    # Not under pytest's private temp root: idmapped sandbox users must traverse to their layers.
    data_dir = Path(tempfile.mkdtemp(prefix=f"e2b-compat-{prefix}-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    server = ManagedServer(data_dir, data_dir.with_suffix(".log"), extra_env=extra_env or {})
    try:
        try:
            server.start()
        except EndpointError as exc:
            pytest.fail(str(exc))
        yield server
    finally:
        server.stop()
        server.release_everything()
        leftovers = [line for line in Path("/proc/mounts").read_text().splitlines() if str(data_dir) in line]
        with contextlib.suppress(OSError):
            shutil.rmtree(data_dir)
        data_dir.with_suffix(".log").unlink(missing_ok=True)
        assert not leftovers, f"mounts left behind: {leftovers}"


@pytest.fixture(scope="package")
def live_server() -> Iterator[LiveServer]:
    with managed_server(
        "server",
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
