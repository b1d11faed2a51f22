"""The outputs of a mutants session: ``mutants.json`` (canonical) and ``mutants.md`` (for people).

Both say, per mutant, killed / survived / error (and which error), the cases that killed it
(``mutants.md`` sums each failure up in one line), the runs made against it and how the mutation
was seen to be in what ran; and the score, killed / (killed + survived). They go to
``reports/mutants/<UTC start>/`` by default, beside the compatibility reports (docs/MUTANTS.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._model import MutationScore
from ._mutants import CaseKey, MutantOutcome, MutantResult, score

__all__ = [
    "MUTANTS_JSON",
    "MUTANTS_MARKDOWN",
    "MutantRun",
    "MutantsFileError",
    "default_mutants_directory",
    "load_mutation_score",
    "to_json",
    "to_markdown",
    "write_outputs",
]

MUTANTS_JSON = "mutants.json"
MUTANTS_MARKDOWN = "mutants.md"
SCHEMA_VERSION = "1.0"
_DETAIL_CHARS = 2000  # per failure in the JSON; the Markdown shows the first line


@dataclass(frozen=True)
class MutantRun:
    """One session: the tree it copied, the baseline, and one result per mutant."""

    started_at: str  # RFC 3339 UTC
    finished_at: str
    tree: str  # the checkout the copies were made from, with its git commit and whether it was dirty
    baseline: dict[CaseKey, tuple[bool, str]]  # every run made on the unmutated copy
    results: tuple[MutantResult, ...]
    budget_s: float
    baseline_error: str = ""  # the unmutated copy's server did not start: nothing was judged


def default_mutants_directory(started_at: str, root: Path = Path("reports")) -> Path:
    stamp = datetime.fromisoformat(started_at).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return root / "mutants" / stamp


def _result_json(result: MutantResult) -> dict[str, Any]:
    mutant = result.mutant
    return {
        "id": mutant.id,
        "file": mutant.file,
        "description": mutant.description,
        "cases": list(mutant.cases),
        "outcome": result.outcome.value,
        "error": None if result.error is None else result.error.value,
        "reason": result.reason,
        "killed_by": [str(key) for key in result.killed_by],
        "ran": [str(key) for key in result.ran],
        "details": {key: text[:_DETAIL_CHARS] for key, text in sorted(result.details.items())},
        "duration_s": round(result.duration_s, 1),
        "waited_s": round(result.waited_s, 1),
        "verified": result.verified,
    }


def to_json(run: MutantRun) -> bytes:
    """Canonical: sorted keys, two-space indent, one final newline; mutants in the order they ran."""
    total = score(run.results)
    failures = [(key, detail) for key, (passed, detail) in sorted(run.baseline.items()) if not passed]
    document = {
        "schema_version": SCHEMA_VERSION,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "tree": run.tree,
        "budget_s": round(run.budget_s),
        "baseline_error": run.baseline_error,
        "baseline": {
            "passed": sorted(str(key) for key, (passed, _) in run.baseline.items() if passed),
            "failed": {str(key): detail[:_DETAIL_CHARS] for key, detail in failures},
        },
        "score": {
            "killed": total.killed,
            "survived": total.survived,
            "errors": total.errors,
            "value": None if total.value is None else round(total.value, 4),
        },
        "mutants": [_result_json(result) for result in run.results],
    }
    return (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _cell(text: str) -> str:
    """One Markdown table cell: the first line, pipes escaped."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first.replace("|", "\\|")[:200]


def _summary(detail: str) -> str:
    """A failure in one line: its first, and when that only announces what follows, also its last
    (a crashed scenario's exception, a failed check's result)."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return _cell(f"{lines[0]} … {lines[-1]}")
    return _cell(lines[0])


def _verdict(result: MutantResult) -> str:
    if result.outcome is MutantOutcome.KILLED:
        return "killed by " + ", ".join(f"`{key}`" for key in result.killed_by)
    if result.outcome is MutantOutcome.SURVIVED:
        return "survived " + ", ".join(f"`{key}`" for key in result.ran)
    assert result.error is not None
    return f"error ({result.error.value}): {_cell(result.reason)}"


def to_markdown(run: MutantRun) -> str:
    total = score(run.results)
    lines = [
        "# Mutants",
        "",
        f"Score: **{total.text()}**, from {run.started_at} to {run.finished_at} (budget {run.budget_s / 60:.0f} min).",
        "",
        f"Tree: {run.tree}.",
        "",
    ]
    if run.baseline_error:
        lines += [f"**The unmutated tree's server did not start; nothing was judged:** {_cell(run.baseline_error)}", ""]
    passed = sum(1 for ok, _ in run.baseline.values() if ok)
    lines += [f"Baseline: {passed} of {len(run.baseline)} runs passed on the unmutated tree; only those count.", ""]
    failed = [(key, detail) for key, (ok, detail) in sorted(run.baseline.items()) if not ok]
    lines += [f"- baseline failure `{key}`: {_summary(detail)}" for key, detail in failed]
    lines += ["", "| mutant | outcome | what changes | file |", "|---|---|---|---|"]
    for result in run.results:
        mutant = result.mutant
        lines.append(f"| `{mutant.id}` | {_verdict(result)} | {_cell(mutant.description)} | `{mutant.file}` |")
    survivors = [result for result in run.results if result.outcome is MutantOutcome.SURVIVED]
    lines += ["", "## Survivors", ""]
    if not survivors:
        lines.append("None: every judged mutant was killed.")
    for result in survivors:
        ran = ", ".join(f"`{key}`" for key in result.ran)
        lines.append(f"- `{result.mutant.id}`: {result.mutant.description}. Still passed: {ran}.")
    killed = [result for result in run.results if result.outcome is MutantOutcome.KILLED]
    if killed:
        lines += ["", "## How the killed ones were noticed", ""]
        for result in killed:
            for key, detail in sorted(result.details.items()):
                lines.append(f"- `{result.mutant.id}` by `{key}`: {_summary(detail)}")
    return "\n".join(lines) + "\n"


def write_outputs(directory: Path, run: MutantRun) -> tuple[Path, Path]:
    """Write both files (JSON last, so a folder with ``mutants.json`` holds a finished pair)."""
    directory.mkdir(parents=True, exist_ok=True)
    markdown = directory / MUTANTS_MARKDOWN
    markdown.write_text(to_markdown(run), encoding="utf-8")
    document = directory / MUTANTS_JSON
    document.write_bytes(to_json(run))
    return document, markdown


class MutantsFileError(ValueError):
    """A file given as a mutants session's output is not one."""


def load_mutation_score(path: Path) -> MutationScore:
    """A session's score and survivors from its mutants.json (or its folder), for a report's appendix."""
    source = path / MUTANTS_JSON if path.is_dir() else path
    try:
        data = source.read_bytes()
        document = json.loads(data)
        if document.get("schema_version") != SCHEMA_VERSION:
            version = document.get("schema_version")
            raise MutantsFileError(f"{source}: not a mutants session's output (schema_version {version!r}, not 1.0)")
        counts = document["score"]
        survivors = tuple(
            (str(m["id"]), str(m["description"])) for m in document["mutants"] if m["outcome"] == "survived"
        )
        found = MutationScore(
            source=str(source),
            sha256=hashlib.sha256(data).hexdigest(),
            started_at=str(document["started_at"]),
            tree=str(document["tree"]),
            killed=int(counts["killed"]),
            survived=int(counts["survived"]),
            errors=int(counts["errors"]),
            survivors=survivors,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, MutantsFileError):
            raise
        raise MutantsFileError(f"{source}: not a mutants session's output ({exc!r})") from None
    if len(found.survivors) != found.survived:
        raise MutantsFileError(f"{source}: its score counts {found.survived} survivors, its mutants {len(survivors)}")
    return found
