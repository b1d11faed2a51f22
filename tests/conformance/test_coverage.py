"""The coverage model's field table and scores (``conformance._coverage``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance._coverage import CellOutcome, FieldNote, FieldNotesError, coverage, load_field_notes
from conformance._model import CaseResult, ClientInfo, Outcome
from contract import Field, Operation

PY = ClientInfo("py-sync", "e2b", "2.32.0")
JS = ClientInfo("js", "e2b", "2.33.0")


def _operation(
    op_id: str, *, python: tuple[str, ...] = ("e2b.sandbox_sync.main.Sandbox.x",), js: bool = True
) -> Operation:
    return Operation(
        op_id,
        "control-plane",
        "http",
        "unary",
        "/x",
        "GET",
        None,
        python,
        ("Sandbox.x",) if js else (),
        True,
        "derived",
    )


INVENTORY = [_operation("op.a"), _operation("op.b"), _operation("op.py_only", js=False)]
FIELDS = [Field("op.a", "body.x"), Field("op.a", "body.y"), Field("op.b", "query.z"), Field("op.py_only", "body.w")]


def _result(
    case: str, client: ClientInfo, outcome: Outcome, operations: tuple[str, ...], fields: tuple[str, ...]
) -> CaseResult:
    return CaseResult(case, client, outcome, 0.1, operations, fields=fields)


def test_a_field_takes_the_worst_outcome_of_the_cases_that_declare_it() -> None:
    results = [
        _result("c/one", PY, Outcome.PASS, ("op.a",), ("op.a:body.x", "op.a:body.y")),
        _result("c/two", PY, Outcome.FAIL, ("op.a",), ("op.a:body.y",)),
        _result("c/one", JS, Outcome.PASS, ("op.a",), ("op.a:body.x",)),
    ]
    cov = coverage(results, INVENTORY, fields=FIELDS)
    assert cov.field_cell("op.a:body.x", "py-sync").outcome is CellOutcome.PASS  # type: ignore[union-attr]
    cell = cov.field_cell("op.a:body.y", "py-sync")
    assert cell is not None
    assert cell.outcome is CellOutcome.FAIL
    assert cell.cases == ("c/one", "c/two")
    assert cov.field_cell("op.a:body.y", "js").outcome is CellOutcome.GAP  # type: ignore[union-attr]


def test_a_field_a_flavour_never_sends_has_no_cell_and_does_not_count() -> None:
    cov = coverage([_result("c/one", JS, Outcome.PASS, ("op.a",), ())], INVENTORY, fields=FIELDS, flavours=("py-sync",))
    assert cov.field_cell("op.py_only:body.w", "js") is None
    assert cov.field_cell("op.py_only:body.w", "py-sync") is not None
    assert cov.score("js").fields_total == 3
    assert cov.score("py-sync").fields_total == 4


def test_listed_fields_say_why_and_stay_not_green() -> None:
    notes = [FieldNote(("op.b:query.z",), "no case yet", "the server filters")]
    cov = coverage([], INVENTORY, fields=FIELDS, field_notes=notes, flavours=("py-sync",))
    cell = cov.field_cell("op.b:query.z", "py-sync")
    assert cell is not None
    assert cell.outcome is CellOutcome.LISTED
    assert (cell.reason, cell.answer) == ("no case yet", "the server filters")
    assert not cell.outcome.green
    assert cov.field_gaps("py-sync") == ("op.a:body.x", "op.a:body.y", "op.py_only:body.w")


def test_declared_unsupported_features_mark_their_fields_and_lower_only_the_score() -> None:
    results = [
        _result("c/one", PY, Outcome.PASS, ("op.a",), ("op.a:body.x", "op.a:body.y")),
        _result("unsupported/b", PY, Outcome.UNSUPPORTED, ("op.b",), ()),
        _result("unsupported/w", PY, Outcome.UNSUPPORTED, (), ("op.py_only:body.w",)),
    ]
    cov = coverage(results, INVENTORY, fields=FIELDS)
    assert cov.field_cell("op.b:query.z", "py-sync").outcome is CellOutcome.UNSUPPORTED  # type: ignore[union-attr]
    assert cov.field_cell("op.py_only:body.w", "py-sync").outcome is CellOutcome.UNSUPPORTED  # type: ignore[union-attr]
    score = cov.score("py-sync")
    # Field coverage leaves out the fields of an unsupported operation (op.b), not a field-level one.
    assert (score.fields_green, score.fields_total) == (2, 3)
    # The score counts everything: 3 operations (op.a green) and 4 fields (2 green).
    assert (score.inventory_green, score.inventory_total) == (3, 7)
    assert score.compatibility == pytest.approx(3 / 7)


def test_fields_cases_name_but_the_contract_lacks_are_reported() -> None:
    cov = coverage([_result("c/one", PY, Outcome.PASS, ("op.a",), ("op.a:body.typo",))], INVENTORY, fields=FIELDS)
    assert cov.unknown_fields == ("op.a:body.typo",)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"fields": ["op.a:body.nope"], "reason": "r", "answer": "a"}, "not fields of the contract"),
        ({"fields": [], "reason": "r", "answer": "a"}, "non-empty list"),
        ({"fields": ["op.a:body.x"], "reason": "", "answer": "a"}, "non-empty texts"),
        ({"fields": ["op.a:body.x"], "reason": "r"}, "exactly the keys"),
    ],
)
def test_field_notes_refuse_what_they_cannot_mean(tmp_path: Path, entry: dict[str, object], message: str) -> None:
    path = tmp_path / "fields.json"
    path.write_text(json.dumps({"schema": 1, "not_covered": [entry]}))
    with pytest.raises(FieldNotesError, match=message):
        load_field_notes(path, fields=FIELDS)


def test_field_notes_refuse_a_field_listed_twice(tmp_path: Path) -> None:
    path = tmp_path / "fields.json"
    entry = {"fields": ["op.a:body.x"], "reason": "r", "answer": "a"}
    path.write_text(json.dumps({"schema": 1, "not_covered": [entry, entry]}))
    with pytest.raises(FieldNotesError, match="listed twice"):
        load_field_notes(path, fields=FIELDS)


def test_the_committed_field_notes_load() -> None:
    assert load_field_notes()


def test_a_field_a_flavours_client_never_sends_has_no_cell_for_it() -> None:
    contexts = _operation("interpreter.contexts.create")
    token = Field("interpreter.contexts.create", "header.X-Access-Token")  # sent by Python, not by JS
    cov = coverage([], [contexts], fields=[token], flavours=("py-sync", "js"))
    assert cov.field_cell(token.id, "py-sync") is not None
    assert cov.field_cell(token.id, "js") is None
    assert cov.score("js").fields_total == 0
