"""Versioned schema migrations for the store, and the refusal to run on a history we do not know.

The database outlives any one server binary, so its schema is changed only by migrations, and the
migrations are data: an ordered tuple of (version, name, sql). Each database records what was
applied to it in ``schema_migrations`` with a checksum of the SQL. On open, the missing migrations
are applied in order, each in its own transaction (DDL is transactional in SQLite, so a migration
that fails half-way leaves nothing behind), taken with ``BEGIN IMMEDIATE`` so that two servers
starting on the same file cannot both apply one.

A history this code does not know is refused with ``UnknownMigrationHistory`` rather than guessed
at: a version we have never heard of means a newer server wrote the file (its records may use
fields we would drop on the next write), a different checksum means an applied migration was edited
afterwards (the schema is not what the code believes), and a hole means someone skipped one.
Starting anyway could corrupt records, and records are the source of truth for real sandboxes.

Applied migrations are never edited: a schema change is a new migration. In particular the states
in migration 1's CHECK are literal SQL, not generated from the store's transition table, so that
changing the table in Python cannot silently change the checksum of an applied migration
(tests/reference_server/test_store.py checks that the two agree).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import aiosqlite


class UnknownMigrationHistory(Exception):  # noqa: N818 - the name says what was found; it is fatal, not a request error
    """The database's migration history is not a prefix of the migrations this server knows."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """sha256 of the SQL exactly as written: any edit, even to a comment, is a different migration."""
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AppliedMigration:
    """One row of ``schema_migrations``."""

    version: int
    name: str
    checksum: str
    applied_at: str


# The history table is not itself a migration: it has to exist before there is a history to read.
_HISTORY_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    checksum TEXT NOT NULL,
    applied_at TEXT NOT NULL
) STRICT
"""

# One JSON record per sandbox is the source of truth. The columns the server searches by are
# generated from it (so they can never disagree with it) and indexed; VIRTUAL keeps the record the
# only copy in the table, the indexes hold the extracted values. Generated columns of a STRICT
# table are not type-checked by SQLite, so each one carries a CHECK on the JSON type of its field.
# The expressions extract only from valid JSON: otherwise the extraction itself would fail before
# the CHECKs run, and malformed JSON would be reported as a query error instead of as the violated
# constraint. Timestamps are fixed-width UTC text (``2026-01-02T03:04:05.000006Z``), so text order
# is time order and the expiry and pagination comparisons can use the indexes.
_SANDBOXES = """
CREATE TABLE sandboxes (
    record TEXT NOT NULL
        CONSTRAINT record_is_a_json_object CHECK (json_valid(record) AND json_type(record) = 'object'),
    sandbox_id TEXT GENERATED ALWAYS AS (iif(json_valid(record), record ->> '$.sandbox_id', NULL)) VIRTUAL
        CONSTRAINT sandbox_id_is_a_nonempty_string
        CHECK (json_type(record, '$.sandbox_id') IS 'text' AND sandbox_id <> ''),
    owner TEXT GENERATED ALWAYS AS (iif(json_valid(record), record ->> '$.owner', NULL)) VIRTUAL
        CONSTRAINT owner_is_a_nonempty_string
        CHECK (json_type(record, '$.owner') IS 'text' AND owner <> ''),
    state TEXT GENERATED ALWAYS AS (iif(json_valid(record), record ->> '$.state', NULL)) VIRTUAL
        CONSTRAINT state_is_a_lifecycle_state
        CHECK (json_type(record, '$.state') IS 'text' AND state IN (
            'creating', 'running', 'pausing', 'paused', 'resuming', 'killing', 'killed', 'failed')),
    generation INTEGER GENERATED ALWAYS AS (iif(json_valid(record), record ->> '$.generation', NULL)) VIRTUAL
        CONSTRAINT generation_is_a_positive_integer
        CHECK (json_type(record, '$.generation') IS 'integer' AND generation >= 1),
    created_at TEXT GENERATED ALWAYS AS (iif(json_valid(record), record ->> '$.created_at', NULL)) VIRTUAL
        CONSTRAINT created_at_is_a_utc_timestamp
        CHECK (json_type(record, '$.created_at') IS 'text' AND created_at GLOB
            '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9][0-9][0-9][0-9]Z'),
    expires_at TEXT GENERATED ALWAYS AS (iif(json_valid(record), record ->> '$.expires_at', NULL)) VIRTUAL
        CONSTRAINT expires_at_is_a_utc_timestamp
        CHECK (json_type(record, '$.expires_at') IS 'text' AND expires_at GLOB
            '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9][0-9][0-9][0-9]Z'),
    CONSTRAINT metadata_is_an_object CHECK (json_type(record, '$.metadata') IS 'object')
) STRICT;

CREATE UNIQUE INDEX sandboxes_by_id ON sandboxes (sandbox_id);
CREATE INDEX sandboxes_by_owner ON sandboxes (owner, created_at, sandbox_id);
CREATE INDEX sandboxes_by_expiry ON sandboxes (state, expires_at);
"""

# API keys: only a salted PBKDF2 hash of each key is kept (``_credentials.hash_api_key``), found
# by its public ``key_id``. A revoked key keeps its row (revoked_at set) so its id is never
# reissued and the revocation can be audited.
_API_KEYS = """
CREATE TABLE api_keys (
    key_id TEXT PRIMARY KEY CHECK (key_id GLOB '[0-9a-f]*' AND length(key_id) BETWEEN 8 AND 64),
    owner TEXT NOT NULL CHECK (owner <> ''),
    hash TEXT NOT NULL CHECK (hash GLOB 'pbkdf2-sha256$*'),
    name TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    revoked_at TEXT
) STRICT;

CREATE INDEX api_keys_by_owner ON api_keys (owner, created_at);
"""

# Snapshots: a sandbox's writable layer captured as a template (the runtime holds the files).
# ``names`` is the JSON array the API reports; listing pages in (created_at, snapshot_id) order.
_SNAPSHOTS = """
CREATE TABLE snapshots (
    snapshot_id TEXT PRIMARY KEY CHECK (snapshot_id <> ''),
    owner TEXT NOT NULL CHECK (owner <> ''),
    sandbox_id TEXT NOT NULL CHECK (sandbox_id <> ''),
    template_id TEXT NOT NULL,
    names TEXT NOT NULL CHECK (json_valid(names) AND json_type(names) = 'array'),
    created_at TEXT NOT NULL
) STRICT;

CREATE INDEX snapshots_by_owner ON snapshots (owner, created_at, snapshot_id);
"""

# Template builds (``_templates``): an owner's named templates, their builds (a build's layer is
# the runtime's snapshot id of its filesystem, set once ready), ``name:tag`` pointers at builds,
# build logs in order, the per-owner step cache (a content key → the layer after those steps) and
# layers no record names any more, deleted from the runtime once nothing uses them.
_TEMPLATES = """
CREATE TABLE templates (
    template_id TEXT PRIMARY KEY CHECK (template_id <> ''),
    owner TEXT NOT NULL CHECK (owner <> ''),
    name TEXT NOT NULL CHECK (name <> ''),
    cpu_count INTEGER NOT NULL CHECK (cpu_count >= 1),
    memory_mb INTEGER NOT NULL CHECK (memory_mb >= 1),
    disk_mb INTEGER NOT NULL CHECK (disk_mb >= 0),
    public INTEGER NOT NULL CHECK (public IN (0, 1)),
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    spawn_count INTEGER NOT NULL DEFAULT 0,
    last_spawned_at TEXT
) STRICT;

CREATE UNIQUE INDEX templates_by_name ON templates (owner, name);

CREATE TABLE builds (
    build_id TEXT PRIMARY KEY CHECK (build_id <> ''),
    template_id TEXT NOT NULL REFERENCES templates (template_id),
    owner TEXT NOT NULL CHECK (owner <> ''),
    status TEXT NOT NULL CHECK (status IN ('waiting', 'building', 'ready', 'error')),
    cpu_count INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    finished_at TEXT,
    spec TEXT CHECK (spec IS NULL OR json_valid(spec)),
    layer TEXT,
    config TEXT CHECK (config IS NULL OR json_valid(config)),
    reason TEXT CHECK (reason IS NULL OR json_valid(reason)),
    requested_tags TEXT NOT NULL CHECK (json_valid(requested_tags) AND json_type(requested_tags) = 'array'),
    CHECK (status <> 'ready' OR (layer IS NOT NULL AND config IS NOT NULL))
) STRICT;

CREATE INDEX builds_by_template ON builds (template_id, created_at);
CREATE INDEX builds_unfinished ON builds (status);

CREATE TABLE tags (
    template_id TEXT NOT NULL REFERENCES templates (template_id),
    tag TEXT NOT NULL CHECK (tag <> ''),
    build_id TEXT NOT NULL REFERENCES builds (build_id),
    created_at TEXT NOT NULL,
    PRIMARY KEY (template_id, tag)
) STRICT;

CREATE TABLE build_logs (
    build_id TEXT NOT NULL REFERENCES builds (build_id),
    seq INTEGER NOT NULL CHECK (seq >= 0),
    timestamp TEXT NOT NULL,
    level TEXT NOT NULL CHECK (level IN ('debug', 'info', 'warn', 'error')),
    message TEXT NOT NULL,
    step TEXT,
    PRIMARY KEY (build_id, seq)
) STRICT;

CREATE TABLE build_cache (
    owner TEXT NOT NULL CHECK (owner <> ''),
    key TEXT NOT NULL CHECK (length(key) = 64),
    layer TEXT NOT NULL CHECK (layer <> ''),
    config TEXT NOT NULL CHECK (json_valid(config)),
    created_at TEXT NOT NULL,
    PRIMARY KEY (owner, key)
) STRICT;

CREATE TABLE retired_layers (
    layer TEXT PRIMARY KEY CHECK (layer <> '')
) STRICT;
"""

# Volumes (``_volumes``): an owner's named volumes, their sealed content-API token and size. The
# state orders a crash: ``creating`` until the files exist, ``deleting`` once their removal began
# (start-up finishes both); only ``ready`` volumes are mounted or served.
_VOLUMES = """
CREATE TABLE volumes (
    volume_id TEXT PRIMARY KEY CHECK (volume_id <> ''),
    owner TEXT NOT NULL CHECK (owner <> ''),
    name TEXT NOT NULL CHECK (name <> ''),
    token TEXT NOT NULL CHECK (json_valid(token) AND json_type(token) = 'object'),
    size_mb INTEGER NOT NULL CHECK (size_mb >= 16),
    state TEXT NOT NULL CHECK (state IN ('creating', 'ready', 'deleting')),
    created_at TEXT NOT NULL
) STRICT;

CREATE UNIQUE INDEX volumes_by_name ON volumes (owner, name);
CREATE INDEX volumes_by_owner ON volumes (owner, created_at, volume_id);
"""

# Idempotent creates (``_idempotency``): an owner's ``Idempotency-Key``, the fingerprint of the body
# it was first sent with and, once that create succeeded, the sandbox it made (NULL while pending).
_CREATE_KEYS = """
CREATE TABLE create_keys (
    owner TEXT NOT NULL CHECK (owner <> ''),
    key TEXT NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint TEXT NOT NULL CHECK (length(fingerprint) = 64),
    sandbox_id TEXT CHECK (sandbox_id IS NULL OR sandbox_id <> ''),
    created_at TEXT NOT NULL,
    PRIMARY KEY (owner, key)
) STRICT;

CREATE INDEX create_keys_by_age ON create_keys (created_at);
"""

# Append only; never edit an entry once a server has shipped with it.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "sandboxes", _SANDBOXES),
    Migration(2, "api_keys", _API_KEYS),
    Migration(3, "snapshots", _SNAPSHOTS),
    Migration(4, "templates", _TEMPLATES),
    Migration(5, "volumes", _VOLUMES),
    Migration(6, "create_keys", _CREATE_KEYS),
)


def split_statements(sql: str) -> list[str]:
    """Split a migration into single statements at the semicolons SQLite says end one.

    Python's ``executescript`` would commit the open transaction first, so a migration's statements
    are run one by one inside it instead. ``sqlite3.complete_statement`` knows about string literals,
    comments and trigger bodies, so only real statement ends split.
    """
    statements: list[str] = []
    start = 0
    for end, char in enumerate(sql):
        if char == ";" and sqlite3.complete_statement(sql[start : end + 1]):
            statements.append(sql[start : end + 1].strip())
            start = end + 1
    rest = [line for line in sql[start:].splitlines() if line.strip() and not line.strip().startswith("--")]
    if rest:
        raise ValueError(f"migration SQL does not end with a complete statement: {rest[0].strip()[:60]!r}")
    return statements


def check_sequence(migrations: Sequence[Migration]) -> None:
    """The code's own list must be numbered 1, 2, 3, … with names; anything else is a programming error."""
    versions = [migration.version for migration in migrations]
    if versions != list(range(1, len(migrations) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3, … in order, got {versions}")
    for migration in migrations:
        if not migration.name or not split_statements(migration.sql):
            raise ValueError(f"migration {migration.version} needs a name and at least one statement")


def pending(history: Sequence[AppliedMigration], known: Sequence[Migration], *, database: str) -> list[Migration]:
    """What to apply to a database with ``history``; raises on any history that is not ours."""
    by_version = {migration.version: migration for migration in known}
    newest = known[-1].version if known else 0
    for applied in history:
        migration = by_version.get(applied.version)
        if migration is None:
            raise UnknownMigrationHistory(
                f"{database} has migration {applied.version} ({applied.name!r}, applied {applied.applied_at}), but "
                f"this server knows migrations up to {newest} only: the database was probably written by a newer "
                "server. Refusing to start rather than guess its schema; run the newer server or restore a backup."
            )
        if applied.checksum != migration.checksum:
            raise UnknownMigrationHistory(
                f"{database} has migration {applied.version} ({applied.name!r}) applied with checksum "
                f"{applied.checksum}, but this server's migration {migration.version} ({migration.name!r}) has "
                f"checksum {migration.checksum}: its SQL changed after it was applied. Refusing to start; an "
                "applied migration must never be edited (add a new one instead)."
            )
    versions = sorted(applied.version for applied in history)
    if versions != list(range(1, len(versions) + 1)):
        raise UnknownMigrationHistory(
            f"{database} has migrations {versions} applied: that history has a hole, which this server never "
            "writes. Refusing to start."
        )
    return list(known[len(versions) :])


async def read_history(db: aiosqlite.Connection) -> list[AppliedMigration]:
    rows = await db.execute_fetchall(
        "SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"
    )
    return [AppliedMigration(int(row[0]), str(row[1]), str(row[2]), str(row[3])) for row in rows]


async def migrate(
    db: aiosqlite.Connection, migrations: Sequence[Migration] = MIGRATIONS, *, database: str = "the database"
) -> tuple[int, ...]:
    """Apply the missing migrations in order, one transaction each; returns the versions applied now.

    ``db`` must be in autocommit mode (``isolation_level=None``): transactions here are explicit.
    The history is read again inside every transaction, under the write lock, so a server that
    starts concurrently and applies a migration first is noticed instead of repeated.
    """
    check_sequence(migrations)
    applied_now: list[int] = []
    while True:
        await db.execute("BEGIN IMMEDIATE")
        try:
            await db.execute(_HISTORY_TABLE)
            todo = pending(await read_history(db), migrations, database=database)
            if not todo:
                await db.execute("COMMIT")
                return tuple(applied_now)
            migration = todo[0]
            for statement in split_statements(migration.sql):
                await db.execute(statement)
            await db.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
                (migration.version, migration.name, migration.checksum, datetime.now(UTC).isoformat()),
            )
            await db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                await db.execute("ROLLBACK")
            raise
        applied_now.append(migration.version)
