"""``e2b-compat conformance run``: endpoint, clients, every suite, the report, the signature, the gate.

Order of a run:

1. The endpoint: our reference server started on its embedded defaults in a scratch data folder
   (``ManagedServer``) on the backend asked for (the host prepared for it first), or the one the
   options or the ``E2B_*`` environment describe (``backend`` is then only a label). Backend
   ``all`` runs our server on every serving backend of ``runtime.backends`` in turn, one signed
   report each, then merges them into a signed matrix (``_matrix``).
2. The clients: the pinned versions, plus any versions asked for (an SDK sweep); each set is an
   isolated environment installed from hash-locked files and checked unmodified first.
3. The suites: official-client scenarios (``_cases``) per client set; wire-level cases
   (``_wire``); the features the target declares unsupported (``features.json``), each probed
   for the upstream-equivalent answer.
4. Cases needing a feature the backend lacks and refused as declared become unsupported
   (``_backend_features``); known failures applied (this backend's and every backend's); coverage
   against the contract inventory, the gate, the report (JSON, JUnit, Markdown) signed with
   Ed25519; a summary table; exit status 1 when the gate fails or any case fails, gated or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from contract import load_fields, load_inventory
from contract.protocol import API_KEY_HEADER

from ._backend_features import apply_missing_features, managed_features
from ._clients import verify_node_clients, verify_python_clients
from ._coverage import coverage, load_field_notes
from ._endpoint import Endpoint, EndpointError, ExternalEndpoint, ManagedServer, prepare_backend_host, serving_backends
from ._gate import apply_known_failures, evaluate, for_backend, load_known_failures, load_policy
from ._harness import ClientSet, RunPlan, run_cases
from ._model import CaseResult, ClientInfo, MutationScore, Outcome, RunInfo
from ._mutant_report import MutantsFileError, load_mutation_score
from ._properties import envd_runner, property_results
from ._recorder import check_drift, fixture_path
from ._registry import RegistryOffer, offered_image, registry_problem
from ._report import ReportFiles, write_report
from ._schema_suite import control_plane_url, operation_ids, run_schemathesis
from ._signing import load_or_create_signing_key
from ._versions import write_versions
from ._wire import run_wire_cases

__all__ = ["ALL_BACKENDS", "RunOptions", "main_run", "managed_backends"]

FEATURES = Path(__file__).resolve().parent / "features.json"
FLAVOURS = ("py-sync", "py-async", "js")
ALL_BACKENDS = "all"  # --backend all: our server on every serving backend, one after another


@dataclass(frozen=True)
class RunOptions:
    endpoint_env: dict[str, str] | None  # the four variables of an external endpoint; None: start ours
    second_api_key: str | None
    python_versions: tuple[str, ...]
    node_versions: tuple[str, ...]
    match: str
    output: Path | None
    reports_root: Path
    features: Path | None
    signing_key: Path | None
    server_name: str
    # Our server: the backend it runs on (a serving backend of runtime.backends, or "all").
    # Another endpoint: only a label for its report.
    backend: str
    jobs: int = 1  # scenario cases run side by side (``RunPlan.jobs``)
    mutants: Path | None = None  # a mutants session's mutants.json (or folder): the report's appendix
    # Offer the registry cases a registry on this host (``conformance._registry``); our own
    # server always gets one. An endpoint elsewhere could not reach it.
    local_registry: bool = False


def _probe(endpoint: Endpoint, feature: dict[str, Any]) -> tuple[bool, str]:
    """Send the feature's probe request; whether the answer is the declared upstream-equivalent one."""
    env = endpoint.clients_env()
    context = ssl.create_default_context(cafile=env.get("SSL_CERT_FILE"))
    probe = feature["probe"]
    url = f"https://api.{env['E2B_DOMAIN']}{probe['path']}"
    with httpx.Client(verify=context, timeout=60, trust_env=False) as http:
        response = http.request(
            probe["method"], url, json=probe.get("body"), headers={API_KEY_HEADER: env["E2B_API_KEY"]}
        )
    expected = feature["upstream"]
    try:
        body = response.json()
    except ValueError:
        body = None
    matches = response.status_code == expected["status"] and (
        not isinstance(body, dict) or body.get("code") == expected["status"]
    )
    return matches, f"{probe['method']} {url} answered {response.status_code}: {response.text[:200]}"


def unsupported_results(
    endpoint: Endpoint, features: Path | None, client_sets: Sequence[ClientSet]
) -> list[CaseResult]:
    """One result per declared-unsupported feature and client: unsupported when the probe answers as declared."""
    if features is None or not features.exists():
        return []
    declared = json.loads(features.read_text())["unsupported"]
    results = []
    for feature in declared:
        matches, answered = _probe(endpoint, feature)
        upstream = f"{feature['upstream']['status']}: {feature['upstream']['meaning']}"
        for clients in client_sets:
            for flavour in FLAVOURS:
                info = clients.info(flavour)
                name = f"unsupported/{feature['name']}"
                operations = tuple(feature["operations"])
                fields = tuple(feature.get("fields", ()))
                if matches:
                    results.append(
                        CaseResult(
                            name,
                            info,
                            Outcome.UNSUPPORTED,
                            0.0,
                            operations,
                            reason=feature["reason"],
                            upstream=upstream,
                            fields=fields,
                        )
                    )
                else:
                    detail = f"declared unsupported, but not with the upstream answer ({upstream}): {answered}"
                    results.append(CaseResult(name, info, Outcome.FAIL, 0.0, operations, detail=detail, fields=fields))
    return results


def drift_results(client_sets: Sequence[ClientSet]) -> list[CaseResult]:
    """Re-record what each client flavour sends (``_recorder``) and compare with ``fixtures/wire/``.

    This runs against the recorder's own fixture server, not the endpoint: it says whether the
    clients under test still send what the cases were written for. A version with no committed
    recording is skipped, saying so (``python -m conformance._recorder write`` makes one).
    """
    results = []
    for clients in client_sets:
        for flavour in FLAVOURS:
            info = clients.info(flavour)
            env = clients.node if flavour == "js" else clients.python
            assert env is not None
            name = "recorder/wire-drift"
            if not fixture_path(flavour, info.version).exists():
                reason = f"no committed recording for {flavour} e2b {info.version}"
                results.append(CaseResult(name, info, Outcome.SKIP, 0.0, (), reason=reason))
                continue
            start = time.monotonic()
            drift = check_drift(
                flavours=(flavour,),
                python=clients.python if flavour != "js" else None,
                node=clients.node if flavour == "js" else None,
            )
            outcome = Outcome.FAIL if drift else Outcome.PASS
            results.append(CaseResult(name, info, outcome, time.monotonic() - start, (), detail=drift))
    return results


SCHEMA_EXAMPLES = 25  # per operation; the suite creates at most a few sandboxes whatever this is


def schema_results(endpoint: Endpoint) -> list[CaseResult]:
    """schemathesis over the control plane from the derived document, with valid and with wrong credentials."""
    env = endpoint.clients_env()
    ids = operation_ids()
    info = ClientInfo("schemathesis", "schemathesis", metadata.version("schemathesis"))
    results = []
    for name, wrong in (("properties/schemathesis/valid-key", False), ("properties/schemathesis/wrong-key", True)):
        suite = run_schemathesis(
            control_plane_url(env["E2B_DOMAIN"]),
            env["E2B_API_KEY"],
            ca_file=env.get("SSL_CERT_FILE"),
            max_examples=SCHEMA_EXAMPLES,
            wrong_credentials=wrong,
        )
        operations = tuple(sorted({ids[label] for label in suite.operations if label in ids}))
        outcome = Outcome.PASS if suite.passed else Outcome.FAIL
        detail = "" if suite.passed else suite.report()[:20_000]
        results.append(CaseResult(name, info, outcome, suite.duration_s, operations, detail))
    return results


def _client_sets(options: RunOptions, console: Console) -> list[ClientSet]:
    sets = []
    pythons = options.python_versions or ("pinned",)
    nodes = options.node_versions or ("pinned",)
    for index in range(max(len(pythons), len(nodes))):
        python = pythons[min(index, len(pythons) - 1)]
        node = nodes[min(index, len(nodes) - 1)]
        console.print(f"clients: installing/checking Python e2b {python} and npm e2b {node}")
        clients = ClientSet.ensure(python, node)
        assert clients.python is not None
        assert clients.node is not None
        problems = verify_python_clients(clients.python) + verify_node_clients(clients.node)
        if problems:
            raise SystemExit("an official client differs from its registry artifact:\n" + "\n".join(problems))
        sets.append(clients)
    return sets


def _summary(console: Console, run: RunInfo, gate_passed: bool, files: Any) -> None:
    table = Table(title="conformance results")
    table.add_column("client", no_wrap=True)
    for outcome in Outcome:
        table.add_column(outcome.value, justify="right")
    clients = sorted({r.client for r in run.results}, key=lambda c: (c.flavour, c.package, c.version))
    for client in clients:
        counts = [sum(1 for r in run.results if r.client == client and r.outcome is o) for o in Outcome]
        name = client.flavour if client.package == client.flavour else f"{client.flavour} {client.package}"
        table.add_row(f"{name} {client.version}", *(str(count) for count in counts))
    console.print(table)
    for result in run.results:
        if result.outcome is Outcome.FAIL:
            client = result.client
            console.print(f"[red]FAIL[/red] {client.flavour} {client.package} {client.version} {result.case}")
            console.print("    " + result.detail.strip().splitlines()[0][:300] if result.detail else "")
    console.print(f"report: {files.directory}")
    console.print("[green]gate: passed[/green]" if gate_passed else "[red]gate: FAILED[/red]")


def managed_backends(backend: str) -> tuple[str, ...]:
    """The backends our server runs on for ``--backend``: one, or every serving one for ``all``.

    An unknown or non-serving name is a ``ValueError`` naming the serving ones.
    """
    serving = serving_backends()
    if backend == ALL_BACKENDS:
        return serving
    if backend not in serving:
        raise ValueError(f"backend {backend!r} cannot serve (serving backends: {', '.join(serving)}, or all)")
    return (backend,)


def _start_ours(console: Console, backend: str) -> tuple[ManagedServer, Path]:
    def say(message: str) -> None:
        console.print(f"host set-up ({backend}): {message}")

    prepare_backend_host(backend, say)
    # Not under a private temp root: idmapped sandbox users must traverse to their layers.
    data_dir = Path(tempfile.mkdtemp(prefix="e2b-compat-conformance-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    server = ManagedServer(data_dir, data_dir.with_suffix(".log"), backend=backend)
    console.print(f"endpoint: starting the reference server on {backend} (data {data_dir}, log {server.log})")
    server.start()
    server.second_api_key = server.issue_key("conformance-second-owner")
    return server, data_dir


def main_run(options: RunOptions) -> int:
    console = Console(stderr=True)
    try:  # read first: a wrong file must not cost a whole run
        mutation = None if options.mutants is None else load_mutation_score(options.mutants)
        backends = managed_backends(options.backend) if options.endpoint_env is None else (options.backend,)
    except (MutantsFileError, ValueError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    client_sets = _client_sets(options, console)
    if options.endpoint_env is not None or options.backend != ALL_BACKENDS:
        status, _ = _run_one(options, client_sets, mutation, console)
        return status
    statuses, reports = [], []
    for backend in backends:
        output = None if options.output is None else options.output / backend
        console.rule(f"backend {backend}")
        status, files = _run_one(replace(options, backend=backend, output=output), client_sets, mutation, console)
        statuses.append(status)
        if files is not None:
            reports.append(files.directory)
    matrix_status = _write_backend_matrix(options, reports, console)
    return max([*statuses, matrix_status])


def _write_backend_matrix(options: RunOptions, reports: Sequence[Path], console: Console) -> int:
    """The matrix of one ``--backend all`` run, signed like its reports: 1 when a difference is unexplained."""
    from ._matrix import MatrixError, load_report, write_matrix  # noqa: PLC0415

    if not reports:
        console.print("[red]matrix: no backend produced a report[/red]")
        return 1
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    output = options.output / "matrix" if options.output is not None else options.reports_root / f"{stamp}-matrix"
    try:
        written = write_matrix(
            [load_report(path) for path in reports],
            output,
            signing_key=load_or_create_signing_key(options.signing_key),
        )
    except MatrixError as exc:
        console.print(f"[red]matrix: {exc}[/red]")
        return 1
    console.print(f"matrix: {written.markdown}")
    if written.unexplained:
        console.print(f"[red]matrix: {written.unexplained} difference(s) between backends unexplained[/red]")
        return 1
    return 0


def _offered_registry(stack: contextlib.ExitStack, console: Console) -> RegistryOffer | None:
    problem = registry_problem()
    if problem is not None:
        console.print(f"registry cases: skipped, {problem}")
        return None
    offer = stack.enter_context(offered_image())
    console.print(f"registry cases: the private image {offer.reference} (basic auth, a password of this run's own)")
    return offer


def _run_one(
    options: RunOptions, client_sets: Sequence[ClientSet], mutation: MutationScore | None, console: Console
) -> tuple[int, ReportFiles | None]:
    """One endpoint, one backend: every suite, the report; (exit status, the report written or None)."""
    managed: ManagedServer | None = None
    endpoint: Endpoint
    if options.endpoint_env is None:
        try:
            managed, data_dir = _start_ours(console, options.backend)
        except EndpointError as exc:
            console.print(f"[red]endpoint ({options.backend}): {exc}[/red]")
            return 2, None
        endpoint = managed
    else:
        endpoint = ExternalEndpoint(
            options.endpoint_env, options.second_api_key, server=options.server_name, backend=options.backend
        )
    try:
        with contextlib.ExitStack() as stack:
            offer = _offered_registry(stack, console) if managed is not None or options.local_registry else None
            plan = RunPlan(endpoint, tuple(client_sets), match=options.match, jobs=options.jobs, registry=offer)
            run = run_cases(plan)
        extra = run_wire_cases(endpoint.clients_env(), options.match)
        if "properties".startswith(options.match) or options.match in "properties/":
            for clients in client_sets:
                make = envd_runner(clients.python, clients.node, endpoint.clients_env())
                extra += property_results(make, clients.info)
        features = options.features if options.features is not None else (FEATURES if managed else None)
        extra += unsupported_results(endpoint, features, client_sets)
        if not options.match:
            extra += drift_results(client_sets)
            extra += schema_results(endpoint)
        run = replace(run, results=(*run.results, *extra))
    finally:
        if managed is not None:
            managed.stop()
            managed.release_everything()
            shutil.rmtree(data_dir, ignore_errors=True)
    provided = managed_features(endpoint.backend) if managed is not None else None
    run = replace(run, target=replace(run.target, features=provided))
    refused = apply_missing_features(run.results, endpoint.backend, provided)
    applied = apply_known_failures(refused, for_backend(load_known_failures(), endpoint.backend))
    run = replace(run, results=tuple(applied.results), mutation=mutation)
    cov = coverage(
        run.results, load_inventory(), flavours=FLAVOURS, fields=load_fields(), field_notes=load_field_notes()
    )
    gate = evaluate(cov, load_policy())
    files = write_report(
        options.output,
        run,
        cov,
        gate,
        stale_known_failures=applied.stale,
        signing_key=load_or_create_signing_key(options.signing_key),
        reports_root=options.reports_root,
    )
    if len(client_sets) > 1:  # an SDK sweep: the same results arranged by client version
        console.print(f"versions: {write_versions(files.directory, run)}")
    _summary(console, run, gate.passed, files)
    failed = failed_cases(run)
    if failed and gate.passed:
        console.print(f"[red]{len(failed)} case(s) failed outside the gate: the run fails[/red]")
    return exit_status(run, gate.passed), files


def failed_cases(run: RunInfo) -> list[CaseResult]:
    """The results that failed (a known failure is not one)."""
    return [result for result in run.results if result.outcome is Outcome.FAIL]


def exit_status(run: RunInfo, gate_passed: bool) -> int:
    """1 when the gate failed or any case failed, gated or not; else 0."""
    return 0 if gate_passed and not failed_cases(run) else 1


def endpoint_from_environment(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The four client variables from the environment, if an endpoint is described there."""
    environ = dict(os.environ if environ is None else environ)
    if "E2B_API_KEY" not in environ or "E2B_DOMAIN" not in environ:
        return None
    return {
        name: environ[name]
        for name in ("E2B_API_KEY", "E2B_DOMAIN", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS")
        if name in environ
    }
