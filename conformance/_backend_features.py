"""Which cases and operations need which backend feature (``backend-features.json``), and what follows.

A backend declares what it provides (``runtime.backend.Feature``; its ``FEATURES`` in the
``runtime.backends`` table). What it lacks, it refuses the way upstream refuses an operation a
deployment does not offer. This module holds the other half, as data: for each feature, the case
patterns and operation ids that need it, why, and the answer a refusal gives.

- In a run on a managed server, ``apply_missing_features`` records a case that needs a missing
  feature and failed *with the declared answer* (its status in the failure detail) as unsupported,
  with the reason and the upstream answer; any other failure of it stays a failure.
- The matrix (``_matrix``) explains a difference between backends by ``explain_missing``: the
  features the report's backend lacks that the case or operation needs.

A foreign endpoint's features are unknown (``None``): nothing is rewritten and nothing is
explained by a feature for it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._endpoint import backend_features, runtime_features
from ._model import CaseResult, Outcome

__all__ = [
    "BACKEND_FEATURES_PATH",
    "FeatureNeed",
    "FeaturesFileError",
    "apply_missing_features",
    "explain_missing",
    "load_feature_needs",
    "managed_features",
    "provided_of",
]

BACKEND_FEATURES_PATH = Path(__file__).resolve().parent / "backend-features.json"
_SCHEMA = 1


class FeaturesFileError(ValueError):
    """backend-features.json is malformed or names a feature the runtime does not have."""


@dataclass(frozen=True)
class FeatureNeed:
    feature: str  # a runtime.backend.Feature value: "pause-memory"
    cases: tuple[str, ...]  # shell-style patterns over case names
    operations: tuple[str, ...]  # inventory operation ids
    reason: str
    upstream_status: int
    upstream_meaning: str

    def covers_case(self, case: str) -> bool:
        return any(fnmatch.fnmatchcase(case, pattern) for pattern in self.cases)

    @property
    def upstream(self) -> str:
        return f"{self.upstream_status}: {self.upstream_meaning}"


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise FeaturesFileError(f"{where}: expected a list of non-empty strings")
    return tuple(value)


@functools.cache
def load_feature_needs(path: Path = BACKEND_FEATURES_PATH) -> tuple[FeatureNeed, ...]:
    """Every feature's needs; every ``runtime.backend.Feature`` must have an entry, and nothing else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FeaturesFileError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != _SCHEMA or not isinstance(data.get("features"), dict):
        raise FeaturesFileError(f"{path}: expected an object with schema {_SCHEMA} and a features object")
    known = set(runtime_features())
    if set(data["features"]) != known:
        missing, extra = sorted(known - set(data["features"])), sorted(set(data["features"]) - known)
        raise FeaturesFileError(f"{path}: features must be exactly the runtime's (missing {missing}, unknown {extra})")
    needs = []
    for name, entry in sorted(data["features"].items()):
        where = f"{path}: {name}"
        upstream = entry.get("upstream") if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or set(entry) != {"cases", "operations", "reason", "upstream"}
            or not isinstance(entry["reason"], str)
            or not entry["reason"].strip()
            or not isinstance(upstream, dict)
            or not isinstance(upstream.get("status"), int)
            or not isinstance(upstream.get("meaning"), str)
        ):
            raise FeaturesFileError(f"{where}: expected cases, operations, reason and upstream {{status, meaning}}")
        needs.append(
            FeatureNeed(
                name,
                _strings(entry["cases"], f"{where}.cases"),
                _strings(entry["operations"], f"{where}.operations"),
                entry["reason"],
                upstream["status"],
                upstream["meaning"],
            )
        )
    return tuple(needs)


def managed_features(backend: str) -> tuple[str, ...]:
    """What the table says a backend provides, sorted: the feature list a report of our server shows."""
    return backend_features(backend)


def _lacking(provided: Iterable[str] | None, needs: Sequence[FeatureNeed]) -> list[FeatureNeed]:
    if provided is None:  # unknown: a foreign endpoint
        return []
    have = set(provided)
    return [need for need in needs if need.feature not in have]


def apply_missing_features(
    results: Iterable[CaseResult],
    backend: str,
    provided: Iterable[str] | None,
    needs: Sequence[FeatureNeed] | None = None,
) -> list[CaseResult]:
    """A failed case that needs a feature ``backend`` lacks, answered with the declared status: unsupported."""
    lacking = _lacking(provided, load_feature_needs() if needs is None else needs)
    rewritten = []
    for result in results:
        need = next((n for n in lacking if n.covers_case(result.case)), None)
        declared = need is not None and re.search(rf"\b{need.upstream_status}\b", result.detail) is not None
        if need is not None and result.outcome is Outcome.FAIL and declared:
            reason = f"backend {backend} lacks {need.feature}: {need.reason}"
            rewritten.append(
                dataclasses.replace(result, outcome=Outcome.UNSUPPORTED, reason=reason, upstream=need.upstream)
            )
        else:
            rewritten.append(result)
    return rewritten


def explain_missing(
    provided: Iterable[str] | None,
    *,
    case: str | None = None,
    operation: str | None = None,
    needs: Sequence[FeatureNeed] | None = None,
) -> list[FeatureNeed]:
    """The lacking features that the case (or the operation) needs; empty when none explains it."""
    found = []
    for need in _lacking(provided, load_feature_needs() if needs is None else needs):
        if (case is not None and need.covers_case(case)) or (operation is not None and operation in need.operations):
            found.append(need)
    return found


def provided_of(target: Mapping[str, object]) -> tuple[str, ...] | None:
    """A report's ``target.features`` (None: unknown)."""
    features = target.get("features")
    return tuple(str(item) for item in features) if isinstance(features, list) else None
