"""The durable store: schema and migrations, compare-and-swap, pagination, crash safety.

Every test runs on a real SQLite file in WAL mode (no in-memory shortcut: WAL, locking between
connections and recovery after a kill are what is being tested). pytest-asyncio is not used:
each test runs its scenario with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_server._migrations import (
    MIGRATIONS,
    Migration,
    UnknownMigrationHistory,
    check_sequence,
    split_statements,
)
from reference_server._records import STATES, TRANSITIONS, SandboxDetails, SandboxRecord, SandboxState
from reference_server._store import (
    AlreadyExists,
    Changes,
    GenerationConflict,
    InvalidCursor,
    InvalidTransition,
    NotFound,
    Store,
    check_transition,
    decode_cursor,
    encode_cursor,
)

from .test_records import details_values

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LIFETIME = timedelta(minutes=5)


def make(sandbox_id: str = "sb-1", **overrides: Any) -> SandboxRecord:
    values: dict[str, Any] = {
        "sandbox_id": sandbox_id,
        "owner": "team-a",
        "template_id": "base",
        "state": "creating",
        "created_at": T0,
        "expires_at": T0 + LIFETIME,
    }
    values.update(overrides)
    return SandboxRecord(**values)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def raw(path: Path) -> sqlite3.Connection:
    """A plain connection, bypassing the store, as an operator or a buggy writer would."""
    return sqlite3.connect(path, isolation_level=None)


def history(path: Path) -> list[tuple[int, str, str, str]]:
    db = raw(path)
    try:
        return db.execute(
            "SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"
        ).fetchall()
    finally:
        db.close()


# --- the record -----------------------------------------------------------------------------

record_fields = st.fixed_dictionaries(
    {
        "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
        "env_vars": st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=4),
        "details": details_values,
        "created_at": st.datetimes(
            min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
        ),
        "generation": st.integers(1, 2**40),
        "state": st.sampled_from(sorted(STATES)),
        "auto_pause": st.booleans(),
    }
)


@given(record_fields)
def test_record_json_round_trip(values: dict[str, Any]) -> None:
    record = make(expires_at=values["created_at"] + LIFETIME, **values)
    assert SandboxRecord.from_json(record.to_json()) == record


def test_record_times_are_utc_and_must_be_aware() -> None:
    record = make(created_at=datetime(2026, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2))))
    assert record.created_at == T0
    assert record.created_at.tzinfo is UTC
    assert json.loads(record.to_json())["created_at"] == "2026-01-01T00:00:00.000000Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        make(expires_at=datetime(2026, 1, 1))  # naive: the point of the test


@pytest.mark.parametrize(
    ("field", "value"),
    [("state", "sleeping"), ("generation", 0), ("generation", True), ("owner", ""), ("metadata", {"k": 1})],
)
def test_record_rejects_invalid_fields(field: str, value: object) -> None:
    overrides: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        make(**overrides)


def test_record_json_must_have_exactly_the_fields() -> None:
    document = json.loads(make().to_json())
    with pytest.raises(ValueError, match=r"unknown \['extra'\]"):
        SandboxRecord.from_json(json.dumps({**document, "extra": 1}))
    del document["owner"]
    with pytest.raises(ValueError, match=r"missing \['owner'\]"):
        SandboxRecord.from_json(json.dumps(document))


def test_env_vars_stay_out_of_repr() -> None:
    assert "hunter2" not in repr(make(env_vars={"TOKEN": "hunter2"}))


# --- opening, SQLite settings, migrations ---------------------------------------------------


def test_open_sets_wal_foreign_keys_busy_timeout_and_a_strict_table(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db", busy_timeout_ms=1234) as store:
            db = store._db
            assert list(await db.execute_fetchall("PRAGMA journal_mode")) == [("wal",)]
            assert list(await db.execute_fetchall("PRAGMA foreign_keys")) == [(1,)]
            assert list(await db.execute_fetchall("PRAGMA busy_timeout")) == [(1234,)]
            assert list(await db.execute_fetchall("PRAGMA synchronous")) == [(2,)]  # FULL
            tables = await db.execute_fetchall("SELECT name, strict FROM pragma_table_list WHERE name = 'sandboxes'")
            assert list(tables) == [("sandboxes", 1)]

    run(scenario)


def test_migrations_are_applied_once(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def scenario() -> None:
        async with await Store.open(path) as first:
            assert first.migrated == tuple(migration.version for migration in MIGRATIONS)
            await first.insert(make())
        applied = history(path)
        assert [(version, name, checksum) for version, name, checksum, _ in applied] == [
            (migration.version, migration.name, migration.checksum) for migration in MIGRATIONS
        ]
        for _ in range(2):
            async with await Store.open(path) as again:
                assert again.migrated == ()
                assert await again.get("sb-1") == make()
        assert history(path) == applied  # same rows, same applied_at

    run(scenario)


def test_two_servers_opening_a_new_file_together_apply_each_migration_once(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def scenario() -> None:
        stores = await asyncio.gather(*(Store.open(path) for _ in range(4)))
        try:
            # Each migration commits on its own, so openers may share the work, but none is applied twice.
            applied = [version for store in stores for version in store.migrated]
            assert sorted(applied) == [migration.version for migration in MIGRATIONS]
        finally:
            for store in stores:
                await store.close()
        assert [row[0] for row in history(path)] == [migration.version for migration in MIGRATIONS]

    run(scenario)


NEXT = len(MIGRATIONS) + 1  # test migrations follow the real ones
WIDGETS = Migration(NEXT, "widgets", "CREATE TABLE widgets (id INTEGER PRIMARY KEY, name TEXT NOT NULL) STRICT;\n")
WIDGET_NAMES = Migration(NEXT + 1, "widget names", "CREATE INDEX widgets_by_name ON widgets (name);\n")


def test_new_migrations_are_applied_in_order(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def scenario() -> None:
        async with await Store.open(path) as store:
            await store.insert(make())
        async with await Store.open(path, migrations=(*MIGRATIONS, WIDGETS, WIDGET_NAMES)) as newer:
            assert newer.migrated == (NEXT, NEXT + 1)  # the second needs the first's table: order matters
            assert await newer.get("sb-1") == make()
        assert [row[:2] for row in history(path)] == [
            *((migration.version, migration.name) for migration in MIGRATIONS),
            (NEXT, "widgets"),
            (NEXT + 1, "widget names"),
        ]

    run(scenario)


def test_a_failing_migration_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    broken = Migration(NEXT, "half", "CREATE TABLE half (x INTEGER) STRICT;\nINSERT INTO nowhere VALUES (1);\n")

    async def scenario() -> None:
        with pytest.raises(sqlite3.OperationalError, match="nowhere"):
            await Store.open(path, migrations=(*MIGRATIONS, broken))
        async with await Store.open(path) as store:  # the real migrations committed on their own
            assert store.migrated == ()

    run(scenario)
    db = raw(path)
    try:
        assert db.execute("SELECT name FROM sqlite_schema WHERE name = 'half'").fetchall() == []
    finally:
        db.close()
    assert [row[0] for row in history(path)] == [migration.version for migration in MIGRATIONS]


def test_a_history_from_a_newer_server_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def scenario() -> None:
        async with await Store.open(path, migrations=(*MIGRATIONS, WIDGETS)):
            pass
        with pytest.raises(UnknownMigrationHistory, match=rf"migration {NEXT} \('widgets'.*newer server"):
            await Store.open(path)
        async with await Store.open(path, migrations=(*MIGRATIONS, WIDGETS)) as newer:  # untouched by the refusal
            assert newer.migrated == ()

    run(scenario)


def test_a_fake_history_row_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def scenario() -> None:
        async with await Store.open(path):
            pass
        db = raw(path)
        db.execute("INSERT INTO schema_migrations VALUES (99, 'from the future', 'feed', '2030-01-01T00:00:00+00:00')")
        db.close()
        with pytest.raises(UnknownMigrationHistory, match="migration 99"):
            await Store.open(path)

    run(scenario)


def test_an_edited_migration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    edited = Migration(1, "sandboxes", MIGRATIONS[0].sql.replace("CREATE TABLE sandboxes", "CREATE TABLE  sandboxes"))
    assert edited.checksum != MIGRATIONS[0].checksum

    async def scenario() -> None:
        async with await Store.open(path):
            pass
        with pytest.raises(UnknownMigrationHistory, match="SQL changed after it was applied"):
            await Store.open(path, migrations=(edited,))

    run(scenario)


def test_a_history_with_a_hole_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    known = (*MIGRATIONS, WIDGETS, WIDGET_NAMES)

    async def scenario() -> None:
        async with await Store.open(path, migrations=known):
            pass
        db = raw(path)
        db.execute("DELETE FROM schema_migrations WHERE version = ?", (NEXT,))
        db.close()
        with pytest.raises(UnknownMigrationHistory, match="hole"):
            await Store.open(path, migrations=known)

    run(scenario)


def test_the_migration_list_itself_must_be_numbered_from_one() -> None:
    check_sequence(MIGRATIONS)
    with pytest.raises(ValueError, match="numbered"):
        check_sequence((WIDGETS,))
    with pytest.raises(ValueError, match="numbered"):
        check_sequence((*MIGRATIONS, WIDGET_NAMES))


def test_split_statements_splits_only_real_statement_ends() -> None:
    sql = """
    CREATE TABLE a (x TEXT DEFAULT ';'); CREATE TABLE b (y TEXT);
    -- a comment; with a semicolon
    CREATE TRIGGER t AFTER INSERT ON a BEGIN
        INSERT INTO b VALUES ('1;2');
        DELETE FROM b;
    END;
    -- trailing comment
    """
    statements = split_statements(sql)
    assert [statement.split()[:3] for statement in statements] == [
        ["CREATE", "TABLE", "a"],
        ["CREATE", "TABLE", "b"],
        ["--", "a", "comment;"],
    ]
    assert statements[2].endswith("END;")
    with pytest.raises(ValueError, match="complete statement"):
        split_statements("CREATE TABLE a (x TEXT);\nCREATE TABLE b (")


# --- what the schema refuses, whoever writes ------------------------------------------------


def _document(**changes: object) -> str:
    document = json.loads(make().to_json())
    document.update(changes)
    return json.dumps(document)


def _without(key: str) -> str:
    document = json.loads(make().to_json())
    del document[key]
    return json.dumps(document)


BAD_RECORDS = {
    "not JSON": "{not json",
    "a JSON array": "[1, 2]",
    "a JSON string": '"sb-1"',
    "unknown state": _document(state="sleeping"),
    "no state": _without("state"),
    "state a number": _document(state=1),
    "generation a string": _document(generation="2"),
    "generation zero": _document(generation=0),
    "generation a boolean": _document(generation=True),
    "generation fractional": _document(generation=1.5),
    "no sandbox id": _without("sandbox_id"),
    "empty owner": _document(owner=""),
    "owner a number": _document(owner=7),
    "expiry with an offset": _document(expires_at="2026-01-01T00:00:00+00:00"),
    "expiry without microseconds": _document(expires_at="2026-01-01T00:00:00Z"),
    "creation time missing": _without("created_at"),
    "metadata a list": _document(metadata=[]),
}


@pytest.fixture(scope="module")
def schema_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("schema") / "store.db"

    async def scenario() -> None:
        async with await Store.open(path) as store:
            await store.insert(make("existing"))

    run(scenario)
    return path


@pytest.mark.parametrize("text", list(BAD_RECORDS.values()), ids=list(BAD_RECORDS))
def test_raw_sql_cannot_store_a_bad_record(schema_db: Path, text: str) -> None:
    db = raw(schema_db)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            db.execute("INSERT INTO sandboxes (record) VALUES (?)", (text,))
        before = db.execute("SELECT record FROM sandboxes").fetchall()
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            db.execute("UPDATE sandboxes SET record = ?", (text,))
        assert db.execute("SELECT record FROM sandboxes").fetchall() == before
    finally:
        db.close()


def test_raw_sql_cannot_store_a_non_text_record(schema_db: Path) -> None:
    db = raw(schema_db)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="cannot store BLOB value in TEXT column"):  # STRICT
            db.execute("INSERT INTO sandboxes (record) VALUES (?)", (make("blob").to_json().encode(),))
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            db.execute("INSERT INTO sandboxes (record) VALUES (?)", (make("existing").to_json(),))
    finally:
        db.close()


def test_the_schema_accepts_exactly_the_lifecycle_states(schema_db: Path) -> None:
    """Migration 1 spells the states out in SQL; they must be the transition table's."""
    db = raw(schema_db)
    try:
        db.execute("BEGIN")
        for state in sorted(STATES):
            db.execute("INSERT INTO sandboxes (record) VALUES (?)", (make(f"in-{state}", state=state).to_json(),))
        db.execute("ROLLBACK")
        check = db.execute("SELECT sql FROM sqlite_schema WHERE name = 'sandboxes'").fetchone()[0]
        listed = check.split("state IN (", 1)[1].split(")", 1)[0]
        assert {part.strip().strip("'") for part in listed.split(",")} == STATES
    finally:
        db.close()


# --- the lifecycle table ---------------------------------------------------------------------

HAPPY_PATH = ["creating", "running", "pausing", "paused", "resuming", "running", "killing", "killed"]
REFUSED = [
    ("creating", "paused"),
    ("running", "paused"),  # only through pausing
    ("paused", "running"),  # only through resuming
    ("running", "creating"),
    ("running", "killed"),  # only through killing
    ("killed", "killing"),
    ("killed", "running"),
    ("killed", "failed"),
    ("failed", "running"),
    ("running", "sleeping"),
]


def test_the_table_allows_the_lifecycle() -> None:
    for current, new in itertools.pairwise(HAPPY_PATH):
        check_transition(current, new)
    for state in STATES - {"killed"}:
        check_transition(state, "killing")
    for state in STATES - {"killed", "failed"}:
        check_transition(state, "failed")
    check_transition("failed", "killing")
    for state in STATES:
        check_transition(state, state)  # not a transition
    assert TRANSITIONS[SandboxState.KILLED] == frozenset()


@pytest.mark.parametrize(("current", "new"), REFUSED)
def test_the_table_refuses(current: str, new: str) -> None:
    with pytest.raises(InvalidTransition, match=f"{current}|{new}"):
        check_transition(current, new)


# --- operations -------------------------------------------------------------------------------


def test_insert_and_get(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            details = SandboxDetails(envd_version="0.6.4", address="10.11.0.2")
            stored = await store.insert(make(generation=7, metadata={"k": "v"}, details=details))
            assert stored.generation == 1
            assert await store.get("sb-1") == stored
            assert await store.get("nope") is None
            with pytest.raises(AlreadyExists, match="sb-1"):
                await store.insert(make(owner="team-b"))
            assert await store.get("sb-1") == stored

    run(scenario)


def test_compare_and_swap_walks_the_lifecycle(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            record = await store.insert(make())
            for state in HAPPY_PATH[1:]:
                record = await store.compare_and_swap("sb-1", record.generation, {"state": SandboxState(state)})
                assert record.state == state
                assert await store.get("sb-1") == record
            assert record.generation == len(HAPPY_PATH)

    run(scenario)


def test_compare_and_swap_refusals_change_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            await store.insert(make())
            running = await store.compare_and_swap("sb-1", 1, {"state": SandboxState.RUNNING, "metadata": {"a": "b"}})
            assert (running.generation, running.metadata) == (2, {"a": "b"})
            with pytest.raises(GenerationConflict) as conflict:
                await store.compare_and_swap("sb-1", 1, {"state": SandboxState.KILLING})
            assert (conflict.value.expected, conflict.value.current) == (1, 2)
            with pytest.raises(InvalidTransition, match="running cannot become paused"):
                await store.compare_and_swap("sb-1", 2, {"state": SandboxState.PAUSED})
            with pytest.raises(ValueError, match="owner"):
                await store.compare_and_swap("sb-1", 2, cast(Changes, {"owner": "team-b"}))
            with pytest.raises(NotFound):
                await store.compare_and_swap("nope", 1, {"state": SandboxState.RUNNING})
            assert await store.get("sb-1") == running

    run(scenario)


def test_get_recent_sees_every_write_of_its_own_store_at_once(tmp_path: Path) -> None:
    """The data plane's remembered read is never older than this store's last write of the record."""

    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            await store.insert(make())
            assert (await store.get_recent("sb-1", 60)).generation == 1  # type: ignore[union-attr]
            running = await store.compare_and_swap("sb-1", 1, {"state": SandboxState.RUNNING})
            assert await store.get_recent("sb-1", 60) == running
            longer = await store.extend_expiry("sb-1", 2, T0 + 2 * LIFETIME)
            assert await store.get_recent("sb-1", 60) == longer
            # A read in flight while a write is queued keeps nothing it read: the next one sees the write.
            seen, killing = await asyncio.gather(
                store.get_recent("sb-1", 60),
                store.compare_and_swap("sb-1", 3, {"state": SandboxState.KILLING}),
            )
            assert seen is not None
            assert seen.generation in (3, 4)
            assert await store.get_recent("sb-1", 60) == killing
            later = await store.extend_expiry("sb-1", 4, T0 + 3 * LIFETIME)  # forgotten: the next one reads
            # That read is queued before the delete and answers the record; it must not be kept.
            seen, _ = await asyncio.gather(store.get_recent("sb-1", 60), store.delete("sb-1", 5))
            assert seen == later
            assert await store.get_recent("sb-1", 60) is None

    run(scenario)


def test_get_recent_sees_another_process_write_within_its_age(tmp_path: Path) -> None:
    """Another writer of the same file (a second server) is seen once the remembered read is ``max_age_s`` old."""

    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as mine, await Store.open(tmp_path / "store.db") as other:
            await mine.insert(make())
            assert (await mine.get_recent("sb-1", 0.2)).state == "creating"  # type: ignore[union-attr]
            running = await other.compare_and_swap("sb-1", 1, {"state": SandboxState.RUNNING})
            assert (await mine.get_recent("sb-1", 0.2)).state == "creating"  # type: ignore[union-attr]
            assert await mine.get("sb-1") == running  # the plain read always goes to the file
            await asyncio.sleep(0.25)
            assert await mine.get_recent("sb-1", 0.2) == running
            await other.delete("sb-1", 2)
            await asyncio.sleep(0.25)
            assert await mine.get_recent("sb-1", 0.2) is None

    run(scenario)


def test_delete_is_fenced_by_generation(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            await store.insert(make())
            await store.compare_and_swap("sb-1", 1, {"state": SandboxState.KILLING})
            with pytest.raises(GenerationConflict):
                await store.delete("sb-1", 1)
            await store.delete("sb-1", 2)
            assert await store.get("sb-1") is None
            with pytest.raises(NotFound):
                await store.delete("sb-1", 2)

    run(scenario)


def test_extend_expiry_never_shortens(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            original = await store.insert(make(state="running"))
            for earlier in (original.expires_at, original.expires_at - timedelta(seconds=1)):
                same = await store.extend_expiry("sb-1", 1, earlier)  # succeeds, changes nothing
                assert same == original
            assert await store.get("sb-1") == original
            later = original.expires_at + timedelta(minutes=10)
            extended = await store.extend_expiry("sb-1", 1, later)
            assert (extended.expires_at, extended.generation) == (later, 2)
            with pytest.raises(GenerationConflict):
                await store.extend_expiry("sb-1", 1, later + timedelta(minutes=1))
            with pytest.raises(GenerationConflict):  # even a no-op extension names the generation it read
                await store.extend_expiry("sb-1", 1, T0)
            with pytest.raises(ValueError, match="timezone-aware"):
                await store.extend_expiry("sb-1", 2, datetime(2030, 1, 1))  # naive
            assert await store.get("sb-1") == extended

    run(scenario)


def test_expired_lists_running_sandboxes_past_their_expiry(tmp_path: Path) -> None:
    now = T0 + timedelta(hours=1)

    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            await store.insert(make("late", state="running", expires_at=now - timedelta(minutes=1)))
            await store.insert(make("later", state="running", expires_at=now - timedelta(minutes=30)))
            await store.insert(make("exactly", state="running", expires_at=now))
            await store.insert(make("alive", state="running", expires_at=now + timedelta(microseconds=1)))
            await store.insert(make("paused", state="paused", expires_at=now - timedelta(minutes=1)))
            await store.insert(make("killing", state="killing", expires_at=now - timedelta(minutes=1)))
            await store.insert(make("other-owner", owner="team-b", state="running", expires_at=now - timedelta(days=1)))
            expired = await store.expired(now)
            assert [record.sandbox_id for record in expired] == ["other-owner", "later", "late", "exactly"]
            assert [record.sandbox_id for record in await store.expired(now, limit=2)] == ["other-owner", "later"]

    run(scenario)


# --- concurrency ------------------------------------------------------------------------------


def _outcomes(results: Sequence[SandboxRecord | BaseException]) -> tuple[list[SandboxRecord], list[BaseException]]:
    won = [result for result in results if isinstance(result, SandboxRecord)]
    lost = [result for result in results if isinstance(result, BaseException)]
    return won, lost


def test_two_concurrent_swaps_from_one_generation_have_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def scenario() -> None:
        async with await Store.open(path) as a, await Store.open(path) as b:
            for round_ in range(20):
                sandbox_id = f"sb-{round_}"
                await a.insert(make(sandbox_id, state="running"))
                results = await asyncio.gather(
                    a.compare_and_swap(sandbox_id, 1, {"state": SandboxState.PAUSING}),
                    b.compare_and_swap(sandbox_id, 1, {"state": SandboxState.KILLING}),
                    return_exceptions=True,
                )
                won, lost = _outcomes(results)
                assert len(won) == 1, results
                assert len(lost) == 1, results
                assert isinstance(lost[0], GenerationConflict), results
                assert await a.get(sandbox_id) == won[0] == await b.get(sandbox_id)
                assert won[0].generation == 2

    run(scenario)


def test_the_generation_fence_holds_when_both_writers_read_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers read generation 1 before either writes: the UPDATE's WHERE alone picks the winner."""
    path = tmp_path / "store.db"

    async def scenario() -> None:
        barrier = asyncio.Barrier(2)
        async with await Store.open(path) as a, await Store.open(path) as b:
            for store in (a, b):
                read = store._at_generation

                async def read_then_wait(
                    sandbox_id: str,
                    expected: int,
                    read: Callable[[str, int], Coroutine[Any, Any, SandboxRecord]] = read,
                ) -> SandboxRecord:
                    record = await read(sandbox_id, expected)
                    await barrier.wait()
                    return record

                monkeypatch.setattr(store, "_at_generation", read_then_wait)
            await a.insert(make(state="running"))
            results = await asyncio.gather(
                a.compare_and_swap("sb-1", 1, {"state": SandboxState.KILLING}),
                b.extend_expiry("sb-1", 1, T0 + timedelta(hours=1)),
                return_exceptions=True,
            )
            won, lost = _outcomes(results)
            assert len(won) == 1, results
            assert len(lost) == 1, results
            assert isinstance(lost[0], GenerationConflict), results
            assert lost[0].current == 2
            assert await a.get("sb-1") == won[0]

    run(scenario)


def test_the_reaper_cannot_kill_a_sandbox_extended_after_it_looked(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    now = T0 + LIFETIME + timedelta(seconds=1)

    async def scenario() -> None:
        async with await Store.open(path) as server, await Store.open(path) as reaper:
            await server.insert(make(state="running"))
            [due] = await reaper.expired(now)
            extended = await server.extend_expiry("sb-1", due.generation, now + LIFETIME)  # a refresh arrives
            with pytest.raises(GenerationConflict):
                await reaper.compare_and_swap("sb-1", due.generation, {"state": SandboxState.KILLING})
            assert await reaper.get("sb-1") == extended
            assert extended.state == "running"
            assert await reaper.expired(now) == []

    run(scenario)


def test_a_refresh_after_the_reaper_won_fails(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    now = T0 + LIFETIME + timedelta(seconds=1)

    async def scenario() -> None:
        async with await Store.open(path) as server, await Store.open(path) as reaper:
            seen = await server.insert(make(state="running"))
            [due] = await reaper.expired(now)
            killing = await reaper.compare_and_swap("sb-1", due.generation, {"state": SandboxState.KILLING})
            with pytest.raises(GenerationConflict):
                await server.extend_expiry("sb-1", seen.generation, now + LIFETIME)
            assert await server.get("sb-1") == killing

    run(scenario)


def test_the_reaper_and_a_refresh_racing_have_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    now = T0 + LIFETIME + timedelta(seconds=1)

    async def scenario() -> None:
        async with await Store.open(path) as server, await Store.open(path) as reaper:
            for round_ in range(20):
                sandbox_id = f"sb-{round_}"
                await server.insert(make(sandbox_id, state="running"))
                due = next(record for record in await reaper.expired(now) if record.sandbox_id == sandbox_id)
                results = await asyncio.gather(
                    server.extend_expiry(sandbox_id, due.generation, now + LIFETIME),
                    reaper.compare_and_swap(sandbox_id, due.generation, {"state": SandboxState.KILLING}),
                    return_exceptions=True,
                )
                won, lost = _outcomes(results)
                assert len(won) == 1, results
                assert len(lost) == 1, results
                assert isinstance(lost[0], GenerationConflict), results
                final = await server.get(sandbox_id)
                assert final == won[0]
                assert (final.state == "killing") != (final.expires_at > now)

    run(scenario)


# --- listing and pagination -------------------------------------------------------------------


def test_list_filters_by_owner_state_and_every_metadata_pair(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            await store.insert(make("a", metadata={"env": "prod", "team": "x"}, state="running"))
            await store.insert(make("b", metadata={"env": "prod"}, state="paused"))
            await store.insert(make("c", metadata={"env": "dev", "team": "x", 'odd.key"[0]': "v"}, state="running"))
            await store.insert(make("d", state="killed"))
            await store.insert(make("e", owner="team-b", metadata={"env": "prod"}, state="running"))

            async def ids(**query: Any) -> list[str]:
                page = await store.list("team-a", **query)
                assert page.next_token is None
                return [record.sandbox_id for record in page.records]

            assert await ids() == ["a", "b", "c", "d"]
            assert await ids(metadata={"env": "prod"}) == ["a", "b"]
            assert await ids(metadata={"env": "prod", "team": "x"}) == ["a"]
            assert await ids(metadata={"team": "x"}) == ["a", "c"]
            assert await ids(metadata={'odd.key"[0]': "v"}) == ["c"]
            assert await ids(metadata={"env": "staging"}) == []
            assert await ids(metadata={"missing": ""}) == []
            assert await ids(states={"running"}) == ["a", "c"]
            assert await ids(states={"running", "paused"}, metadata={"env": "prod"}) == ["a", "b"]
            assert await ids(states=set()) == []
            with pytest.raises(ValueError, match="sleeping"):
                await store.list("team-a", states={"sleeping"})
            with pytest.raises(ValueError, match="limit"):
                await store.list("team-a", limit=0)

    run(scenario)


records_to_page = st.lists(
    st.tuples(
        st.text(alphabet="abc0123456789", min_size=1, max_size=3),  # sandbox id
        st.sampled_from(["team-a", "team-b"]),
        st.integers(0, 3),  # minutes after T0: many ties, so the sandbox id must break them
        st.sampled_from(sorted(STATES)),
    ),
    max_size=25,
    unique_by=lambda entry: entry[0],
)


@settings(max_examples=30, deadline=None)
@given(
    entries=records_to_page,
    page_size=st.integers(1, 8),
    states=st.none() | st.sets(st.sampled_from(sorted(STATES)), min_size=1),
)
def test_pagination_walks_every_record_exactly_once(
    entries: list[tuple[str, str, int, str]], page_size: int, states: set[str] | None
) -> None:
    expected = sorted(
        (T0 + timedelta(minutes=minutes), sandbox_id)
        for sandbox_id, owner, minutes, state in entries
        if owner == "team-a" and (states is None or state in states)
    )

    async def scenario(path: Path) -> None:
        async with await Store.open(path) as store:
            for sandbox_id, owner, minutes, state in entries:
                await store.insert(
                    make(sandbox_id, owner=owner, state=state, created_at=T0 + timedelta(minutes=minutes))
                )
            walked: list[tuple[datetime, str]] = []
            token: str | None = None
            for _ in range(len(entries) + 2):
                page = await store.list("team-a", states=states, limit=page_size, after=token)
                walked.extend((record.created_at, record.sandbox_id) for record in page.records)
                if page.next_token is None:
                    assert len(page.records) <= page_size
                    break
                assert len(page.records) == page_size
                token = page.next_token
            else:
                pytest.fail("pagination did not end")
            assert walked == expected

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder) / "store.db"))


def _b64(raw_bytes: bytes) -> str:
    return base64.urlsafe_b64encode(raw_bytes).decode().rstrip("=")


MALFORMED_CURSORS = {
    "empty": "",
    "not base64": "not base64!",
    "impossible length": "a",
    "padding": _b64(b'["2026-01-01T00:00:00.000000Z","sb-1"]') + "==",
    "standard alphabet": "+/+/",
    "not JSON": _b64(b"hello"),
    "not UTF-8": _b64(b"\xff\xfe"),
    "one part": _b64(b'["2026-01-01T00:00:00.000000Z"]'),
    "numbers": _b64(b"[1, 2]"),
    "empty id": _b64(b'["2026-01-01T00:00:00.000000Z", ""]'),
    "not a timestamp": _b64(b'["2026-01-01", "sb-1"]'),
    "an object": _b64(b'{"created_at": "2026-01-01T00:00:00.000000Z", "sandbox_id": "sb-1"}'),
    "huge": "A" * 4096,
}


@pytest.mark.parametrize("token", list(MALFORMED_CURSORS.values()), ids=list(MALFORMED_CURSORS))
def test_a_malformed_cursor_is_refused(token: str) -> None:
    with pytest.raises(InvalidCursor, match="Invalid pagination cursor"):
        decode_cursor(token)


def test_the_store_refuses_a_malformed_cursor(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Store.open(tmp_path / "store.db") as store:
            with pytest.raises(InvalidCursor):
                await store.list("team-a", after=MALFORMED_CURSORS["not JSON"])

    run(scenario)


@given(st.text(max_size=64) | st.binary(max_size=48).map(_b64))
def test_decoding_any_token_either_works_or_is_an_invalid_cursor(token: str) -> None:
    with contextlib.suppress(InvalidCursor):
        decode_cursor(token)


def test_a_cursor_is_the_last_key() -> None:
    record = make("sb-é")
    assert decode_cursor(encode_cursor(record)) == ("2026-01-01T00:00:00.000000Z", "sb-é")


# --- crash safety ---------------------------------------------------------------------------

CRASHING_WRITER = """
import asyncio, os, signal, sqlite3, sys
from datetime import UTC, datetime, timedelta
from reference_server._records import SandboxRecord
from reference_server._store import Store

def make(sandbox_id):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return SandboxRecord(sandbox_id=sandbox_id, owner="team-a", template_id="base", state="creating",
                         created_at=t0, expires_at=t0 + timedelta(minutes=5))

async def main(path, count):
    store = await Store.open(path)
    for i in range(count):
        await store.insert(make(f"sb-{i:03d}"))
    await store.compare_and_swap("sb-000", 1, {"state": "running"})
    other = sqlite3.connect(path, isolation_level=None)  # a writer caught in the middle of a transaction
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO sandboxes (record) VALUES (?)", (make("uncommitted").to_json(),))
    print("committed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def test_records_committed_before_a_kill_survive_it(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    count = 50
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(path), str(count)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert crashed.stdout == "committed\n"
    assert Path(f"{path}-wal").stat().st_size > 0  # the commits sit in the WAL, never checkpointed

    async def scenario() -> None:
        async with await Store.open(path) as store:
            assert store.migrated == ()
            page = await store.list("team-a", limit=1000)
            assert [record.sandbox_id for record in page.records] == [f"sb-{i:03d}" for i in range(count)]
            first = await store.get("sb-000")
            assert first is not None
            assert (first.state, first.generation) == ("running", 2)
            assert await store.get("uncommitted") is None
            await store.insert(make("after-the-crash"))  # the lock died with the process

    run(scenario)


def test_a_copy_of_the_files_taken_mid_wal_has_every_commit(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    copy = tmp_path / "copy" / "store.db"
    copy.parent.mkdir()

    async def scenario() -> None:
        async with await Store.open(path) as store:
            for i in range(10):
                record = await store.insert(make(f"sb-{i}"))
                await store.compare_and_swap(record.sandbox_id, 1, {"state": SandboxState.RUNNING})
            assert Path(f"{path}-wal").stat().st_size > 0
            shutil.copyfile(path, copy)  # as a power cut would leave them: database and WAL, no clean close
            shutil.copyfile(f"{path}-wal", f"{copy}-wal")
            expected = (await store.list("team-a")).records
        async with await Store.open(copy) as recovered:
            assert (await recovered.list("team-a")).records == expected
            assert {record.state for record in expected} == {"running"}

    run(scenario)
