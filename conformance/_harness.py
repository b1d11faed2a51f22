"""A conformance run: every case with every client flavour and version, against one endpoint.

For each (client version, case, flavour) the runner starts the scenario script in that client's
own environment with only the endpoint's variables, times it, collects its ``client:case:stage``
traces and checks its result. A scenario that crashes, times out or whose check fails is a
``fail`` whose detail is the check's message or the script's last output (the client's own
exception names the request it was making). Known failures are applied afterwards by the
report (they still run). A rich progress bar shows where the run is.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._cases import FAMILY_TEMPLATES, Case, cases
from ._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from ._endpoint import Endpoint
from ._model import CaseResult, ClientInfo, Outcome, RunInfo, Target
from ._registry import RegistryOffer
from ._scenarios import SCENARIOS, ScenarioError, ScenarioRun, ScenarioRunner

__all__ = ["ClientSet", "RunPlan", "run_cases"]

HARNESS_VERSION = "0.1.0"
INTERPRETER_PACKAGES = {"python": "e2b-code-interpreter", "js": "@e2b/code-interpreter"}
CASE_TIMEOUT_S = 600
WORKDIR = "/home/user"  # every scenario works in the sandbox user's home
MANIFEST = Path(__file__).resolve().parent.parent / "contract" / "manifest.json"


@dataclass(frozen=True)
class ClientSet:
    """One Python and one Node client version, installed unchanged (``_clients``)."""

    python: PythonClients | None
    node: NodeClients | None
    python_version: str
    node_version: str

    @classmethod
    def ensure(cls, python_version: str | None, node_version: str | None) -> ClientSet:
        python = (
            ensure_python_clients() if python_version in (None, "pinned") else ensure_python_clients(python_version)
        )
        node = ensure_node_clients() if node_version in (None, "pinned") else ensure_node_clients(node_version)
        return cls(python, node, python.version, node.version)

    def info(self, flavour: str, family: str = "") -> ClientInfo:
        """The client a case of ``family`` runs with: the interpreter cases use the interpreter clients."""
        version = self.node_version if flavour == "js" else self.python_version
        if family != "interpreter":
            return ClientInfo(flavour, "e2b", version)
        package = INTERPRETER_PACKAGES["js" if flavour == "js" else "python"]
        clients = self.node if flavour == "js" else self.python
        locked = dict(clients.packages) if clients is not None else {}
        return ClientInfo(flavour, package, locked.get(package, "unknown"))


@dataclass(frozen=True)
class RunPlan:
    endpoint: Endpoint
    client_sets: tuple[ClientSet, ...]
    flavours: tuple[str, ...] = ("py-sync", "py-async", "js")
    match: str = ""  # only cases whose name contains this
    families: tuple[str, ...] = ("sandbox", "envd", "interpreter", "volume")
    # Cases run side by side in this many workers. Each scenario makes and kills its own
    # sandboxes and finds them by its own metadata, so cases do not see one another.
    jobs: int = 1
    # The private image the registry cases build from; None: those cases are skipped.
    registry: RegistryOffer | None = None


def _selected(plan: RunPlan) -> list[tuple[ClientSet, Case, str]]:
    """Every case for every client set and flavour, once per client that runs it, if it has the case's API.

    Two client sets of a sweep can hold the same interpreter client (e2b 2.61 and 2.63 both bring
    e2b-code-interpreter 2.11.5): its cases run once, with the later set (the newer e2b below it),
    since a report has one result per case and client.
    """
    chosen: list[tuple[ClientSet, Case, str]] = []
    seen: set[tuple[str, ClientInfo]] = set()
    for clients in reversed(plan.client_sets):
        for family in plan.families:
            for case in cases(family):
                if plan.match not in case.name:
                    continue
                for flavour in case.flavours:
                    info = clients.info(flavour, case.family)
                    key = (case.name, info)
                    # A client older than the case's API has no result for it: not a skip, which
                    # would leave the operations the case covers short of green for that client.
                    if flavour in plan.flavours and key not in seen and not case.predates(info.version):
                        seen.add(key)
                        chosen.append((clients, case, flavour))
    order = {id(clients): index for index, clients in enumerate(plan.client_sets)}
    return sorted(chosen, key=lambda chosen_one: order[id(chosen_one[0])])


class _ScenarioRuns:
    """Each scenario runs once per client set and flavour in a run; the cases that check it share that run.

    Several cases check one scenario (a language's contexts, state and env vars...). A case's check
    reads its own copy of the result, or meets the same failure; a worker that asks for a scenario
    another worker is running waits for that run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, ...], tuple[threading.Lock, list[ScenarioRun | BaseException]]] = {}

    def run(self, key: tuple[str, ...], make: Callable[[], ScenarioRun]) -> ScenarioRun:
        with self._lock:
            lock, done = self._runs.setdefault(key, (threading.Lock(), []))
        with lock:
            if not done:
                try:
                    done.append(make())
                except (ScenarioError, subprocess.TimeoutExpired) as exc:
                    done.append(exc)
        (ran,) = done
        if isinstance(ran, BaseException):
            raise ran
        return dataclasses.replace(ran, result=copy.deepcopy(ran.result))


def _run_one(
    plan: RunPlan, clients: ClientSet, case: Case, flavour: str, runs: _ScenarioRuns | None = None
) -> CaseResult:
    # Every outcome carries the fields the case covers: a failing case makes them red too.
    return dataclasses.replace(_outcome(plan, clients, case, flavour, runs or _ScenarioRuns()), fields=case.fields)


def _outcome(plan: RunPlan, clients: ClientSet, case: Case, flavour: str, runs: _ScenarioRuns) -> CaseResult:
    info = clients.info(flavour, case.family)
    if clients.python is None or clients.node is None:
        return CaseResult(case.name, info, Outcome.SKIP, 0.0, case.operations, reason="client not installed")
    extra = {}
    if case.second_owner:
        if plan.endpoint.second_api_key is None:
            return CaseResult(
                case.name, info, Outcome.SKIP, 0.0, case.operations, reason="no second owner's API key was given"
            )
        extra["SECOND_API_KEY"] = plan.endpoint.second_api_key
    if case.registry:
        if plan.registry is None:
            reason = "no image registry the endpoint can reach was offered (--local-registry: one on this host)"
            return CaseResult(case.name, info, Outcome.SKIP, 0.0, case.operations, reason=reason)
        extra.update(plan.registry.env())
    runner = ScenarioRunner(
        clients.python,
        clients.node,
        env=plan.endpoint.clients_env(**extra),
        workdir=lambda name: WORKDIR,
        scripts=SCENARIOS / case.family,
    )
    start = time.monotonic()
    try:
        key = (clients.python_version, clients.node_version, flavour, case.family, case.scenario, str(bool(extra)))
        ran = runs.run(key, lambda: runner.run(flavour, case.scenario, CASE_TIMEOUT_S))
    except ScenarioError as exc:
        return CaseResult(case.name, info, Outcome.FAIL, time.monotonic() - start, case.operations, detail=str(exc))
    except subprocess.TimeoutExpired:
        detail = f"{flavour}:{case.name} did not finish within {CASE_TIMEOUT_S} s"
        return CaseResult(case.name, info, Outcome.FAIL, time.monotonic() - start, case.operations, detail=detail)
    try:
        case.check(ran.result, runner.work(flavour, case.scenario))
    # A result without a key the check reads (or of another shape) is that case's failure, not the run's.
    except (AssertionError, LookupError, TypeError, ValueError) as exc:
        failure = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
        detail = f"check failed: {failure}\nresult: {ran.result}"
        return CaseResult(case.name, info, Outcome.FAIL, ran.duration_s, case.operations, detail, traces=ran.traces)
    return CaseResult(case.name, info, Outcome.PASS, ran.duration_s, case.operations, traces=ran.traces)


def templates(selected: list[tuple[ClientSet, Case, str]]) -> str:
    """The templates the selected cases' sandboxes come from, comma-separated, in first-use order."""
    return ",".join(dict.fromkeys(FAMILY_TEMPLATES[case.family] for _, case, _ in selected))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_cases(plan: RunPlan, *, on_result: Callable[[CaseResult], None] | None = None) -> RunInfo:
    started = _now()
    selected = _selected(plan)
    results: list[CaseResult | None] = [None] * len(selected)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[current]}"),
        transient=False,
    ) as progress:
        task = progress.add_task("conformance", total=len(selected), current="")
        done = threading.Lock()
        runs = _ScenarioRuns()

        def one(index: int) -> None:
            clients, case, flavour = selected[index]
            info = clients.info(flavour, case.family)
            progress.update(task, current=f"{flavour} {info.package} {info.version} {case.name}")
            result = _run_one(plan, clients, case, flavour, runs)
            with done:  # results keep the selection's order; callbacks come one at a time
                results[index] = result
                if on_result is not None:
                    on_result(result)
                progress.advance(task)

        pool = ThreadPoolExecutor(max_workers=max(1, plan.jobs), thread_name_prefix="case")
        try:
            for future in [pool.submit(one, index) for index in range(len(selected))]:
                future.result()
        finally:
            # An interrupt (or a failure of the harness itself) stops the run: the cases not started
            # are dropped rather than run to the end; those under way finish.
            pool.shutdown(wait=True, cancel_futures=True)
    endpoint = plan.endpoint
    target = Target(endpoint.server, endpoint.domain, templates(selected) or endpoint.template, endpoint.backend)
    return RunInfo(
        target=target,
        contract_manifest_sha256=hashlib.sha256(MANIFEST.read_bytes()).hexdigest(),
        started_at=started,
        finished_at=_now(),
        harness_version=HARNESS_VERSION,
        results=tuple(result for result in results if result is not None),
    )
