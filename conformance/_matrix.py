"""``e2b-compat conformance matrix``: several signed reports merged into one compatibility matrix.

A report (``_report``) is one run: one endpoint and backend, the templates its cases used, and
the client versions it ran. Runs over several backends, template sets or client versions are
merged here into ``matrix.json`` (canonical, like report.json) and ``matrix.md``:

- one row per report, keyed by (backend, templates, client versions): whether its signature
  holds, its gate, and per flavour the cases passed, field coverage and compatibility score;
- the cases that did not pass everywhere, one column per (report, flavour), so that a case
  failing only on one backend or one client version stands out;
- operations x clients x backends: every inventory operation's outcome per (report, flavour);
- every case and operation whose outcome differs between backends, each non-green cell with its
  reason: a feature that backend lacks, a known failure, or *unexplained* (``_matrix_backends``).
  ``unexplained`` counts those; the command and ``--backend all`` exit 1 when it is not 0.

``matrix.json`` is signed like a report (``matrix.json.sig``, ``matrix.json.pub``) when a key is
given; ``e2b-compat conformance verify OUTPUT/matrix.json`` checks it.

Reports are read, validated against ``report.schema.json`` and their signatures checked; a report
whose signature is present but wrong, a document that is not a report, or two reports with the
same key is an error (``MatrixError``): a matrix must not silently pick one of two answers.
An unsigned report is merged and shown as such.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema

from ._backend_features import provided_of
from ._coverage import SEVERITY
from ._matrix_backends import backend_differences, operations_table
from ._report import REPORT_JSON, REPORT_SCHEMA_PATH
from ._signing import signature_paths, verify

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["MatrixError", "MatrixFiles", "MergedReport", "load_report", "matrix_document", "write_matrix"]

MATRIX_JSON = "matrix.json"
MATRIX_MARKDOWN = "matrix.md"
MATRIX_SCHEMA_VERSION = "1.1"  # 1.1: run features, operations x clients x backends, differences explained
FLAVOURS = ("py-sync", "py-async", "js")


class MatrixError(ValueError):
    """A report cannot be merged (not a report, a broken signature, a duplicate key)."""


@dataclass(frozen=True)
class MergedReport:
    """One report as the matrix sees it."""

    path: Path  # its report.json
    document: dict[str, Any]
    signed: bool
    fingerprint: str | None

    @property
    def backend(self) -> str:
        return str(self.document["target"]["backend"])

    @property
    def templates(self) -> str:
        return str(self.document["target"]["template"])

    @property
    def clients(self) -> tuple[str, ...]:
        """``py-sync e2b 2.32.0``, one per (flavour, package, version) the run used."""
        return tuple(f"{c['flavour']} {c['package']} {c['version']}" for c in self.document["clients"])

    @property
    def key(self) -> tuple[str, str, tuple[str, ...]]:
        return (self.backend, self.templates, self.clients)


@functools.cache
def _report_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(REPORT_SCHEMA_PATH.read_text(encoding="utf-8")))


def load_report(path: Path, *, trusted_fingerprint: str | None = None) -> MergedReport:
    """Read a report folder (or its report.json), validate it and check its signature if it has one."""
    report = path / REPORT_JSON if path.is_dir() else path
    try:
        document = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MatrixError(f"{report}: not a readable JSON report ({exc})") from None
    problem = jsonschema.exceptions.best_match(_report_validator().iter_errors(document))
    if problem is not None:
        where = "/".join(str(part) for part in problem.absolute_path) or "(top)"
        raise MatrixError(f"{report}: not a conformance report ({where}: {problem.message})")
    signature, public_key = signature_paths(report)
    if not signature.exists() and not public_key.exists():
        if trusted_fingerprint is not None:
            raise MatrixError(f"{report}: unsigned, but a trusted key was asked for")
        return MergedReport(report, document, signed=False, fingerprint=None)
    checked = verify(report, trusted_fingerprint=trusted_fingerprint)
    if not checked:
        raise MatrixError(f"{report}: {checked.problem}")
    return MergedReport(report, document, signed=True, fingerprint=checked.fingerprint)


def _ordered(reports: Sequence[MergedReport]) -> list[MergedReport]:
    seen: dict[tuple[str, str, tuple[str, ...]], MergedReport] = {}
    for report in reports:
        other = seen.get(report.key)
        if other is not None:
            raise MatrixError(
                f"{other.path} and {report.path} are both reports of backend {report.backend}, "
                f"templates {report.templates}, clients {', '.join(report.clients)}: merge one of them"
            )
        seen[report.key] = report
    return [seen[key] for key in sorted(seen)]


def _flavour_row(summary: dict[str, Any]) -> dict[str, Any]:
    cases = summary["cases"]
    score = summary["score"]
    return {
        "cases_passed": cases.get("pass", 0) + cases.get("fixed", 0),
        "cases_total": sum(cases.values()),
        "cases_failed": cases.get("fail", 0),
        "field_coverage": score["field_coverage"],
        "compatibility": score["compatibility"],
    }


def _outcomes(report: MergedReport) -> dict[tuple[str, str], str]:
    """(case, flavour) → the worst outcome of that case's results (several client versions)."""
    order = [outcome.value for outcome in SEVERITY]
    found: dict[tuple[str, str], str] = {}
    for result in report.document["results"]:
        key = (result["case"], result["client"]["flavour"])
        outcome = result["outcome"]
        previous = found.get(key)
        if previous is None or order.index(outcome) < order.index(previous):
            found[key] = outcome
    return found


def matrix_document(reports: Sequence[MergedReport]) -> dict[str, Any]:
    """The merged matrix as a JSON-ready dict."""
    if not reports:
        raise MatrixError("no reports to merge")
    ordered = _ordered(reports)
    rows = []
    outcomes = [_outcomes(report) for report in ordered]
    for index, report in enumerate(ordered, 1):
        summary = report.document["summary"]
        rows.append(
            {
                "run": index,
                "report": str(report.path),
                "backend": report.backend,
                "templates": report.templates,
                "clients": list(report.clients),
                "started_at": report.document["started_at"],
                "signed": report.signed,
                "fingerprint": report.fingerprint,
                "gate_passed": report.document["gate"]["passed"],
                "features": None if (found := provided_of(report.document["target"])) is None else sorted(found),
                "flavours": {
                    flavour: _flavour_row(summary[flavour])
                    for flavour in FLAVOURS
                    if flavour in summary and sum(summary[flavour]["cases"].values())  # a flavour that ran
                },
            }
        )
    cases = sorted({case for found in outcomes for case, _ in found})
    differing = []
    for case in cases:
        cells = {
            f"{index}:{flavour}": found[case, flavour]
            for index, found in enumerate(outcomes, 1)
            for flavour in FLAVOURS
            if (case, flavour) in found
        }
        if any(outcome not in ("pass", "fixed") for outcome in cells.values()):
            differing.append({"case": case, "cells": cells})
    differences = backend_differences(ordered)
    return {
        "schema_version": MATRIX_SCHEMA_VERSION,
        "runs": rows,
        "cases_not_passing_everywhere": differing,
        "operations": operations_table(ordered),
        "differences": differences,
        "unexplained": sum(1 for row in differences if not row["explained"]),
    }


def _percent(value: float) -> str:
    return f"{value * 100:.1f} %"


def to_markdown(document: dict[str, Any]) -> str:
    runs = document["runs"]
    lines = [
        "# Compatibility matrix",
        "",
        f"{len(runs)} report(s) merged; one row per (backend, templates, clients).",
        "",
    ]
    header = ["run", "backend", "templates", "clients", "signed", "gate"]
    for flavour in FLAVOURS:
        header += [f"{flavour} cases", f"{flavour} fields", f"{flavour} score"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        cells = [
            str(run["run"]),
            run["backend"],
            run["templates"],
            "<br>".join(run["clients"]),
            f"yes ({run['fingerprint'][:16]}…)" if run["signed"] else "no",
            "passed" if run["gate_passed"] else "FAILED",
        ]
        for flavour in FLAVOURS:
            row = run["flavours"].get(flavour)
            if row is None:
                cells += ["-", "-", "-"]
            else:
                cells += [
                    f"{row['cases_passed']}/{row['cases_total']}",
                    _percent(row["field_coverage"]),
                    _percent(row["compatibility"]),
                ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines += ["", "## Cases that did not pass everywhere", ""]
    differing = document["cases_not_passing_everywhere"]
    if not differing:
        lines.append("None: every case passed in every run it ran in.")
    else:
        columns = [f"{run['run']}:{flavour}" for run in runs for flavour in FLAVOURS if flavour in run["flavours"]]
        lines += ["| case | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
        for row in differing:
            lines.append(f"| `{row['case']}` | " + " | ".join(row["cells"].get(c, "") for c in columns) + " |")
    lines += _features_section(runs)
    lines += _differences_section(document)
    lines += _operations_section(document)
    lines += ["", "Reports:", ""]
    lines += [f"{run['run']}. `{run['report']}` ({run['started_at']})" for run in runs]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _columns(runs: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(key, header) per (run, flavour) that ran: ``1:js`` and ``crun js`` (run number added when a backend repeats)."""
    backends = [run["backend"] for run in runs]
    columns = []
    for run in runs:
        name = run["backend"] if backends.count(run["backend"]) == 1 else f"{run['run']}:{run['backend']}"
        columns += [
            (f"{run['run']}:{flavour}", f"{name} {flavour}") for flavour in FLAVOURS if flavour in run["flavours"]
        ]
    return columns


def _features_section(runs: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Backend features",
        "",
        "What each run's backend provides (the backends table; unknown: not our server).",
        "",
    ]
    for run in runs:
        features = run["features"]
        shown = "unknown" if features is None else (", ".join(f"`{f}`" for f in features) or "none")
        lines.append(f"- run {run['run']} ({_cell(run['backend'])}): {shown}")
    return lines


def _differences_section(document: dict[str, Any]) -> list[str]:
    lines = ["", "## Differences between backends", ""]
    differences = document["differences"]
    if not differences:
        return [*lines, "None: every case and operation has the same outcome on every backend."]
    lines.append(f"{len(differences)} row(s) differ; **{document['unexplained']} unexplained**.")
    lines += ["", "| kind | case or operation | run | backend | client | outcome | why | reason |", "|" + "---|" * 8]
    for row in differences:
        for item in row["explanations"]:
            why = item["why"] + (f" ({', '.join(item['features'])})" if item["features"] else "")
            if item["why"] == "unexplained":
                why = "**UNEXPLAINED**"
            cells = [row["kind"], f"`{row['id']}`", str(item["run"]), item["backend"], item["flavour"], item["outcome"]]
            lines.append("| " + " | ".join(_cell(c) for c in [*cells, why, item["reason"][:200]]) + " |")
    return lines


def _operations_section(document: dict[str, Any]) -> list[str]:
    columns = _columns(document["runs"])
    lines = ["", "## Operations x clients x backends", ""]
    lines += [
        "| operation | " + " | ".join(_cell(header) for _, header in columns) + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for row in document["operations"]:
        lines.append(f"| `{row['id']}` | " + " | ".join(row["cells"].get(key, "") for key, _ in columns) + " |")
    return lines


@dataclass(frozen=True)
class MatrixFiles:
    json: Path
    markdown: Path
    unexplained: int  # differences between backends with no declared reason
    signature: Path | None = None
    public_key: Path | None = None


def write_matrix(
    reports: Sequence[MergedReport], output: Path, *, signing_key: Ed25519PrivateKey | None = None
) -> MatrixFiles:
    """Write matrix.json and matrix.md into ``output`` (and sign matrix.json when given a key).

    Nothing is written if the merge fails; an existing matrix.json is never overwritten.
    """
    document = matrix_document(reports)
    text = json.dumps(document, sort_keys=True, ensure_ascii=False, indent=2) + "\n"
    markdown = to_markdown(document)
    output.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = output / MATRIX_JSON, output / MATRIX_MARKDOWN
    if json_path.exists():
        raise MatrixError(f"{json_path} already exists; write each matrix to a new folder")
    markdown_path.write_text(markdown, encoding="utf-8")
    json_path.write_text(text, encoding="utf-8")
    files = MatrixFiles(json_path, markdown_path, document["unexplained"])
    if signing_key is None:
        return files
    from ._signing import sign_report  # noqa: PLC0415 - cryptography is loaded only when signing

    signed = sign_report(json_path, signing_key)
    return MatrixFiles(json_path, markdown_path, files.unexplained, signed.signature_path, signed.public_key_path)
