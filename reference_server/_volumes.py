"""Volumes: an owner's named, persistent storage that sandboxes mount and the content API serves.

The store keeps who owns which volume, its sealed token and its size; the files are the
runtime's (``runtime.volumes``: one size-limited image per volume, mounted under
``<data>/volumes``). Every change is ordered so that a crash is settled at the next start
(``VolumeService.open``):

    create   record ``creating`` → make and mount the files → ``ready`` → answer
    delete   ``ready`` → ``deleting`` → check no sandbox mounts it → remove the files → drop the record

A ``creating`` record at start belonged to a create nobody got an answer for: its files and
record go. A ``deleting`` one is finished. A ``ready`` volume whose files are gone is made again,
empty, and reported; files no record names are moved to ``<data>/volumes-orphaned`` for the
operator (never deleted: they are somebody's data).

In use: a delete is refused (409) while any sandbox that is not gone mounts the volume. A create
that mounts a volume re-reads it after writing its sandbox record, and a delete marks the volume
``deleting`` before it reads the sandboxes, so of a create and a delete running at once, one
always sees the other (``SandboxService`` does the create's half).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import shutil
import sqlite3
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import aiosqlite

from runtime.volumes import VolumeStorage

from . import _errors as text
from ._credentials import SealedToken, TokenScope, TokenVault, new_sandbox_token
from ._errors import ApiError
from ._records import format_time, parse_time

__all__ = [
    "MAX_NAME",
    "ORPHANED",
    "VolumeRecord",
    "VolumeReport",
    "VolumeService",
    "VolumeStore",
    "check_volume_name",
    "new_volume_id",
]

log = logging.getLogger(__name__)

MAX_NAME = 128
ORPHANED = "volumes-orphaned"
# Letters, digits and ``._-``, starting with a letter or digit: a name is also how a create asks
# for the volume, and it is shown in logs and in the sandbox's detail.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_volume_id() -> str:
    return "vol" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(17))


def check_volume_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ApiError(400, "Invalid request body: name: must be a non-empty string")
    if len(name) > MAX_NAME:
        raise ApiError(400, f"Invalid request body: name: at most {MAX_NAME} characters")
    if not _NAME.fullmatch(name):
        raise ApiError(
            400, "Invalid request body: name: letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, kw_only=True)
class VolumeRecord:
    volume_id: str
    owner: str
    name: str
    token: SealedToken = field(repr=False)
    size_mb: int
    state: str  # creating, ready, deleting
    created_at: datetime


@dataclass(frozen=True)
class VolumeReport:
    """What start-up found: volumes made again empty (their files were gone), files set aside, creates undone."""

    remade: tuple[str, ...] = ()
    orphaned: tuple[str, ...] = ()
    undone: tuple[str, ...] = ()


# Constant SQL only: no statement is ever assembled from input.
_COLUMNS = "volume_id, owner, name, token, size_mb, state, created_at"
_SELECT = f"SELECT {_COLUMNS} FROM volumes"  # noqa: S608 - constant


def _row(row: sqlite3.Row | tuple[object, ...]) -> VolumeRecord:
    volume_id, owner, name, token, size_mb, state, created_at = tuple(row)
    return VolumeRecord(
        volume_id=str(volume_id),
        owner=str(owner),
        name=str(name),
        token=SealedToken.from_dict(json.loads(str(token))),
        size_mb=int(str(size_mb)),
        state=str(state),
        created_at=parse_time(str(created_at)),
    )


class VolumeStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def insert(self, record: VolumeRecord) -> bool:
        """False when the owner has a volume of that name already."""
        try:
            await self._db.execute(
                f"INSERT INTO volumes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant
                (
                    record.volume_id,
                    record.owner,
                    record.name,
                    json.dumps(record.token.to_dict()),
                    record.size_mb,
                    record.state,
                    format_time(record.created_at),
                ),
            )
        except sqlite3.IntegrityError:
            return False
        return True

    async def get(self, volume_id: str) -> VolumeRecord | None:
        rows = list(await self._db.execute_fetchall(_SELECT + " WHERE volume_id = ?", (volume_id,)))
        return _row(rows[0]) if rows else None

    async def named(self, owner: str, name: str) -> VolumeRecord | None:
        rows = list(await self._db.execute_fetchall(_SELECT + " WHERE owner = ? AND name = ?", (owner, name)))
        return _row(rows[0]) if rows else None

    async def owned(self, owner: str) -> list[VolumeRecord]:
        rows = await self._db.execute_fetchall(
            _SELECT + " WHERE owner = ? AND state = 'ready' ORDER BY created_at, volume_id", (owner,)
        )
        return [_row(row) for row in rows]

    async def all(self) -> list[VolumeRecord]:
        return [_row(row) for row in await self._db.execute_fetchall(_SELECT + " ORDER BY created_at, volume_id")]

    async def move(self, volume_id: str, current: str, new: str) -> bool:
        """``current`` → ``new``; False when the volume was not in ``current`` (another request moved it)."""
        cursor = await self._db.execute(
            "UPDATE volumes SET state = ? WHERE volume_id = ? AND state = ?", (new, volume_id, current)
        )
        return cursor.rowcount == 1

    async def delete(self, volume_id: str) -> None:
        await self._db.execute("DELETE FROM volumes WHERE volume_id = ?", (volume_id,))


InUse = Callable[[str], Awaitable[bool]]  # volume id → whether a sandbox that is not gone mounts it


class VolumeService:
    def __init__(
        self,
        *,
        store: VolumeStore,
        storage: VolumeStorage,
        vault: TokenVault,
        size_mb: int,
        in_use: InUse,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.storage = storage
        self._vault = vault
        self._size_mb = size_mb
        self._in_use = in_use
        self._clock = clock or (lambda: datetime.now(UTC))

    # -- the control plane -----------------------------------------------------------------

    async def create(self, owner: str, name: object) -> tuple[VolumeRecord, str]:
        """A new empty volume of ``owner``'s, ready, with its token in the clear."""
        name = check_volume_name(name)
        volume_id = new_volume_id()
        token = new_sandbox_token()
        record = VolumeRecord(
            volume_id=volume_id,
            owner=owner,
            name=name,
            token=self._vault.seal(token, TokenScope.VOLUME, volume_id),
            size_mb=self._size_mb,
            state="creating",
            created_at=self._clock(),
        )
        if not await self.store.insert(record):
            raise ApiError(409, text.VOLUME_EXISTS)
        try:
            await asyncio.to_thread(self.storage.ensure, volume_id, record.size_mb)
        except BaseException:
            await asyncio.shield(self._remove(volume_id))
            raise
        await self.store.move(volume_id, "creating", "ready")
        log.info("volume %s (%s) created for %s", volume_id, name, owner)
        return replace(record, state="ready"), token

    async def list(self, owner: str) -> list[VolumeRecord]:
        return await self.store.owned(owner)

    async def get(self, owner: str, volume_id: str) -> tuple[VolumeRecord, str]:
        record = await self.owned(owner, volume_id)
        return record, self._vault.open(record.token, TokenScope.VOLUME, record.volume_id)

    async def owned(self, owner: str, volume_id: str) -> VolumeRecord:
        """One of ``owner``'s ready volumes; another owner's is as missing as one that never was (404)."""
        record = await self.store.get(volume_id)
        if record is None or record.owner != owner or record.state != "ready":
            raise ApiError(404, text.VOLUME_NOT_FOUND)
        return record

    async def named(self, owner: str, name: str) -> VolumeRecord | None:
        record = await self.store.named(owner, name)
        return record if record is not None and record.state == "ready" else None

    async def delete(self, owner: str, volume_id: str) -> None:
        record = await self.owned(owner, volume_id)
        if not await self.store.move(volume_id, "ready", "deleting"):
            raise ApiError(404, text.VOLUME_NOT_FOUND)  # a delete at the same time took it
        if await self._in_use(volume_id):  # read after the mark: a create mounting it now sees it deleting
            await self.store.move(volume_id, "deleting", "ready")
            raise ApiError(409, text.VOLUME_IN_USE)
        await asyncio.shield(self._remove(record.volume_id))
        log.info("volume %s (%s) of %s deleted", volume_id, record.name, owner)

    async def still_ready(self, volume_id: str) -> bool:
        record = await self.store.get(volume_id)
        return record is not None and record.state == "ready"

    def mount_point(self, volume_id: str) -> Path:
        return self.storage.mount_point(volume_id)

    # -- the content API ----------------------------------------------------------------------

    async def authorize(self, volume_id: str, presented: str | None) -> VolumeRecord:
        """The ready volume ``presented`` is the token of; 401 for anything else (a missing volume too)."""
        record = await self.store.get(volume_id)
        if (
            record is None
            or record.state != "ready"
            or not self._vault.matches(presented, record.token, TokenScope.VOLUME, volume_id)
        ):
            raise ApiError(401, text.INVALID_VOLUME_TOKEN)
        return record

    # -- start-up -------------------------------------------------------------------------

    async def open(self) -> VolumeReport:
        """Settle what a stop cut off, and mount every ready volume (before any sandbox is reconciled)."""
        remade: list[str] = []
        undone: list[str] = []
        known: set[str] = set()
        for record in await self.store.all():
            known.add(record.volume_id)
            if record.state == "creating":
                await self._remove(record.volume_id)
                undone.append(record.volume_id)
            elif record.state == "deleting":
                await self._remove(record.volume_id)
            else:
                had_files = record.volume_id in await asyncio.to_thread(self.storage.ids)
                await asyncio.to_thread(self.storage.ensure, record.volume_id, record.size_mb)
                if not had_files:
                    log.error("volume %s (%s): its files were gone; made again, empty", record.volume_id, record.name)
                    remade.append(record.volume_id)
        orphaned = sorted(await asyncio.to_thread(self.storage.ids) - known)
        for volume_id in orphaned:
            await asyncio.to_thread(self._set_aside, volume_id)
        return VolumeReport(tuple(remade), tuple(orphaned), tuple(undone))

    def _set_aside(self, volume_id: str) -> None:
        self.storage.release(volume_id)
        target = self.storage.root.parent / ORPHANED / volume_id
        target.parent.mkdir(parents=True, exist_ok=True)
        target.parent.chmod(0o700)
        if target.exists():
            target = target.with_name(f"{volume_id}.{secrets.token_hex(3)}")
        shutil.move(str(self.storage.root / volume_id), str(target))
        log.error("volume files %s have no record: kept in %s", volume_id, target)

    async def _remove(self, volume_id: str) -> None:
        """Files first, then the record: a crash in between leaves a record start-up finishes."""
        await asyncio.to_thread(self.storage.remove, volume_id)
        await self.store.delete(volume_id)
