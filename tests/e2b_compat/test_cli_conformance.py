"""``e2b-compat conformance verify``: exit 0 and the fingerprint for a valid signature, 1 otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conformance._coverage import coverage
from conformance._gate import evaluate, load_policy
from conformance._report import write_report
from conformance._signing import fingerprint
from e2b_compat._cli import main
from tests.conformance.test_report import INVENTORY, MIXED


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def report_dir(tmp_path: Path, key: Ed25519PrivateKey) -> Path:
    cov = coverage(MIXED.results, INVENTORY)
    gate = evaluate(cov, load_policy(inventory=INVENTORY))
    return write_report(tmp_path / "report", MIXED, cov, gate, signing_key=key).directory


def test_help_lists_the_conformance_group_and_verify(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["conformance", "--help"])
    assert info.value.code == 0
    assert "verify" in capsys.readouterr().out


def test_a_valid_report_prints_its_fingerprint(
    report_dir: Path, key: Ed25519PrivateKey, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = fingerprint(key.public_key())
    for target in (report_dir, report_dir / "report.json"):
        assert main(["conformance", "verify", str(target)]) == 0
        out, err = capsys.readouterr()
        assert out == expected + "\n"
        assert "not checked against a trusted fingerprint" in err

    assert main(["conformance", "verify", str(report_dir), "--fingerprint", expected.upper()]) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    assert "valid signature by the trusted key" in err


def test_another_fingerprint_exits_1_and_says_whose_key_it_is(
    report_dir: Path, key: Ed25519PrivateKey, capsys: pytest.CaptureFixture[str]
) -> None:
    other = fingerprint(Ed25519PrivateKey.generate().public_key())
    assert main(["conformance", "verify", str(report_dir), "--fingerprint", other]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"signed with key {fingerprint(key.public_key())}, not with the trusted key {other}" in err


def test_a_changed_report_exits_1_with_a_clear_message(report_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = report_dir / "report.json"
    data = bytearray(report.read_bytes())
    data[len(data) // 3] ^= 0x20
    report.write_bytes(bytes(data))
    assert main(["conformance", "verify", str(report_dir)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"e2b-compat: {report}: signature NOT valid: ")
    assert "report or its signature was changed" in err


def test_an_unsigned_or_missing_report_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "verify", str(tmp_path / "nowhere")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "report.json").write_text("{}\n", encoding="utf-8")
    assert main(["conformance", "verify", str(tmp_path)]) == 1
    assert "report.json.sig does not exist" in capsys.readouterr().err


def test_matrix_merges_reports_and_refuses_a_duplicate(
    report_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["conformance", "matrix", str(report_dir), "--output", str(tmp_path / "m"), "--unsigned"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "m" / "matrix.md"), str(tmp_path / "m" / "matrix.json")]
    assert "| 1 | crun | base |" in (tmp_path / "m" / "matrix.md").read_text(encoding="utf-8")
    out = tmp_path / "twice"
    twice = [str(report_dir), str(report_dir / "report.json")]
    assert main(["conformance", "matrix", *twice, "--output", str(out), "--unsigned"]) == 1
    assert "both reports of backend crun" in capsys.readouterr().err
    assert not out.exists(), "nothing is written when the merge fails"


def test_run_refuses_a_mutants_file_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mutants.json").write_text("{}", encoding="utf-8")
    assert main(["conformance", "run", "--mutants", str(tmp_path / "mutants.json")]) == 2
    assert "not a mutants session" in " ".join(capsys.readouterr().err.split())
