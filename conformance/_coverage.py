"""The coverage model: a run's results folded onto the contract's operations and fields.

Both tables are per client flavour. A cell takes the worst outcome among the cases covering it
(so "green" means every covering case was green) or ``gap`` when no case covers it:

- operations: one cell per (inventory operation, flavour), whether or not the flavour can send it;
- fields: one cell per (request field, flavour) for the fields (``contract.load_fields``) of the
  operations that flavour's client can send. A field is covered by the cases that declare it
  (``Case.fields``: their check shows the field's *effect*), and is ``unsupported`` when the
  target declares a feature unsupported that names it or its operation (``features.json``). A
  field no case covers is ``listed`` when ``fields.json`` says why (with the answer a client then
  gets), else a ``gap``.

Two numbers summarise a flavour: *field coverage*, the share of the fields of its supported
operations that are green, and the *compatibility score*, the share of everything it can send
(operations and fields, declared-unsupported ones included) that is green. Declaring a feature
unsupported can keep the gate green but lowers the score.

The writers (``_report``) and the gate (``_gate``) read this module; it imports neither.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contract import Field, Operation, flavour_reaches, load_fields, not_sent

from ._model import CaseResult, Outcome

__all__ = [
    "FIELD_NOTES_PATH",
    "FLAVOUR_ORDER",
    "SEVERITY",
    "Cell",
    "CellOutcome",
    "Coverage",
    "FieldCell",
    "FieldNote",
    "FieldNotesError",
    "Score",
    "coverage",
    "first_line",
    "load_field_notes",
    "ordered_flavours",
]

FIELD_NOTES_PATH = Path(__file__).resolve().parent / "fields.json"
_FIELD_NOTES_SCHEMA = 1

# Columns come in this order; flavours not listed here follow, sorted.
FLAVOUR_ORDER = ("py-sync", "py-async", "js")


class CellOutcome(enum.Enum):
    """The outcome of one operation or field for one client flavour: a case outcome, or none."""

    PASS = "pass"  # noqa: S105 - an outcome, not a password
    FIXED = "fixed"
    UNSUPPORTED = "unsupported"
    SKIP = "skip"
    KNOWN_FAIL = "known-fail"
    FAIL = "fail"
    LISTED = "listed"  # fields only: no case covers it, and fields.json says why
    GAP = "gap"

    @property
    def green(self) -> bool:
        return self in (CellOutcome.PASS, CellOutcome.FIXED)


# Worst first. A cell takes the worst outcome among its cases: one failing case makes the operation
# red, and a skipped case means the operation was not fully shown to work, however the others went.
SEVERITY = (Outcome.FAIL, Outcome.KNOWN_FAIL, Outcome.SKIP, Outcome.UNSUPPORTED, Outcome.FIXED, Outcome.PASS)


@dataclass(frozen=True)
class Cell:
    operation: str
    flavour: str
    outcome: CellOutcome
    cases: tuple[str, ...]  # every case (of this flavour) that covers the operation, sorted
    detail: str  # why it is not green: the failing cases and their first lines, or "no case covers it"
    reason: str = ""  # unsupported / known-fail / skip: the declared reasons
    upstream: str = ""  # unsupported: what the upstream service answers instead


@dataclass(frozen=True)
class FieldCell:
    field: str  # "<operation>:<key>"
    flavour: str
    outcome: CellOutcome
    cases: tuple[str, ...]
    detail: str
    reason: str = ""  # listed / unsupported: why
    answer: str = ""  # listed / unsupported: what a client that sends it gets


@dataclass(frozen=True)
class FieldNote:
    """A fields.json entry: why no case shows these fields' effect, and what a client gets."""

    fields: tuple[str, ...]
    reason: str
    answer: str


class FieldNotesError(ValueError):
    """fields.json is malformed or names a field the contract does not have."""


@dataclass(frozen=True)
class Score:
    """One flavour's headline numbers (green / total, and the share as a fraction)."""

    fields_green: int
    fields_total: int  # fields of the operations the flavour sends that are not declared unsupported
    inventory_green: int
    inventory_total: int  # operations and fields the flavour sends, declared-unsupported ones included

    @property
    def field_coverage(self) -> float:
        return self.fields_green / self.fields_total if self.fields_total else 0.0

    @property
    def compatibility(self) -> float:
        return self.inventory_green / self.inventory_total if self.inventory_total else 0.0


@dataclass(frozen=True)
class Coverage:
    """Inventory operations and request fields by client flavours, for one run (one backend)."""

    operations: tuple[str, ...]  # inventory order
    flavours: tuple[str, ...]  # column order
    cells: Mapping[tuple[str, str], Cell]  # (operation, flavour) → cell; every pair is present
    gaps: tuple[str, ...]  # operations that no case covers, for any flavour
    unknown_operations: tuple[str, ...]  # ids that cases name but the inventory does not have (a typo, or drift)
    fields: tuple[str, ...] = ()  # field ids, sorted
    # (field, flavour) → cell, for the fields of the operations each flavour sends
    field_cells: Mapping[tuple[str, str], FieldCell] = field(default_factory=dict)
    unknown_fields: tuple[str, ...] = ()  # ids that cases declare but the contract does not have
    # flavour → the operations its client sends (the score's denominator); empty: all of them
    reached: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def cell(self, operation: str, flavour: str) -> Cell | None:
        return self.cells.get((operation, flavour))

    def field_cell(self, field_id: str, flavour: str) -> FieldCell | None:
        return self.field_cells.get((field_id, flavour))

    def field_gaps(self, flavour: str) -> tuple[str, ...]:
        return tuple(
            f for f in self.fields if (c := self.field_cells.get((f, flavour))) and c.outcome is CellOutcome.GAP
        )

    def score(self, flavour: str) -> Score:
        reached = self.reached.get(flavour)
        operations = [self.cells[op, flavour] for op in self.operations if reached is None or op in reached]
        fields = [c for (_, f), c in self.field_cells.items() if f == flavour]
        unsupported = {c.operation for c in operations if c.outcome is CellOutcome.UNSUPPORTED}
        supported_fields = [c for c in fields if c.field.partition(":")[0] not in unsupported]
        green_fields = sum(c.outcome.green for c in supported_fields)
        return Score(
            fields_green=green_fields,
            fields_total=len(supported_fields),
            inventory_green=sum(c.outcome.green for c in operations) + sum(c.outcome.green for c in fields),
            inventory_total=len(operations) + len(fields),
        )


def coverage(
    results: Iterable[CaseResult],
    inventory: Sequence[Operation],
    *,
    flavours: Iterable[str] = (),
    fields: Sequence[Field] = (),
    field_notes: Sequence[FieldNote] = (),
) -> Coverage:
    """Fold ``results`` onto ``inventory`` (one cell per operation and flavour) and onto ``fields``.

    Columns are the flavours that have results plus ``flavours`` (those a gate or the runner
    expects even when none of their cases ran, so that they show up as gaps rather than vanish).
    """
    results = tuple(results)
    operation_ids = tuple(op.id for op in inventory)
    known = set(operation_ids)
    columns = ordered_flavours({r.client.flavour for r in results} | set(flavours))
    covering: dict[tuple[str, str], list[CaseResult]] = {}
    for result in results:
        for operation in result.operations:
            covering.setdefault((operation, result.client.flavour), []).append(result)
    cells = {
        (operation, flavour): _cell(operation, flavour, covering.get((operation, flavour), []))
        for operation in operation_ids
        for flavour in columns
    }
    covered = {operation for operation, _ in covering}
    by_id = {op.id: op for op in inventory}
    reached = {
        flavour: frozenset(op.id for op in inventory if op.called_by_sdk and flavour_reaches(op, flavour))
        for flavour in columns
    }
    field_cells, unknown_fields = _field_cells(results, fields, field_notes, columns, reached, by_id)
    return Coverage(
        operations=operation_ids,
        flavours=columns,
        cells=cells,
        gaps=tuple(op for op in operation_ids if op not in covered),
        unknown_operations=tuple(sorted(covered - known)),
        fields=tuple(sorted(f.id for f in fields)),
        field_cells=field_cells,
        unknown_fields=unknown_fields,
        reached=reached if fields else {},
    )


def ordered_flavours(flavours: Iterable[str]) -> tuple[str, ...]:
    present = set(flavours)
    return tuple(f for f in FLAVOUR_ORDER if f in present) + tuple(sorted(present - set(FLAVOUR_ORDER)))


def _worst(covering: list[CaseResult]) -> tuple[Outcome, list[CaseResult]]:
    worst = min((r.outcome for r in covering), key=SEVERITY.index)
    return worst, sorted((r for r in covering if r.outcome is worst), key=lambda r: r.case)


def _detail(worst: Outcome, those: list[CaseResult], reason: str, upstream: str) -> str:
    if worst is Outcome.FAIL:
        return "; ".join(f"{r.case}: {first_line(r.detail) or 'failed'}" for r in those)
    if worst is Outcome.KNOWN_FAIL:
        return "; ".join(f"{r.case}: known failure: {r.reason or 'no reason given'}" for r in those)
    if worst is Outcome.SKIP:
        return "; ".join(f"{r.case}: skipped: {r.reason or 'no reason given'}" for r in those)
    if worst is Outcome.UNSUPPORTED:
        return f"declared unsupported: {reason or 'no reason given'}; upstream answers: {upstream or 'not stated'}"
    return ""


def _cell(operation: str, flavour: str, covering: list[CaseResult]) -> Cell:
    if not covering:
        return Cell(operation, flavour, CellOutcome.GAP, (), "no case covers it")
    cases = tuple(sorted({r.case for r in covering}))
    worst, those = _worst(covering)
    reason = _distinct(r.reason for r in those)
    upstream = _distinct(r.upstream for r in those)
    keep = worst in (Outcome.UNSUPPORTED, Outcome.KNOWN_FAIL, Outcome.SKIP)
    return Cell(
        operation,
        flavour,
        CellOutcome(worst.value),
        cases,
        _detail(worst, those, reason, upstream),
        reason=reason if keep else "",
        upstream=upstream if worst is Outcome.UNSUPPORTED else "",
    )


def _field_cells(  # noqa: PLR0917 - one private helper of coverage(), called once
    results: tuple[CaseResult, ...],
    fields: Sequence[Field],
    notes: Sequence[FieldNote],
    columns: tuple[str, ...],
    reached: Mapping[str, frozenset[str]],
    operations: Mapping[str, Operation],
) -> tuple[dict[tuple[str, str], FieldCell], tuple[str, ...]]:
    known = {f.id for f in fields}
    declared: dict[tuple[str, str], list[CaseResult]] = {}
    unsupported_ops: dict[tuple[str, str], list[CaseResult]] = {}
    for result in results:
        for field_id in result.fields:
            declared.setdefault((field_id, result.client.flavour), []).append(result)
        if result.outcome is Outcome.UNSUPPORTED:
            for operation in result.operations:
                unsupported_ops.setdefault((operation, result.client.flavour), []).append(result)
    noted = {field_id: note for note in notes for field_id in note.fields}
    cells: dict[tuple[str, str], FieldCell] = {}
    unsent = {flavour: not_sent(flavour) for flavour in columns}
    for f in sorted(fields, key=lambda f: f.id):
        if f.operation not in operations:
            continue
        for flavour in columns:
            if f.operation not in reached.get(flavour, frozenset()) or f.id in unsent[flavour]:
                continue
            covering = declared.get((f.id, flavour), []) + unsupported_ops.get((f.operation, flavour), [])
            cells[f.id, flavour] = _field_cell(f.id, flavour, covering, noted.get(f.id))
    unknown = sorted({field_id for field_id, _ in declared} - known)
    return cells, tuple(unknown)


def _field_cell(field_id: str, flavour: str, covering: list[CaseResult], note: FieldNote | None) -> FieldCell:
    if not covering:
        if note is not None:
            return FieldCell(
                field_id, flavour, CellOutcome.LISTED, (), f"not covered: {note.reason}", note.reason, note.answer
            )
        return FieldCell(
            field_id, flavour, CellOutcome.GAP, (), "no case shows its effect, and fields.json does not say why"
        )
    cases = tuple(sorted({r.case for r in covering}))
    worst, those = _worst(covering)
    reason = _distinct(r.reason for r in those) if worst is Outcome.UNSUPPORTED else ""
    upstream = _distinct(r.upstream for r in those) if worst is Outcome.UNSUPPORTED else ""
    return FieldCell(
        field_id, flavour, CellOutcome(worst.value), cases, _detail(worst, those, reason, upstream), reason, upstream
    )


def _distinct(texts: Iterable[str]) -> str:
    return "; ".join(dict.fromkeys(t for t in texts if t))


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


def load_field_notes(path: Path = FIELD_NOTES_PATH, *, fields: Iterable[Field] | None = None) -> tuple[FieldNote, ...]:
    """Read fields.json; every field it names must be in ``fields`` (default: the contract's)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FieldNotesError(f"{path}: {exc}") from exc
    if (
        not isinstance(data, dict)
        or data.get("schema") != _FIELD_NOTES_SCHEMA
        or not isinstance(data.get("not_covered"), list)
    ):
        raise FieldNotesError(f"{path}: expected an object with schema {_FIELD_NOTES_SCHEMA} and a not_covered list")
    known = {f.id for f in (fields if fields is not None else load_fields())}
    notes: list[FieldNote] = []
    seen: set[str] = set()
    for index, entry in enumerate(data["not_covered"]):
        where = f"{path}: entry {index}"
        if not isinstance(entry, dict) or set(entry) != {"fields", "reason", "answer"}:
            raise FieldNotesError(f"{where}: expected exactly the keys fields, reason, answer")
        ids, reason, answer = entry["fields"], entry["reason"], entry["answer"]
        if not (isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids)):
            raise FieldNotesError(f"{where}: fields must be a non-empty list of field ids")
        if not (isinstance(reason, str) and reason and isinstance(answer, str) and answer):
            raise FieldNotesError(f"{where}: reason and answer must be non-empty texts")
        if unknown := sorted(set(ids) - known):
            raise FieldNotesError(f"{where}: not fields of the contract: {', '.join(unknown)}")
        if twice := sorted(set(ids) & seen):
            raise FieldNotesError(f"{where}: listed twice: {', '.join(twice)}")
        seen.update(ids)
        notes.append(FieldNote(tuple(ids), reason, answer))
    return tuple(notes)
