"""The hand-kept lock file parses, and malformed ones are refused with a reason."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from contract import LockFileError, load_lock
from contract._lock import LOCK_PATH, parse_lock


def _raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(LOCK_PATH.read_text())
    return data


def test_committed_lock_pins_the_four_official_artifacts() -> None:
    lock = load_lock()
    assert {(a.registry, a.name, a.version) for a in lock.artifacts.values()} == {
        ("pypi", "e2b", "2.32.0"),
        ("pypi", "e2b-code-interpreter", "2.8.1"),
        ("npm", "e2b", "2.33.0"),
        ("npm", "@e2b/code-interpreter", "2.6.1"),
    }
    assert lock.sources["e2b"].commit.startswith("423a1b73")
    assert lock.sources["code-interpreter"].commit.startswith("5aeca43f")
    assert lock.artifact("js-e2b").spec == "e2b@2.33.0"
    assert lock.artifact("py-e2b").spec == "e2b==2.32.0"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["artifacts"]["py-e2b"].update(sha256="ABC"), "sha256 must be 64 lowercase hex"),
        (lambda d: d["artifacts"]["js-e2b"].pop("integrity"), "sha512 'integrity'"),
        (lambda d: d["artifacts"]["py-e2b"].update(registry="cargo"), "registry must be"),
        (lambda d: d["artifacts"]["py-e2b"].update(source="nowhere"), "unknown source"),
        (lambda d: d["sources"]["e2b"].update(commit="423a1b7"), "40 lowercase hex"),
        (lambda d: d["artifacts"]["py-e2b"].pop("version"), "'version'"),
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d.update(artifacts={}), "pins no artifacts"),
    ],
)
def test_malformed_lock_is_refused(mutate: Any, message: str) -> None:
    data = copy.deepcopy(_raw())
    mutate(data)
    with pytest.raises(LockFileError, match=message):
        parse_lock(data)


def test_unknown_artifact_key_is_an_error() -> None:
    with pytest.raises(LockFileError, match="no artifact 'nope'"):
        load_lock().artifact("nope")
