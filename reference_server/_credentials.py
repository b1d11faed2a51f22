"""Credential primitives of the reference server: API keys, sandbox tokens, signed file URLs.

Pure on purpose: no clock, no store, no environment. Randomness comes from the operating
system, and the only file touched is the master key at the path the caller passes. The store
keeps what these functions return; handlers reach them through a service (docs/ARCHITECTURE.md).

- **API keys** are 160 random bits, so nobody guesses one; the salted PBKDF2 hash only makes a
  stolen store expensive to use. A salted hash cannot be looked up by key, hence ``key_id``: a
  short deterministic fingerprint to find the one record whose hash is then verified.
- **Sandbox tokens** (envd, traffic, volume) are handed back to the client that created the
  sandbox, so they are stored encrypted, not hashed. Checking a presented token must not need
  the plaintext, so each sealed token also carries a keyed digest compared in constant time.
  Ciphertext and digest are bound to the scope, the sandbox and the key version: a token of one
  scope or sandbox never passes for another, and an unknown key version fails closed.
- **Secrets never reach logs**: objects holding them print nothing secret, and ``redact`` is the
  one way to mention a secret in a message.

Exceptions::

    CredentialError
    ├── TokenError      a sealed token is malformed or does not open (other scope or sandbox,
    │                   unknown key version, altered bytes)
    └── MasterKeyError  the master key file is unusable (message says why and what to do)
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import os
import re
import secrets
import stat
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


class CredentialError(Exception):
    """Base of the credential errors."""


class TokenError(CredentialError):
    pass


class MasterKeyError(CredentialError):
    pass


# -- redaction ------------------------------------------------------------------

_REDACT_PREFIXES = ("e2b_", "v1_")  # API keys, file signatures: the prefix says what it was
_REDACT_MIN_LENGTH = 16  # shorter secrets show no character at all


def redact(value: str | None) -> str:
    """A secret as it may appear in a log or a message, e.g. ``e2b_…3f9a``: known prefix and last four characters."""
    if value is None:
        return "<none>"
    if not value:
        return "<empty>"
    prefix = next((p for p in _REDACT_PREFIXES if value.startswith(p)), "")
    rest = value[len(prefix) :]
    tail = rest[-4:] if len(rest) >= _REDACT_MIN_LENGTH else ""
    return f"{prefix}\N{HORIZONTAL ELLIPSIS}{tail}"


# -- API keys -------------------------------------------------------------------

API_KEY_PREFIX = "e2b_"
# What both SDKs accept (docs/PROTOCOL-NOTES.md, Headers); use with fullmatch.
API_KEY_PATTERN = re.compile(r"e2b_[0-9a-f]+")
API_KEY_HEX_CHARS = 40

HASH_SCHEME = "pbkdf2-sha256"
# ~0.12 s per check on this kind of machine. The key's own entropy is what keeps it safe; the
# stretching is defence in depth for a stolen store, so it is kept to what a request can afford.
DEFAULT_ITERATIONS = 200_000
MAX_ITERATIONS = 10_000_000  # a stored hash asking for more is corrupt, not a reason to burn seconds
_SALT_BYTES = 16
_DIGEST_BYTES = 32
_KEY_ID_LABEL = b"e2b-compat-key-id-v1\x00"
_KEY_ID_HEX_CHARS = 12
_ITERATIONS_TEXT = re.compile(r"[1-9][0-9]{0,7}")
_HEX_TEXT = re.compile(r"(?:[0-9a-f]{2})+")


def is_api_key(value: str) -> bool:
    return API_KEY_PATTERN.fullmatch(value) is not None


def new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_hex(API_KEY_HEX_CHARS // 2)


def key_id(key: str) -> str:
    """The index under which a key's record is stored: 12 hex characters of a labelled sha256.

    Hashes are salted, so the store cannot be searched by hash; without an index, checking one
    request would mean a PBKDF2 run per stored key. The fingerprint is safe to store and log:
    48 bits of a hash of a 160-bit random key leave nothing to guess from. It is an index, not a
    proof; two keys may share it, so the caller verifies every record found under it.
    """
    return hashlib.sha256(_KEY_ID_LABEL + key.encode("utf-8", "surrogatepass")).hexdigest()[:_KEY_ID_HEX_CHARS]


def hash_api_key(key: str, iterations: int = DEFAULT_ITERATIONS) -> str:
    """``pbkdf2-sha256$<iterations>$<salt-hex>$<digest-hex>`` with a fresh random salt."""
    if not is_api_key(key):
        raise ValueError(f"not an API key ({redact(key)}): expected e2b_ followed by lowercase hex")
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be 1..{MAX_ITERATIONS}, not {iterations}")
    salt = secrets.token_bytes(_SALT_BYTES)
    return f"{HASH_SCHEME}${iterations}${salt.hex()}${_pbkdf2(key, salt, iterations).hex()}"


def verify_api_key(key: str, stored: str) -> bool:
    """Whether ``key`` is the key behind ``stored``; False (never an exception) for anything malformed."""
    parsed = _parse_hash(stored)
    if parsed is None or not isinstance(key, str) or not is_api_key(key):
        return False
    iterations, salt, expected = parsed
    return hmac.compare_digest(_pbkdf2(key, salt, iterations), expected)


def _pbkdf2(key: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", key.encode("ascii"), salt, iterations, _DIGEST_BYTES)


def _parse_hash(stored: object) -> tuple[int, bytes, bytes] | None:
    if not isinstance(stored, str):
        return None
    parts = stored.split("$")
    if len(parts) != 4 or parts[0] != HASH_SCHEME:
        return None
    raw_iterations, raw_salt, raw_digest = parts[1:]
    if _ITERATIONS_TEXT.fullmatch(raw_iterations) is None or int(raw_iterations) > MAX_ITERATIONS:
        return None
    if _HEX_TEXT.fullmatch(raw_salt) is None or _HEX_TEXT.fullmatch(raw_digest) is None:
        return None
    digest = bytes.fromhex(raw_digest)
    if len(digest) != _DIGEST_BYTES:
        return None
    return int(raw_iterations), bytes.fromhex(raw_salt), digest


# -- sandbox tokens -------------------------------------------------------------

SANDBOX_TOKEN_BYTES = 32
MASTER_KEY_BYTES = 32
_DOMAIN = b"e2b-compat-token-v1"
_NONCE_BYTES = 12
_TAG_BYTES = 16
_MAX_VERSION = 2**32 - 1


def new_sandbox_token() -> str:
    return secrets.token_hex(SANDBOX_TOKEN_BYTES)


class TokenScope(enum.IntEnum):
    ENVD = 1  # X-Access-Token of the sandbox's envd
    TRAFFIC = 2  # E2B-Traffic-Access-Token on user ports when public traffic is off
    VOLUME = 3  # bearer token of a volume's content API


@dataclass(frozen=True, repr=False)
class SealedToken:
    """A token as the store keeps it: AES-256-GCM ciphertext plus a keyed digest, under one key version."""

    version: int
    nonce: bytes
    ciphertext: bytes  # includes the GCM tag
    digest: bytes  # HMAC-SHA256 over the binding, nonce, ciphertext and token

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or not isinstance(self.version, int):
            raise TokenError("sealed token: key version must be an integer")
        if not 1 <= self.version <= _MAX_VERSION:
            raise TokenError(f"sealed token: key version {self.version} is out of range")
        lengths = ((self.nonce, _NONCE_BYTES, "nonce"), (self.digest, hashlib.sha256().digest_size, "digest"))
        for value, length, name in lengths:
            if not isinstance(value, bytes) or len(value) != length:
                raise TokenError(f"sealed token: {name} must be {length} bytes")
        if not isinstance(self.ciphertext, bytes) or len(self.ciphertext) <= _TAG_BYTES:
            raise TokenError("sealed token: ciphertext is too short")

    def __repr__(self) -> str:
        return f"SealedToken(version={self.version}, ciphertext=<{len(self.ciphertext)} bytes>)"

    def to_dict(self) -> dict[str, int | str]:
        return {
            "version": self.version,
            "nonce": base64.b64encode(self.nonce).decode("ascii"),
            "ciphertext": base64.b64encode(self.ciphertext).decode("ascii"),
            "digest": base64.b64encode(self.digest).decode("ascii"),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SealedToken:
        if set(data) != {"version", "nonce", "ciphertext", "digest"}:
            raise TokenError("sealed token: expected exactly version, nonce, ciphertext and digest")
        version = data["version"]
        if isinstance(version, bool) or not isinstance(version, int):
            raise TokenError("sealed token: key version must be an integer")
        return cls(version, _unbase64(data["nonce"]), _unbase64(data["ciphertext"]), _unbase64(data["digest"]))


def _unbase64(value: object) -> bytes:
    if not isinstance(value, str):
        raise TokenError("sealed token: binary fields must be base64 strings")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise TokenError("sealed token: invalid base64") from None


@dataclass(frozen=True, repr=False)
class _Subkeys:
    aead: AESGCM
    mac: bytes


class TokenVault:
    """Seals sandbox tokens with the newest master key; opens and checks them under the version they name.

    Rotation: construct with the new key and version, older keys in ``previous``. Blobs sealed
    under an older version keep opening; new seals use the newest. Dropping an old key makes its
    blobs fail closed. Only subkeys derived with HKDF are kept, one for AES-GCM, one for HMAC.
    """

    __slots__ = ("_keys", "_newest")

    def __init__(self, master_key: bytes, version: int = 1, *, previous: Mapping[int, bytes] | None = None) -> None:
        older = dict(previous or {})
        self._keys = {v: _derive(key, v) for v, key in (*older.items(), (version, master_key))}
        if max(self._keys) != version or version in older:
            raise ValueError(f"key version {version} must be newer than every previous version")
        self._newest = version

    def __repr__(self) -> str:
        return f"TokenVault(versions={sorted(self._keys)}, sealing={self._newest})"

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(sorted(self._keys))

    def seal(self, token: str, scope: TokenScope, sandbox_id: str) -> SealedToken:
        if not token:
            raise ValueError("refusing to seal an empty token")
        if not sandbox_id:
            raise ValueError("a sealed token needs a sandbox id")
        version = self._newest
        keys = self._keys[version]
        binding = _binding(TokenScope(scope), sandbox_id, version)
        nonce = os.urandom(_NONCE_BYTES)
        plaintext = token.encode("utf-8", "surrogatepass")
        ciphertext = keys.aead.encrypt(nonce, plaintext, binding)
        return SealedToken(version, nonce, ciphertext, _digest(keys.mac, binding, nonce, ciphertext, plaintext))

    def open(self, sealed: SealedToken, scope: TokenScope, sandbox_id: str) -> str:
        """The plaintext token; TokenError unless every byte, the scope, the sandbox and the version agree."""
        keys = self._keys.get(sealed.version)
        if keys is None:
            raise TokenError(f"sealed token names key version {sealed.version}, which this vault does not have")
        binding = _binding(TokenScope(scope), sandbox_id, sealed.version)
        try:
            plaintext = keys.aead.decrypt(sealed.nonce, sealed.ciphertext, binding)
        except InvalidTag:
            raise TokenError("sealed token does not open for this scope and sandbox, or was altered") from None
        expected = _digest(keys.mac, binding, sealed.nonce, sealed.ciphertext, plaintext)
        if not hmac.compare_digest(expected, sealed.digest):
            raise TokenError("sealed token digest does not match its ciphertext")
        return plaintext.decode("utf-8", "surrogatepass")

    def matches(self, presented: str | None, sealed: SealedToken, scope: TokenScope, sandbox_id: str) -> bool:
        """Whether a presented token is the sealed one, by digest in constant time, without decrypting."""
        keys = self._keys.get(sealed.version)
        if not presented or keys is None:
            return False
        binding = _binding(TokenScope(scope), sandbox_id, sealed.version)
        plaintext = presented.encode("utf-8", "surrogatepass")
        expected = _digest(keys.mac, binding, sealed.nonce, sealed.ciphertext, plaintext)
        return hmac.compare_digest(expected, sealed.digest)


def _derive(master_key: bytes, version: int) -> _Subkeys:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= _MAX_VERSION:
        raise ValueError(f"key versions are integers 1..{_MAX_VERSION}, not {version!r}")
    if not isinstance(master_key, bytes) or len(master_key) != MASTER_KEY_BYTES:
        raise ValueError(f"master key version {version} must be {MASTER_KEY_BYTES} bytes")

    def subkey(purpose: bytes) -> bytes:
        info = _DOMAIN + b"\x00" + purpose + struct.pack(">I", version)
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master_key)

    return _Subkeys(AESGCM(subkey(b"aes-256-gcm")), subkey(b"hmac-sha256"))


def _binding(scope: TokenScope, sandbox_id: str, version: int) -> bytes:
    """What a sealed token belongs to, unambiguously encoded (fixed-width fields, length-prefixed id)."""
    sandbox = sandbox_id.encode("utf-8", "surrogatepass")
    return _DOMAIN + b"\x00" + struct.pack(">BII", scope, version, len(sandbox)) + sandbox


def _digest(mac_key: bytes, binding: bytes, nonce: bytes, ciphertext: bytes, plaintext: bytes) -> bytes:
    # Covering nonce and ciphertext too means a blob altered anywhere fails ``matches`` as well as ``open``.
    message = binding + nonce + struct.pack(">I", len(ciphertext)) + ciphertext + plaintext
    return hmac.new(mac_key, message, hashlib.sha256).digest()


# -- master key file ------------------------------------------------------------


def load_or_create_master_key(path: Path) -> bytes:
    """The 32-byte master key at ``path``, created (mode 0600, atomically) when there is none."""
    try:
        return _load_master_key(path)
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(MASTER_KEY_BYTES)
    if _create_master_key(path, key):
        return key
    return _load_master_key(path)  # another process created it first: everyone uses that one


def require_private_file(fd: int, path: Path, what: str, error: type[Exception]) -> None:
    """Refuse a secret file that is not a regular file or that group or others may access.

    Checked on the open descriptor, not the path, so the file read is the file checked.
    """
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what} {path} is not a regular file")
    if info.st_mode & 0o077:
        raise error(
            f"{what} {path} has mode {stat.S_IMODE(info.st_mode):04o}; group and others must have "
            f"no access (chmod 600 {path})"
        )


def _load_master_key(path: Path) -> bytes:
    try:
        # O_NONBLOCK: a FIFO at the path must not hang start-up; it changes nothing for regular files.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise MasterKeyError(f"cannot read the master key {path}: {exc.strerror}") from exc
    try:
        require_private_file(fd, path, "the master key", MasterKeyError)
        data = b""
        while len(data) <= MASTER_KEY_BYTES and (chunk := os.read(fd, MASTER_KEY_BYTES + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) != MASTER_KEY_BYTES:
        found = "more" if len(data) > MASTER_KEY_BYTES else str(len(data))
        raise MasterKeyError(f"the master key {path} must hold exactly {MASTER_KEY_BYTES} bytes, it holds {found}")
    return data


def _create_master_key(path: Path, key: bytes) -> bool:
    """Write ``key`` to a private temporary file, then link it into place; False if ``path`` appeared meanwhile.

    A hard link publishes the complete file atomically like a rename, but never replaces a key
    that a concurrent start wrote first (which would orphan every token sealed with it).
    """
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise MasterKeyError(f"cannot create the master key {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), 0o600)
            file.write(key)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise MasterKeyError(f"cannot create the master key {path}: {exc.strerror}") from exc
    finally:
        os.unlink(temporary)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return True


# -- signed file URLs -----------------------------------------------------------

FileOperation = Literal["read", "write"]


def file_signature(path: str, operation: FileOperation, user: str | None, token: str, expiration: int | None) -> str:
    """The ``signature`` query parameter of a signed envd file URL (docs/PROTOCOL-NOTES.md, envd HTTP routes).

    Whoever holds the URL holds the access until ``expiration``: redact it like a token.
    """
    if operation not in ("read", "write"):
        raise ValueError(f"operation must be 'read' or 'write', not {operation!r}")
    raw = f"{path}:{operation}:{user or ''}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).digest()
    return "v1_" + base64.b64encode(digest).decode("ascii").rstrip("=")
