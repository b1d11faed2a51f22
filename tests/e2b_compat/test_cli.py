"""The ``e2b-compat`` command line."""

from __future__ import annotations

import pytest

from contract import ArtifactStore
from e2b_compat._cli import main


def test_help_lists_only_working_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "contract" in out


def test_inventory_filters_by_surface(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "inventory", "--surface", "envd-rpc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 17
    assert any(line.startswith("envd.process.Start ") and "server-stream" in line for line in lines)


@pytest.mark.artifacts
def test_check_reports_no_drift(store: ArtifactStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "--cache", str(store.root), "check"]) == 0
    assert "no drift" in capsys.readouterr().out


@pytest.mark.artifacts
def test_fetch_prints_each_verified_artifact(store: ArtifactStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "--cache", str(store.root), "fetch"]) == 0
    out = capsys.readouterr().out
    assert "e2b==2.32.0" in out
    assert "@e2b/code-interpreter@2.6.1" in out


def test_contract_errors_exit_2_with_a_message(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from contract import LockFileError

    def broken(*_args: object, **_kwargs: object) -> None:
        raise LockFileError("the lock is broken")

    monkeypatch.setattr("e2b_compat._cli.load_lock", broken)
    assert main(["contract", "fetch"]) == 2
    assert "e2b-compat: the lock is broken" in capsys.readouterr().err
