"""API keys: issue, authenticate, revoke, list, the PBKDF2 cache, and the first-start key file.

Every test uses a real store on a SQLite file (WAL), as the server does; a second ``Store`` on the
same file plays the other process (the ``keys`` command). Keys are issued with a low PBKDF2 cost
to keep the tests fast; verification always uses the cost recorded in the stored hash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import threading
from collections.abc import Callable, Coroutine
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from reference_server import _keys
from reference_server._credentials import hash_api_key, is_api_key, key_id, new_api_key, redact, verify_api_key
from reference_server._keys import IssuedKey, KeyInfo, KeyStore, ensure_key, validate_owner, write_private_file
from reference_server._store import Store

FAST = 1_000  # PBKDF2 iterations for test keys
T0 = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def keystore(store: Store) -> KeyStore:
    return KeyStore(store.db, iterations=FAST, clock=lambda: T0)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "server.db"


@pytest.fixture
def verify_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts PBKDF2 verifications (the expensive step), recording the hash each was run against."""
    calls: list[str] = []

    def counting(key: str, stored: str) -> bool:
        calls.append(stored)
        return verify_api_key(key, stored)

    monkeypatch.setattr(_keys, "verify_api_key", counting)
    return calls


# --- issue, authenticate, revoke ----------------------------------------------------------------


def test_issue_stores_only_a_hash_under_the_key_id(db_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            issued = await keystore(store).issue("alice", "laptop")
            assert is_api_key(issued.key)
            assert (issued.key_id, issued.owner, issued.name, issued.created_at) == (
                key_id(issued.key),
                "alice",
                "laptop",
                T0,
            )
            query = "SELECT key_id, owner, hash, name, created_at, revoked_at FROM api_keys"
            rows = list(await store.db.execute_fetchall(query))
            assert len(rows) == 1
            kid, owner, stored, name, created_at, revoked_at = rows[0]
            assert (kid, owner, name, created_at, revoked_at) == (
                issued.key_id,
                "alice",
                "laptop",
                "2026-03-04T05:06:07.890123Z",
                None,
            )
            assert stored.startswith(f"pbkdf2-sha256${FAST}$")
            assert issued.key not in stored
        # Nowhere in the database files, WAL included.
        for path in db_path.parent.iterdir():
            assert issued.key.encode() not in path.read_bytes(), path

    run(scenario)


def test_authenticate_returns_the_owner_in_this_and_another_process(db_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as first, await Store.open(db_path) as second:
            issued = await keystore(first).issue("alice")
            assert await keystore(first).authenticate(issued.key) == "alice"
            assert await KeyStore(second.db).authenticate(issued.key) == "alice"

    run(scenario)


def test_a_revocation_by_another_connection_takes_effect_at_once(db_path: Path, verify_calls: list[str]) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as server, await Store.open(db_path) as cli:
            keys = keystore(server)
            issued = await keys.issue("alice")
            assert await keys.authenticate(issued.key) == "alice"
            assert await keys.authenticate(issued.key) == "alice"  # cached now
            assert await KeyStore(cli.db).revoke(issued.key_id) is True
            assert await keys.authenticate(issued.key) is None
            assert await keys.authenticate(issued.key) is None

    run(scenario)
    assert verify_calls == []  # the issuing process never needed PBKDF2, and a revoked key needs none


def test_revoke_is_false_for_unknown_and_already_revoked_keys(db_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            issued = await keys.issue("alice")
            assert await keys.revoke("0123456789ab") is False
            assert await keys.revoke(issued.key_id) is True
            assert await keys.revoke(issued.key_id) is False
            [info] = await keys.list()
            assert info.revoked_at == T0

    run(scenario)


def test_a_wrong_key_stored_under_its_key_id_is_refused(db_path: Path, verify_calls: list[str]) -> None:
    """A presented key finds a row by its key_id, but the row's hash is of another key."""
    presented, other = new_api_key(), new_api_key()

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            await store.db.execute(
                "INSERT INTO api_keys (key_id, owner, hash, created_at) VALUES (?, 'mallory', ?, ?)",
                (key_id(presented), hash_api_key(other, FAST), "2026-01-01T00:00:00.000000Z"),
            )
            keys = keystore(store)
            assert await keys.authenticate(presented) is None
            assert await keys.authenticate(presented) is None

    run(scenario)
    assert len(verify_calls) == 2  # failures are not cached: each costs a full verification


def test_a_key_sharing_a_verified_keys_id_is_refused_without_pbkdf2(
    db_path: Path, verify_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_keys, "key_id", lambda key: "000000000000")  # every key collides

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            issued = await keystore(store).issue("alice")
            keys = KeyStore(store.db)
            assert await keys.authenticate(issued.key) == "alice"
            assert await keys.authenticate(new_api_key()) is None

    run(scenario)
    assert len(verify_calls) == 1  # only the genuine key's first check


@pytest.mark.parametrize(
    "presented",
    [
        None,
        "",
        "e2b_",
        "e2b_" + "0" * 39,
        "e2b_" + "0" * 41,
        "e2b_" + "A" * 40,
        "E2B_" + "0" * 40,
        "sk_" + "0" * 40,
        " e2b_" + "0" * 40,
        "e2b_" + "0" * 40 + "\n",
        "e2b_" + "\u0660" * 40,  # Arabic-Indic zeros: digits to str.isdigit, not to us
        12345,
        b"e2b_" + b"0" * 40,
    ],
)
def test_malformed_keys_are_refused_without_a_lookup(
    db_path: Path, verify_calls: list[str], presented: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []

    def recording_key_id(key: str) -> str:
        looked_up.append(key)
        return "000000000000"

    monkeypatch.setattr(_keys, "key_id", recording_key_id)

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            assert await keystore(store).authenticate(cast(Any, presented)) is None

    run(scenario)
    assert looked_up == []
    assert verify_calls == []


def test_an_unknown_well_formed_key_is_refused(db_path: Path, verify_calls: list[str]) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            await keystore(store).issue("alice")
            assert await keystore(store).authenticate(new_api_key()) is None

    run(scenario)
    assert verify_calls == []


# --- the PBKDF2 cache ---------------------------------------------------------------------------


def test_pbkdf2_runs_once_per_key_per_process_and_again_when_the_hash_changes(
    db_path: Path, verify_calls: list[str]
) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as cli, await Store.open(db_path) as server:
            first = await keystore(cli).issue("alice")
            second = await keystore(cli).issue("bob")
            keys = KeyStore(server.db)  # a process that issued neither key
            for _ in range(3):
                assert await keys.authenticate(first.key) == "alice"
            assert len(verify_calls) == 1
            assert await keys.authenticate(second.key) == "bob"
            assert len(verify_calls) == 2
            # The row gets a new hash of the same key (a re-hash at another cost): verified again, once.
            rehashed = hash_api_key(first.key, FAST + 1)
            await cli.db.execute("UPDATE api_keys SET hash = ? WHERE key_id = ?", (rehashed, first.key_id))
            assert await keys.authenticate(first.key) == "alice"
            assert await keys.authenticate(first.key) == "alice"
            assert verify_calls[2:] == [rehashed]
            # A hash of another key under this key_id: the cached success no longer counts.
            await cli.db.execute(
                "UPDATE api_keys SET hash = ? WHERE key_id = ?", (hash_api_key(new_api_key(), FAST), first.key_id)
            )
            assert await keys.authenticate(first.key) is None

    run(scenario)


def test_concurrent_checks_of_one_key_share_one_pbkdf2_run(db_path: Path, verify_calls: list[str]) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as cli, await Store.open(db_path) as server:
            issued = await keystore(cli).issue("alice")
            keys = KeyStore(server.db)
            owners = await asyncio.gather(*(keys.authenticate(issued.key) for _ in range(10)))
            assert owners == ["alice"] * 10

    run(scenario)
    assert len(verify_calls) == 1


def test_a_cancelled_check_does_not_cancel_the_others(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(key: str, stored: str) -> bool:
        started.set()
        release.wait(10)
        return verify_api_key(key, stored)

    monkeypatch.setattr(_keys, "verify_api_key", slow)

    async def scenario() -> None:
        async with await Store.open(db_path) as cli, await Store.open(db_path) as server:
            issued = await keystore(cli).issue("alice")
            keys = KeyStore(server.db)
            doomed = asyncio.ensure_future(keys.authenticate(issued.key))
            survivor = asyncio.ensure_future(keys.authenticate(issued.key))
            assert await asyncio.to_thread(started.wait, 10)
            await asyncio.sleep(0.01)  # let the second check join the verification in flight
            doomed.cancel()
            release.set()
            assert await survivor == "alice"
            with pytest.raises(asyncio.CancelledError):
                await doomed

    run(scenario)


def test_the_cache_holds_no_key(db_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as cli, await Store.open(db_path) as server:
            issued = await keystore(cli).issue("alice")
            keys = KeyStore(server.db)
            assert await keys.authenticate(issued.key) == "alice"
            state = repr(vars(keys)) + repr([vars(entry) for entry in keys._verified.values()])
            assert issued.key not in state
            assert issued.key[4:] not in state
            for entry in keys._verified.values():
                assert issued.key.encode() not in entry.digest

    run(scenario)


# --- no secrets in reprs or logs ----------------------------------------------------------------


def test_the_key_never_appears_in_reprs_or_logs(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[IssuedKey] = []

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            issued = await keys.issue("alice", "laptop")
            seen.append(issued)
            await keys.authenticate(issued.key)
            await KeyStore(store.db).authenticate(issued.key)
            await keys.revoke(issued.key_id)
            await keys.authenticate(issued.key)

    run(scenario)
    [issued] = seen
    assert issued.key not in repr(issued)
    assert issued.key not in str(issued)
    assert redact(issued.key) in repr(issued)
    assert issued.key_id in repr(issued)
    assert caplog.records, "issuing and revoking are logged"
    assert issued.key not in caplog.text
    assert issued.key[4:] not in caplog.text


# --- listing ------------------------------------------------------------------------------------


def test_list_shows_no_hash_and_filters_by_owner(db_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            alice = await keys.issue("alice", "one")
            bob = await keys.issue("bob")
            await keys.revoke(bob.key_id)
            listed = await keys.list()
            assert {info.key_id for info in listed} == {alice.key_id, bob.key_id}
            assert await keys.list("alice") == [KeyInfo(alice.key_id, "alice", "one", T0, None)]
            assert await keys.list("nobody") == []
            [bob_info] = await keys.list("bob")
            assert bob_info.revoked
            assert bob_info.revoked_at == T0

    run(scenario)
    assert {item.name for item in fields(KeyInfo)} == {"key_id", "owner", "name", "created_at", "revoked_at"}


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("owner", ["a", "team-a", "A.b_c-9", "x" * 64])
def test_valid_owners(owner: str) -> None:
    assert validate_owner(owner) == owner


@pytest.mark.parametrize("owner", ["", "x" * 65, "a b", "a/b", "ä", "a\n", "a:b", "team@x"])
def test_invalid_owners_are_refused_with_the_rule(owner: str, db_path: Path) -> None:
    with pytest.raises(ValueError, match="1-64 characters of letters, digits"):
        validate_owner(owner)

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            with pytest.raises(ValueError, match="owner"):
                await keystore(store).issue(owner)
            assert await store.db.execute_fetchall("SELECT * FROM api_keys") == []

    run(scenario)


@pytest.mark.parametrize("name", ["line\nbreak", "bell\a", "x" * 201])
def test_invalid_key_names_are_refused(name: str, db_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            with pytest.raises(ValueError, match="name"):
                await keystore(store).issue("alice", name)

    run(scenario)


# --- the first-start key ------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ensure_key_issues_once_then_reuses_the_file(tmp_path: Path, db_path: Path) -> None:
    key_file = tmp_path / "state" / "api-key"

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            first = await ensure_key(store.db, key_file, "default", keys=keys)
            assert key_file.read_text() == first + "\n"
            assert mode(key_file) == 0o600
            assert await KeyStore(store.db).authenticate(first) == "default"
            again = await ensure_key(store.db, key_file, "default", keys=keys)
            assert again == first
            assert len(await keys.list()) == 1

    run(scenario)


def test_ensure_key_without_a_keystore_uses_the_connection(tmp_path: Path, db_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            key = await ensure_key(store.db, tmp_path / "api-key", "default")
            assert await KeyStore(store.db).authenticate(key) == "default"
            assert await ensure_key(store.db, tmp_path / "api-key", "default") == key

    run(scenario)


def test_ensure_key_replaces_and_revokes_a_key_in_a_readable_file(tmp_path: Path, db_path: Path) -> None:
    key_file = tmp_path / "api-key"

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            old = await ensure_key(store.db, key_file, "default", keys=keys)
            key_file.chmod(0o644)
            new = await ensure_key(store.db, key_file, "default", keys=keys)
            assert new != old
            assert mode(key_file) == 0o600
            assert key_file.read_text() == new + "\n"
            assert await keys.authenticate(old) is None  # it may have been read: revoked
            assert await keys.authenticate(new) == "default"

    run(scenario)


@pytest.mark.parametrize("content", ["", "not a key\n", "e2b_" + "0" * 40 + "\n"])
def test_ensure_key_replaces_a_file_without_a_valid_key(tmp_path: Path, db_path: Path, content: str) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text(content)
    key_file.chmod(0o600)

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            new = await ensure_key(store.db, key_file, "default", keys=keystore(store))
            assert key_file.read_text() == new + "\n"
            assert await keystore(store).authenticate(new) == "default"

    run(scenario)


def test_ensure_key_replaces_a_revoked_key(tmp_path: Path, db_path: Path) -> None:
    key_file = tmp_path / "api-key"

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            old = await ensure_key(store.db, key_file, "default", keys=keys)
            await keys.revoke(key_id(old))
            new = await ensure_key(store.db, key_file, "default", keys=keys)
            assert new != old
            assert await keys.authenticate(new) == "default"

    run(scenario)


def test_ensure_key_for_another_owner_issues_a_new_key_and_keeps_the_old_valid(tmp_path: Path, db_path: Path) -> None:
    key_file = tmp_path / "api-key"

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            old = await ensure_key(store.db, key_file, "alice", keys=keys)
            new = await ensure_key(store.db, key_file, "bob", keys=keys)
            assert new != old
            assert await keys.authenticate(new) == "bob"
            assert await keys.authenticate(old) == "alice"

    run(scenario)


def test_ensure_key_does_not_follow_a_symlink(tmp_path: Path, db_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched\n")
    key_file = tmp_path / "api-key"
    key_file.symlink_to(elsewhere)

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            new = await ensure_key(store.db, key_file, "default", keys=keystore(store))
            assert not key_file.is_symlink()
            assert key_file.read_text() == new + "\n"

    run(scenario)
    assert elsewhere.read_text() == "untouched\n"


def test_write_private_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "new" / "secret"
    previous = os.umask(0)
    try:
        write_private_file(target, "one\n")
        write_private_file(target, "two\n")
    finally:
        os.umask(previous)
    assert target.read_text() == "two\n"
    assert mode(target) == 0o600
    assert mode(target.parent) == 0o700
    assert sorted(path.name for path in target.parent.iterdir()) == ["secret"]  # no temporary left behind


def test_write_private_file_leaves_nothing_when_it_fails(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.mkdir()  # a folder cannot be replaced by a file
    with pytest.raises(_keys.KeyFileError, match="cannot write"):
        write_private_file(target, "x")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["secret"]


def test_issue_draws_another_key_when_the_key_id_is_taken(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = iter(["aaaaaaaaaaaa", "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", *["cccccccccccc"] * 3])
    monkeypatch.setattr(_keys, "key_id", lambda key: next(ids))

    async def scenario() -> None:
        async with await Store.open(db_path) as store:
            keys = keystore(store)
            assert (await keys.issue("alice")).key_id == "aaaaaaaaaaaa"
            assert (await keys.issue("bob")).key_id == "bbbbbbbbbbbb"  # after one collision
            assert (await keys.issue("carol")).key_id == "cccccccccccc"
            with pytest.raises(RuntimeError, match="could not draw an unused key id"):
                await keys.issue("dave")
            assert [info.owner for info in await keys.list()] == ["alice", "bob", "carol"]

    run(scenario)
