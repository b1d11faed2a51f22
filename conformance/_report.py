"""Compatibility reports: report.json, report.junit.xml and report.md, written from a run and its coverage.

A run's results (``_model.RunInfo``) folded onto the contract's operations and fields
(``_coverage.Coverage``) are written in three forms:

- ``report.json``: canonical JSON (sorted keys, UTF-8, two-space indent, one final newline, results
  in a fixed order), so the same run always gives the same bytes; these bytes are what
  ``_signing`` signs. Its schema is ``report.schema.json`` beside this file (docs/REPORT.md);
- ``report.junit.xml``: one ``testsuite`` per client flavour and version, for CI viewers;
- ``report.md``: the matrix, a summary, fixed known failures and the gate verdict, for people.

Every text that came from the endpoint or the clients (failure details, reasons, even the server's
name) is untrusted: it is escaped for Markdown, stripped of characters XML 1.0 cannot carry, and
lone surrogates are written as ``\\udcxx`` escapes instead of failing the write.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._coverage import CellOutcome, Coverage, first_line, ordered_flavours
from ._model import REPORT_SCHEMA_VERSION, CaseResult, ClientInfo, Outcome, RunInfo

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ._gate import GateResult, KnownFailure

__all__ = [
    "REPORT_SCHEMA_PATH",
    "ReportFiles",
    "default_report_directory",
    "report_document",
    "to_json",
    "to_junit",
    "to_markdown",
    "write_report",
]

REPORT_SCHEMA_PATH = Path(__file__).resolve().parent / "report.schema.json"

REPORT_JSON = "report.json"
REPORT_JUNIT = "report.junit.xml"
REPORT_MARKDOWN = "report.md"


# --- report.json ---


def _ordered_results(run: RunInfo) -> list[CaseResult]:
    """Results in report order; the same (case, client) twice is a runner bug, not something to average."""
    ordered = sorted(run.results, key=_result_key)
    for before, after in itertools.pairwise(ordered):
        if _result_key(before) == _result_key(after):
            client = before.client
            raise ValueError(f"case {before.case!r} has two results for {client.flavour} {client.version}")
    return ordered


def _ordered_clients(clients: Iterable[ClientInfo]) -> list[ClientInfo]:
    clients = set(clients)
    rank = {flavour: index for index, flavour in enumerate(ordered_flavours(c.flavour for c in clients))}
    return sorted(clients, key=lambda c: (rank[c.flavour], c.package, c.version))


def _result_key(result: CaseResult) -> tuple[str, str, str, str]:
    return (result.case, result.client.flavour, result.client.package, result.client.version)


def _client(client: ClientInfo) -> dict[str, str]:
    return {"flavour": client.flavour, "package": client.package, "version": client.version}


def _result(result: CaseResult) -> dict[str, Any]:
    return {
        "case": result.case,
        "client": _client(result.client),
        "outcome": result.outcome.value,
        "duration_s": result.duration_s,
        "operations": list(result.operations),
        "detail": result.detail,
        "reason": result.reason,
        "upstream": result.upstream,
        "traces": list(result.traces),
        "fields": list(result.fields),
    }


def _known(entry: KnownFailure) -> dict[str, str]:
    return {"case": entry.case, "flavour": entry.flavour, "reason": entry.reason}


def _case_counts(run: RunInfo, flavours: Iterable[str]) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {flavour: Counter() for flavour in flavours}
    for result in run.results:
        counts.setdefault(result.client.flavour, Counter())[result.outcome.value] += 1
    return counts


def _operation_counts(cov: Coverage) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {flavour: Counter() for flavour in cov.flavours}
    for (_, flavour), cell in cov.cells.items():
        counts[flavour][cell.outcome.value] += 1
    return counts


def _field_counts(cov: Coverage) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {flavour: Counter() for flavour in cov.flavours}
    for (_, flavour), cell in cov.field_cells.items():
        counts[flavour][cell.outcome.value] += 1
    return counts


def _score(cov: Coverage, flavour: str) -> dict[str, Any]:
    score = cov.score(flavour)
    return {
        "fields_green": score.fields_green,
        "fields_total": score.fields_total,
        "field_coverage": round(score.field_coverage, 4),
        "inventory_green": score.inventory_green,
        "inventory_total": score.inventory_total,
        "compatibility": round(score.compatibility, 4),
    }


def _field_rows(cov: Coverage) -> list[dict[str, Any]]:
    rows = []
    for field_id in cov.fields:
        cells = {
            flavour: {
                "outcome": cell.outcome.value,
                "cases": list(cell.cases),
                "detail": cell.detail,
                "reason": cell.reason,
                "answer": cell.answer,
            }
            for flavour in cov.flavours
            if (cell := cov.field_cell(field_id, flavour)) is not None
        }
        rows.append({"id": field_id, "cells": cells})
    return rows


def _mutation(run: RunInfo) -> dict[str, Any] | None:
    found = run.mutation
    if found is None:
        return None
    return {
        "source": found.source,
        "sha256": found.sha256,
        "started_at": found.started_at,
        "tree": found.tree,
        "killed": found.killed,
        "survived": found.survived,
        "errors": found.errors,
        "score": round(found.value, 4),
        "survivors": [{"id": mutant, "description": what} for mutant, what in found.survivors],
    }


def report_document(
    run: RunInfo, cov: Coverage, gate_result: GateResult, *, stale_known_failures: Sequence[KnownFailure] = ()
) -> dict[str, Any]:
    """The report as a JSON-ready dict (what ``to_json`` serialises; ``report.schema.json`` describes it)."""
    if not all(result.duration_s >= 0 for result in run.results):  # also refuses NaN
        raise ValueError("every duration_s must be a finite number >= 0")
    results = _ordered_results(run)
    case_counts = _case_counts(run, cov.flavours)
    operation_counts = _operation_counts(cov)
    field_counts = _field_counts(cov)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "harness_version": run.harness_version,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "target": {
            "server": run.target.server,
            "domain": run.target.domain,
            "template": run.target.template,
            "backend": run.target.backend,
            "features": None if run.target.features is None else sorted(run.target.features),
        },
        "contract": {"manifest_sha256": run.contract_manifest_sha256},
        "clients": [_client(c) for c in _ordered_clients({r.client for r in results})],
        "results": [_result(r) for r in results],
        "summary": {
            flavour: {
                "cases": {o.value: case_counts[flavour][o.value] for o in Outcome},
                "operations": {o.value: operation_counts.get(flavour, Counter())[o.value] for o in CellOutcome},
                "fields": {o.value: field_counts.get(flavour, Counter())[o.value] for o in CellOutcome},
                "score": _score(cov, flavour),
            }
            for flavour in ordered_flavours(case_counts)
        },
        "coverage": {
            "backend": run.target.backend,
            "flavours": list(cov.flavours),
            "operations": [
                {
                    "id": operation,
                    "cells": {
                        flavour: {
                            "outcome": cell.outcome.value,
                            "cases": list(cell.cases),
                            "detail": cell.detail,
                            "reason": cell.reason,
                            "upstream": cell.upstream,
                        }
                        for flavour in cov.flavours
                        for cell in (cov.cells[operation, flavour],)
                    },
                }
                for operation in cov.operations
            ],
            "fields": _field_rows(cov),
        },
        "gaps": list(cov.gaps),
        "unknown_operations": list(cov.unknown_operations),
        "unknown_fields": list(cov.unknown_fields),
        "fixed": [
            {"case": r.case, "flavour": r.client.flavour, "reason": r.reason}
            for r in results
            if r.outcome is Outcome.FIXED
        ],
        "stale_known_failures": [
            _known(e) for e in sorted(stale_known_failures, key=lambda e: (e.case, e.flavour, e.reason))
        ],
        "mutation": _mutation(run),
        "gate": {
            "passed": gate_result.passed,
            "policy_sha256": gate_result.policy_sha256,
            "required": [{"operation": op, "flavour": flavour} for op, flavour in gate_result.required],
            "failures": [
                {"operation": f.operation, "flavour": f.flavour, "outcome": f.outcome.value, "detail": f.detail}
                for f in gate_result.failures
            ],
        },
    }


def to_json(
    run: RunInfo, cov: Coverage, gate_result: GateResult, *, stale_known_failures: Sequence[KnownFailure] = ()
) -> bytes:
    """Canonical JSON bytes of the report: the same inputs always give the same bytes."""
    text = json.dumps(
        report_document(run, cov, gate_result, stale_known_failures=stale_known_failures),
        sort_keys=True,
        ensure_ascii=False,
        indent=2,
        allow_nan=False,
    )
    # A lone surrogate (undecodable process output) cannot be UTF-8: write it as the JSON escape
    # it stands for (json.dumps has already doubled any backslash before it).
    return (text + "\n").encode("utf-8", "backslashreplace")


# --- report.junit.xml ---

# What XML 1.0 can carry; anything else (NUL, terminal escapes, lone surrogates) is written as an escape.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text: str) -> str:
    return _NOT_XML.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text
    )


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def to_junit(run: RunInfo) -> bytes:
    """JUnit XML: a testsuite per client flavour and version, a testcase per case.

    fail → ``failure``; known-fail, unsupported and skip → ``skipped`` with ``type`` saying which
    (JUnit has no expected-failure element; pytest maps xfail the same way); pass and fixed pass.
    """
    results = _ordered_results(run)
    suites: dict[ClientInfo, list[CaseResult]] = {}
    for result in results:
        suites.setdefault(result.client, []).append(result)
    root = ET.Element("testsuites", name=_xml(f"e2b-compat conformance: {run.target.server}"))
    totals: Counter[str] = Counter()
    total_time = 0.0
    for client in _ordered_clients(suites):
        cases = suites[client]
        counts = Counter(_junit_kind(r.outcome) for r in cases)
        time = sum(r.duration_s for r in cases)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=_xml(f"{client.flavour} {client.package} {client.version}"),
            tests=str(len(cases)),
            failures=str(counts["failure"]),
            errors="0",
            skipped=str(counts["skipped"]),
            time=_seconds(time),
        )
        properties = ET.SubElement(suite, "properties")
        for name, value in (
            ("server", run.target.server),
            ("domain", run.target.domain),
            ("template", run.target.template),
            ("backend", run.target.backend),
            ("contract_manifest_sha256", run.contract_manifest_sha256),
            ("harness_version", run.harness_version),
            ("started_at", run.started_at),
        ):
            ET.SubElement(properties, "property", name=name, value=_xml(value))
        for result in cases:
            _junit_case(suite, result)
        totals.update({"tests": len(cases), "failures": counts["failure"], "skipped": counts["skipped"]})
        total_time += time
    root.set("tests", str(totals["tests"]))
    root.set("failures", str(totals["failures"]))
    root.set("errors", "0")
    root.set("skipped", str(totals["skipped"]))
    root.set("time", _seconds(total_time))
    ET.indent(root)
    document: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return document + b"\n"


def _junit_kind(outcome: Outcome) -> str:
    if outcome is Outcome.FAIL:
        return "failure"
    if outcome in (Outcome.KNOWN_FAIL, Outcome.UNSUPPORTED, Outcome.SKIP):
        return "skipped"
    return "passed"


def _junit_case(suite: ET.Element, result: CaseResult) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        classname=_xml(result.client.flavour),
        name=_xml(result.case),
        time=_seconds(result.duration_s),
    )
    operations = ", ".join(result.operations)
    if result.outcome is Outcome.FAIL:
        failure = ET.SubElement(case, "failure", type="fail", message=_xml(first_line(result.detail) or "failed"))
        failure.text = _xml(result.detail)
    elif result.outcome is Outcome.KNOWN_FAIL:
        skipped = ET.SubElement(case, "skipped", type="known-fail", message=_xml(f"known failure: {result.reason}"))
        skipped.text = _xml(result.detail)
    elif result.outcome is Outcome.UNSUPPORTED:
        message = f"unsupported: {result.reason}; upstream answers: {result.upstream}"
        ET.SubElement(case, "skipped", type="unsupported", message=_xml(message))
    elif result.outcome is Outcome.SKIP:
        ET.SubElement(case, "skipped", type="skip", message=_xml(result.reason))
    out = [f"operations: {operations}"]
    if result.outcome is Outcome.FIXED:
        out.append(f"listed as a known failure ({result.reason}) but passed: remove it from known-failures.json")
    out.extend(result.traces)
    ET.SubElement(case, "system-out").text = _xml("\n".join(out))


# --- report.md ---

SYMBOLS = {
    CellOutcome.PASS: "✅",
    CellOutcome.FIXED: "✅",
    CellOutcome.FAIL: "❌",
    CellOutcome.UNSUPPORTED: "➖",  # noqa: RUF001 - the symbol is meant
    CellOutcome.KNOWN_FAIL: "⚠️",
    CellOutcome.SKIP: "⏭️",
    CellOutcome.LISTED: "📝",
    CellOutcome.GAP: "·",
}

LEGEND = (
    "Legend: ✅ every case covering the operation passed (or a known failure now passes) · "
    "❌ a case failed · ⚠️ known failure (listed in known-failures.json) · "
    "➖ declared unsupported, and the endpoint gave the answer declared for that · "  # noqa: RUF001
    "⏭️ skipped (could not run here) · `·` gap: no case covers the operation"
)

FIELD_LEGEND = (
    "Legend as above; 📝 listed in conformance/fields.json (why no case shows the effect, and what a "
    "client gets); an empty cell: that client never sends the field."
)

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~&])")
_MD_DETAIL_CHARS = 200


# Control characters (a terminal escape would act when someone cats report.md) and lone surrogates.
_MD_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _flat(text: str) -> str:
    flat = " ".join(text.split())
    return _MD_UNPRINTABLE.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", flat
    )


def _md(text: str, limit: int = _MD_DETAIL_CHARS) -> str:
    """Untrusted text as inert Markdown on one table line: no links, images, HTML or column breaks."""
    flat = _flat(text)
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return _MD_SPECIAL.sub(r"\\\1", flat)


def _code(text: str, limit: int = _MD_DETAIL_CHARS) -> str:
    """Untrusted text as a code span: nothing inside is interpreted, except a backtick (ends it) and,
    in a table, a pipe (GFM splits the row on it even there)."""
    flat = _flat(text).replace("`", "'")
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return "`" + flat.replace("|", "\\|") + "`"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _column(flavour: str, packages: Mapping[str, str]) -> str:
    if not packages:
        return _md(flavour)
    if len(packages) == 1:
        return f"{_md(flavour)} {_md(next(iter(packages.values())))}"
    named = ", ".join(f"{_md(package)} {_md(version)}" for package, version in sorted(packages.items()))
    return f"{_md(flavour)} ({named})"


def to_markdown(
    run: RunInfo, cov: Coverage, gate_result: GateResult, *, stale_known_failures: Sequence[KnownFailure] = ()
) -> str:
    target = run.target
    # A flavour's column names its version; with several packages (e2b and its interpreter
    # client) each is named: "py-sync (e2b 2.32.0, e2b-code-interpreter 2.8.1)".
    packages: dict[str, dict[str, str]] = {}
    for result in _ordered_results(run):
        packages.setdefault(result.client.flavour, {})[result.client.package] = result.client.version
    columns = [_column(flavour, packages.get(flavour, {})) for flavour in cov.flavours]
    lines = [
        f"# E2B compatibility report: {_md(target.server)}",
        "",
        f"- domain: {_md(target.domain)}; template: {_md(target.template)}; backend: {_md(target.backend)}",
        f"- backend features: {_features_line(target.features)}",
        f"- contract manifest sha256: {_code(run.contract_manifest_sha256)}",
        f"- run: {_md(run.started_at)} to {_md(run.finished_at)}; harness {_md(run.harness_version)}",
        "",
    ]
    lines += _gate_section(gate_result)
    lines += _score_section(cov)
    lines += ["", f"## Operations by client (backend: {_md(target.backend)})", "", LEGEND, ""]
    lines += _table(
        ["operation", *columns],
        ([_code(op), *(SYMBOLS[cov.cells[op, f].outcome] for f in cov.flavours)] for op in cov.operations),
    )
    lines += ["", "## Summary", "", "Cases per outcome:", ""]
    case_counts = _case_counts(run, cov.flavours)
    flavours = ordered_flavours(case_counts)
    lines += _table(
        ["client", *(o.value for o in Outcome), "total"],
        (
            [_md(f), *(str(case_counts[f][o.value]) for o in Outcome), str(sum(case_counts[f].values()))]
            for f in flavours
        ),
    )
    lines += ["", f"Operations ({len(cov.operations)} in the contract inventory):", ""]
    operation_counts = _operation_counts(cov)
    lines += _table(
        ["client", "green", *(o.value for o in CellOutcome if not o.green)],
        (
            [
                _md(f),
                str(sum(n for o, n in operation_counts[f].items() if CellOutcome(o).green)),
                *(str(operation_counts[f][o.value]) for o in CellOutcome if not o.green),
            ]
            for f in cov.flavours
        ),
    )
    lines += ["", "## Known failures that now pass", ""]
    fixed = [r for r in _ordered_results(run) if r.outcome is Outcome.FIXED]
    lines += [f"- {_code(r.case)} ({_md(r.client.flavour)}): {_md(r.reason)}" for r in fixed] or ["None."]
    if stale_known_failures:
        lines += ["", "Listed in known-failures.json but no such case ran (remove them):", ""]
        lines += [f"- {_code(e.case)} ({_md(e.flavour)}): {_md(e.reason)}" for e in stale_known_failures]
    lines += ["", "## Gaps", "", "Operations that no case covers, for any client:", ""]
    lines += [f"- {_code(op)}" for op in cov.gaps] or ["None."]
    if cov.unknown_operations:
        lines += ["", "Operation ids named by cases but missing from the inventory:", ""]
        lines += [f"- {_code(op)}" for op in cov.unknown_operations]
    lines += _fields_not_green(cov)
    failures = [r for r in _ordered_results(run) if r.outcome is Outcome.FAIL]
    if failures:
        lines += ["", "## Failures", "", "First lines; report.json has the full details.", ""]
        lines += _table(
            ["case", "client", "detail"],
            ([_code(r.case), _md(r.client.flavour), _md(first_line(r.detail) or "failed")] for r in failures),
        )
    lines += _field_matrix(cov)
    lines += _mutation_appendix(run)
    return "\n".join(lines) + "\n"


def _features_line(features: Sequence[str] | None) -> str:
    """The backend's feature list, and what it lacks of the runtime's, or "unknown" (a foreign endpoint)."""
    if features is None:
        return "unknown (not our server: its backend's features are not known here)"
    from ._endpoint import runtime_features  # noqa: PLC0415 - the runtime's list, through the harness's door

    lacking = sorted(feature for feature in runtime_features() if feature not in features)
    shown = ", ".join(_code(feature) for feature in sorted(features)) or "none"
    return shown + ("; lacks " + ", ".join(_code(feature) for feature in lacking) if lacking else "; lacks none")


def _mutation_appendix(run: RunInfo) -> list[str]:
    found = run.mutation
    lines = ["", "## Appendix: mutation score", ""]
    if found is None:
        return [*lines, "No mutants session was given (`--mutants`; docs/MUTANTS.md)."]
    lines += [
        f"{found.killed} of {found.killed + found.survived} mutants killed: **{found.value * 100:.1f} %** "
        f"({found.errors} not judged), by the session of {_md(found.started_at)} on {_md(found.tree)} "
        f"({_code(found.source)}, sha256 {_code(found.sha256[:16])}).",
        "",
    ]
    if not found.survivors:
        return [*lines, "No mutant survived."]
    lines += ["Survivors (behaviour changes no case noticed):", ""]
    return lines + [f"- {_code(mutant)}: {_md(what)}" for mutant, what in found.survivors]


def _percent(green: int, total: int) -> str:
    return f"{100 * green / total:.1f} % ({green}/{total})" if total else "n/a (0/0)"


def _score_section(cov: Coverage) -> list[str]:
    if not cov.fields:
        return []
    lines = [
        "",
        "## Scores",
        "",
        "Field coverage: the request fields of the operations a client sends (not declared unsupported) "
        "whose effect a passing case shows. Compatibility score: everything the client sends "
        "(operations and fields, declared-unsupported ones included) that is green.",
        "",
    ]
    scores = {f: cov.score(f) for f in cov.flavours}
    return lines + _table(
        ["client", "field coverage", "compatibility score"],
        (
            [
                _md(f),
                _percent(scores[f].fields_green, scores[f].fields_total),
                _percent(scores[f].inventory_green, scores[f].inventory_total),
            ]
            for f in cov.flavours
        ),
    )


def _fields_not_green(cov: Coverage) -> list[str]:
    if not cov.fields:
        return []
    lines = ["", "## Fields not shown to work", ""]
    rows = [
        [_code(field_id), _md(flavour), f"{SYMBOLS[cell.outcome]} {cell.outcome.value}", _md(cell.detail)]
        for field_id in cov.fields
        for flavour in cov.flavours
        if (cell := cov.field_cell(field_id, flavour)) is not None and not cell.outcome.green
    ]
    if not rows:
        return [*lines, "None."]
    return lines + _table(["field", "client", "outcome", "why"], rows)


def _field_matrix(cov: Coverage) -> list[str]:
    if not cov.fields:
        return []
    lines = ["", "## Appendix: fields by client", "", FIELD_LEGEND, ""]
    return lines + _table(
        ["field", *(_md(f) for f in cov.flavours)],
        (
            [_code(field_id), *(SYMBOLS[c.outcome] if (c := cov.field_cell(field_id, f)) else "" for f in cov.flavours)]
            for field_id in cov.fields
        ),
    )


def _gate_section(gate_result: GateResult) -> list[str]:
    required = len(gate_result.required)
    if gate_result.passed:
        return ["## Gate: ✅ passed", "", f"All {required} required (operation, client) pairs are green."]
    lines = [
        "## Gate: ❌ failed",
        "",
        f"{len(gate_result.failures)} of {required} required (operation, client) pairs are not green:",
        "",
    ]
    lines += _table(
        ["operation", "client", "outcome", "detail"],
        (
            [_code(f.operation), _md(f.flavour), f"{SYMBOLS[f.outcome]} {f.outcome.value}", _md(f.detail)]
            for f in gate_result.failures
        ),
    )
    return lines


# --- files ---


@dataclass(frozen=True)
class ReportFiles:
    directory: Path
    json: Path
    junit: Path
    markdown: Path
    signature: Path | None = None  # report.json.sig, when a signing key was given
    public_key: Path | None = None  # report.json.pub


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def default_report_directory(run: RunInfo, root: Path = Path("reports")) -> Path:
    """``<root>/<UTC start, 20260101T120000Z>-<backend>-<template>``: sorts by time, says what was tested."""
    started = datetime.fromisoformat(run.started_at)
    if started.tzinfo is None:
        raise ValueError(f"started_at {run.started_at!r} has no UTC offset (RFC 3339 requires one)")
    stamp = started.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    parts = [stamp] + [
        _UNSAFE_NAME.sub("_", part).strip("._") or "_" for part in (run.target.backend, run.target.template)
    ]
    return root / "-".join(parts)


def write_report(
    directory: Path | None,
    run: RunInfo,
    cov: Coverage,
    gate_result: GateResult,
    *,
    stale_known_failures: Sequence[KnownFailure] = (),
    signing_key: Ed25519PrivateKey | None = None,
    reports_root: Path = Path("reports"),
) -> ReportFiles:
    """Write report.json, report.junit.xml and report.md (and sign report.json when given a key).

    ``directory`` None means ``default_report_directory(run, reports_root)``. An existing report.json
    there is never overwritten: a signed report must not change under its signature.
    """
    target = directory if directory is not None else default_report_directory(run, reports_root)
    target.mkdir(parents=True, exist_ok=True)
    json_path = target / REPORT_JSON
    if json_path.exists():
        raise FileExistsError(f"{json_path} already exists; write each report to a new folder")
    # Everything is rendered before anything is written: a rendering error leaves no half report.
    report = to_json(run, cov, gate_result, stale_known_failures=stale_known_failures)
    junit = to_junit(run)
    markdown = to_markdown(run, cov, gate_result, stale_known_failures=stale_known_failures)
    _write(target / REPORT_JUNIT, junit)
    _write(target / REPORT_MARKDOWN, markdown.encode("utf-8", "backslashreplace"))
    _write(json_path, report)
    files = ReportFiles(target, json_path, target / REPORT_JUNIT, target / REPORT_MARKDOWN)
    if signing_key is None:
        return files
    from ._signing import sign_report  # noqa: PLC0415 - cryptography is loaded only when signing

    signed = sign_report(json_path, signing_key)
    return ReportFiles(
        files.directory, files.json, files.junit, files.markdown, signed.signature_path, signed.public_key_path
    )


def _write(path: Path, data: bytes) -> None:
    """Whole file or nothing: a reader (or a signer) never sees a half-written report."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with temporary.open("xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
