"""What a conformance run produces: one result per (case, client flavour), and the run around them.

These are plain data, shared by the runner (which makes them), the report writers (JSON, JUnit,
Markdown), the signer and the gate. The JSON report's schema is these fields, versioned by
``REPORT_SCHEMA_VERSION`` and documented in docs/REPORT.md.

Outcomes::

    pass         the case ran and every check held
    fail         it ran and a check failed, or it crashed (``detail`` says which request differed)
    unsupported  the target declares the feature unsupported (``reason``; ``upstream`` is the answer
                 the upstream service gives in that case); the case still runs and must get exactly
                 that answer, else it is a fail
    known-fail   it failed and is listed in known-failures.json (``reason`` from there)
    fixed        it is listed as a known failure but passed: the report says so, so the list shrinks
    skip         it could not run at all here (``reason``), e.g. a client flavour that is not installed
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["REPORT_SCHEMA_VERSION", "CaseResult", "ClientInfo", "MutationScore", "Outcome", "RunInfo", "Target"]

REPORT_SCHEMA_VERSION = "1.3"


class Outcome(enum.Enum):
    PASS = "pass"  # noqa: S105 - an outcome, not a password
    FAIL = "fail"
    UNSUPPORTED = "unsupported"
    KNOWN_FAIL = "known-fail"
    FIXED = "fixed"
    SKIP = "skip"

    @property
    def green(self) -> bool:
        """Whether the gate counts it as working (an honest "unsupported" with the upstream answer is not)."""
        return self in (Outcome.PASS, Outcome.FIXED)


@dataclass(frozen=True)
class ClientInfo:
    flavour: str  # "py-sync", "py-async", "js"
    package: str  # "e2b" (PyPI) or "e2b" (npm)
    version: str  # "2.32.0"


@dataclass(frozen=True)
class CaseResult:
    case: str  # hierarchical name: "sandbox/lifecycle/pause-twice"
    client: ClientInfo
    outcome: Outcome
    duration_s: float
    operations: tuple[str, ...]  # inventory operation ids the case exercises
    detail: str = ""  # failure details: the request that differed, the check that failed
    reason: str = ""  # for unsupported / known-fail / skip
    upstream: str = ""  # for unsupported: what the upstream service answers
    traces: tuple[str, ...] = ()  # "client:case:stage" lines the scenario printed
    # request field ids ("<operation>:<key>", contract.load_fields) whose effect the case's check
    # shows, or that a declared-unsupported feature names
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """The endpoint under test."""

    server: str  # a name for it: "e2b-compat 0.1.0" or what the operator says
    domain: str  # E2B_DOMAIN as the clients got it
    # The templates the cases' sandboxes were created from, comma-separated in first-use order:
    # "base", or "base,code-interpreter-v1" when the interpreter cases ran too.
    template: str
    backend: str  # isolation backend: "crun", or "unknown" for a foreign endpoint
    # What the backend provides (runtime.backend.Feature values, sorted) as the backends table
    # says; None: unknown (a foreign endpoint).
    features: tuple[str, ...] | None = None


@dataclass(frozen=True)
class MutationScore:
    """A mutants session's outcome (``nox -s mutants``), carried into a report's appendix."""

    source: str  # the mutants.json it was read from
    sha256: str  # of that file
    started_at: str
    tree: str  # the checkout the mutants were planted in, as the session named it
    killed: int
    survived: int
    errors: int
    survivors: tuple[tuple[str, str], ...] = ()  # (mutant id, the behaviour it changes)

    @property
    def value(self) -> float:
        judged = self.killed + self.survived
        return self.killed / judged if judged else 0.0


@dataclass(frozen=True)
class RunInfo:
    target: Target
    contract_manifest_sha256: str  # digest of contract/manifest.json: which contract was tested
    started_at: str  # RFC 3339 UTC
    finished_at: str
    harness_version: str
    results: tuple[CaseResult, ...] = field(default=())
    mutation: MutationScore | None = None  # the report's appendix, when a mutants session is given
