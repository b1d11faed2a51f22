"""Idempotent creates: a create sent again with the same ``Idempotency-Key`` makes no second sandbox.

Python clients from e2b 2.60 on retry a control-plane request that was answered 429, 502, 503 or
504 (unless the answer says ``Should-Retry: false``); from 2.61 a caller may name a create with an
``Idempotency-Key`` header (1-255 characters of ``[a-z0-9-]``, checked by the client too) so that
a create whose answer was lost can be sent again safely (docs/PROTOCOL-NOTES.md, "Retries").

A key belongs to one owner and lives for ``WINDOW`` after its first use. What a create with a key
finds decides what it does; the table below is the whole behaviour (``RULES``):

    found                                   answer
    --------------------------------------  ------------------------------------------------------
    no row (or one older than the window)   reserve the key (pending), create; on success bind the
                                            sandbox's id to it, on any failure drop the row again
                                            (nothing was made, so the same key may try again)
    another request body                    422, ``Should-Retry: false``
    pending: the first is still creating    409, ``Should-Retry: true``, ``Retry-After: 1``
    bound to a sandbox that is there        the first create's answer again (201, the same id)
    bound to a sandbox that is gone         409, ``Should-Retry: false``

A pending row exists only while this server creates: a stop cuts creates off, so ``open`` drops
the pending rows it finds (the sandboxes they were making are settled by reconcile; no client
ever got their answer). One server owns a data folder, so "pending" needs no owner process.
The request body is compared by its canonical JSON (keys sorted), so a retry's re-encoding of the
same object is the same request.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

import aiosqlite

from contract.protocol import IDEMPOTENCY_KEY_HEADER, RETRY_AFTER_HEADER, SHOULD_RETRY_HEADER
from reference_server._errors import ApiError
from reference_server._records import format_time

__all__ = ["RULES", "WINDOW", "CreateKeys", "Found", "fingerprint", "parse_key"]

WINDOW = timedelta(hours=24)
_KEY = re.compile(r"[a-z0-9-]{1,255}")

T = TypeVar("T")


class Found(enum.Enum):
    """What a create with a key finds in the table."""

    NOTHING = "nothing"
    OTHER_BODY = "other-body"
    PENDING = "pending"
    BOUND = "bound"
    BOUND_GONE = "bound-gone"


# Found → (status, message, headers) of a refusal; NOTHING and BOUND are answered by creating or replaying.
RULES: dict[Found, tuple[int, str, dict[str, str]]] = {
    Found.OTHER_BODY: (
        422,
        f"This {IDEMPOTENCY_KEY_HEADER} was used for a create with another request body",
        {SHOULD_RETRY_HEADER: "false"},
    ),
    Found.PENDING: (
        409,
        f"A create with this {IDEMPOTENCY_KEY_HEADER} is in progress",
        {SHOULD_RETRY_HEADER: "true", RETRY_AFTER_HEADER: "1"},
    ),
    Found.BOUND_GONE: (
        409,
        f"The sandbox created with this {IDEMPOTENCY_KEY_HEADER} no longer exists",
        {SHOULD_RETRY_HEADER: "false"},
    ),
}


def parse_key(value: str | None) -> str | None:
    """The header's key, or None without one; 400 for a key the clients would not send either."""
    if value is None:
        return None
    if not _KEY.fullmatch(value):
        raise ApiError(
            400,
            f"Invalid {IDEMPOTENCY_KEY_HEADER} header: 1-255 lowercase letters, digits and hyphens",
            {SHOULD_RETRY_HEADER: "false"},
        )
    return value


def fingerprint(body: dict[str, Any]) -> str:
    """sha256 of the body's canonical JSON: equal objects, equal prints, whatever their encoding."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class CreateKeys:
    """The ``create_keys`` table (migration 6) and the rules above."""

    def __init__(self, db: aiosqlite.Connection, clock: Callable[[], datetime]) -> None:
        self._db = db
        self._clock = clock

    async def open(self) -> int:
        """Drop the pending rows a stop cut off and the rows past the window; how many were pending."""
        cursor = await self._db.execute("DELETE FROM create_keys WHERE sandbox_id IS NULL")
        await self._prune()
        return cursor.rowcount

    async def once(
        self,
        owner: str,
        key: str,
        body_print: str,
        *,
        create: Callable[[], Awaitable[T]],
        bound_id: Callable[[T], str],
        replay: Callable[[str], Awaitable[T | None]],
    ) -> T:
        """``create()`` at most once per (owner, key); a repeat answers ``replay(id)`` (None: the sandbox is gone)."""
        await self._prune()
        while True:
            if await self._reserve(owner, key, body_print):
                break
            row = await self._row(owner, key)
            if row is None:  # dropped between the two statements (its create failed): try to reserve again
                continue
            found_print, sandbox_id = row
            if found_print != body_print:
                self._refuse(Found.OTHER_BODY)
            if sandbox_id is None:
                self._refuse(Found.PENDING)
            replayed = await replay(sandbox_id)
            if replayed is None:
                self._refuse(Found.BOUND_GONE)
            return replayed
        try:
            made = await create()
        except BaseException:
            await self._db.execute("DELETE FROM create_keys WHERE owner = ? AND key = ?", (owner, key))
            raise
        await self._db.execute(
            "UPDATE create_keys SET sandbox_id = ? WHERE owner = ? AND key = ?", (bound_id(made), owner, key)
        )
        return made

    @staticmethod
    def _refuse(found: Found) -> NoReturn:
        status, message, headers = RULES[found]
        raise ApiError(status, message, headers)

    async def _reserve(self, owner: str, key: str, body_print: str) -> bool:
        try:
            await self._db.execute(
                "INSERT INTO create_keys (owner, key, fingerprint, sandbox_id, created_at) VALUES (?, ?, ?, NULL, ?)",
                (owner, key, body_print, format_time(self._clock())),
            )
        except sqlite3.IntegrityError:
            return False
        return True

    async def _row(self, owner: str, key: str) -> tuple[str, str | None] | None:
        rows = list(
            await self._db.execute_fetchall(
                "SELECT fingerprint, sandbox_id FROM create_keys WHERE owner = ? AND key = ?", (owner, key)
            )
        )
        if not rows:
            return None
        found_print, sandbox_id = tuple(rows[0])
        return str(found_print), None if sandbox_id is None else str(sandbox_id)

    async def _prune(self) -> None:
        """Bound keys past the window are forgotten: the same key then makes a new sandbox."""
        cutoff = format_time(self._clock() - WINDOW)
        await self._db.execute("DELETE FROM create_keys WHERE sandbox_id IS NOT NULL AND created_at < ?", (cutoff,))
