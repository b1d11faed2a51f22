"""The real reference server (TLS, real sandboxes) as a process of its own, for the official clients.

The server runs ``e2b-compat serve`` exactly as the README says, configured only through its
documented environment variables, in a process group of its own; the clients get nothing but
the four variables the server prints (``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE``,
``NODE_EXTRA_CA_CERTS``). The crash tests stop it with SIGKILL and start it again on the same
data directory; at the end every sandbox it made is gone and nothing is left mounted.

The client scenarios (envd, lifecycle, interpreter) run once per serving backend of the runtime's
table (``backend_server``), so every isolation is held to the same cases; on the default backend
their verdicts come from the harness's full run (``_default_run``), which runs them all, three at
a time; off it each case runs once, on one backend in one flavour, where the test runs its
scenario (``one_run_off_the_default``). The tests of the server's own behaviour
(crashes, the edge's refusals, admission) run on the default backend.
A case newer than the pinned clients (``Case.since``) runs with the newest committed ones.
A case ``conformance/known-failures.json`` lists for a backend is a strict xfail there
(``_known_failures``): it still runs, and a pass fails until its entry is removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from conformance._backend_features import explain_missing, managed_features
from conformance._cases import Case
from conformance._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from conformance._endpoint import ManagedServer
from conformance._gate import load_known_failures
from conformance._harness import CASE_TIMEOUT_S
from conformance._registry import RegistryOffer, offered_image
from conformance._scenarios import SCENARIOS as ALL_SCENARIOS
from conformance._scenarios import ScenarioRunner
from runtime.backends import DEFAULT_BACKEND, serving_backends
from tests.clients import newest, predates
from tests.servers import managed_server

from ._default_run import CaseRun, chosen_backend, chosen_flavour, full_run, verdict
from ._known_failures import known_failure, mark_known_failures

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server's crun sandboxes need root")

SCENARIOS = ALL_SCENARIOS / "sandbox"
LiveServer = ManagedServer
SERVER_LOG_LINES = 60  # of a failed case's server, in its report
SWEEPS = {"E2B_COMPAT_SERVER_REAPER_INTERVAL_SECONDS": "0.5", "E2B_COMPAT_SERVER_METRICS_INTERVAL_SECONDS": "1"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A case the harness lists as a known failure of a backend is expected to fail there, strictly."""
    mark_known_failures(items)
    one_run_off_the_default(config, items)


def one_run_off_the_default(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Off the default backend every case runs once: in one client flavour, on one backend.

    Which client sends a request is the harness's concern and is tried on the default backend in
    every flavour; what a backend changes shows in any one flavour, and in most cases on either
    backend. So the flavour rotates over the scenarios (``chosen_flavour``) and the backend over
    the cases (``chosen_backend``): each client meets every backend, and each backend runs about
    its share of every family of cases. A case that a backend says something of (a known failure there, or a
    feature it lacks that the case needs) runs on that backend too: every declared difference is
    checked on its backend. The backend-wide tests (templates, the large file, MCP, and the
    backend state machine in ``tests/runtime``) run on every backend regardless. The whole matrix,
    every case in every flavour on every backend, is ``nox -s conformance -- --backend all``; set
    ``E2B_COMPAT_LIVE_EVERY_FLAVOUR=1`` to run it here.
    """
    if os.environ.get("E2B_COMPAT_LIVE_EVERY_FLAVOUR"):
        return
    others = [name for name in serving_backends() if name != DEFAULT_BACKEND]
    known = load_known_failures()
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        backend, flavour, case = params.get("backend_server"), params.get("flavour"), params.get("case")
        if (
            isinstance(backend, str)
            and backend != DEFAULT_BACKEND
            and isinstance(case, Case)
            and isinstance(flavour, str)
        ):
            declared = known_failure(known, backend, case.name, flavour) is not None or bool(
                explain_missing(managed_features(backend), case=case.name)
            )
            if flavour != chosen_flavour(case) or (backend != chosen_backend(case, others) and not declared):
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="package")
def live_server() -> Iterator[LiveServer]:
    with managed_server("compat-server", SWEEPS) as server:
        yield server


@pytest.fixture(scope="package")
def default_run(live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> CaseRun:
    """The harness's full run against ``live_server``, made once (``_default_run``)."""
    return full_run(live_server, tmp_path_factory.mktemp("default-run"))


def check_case(request: pytest.FixtureRequest, runner: ScenarioRunner, flavour: str, case: Case) -> None:
    """One live client case on the backend of ``request``'s ``backend_server``.

    A case that calls an API newer than the pinned client (``Case.since``) runs with the newest
    committed clients, on every backend (the harness's run skips it for the pinned ones).
    On the default backend the verdict is the harness's full run's (``default_run``). The other
    backends' tests run the scenario themselves, one case at a time, within the harness's bound
    for a case: their creates and removals are several times crun's, and Docker's queue on its
    pool's btrfs transactions (three at a time took longer than one after another: 777 s against
    634 s, measured here).
    """
    if predates(runner, flavour, case):
        # The pinned client has no way to make this case's requests (the harness's run skips it for
        # them): the newest committed clients run it, on every backend.
        runner = newest(runner)
    elif request.node.callspec.params["backend_server"] == DEFAULT_BACKEND:
        verdict(request.getfixturevalue("default_run"), flavour, case)
        return
    backend = request.node.callspec.params["backend_server"]
    # A case that needs a feature this backend lacks must fail with the declared refusal, which the
    # harness then reports as unsupported (conformance/backend-features.json); anything else fails.
    lacking = explain_missing(managed_features(backend), case=case.name)
    try:
        case.check(runner(flavour, case.scenario, CASE_TIMEOUT_S), runner.work(flavour, case.scenario))
    except AssertionError as exc:
        if any(re.search(rf"\b{need.upstream_status}\b", str(exc)) for need in lacking):
            return
        _add_server_log(request, exc)
        raise
    except Exception as exc:
        _add_server_log(request, exc)
        raise
    if lacking:
        pytest.fail(f"{backend} is declared to lack {', '.join(n.feature for n in lacking)}, yet {case.name} passed")


def _add_server_log(request: pytest.FixtureRequest, exc: BaseException) -> None:
    """The server's side of a failure: its log goes when the server stops."""
    server: LiveServer = request.getfixturevalue("backend_server")
    exc.add_note(f"the server's log, last {SERVER_LOG_LINES} lines:\n{log_tail(server, SERVER_LOG_LINES)}")


def log_tail(server: LiveServer, lines: int) -> str:
    """The log's last lines, without the API key the server prints for its clients."""
    try:
        tail = "\n".join(server.log.read_text(errors="replace").splitlines()[-lines:])
        return re.sub(r"E2B_API_KEY=\S+", "E2B_API_KEY=<redacted>", tail)
    except OSError as exc:
        return f"(unreadable: {exc})"


@pytest.fixture(scope="package", params=serving_backends())
def backend_server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """A live server on each serving backend in turn (the default one is ``live_server`` itself)."""
    name: str = request.param
    if name == DEFAULT_BACKEND:
        yield request.getfixturevalue("live_server")
        return
    with managed_server(f"compat-{name}", SWEEPS, backend=name) as server:
        yield server


@pytest.fixture(scope="package")
def offered() -> Iterator[RegistryOffer]:
    """The harness's private image (``conformance._registry``) for the registry cases on every backend."""
    with offered_image() as offer:
        yield offer


@pytest.fixture(scope="session")
def python_clients() -> PythonClients:
    return ensure_python_clients()


@pytest.fixture(scope="session")
def node_clients() -> NodeClients:
    return ensure_node_clients()


@pytest.fixture(scope="package")
def server_scenario(
    backend_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> ScenarioRunner:
    """The agent's envd scenarios, now through the server: real sandboxes, TLS, the edge and proxy."""
    return ScenarioRunner(
        python_clients, node_clients, env=backend_server.clients_env(), workdir=lambda name: "/home/user"
    )


@pytest.fixture(scope="package")
def lifecycle(
    backend_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients, offered: RegistryOffer
) -> ScenarioRunner:
    """Control-plane scenarios (``scenarios/``): create, list, pause, snapshot, ... per client flavour."""
    second = backend_server.issue_key("second-owner")
    return ScenarioRunner(
        python_clients,
        node_clients,
        env=backend_server.clients_env(SECOND_API_KEY=second, **offered.env()),
        workdir=lambda name: "/home/user",
        scripts=SCENARIOS,
    )
