"""The matrix across backends: operations x clients x backends, and every difference explained.

``_matrix`` merges reports; this part compares them. For each operation of the contract inventory
and each case, one cell per (report, flavour). A row *differs* when, for some flavour, reports of
different backends disagree (pass and fixed count as the same). Every cell of a differing row
that is not green gets a reason:

- ``missing-feature``: the report's backend lacks a feature (its ``target.features``) that the
  case or the operation needs (``backend-features.json``);
- ``known-failure``: a known failure (``known-failures.json``, for that backend or for all), with
  its listed reason;
- ``skip``: the case could not run there, with its reason;
- ``unexplained``: none of these. An unexplained difference fails the matrix: a backend behaving
  differently for no declared reason is a bug to find, not a fact to publish.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._backend_features import FeatureNeed, explain_missing, load_feature_needs, provided_of
from ._coverage import SEVERITY, first_line

if TYPE_CHECKING:
    from ._matrix import MergedReport

__all__ = ["backend_differences", "gist", "operations_table"]

FLAVOURS = ("py-sync", "py-async", "js")
_GREEN = ("pass", "fixed")
_ORDER = [outcome.value for outcome in SEVERITY]


def _column(index: int, flavour: str) -> str:
    return f"{index}:{flavour}"


_ERROR_LINE = re.compile(r"^\s*[\w.]*(Error|Exception)\b.*:")


def gist(detail: str) -> str:
    """The line of a failure detail that says what went wrong: the error raised, else its first line."""
    for line in detail.splitlines():
        if _ERROR_LINE.match(line):
            return line.strip()[:200]
    return first_line(detail)[:200]


def _case_cells(report: MergedReport) -> dict[tuple[str, str], tuple[str, str]]:
    """(case, flavour) → (worst outcome over its client versions, that result's reason or failure gist)."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for result in report.document["results"]:
        key = (result["case"], result["client"]["flavour"])
        previous = found.get(key)
        if previous is None or _ORDER.index(result["outcome"]) < _ORDER.index(previous[0]):
            found[key] = (result["outcome"], result.get("reason", "") or gist(result.get("detail", "")))
    return found


def _operation_cells(report: MergedReport) -> dict[tuple[str, str], dict[str, Any]]:
    """(operation, flavour) → the report's coverage cell (outcome, cases, reason, ...), for flavours that ran."""
    ran = {result["client"]["flavour"] for result in report.document["results"]}
    return {
        (row["id"], flavour): cell
        for row in report.document["coverage"]["operations"]
        for flavour, cell in row["cells"].items()
        if flavour in ran
    }


def operations_table(reports: Sequence[MergedReport]) -> list[dict[str, Any]]:
    """One row per operation: its outcome per (report, flavour) that ran that flavour."""
    per_report = [_operation_cells(report) for report in reports]
    operations = sorted({operation for cells in per_report for operation, _ in cells})
    return [
        {
            "id": operation,
            "cells": {
                _column(index, flavour): cells[operation, flavour]["outcome"]
                for index, cells in enumerate(per_report, 1)
                for flavour in FLAVOURS
                if (operation, flavour) in cells
            },
        }
        for operation in operations
    ]


def _differs(report_backends: Sequence[str], cells: dict[str, str], flavour: str) -> bool:
    by_backend: dict[str, set[str]] = {}
    for index, backend in enumerate(report_backends, 1):
        outcome = cells.get(_column(index, flavour))
        if outcome is not None:
            by_backend.setdefault(backend, set()).add("pass" if outcome in _GREEN else outcome)
    seen = set().union(*by_backend.values()) if by_backend else set()
    return len(by_backend) > 1 and len(seen) > 1


def _explain(
    outcome: str, reason: str, needs: list[FeatureNeed], cases_needing: list[FeatureNeed]
) -> tuple[str, list[str], str]:
    """(why, features, reason) for one non-green cell."""
    lacking = sorted({need.feature for need in (*needs, *cases_needing)})
    if lacking:
        why_text = "; ".join(sorted({need.reason for need in (*needs, *cases_needing)}))
        return "missing-feature", lacking, why_text
    if outcome == "known-fail":
        return "known-failure", [], reason
    if outcome == "skip":
        return "skip", [], reason
    return "unexplained", [], reason


def backend_differences(reports: Sequence[MergedReport]) -> list[dict[str, Any]]:
    """Every case and operation whose outcome differs between backends, each non-green cell explained."""
    needs = load_feature_needs()
    backends = [report.backend for report in reports]
    provided = [provided_of(report.document["target"]) for report in reports]
    rows: list[dict[str, Any]] = []
    case_cells = [_case_cells(report) for report in reports]
    for case in sorted({case for cells in case_cells for case, _ in cells}):
        cells = {
            _column(index, flavour): found[case, flavour][0]
            for index, found in enumerate(case_cells, 1)
            for flavour in FLAVOURS
            if (case, flavour) in found
        }

        def case_why(index: int, flavour: str, case: str = case) -> tuple[str, list[str], str]:
            outcome, reason = case_cells[index - 1][case, flavour]
            return _explain(outcome, reason, explain_missing(provided[index - 1], case=case, needs=needs), [])

        rows += _rows("case", case, cells, backends, case_why)
    operation_cells = [_operation_cells(report) for report in reports]
    for row in operations_table(reports):
        operation = row["id"]

        def operation_why(index: int, flavour: str, operation: str = operation) -> tuple[str, list[str], str]:
            cell = operation_cells[index - 1][operation, flavour]
            have = provided[index - 1]
            by_case = [n for case in cell["cases"] for n in explain_missing(have, case=case, needs=needs)]
            by_operation = explain_missing(have, operation=operation, needs=needs)
            reason = cell.get("reason", "") or gist(cell.get("detail", ""))
            return _explain(cell["outcome"], reason, by_operation, by_case)

        rows += _rows("operation", operation, row["cells"], backends, operation_why)
    return rows


def _rows(kind: str, name: str, cells: dict[str, str], backends: Sequence[str], why: Any) -> list[dict[str, Any]]:
    differing = [flavour for flavour in FLAVOURS if _differs(backends, cells, flavour)]
    if not differing:
        return []
    explanations = []
    for index, backend in enumerate(backends, 1):
        for flavour in differing:
            outcome = cells.get(_column(index, flavour))
            if outcome is None or outcome in _GREEN:
                continue
            reason_kind, features, reason = why(index, flavour)
            explanations.append(
                {
                    "run": index,
                    "backend": backend,
                    "flavour": flavour,
                    "outcome": outcome,
                    "why": reason_kind,
                    "features": features,
                    "reason": reason,
                }
            )
    explained = all(item["why"] != "unexplained" for item in explanations)
    return [{"kind": kind, "id": name, "cells": cells, "explanations": explanations, "explained": explained}]
