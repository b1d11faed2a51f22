"""The cases as data agree with the scenario scripts and the contract, without running anything.

A case names a scenario per client flavour and the operations it covers; a typo in either would
only show when the case runs against a live endpoint (as a crash, or as coverage silently lost).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from conformance import _harness
from conformance._cases import CASES, FAMILY_TEMPLATES, Case
from conformance._clients import NodeClients, PythonClients
from conformance._coverage import FLAVOUR_ORDER as FLAVOURS
from conformance._coverage import load_field_notes
from conformance._endpoint import ExternalEndpoint
from conformance._harness import ClientSet, templates
from conformance._model import ClientInfo, Outcome
from conformance._scenarios import SCENARIOS, ScenarioRun, ScenarioRunner
from contract import load_fields, load_inventory

SCRIPTS = {"py-sync": "py_sync.py", "py-async": "py_async.py", "js": "js.cjs"}
# JS scenario tables: `'name': async (…) =>`, `'name': [options, async (…) =>]`, or `scenarios['name'] = …`.
_JS_ENTRY = re.compile(r"""^\s*'([^']+)':\s*(?:\[|async\b)|\bscenarios\['([^']+)'\]\s*=""", re.M)


def _python_scenarios(path: Path) -> set[str]:
    """Names registered with ``@scenario("name", …)`` in a Python scenario script."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and isinstance(decorator.func, ast.Name)
                    and decorator.func.id == "scenario"
                    and decorator.args
                    and isinstance(decorator.args[0], ast.Constant)
                ):
                    names.add(str(decorator.args[0].value))
    return names


def _js_scenarios(path: Path) -> set[str]:
    return {a or b for a, b in _JS_ENTRY.findall(path.read_text(encoding="utf-8"))}


def _defined(family: str, flavour: str) -> set[str]:
    path = SCENARIOS / family / SCRIPTS[flavour]
    return _js_scenarios(path) if flavour == "js" else _python_scenarios(path)


FAMILIES = sorted({case.family for case in CASES})


def test_every_family_has_a_script_per_flavour_and_a_template() -> None:
    assert set(FAMILIES) == set(FAMILY_TEMPLATES)
    for family in FAMILIES:
        for script in SCRIPTS.values():
            assert (SCENARIOS / family / script).is_file(), f"{family}/{script}"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_each_flavour_script_defines_the_cases_scenario(case: Case) -> None:
    for flavour in case.flavours:
        assert case.scenario in _defined(case.family, flavour), f"{flavour} has no scenario {case.scenario!r}"


def test_the_parsers_find_every_interpreter_scenario() -> None:
    # Guards the two parsers above: a parser that found nothing would make the test above vacuous.
    expected = {case.scenario for case in CASES if case.family == "interpreter"}
    for flavour in SCRIPTS:
        assert _defined("interpreter", flavour) == expected, flavour


def test_case_names_are_unique_and_operations_are_inventory_ids() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    known = {op.id for op in load_inventory()}
    for case in CASES:
        assert set(case.operations) <= known, (case.name, sorted(set(case.operations) - known))
        assert len(case.operations) == len(set(case.operations)), case.name


def test_interpreter_cases_cover_every_interpreter_call_of_the_clients() -> None:
    called = {op.id for op in load_inventory() if op.surface == "interpreter" and op.called_by_sdk}
    for flavour in SCRIPTS:
        covered = {op for case in CASES if flavour in case.flavours for op in case.operations}
        assert called <= covered, (flavour, sorted(called - covered))


def test_a_run_names_the_templates_its_cases_use() -> None:
    clients = ClientSet(None, None, "2.32.0", "2.33.0")
    by_family = {case.family: case for case in CASES}
    selected = [(clients, by_family[family], "py-sync") for family in ("sandbox", "envd", "interpreter")]
    assert templates(selected) == "base,code-interpreter-v1"
    assert templates(selected[:2]) == "base"
    assert templates([]) == ""


def test_a_check_that_trips_over_a_malformed_result_fails_that_case_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def run(self: object, flavour: str, name: str, timeout: float = 180, *args: str) -> ScenarioRun:
        return ScenarioRun({"unexpected": True}, (f"{flavour}:{name}:done",), 0.5)

    monkeypatch.setattr(ScenarioRunner, "run", run)
    clients = ClientSet(
        PythonClients(tmp_path / "python", tmp_path, "2.32.0"), NodeClients(tmp_path, "2.33.0"), "2.32.0", "2.33.0"
    )
    endpoint = ExternalEndpoint({"E2B_API_KEY": "e2b_00", "E2B_DOMAIN": "e2b.test"})
    plan = _harness.RunPlan(endpoint, (clients,))
    case = next(case for case in CASES if case.name == "interpreter/run/basic")
    result = _harness._run_one(plan, clients, case, "py-sync")
    assert result.outcome is Outcome.FAIL
    assert result.detail.startswith("check failed: KeyError: 'first'")
    assert result.traces == ("py-sync:interpreter/run/basic:done",)


def test_interpreter_cases_are_reported_under_the_interpreter_clients(tmp_path: Path) -> None:
    # The locks pin e2b and its interpreter client together; the interpreter cases exercise
    # the latter, so the report must name it (and its version) for them.
    python = PythonClients(
        tmp_path / "python", tmp_path, "2.32.0", (("e2b", "2.32.0"), ("e2b-code-interpreter", "2.8.1"))
    )
    node = NodeClients(tmp_path, "2.33.0", (("e2b", "2.33.0"), ("@e2b/code-interpreter", "2.6.1")))
    clients = ClientSet(python, node, "2.32.0", "2.33.0")
    assert clients.info("py-async", "interpreter") == ClientInfo("py-async", "e2b-code-interpreter", "2.8.1")
    assert clients.info("js", "interpreter") == ClientInfo("js", "@e2b/code-interpreter", "2.6.1")
    assert clients.info("py-sync", "envd") == ClientInfo("py-sync", "e2b", "2.32.0")
    assert clients.info("js", "sandbox") == ClientInfo("js", "e2b", "2.33.0")


def test_a_sweep_runs_an_interpreter_client_shared_by_two_sets_once_with_the_later(tmp_path: Path) -> None:
    """e2b 2.61 and 2.63 both bring e2b-code-interpreter 2.11.5: a report has one result per case and client."""

    def client_set(e2b: str, interpreter: str, node: str, js_interpreter: str) -> ClientSet:
        python = PythonClients(tmp_path, tmp_path, e2b, (("e2b", e2b), ("e2b-code-interpreter", interpreter)))
        js = NodeClients(tmp_path, node, (("e2b", node), ("@e2b/code-interpreter", js_interpreter)))
        return ClientSet(python, js, e2b, node)

    older, newer = client_set("2.61.0", "2.11.5", "2.39.0", "2.7.2"), client_set("2.63.0", "2.11.5", "2.45.0", "2.7.2")
    endpoint = ExternalEndpoint({"E2B_API_KEY": "e2b_00", "E2B_DOMAIN": "e2b.test"})
    selected = _harness._selected(_harness.RunPlan(endpoint, (older, newer)))
    keys = [(case.name, clients.info(flavour, case.family)) for clients, case, flavour in selected]
    assert len(keys) == len(set(keys)), "one result per case and client"
    interpreter = {clients.python_version for clients, case, _ in selected if case.family == "interpreter"}
    assert interpreter == {"2.63.0"}, "the shared interpreter client runs with the newer e2b below it"
    envd = [clients.python_version for clients, case, _ in selected if case.family == "envd"]
    assert envd == sorted(envd), "the client sets keep their order"
    assert set(envd) == {"2.61.0", "2.63.0"}, "each e2b runs the e2b cases"


def test_a_client_older_than_a_cases_api_has_no_result_for_it(tmp_path: Path) -> None:
    """Not a skip: a skipped case would keep the operations it covers short of green for that client."""
    python = PythonClients(tmp_path, tmp_path, "2.32.0", (("e2b", "2.32.0"), ("e2b-code-interpreter", "2.8.1")))
    node = NodeClients(tmp_path, "2.33.0", (("e2b", "2.33.0"), ("@e2b/code-interpreter", "2.6.1")))
    endpoint = ExternalEndpoint({"E2B_API_KEY": "e2b_00", "E2B_DOMAIN": "e2b.test"})
    selected = _harness._selected(_harness.RunPlan(endpoint, (ClientSet(python, node, "2.32.0", "2.33.0"),)))
    names = {case.name for _, case, _ in selected}
    newer = {case.name for case in CASES if case.since}
    assert newer >= {
        "sandbox/lifecycle/list-order",
        "sandbox/lifecycle/idempotent-create",
        "envd/commands/stream-input",
        "sandbox/lifecycle/fork",
    }
    assert not names & newer, "the pinned clients predate these cases' APIs"
    assert "sandbox/lifecycle/list-filter-paginate" in names
    assert all(case.predates("2.32.0") and not case.predates("2.63.0") for case in CASES if case.since)


def test_the_pinned_locks_name_both_clients() -> None:
    from conformance._clients import _node_lock, _pins, _python_lock

    pins = _pins(_python_lock(None).read_text(encoding="utf-8"))
    assert (pins["e2b"], pins["e2b-code-interpreter"]) == ("2.32.0", "2.8.1")
    node = json.loads((_node_lock(None) / "package.json").read_text(encoding="utf-8"))["dependencies"]
    assert (node["e2b"], node["@e2b/code-interpreter"]) == ("2.33.0", "2.6.1")


def test_case_fields_are_contract_fields_of_the_case_s_own_operations() -> None:
    fields = {field.id: field for field in load_fields()}
    for case in CASES:
        assert len(case.fields) == len(set(case.fields)), case.name
        for field_id in case.fields:
            assert field_id in fields, (case.name, field_id)
            assert fields[field_id].operation in case.operations, (case.name, field_id)


def test_a_field_listed_as_not_covered_is_uncovered_for_some_client_flavour() -> None:
    """A note that every flavour's cases have made untrue must go (fields.json shrinks)."""
    covered_everywhere = set.intersection(
        *({field_id for case in CASES if flavour in case.flavours for field_id in case.fields} for flavour in FLAVOURS)
    )
    listed = {field_id for note in load_field_notes() for field_id in note.fields}
    assert not covered_everywhere & listed, sorted(covered_everywhere & listed)
