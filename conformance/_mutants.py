"""Mutation testing of the harness itself: what a mutant is, how it is applied, how it is judged.

A mutant is one behavioural change of one file (``Mutant``; the curated list is
``_mutant_catalog.MUTANTS``). It is applied to a copy of the tree, never to the checkout, by
replacing an ``old`` snippet that must occur exactly once: a snippet that is missing or ambiguous
is a ``MutationError``, so a list that no longer fits the code fails loudly instead of quietly
testing nothing.

A mutant is **killed** when at least one case that passed on the unmutated tree fails with the
mutant in place, **survived** when every such case still passes, and an **error** when it could
not be judged (``ErrorKind`` says why). The score is killed / (killed + survived); errors are
left out of it and listed. This module is pure: the runner (``_mutant_run``) does the work.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CaseKey",
    "ErrorKind",
    "Mutant",
    "MutantOutcome",
    "MutantResult",
    "MutationError",
    "Score",
    "apply_mutation",
    "apply_to_tree",
    "classify",
    "expand_selectors",
    "score",
]

WIRE_FLAVOUR = "wire"  # the client column of wire cases (``_wire.CLIENT``)
DEFAULT_FLAVOUR = "py-sync"  # a selector without ``@`` runs the case with this flavour, if it has it
_ID = re.compile(r"[a-z0-9-]+(/[a-z0-9-]+){2,}")


class MutationError(ValueError):
    """The mutant cannot be applied: its file or its ``old`` snippet is not there exactly once."""


@dataclass(frozen=True)
class Mutant:
    id: str  # "<part>/<area>/<what>", e.g. "server/list/reversed-order"
    file: str  # posix path relative to the repository root
    old: str  # occurs exactly once in the file
    new: str
    description: str  # the behaviour that changes, in one line
    cases: tuple[str, ...]  # case selectors: "name", "name@flavour,flavour" or "name@*"

    def __post_init__(self) -> None:
        if not _ID.fullmatch(self.id):
            raise ValueError(f"mutant id {self.id!r} is not hierarchical (<part>/<area>/<what>, a-z 0-9 -)")
        if self.old == self.new:
            raise ValueError(f"{self.id}: old and new are the same")
        if not self.old:
            raise ValueError(f"{self.id}: an empty old snippet would match everywhere")
        if not self.cases:
            raise ValueError(f"{self.id}: no cases to run against it")
        if "\n" in self.description or not self.description:
            raise ValueError(f"{self.id}: the description is one line")

    @property
    def in_sandbox(self) -> bool:
        """Whether the mutated file runs inside sandboxes (the agent or the interpreter)."""
        return self.file.startswith(("runtime/agent/", "runtime/interpreter/"))

    @property
    def in_runtime(self) -> bool:
        """Whether the mutated file is part of ``runtime`` (and so of the template's key)."""
        return self.file.startswith("runtime/")


def apply_mutation(text: str, mutant: Mutant) -> str:
    """``text`` with the mutant's ``old`` snippet replaced; ``MutationError`` unless it occurs exactly once."""
    found = text.count(mutant.old)
    if found != 1:
        how = "not found" if found == 0 else f"found {found} times (ambiguous)"
        raise MutationError(f"{mutant.id}: the old snippet is {how} in {mutant.file}: {mutant.old[:120]!r}")
    return text.replace(mutant.old, mutant.new, 1)


def apply_to_tree(root: Path, mutant: Mutant) -> Path:
    """Mutate ``root/<file>`` in place (``root`` is a copy of the tree); returns the file."""
    path = root / mutant.file
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MutationError(f"{mutant.id}: cannot read {mutant.file}: {exc.strerror or exc}") from None
    mutated = apply_mutation(text, mutant)
    path.unlink()  # a new file, in case the copy shares the inode with the original (hard links)
    path.write_text(mutated, encoding="utf-8")
    return path


@dataclass(frozen=True, order=True)
class CaseKey:
    """One run of one case: a scenario case with a client flavour, or a wire case (flavour ``wire``)."""

    case: str
    flavour: str

    def __str__(self) -> str:
        return f"{self.case}@{self.flavour}"


def expand_selectors(selectors: Iterable[str], known: Mapping[str, tuple[str, ...]]) -> list[CaseKey]:
    """The runs ``selectors`` name; ``known`` maps every case name to its flavours (wire: ``("wire",)``).

    ``ValueError`` names a selector that matches no case or asks for a flavour the case lacks.
    """
    keys: list[CaseKey] = []
    for selector in selectors:
        name, _, wanted = selector.partition("@")
        flavours = known.get(name)
        if flavours is None:
            raise ValueError(f"case selector {selector!r}: no case is named {name!r}")
        if wanted == "*":
            chosen = flavours
        elif wanted:
            chosen = tuple(wanted.split(","))
            missing = [flavour for flavour in chosen if flavour not in flavours]
            if missing:
                raise ValueError(f"case selector {selector!r}: {name} has no flavour {missing[0]!r} ({flavours})")
        else:
            chosen = (DEFAULT_FLAVOUR,) if DEFAULT_FLAVOUR in flavours else flavours[:1]
        keys += [CaseKey(name, flavour) for flavour in chosen]
    return sorted(dict.fromkeys(keys))


class MutantOutcome(enum.Enum):
    KILLED = "killed"
    SURVIVED = "survived"
    ERROR = "error"


class ErrorKind(enum.Enum):
    """Why a mutant could not be judged."""

    APPLY = "apply"  # the mutation did not apply (snippet missing or ambiguous, file absent)
    SELECT = "select"  # a case selector names no case (the catalog no longer fits the cases)
    START = "start"  # the server built from the mutated copy did not start
    NOT_IN_SANDBOX = "not-in-sandbox"  # the template the server made does not hold the mutated file
    TIMEOUT = "timeout"  # the mutant's time limit passed before any case failed
    CRASH = "crash"  # the runner for this mutant ended without reporting
    NO_CASES = "no-cases"  # none of its cases passed on the unmutated tree: nothing can kill it
    NOT_RUN = "not-run"  # the session's time budget (or the shared lock) ran out first


@dataclass(frozen=True)
class MutantResult:
    mutant: Mutant
    outcome: MutantOutcome
    error: ErrorKind | None = None
    reason: str = ""  # for errors: what went wrong
    killed_by: tuple[CaseKey, ...] = ()
    ran: tuple[CaseKey, ...] = ()  # the baseline-passing runs that were made against it
    details: Mapping[str, str] = field(default_factory=dict)  # str(CaseKey) → why it failed
    duration_s: float = 0.0  # its own time: copy, server, cases (not the wait for the shared lock)
    verified: str = ""  # how the mutation was seen to be in what ran (server copy, template file)
    waited_s: float = 0.0  # for the shared heavy-test lock, while other runs held it


def classify(
    mutant: Mutant,
    baseline_passed: Iterable[CaseKey],
    selected: Sequence[CaseKey],
    observed: Mapping[CaseKey, tuple[bool, str]],
    *,
    complete: bool,
    duration_s: float = 0.0,
    verified: str = "",
    incomplete: ErrorKind = ErrorKind.TIMEOUT,
    incomplete_reason: str = "",
) -> MutantResult:
    """Judge one mutant from what its runs showed (``observed``: key → (passed, detail)).

    Only runs that passed on the baseline count. One failure among them kills the mutant, even
    when the run did not finish (``complete`` False); an unfinished run without a failure is an
    error of kind ``incomplete``.
    """
    passed_before = set(baseline_passed)
    counting = [key for key in selected if key in passed_before]
    if not counting:
        return MutantResult(
            mutant,
            MutantOutcome.ERROR,
            ErrorKind.NO_CASES,
            "none of its cases passed on the unmutated tree: " + ", ".join(map(str, selected)),
            duration_s=duration_s,
        )
    ran = tuple(key for key in counting if key in observed)
    killers = tuple(key for key in ran if not observed[key][0])
    details = {str(key): observed[key][1] for key in killers}
    if killers:
        return MutantResult(
            mutant,
            MutantOutcome.KILLED,
            killed_by=killers,
            ran=ran,
            details=details,
            duration_s=duration_s,
            verified=verified,
        )
    if not complete or len(ran) < len(counting):
        missing = ", ".join(str(key) for key in counting if key not in observed)
        reason = incomplete_reason or f"no case failed, but these did not finish: {missing}"
        return MutantResult(mutant, MutantOutcome.ERROR, incomplete, reason, ran=ran, duration_s=duration_s)
    return MutantResult(mutant, MutantOutcome.SURVIVED, ran=ran, duration_s=duration_s, verified=verified)


@dataclass(frozen=True)
class Score:
    killed: int
    survived: int
    errors: int

    @property
    def value(self) -> float | None:
        """killed / (killed + survived); None when no mutant was judged."""
        judged = self.killed + self.survived
        return None if judged == 0 else self.killed / judged

    def text(self) -> str:
        value = self.value
        shown = "n/a" if value is None else f"{value:.1%}"
        return f"{shown} ({self.killed} killed / {self.killed + self.survived} judged; {self.errors} errors)"


def score(results: Iterable[MutantResult]) -> Score:
    outcomes = [result.outcome for result in results]
    return Score(
        killed=outcomes.count(MutantOutcome.KILLED),
        survived=outcomes.count(MutantOutcome.SURVIVED),
        errors=outcomes.count(MutantOutcome.ERROR),
    )
