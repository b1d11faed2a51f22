"""The matrix across backends (``conformance._matrix_backends``): operations x clients x backends, explained."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conformance._matrix import load_report, matrix_document, write_matrix
from conformance._matrix_backends import gist
from conformance._model import CaseResult, Outcome, Target
from conformance._signing import verify
from runtime.backend import Feature
from tests.conformance.test_matrix import _write
from tests.conformance.test_report import make_run, result

EVERYTHING = tuple(sorted(feature.value for feature in Feature))
NO_PAUSE = tuple(f for f in EVERYTHING if f != Feature.PAUSE_MEMORY.value)
PAUSE_CASE = "sandbox/lifecycle/pause-memory-connect"
METRICS_CASE = "sandbox/lifecycle/metrics"
COMMAND_CASE = "envd/commands/foreground"


def _results(pause: Outcome, metrics: Outcome, command: Outcome) -> tuple[CaseResult, ...]:
    return (
        result(PAUSE_CASE, "js", pause, "control.sandboxes.pause", detail="" if pause is Outcome.PASS else "got 500"),
        result(METRICS_CASE, "js", metrics, "control.sandboxes.metrics", reason="runsc: no pids"),
        result(COMMAND_CASE, "js", command, "envd.process.Start", detail="" if command is Outcome.PASS else "hung"),
        result(COMMAND_CASE, "py-sync", Outcome.PASS, "envd.process.Start"),
    )


def _report(tmp_path: Path, backend: str, features: tuple[str, ...] | None, *outcomes: Outcome, key=None) -> Path:  # type: ignore[no-untyped-def]
    run = make_run(*_results(*outcomes))
    run = dataclasses.replace(run, target=Target("e2b-compat 0.1.0", "e2b.localhost:1", "base", backend, features))
    return _write(tmp_path / backend, run, key)


def test_every_difference_has_its_reason_and_an_unexplained_one_is_flagged(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    crun = _report(tmp_path, "crun", EVERYTHING, Outcome.PASS, Outcome.PASS, Outcome.PASS, key=key)
    # gvisor lacks pause-memory (its pause fails), knows its metrics failure, and fails a command for no reason.
    gvisor = _report(tmp_path, "gvisor", NO_PAUSE, Outcome.FAIL, Outcome.KNOWN_FAIL, Outcome.FAIL, key=key)
    document = matrix_document([load_report(crun), load_report(gvisor)])
    assert [(run["backend"], run["features"]) for run in document["runs"]] == [
        ("crun", list(EVERYTHING)),
        ("gvisor", list(NO_PAUSE)),
    ]
    cases = {row["id"]: row for row in document["differences"] if row["kind"] == "case"}
    assert set(cases) == {PAUSE_CASE, METRICS_CASE, COMMAND_CASE}, "py-sync of the command case agrees: not a row"
    (pause,) = cases[PAUSE_CASE]["explanations"]
    assert (pause["backend"], pause["flavour"], pause["outcome"], pause["why"], pause["features"]) == (
        "gvisor",
        "js",
        "fail",
        "missing-feature",
        ["pause-memory"],
    )
    (metrics,) = cases[METRICS_CASE]["explanations"]
    assert (metrics["why"], metrics["reason"]) == ("known-failure", "runsc: no pids")
    (command,) = cases[COMMAND_CASE]["explanations"]
    assert (command["why"], command["reason"]) == ("unexplained", "hung"), "the failure's gist beside it"
    assert not cases[COMMAND_CASE]["explained"]
    assert cases[PAUSE_CASE]["explained"]
    operations = {row["id"]: row for row in document["differences"] if row["kind"] == "operation"}
    assert operations["control.sandboxes.pause"]["explanations"][0]["why"] == "missing-feature"
    assert operations["envd.process.Start"]["explanations"][0]["why"] == "unexplained"
    assert document["unexplained"] == 2, "the command case and its operation"
    table = {row["id"]: row["cells"] for row in document["operations"]}
    assert table["control.sandboxes.pause"] == {"1:js": "pass", "2:js": "fail", "1:py-sync": "gap", "2:py-sync": "gap"}
    written = write_matrix([load_report(crun), load_report(gvisor)], tmp_path / "matrix", signing_key=key)
    assert written.unexplained == 2
    assert verify(written.json), "the matrix is signed like a report"
    markdown = written.markdown.read_text(encoding="utf-8")
    assert "| operation | crun py-sync | crun js | gvisor py-sync | gvisor js |" in markdown
    assert "| case | `envd/commands/foreground` | 2 | gvisor | js | fail | **UNEXPLAINED** |" in markdown
    assert "missing-feature (pause-memory)" in markdown
    assert "- run 2 (gvisor): `disk-limit`" in markdown


def test_the_same_outcome_everywhere_is_no_difference_and_unknown_features_explain_nothing(tmp_path: Path) -> None:
    crun = _report(tmp_path, "crun", EVERYTHING, Outcome.FAIL, Outcome.PASS, Outcome.PASS)
    other = _report(tmp_path, "unknown", None, Outcome.FAIL, Outcome.PASS, Outcome.FAIL)
    document = matrix_document([load_report(crun), load_report(other)])
    assert {row["id"] for row in document["differences"]} == {COMMAND_CASE, "envd.process.Start"}
    assert document["runs"][1]["features"] is None
    assert all(item["why"] == "unexplained" for row in document["differences"] for item in row["explanations"])


def test_the_gist_of_a_failure_is_the_error_it_raised() -> None:
    js = "js:case failed (exit 1):\n\njs:case:start\nSandboxError: 403: could not switch uid\n    at handle (x.js:1)"
    assert gist(js) == "SandboxError: 403: could not switch uid"
    python = (
        "py-sync:case failed:\nTraceback (most recent call last):\n  File x\ne2b.exceptions.SandboxException: 500: boom"
    )
    assert gist(python) == "e2b.exceptions.SandboxException: 500: boom"
    assert gist("status 200, not 201\nmore") == "status 200, not 201"


def test_one_backend_alone_has_no_differences(tmp_path: Path) -> None:
    crun = _report(tmp_path, "crun", EVERYTHING, Outcome.FAIL, Outcome.PASS, Outcome.FAIL)
    document = matrix_document([load_report(crun)])
    assert document["differences"] == []
    assert document["unexplained"] == 0
