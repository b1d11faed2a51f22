"""``e2b-compat keys``: issue, list and revoke API keys in a server's data folder."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from e2b_compat._cli import main
from reference_server._credentials import key_id
from reference_server._keys import KeyStore
from reference_server._store import Store


def authenticate(data_dir: Path, key: str) -> str | None:
    async def scenario() -> str | None:
        async with await Store.open(data_dir / "server.db") as store:
            return await KeyStore(store.db).authenticate(key)

    return asyncio.run(scenario())


def issue(data_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["keys", "issue", "--data-dir", str(data_dir), *extra]) == 0
    return capsys.readouterr().out.strip()


def test_issue_prints_only_the_key_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    assert main(["keys", "issue", "--owner", "alice", "--name", "laptop", "--data-dir", str(data_dir)]) == 0
    out, err = capsys.readouterr()
    assert re.fullmatch(r"e2b_[0-9a-f]{40}\n", out)
    key = out.strip()
    assert key_id(key) in err
    assert "alice" in err
    assert key not in err
    assert authenticate(data_dir, key) == "alice"


def test_list_shows_a_table_without_keys_or_hashes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alice = issue(tmp_path, capsys, "--owner", "alice", "--name", "ci runner")
    bob = issue(tmp_path, capsys, "--owner", "bob")
    assert main(["keys", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split() == ["KEY", "ID", "OWNER", "NAME", "CREATED", "REVOKED"]
    assert len(rows) == 2
    by_id = {row.split()[0]: row for row in rows}
    assert set(by_id) == {key_id(alice), key_id(bob)}
    assert "alice" in by_id[key_id(alice)]
    assert "ci runner" in by_id[key_id(alice)]
    assert by_id[key_id(bob)].split()[-1] == "-"  # not revoked
    for secret in (alice, bob, alice[4:], "pbkdf2"):
        assert secret not in out

    assert main(["keys", "list", "--owner", "bob", "--data-dir", str(tmp_path)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == [key_id(bob)]


def test_revoke_takes_effect_and_refuses_unknown_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = issue(tmp_path, capsys, "--owner", "alice")
    assert main(["keys", "revoke", key_id(key), "--data-dir", str(tmp_path)]) == 0
    assert key_id(key) in capsys.readouterr().out
    assert authenticate(tmp_path, key) is None

    assert main(["keys", "revoke", key_id(key), "--data-dir", str(tmp_path)]) == 1
    assert f"no unrevoked key with id {key_id(key)}" in capsys.readouterr().err
    assert main(["keys", "revoke", "0123456789ab", "--data-dir", str(tmp_path)]) == 1

    assert main(["keys", "list", "--data-dir", str(tmp_path)]) == 0
    [row] = capsys.readouterr().out.splitlines()[1:]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$", row)  # the revocation time


@pytest.mark.parametrize("action", [["list"], ["revoke", "0123456789ab"]])
def test_list_and_revoke_do_not_create_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: list[str]
) -> None:
    data_dir = tmp_path / "typo"
    assert main(["keys", *action, "--data-dir", str(data_dir)]) == 1
    assert "no server database" in capsys.readouterr().err
    assert not data_dir.exists()


def test_invalid_owner_exits_2_with_the_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "issue", "--owner", "a b", "--data-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "1-64 characters" in captured.err


def test_the_data_dir_defaults_to_the_server_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2B_COMPAT_SERVER_DATA_DIR", str(tmp_path / "configured"))
    assert main(["keys", "issue", "--owner", "alice"]) == 0
    key = capsys.readouterr().out.strip()
    assert authenticate(tmp_path / "configured", key) == "alice"


def test_a_broken_configuration_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_COMPAT_SERVER_DATA_DIR", "relative")
    assert main(["keys", "list"]) == 2
    assert "configuration" in capsys.readouterr().err
