"""``--backend``: our server on one backend or on every serving one (``conformance._run``), and the CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import conformance
from conformance import _run
from conformance._endpoint import ManagedServer
from conformance._model import Outcome, Target
from conformance._report import ReportFiles
from conformance._run import RunOptions, main_run, managed_backends
from conformance._signing import load_or_create_signing_key, verify
from e2b_compat._cli import main
from runtime import backends
from runtime.backend import Feature
from tests.conformance.test_matrix import _write
from tests.conformance.test_report import make_run, result


def _options(tmp_path: Path, backend: str, **changes: Any) -> RunOptions:
    options = RunOptions(
        endpoint_env=None,
        second_api_key=None,
        python_versions=(),
        node_versions=(),
        match="envd/commands",
        output=tmp_path / "out",
        reports_root=tmp_path / "reports",
        features=None,
        signing_key=tmp_path / "key.pem",
        server_name="external",
        backend=backend,
    )
    return dataclasses.replace(options, **changes)


@pytest.fixture
def two_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of crun, a second serving backend, and the fake (not serving), whatever else is in the real one."""
    table = backends.BACKENDS
    fake = table["fake"]
    other = dataclasses.replace(fake, name="other", serves=True)
    monkeypatch.setattr(backends, "BACKENDS", {"crun": table["crun"], "other": other, "fake": fake})


def test_all_is_every_serving_backend_and_a_name_must_serve(two_serving: None) -> None:
    assert managed_backends("all") == ("crun", "other")
    assert managed_backends("other") == ("other",)
    with pytest.raises(ValueError, match=r"'fake' cannot serve \(serving backends: crun, other, or all\)"):
        managed_backends("fake")
    with pytest.raises(ValueError, match="'nope' cannot serve"):
        managed_backends("nope")


def test_a_managed_server_runs_on_the_backend_it_was_given(tmp_path: Path) -> None:
    server = ManagedServer(tmp_path, tmp_path / "log", backend="gvisor")
    assert server.server_env()["E2B_COMPAT_SERVER_BACKEND"] == "gvisor"


def test_an_unknown_backend_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*args: object) -> list[object]:
        raise AssertionError("clients installed")

    monkeypatch.setattr(_run, "_client_sets", never)
    assert main_run(_options(tmp_path, "nope")) == 2
    assert "'nope' cannot serve" in capsys.readouterr().err


def _fake_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_on: str) -> list[RunOptions]:
    """Replace one backend's run by a report written at once: every case passes but on ``failing_on``."""
    ran: list[RunOptions] = []
    monkeypatch.setattr(_run, "_client_sets", lambda options, console: [])

    def run_one(options: RunOptions, client_sets: object, mutation: object, console: object) -> tuple[int, ReportFiles]:
        ran.append(options)
        outcome = Outcome.FAIL if options.backend == failing_on else Outcome.PASS
        features = tuple(sorted(feature.value for feature in Feature))
        run = make_run(result("envd/commands/foreground", "js", outcome, "envd.process.Start"))
        run = dataclasses.replace(run, target=Target("s", "d", "base", options.backend, features))
        assert options.output is not None
        directory = _write(options.output, run, load_or_create_signing_key(options.signing_key))
        return (1 if outcome is Outcome.FAIL else 0), ReportFiles(
            directory, directory / "report.json", *[directory] * 2
        )

    monkeypatch.setattr(_run, "_run_one", run_one)
    return ran


def test_all_runs_each_backend_into_its_own_report_then_a_signed_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_serving: None
) -> None:
    ran = _fake_runs(tmp_path, monkeypatch, failing_on="none")
    assert main_run(_options(tmp_path, "all")) == 0
    assert [(o.backend, o.output) for o in ran] == [
        ("crun", tmp_path / "out" / "crun"),
        ("other", tmp_path / "out" / "other"),
    ]
    matrix = tmp_path / "out" / "matrix" / "matrix.json"
    assert verify(matrix)
    assert "## Differences between backends" in (matrix.parent / "matrix.md").read_text(encoding="utf-8")


def test_all_fails_when_a_difference_between_backends_is_unexplained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_serving: None, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_runs(tmp_path, monkeypatch, failing_on="other")
    assert main_run(_options(tmp_path, "all")) == 1
    assert "difference(s) between backends unexplained" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    ("argv", "backend", "external"),
    [
        ([], "crun", False),
        (["--backend", "all"], "all", False),
        (["--backend", "gvisor"], "gvisor", False),
        (["--endpoint-domain", "e2b.example:443", "--endpoint-api-key", "k"], "unknown", True),
        (["--endpoint-domain", "e2b.example:443", "--endpoint-api-key", "k", "--backend", "docker"], "docker", True),
    ],
)
def test_the_command_line_passes_the_backend(
    argv: list[str], backend: str, external: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[RunOptions] = []

    def main_run(options: RunOptions) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(conformance, "main_run", main_run)
    assert main(["conformance", "run", *argv]) == 0
    (options,) = seen
    assert options.backend == backend
    assert (options.endpoint_env is not None) is external
