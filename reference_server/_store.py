"""The reference server's durable store: one JSON record per sandbox, in SQLite.

A server killed at any point must restart with no lost records and no orphaned sandboxes
(docs/ARCHITECTURE.md, "Crash safety"), so everything the control plane knows about a sandbox lives here, not in memory.

- **The JSON record is the source of truth.** The columns the server searches by (owner, state,
  expiry, generation, creation order) are generated from it and indexed, so they cannot disagree
  with it; the table is STRICT with CHECKs, so even a raw-SQL write cannot store a record the
  server could not read back (schema: ``_migrations``).
- **Every change is a compare-and-swap on ``generation``.** A writer names the generation it read;
  the UPDATE matches only that generation and bumps it by one. Of two writers starting from the same
  generation (two requests, a request and the expiry reaper, two server processes on one file)
  exactly one wins and the other gets ``GenerationConflict`` and must re-read. The same number
  fences stale route leases: a lease taken at generation *n* is void once the record moves on.
- **Each operation is one statement in autocommit mode.** The generation check makes a separate
  read-modify-write transaction unnecessary (if the row still has the generation that was read,
  nothing else changed it), so no connection holds SQLite's write lock across an ``await``.
- **One read may be answered from memory**: ``get_recent``, the data plane's per-request lookup.
  It answers a record this store read less than ``RECENT_S`` ago, unless this store has written
  it since; another process writing the same file is seen within ``RECENT_S``. Every other read
  goes to SQLite.
- **SQLite settings**: WAL (readers never block the writer, and a commit is one append),
  ``synchronous=FULL`` (a commit survives power loss, not only a crash: lifecycle writes are rare,
  losing one would orphan a sandbox), ``foreign_keys=ON`` (off by default in SQLite, per
  connection), ``busy_timeout`` (a writer on another connection waits for the lock instead of
  failing at once).

Exceptions::

    StoreError
    ├── NotFound             no record with that id
    ├── AlreadyExists        insert of an id that is taken
    ├── GenerationConflict   the record changed since the caller read it (carries the current generation)
    ├── InvalidTransition    the lifecycle table does not allow that state change
    └── InvalidCursor        a pagination token this store did not make
    UnknownMigrationHistory  (``_migrations``) the database was written by code we do not know: refuse to start
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import re
import sqlite3
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypedDict

import aiosqlite

from ._migrations import MIGRATIONS, Migration, migrate
from ._records import (
    EXPIRING_STATES,
    STATES,
    TRANSITIONS,
    SandboxDetails,
    SandboxRecord,
    SandboxState,
    format_time,
    parse_time,
)

__all__ = [
    "AlreadyExists",
    "Changes",
    "GenerationConflict",
    "InvalidCursor",
    "InvalidTransition",
    "NotFound",
    "Page",
    "Store",
    "StoreError",
    "check_transition",
    "decode_cursor",
    "decode_page_key",
    "encode_cursor",
    "encode_page_key",
]


class StoreError(Exception):
    """Base of the errors a store operation reports; handlers map each to an upstream answer."""


# The names say the outcome a handler answers with (404, 409, 400), as in the upstream error table.
class NotFound(StoreError):  # noqa: N818
    pass


class AlreadyExists(StoreError):  # noqa: N818
    pass


class GenerationConflict(StoreError):  # noqa: N818
    def __init__(self, sandbox_id: str, expected: int, current: int) -> None:
        super().__init__(f"sandbox {sandbox_id} is at generation {current}, not {expected}: re-read and retry")
        self.sandbox_id = sandbox_id
        self.expected = expected
        self.current = current


class InvalidTransition(StoreError):  # noqa: N818
    pass


class InvalidCursor(StoreError):  # noqa: N818
    def __init__(self) -> None:
        super().__init__("Invalid pagination cursor")


def check_transition(current: str, new: str) -> None:
    """Raise ``InvalidTransition`` unless the table allows ``current`` → ``new`` (or they are equal)."""
    if new not in STATES:
        raise InvalidTransition(f"unknown sandbox state {new!r} (known: {', '.join(sorted(STATES))})")
    allowed_next = TRANSITIONS[SandboxState(current)]
    if new != current and new not in allowed_next:
        allowed = ", ".join(sorted(allowed_next)) or "nothing: it is terminal"
        raise InvalidTransition(f"a sandbox that is {current} cannot become {new} (it may become: {allowed})")


class Changes(TypedDict, total=False):
    """What a compare-and-swap may change; identity, owner, creation time and generation never change."""

    state: SandboxState
    expires_at: datetime
    metadata: dict[str, str]
    env_vars: dict[str, str]
    auto_pause: bool
    details: SandboxDetails


_CHANGEABLE = frozenset(Changes.__annotations__)


@dataclass(frozen=True)
class Page:
    records: tuple[SandboxRecord, ...]
    next_token: str | None  # for ``x-next-token``; None on the last page


_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,1024}")


def encode_page_key(created_at: datetime, key: str, *, descending: bool = False) -> str:
    """A page cursor: the (creation time, id) sort key of a page's last row, as unpadded URL-safe base64.

    A cursor of a newest-first list also says so: it is a position in that order only.
    """
    parts = [format_time(created_at), key, *(["desc"] if descending else [])]
    text = json.dumps(parts, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def _decode_key(token: str) -> list[str]:
    if not _CURSOR.fullmatch(token):
        raise InvalidCursor
    try:
        key = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8"))
        if not isinstance(key, list) or len(key) not in (2, 3) or not all(isinstance(p, str) and p for p in key):
            raise InvalidCursor
        if len(key) == 3 and key[2] != "desc":
            raise InvalidCursor
        parse_time(key[0])
    except (ValueError, binascii.Error):  # also JSON and UTF-8 decoding errors
        raise InvalidCursor from None
    return key


def decode_page_key(token: str) -> tuple[str, str]:
    """The sort key of an oldest-first cursor made by ``encode_page_key``; ``InvalidCursor`` for anything else."""
    key = _decode_key(token)
    if len(key) != 2:
        raise InvalidCursor
    return key[0], key[1]


def encode_cursor(record: SandboxRecord, *, descending: bool = False) -> str:
    return encode_page_key(record.created_at, record.sandbox_id, descending=descending)


def decode_cursor(token: str, *, descending: bool = False) -> tuple[str, str]:
    """The sort key of a sandbox list cursor of that order; ``InvalidCursor`` for one of the other order."""
    key = _decode_key(token)
    if (len(key) == 3) != descending:
        raise InvalidCursor
    return key[0], key[1]


_GET = "SELECT record FROM sandboxes WHERE sandbox_id = ?"
_INSERT = "INSERT INTO sandboxes (record) VALUES (?)"
_UPDATE = "UPDATE sandboxes SET record = ? WHERE sandbox_id = ? AND generation = ?"
_DELETE = "DELETE FROM sandboxes WHERE sandbox_id = ? AND generation = ?"
# The filters are JSON parameters (json_each), so the SQL is the same text whatever is asked: no SQL
# is ever assembled from input. A metadata filter matches when no wanted pair is missing from the
# record. A sandbox's start (``startedAfter``) is when it first ran (``started_at``, the time the
# API reports, in the same fixed-width UTC text as ``created_at``), or its creation before that.
_FILTERS = """
  AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:started_after IS NULL OR coalesce(record ->> '$.data.started_at', created_at) >= :started_after)
  AND (:template IS NULL OR record ->> '$.template_id' = :template)
  AND NOT EXISTS (
      SELECT 1 FROM json_each(:metadata) AS wanted
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(sandboxes.record, '$.metadata') AS have
          WHERE have.key = wanted.key AND have.value = wanted.value))
"""
# Pages run oldest first above a cursor (without one from ('', ''), below every key) or newest
# first below one (from ('~', ''), above every timestamp): range scans of (owner, created_at,
# sandbox_id) for first and later pages alike.
_LIST = f"""
SELECT record FROM sandboxes
WHERE owner = :owner
  AND (created_at, sandbox_id) > (:after_created_at, :after_sandbox_id){_FILTERS}
ORDER BY created_at, sandbox_id
LIMIT :limit
"""  # noqa: S608 - constant text only
_LIST_NEWEST_FIRST = f"""
SELECT record FROM sandboxes
WHERE owner = :owner
  AND (created_at, sandbox_id) < (:after_created_at, :after_sandbox_id){_FILTERS}
ORDER BY created_at DESC, sandbox_id DESC
LIMIT :limit
"""  # noqa: S608 - constant text only
_ALL = """
SELECT record FROM sandboxes
WHERE :states IS NULL OR state IN (SELECT value FROM json_each(:states))
ORDER BY created_at, sandbox_id
"""
_EXPIRED = """
SELECT record FROM sandboxes
WHERE state IN (SELECT value FROM json_each(:states)) AND expires_at <= :now
ORDER BY expires_at, sandbox_id
LIMIT :limit
"""


_SQLITE_NEEDED = (3, 38, 0)


RECENT_S = 1.0  # how long ``get_recent`` may answer a record from memory
_RECENT_MAX = 4096  # records remembered at most; past that the memory starts again empty


class Store:
    """The sandbox records of one SQLite file. Make one with ``await Store.open(path)``."""

    def __init__(self, db: aiosqlite.Connection, path: Path, migrated: tuple[int, ...]) -> None:
        self._db = db
        self.path = path
        self.migrated = migrated  # the migration versions this open applied (empty when up to date)
        # get_recent's memory: id -> (monotonic time read, record). ``_writes`` counts the writes
        # this store queued: a read that saw it move may have read what a write then replaced.
        self._recent: dict[str, tuple[float, SandboxRecord]] = {}
        self._writes = 0

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 5000,
        migrations: Sequence[Migration] = MIGRATIONS,
    ) -> Store:
        """Open (creating if needed) and migrate; raises ``UnknownMigrationHistory`` on a history we do not know."""
        if sqlite3.sqlite_version_info < _SQLITE_NEEDED:
            raise StoreError(
                f"the store needs SQLite 3.38 or later (STRICT, ->>), this Python has {sqlite3.sqlite_version}"
            )
        path = Path(path)
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")  # before WAL: switching takes a lock
            mode = await _switch_to_wal(db, busy_timeout_ms)
            if [tuple(row) for row in mode] != [("wal",)]:
                raise StoreError(f"{path}: SQLite refused WAL mode (journal_mode is {list(mode)})")
            await db.execute("PRAGMA synchronous = FULL")
            await db.execute("PRAGMA foreign_keys = ON")
            migrated = await migrate(db, migrations, database=str(path))
        except BaseException:
            await db.close()
            raise
        return cls(db, path, migrated)

    @property
    def db(self) -> aiosqlite.Connection:
        """The connection, for the other tables of this database (API keys, snapshots)."""
        return self._db

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        rows = list(await self._db.execute_fetchall(_GET, (sandbox_id,)))
        return SandboxRecord.from_json(rows[0][0]) if rows else None

    async def get_recent(self, sandbox_id: str, max_age_s: float = RECENT_S) -> SandboxRecord | None:
        """``get``, from memory when this store read the record less than ``max_age_s`` ago and wrote none of it since.

        For the data plane's lookup on every proxied request, where a thread hop to SQLite and a
        JSON parse were a tenth of the edge's work. Safe to be ``max_age_s`` late about a change
        by another process only: its writes are not seen here before (this process's always are).
        """
        now = time.monotonic()
        remembered = self._recent.get(sandbox_id)
        if remembered is not None and now - remembered[0] < max_age_s:
            return remembered[1]
        writes = self._writes
        record = await self.get(sandbox_id)
        if record is None:
            self._recent.pop(sandbox_id, None)
        elif writes == self._writes:  # no write was queued meanwhile, so none came after this read
            if len(self._recent) >= _RECENT_MAX:
                self._recent.clear()
            self._recent[sandbox_id] = (now, record)
        return record

    def _writing(self, sandbox_id: str) -> None:
        """Called right before a write of ``sandbox_id`` is queued, with no ``await`` in between.

        One connection runs its statements in the order queued, so a read queued after this sees
        the write; one queued before may not, and ``get_recent`` keeps no record it read meanwhile.
        """
        self._writes += 1
        self._recent.pop(sandbox_id, None)

    async def insert(self, record: SandboxRecord) -> SandboxRecord:
        """Store a new record at generation 1 (whatever ``record.generation`` says); returns what was stored."""
        stored = replace(record, generation=1)
        try:
            self._writing(record.sandbox_id)
            await self._db.execute(_INSERT, (stored.to_json(),))
        except sqlite3.IntegrityError as exc:
            if exc.sqlite_errorname == "SQLITE_CONSTRAINT_UNIQUE":
                raise AlreadyExists(f"sandbox {record.sandbox_id} already exists") from None
            raise
        return stored

    async def compare_and_swap(self, sandbox_id: str, expected_generation: int, changes: Changes) -> SandboxRecord:
        """Apply ``changes`` if the record is still at ``expected_generation``; returns it at the next generation.

        A state change must be allowed by ``TRANSITIONS`` (``InvalidTransition`` otherwise, and nothing
        is written). ``GenerationConflict`` when another writer got there first; ``NotFound`` when gone.
        """
        unknown = set(changes) - _CHANGEABLE
        if unknown:
            raise ValueError(f"cannot change {sorted(unknown)} (changeable: {sorted(_CHANGEABLE)})")
        current = await self._at_generation(sandbox_id, expected_generation)
        if "state" in changes:
            check_transition(current.state, changes["state"])
        new = replace(current, **changes, generation=current.generation + 1)
        await self._swap(new, expected_generation)
        return new

    async def extend_expiry(self, sandbox_id: str, expected_generation: int, new_expires_at: datetime) -> SandboxRecord:
        """Move the expiry later, never earlier (E2B's refresh): an earlier one succeeds and changes nothing.

        A changed expiry is a compare-and-swap like any other, so an extension and the reaper's kill
        that both started from one generation cannot both succeed.
        """
        format_time(new_expires_at)  # rejects a naive datetime before comparing
        current = await self._at_generation(sandbox_id, expected_generation)
        if new_expires_at <= current.expires_at:
            return current
        new = replace(current, expires_at=new_expires_at, generation=current.generation + 1)
        await self._swap(new, expected_generation)
        return new

    async def delete(self, sandbox_id: str, expected_generation: int) -> None:
        self._writing(sandbox_id)
        cursor = await self._db.execute(_DELETE, (sandbox_id, expected_generation))
        if cursor.rowcount != 1:
            raise await self._why_not(sandbox_id, expected_generation)

    async def expired(self, now: datetime, *, limit: int | None = None) -> list[SandboxRecord]:
        """Records in an ``EXPIRING_STATES`` state whose expiry is at or before ``now``, soonest first.

        For the reaper, which then acts through ``compare_and_swap`` at each record's generation: a
        record extended meanwhile has moved on, and the reaper's swap fails.
        """
        rows = await self._db.execute_fetchall(
            _EXPIRED,
            {"states": json.dumps(sorted(EXPIRING_STATES)), "now": format_time(now), "limit": _limit(limit)},
        )
        return [SandboxRecord.from_json(row[0]) for row in rows]

    async def all(self, states: Collection[str] | None = None) -> list[SandboxRecord]:
        """Every owner's records (in ``states`` when given): for startup reconciliation and sweeps."""
        if states is not None and not set(states) <= STATES:
            raise ValueError(f"unknown sandbox states {sorted(set(states) - STATES)}")
        rows = await self._db.execute_fetchall(_ALL, {"states": None if states is None else json.dumps(sorted(states))})
        return [SandboxRecord.from_json(row[0]) for row in rows]

    async def list(
        self,
        owner: str,
        *,
        states: Collection[str] | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
        after: str | None = None,
        descending: bool = False,
        started_after: datetime | None = None,
        template_id: str | None = None,
    ) -> Page:
        """One page of ``owner``'s records in (created_at, sandbox_id) order, or its reverse.

        ``states``: any of them; ``metadata``: every given pair must match; ``started_after``: started
        (or, not started yet, created) then or later; ``template_id``: of that template; ``after``: a
        ``next_token`` from the previous page of the same order (``InvalidCursor`` for anything else).
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if states is not None and not set(states) <= STATES:
            raise ValueError(f"unknown sandbox states {sorted(set(states) - STATES)}")
        first = ("~", "") if descending else ("", "")
        after_key = decode_cursor(after, descending=descending) if after is not None else first
        rows = await self._db.execute_fetchall(
            _LIST_NEWEST_FIRST if descending else _LIST,
            {
                "owner": owner,
                "after_created_at": after_key[0],
                "after_sandbox_id": after_key[1],
                "states": None if states is None else json.dumps(sorted(states)),
                "started_after": None if started_after is None else format_time(started_after),
                "template": template_id,
                "metadata": json.dumps(dict(metadata or {})),
                "limit": limit + 1,  # one more tells whether there is a next page
            },
        )
        records = tuple(SandboxRecord.from_json(row[0]) for row in rows)
        if len(records) <= limit:
            return Page(records, None)
        return Page(records[:limit], encode_cursor(records[limit - 1], descending=descending))

    async def _at_generation(self, sandbox_id: str, expected_generation: int) -> SandboxRecord:
        current = await self.get(sandbox_id)
        if current is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        if current.generation != expected_generation:
            raise GenerationConflict(sandbox_id, expected_generation, current.generation)
        return current

    async def _swap(self, new: SandboxRecord, expected_generation: int) -> None:
        # The WHERE on generation is the fence: if another writer committed since our read, no row matches.
        self._writing(new.sandbox_id)
        cursor = await self._db.execute(_UPDATE, (new.to_json(), new.sandbox_id, expected_generation))
        if cursor.rowcount != 1:
            raise await self._why_not(new.sandbox_id, expected_generation)

    async def _why_not(self, sandbox_id: str, expected_generation: int) -> StoreError:
        current = await self.get(sandbox_id)
        if current is None:
            return NotFound(f"sandbox {sandbox_id} not found")
        return GenerationConflict(sandbox_id, expected_generation, current.generation)


async def _switch_to_wal(db: aiosqlite.Connection, busy_timeout_ms: int) -> list[Any]:
    """``PRAGMA journal_mode = WAL``, retried while another opener holds the lock.

    Changing the journal mode of a new file needs an exclusive lock, and SQLite answers "database
    is locked" at once instead of calling the busy handler when several connections try together
    (two servers starting on one new file): retry within the same time budget.
    """
    deadline = asyncio.get_running_loop().time() + busy_timeout_ms / 1000
    while True:
        try:
            return list(await db.execute_fetchall("PRAGMA journal_mode = WAL"))
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname != "SQLITE_BUSY" or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.01)


def _limit(limit: int | None) -> int:
    if limit is None:
        return -1  # SQLite: no limit
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit
