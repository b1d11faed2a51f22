"""The conformance harness end to end against the real server: a signed report that passes the
gate, and a deliberately broken endpoint (a relay that changes one answer) that fails it, with a
message naming the request that differed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conformance._cases import CASES
from conformance._clients import NodeClients, PythonClients
from conformance._coverage import coverage
from conformance._endpoint import ExternalEndpoint
from conformance._gate import evaluate, load_policy
from conformance._harness import ClientSet, RunPlan, run_cases
from conformance._model import CaseResult, Outcome
from conformance._signing import signature_paths, verify
from conformance._wire import run_wire_cases
from contract import load_inventory
from tests.conformance.faulty_endpoint import Fault, FaultyEndpoint

from ._default_run import CaseRun
from .conftest import LiveServer

pytestmark = [pytest.mark.artifacts]


def _pinned(python_clients: PythonClients, node_clients: NodeClients) -> ClientSet:
    return ClientSet(python_clients, node_clients, python_clients.version, node_clients.version)


def _failed(results: list[CaseResult] | tuple[CaseResult, ...], case: str) -> list[CaseResult]:
    return [result for result in results if result.case == case and result.outcome is Outcome.FAIL]


def test_a_full_run_is_signed_and_passes_the_gate(default_run: CaseRun, tmp_path: Path) -> None:
    assert default_run.status == 0, default_run.report.with_name("report.md").read_text()
    report = default_run.report
    checked = verify(report)
    assert checked.valid, checked.problem
    assert verify(report, trusted_fingerprint=checked.fingerprint).trusted
    changed = tmp_path / "report.json"  # a copy beside copies of its signature: the run's own stays as signed
    for path in (report, *signature_paths(report)):
        shutil.copy(path, tmp_path / path.name)
    data = bytearray(changed.read_bytes())
    data[len(data) // 2] ^= 0x20
    changed.write_bytes(bytes(data))
    assert not verify(changed).valid, "one changed byte must break the signature"


def test_a_create_answered_200_fails_the_cases_and_the_gate(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    with FaultyEndpoint.for_server(live_server, Fault.CREATE_200) as relay:
        endpoint = ExternalEndpoint(relay.client_env(live_server.client_env))
        run = run_cases(RunPlan(endpoint, (_pinned(python_clients, node_clients),), match="create-env-metadata"))
        wire = run_wire_cases(endpoint.clients_env(), "create-status")
        assert relay.faults_injected > 0
    # The Python client parses the body only for the status the contract lists ("Body of the request
    # is None"); the JS client accepts any 2xx and does not notice. The wire case catches it for all.
    failed = {result.client.flavour for result in _failed(run.results, "sandbox/lifecycle/create-env-metadata")}
    assert failed == {"py-sync", "py-async"}
    (failure,) = _failed(wire, "wire/control/create-status")
    assert "POST https://api." in failure.detail
    assert "/sandboxes answered 200, the contract says 201" in failure.detail
    gate = evaluate(coverage((*run.results, *wire), load_inventory()), load_policy())
    assert not gate.passed
    assert "control.sandboxes.create" in {item.operation for item in gate.failures}


def test_a_dropped_stream_event_fails_the_cases_and_names_the_stream(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    with FaultyEndpoint.for_server(live_server, Fault.DROP_STREAM_EVENT) as relay:
        endpoint = ExternalEndpoint(relay.client_env(live_server.client_env))
        run = run_cases(RunPlan(endpoint, (_pinned(python_clients, node_clients),), match="commands/foreground"))
        wire = run_wire_cases(endpoint.clients_env(), "process-stream")
        assert relay.faults_injected > 0
    assert _failed(run.results, "envd/commands/foreground"), run.results
    (failure,) = _failed(wire, "wire/envd/process-stream")
    assert "/process.Process/Start: the stream's events were" in failure.detail
    assert "data:one" not in failure.detail.split("expected")[0], "the dropped event is the first output"


def test_a_faithful_relay_changes_nothing(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    with FaultyEndpoint.for_server(live_server, Fault.NONE) as relay:
        endpoint = ExternalEndpoint(relay.client_env(live_server.client_env))
        run = run_cases(RunPlan(endpoint, (_pinned(python_clients, node_clients),), match="commands/foreground"))
        wire = run_wire_cases(endpoint.clients_env(), "process-stream")
    assert all(result.outcome is Outcome.PASS for result in (*run.results, *wire)), [
        (result.case, result.detail) for result in (*run.results, *wire)
    ]


def test_swapped_sandbox_traffic_fails_the_burst_and_names_both_sandboxes(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    """The relay gives two sandboxes each other's traffic: the parallel-creates case names the pair."""
    with FaultyEndpoint.for_server(live_server, Fault.SWAP_SANDBOXES) as relay:
        endpoint = ExternalEndpoint(
            relay.client_env(live_server.client_env), second_api_key=live_server.issue_key("swap-second")
        )
        plan = RunPlan(
            endpoint, (_pinned(python_clients, node_clients),), match="parallel-creates", flavours=("py-sync",)
        )
        run = run_cases(plan)
        assert relay.faults_injected > 0
        assert relay.swapped_pair is not None
        first, second = relay.swapped_pair
    (failure,) = _failed(run.results, "sandbox/lifecycle/parallel-creates")
    # The swap starts once both sandboxes exist, so one of them may have finished its requests
    # before: the message names the pair from the side that was misrouted.
    summary = failure.detail.splitlines()[0]
    assert "misrouted" in summary, summary
    assert f"is that of {second} (" in summary or f"is that of {first} (" in summary, summary
    assert first in summary, summary
    assert second in summary, summary


def test_a_reversed_list_fails_the_list_case_and_names_the_list_call(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    """Sandbox lists of two or more come reversed: every flavour's list case names the calls."""
    with FaultyEndpoint.for_server(live_server, Fault.REVERSE_LIST) as relay:
        endpoint = ExternalEndpoint(relay.client_env(live_server.client_env))
        run = run_cases(RunPlan(endpoint, (_pinned(python_clients, node_clients),), match="list-filter-paginate"))
        assert relay.faults_injected > 0
    failed = _failed(run.results, "sandbox/lifecycle/list-filter-paginate")
    assert {result.client.flavour for result in failed} == {"py-sync", "py-async", "js"}, run.results
    for failure in failed:
        # Pages of one are immune to the fault and give the order; the pages of two and the unpaged
        # list are reversed, and the message names each of those calls.
        assert "Sandbox.list(query={metadata: {suite: " in failure.detail, failure.detail
        assert ", limit=2) page 1 returned sandboxes in reverse order" in failure.detail, failure.detail
        assert "}}) page 1 returned sandboxes in reverse order" in failure.detail, failure.detail
        assert "limit=1) page" not in failure.detail, failure.detail


def test_a_dropped_watch_event_fails_the_watch_cases_and_names_the_event(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    """The first event of each WatchDir stream, and of the polling watcher, is lost on the way."""
    with FaultyEndpoint.for_server(live_server, Fault.DROP_WATCH_EVENT) as relay:
        endpoint = ExternalEndpoint(relay.client_env(live_server.client_env))
        run = run_cases(RunPlan(endpoint, (_pinned(python_clients, node_clients),), match="envd/watch/"))
        # The first event of two streams and one polling watcher here; the option cases' watchers lose theirs too.
        assert relay.faults_injected >= 3
    (polling,) = _failed(run.results, "envd/watch/polling")
    streams = _failed(run.results, "envd/watch/stream")
    assert {result.client.flavour for result in streams} == {"py-async", "js"}, run.results
    assert "/watched (CreateWatcher/GetWatcherEvents): missing event CREATE a.txt;" in polling.detail, polling.detail
    for failure in streams:
        assert "/watched (WatchDir): missing event CREATE a.txt;" in failure.detail, failure.detail


@pytest.mark.parametrize("match", ["list-filter-paginate", "envd/watch/"])
def test_a_faithful_relay_passes_the_list_and_watch_cases(
    live_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients, match: str
) -> None:
    with FaultyEndpoint.for_server(live_server, Fault.NONE) as relay:
        endpoint = ExternalEndpoint(relay.client_env(live_server.client_env))
        run = run_cases(RunPlan(endpoint, (_pinned(python_clients, node_clients),), match=match))
    assert len(run.results) == sum(len(case.flavours) for case in CASES if match in case.name)
    assert all(result.outcome is Outcome.PASS for result in run.results), [
        (result.case, result.client.flavour, result.detail) for result in run.results
    ]
