"""Snapshot records: which owner may start sandboxes from which captured writable layer.

The runtime keeps the files (``Backend.snapshot`` returns an id that works as a template); this
table says whose it is, which sandbox it came from, and the names the API reports. Pages are in
(created_at, snapshot_id) order with the same opaque cursor format as the sandbox list.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime

import aiosqlite

from ._records import format_time, parse_time
from ._store import AlreadyExists, decode_page_key, encode_page_key

__all__ = ["SnapshotPage", "SnapshotRecord", "SnapshotStore"]


@dataclass(frozen=True, kw_only=True)
class SnapshotRecord:
    snapshot_id: str
    owner: str
    sandbox_id: str
    template_id: str  # what the source sandbox was started from
    names: tuple[str, ...]
    created_at: datetime


@dataclass(frozen=True)
class SnapshotPage:
    records: tuple[SnapshotRecord, ...]
    next_token: str | None


# Constant SQL only: no statement is ever assembled from input.
_SELECT = "SELECT snapshot_id, owner, sandbox_id, template_id, names, created_at FROM snapshots"
_GET = _SELECT + " WHERE snapshot_id = ?"
_INSERT = (
    "INSERT INTO snapshots (snapshot_id, owner, sandbox_id, template_id, names, created_at) VALUES (?, ?, ?, ?, ?, ?)"
)
_LIST = (
    _SELECT  # noqa: S608 - constant text only
    + """
WHERE owner = :owner
  AND (:sandbox_id IS NULL OR sandbox_id = :sandbox_id)
  AND (:name IS NULL OR snapshot_id = :name OR EXISTS (
      SELECT 1 FROM json_each(snapshots.names) AS named
      WHERE named.value = :name
         OR (instr(:name, ':') = 0 AND substr(named.value, 1, instr(named.value || ':', ':') - 1) = :name)))
  AND (created_at, snapshot_id) > (:after_created_at, :after_snapshot_id)
ORDER BY created_at, snapshot_id
LIMIT :limit
"""
)


def _row(row: sqlite3.Row | tuple[object, ...]) -> SnapshotRecord:
    snapshot_id, owner, sandbox_id, template_id, names, created_at = tuple(row)
    decoded = json.loads(str(names))
    return SnapshotRecord(
        snapshot_id=str(snapshot_id),
        owner=str(owner),
        sandbox_id=str(sandbox_id),
        template_id=str(template_id),
        names=tuple(str(name) for name in decoded),
        created_at=parse_time(str(created_at)),
    )


class SnapshotStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def insert(self, record: SnapshotRecord) -> None:
        try:
            await self._db.execute(
                _INSERT,
                (
                    record.snapshot_id,
                    record.owner,
                    record.sandbox_id,
                    record.template_id,
                    json.dumps(list(record.names)),
                    format_time(record.created_at),
                ),
            )
        except sqlite3.IntegrityError:
            raise AlreadyExists(f"snapshot {record.snapshot_id} already exists") from None

    async def get(self, snapshot_id: str) -> SnapshotRecord | None:
        rows = list(await self._db.execute_fetchall(_GET, (snapshot_id,)))
        return _row(rows[0]) if rows else None

    async def delete(self, snapshot_id: str) -> bool:
        cursor = await self._db.execute("DELETE FROM snapshots WHERE snapshot_id = ?", (snapshot_id,))
        return cursor.rowcount == 1

    async def all_ids(self) -> set[str]:
        return {str(row[0]) for row in await self._db.execute_fetchall("SELECT snapshot_id FROM snapshots")}

    async def list(
        self,
        owner: str,
        *,
        sandbox_id: str | None = None,
        name: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> SnapshotPage:
        """One page of ``owner``'s snapshots; ``name``: its id, one of its names, or a name without its ``:tag``."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        after_key = decode_page_key(after) if after is not None else ("", "")
        rows = await self._db.execute_fetchall(
            _LIST,
            {
                "owner": owner,
                "sandbox_id": sandbox_id,
                "name": name,
                "after_created_at": after_key[0],
                "after_snapshot_id": after_key[1],
                "limit": limit + 1,
            },
        )
        records = tuple(_row(row) for row in rows)
        if len(records) <= limit:
            return SnapshotPage(records, None)
        return SnapshotPage(
            records[:limit], encode_page_key(records[limit - 1].created_at, records[limit - 1].snapshot_id)
        )
