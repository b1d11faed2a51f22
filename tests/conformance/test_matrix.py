"""Merging reports into a compatibility matrix (``conformance._matrix``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conformance._coverage import coverage
from conformance._gate import evaluate, load_policy
from conformance._matrix import MatrixError, load_report, matrix_document, to_markdown, write_matrix
from conformance._model import CaseResult, ClientInfo, Outcome, RunInfo, Target
from conformance._report import write_report
from conformance._signing import fingerprint
from contract import load_inventory

REPO = Path(__file__).resolve().parents[2]
INVENTORY = load_inventory()
POLICY = load_policy(inventory=INVENTORY)
CREATE = "control.sandboxes.create"


def _run(backend: str, js_version: str, create_outcome: Outcome) -> RunInfo:
    clients = {"py-sync": ClientInfo("py-sync", "e2b", "2.32.0"), "js": ClientInfo("js", "e2b", js_version)}
    results = (
        CaseResult("sandbox/create", clients["py-sync"], Outcome.PASS, 1.0, (CREATE,)),
        CaseResult("sandbox/create", clients["js"], create_outcome, 1.0, (CREATE,), detail="status 200, not 201"),
        CaseResult("envd/commands/foreground", clients["js"], Outcome.PASS, 1.0, ("envd.process.Start",)),
    )
    return RunInfo(
        target=Target(server="e2b-compat 0.1.0", domain="e2b.localhost:8443", template="base", backend=backend),
        contract_manifest_sha256=hashlib.sha256((REPO / "contract" / "manifest.json").read_bytes()).hexdigest(),
        started_at="2026-05-09T07:35:25Z",
        finished_at="2026-05-09T07:41:02Z",
        harness_version="0.1.0",
        results=results,
    )


def _write(folder: Path, run: RunInfo, key: Ed25519PrivateKey | None = None) -> Path:
    cov = coverage(run.results, INVENTORY, flavours=("py-sync", "py-async", "js"))
    return write_report(folder, run, cov, evaluate(cov, POLICY), signing_key=key).directory


def test_one_row_per_report_and_the_cases_that_differ(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    crun = _write(tmp_path / "crun", _run("crun", "2.33.0", Outcome.PASS), key)
    other = _write(tmp_path / "other", _run("gvisor", "2.50.0", Outcome.FAIL), key)
    reports = [load_report(other), load_report(crun, trusted_fingerprint=fingerprint(key.public_key()))]
    document = matrix_document(reports)
    runs = document["runs"]
    assert [(r["backend"], r["clients"]) for r in runs] == [
        ("crun", ["py-sync e2b 2.32.0", "js e2b 2.33.0"]),
        ("gvisor", ["py-sync e2b 2.32.0", "js e2b 2.50.0"]),
    ], "sorted by (backend, templates, clients) whatever the order given"
    assert all(r["signed"] for r in runs)
    assert runs[0]["flavours"]["js"]["cases_passed"] == 2
    assert runs[1]["flavours"]["js"]["cases_failed"] == 1
    assert "py-async" not in runs[0]["flavours"], "a flavour with no results has no row"
    # Only the case that failed somewhere is listed, with every run's outcome beside it.
    assert document["cases_not_passing_everywhere"] == [
        {"case": "sandbox/create", "cells": {"1:js": "pass", "1:py-sync": "pass", "2:js": "fail", "2:py-sync": "pass"}}
    ]
    markdown = to_markdown(document)
    assert "| `sandbox/create` | pass | pass | pass | fail |" in markdown
    written = write_matrix(reports, tmp_path / "matrix")
    assert json.loads(written.json.read_text(encoding="utf-8")) == document
    assert written.markdown.read_text(encoding="utf-8") == markdown


def test_two_reports_of_the_same_backend_templates_and_clients_are_refused(tmp_path: Path) -> None:
    run = _run("crun", "2.33.0", Outcome.PASS)
    first = _write(tmp_path / "a", run)
    second = _write(tmp_path / "b", dataclasses.replace(run, started_at="2026-05-10T07:35:25Z"))
    with pytest.raises(MatrixError, match="both reports of backend crun"):
        matrix_document([load_report(first), load_report(second)])
    with pytest.raises(MatrixError, match="no reports"):
        matrix_document([])


def test_a_changed_signed_report_and_a_document_that_is_no_report_are_refused(tmp_path: Path) -> None:
    folder = _write(tmp_path / "r", _run("crun", "2.33.0", Outcome.PASS), Ed25519PrivateKey.generate())
    report = folder / "report.json"
    report.write_bytes(report.read_bytes().replace(b'"crun"', b'"runc"'))
    with pytest.raises(MatrixError, match="signature does not match"):
        load_report(folder)
    unsigned = _write(tmp_path / "u", _run("crun", "2.33.0", Outcome.PASS))
    assert not load_report(unsigned).signed
    with pytest.raises(MatrixError, match="unsigned, but a trusted key"):
        load_report(unsigned, trusted_fingerprint="00" * 32)
    (tmp_path / "x.json").write_text('{"schema_version": "1.1"}', encoding="utf-8")
    with pytest.raises(MatrixError, match="not a conformance report"):
        load_report(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{", encoding="utf-8")
    with pytest.raises(MatrixError, match="not a readable JSON report"):
        load_report(tmp_path / "y.json")
