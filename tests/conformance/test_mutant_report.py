"""mutants.json and mutants.md: what each says about a session, and where they go."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conformance._mutant_report import (
    MUTANTS_JSON,
    MUTANTS_MARKDOWN,
    MutantRun,
    MutantsFileError,
    default_mutants_directory,
    load_mutation_score,
    to_json,
    to_markdown,
    write_outputs,
)
from conformance._mutants import CaseKey, ErrorKind, Mutant, MutantOutcome, MutantResult

A, B = CaseKey("envd/commands/foreground", "py-sync"), CaseKey("wire/control/create-status", "wire")


def _mutant(name: str, description: str = "answers 200 | not 201") -> Mutant:
    return Mutant(f"server/create/{name}", "reference_server/_views.py", "old", "new", description, ("envd/x",))


RUN = MutantRun(
    started_at="2026-05-09T07:35:25Z",
    finished_at="2026-05-09T07:50:00Z",
    tree="/work/main at 0123456789ab",
    baseline={A: (True, ""), B: (False, "POST answered 500\nmore")},
    results=(
        MutantResult(
            _mutant("killed"),
            MutantOutcome.KILLED,
            killed_by=(A,),
            ran=(A,),
            details={str(A): "exit 1\nrest"},
        ),
        MutantResult(_mutant("survived"), MutantOutcome.SURVIVED, ran=(A,), duration_s=12.34, waited_s=3.0),
        MutantResult(_mutant("broken"), MutantOutcome.ERROR, ErrorKind.APPLY, "the old snippet is not found"),
    ),
    budget_s=1800,
)


def test_the_json_holds_every_mutant_the_baseline_and_the_score() -> None:
    document = json.loads(to_json(RUN))
    assert document["score"] == {"killed": 1, "survived": 1, "errors": 1, "value": 0.5}
    assert document["baseline"] == {
        "passed": ["envd/commands/foreground@py-sync"],
        "failed": {"wire/control/create-status@wire": "POST answered 500\nmore"},
    }
    killed, survived, broken = document["mutants"]
    assert killed["outcome"] == "killed"
    assert killed["killed_by"] == ["envd/commands/foreground@py-sync"]
    assert killed["details"] == {"envd/commands/foreground@py-sync": "exit 1\nrest"}
    assert (survived["outcome"], survived["duration_s"], survived["waited_s"]) == ("survived", 12.3, 3.0)
    assert (broken["outcome"], broken["error"], broken["reason"]) == ("error", "apply", "the old snippet is not found")
    assert killed["error"] is None
    assert set(killed) >= {"id", "file", "description", "cases", "ran", "verified"}


def test_the_json_is_canonical() -> None:
    data = to_json(RUN)
    assert data.endswith(b"}\n")
    assert data == (json.dumps(json.loads(data), indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    assert to_json(RUN) == data


def test_the_markdown_gives_the_score_each_outcome_and_the_survivors() -> None:
    text = to_markdown(RUN)
    assert "Score: **50.0% (1 killed / 2 judged; 1 errors)**" in text
    assert "| `server/create/killed` | killed by `envd/commands/foreground@py-sync` |" in text
    assert "| `server/create/broken` | error (apply): the old snippet is not found |" in text
    assert "answers 200 \\| not 201" in text, "pipes in cells are escaped"
    survivors = text.split("## Survivors", 1)[1].split("##", 1)[0]
    assert "`server/create/survived`" in survivors
    assert "`server/create/killed`" not in survivors
    assert "- baseline failure `wire/control/create-status@wire`: POST answered 500\n" in text
    assert "by `envd/commands/foreground@py-sync`: exit 1\n" in text, "only a failure's first line"


def test_a_failure_that_announces_its_detail_shows_its_last_line_too() -> None:
    crashed = (
        "py-sync:sandbox/create failed (exit 1):\n\nTraceback ...\n  File x\nException: Body of the request is None\n"
    )
    result = MutantResult(_mutant("crashed"), MutantOutcome.KILLED, killed_by=(A,), ran=(A,), details={str(A): crashed})
    run = MutantRun("2026-05-09T07:35:25Z", "2026-05-09T07:36:00Z", "t", {A: (True, "")}, (result,), 60)
    assert "(exit 1): … Exception: Body of the request is None\n" in to_markdown(run)


def test_a_run_without_survivors_says_so_and_a_baseline_error_is_shown() -> None:
    run = MutantRun("2026-05-09T07:35:25Z", "2026-05-09T07:36:00Z", "t", {}, (), 60, baseline_error="no server")
    text = to_markdown(run)
    assert "None: every judged mutant was killed." in text
    assert "Score: **n/a" in text
    assert "nothing was judged:** no server" in text
    assert json.loads(to_json(run))["score"]["value"] is None


def test_outputs_go_beside_the_reports_by_start_time(tmp_path: Path) -> None:
    directory = default_mutants_directory("2026-05-09T07:35:25Z", tmp_path)
    assert directory == tmp_path / "mutants" / "20260509T073525Z"
    document, markdown = write_outputs(directory, RUN)
    assert (document.name, markdown.name) == (MUTANTS_JSON, MUTANTS_MARKDOWN)
    assert document.read_bytes() == to_json(RUN)
    assert markdown.read_text() == to_markdown(RUN)


def test_a_sessions_score_and_survivors_are_read_back_for_a_report(tmp_path: Path) -> None:
    json_path, _ = write_outputs(tmp_path / "session", RUN)
    for given in (json_path, json_path.parent):
        found = load_mutation_score(given)
        assert (found.killed, found.survived, found.errors, found.value) == (1, 1, 1, 0.5)
        assert found.survivors == (("server/create/survived", "answers 200 | not 201"),)
        assert found.tree == RUN.tree
        assert found.started_at == RUN.started_at
        assert found.sha256 == hashlib.sha256(json_path.read_bytes()).hexdigest()


def test_a_file_that_is_no_sessions_output_is_refused(tmp_path: Path) -> None:
    for name, text in (("a.json", "{"), ("b.json", '{"schema_version": "9"}'), ("c.json", '{"schema_version": "1.0"}')):
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(MutantsFileError, match=name):
            load_mutation_score(tmp_path / name)
    with pytest.raises(MutantsFileError, match="not a mutants session"):
        load_mutation_score(tmp_path / "missing")
    document = json.loads(to_json(RUN))
    document["score"]["survived"] = 2
    (tmp_path / "d.json").write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(MutantsFileError, match="counts 2 survivors"):
        load_mutation_score(tmp_path / "d.json")
