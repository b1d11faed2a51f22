"""Mutants: applying one (the exact-once rule), choosing its runs, judging it, and the score."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance._mutants import (
    CaseKey,
    ErrorKind,
    Mutant,
    MutantOutcome,
    MutantResult,
    MutationError,
    Score,
    apply_mutation,
    apply_to_tree,
    classify,
    expand_selectors,
    score,
)


def mutant(old: str = "return 201", new: str = "return 200", file: str = "pkg/mod.py", **kw: object) -> Mutant:
    fields: dict[str, object] = {"description": "answers 200", "cases": ("envd/a",)} | kw
    return Mutant("server/create/status-200", file, old, new, **fields)  # type: ignore[arg-type]


# --- applying: the snippet must occur exactly once ---


def test_the_snippet_is_replaced_once() -> None:
    assert apply_mutation("def f():\n    return 201\n", mutant()) == "def f():\n    return 200\n"


def test_a_missing_snippet_is_an_error_naming_the_mutant_and_the_file() -> None:
    with pytest.raises(MutationError, match=r"server/create/status-200: the old snippet is not found in pkg/mod\.py"):
        apply_mutation("def f():\n    return 204\n", mutant())


def test_an_ambiguous_snippet_is_an_error_saying_how_often_it_occurs() -> None:
    with pytest.raises(MutationError, match="found 2 times"):
        apply_mutation("return 201\nreturn 201\n", mutant())


def test_whitespace_counts() -> None:
    with pytest.raises(MutationError, match="not found"):
        apply_mutation("return  201\n", mutant())


def test_applying_to_a_tree_writes_a_new_file_and_leaves_the_original_alone(tmp_path: Path) -> None:
    original = tmp_path / "original.py"
    original.write_text("return 201\n")
    copy = tmp_path / "copy" / "pkg" / "mod.py"
    copy.parent.mkdir(parents=True)
    copy.hardlink_to(original)  # a copy made of links must not write through to what it copies
    assert apply_to_tree(tmp_path / "copy", mutant()) == copy
    assert copy.read_text() == "return 200\n"
    assert original.read_text() == "return 201\n"


def test_a_missing_file_is_a_mutation_error(tmp_path: Path) -> None:
    with pytest.raises(MutationError, match=r"cannot read pkg/mod\.py"):
        apply_to_tree(tmp_path, mutant())


def test_a_failed_application_leaves_the_file_unchanged(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("return 201\nreturn 201\n")
    with pytest.raises(MutationError):
        apply_to_tree(tmp_path, mutant())
    assert (tmp_path / "pkg" / "mod.py").read_text() == "return 201\nreturn 201\n"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": "server/create"}, "hierarchical"),
        ({"id": "Server/Create/X"}, "hierarchical"),
        ({"new": "return 201"}, "the same"),
        ({"old": "", "new": "x"}, "empty old snippet"),
        ({"cases": ()}, "no cases"),
        ({"description": "two\nlines"}, "one line"),
    ],
)
def test_a_malformed_mutant_is_refused(change: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "id": "server/create/status-200",
        "file": "pkg/mod.py",
        "old": "return 201",
        "new": "return 200",
        "description": "answers 200",
        "cases": ("envd/a",),
    } | change
    with pytest.raises(ValueError, match=message):
        Mutant(**fields)  # type: ignore[arg-type]


def test_where_the_mutated_code_runs() -> None:
    assert mutant(file="runtime/agent/_http.py").in_sandbox
    assert mutant(file="runtime/interpreter/_app.py").in_sandbox
    assert not mutant(file="runtime/_oci_backend.py").in_sandbox
    assert mutant(file="runtime/_oci_backend.py").in_runtime
    assert not mutant(file="reference_server/_views.py").in_runtime


# --- selectors ---

KNOWN = {"envd/a": ("py-sync", "py-async", "js"), "sandbox/b": ("js",), "wire/c": ("wire",)}


def test_a_bare_selector_runs_py_sync_or_the_only_flavour() -> None:
    assert expand_selectors(["envd/a", "sandbox/b", "wire/c"], KNOWN) == [
        CaseKey("envd/a", "py-sync"),
        CaseKey("sandbox/b", "js"),
        CaseKey("wire/c", "wire"),
    ]


def test_flavours_can_be_named_or_all_and_duplicates_collapse() -> None:
    assert expand_selectors(["envd/a@js,py-async", "envd/a@js"], KNOWN) == [
        CaseKey("envd/a", "js"),
        CaseKey("envd/a", "py-async"),
    ]
    assert len(expand_selectors(["envd/a@*"], KNOWN)) == 3


@pytest.mark.parametrize(
    ("selector", "message"), [("envd/nope", "no case is named"), ("sandbox/b@py-sync", "no flavour 'py-sync'")]
)
def test_a_selector_that_fits_no_case_is_an_error(selector: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand_selectors([selector], KNOWN)


def test_a_case_key_prints_as_case_at_flavour() -> None:
    assert str(CaseKey("envd/a", "js")) == "envd/a@js"


# --- judging ---

A, B, C = CaseKey("envd/a", "py-sync"), CaseKey("envd/a", "js"), CaseKey("wire/c", "wire")


def test_one_failing_baseline_pass_kills_it() -> None:
    result = classify(mutant(), [A, B], [A, B], {A: (True, ""), B: (False, "exit 1")}, complete=True)
    assert result.outcome is MutantOutcome.KILLED
    assert result.killed_by == (B,)
    assert result.details == {"envd/a@js": "exit 1"}
    assert result.ran == (A, B)


def test_a_run_that_failed_on_the_baseline_does_not_count() -> None:
    result = classify(mutant(), [A], [A, C], {A: (True, ""), C: (False, "broken anyway")}, complete=True)
    assert result.outcome is MutantOutcome.SURVIVED
    assert result.ran == (A,)


def test_no_baseline_pass_among_its_runs_is_an_error() -> None:
    result = classify(mutant(), [B], [A], {}, complete=True)
    assert (result.outcome, result.error) == (MutantOutcome.ERROR, ErrorKind.NO_CASES)
    assert "envd/a@py-sync" in result.reason


def test_an_unfinished_run_kills_when_something_failed_else_it_is_an_error() -> None:
    killed = classify(mutant(), [A, B], [A, B], {A: (False, "timeout")}, complete=False)
    assert killed.outcome is MutantOutcome.KILLED
    unfinished = classify(mutant(), [A, B], [A, B], {A: (True, "")}, complete=False)
    assert (unfinished.outcome, unfinished.error) == (MutantOutcome.ERROR, ErrorKind.TIMEOUT)
    assert "envd/a@js" in unfinished.reason
    crashed = classify(
        mutant(), [A], [A], {}, complete=False, incomplete=ErrorKind.CRASH, incomplete_reason="ended early"
    )
    assert (crashed.error, crashed.reason) == (ErrorKind.CRASH, "ended early")


def test_a_complete_run_missing_a_result_is_not_a_survivor() -> None:
    result = classify(mutant(), [A, B], [A, B], {A: (True, "")}, complete=True)
    assert result.outcome is MutantOutcome.ERROR


# --- the score ---


def test_the_score_is_killed_over_killed_plus_survived() -> None:
    results = [
        MutantResult(mutant(), MutantOutcome.KILLED),
        MutantResult(mutant(), MutantOutcome.KILLED),
        MutantResult(mutant(), MutantOutcome.KILLED),
        MutantResult(mutant(), MutantOutcome.SURVIVED),
        MutantResult(mutant(), MutantOutcome.ERROR, ErrorKind.START, "no server"),
    ]
    total = score(results)
    assert total == Score(killed=3, survived=1, errors=1)
    assert total.value == 0.75
    assert total.text() == "75.0% (3 killed / 4 judged; 1 errors)"


def test_with_nothing_judged_there_is_no_score() -> None:
    total = score([MutantResult(mutant(), MutantOutcome.ERROR, ErrorKind.APPLY, "gone")])
    assert total.value is None
    assert total.text().startswith("n/a")
