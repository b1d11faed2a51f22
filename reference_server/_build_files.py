"""Files uploaded for template builds: one archive per owner and content hash, and the links to upload them.

``GET /templates/{id}/files/{hash}`` answers whether the owner's archive of that hash is here,
and if not, a link to ``PUT`` it to. The clients send that request with no API key (it is meant
for a storage bucket), so the link carries its own authority: the owner, template and hash,
an expiry, and an HMAC of them under a key this server made at start (a link outlives neither the
hour nor the server). An archive is written to a temporary name and renamed into place only once
complete and within the size limit, so a cut-off upload leaves nothing that looks present.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

__all__ = ["BuildFiles", "UploadRefusedError", "UploadTooLargeError"]

LINK_LIFETIME_S = 3600
_HASH = re.compile(r"[0-9a-f]{64}")


class UploadRefusedError(Exception):
    """The link is not one of ours, or has expired."""


class UploadTooLargeError(Exception):
    pass


def _owner_folder(owner: str) -> str:
    return hashlib.sha256(owner.encode("utf-8")).hexdigest()[:32]


class BuildFiles:
    def __init__(self, root: Path, *, max_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self._root = root
        self._max_bytes = max_bytes
        self._key = secrets.token_bytes(32)
        self._clock = clock

    @staticmethod
    def valid_hash(files_hash: str) -> bool:
        return bool(_HASH.fullmatch(files_hash))

    def path(self, owner: str, files_hash: str) -> Path:
        if not self.valid_hash(files_hash):
            raise ValueError("not a files hash")
        return self._root / _owner_folder(owner) / f"{files_hash}.tar"

    def present(self, owner: str, files_hash: str) -> bool:
        return self.path(owner, files_hash).is_file()

    def _now(self) -> float:
        return self._clock()

    def token(self, owner: str, template_id: str, files_hash: str) -> str:
        claims = {"o": owner, "t": template_id, "h": files_hash, "e": int(self._now()) + LINK_LIFETIME_S}
        body = base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode()).decode().rstrip("=")
        signature = hmac.new(self._key, body.encode("ascii"), hashlib.sha256).hexdigest()
        return f"{body}.{signature}"

    def check(self, token: str, template_id: str, files_hash: str) -> str:
        """The owner the link was made for; ``UploadRefusedError`` for anything else."""
        body, _, signature = token.partition(".")
        expected = hmac.new(self._key, body.encode("ascii", "replace"), hashlib.sha256).hexdigest()
        if not signature or not hmac.compare_digest(expected, signature):
            raise UploadRefusedError("this upload link is not valid")
        try:
            claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, binascii.Error):
            raise UploadRefusedError("this upload link is not valid") from None
        if claims.get("t") != template_id or claims.get("h") != files_hash or not isinstance(claims.get("o"), str):
            raise UploadRefusedError("this upload link is for another file")
        if int(claims.get("e", 0)) < self._now():
            raise UploadRefusedError("this upload link has expired")
        return str(claims["o"])

    async def receive(self, owner: str, files_hash: str, chunks: AsyncIterator[bytes]) -> int:
        """Store an upload; its size. ``UploadTooLargeError`` past the limit (nothing is kept then)."""
        target = self.path(owner, files_hash)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = target.with_name(f".{files_hash}.{secrets.token_hex(6)}.part")
        size = 0
        try:
            with partial.open("wb") as handle:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self._max_bytes:
                        raise UploadTooLargeError(f"the archive is larger than {self._max_bytes // (1 << 20)} MiB")
                    await asyncio.to_thread(handle.write, chunk)  # a slow disk must not hold the loop
                await asyncio.to_thread(os.fsync, handle.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return size
