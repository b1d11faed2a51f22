"""Template records: templates an owner built, their builds, tags, build logs and the step cache.

A *template* is an owner's name (``my-app``) with its resources; each ``POST /v3/templates``
asks for a new *build* of it. A build goes ``waiting`` (asked for, or queued) → ``building`` →
``ready`` or ``error``; only a ready build has a *layer* (the runtime's id of the captured
filesystem, a backend snapshot) and the *config* a sandbox of it starts with (user, working
directory, environment, start and ready commands). *Tags* point a ``name:tag`` at one build;
``name`` alone is ``name:default``. The *step cache* maps a chain of build steps (by content) to
the layer after them, so a later build with the same first steps starts from there. Layers that
nothing names any more are *retired*: deleted from the runtime once no sandbox uses them.

The table layout is migration 4 (``_migrations``). This store has its own SQLite connection to
the server's file: its writes that span several statements are transactions, and a transaction
on the connection the other stores share would take their statements in with it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import string
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import aiosqlite

from ._records import format_time, parse_time

__all__ = [
    "BUILD_STATES",
    "DEFAULT_TAG",
    "BuildConfig",
    "BuildLog",
    "BuildRecord",
    "BuildState",
    "Built",
    "CacheEntry",
    "TagRecord",
    "TemplateRecord",
    "TemplateStore",
    "new_build_id",
    "new_template_id",
]

BuildState = Literal["waiting", "building", "ready", "error"]
BUILD_STATES: tuple[BuildState, ...] = ("waiting", "building", "ready", "error")
DEFAULT_TAG = "default"
_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_template_id() -> str:
    """20 lowercase letters and digits, the shape of upstream's template ids."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))


def new_build_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class BuildConfig:
    """What a sandbox of a ready build starts with (the build's last user, workdir and env)."""

    user: str = "user"
    workdir: str | None = None  # None: the user's home
    env: Mapping[str, str] = field(default_factory=dict)
    start_cmd: str | None = None
    ready_cmd: str | None = None
    root: str = "base"  # the server template at the bottom of its layers (its memory floor applies)

    def to_dict(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "workdir": self.workdir,
            "env": dict(self.env),
            "start_cmd": self.start_cmd,
            "ready_cmd": self.ready_cmd,
            "root": self.root,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildConfig:
        env = data.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("build config env must map strings to strings")
        return cls(
            user=str(data.get("user") or "user"),
            workdir=None if data.get("workdir") is None else str(data["workdir"]),
            env=dict(env),
            start_cmd=None if data.get("start_cmd") is None else str(data["start_cmd"]),
            ready_cmd=None if data.get("ready_cmd") is None else str(data["ready_cmd"]),
            root=str(data.get("root") or "base"),
        )


@dataclass(frozen=True, kw_only=True)
class TemplateRecord:
    template_id: str
    owner: str
    name: str
    cpu_count: int
    memory_mb: int
    disk_mb: int
    public: bool
    created_at: datetime
    updated_at: datetime
    spawn_count: int = 0
    last_spawned_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    build_id: str
    template_id: str
    owner: str
    status: BuildState
    cpu_count: int
    memory_mb: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    spec: Mapping[str, Any] | None = None  # the build-start body, once started
    layer: str | None = None  # the runtime's layer, once ready
    config: BuildConfig | None = None  # once ready
    reason: Mapping[str, Any] | None = None  # {"message", "step"} once failed
    requested_tags: tuple[str, ...] = ()  # assigned when the build is ready


@dataclass(frozen=True)
class Built:
    """A ready build a sandbox can start from: its template, the build, its layer and config."""

    template: TemplateRecord
    build: BuildRecord
    layer: str
    config: BuildConfig


@dataclass(frozen=True)
class TagRecord:
    template_id: str
    tag: str
    build_id: str
    created_at: datetime


@dataclass(frozen=True)
class BuildLog:
    timestamp: datetime
    level: str
    message: str
    step: str | None = None


@dataclass(frozen=True)
class CacheEntry:
    key: str
    layer: str
    config: BuildConfig


# Constant SQL only: no statement is ever assembled from input.
_TEMPLATE_COLUMNS = (
    "template_id, owner, name, cpu_count, memory_mb, disk_mb, public, created_at, updated_at, "
    "spawn_count, last_spawned_at"
)
_BUILD_COLUMNS = (
    "build_id, template_id, owner, status, cpu_count, memory_mb, created_at, updated_at, finished_at, "
    "spec, layer, config, reason, requested_tags"
)


def _opt_time(value: object) -> datetime | None:
    return None if value is None else parse_time(str(value))


def _template_row(row: Sequence[Any]) -> TemplateRecord:
    return TemplateRecord(
        template_id=str(row[0]),
        owner=str(row[1]),
        name=str(row[2]),
        cpu_count=int(row[3]),
        memory_mb=int(row[4]),
        disk_mb=int(row[5]),
        public=bool(row[6]),
        created_at=parse_time(str(row[7])),
        updated_at=parse_time(str(row[8])),
        spawn_count=int(row[9]),
        last_spawned_at=_opt_time(row[10]),
    )


def _json(value: object) -> Any:
    return None if value is None else json.loads(str(value))


def _build_row(row: Sequence[Any]) -> BuildRecord:
    config = _json(row[11])
    status = str(row[3])
    if status not in BUILD_STATES:
        raise ValueError(f"unknown build state {status!r}")
    return BuildRecord(
        build_id=str(row[0]),
        template_id=str(row[1]),
        owner=str(row[2]),
        status=status,  # narrowed by the check above
        cpu_count=int(row[4]),
        memory_mb=int(row[5]),
        created_at=parse_time(str(row[6])),
        updated_at=parse_time(str(row[7])),
        finished_at=_opt_time(row[8]),
        spec=_json(row[9]),
        layer=None if row[10] is None else str(row[10]),
        config=None if config is None else BuildConfig.from_dict(config),
        reason=_json(row[12]),
        requested_tags=tuple(_json(row[13]) or ()),
    )


class TemplateStore:
    """Make one with ``await TemplateStore.open(path)`` on a file ``Store.open`` has migrated."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        # One connection, many tasks: a statement of one task between another's BEGIN and COMMIT
        # would join (or be refused by) that transaction, so every use takes this lock.
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_ms: int = 5000) -> TemplateStore:
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            await db.execute("PRAGMA synchronous = FULL")
            await db.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            await db.close()
            raise
        return cls(db)

    async def close(self) -> None:
        await self._db.close()

    async def _transaction(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, parameters in statements:
                    await self._db.execute(sql, parameters)
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            await self._db.execute("COMMIT")

    async def _execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        """One statement on its own; the rows it changed."""
        async with self._lock:
            cursor = await self._db.execute(sql, parameters)
            return int(cursor.rowcount)

    async def _fetchall(self, sql: str, parameters: Sequence[Any] = ()) -> list[Sequence[Any]]:
        async with self._lock:
            return [tuple(row) for row in await self._db.execute_fetchall(sql, parameters)]

    # -- templates -------------------------------------------------------------------

    async def template_by_name(self, owner: str, name: str) -> TemplateRecord | None:
        rows = await self._fetchall(
            f"SELECT {_TEMPLATE_COLUMNS} FROM templates WHERE owner = ? AND name = ?",  # noqa: S608 - constant
            (owner, name),
        )
        return _template_row(rows[0]) if rows else None

    async def template(self, template_id: str) -> TemplateRecord | None:
        rows = await self._fetchall(
            f"SELECT {_TEMPLATE_COLUMNS} FROM templates WHERE template_id = ?",  # noqa: S608 - constant
            (template_id,),
        )
        return _template_row(rows[0]) if rows else None

    async def templates(self, owner: str) -> list[TemplateRecord]:
        rows = await self._fetchall(
            f"SELECT {_TEMPLATE_COLUMNS} FROM templates WHERE owner = ? ORDER BY created_at, template_id",  # noqa: S608
            (owner,),
        )
        return [_template_row(row) for row in rows]

    async def insert_build(self, template: TemplateRecord | None, build: BuildRecord, *, new: bool) -> None:
        """A build, with its template when ``new`` (one transaction); ``sqlite3.IntegrityError`` on a taken name."""
        statements: list[tuple[str, Sequence[Any]]] = []
        if new:
            assert template is not None
            statements.append(
                (
                    f"INSERT INTO templates ({_TEMPLATE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                    (
                        template.template_id,
                        template.owner,
                        template.name,
                        template.cpu_count,
                        template.memory_mb,
                        template.disk_mb,
                        int(template.public),
                        format_time(template.created_at),
                        format_time(template.updated_at),
                        0,
                        None,
                    ),
                )
            )
        elif template is not None:
            statements.append(
                (
                    "UPDATE templates SET cpu_count = ?, memory_mb = ?, updated_at = ? WHERE template_id = ?",
                    (template.cpu_count, template.memory_mb, format_time(template.updated_at), template.template_id),
                )
            )
        statements.append(
            (
                f"INSERT INTO builds ({_BUILD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (
                    build.build_id,
                    build.template_id,
                    build.owner,
                    build.status,
                    build.cpu_count,
                    build.memory_mb,
                    format_time(build.created_at),
                    format_time(build.updated_at),
                    None,
                    None,
                    None,
                    None,
                    None,
                    json.dumps(list(build.requested_tags)),
                ),
            )
        )
        await self._transaction(statements)

    async def set_public(self, template_id: str, public: bool, now: datetime) -> None:
        await self._execute(
            "UPDATE templates SET public = ?, updated_at = ? WHERE template_id = ?",
            (int(public), format_time(now), template_id),
        )

    async def count_spawn(self, template_id: str, now: datetime) -> None:
        await self._execute(
            "UPDATE templates SET spawn_count = spawn_count + 1, last_spawned_at = ? WHERE template_id = ?",
            (format_time(now), template_id),
        )

    async def delete_template(self, template_id: str, retired: Sequence[str]) -> None:
        """The template with its builds, tags and logs; ``retired`` layers are queued for deletion."""
        statements: list[tuple[str, Sequence[Any]]] = [
            ("INSERT OR IGNORE INTO retired_layers (layer) VALUES (?)", (layer,)) for layer in retired
        ]
        statements += [
            (
                "DELETE FROM build_logs WHERE build_id IN (SELECT build_id FROM builds WHERE template_id = ?)",
                (template_id,),
            ),
            ("DELETE FROM tags WHERE template_id = ?", (template_id,)),
            ("DELETE FROM builds WHERE template_id = ?", (template_id,)),
            ("DELETE FROM templates WHERE template_id = ?", (template_id,)),
        ]
        await self._transaction(statements)

    # -- builds ------------------------------------------------------------------------

    async def build(self, build_id: str) -> BuildRecord | None:
        rows = await self._fetchall(
            f"SELECT {_BUILD_COLUMNS} FROM builds WHERE build_id = ?",  # noqa: S608 - constant
            (build_id,),
        )
        return _build_row(rows[0]) if rows else None

    async def builds(self, template_id: str) -> list[BuildRecord]:
        rows = await self._fetchall(
            f"SELECT {_BUILD_COLUMNS} FROM builds WHERE template_id = ? ORDER BY created_at, build_id",  # noqa: S608
            (template_id,),
        )
        return [_build_row(row) for row in rows]

    async def unfinished_builds(self) -> list[BuildRecord]:
        rows = await self._fetchall(
            f"SELECT {_BUILD_COLUMNS} FROM builds WHERE status IN ('waiting', 'building')",  # noqa: S608 - constant
        )
        return [_build_row(row) for row in rows]

    async def start_build(self, build_id: str, spec: Mapping[str, Any], now: datetime) -> bool:
        """Record the build's steps; False when it was started before (each build runs once)."""
        changed = await self._execute(
            "UPDATE builds SET spec = ?, updated_at = ? WHERE build_id = ? AND status = 'waiting' AND spec IS NULL",
            (json.dumps(spec), format_time(now), build_id),
        )
        return changed == 1

    async def set_building(self, build_id: str, now: datetime) -> None:
        await self._execute(
            "UPDATE builds SET status = 'building', updated_at = ? WHERE build_id = ? AND status = 'waiting'",
            (format_time(now), build_id),
        )

    async def fail_build(self, build_id: str, reason: Mapping[str, Any], now: datetime) -> bool:
        changed = await self._execute(
            "UPDATE builds SET status = 'error', reason = ?, updated_at = ?, finished_at = ? "
            "WHERE build_id = ? AND status IN ('waiting', 'building')",
            (json.dumps(reason), format_time(now), format_time(now), build_id),
        )
        return changed == 1

    async def finish_build(
        self, build: BuildRecord, layer: str, config: BuildConfig, tags: Sequence[str], now: datetime
    ) -> None:
        """Ready, with its tags moved onto it (a tag on an older build now names this one)."""
        stamp = format_time(now)
        statements: list[tuple[str, Sequence[Any]]] = [
            (
                "UPDATE builds SET status = 'ready', layer = ?, config = ?, updated_at = ?, finished_at = ? "
                "WHERE build_id = ? AND status = 'building'",
                (layer, json.dumps(config.to_dict()), stamp, stamp, build.build_id),
            )
        ]
        statements += [
            (
                "INSERT INTO tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, "
                "created_at = excluded.created_at",
                (build.template_id, tag, build.build_id, stamp),
            )
            for tag in tags
        ]
        await self._transaction(statements)

    # -- tags --------------------------------------------------------------------------

    async def tags(self, template_id: str) -> list[TagRecord]:
        rows = await self._fetchall(
            "SELECT template_id, tag, build_id, created_at FROM tags WHERE template_id = ? ORDER BY created_at, tag",
            (template_id,),
        )
        return [TagRecord(str(r[0]), str(r[1]), str(r[2]), parse_time(str(r[3]))) for r in rows]

    async def tag(self, template_id: str, tag: str) -> TagRecord | None:
        rows = await self._fetchall(
            "SELECT template_id, tag, build_id, created_at FROM tags WHERE template_id = ? AND tag = ?",
            (template_id, tag),
        )
        return (
            TagRecord(str(rows[0][0]), str(rows[0][1]), str(rows[0][2]), parse_time(str(rows[0][3]))) if rows else None
        )

    async def assign_tags(self, template_id: str, build_id: str, tags: Sequence[str], now: datetime) -> None:
        stamp = format_time(now)
        await self._transaction(
            [
                (
                    "INSERT INTO tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, "
                    "created_at = excluded.created_at",
                    (template_id, tag, build_id, stamp),
                )
                for tag in tags
            ]
        )

    async def remove_tags(self, template_id: str, tags: Sequence[str]) -> None:
        await self._transaction(
            [("DELETE FROM tags WHERE template_id = ? AND tag = ?", (template_id, tag)) for tag in tags]
        )

    # -- logs --------------------------------------------------------------------------

    async def append_logs(self, build_id: str, entries: Sequence[BuildLog]) -> None:
        """Entries after the build's last, numbered in one statement (no read of the count first)."""
        if not entries:
            return
        await self._transaction(
            [
                (
                    "INSERT INTO build_logs (build_id, seq, timestamp, level, message, step) "
                    "SELECT ?, COALESCE(MAX(seq), -1) + 1, ?, ?, ?, ? FROM build_logs WHERE build_id = ?",
                    (build_id, format_time(entry.timestamp), entry.level, entry.message, entry.step, build_id),
                )
                for entry in entries
            ]
        )

    async def logs(
        self,
        build_id: str,
        *,
        offset: int = 0,
        limit: int,
        levels: tuple[str, ...] | None = None,
        cursor: datetime | None = None,
        forward: bool = True,
    ) -> list[BuildLog]:
        """Entries in the order they came (newest first unless ``forward``), filtered in SQL.

        ``levels``: only these; ``cursor``: only entries at or after it (``forward``) or at or
        before it; ``offset`` and ``limit`` count the entries that pass. Timestamps are fixed-width
        text, so text order is time order.
        """
        where, args = ["build_id = ?"], [build_id]
        if levels is not None:
            where.append(f"level IN ({', '.join('?' for _ in levels)})")
            args += list(levels)
        if cursor is not None:
            where.append("timestamp >= ?" if forward else "timestamp <= ?")
            args.append(format_time(cursor))
        order = "ASC" if forward else "DESC"
        rows = await self._fetchall(
            f"SELECT timestamp, level, message, step FROM build_logs WHERE {' AND '.join(where)} "  # noqa: S608
            f"ORDER BY seq {order} LIMIT ? OFFSET ?",
            (*args, limit, offset),
        )
        return [
            BuildLog(parse_time(str(r[0])), str(r[1]), str(r[2]), None if r[3] is None else str(r[3])) for r in rows
        ]

    # -- the step cache and retired layers -------------------------------------------

    async def cached(self, owner: str, key: str) -> CacheEntry | None:
        rows = await self._fetchall(
            "SELECT key, layer, config FROM build_cache WHERE owner = ? AND key = ?", (owner, key)
        )
        if not rows:
            return None
        return CacheEntry(str(rows[0][0]), str(rows[0][1]), BuildConfig.from_dict(json.loads(str(rows[0][2]))))

    async def remember(self, owner: str, entry: CacheEntry, now: datetime, *, keep: int) -> list[str]:
        """Cache a layer under its key; returns the layers the oldest entries over ``keep`` held (retired)."""
        await self._execute(
            "INSERT INTO build_cache (owner, key, layer, config, created_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (owner, key) DO UPDATE SET layer = excluded.layer, config = excluded.config, "
            "created_at = excluded.created_at",
            (owner, entry.key, entry.layer, json.dumps(entry.config.to_dict()), format_time(now)),
        )
        rows = await self._fetchall(
            "SELECT key, layer FROM build_cache WHERE owner = ? ORDER BY created_at DESC, key LIMIT -1 OFFSET ?",
            (owner, keep),
        )
        evicted = [(str(r[0]), str(r[1])) for r in rows]
        if evicted:
            await self._transaction(
                [("DELETE FROM build_cache WHERE owner = ? AND key = ?", (owner, key)) for key, _layer in evicted]
                + [("INSERT OR IGNORE INTO retired_layers (layer) VALUES (?)", (layer,)) for _key, layer in evicted]
            )
        return [layer for _key, layer in evicted]

    async def layers_in_use(self) -> set[str]:
        """Every layer a ready build or a cache entry names: never to be deleted."""
        rows = await self._fetchall(
            "SELECT layer FROM builds WHERE layer IS NOT NULL UNION SELECT layer FROM build_cache"
        )
        return {str(row[0]) for row in rows}

    async def retire(self, layers: Sequence[str]) -> None:
        await self._transaction([("INSERT OR IGNORE INTO retired_layers (layer) VALUES (?)", (x,)) for x in layers])

    async def retired(self) -> list[str]:
        return [str(row[0]) for row in await self._fetchall("SELECT layer FROM retired_layers")]

    async def forget_retired(self, layer: str) -> None:
        await self._execute("DELETE FROM retired_layers WHERE layer = ?", (layer,))
