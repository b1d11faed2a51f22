"""API keys of the reference server: issued, listed, revoked and checked against the ``api_keys`` table.

Only a salted PBKDF2 hash of each key is stored (``_credentials.hash_api_key``), under the key's
public ``key_id``. The plaintext exists once, in the ``IssuedKey`` that ``issue`` returns.

Checking a key runs on every control-plane request, and PBKDF2 costs ~100 ms, so ``authenticate``:

- **reads the row every time**: one SELECT on the primary key. A revocation written by another
  process (the ``e2b-compat keys revoke`` command) therefore takes effect on the next request,
  with no cache to expire;
- **runs PBKDF2 only for a key this process has not verified yet against this stored hash**, in a
  worker thread so the event loop keeps serving. Concurrent checks of one key share a single run;
- **remembers a success** under (key_id, stored hash) as an HMAC digest of the key under a
  per-process random secret: never the key itself, so the cache is worth nothing in a memory dump.
  A changed hash (the row replaced) misses the cache and is verified again. A presented key whose
  digest differs from the verified one is refused without PBKDF2: a hash belongs to one key.

``ensure_key`` gives the serve command its first-start key, kept in a private file.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import hmac
import logging
import os
import re
import secrets
import sqlite3
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiosqlite

from ._credentials import (
    API_KEY_HEX_CHARS,
    API_KEY_PREFIX,
    DEFAULT_ITERATIONS,
    hash_api_key,
    key_id,
    new_api_key,
    redact,
    require_private_file,
    verify_api_key,
)
from ._files import replace_file
from ._records import format_time, parse_time

__all__ = [
    "IssuedKey",
    "KeyFileError",
    "KeyInfo",
    "KeyStore",
    "ensure_key",
    "validate_owner",
    "write_private_file",
]

log = logging.getLogger(__name__)

_OWNER = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_NAME_LENGTH = 200
# Exactly what new_api_key makes: anything else cannot be one of our keys, so it costs no lookup.
_OUR_KEY = re.compile(re.escape(API_KEY_PREFIX) + f"[0-9a-f]{{{API_KEY_HEX_CHARS}}}")
_ISSUE_ATTEMPTS = 3  # a key_id collision (48 bits) is astronomically rare; retrying is cheaper than reasoning

_SELECT = "SELECT owner, hash, revoked_at FROM api_keys WHERE key_id = ?"
_INSERT = "INSERT INTO api_keys (key_id, owner, hash, name, created_at) VALUES (?, ?, ?, ?, ?)"
_REVOKE = "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL"
_LIST = """
SELECT key_id, owner, name, created_at, revoked_at FROM api_keys
WHERE :owner IS NULL OR owner = :owner
ORDER BY created_at, key_id
"""


class KeyFileError(Exception):
    """The first-start key file cannot be written (message says where and why)."""


def validate_owner(owner: str) -> str:
    """``owner`` if it is 1-64 characters of letters, digits, ``.``, ``_`` and ``-``; ValueError otherwise."""
    if not isinstance(owner, str) or _OWNER.fullmatch(owner) is None:
        raise ValueError(
            f"owner {owner!r} is not valid: use 1-64 characters of letters, digits, '.', '_' and '-' "
            "(owners appear in paths, logs and tables)"
        )
    return owner


def _validate_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"a key name is text of at most {MAX_NAME_LENGTH} characters")
    if any(not char.isprintable() for char in name):
        # Names are printed in tables and logs: no control characters that could forge lines.
        raise ValueError(f"key name {name!r} has control or other unprintable characters")
    return name


@dataclass(frozen=True, repr=False)
class IssuedKey:
    """A key just issued. ``key`` is the only copy of the plaintext there will ever be; reprs redact it."""

    key: str
    key_id: str
    owner: str
    name: str
    created_at: datetime

    def __repr__(self) -> str:
        return (
            f"IssuedKey(key={redact(self.key)!r}, key_id={self.key_id!r}, owner={self.owner!r}, "
            f"name={self.name!r}, created_at={self.created_at!r})"
        )


@dataclass(frozen=True)
class KeyInfo:
    """What may be shown about a stored key: no hash, no key."""

    key_id: str
    owner: str
    name: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True, repr=False)
class _Verified:
    stored_hash: str
    digest: bytes  # HMAC-SHA256 of the key under the store's per-process secret


class KeyStore:
    """API keys in the ``api_keys`` table of a store's connection (autocommit mode, as ``Store.db`` is).

    ``iterations`` is the PBKDF2 cost of newly issued keys; tests lower it, the server keeps the default.
    """

    def __init__(
        self,
        db: aiosqlite.Connection,
        *,
        iterations: int = DEFAULT_ITERATIONS,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._db = db
        self._iterations = iterations
        self._clock = clock
        self._secret = secrets.token_bytes(32)  # keys the cache digests; never leaves this object
        self._verified: dict[str, _Verified] = {}  # by key_id: at most one entry per stored key
        self._in_flight: dict[tuple[str, str, bytes], asyncio.Task[bool]] = {}

    def __repr__(self) -> str:
        return f"KeyStore(verified={len(self._verified)})"

    async def issue(self, owner: str, name: str = "") -> IssuedKey:
        validate_owner(owner)
        _validate_name(name)
        for _ in range(_ISSUE_ATTEMPTS):
            key = new_api_key()
            kid = key_id(key)
            stored = await asyncio.to_thread(hash_api_key, key, self._iterations)
            created_at = parse_time(format_time(self._clock()))  # as stored: UTC, microseconds
            try:
                await self._db.execute(_INSERT, (kid, owner, stored, name, format_time(created_at)))
            except sqlite3.IntegrityError as exc:
                if exc.sqlite_errorname == "SQLITE_CONSTRAINT_PRIMARYKEY":
                    continue  # the key_id is taken (revoked rows keep theirs): draw another key
                raise
            # This process just derived the hash from the key, so its first use needs no PBKDF2.
            self._verified[kid] = _Verified(stored, self._digest(key))
            log.info("issued API key %s (%s) for owner %s", kid, redact(key), owner)
            return IssuedKey(key=key, key_id=kid, owner=owner, name=name, created_at=created_at)
        raise RuntimeError(f"could not draw an unused key id in {_ISSUE_ATTEMPTS} attempts")

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key for good; False when no key has that id or it was revoked already."""
        cursor = await self._db.execute(_REVOKE, (format_time(self._clock()), key_id))
        self._verified.pop(key_id, None)
        if cursor.rowcount != 1:
            return False
        log.info("revoked API key %s", key_id)
        return True

    async def list(self, owner: str | None = None) -> builtins.list[KeyInfo]:
        """Every key (revoked ones too), oldest first; only ``owner``'s when given."""
        if owner is not None:
            validate_owner(owner)
        rows = await self._db.execute_fetchall(_LIST, {"owner": owner})
        return [
            KeyInfo(
                key_id=str(row[0]),
                owner=str(row[1]),
                name=str(row[2]),
                created_at=parse_time(row[3]),
                revoked_at=None if row[4] is None else parse_time(row[4]),
            )
            for row in rows
        ]

    async def authenticate(self, presented: str | None) -> str | None:
        """The owner of a valid, unrevoked key; None for a missing, malformed, unknown, revoked or wrong key."""
        if not isinstance(presented, str) or _OUR_KEY.fullmatch(presented) is None:
            return None
        kid = key_id(presented)
        rows = list(await self._db.execute_fetchall(_SELECT, (kid,)))
        if not rows:
            return None
        owner, stored, revoked_at = str(rows[0][0]), str(rows[0][1]), rows[0][2]
        if revoked_at is not None:
            self._verified.pop(kid, None)
            return None
        digest = self._digest(presented)
        known = self._verified.get(kid)
        if known is not None and known.stored_hash == stored:
            return owner if hmac.compare_digest(known.digest, digest) else None
        if not await self._verify(presented, stored, (kid, stored, digest)):
            return None
        self._verified[kid] = _Verified(stored, digest)
        return owner

    def _digest(self, key: str) -> bytes:
        return hmac.new(self._secret, key.encode("ascii"), hashlib.sha256).digest()

    async def _verify(self, presented: str, stored: str, flight: tuple[str, str, bytes]) -> bool:
        # A client often opens with several requests at once; they wait for one PBKDF2 run, not one each.
        task = self._in_flight.get(flight)
        if task is None:
            task = asyncio.ensure_future(asyncio.to_thread(verify_api_key, presented, stored))
            self._in_flight[flight] = task

            def forget(done: asyncio.Task[bool]) -> None:
                if self._in_flight.get(flight) is done:
                    del self._in_flight[flight]

            task.add_done_callback(forget)
        # shield: one waiter being cancelled (its client went away) must not cancel the others' check.
        return await asyncio.shield(task)


# -- the first-start key --------------------------------------------------------


async def ensure_key(store_db: aiosqlite.Connection, path: Path, owner: str, *, keys: KeyStore | None = None) -> str:
    """The key in ``path`` if it is private, valid and ``owner``'s; otherwise a new key for ``owner`` written there.

    A key found in a file that group or others could read is revoked before the new key replaces
    it: whoever could read the file may have it. A key of another owner (the configured owner
    changed) is left valid but no longer kept in the file; ``e2b-compat keys list`` still shows it.
    """
    validate_owner(owner)
    store = keys if keys is not None else KeyStore(store_db)
    found, private = _read_key_file(path)
    if found is not None:
        found_owner = await store.authenticate(found)
        if found_owner == owner and private:
            return found
        if found_owner is not None and not private:
            await store.revoke(key_id(found))
            log.warning("revoked API key %s: its file %s was readable by group or others", key_id(found), path)
    issued = await store.issue(owner, name="first-start key")
    write_private_file(path, issued.key + "\n")
    log.info("wrote API key %s for owner %s to %s", issued.key_id, owner, path)
    return issued.key


def _read_key_file(path: Path) -> tuple[str | None, bool]:
    """The key in ``path`` (None when absent, unreadable or not a key) and whether the file is private."""
    try:
        # O_NOFOLLOW: a symlink planted at the path is not followed; O_NONBLOCK: a FIFO does not hang start-up.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, True
    except OSError as exc:
        log.warning("cannot read the API key file %s (%s); a new key replaces it", path, exc.strerror)
        return None, True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            log.warning("the API key file %s is not a regular file; a new key replaces it", path)
            return None, True
        try:
            require_private_file(fd, path, "the API key file", KeyFileError)
            private = True
        except KeyFileError as exc:
            log.warning("%s; a new key replaces it", exc)
            private = False
        data = os.read(fd, 256)  # a key is 44 characters: anything much longer is not one
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    return (text if _OUR_KEY.fullmatch(text) else None), private


def write_private_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, readable by the owner only, atomically (``_files.replace_file``).

    The folder is created 0700 when missing.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        replace_file(path, text.encode("utf-8"), mode=0o600)
    except OSError as exc:
        raise KeyFileError(f"cannot write {path}: {exc.strerror}") from exc
