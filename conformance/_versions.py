"""The version matrix of an SDK sweep: client, version and result, and the changes by version.

A sweep (``e2b-compat conformance run --sweep``) runs every committed client lock against one
endpoint; its report holds one result per case, flavour and version. ``versions.md`` beside the
report shows, for people:

1. **the matrix**: one row per client flavour and version, with its pass, fail, skip and
   known-failure counts and the cases it failed;
2. **cases by version**: for each case that is not the same everywhere, its outcome per version
   (a case skipped before the version whose API it calls shows where that API begins);
3. **changes by version**: the protocol and client changes found since the pin
   (``client-changes.json``: what changed, the first version with it, what the server does),
   ordered by package and version.

Pure functions of the run and the change list; ``write_versions`` only writes the page.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._clients import version_order
from ._model import ClientInfo, Outcome, RunInfo

__all__ = ["CHANGES", "VERSIONS_MARKDOWN", "ClientChange", "load_changes", "versions_markdown", "write_versions"]

CHANGES = Path(__file__).resolve().parent / "client-changes.json"
VERSIONS_MARKDOWN = "versions.md"
_MARK = {**{outcome: outcome.value for outcome in Outcome}, Outcome.FAIL: "FAIL"}


@dataclass(frozen=True)
class ClientChange:
    package: str  # "python e2b", "npm e2b", "python e2b-code-interpreter"
    since: str  # the first version that has it
    change: str
    server: str  # what the server does about it


def load_changes(path: Path = CHANGES) -> list[ClientChange]:
    entries = json.loads(path.read_text(encoding="utf-8"))["changes"]
    return [ClientChange(e["package"], e["since"], e["change"], e["server"]) for e in entries]


def _ordered(clients: Iterable[ClientInfo]) -> list[ClientInfo]:
    return sorted(set(clients), key=lambda c: (c.flavour, c.package, version_order(c.version)))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _matrix(run: RunInfo) -> list[str]:
    lines = [
        "| client | version | pass | fail | skip | known failure | failed cases |",
        "|---|---|---|---|---|---|---|",
    ]
    for client in _ordered(result.client for result in run.results):
        mine = [result for result in run.results if result.client == client]
        counts = Counter(result.outcome for result in mine)
        failed = ", ".join(sorted(result.case for result in mine if result.outcome is Outcome.FAIL)) or "-"
        lines.append(
            f"| {client.flavour} {client.package} | {client.version} | {counts[Outcome.PASS]} | "
            f"{counts[Outcome.FAIL]} | {counts[Outcome.SKIP]} | {counts[Outcome.KNOWN_FAIL]} | {_cell(failed)} |"
        )
    return lines


def _by_case(run: RunInfo) -> list[str]:
    """Cases whose outcome differs between the versions of one client flavour, one table per flavour."""
    lines: list[str] = []
    for flavour in sorted({result.client.flavour for result in run.results}):
        results = [result for result in run.results if result.client.flavour == flavour]
        versions = _ordered(result.client for result in results)
        outcome: dict[str, dict[ClientInfo, Outcome]] = defaultdict(dict)
        for result in results:
            outcome[result.case][result.client] = result.outcome
        varying = sorted(case for case, seen in outcome.items() if len(set(seen.values())) > 1)
        if not varying:
            continue
        header = [f"{client.package} {client.version}" for client in versions]
        lines += [f"### {flavour}", "", "| case | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
        for case in varying:
            cells = [_MARK[outcome[case][client]] if client in outcome[case] else "-" for client in versions]
            lines.append(f"| {_cell(case)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines or ["Every case had the same outcome in every version of its client.", ""]


def _changes(changes: Sequence[ClientChange]) -> list[str]:
    lines = ["| package | first version | change | what the server does |", "|---|---|---|---|"]
    for change in sorted(changes, key=lambda c: (c.package, version_order(c.since))):
        lines.append(f"| {change.package} | {change.since} | {_cell(change.change)} | {_cell(change.server)} |")
    return lines


def versions_markdown(run: RunInfo, changes: Sequence[ClientChange]) -> str:
    target = run.target
    lines = [
        f"# Client versions against {target.server} ({target.backend})",
        "",
        f"Run {run.started_at} to {run.finished_at}; every committed client lock. The signed report beside",
        "this page (report.json) holds every result; this page only arranges them by version.",
        "",
        "## The matrix",
        "",
        *_matrix(run),
        "",
        "## Cases by version",
        "",
        *_by_case(run),
        "## Changes by version",
        "",
        *_changes(changes),
        "",
    ]
    return "\n".join(lines)


def write_versions(directory: Path, run: RunInfo, changes: Sequence[ClientChange] | None = None) -> Path:
    path = directory / VERSIONS_MARKDOWN
    path.write_text(versions_markdown(run, load_changes() if changes is None else changes), encoding="utf-8")
    return path
