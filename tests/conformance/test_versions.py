"""The sweep's version page: every client version a row, varying cases by version, the changes (``_versions``)."""

from __future__ import annotations

from pathlib import Path

from conformance._model import CaseResult, ClientInfo, Outcome, RunInfo, Target
from conformance._versions import CHANGES, ClientChange, load_changes, versions_markdown, write_versions

OLD, MID, NEW = (ClientInfo("py-sync", "e2b", version) for version in ("2.32.0", "2.9.0", "2.63.0"))
JS = ClientInfo("js", "e2b", "2.51.0")


def run_of(*results: CaseResult) -> RunInfo:
    target = Target(server="e2b-compat", domain="e2b.test", template="base", backend="crun")
    return RunInfo(target, "0" * 64, "2026-12-04T18:00:00Z", "2026-12-04T18:30:00Z", "0.1.0", results=results)


def result(client: ClientInfo, case: str, outcome: Outcome) -> CaseResult:
    return CaseResult(case, client, outcome, 1.0, ())


def test_the_matrix_has_a_row_per_version_in_version_order() -> None:
    page = versions_markdown(
        run_of(
            result(NEW, "sandbox/lifecycle/list-order", Outcome.PASS),
            result(OLD, "sandbox/lifecycle/list-order", Outcome.SKIP),
            result(MID, "sandbox/lifecycle/list-order", Outcome.FAIL),
            result(NEW, "envd/commands/run", Outcome.PASS),
            result(OLD, "envd/commands/run", Outcome.PASS),
            result(MID, "envd/commands/run", Outcome.PASS),
            result(JS, "envd/commands/run", Outcome.KNOWN_FAIL),
        ),
        [],
    )
    rows = [line for line in page.splitlines() if line.startswith("| py-sync e2b |")]
    assert [row.split(" | ")[1] for row in rows] == ["2.9.0", "2.32.0", "2.63.0"], "numeric version order"
    assert rows[0].endswith("| 1 | 1 | 0 | 0 | sandbox/lifecycle/list-order |")
    assert "| js e2b | 2.51.0 | 0 | 0 | 0 | 1 | - |" in page
    assert "| sandbox/lifecycle/list-order | FAIL | skip | pass |" in page, "the case's outcome per version"
    assert "| envd/commands/run |" not in page.split("## Cases by version")[1], "a case the same everywhere is left out"


def test_changes_are_listed_by_package_and_version() -> None:
    changes = [
        ClientChange("python e2b", "2.61.0", "Idempotency-Key | on create", "made once"),
        ClientChange("python e2b", "2.9.0", "early", "nothing"),
        ClientChange("npm e2b", "2.45.0", "list order", "orders"),
    ]
    page = versions_markdown(run_of(result(NEW, "envd/commands/run", Outcome.PASS)), changes)
    table = page.split("## Changes by version")[1]
    assert table.index("npm e2b") < table.index("| python e2b | 2.9.0") < table.index("| python e2b | 2.61.0")
    assert "Idempotency-Key \\| on create" in table, "a | in a change is escaped, not a new column"
    assert "Every case had the same outcome" in page


def test_the_committed_changes_load_and_name_released_versions(tmp_path: Path) -> None:
    changes = load_changes(CHANGES)
    assert changes, "client-changes.json lists the changes since the pin"
    for change in changes:
        assert change.package in {"python e2b", "npm e2b", "python e2b-code-interpreter"}, change
        assert all(part.isdigit() for part in change.since.split(".")), change
        assert change.change
        assert change.server
    written = write_versions(tmp_path, run_of(result(NEW, "envd/commands/run", Outcome.PASS)))
    assert written.name == "versions.md"
    assert "Idempotency-Key" in written.read_text()
