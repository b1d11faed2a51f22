"""Reports: coverage folding, canonical JSON against its schema, JUnit XML, Markdown, the files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance._coverage import CellOutcome, coverage
from conformance._gate import GatePolicy, GateResult, KnownFailure, evaluate, load_policy
from conformance._model import (
    REPORT_SCHEMA_VERSION,
    CaseResult,
    ClientInfo,
    MutationScore,
    Outcome,
    RunInfo,
    Target,
)
from conformance._report import (
    LEGEND,
    REPORT_SCHEMA_PATH,
    default_report_directory,
    to_json,
    to_junit,
    to_markdown,
    write_report,
)
from contract import load_inventory

REPO = Path(__file__).resolve().parents[2]
MANIFEST_SHA256 = hashlib.sha256((REPO / "contract" / "manifest.json").read_bytes()).hexdigest()
INVENTORY = load_inventory()
POLICY = load_policy(inventory=INVENTORY)
CLIENTS = {
    "py-sync": ClientInfo("py-sync", "e2b", "2.32.0"),
    "py-async": ClientInfo("py-async", "e2b", "2.32.0"),
    "js": ClientInfo("js", "e2b", "2.33.0"),
}
SCHEMA = json.loads(REPORT_SCHEMA_PATH.read_text(encoding="utf-8"))


def result(
    case: str,
    flavour: str,
    outcome: Outcome,
    *operations: str,
    duration_s: float = 0.25,
    detail: str = "",
    reason: str = "",
    upstream: str = "",
    traces: tuple[str, ...] = (),
) -> CaseResult:
    return CaseResult(
        case=case,
        client=CLIENTS[flavour],
        outcome=outcome,
        duration_s=duration_s,
        operations=operations,
        detail=detail,
        reason=reason,
        upstream=upstream,
        traces=traces,
    )


def make_run(*results: CaseResult, server: str = "e2b-compat 0.1.0") -> RunInfo:
    return RunInfo(
        target=Target(server=server, domain="e2b.localhost:8443", template="base", backend="crun"),
        contract_manifest_sha256=MANIFEST_SHA256,
        started_at="2026-05-09T07:35:25Z",
        finished_at="2026-05-09T07:41:02Z",
        harness_version="0.1.0",
        results=tuple(results),
    )


def gate_of(run: RunInfo, policy: GatePolicy | None = None) -> GateResult:
    return evaluate(coverage(run.results, INVENTORY), policy or POLICY)


def validate(report: bytes) -> dict[str, object]:
    document = json.loads(report)
    jsonschema.Draft202012Validator(SCHEMA).validate(document)
    assert isinstance(document, dict)
    return document


# A run with every outcome, two cases per operation in places, and hostile text.
MIXED = make_run(
    result("sandbox/create-kill", "py-sync", Outcome.PASS, "control.sandboxes.create", "control.sandboxes.kill"),
    result("sandbox/create-kill", "js", Outcome.PASS, "control.sandboxes.create", "control.sandboxes.kill"),
    result(
        "sandbox/pause-twice",
        "py-sync",
        Outcome.FAIL,
        "control.sandboxes.pause",
        "control.sandboxes.kill",
        detail="POST /sandboxes/x/pause: expected 409, got 500\nbody: {}",
        traces=("py-sync:sandbox/pause-twice:pause",),
    ),
    result("sandbox/pause-twice", "js", Outcome.KNOWN_FAIL, "control.sandboxes.pause", reason="issue 12"),
    result(
        "network/update",
        "py-sync",
        Outcome.UNSUPPORTED,
        "control.sandboxes.update_network",
        reason="no egress control on this host",
        upstream="400 network updates are not enabled",
    ),
    result("commands/run", "py-sync", Outcome.FIXED, "envd.process.Start", reason="issue 7"),
    result("commands/run", "js", Outcome.SKIP, "envd.process.Start", reason="node not installed"),
    result(
        "files/odd <names> | *stars*",
        "py-sync",
        Outcome.FAIL,
        "envd.http.files_upload",
        detail="got \x1b[31mred\x00 bytes \udc80 and <script>alert(1)</script> | [link](http://x)",
    ),
)


# --- coverage ---


def test_an_operation_is_green_only_when_every_covering_case_passed() -> None:
    cov = coverage(
        [
            result("a", "py-sync", Outcome.PASS, "control.sandboxes.create"),
            result("b", "py-sync", Outcome.FIXED, "control.sandboxes.create"),
            result("a", "js", Outcome.PASS, "control.sandboxes.create"),
            result("b", "js", Outcome.FAIL, "control.sandboxes.create", detail="status 500\nmore"),
        ],
        INVENTORY,
    )
    green = cov.cells["control.sandboxes.create", "py-sync"]
    assert green.outcome.green
    assert green.cases == ("a", "b")
    red = cov.cells["control.sandboxes.create", "js"]
    assert red.outcome is CellOutcome.FAIL
    assert red.detail == "b: status 500"


def test_worst_outcome_wins_and_unsupported_keeps_reason_and_upstream() -> None:
    cov = coverage(MIXED.results, INVENTORY)
    assert cov.flavours == ("py-sync", "js")
    assert cov.cells["control.sandboxes.kill", "py-sync"].outcome is CellOutcome.FAIL
    assert cov.cells["control.sandboxes.pause", "js"].outcome is CellOutcome.KNOWN_FAIL
    assert cov.cells["envd.process.Start", "js"].outcome is CellOutcome.SKIP
    assert cov.cells["envd.process.Start", "py-sync"].outcome is CellOutcome.FIXED
    unsupported = cov.cells["control.sandboxes.update_network", "py-sync"]
    assert unsupported.outcome is CellOutcome.UNSUPPORTED
    assert unsupported.reason == "no egress control on this host"
    assert unsupported.upstream == "400 network updates are not enabled"
    assert not unsupported.outcome.green


def test_skip_outranks_unsupported_and_failure_outranks_everything() -> None:
    for outcomes, expected in [
        ((Outcome.UNSUPPORTED, Outcome.SKIP), CellOutcome.SKIP),
        ((Outcome.PASS, Outcome.UNSUPPORTED), CellOutcome.UNSUPPORTED),
        ((Outcome.KNOWN_FAIL, Outcome.FAIL, Outcome.PASS), CellOutcome.FAIL),
        ((Outcome.SKIP, Outcome.KNOWN_FAIL), CellOutcome.KNOWN_FAIL),
    ]:
        cases = [result(f"c{i}", "py-sync", o, "envd.process.List") for i, o in enumerate(outcomes)]
        assert coverage(cases, INVENTORY).cells["envd.process.List", "py-sync"].outcome is expected


def test_gaps_are_operations_no_case_covers_for_any_flavour() -> None:
    cov = coverage(MIXED.results, INVENTORY)
    covered = {op for r in MIXED.results for op in r.operations}
    assert set(cov.gaps) == {op.id for op in INVENTORY} - covered
    assert "control.sandboxes.create" not in cov.gaps
    # covered for py-sync only: a gap cell for js, but not in the list of operations nobody covers
    assert "control.sandboxes.update_network" not in cov.gaps
    assert cov.cells["control.sandboxes.update_network", "js"].outcome is CellOutcome.GAP
    assert len(cov.cells) == len(INVENTORY) * 2


def test_expected_flavours_appear_as_gap_columns_in_a_fixed_order() -> None:
    cov = coverage([result("a", "js", Outcome.PASS, "envd.process.List")], INVENTORY, flavours=["zz-new", "py-async"])
    assert cov.flavours == ("py-async", "js", "zz-new")
    assert cov.cells["envd.process.List", "py-async"].outcome is CellOutcome.GAP


def test_operation_ids_missing_from_the_inventory_are_reported() -> None:
    cov = coverage([result("a", "js", Outcome.PASS, "control.sandboxes.craete")], INVENTORY)
    assert cov.unknown_operations == ("control.sandboxes.craete",)


# --- report.json ---


def test_json_report_validates_and_carries_the_run() -> None:
    stale = [KnownFailure("gone/case", "js", "issue 3")]
    cov = coverage(MIXED.results, INVENTORY)
    report = to_json(MIXED, cov, gate_of(MIXED), stale_known_failures=stale)
    document = validate(report)
    assert document["schema_version"] == REPORT_SCHEMA_VERSION
    assert document["target"] == {
        "server": "e2b-compat 0.1.0",
        "domain": "e2b.localhost:8443",
        "template": "base",
        "backend": "crun",
        "features": None,  # unknown: the run did not say
    }
    assert document["contract"] == {"manifest_sha256": MANIFEST_SHA256}
    assert document["fixed"] == [{"case": "commands/run", "flavour": "py-sync", "reason": "issue 7"}]
    assert document["stale_known_failures"] == [{"case": "gone/case", "flavour": "js", "reason": "issue 3"}]
    results = document["results"]
    assert isinstance(results, list)
    assert [(r["case"], r["client"]["flavour"]) for r in results] == sorted(
        (r.case, r.client.flavour) for r in MIXED.results
    )
    pause = next(r for r in results if r["case"] == "sandbox/pause-twice" and r["client"]["flavour"] == "py-sync")
    assert pause["client"] == {"flavour": "py-sync", "package": "e2b", "version": "2.32.0"}
    assert pause["detail"].startswith("POST /sandboxes/x/pause: expected 409")
    assert pause["duration_s"] == 0.25
    odd = next(r for r in results if r["case"].startswith("files/odd"))
    assert "\udc80" in odd["detail"]  # a lone surrogate survives as its JSON escape
    gate = document["gate"]
    assert isinstance(gate, dict)
    assert gate["passed"] is False
    assert {"operation": "control.sandboxes.pause", "flavour": "py-sync"} in gate["required"]
    coverage_doc = document["coverage"]
    assert isinstance(coverage_doc, dict)
    assert coverage_doc["backend"] == "crun"
    row = next(o for o in coverage_doc["operations"] if o["id"] == "control.sandboxes.update_network")
    assert row["cells"]["py-sync"]["upstream"] == "400 network updates are not enabled"
    assert row["cells"]["js"]["outcome"] == "gap"
    summary = document["summary"]
    assert isinstance(summary, dict)
    assert summary["py-sync"]["cases"] == {
        "pass": 1,
        "fail": 2,
        "unsupported": 1,
        "known-fail": 0,
        "fixed": 1,
        "skip": 0,
    }


def test_json_is_canonical_and_independent_of_result_order() -> None:
    cov = coverage(MIXED.results, INVENTORY)
    report = to_json(MIXED, cov, gate_of(MIXED))
    shuffled = list(MIXED.results)
    random.Random(4).shuffle(shuffled)
    other = dataclasses.replace(MIXED, results=tuple(shuffled))
    assert to_json(other, coverage(other.results, INVENTORY), gate_of(other)) == report
    assert report.endswith(b"}\n")
    assert not report.endswith(b"\n\n")
    report.decode("utf-8")  # UTF-8 throughout: the lone surrogate is written as its JSON escape
    canonical = json.dumps(json.loads(report), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert canonical.encode("utf-8", "backslashreplace") == report


def test_json_refuses_two_results_for_the_same_case_and_client() -> None:
    run = make_run(
        result("a", "js", Outcome.PASS, "envd.process.List"), result("a", "js", Outcome.FAIL, "envd.process.List")
    )
    with pytest.raises(ValueError, match="two results"):
        to_json(run, coverage(run.results, INVENTORY), gate_of(run))


def test_json_refuses_a_nan_or_negative_duration() -> None:
    for bad in (float("nan"), -1.0):
        run = make_run(result("a", "js", Outcome.PASS, "envd.process.List", duration_s=bad))
        with pytest.raises(ValueError, match="duration_s"):
            to_json(run, coverage(run.results, INVENTORY), gate_of(run))


def test_the_schema_version_in_the_schema_is_the_models() -> None:
    assert SCHEMA["properties"]["schema_version"]["const"] == REPORT_SCHEMA_VERSION
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from(["\udc80", "\x00", "\x1b"]))
_operation_ids = st.sampled_from([op.id for op in INVENTORY] + ["not.in.inventory"])
_results = st.lists(
    st.builds(
        result,
        st.text(min_size=1, max_size=20),
        st.sampled_from(sorted(CLIENTS)),
        st.sampled_from(list(Outcome)),
        duration_s=st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
        detail=_text,
        reason=_text,
        upstream=_text,
        traces=st.lists(_text, max_size=3).map(tuple),
    ).flatmap(
        lambda r: st.lists(_operation_ids, max_size=4).map(lambda ops: dataclasses.replace(r, operations=tuple(ops)))
    ),
    max_size=12,
    unique_by=lambda r: (r.case, r.client.flavour),
)


@settings(max_examples=20, deadline=None)  # each report takes jsonschema ~0.3 s
@given(results=_results, server=_text, stale_cases=st.lists(_text.filter(bool), max_size=2))
def test_every_report_validates_against_the_schema(
    results: list[CaseResult], server: str, stale_cases: list[str]
) -> None:
    run = make_run(*results, server=server)
    cov = coverage(run.results, INVENTORY)
    gate = gate_of(run)
    stale = [KnownFailure(case, "js", "why") for case in stale_cases]
    report = to_json(run, cov, gate, stale_known_failures=stale)
    validate(report)
    # the other two forms never fail on the same input, and the JUnit XML stays well-formed
    ET.fromstring(to_junit(run))
    to_markdown(run, cov, gate, stale_known_failures=stale)


# --- report.junit.xml ---


def test_junit_has_a_suite_per_client_and_the_right_counts() -> None:
    root = ET.fromstring(to_junit(MIXED))
    assert root.tag == "testsuites"
    suites = {suite.get("name"): suite for suite in root.iter("testsuite")}
    assert list(suites) == ["py-sync e2b 2.32.0", "js e2b 2.33.0"]
    py = suites["py-sync e2b 2.32.0"]
    assert (py.get("tests"), py.get("failures"), py.get("errors"), py.get("skipped")) == ("5", "2", "0", "1")
    assert len(py.findall("testcase")) == 5
    js = suites["js e2b 2.33.0"]
    assert (js.get("tests"), js.get("failures"), js.get("skipped")) == ("3", "0", "2")
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("8", "2", "3")
    props = {p.get("name"): p.get("value") for p in py.iter("property")}
    assert props["backend"] == "crun"
    assert props["contract_manifest_sha256"] == MANIFEST_SHA256

    pause = py.find("testcase[@name='sandbox/pause-twice']")
    assert pause is not None
    assert pause.get("classname") == "py-sync"
    assert pause.get("time") == "0.250"
    failure = pause.find("failure")
    assert failure is not None
    assert failure.get("message") == "POST /sandboxes/x/pause: expected 409, got 500"
    assert failure.text is not None
    assert "body: {}" in failure.text
    out = pause.find("system-out")
    assert out is not None
    assert out.text is not None
    assert "py-sync:sandbox/pause-twice:pause" in out.text

    kinds = {case.get("name"): case.find("skipped") for case in js.iter("testcase")}
    known, skipped = kinds["sandbox/pause-twice"], kinds["commands/run"]
    assert known is not None
    assert known.get("type") == "known-fail"
    assert skipped is not None
    assert skipped.get("type") == "skip"
    assert kinds["sandbox/create-kill"] is None

    unsupported = py.find("testcase[@name='network/update']/skipped")
    assert unsupported is not None
    assert unsupported.get("type") == "unsupported"
    assert "400 network updates are not enabled" in (unsupported.get("message") or "")
    odd = py.find("testcase[@name='files/odd <names> | *stars*']/failure")
    assert odd is not None
    assert odd.text is not None
    assert "\\x1b[31mred\\x00" in odd.text  # escaped, since XML 1.0 cannot carry them


def test_junit_of_an_empty_run_is_an_empty_testsuites() -> None:
    root = ET.fromstring(to_junit(make_run()))
    assert root.get("tests") == "0"
    assert list(root) == []


# --- report.md ---


def test_markdown_has_legend_matrix_summary_fixed_and_gate() -> None:
    cov = coverage(MIXED.results, INVENTORY, flavours=["py-async"])
    gate = gate_of(MIXED)
    markdown = to_markdown(MIXED, cov, gate, stale_known_failures=[KnownFailure("gone/case", "js", "issue 3")])
    assert LEGEND in markdown
    for symbol in ("✅", "❌", "➖", "⚠️", "·"):  # noqa: RUF001 - the legend's symbols
        assert symbol in LEGEND
    lines = markdown.splitlines()
    matrix = lines[lines.index("## Operations by client (backend: crun)") :]
    header = next(line for line in matrix if line.startswith("| operation |"))
    assert header == "| operation | py-sync 2.32.0 | py-async | js 2.33.0 |"
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in lines if line.startswith("| `")}
    assert rows["`control.sandboxes.create`"].endswith("| ✅ | · | ✅ |")
    assert rows["`control.sandboxes.pause`"].endswith("| ❌ | · | ⚠️ |")
    assert rows["`control.sandboxes.update_network`"].endswith("| ➖ | · | · |")  # noqa: RUF001
    assert rows["`envd.process.Start`"].endswith("| ✅ | · | ⏭️ |")
    assert rows["`control.templates.list`"].endswith("| · | · | · |")
    assert "| py-sync | 1 | 2 | 1 | 0 | 1 | 0 | 5 |" in lines  # cases per outcome
    assert "- `commands/run` (py-sync): issue 7" in lines  # fixed known failure
    assert "- `gone/case` (js): issue 3" in lines
    assert "## Gate: ❌ failed" in lines
    gate_rows = [line for line in lines if line.startswith("| `control.sandboxes.pause` | py-sync | ❌ fail |")]
    assert len(gate_rows) == 1
    assert "| `control.sandboxes.create` | py-async | · gap | no result for this client flavour |" in lines


def test_markdown_renders_hostile_text_inert() -> None:
    cov = coverage(MIXED.results, INVENTORY)
    markdown = to_markdown(MIXED, cov, gate_of(MIXED))
    assert "<script>" not in markdown
    assert "](http" not in markdown
    assert "\x1b" not in markdown
    assert "\x00" not in markdown
    assert "\\x1b" in markdown  # shown escaped instead
    lines = markdown.splitlines()
    failures = lines[lines.index("## Failures") :]
    row = next(line for line in failures if "files/odd" in line)
    assert row.replace("\\|", "").count("|") == 4  # the text's own pipes add no columns (3 columns)
    gate = next(line for line in lines if line.startswith("| `envd.http.files_upload` | py-sync |"))
    assert gate.replace("\\|", "").count("|") == 5


def test_markdown_of_a_passing_gate_says_so() -> None:
    required = POLICY.required
    results = [result(f"case/{op}", flavour, Outcome.PASS, op) for op, flavour in required]
    run = make_run(*results)
    markdown = to_markdown(run, coverage(run.results, INVENTORY), gate_of(run))
    assert "## Gate: ✅ passed" in markdown
    assert f"All {len(required)} required (operation, client) pairs are green." in markdown


# --- files ---


def test_write_report_writes_three_files_into_the_default_folder(tmp_path: Path) -> None:
    cov = coverage(MIXED.results, INVENTORY)
    gate = gate_of(MIXED)
    files = write_report(None, MIXED, cov, gate, reports_root=tmp_path)
    assert files.directory == tmp_path / "20260509T073525Z-crun-base"
    assert files.json.read_bytes() == to_json(MIXED, cov, gate)
    assert files.junit.read_bytes() == to_junit(MIXED)
    assert "## Gate" in files.markdown.read_text(encoding="utf-8")
    assert files.signature is None
    assert sorted(p.name for p in files.directory.iterdir()) == ["report.json", "report.junit.xml", "report.md"]
    with pytest.raises(FileExistsError):
        write_report(files.directory, MIXED, cov, gate)


def test_write_report_signs_when_given_a_key(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from conformance._signing import fingerprint, verify

    key = Ed25519PrivateKey.generate()
    files = write_report(tmp_path / "r", MIXED, coverage(MIXED.results, INVENTORY), gate_of(MIXED), signing_key=key)
    assert files.signature == tmp_path / "r" / "report.json.sig"
    assert files.public_key == tmp_path / "r" / "report.json.pub"
    checked = verify(files.directory, trusted_fingerprint=fingerprint(key.public_key()))
    assert checked.valid, checked.problem


def test_default_folder_names_are_safe_and_in_utc() -> None:
    run = dataclasses.replace(
        MIXED,
        started_at="2026-05-09T09:35:25+02:00",
        target=Target(server="x", domain="d", template="../team/code interpreter", backend="crun"),
    )
    assert default_report_directory(run, Path("reports")) == Path("reports/20260509T073525Z-crun-team_code_interpreter")
    with pytest.raises(ValueError, match="UTC offset"):
        default_report_directory(dataclasses.replace(MIXED, started_at="2026-05-09T07:35:25"))


def test_a_run_over_two_templates_names_both() -> None:
    target = Target(server="x", domain="d", template="base,code-interpreter-v1", backend="crun")
    run = dataclasses.replace(MIXED, started_at="2026-05-09T07:35:25Z", target=target)
    assert default_report_directory(run).name == "20260509T073525Z-crun-base_code-interpreter-v1"
    assert "template: base,code-interpreter-v1;" in to_markdown(run, coverage(run.results, INVENTORY), gate_of(run))


def test_operation_ids_used_here_exist() -> None:
    assert {op for r in MIXED.results for op in r.operations} <= {op.id for op in INVENTORY}


def test_a_flavour_column_names_every_client_package_it_ran() -> None:
    from conformance._report import _column

    assert _column("py-sync", {}) == "py-sync"
    assert _column("py-sync", {"e2b": "2.32.0"}) == "py-sync 2.32.0"
    assert (
        _column("js", {"e2b": "2.33.0", "@e2b/code-interpreter": "2.6.1"})
        == "js (@e2b/code-interpreter 2.6.1, e2b 2.33.0)"
    )


def test_a_mutants_session_is_the_reports_appendix() -> None:
    score = MutationScore(
        source="reports/mutants/x/mutants.json",
        sha256="ab" * 32,
        started_at="2026-05-09T07:00:00Z",
        tree="/work/main at 0123456789ab",
        killed=9,
        survived=1,
        errors=2,
        survivors=(("server/list/reversed", "lists newest first"),),
    )
    run = dataclasses.replace(MIXED, mutation=score)
    cov = coverage(run.results, INVENTORY)
    document = validate(to_json(run, cov, gate_of(run)))
    assert document["mutation"] == {
        "source": "reports/mutants/x/mutants.json",
        "sha256": "ab" * 32,
        "started_at": "2026-05-09T07:00:00Z",
        "tree": "/work/main at 0123456789ab",
        "killed": 9,
        "survived": 1,
        "errors": 2,
        "score": 0.9,
        "survivors": [{"id": "server/list/reversed", "description": "lists newest first"}],
    }
    markdown = to_markdown(run, cov, gate_of(run))
    appendix = markdown[markdown.index("## Appendix: mutation score") :]
    assert "9 of 10 mutants killed: **90.0 %** (2 not judged)" in appendix
    assert "- `server/list/reversed`: lists newest first" in appendix
    assert validate(to_json(MIXED, cov, gate_of(MIXED)))["mutation"] is None
    assert "No mutants session was given" in to_markdown(MIXED, cov, gate_of(MIXED))
