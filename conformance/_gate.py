"""The release gate and the known-failures list.

``gate.json`` (beside this module) names the operations that must be green for which client
flavours, in groups with a short "why". ``evaluate`` checks a run's coverage against it: a required
(operation, flavour) that is not green (failed, known failure, declared unsupported, skipped, or a
gap: no case covers it, or no case of that flavour ran) fails the gate and is named.

``known-failures.json`` lists cases that fail today on purpose (``{case, flavour, reason}``, and
optionally ``backend``: the entry holds only for runs on that isolation backend).
``apply_known_failures`` turns a listed case's fail into known-fail and its pass into fixed, so a
known failure neither hides among new failures nor lingers after it was fixed, and reports listed
cases that no longer exist (stale entries). A known failure is still not green: listing a case does
not get a required operation through the gate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import Operation, load_inventory

from ._coverage import CellOutcome, Coverage
from ._model import CaseResult, Outcome

__all__ = [
    "GATE_POLICY_PATH",
    "KNOWN_FAILURES_PATH",
    "GateFailure",
    "GateGroup",
    "GatePolicy",
    "GateResult",
    "KnownFailure",
    "KnownFailuresApplied",
    "PolicyError",
    "apply_known_failures",
    "evaluate",
    "for_backend",
    "load_known_failures",
    "load_policy",
]

GATE_POLICY_PATH = Path(__file__).resolve().parent / "gate.json"
KNOWN_FAILURES_PATH = Path(__file__).resolve().parent / "known-failures.json"

_POLICY_SCHEMA = 1
_KNOWN_FAILURES_SCHEMA = 1


class PolicyError(ValueError):
    """gate.json or known-failures.json is malformed or names something that does not exist."""


@dataclass(frozen=True)
class GateGroup:
    name: str
    why: str
    flavours: tuple[str, ...]
    operations: tuple[str, ...]


@dataclass(frozen=True)
class GatePolicy:
    groups: tuple[GateGroup, ...]
    sha256: str  # of the policy file's bytes: the report records which policy gave the verdict

    @property
    def required(self) -> tuple[tuple[str, str], ...]:
        """Every required (operation, flavour), sorted, each once."""
        return tuple(sorted({(op, flavour) for g in self.groups for op in g.operations for flavour in g.flavours}))


@dataclass(frozen=True)
class GateFailure:
    operation: str
    flavour: str
    outcome: CellOutcome
    detail: str


@dataclass(frozen=True)
class GateResult:
    passed: bool
    failures: tuple[GateFailure, ...]  # sorted by operation, then flavour
    required: tuple[tuple[str, str], ...]  # what was checked: (operation, flavour)
    policy_sha256: str


def load_policy(path: Path = GATE_POLICY_PATH, *, inventory: Sequence[Operation] | None = None) -> GatePolicy:
    """Read and check a gate policy; every operation id must be in ``inventory`` (default: the contract's)."""
    raw = _read(path)
    data = _parse(raw, path)
    if not isinstance(data, dict) or data.get("schema") != _POLICY_SCHEMA or not isinstance(data.get("groups"), list):
        raise PolicyError(f"{path}: expected an object with schema {_POLICY_SCHEMA} and a list of groups")
    known = {op.id for op in (inventory if inventory is not None else load_inventory())}
    groups = []
    for index, group in enumerate(data["groups"]):
        where = f"{path}: group {index}"
        if not isinstance(group, dict) or set(group) != {"name", "why", "flavours", "operations"}:
            raise PolicyError(f"{where}: expected exactly the keys name, why, flavours, operations")
        name, why = group["name"], group["why"]
        flavours, operations = _strings(group["flavours"], where), _strings(group["operations"], where)
        if not (isinstance(name, str) and name and isinstance(why, str) and why and flavours and operations):
            raise PolicyError(f"{where}: name, why, flavours and operations must all be non-empty")
        if unknown := sorted(set(operations) - known):
            raise PolicyError(f"{where} ({name}): not in the contract inventory: {', '.join(unknown)}")
        groups.append(GateGroup(name, why, flavours, operations))
    return GatePolicy(tuple(groups), hashlib.sha256(raw).hexdigest())


def evaluate(coverage: Coverage, policy: GatePolicy) -> GateResult:
    """Pass when every required operation is green for every flavour the policy names."""
    failures = []
    for operation, flavour in policy.required:
        cell = coverage.cell(operation, flavour)
        if cell is None:
            # The coverage has no such row or column: nothing of this flavour ran, or another inventory.
            missing = "operation" if operation not in coverage.operations else "client flavour"
            failures.append(GateFailure(operation, flavour, CellOutcome.GAP, f"no result for this {missing}"))
        elif not cell.outcome.green:
            failures.append(GateFailure(operation, flavour, cell.outcome, cell.detail))
    return GateResult(not failures, tuple(failures), policy.required, policy.sha256)


# --- known failures ---


@dataclass(frozen=True)
class KnownFailure:
    case: str
    flavour: str
    reason: str
    backend: str | None = None  # only runs on this backend; None: every backend


@dataclass(frozen=True)
class KnownFailuresApplied:
    results: tuple[CaseResult, ...]  # in the given order, listed cases rewritten
    stale: tuple[KnownFailure, ...]  # listed, but the case is gone (for that flavour, when the flavour ran)


def load_known_failures(path: Path = KNOWN_FAILURES_PATH) -> tuple[KnownFailure, ...]:
    raw = _read(path)
    data = _parse(raw, path)
    if (
        not isinstance(data, dict)
        or data.get("schema") != _KNOWN_FAILURES_SCHEMA
        or not isinstance(data.get("known_failures"), list)
    ):
        raise PolicyError(f"{path}: expected an object with schema {_KNOWN_FAILURES_SCHEMA} and a known_failures list")
    entries = []
    for index, entry in enumerate(data["known_failures"]):
        if (
            not isinstance(entry, dict)
            or not {"case", "flavour", "reason"} <= set(entry) <= {"case", "flavour", "reason", "backend"}
            or not all(isinstance(value, str) and value.strip() for value in entry.values())
        ):
            raise PolicyError(
                f"{path}: entry {index}: expected non-empty strings case, flavour, reason and "
                "optionally backend, nothing else"
            )
        entries.append(KnownFailure(entry["case"], entry["flavour"], entry["reason"], entry.get("backend")))
    seen: set[tuple[str, str, str | None]] = set()
    for entry in entries:
        if (entry.case, entry.flavour, entry.backend) in seen:
            where = "" if entry.backend is None else f" on {entry.backend}"
            raise PolicyError(f"{path}: {entry.case} ({entry.flavour}){where} is listed twice")
        seen.add((entry.case, entry.flavour, entry.backend))
    return tuple(entries)


def for_backend(known: Iterable[KnownFailure], backend: str) -> tuple[KnownFailure, ...]:
    """The entries that hold for a run on ``backend``: its own before the ones for every backend."""
    known = tuple(known)
    own = [entry for entry in known if entry.backend == backend]
    taken = {(entry.case, entry.flavour) for entry in own}
    return (*own, *(e for e in known if e.backend is None and (e.case, e.flavour) not in taken))


def apply_known_failures(results: Iterable[CaseResult], known: Iterable[KnownFailure]) -> KnownFailuresApplied:
    """fail → known-fail and pass → fixed for listed (case, flavour); other outcomes are left alone.

    The listed reason replaces the result's ``reason``; the failure ``detail`` is kept, so a known
    failure that now fails differently can still be noticed in the report.
    """
    listed = {(entry.case, entry.flavour): entry for entry in known}
    results = tuple(results)
    rewritten = []
    for result in results:
        entry = listed.get((result.case, result.client.flavour))
        if entry is not None and result.outcome is Outcome.FAIL:
            rewritten.append(dataclasses.replace(result, outcome=Outcome.KNOWN_FAIL, reason=entry.reason))
        elif entry is not None and result.outcome is Outcome.PASS:
            rewritten.append(dataclasses.replace(result, outcome=Outcome.FIXED, reason=entry.reason))
        else:
            rewritten.append(result)
    cases = {result.case for result in results}
    ran: dict[str, set[str]] = {}
    for result in results:
        ran.setdefault(result.client.flavour, set()).add(result.case)
    # A flavour that did not run at all (a partial run) says nothing about its entries, unless
    # the case is gone for every flavour.
    stale = tuple(
        entry
        for entry in listed.values()
        if entry.case not in cases or (entry.flavour in ran and entry.case not in ran[entry.flavour])
    )
    return KnownFailuresApplied(tuple(rewritten), stale)


# --- shared ---


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"cannot read {path}: {exc.strerror}") from exc


def _parse(raw: bytes, path: Path) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{path}: not JSON: {exc}") from exc


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise PolicyError(f"{where}: expected a list of non-empty strings")
    if len(set(value)) != len(value):
        raise PolicyError(f"{where}: an entry is listed twice")
    return tuple(value)
