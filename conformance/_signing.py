"""Ed25519 detached signatures over the exact bytes of report.json.

Beside ``report.json`` a signed report has::

    report.json.sig   {"algorithm": "ed25519", "fingerprint": <hex>, "signature": <base64>} (canonical JSON)
    report.json.pub   the signer's public key, PEM SubjectPublicKeyInfo

The fingerprint is the sha256 (hex) of the raw 32-byte public key. A signature checked only with
the key beside it proves that the files agree, not who made them: anyone can sign a report of their
own. What ties a report to a signer is ``trusted_fingerprint``, published by the signer elsewhere.

``verify`` is strict on purpose: the .sig and .pub files must be byte for byte what ``sign`` writes
(canonical JSON, canonical base64, the key's own PEM), so that *any* changed byte of any of the
three files fails, not only the bytes that Ed25519 itself covers.

The private key lives in a PEM (PKCS#8) file readable by its owner only; no message here ever
contains key material.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "ALGORITHM",
    "KEY_ENV",
    "Signature",
    "SignedReport",
    "SigningKeyError",
    "VerifyResult",
    "default_key_path",
    "fingerprint",
    "load_or_create_signing_key",
    "sign",
    "sign_report",
    "signature_paths",
    "verify",
]

ALGORITHM = "ed25519"
KEY_ENV = "E2B_COMPAT_SIGNING_KEY"
DEFAULT_KEY_PATH = Path("~/.config/e2b-compat/report-signing-key.pem")

SIGNATURE_SUFFIX = ".sig"
PUBLIC_KEY_SUFFIX = ".pub"

_SIGNATURE_BYTES = 64
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
_SMALL_FILE = 16 * 1024  # .sig, .pub and the key are a few hundred bytes: refuse to read anything much larger


class SigningKeyError(Exception):
    """The signing key file cannot be read, created, or is not private; never includes key material."""


# --- keys ---


def default_key_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$E2B_COMPAT_SIGNING_KEY``, else ``~/.config/e2b-compat/report-signing-key.pem``."""
    env = os.environ if environ is None else environ
    configured = env.get(KEY_ENV, "")
    return Path(configured).expanduser() if configured else DEFAULT_KEY_PATH.expanduser()


def load_or_create_signing_key(path: Path | None = None) -> Ed25519PrivateKey:
    """Load the signing key at ``path`` (default ``default_key_path()``), creating it on first use.

    Creation is atomic and never replaces a key: the PEM goes to a private temporary file that is
    hard-linked into place, so two first runs at once end up using the same key. An existing key
    file that group or others may access is refused, not repaired: it may already have leaked.
    """
    path = default_key_path() if path is None else path
    try:
        return _load_key(path)
    except FileNotFoundError:
        pass
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    if _create_key_file(path, pem):
        return key
    return _load_key(path)  # created by someone else meanwhile: use theirs


def _load_key(path: Path) -> Ed25519PrivateKey:
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the run; regular files are unaffected.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SigningKeyError(f"cannot open the signing key {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)  # checked on the descriptor, so the file read is the file checked
        if not stat.S_ISREG(info.st_mode):
            raise SigningKeyError(f"the signing key {path} is not a regular file")
        if info.st_mode & 0o077:
            raise SigningKeyError(
                f"the signing key {path} has mode {stat.S_IMODE(info.st_mode):04o}; group and others must have "
                f"no access (chmod 600 {path}, and consider the key leaked if others could read it)"
            )
        data = os.read(fd, _SMALL_FILE + 1)
    finally:
        os.close(fd)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # The library's message is not repeated: it is not supposed to, but could, quote the input.
        raise SigningKeyError(f"the signing key {path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"the signing key {path} is not an Ed25519 key")
    return key


def _create_key_file(path: Path, pem: bytes) -> bool:
    """Write ``pem`` to a 0600 temporary file and link it to ``path``; False if ``path`` appeared meanwhile."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise SigningKeyError(f"cannot create the signing key {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), 0o600)  # mkstemp already uses 0600; be explicit about the one thing that matters
            file.write(pem)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)  # unlike a rename, never replaces a key someone else just wrote
        except FileExistsError:
            return False
        except OSError as exc:
            raise SigningKeyError(f"cannot create the signing key {path}: {exc.strerror}") from exc
    finally:
        Path(temporary).unlink(missing_ok=True)
    return True


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """sha256 (hex) of the raw 32-byte public key."""
    return hashlib.sha256(_raw(public_key)).hexdigest()


# --- signing ---


@dataclass(frozen=True)
class Signature:
    algorithm: str  # "ed25519"
    fingerprint: str
    signature: str  # base64 (standard alphabet, padded) of the 64-byte signature
    public_key_pem: bytes

    def signature_file(self) -> bytes:
        """The exact bytes of ``report.json.sig``."""
        return _canonical({"algorithm": self.algorithm, "fingerprint": self.fingerprint, "signature": self.signature})


@dataclass(frozen=True)
class SignedReport:
    report_path: Path
    signature_path: Path
    public_key_path: Path
    signature: Signature


def _canonical(document: dict[str, str]) -> bytes:
    return (json.dumps(document, sort_keys=True, indent=2) + "\n").encode("ascii")


def sign(report_bytes: bytes, key: Ed25519PrivateKey) -> Signature:
    """Sign ``report_bytes`` as they are (no re-serialisation): what is verified is what was signed."""
    public_key = key.public_key()
    return Signature(
        algorithm=ALGORITHM,
        fingerprint=fingerprint(public_key),
        signature=base64.b64encode(key.sign(report_bytes)).decode("ascii"),
        public_key_pem=_pem(public_key),
    )


def signature_paths(report_path: Path) -> tuple[Path, Path]:
    """``report.json`` → (``report.json.sig``, ``report.json.pub``)."""
    return (
        report_path.with_name(report_path.name + SIGNATURE_SUFFIX),
        report_path.with_name(report_path.name + PUBLIC_KEY_SUFFIX),
    )


def sign_report(report_path: Path, key: Ed25519PrivateKey) -> SignedReport:
    """Sign the bytes of ``report_path`` as they are on disk and write the .sig and .pub beside it."""
    signature = sign(report_path.read_bytes(), key)
    signature_path, public_key_path = signature_paths(report_path)
    _replace(public_key_path, signature.public_key_pem)
    _replace(signature_path, signature.signature_file())
    return SignedReport(report_path, signature_path, public_key_path, signature)


def _replace(path: Path, data: bytes) -> None:
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), 0o644)  # public by nature: reports are published
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)


# --- verifying ---


@dataclass(frozen=True)
class VerifyResult:
    valid: bool
    report_path: Path
    fingerprint: str | None  # of the key beside the report, once it could be read
    trusted: bool  # the key matched the trusted fingerprint that was given
    problem: str = ""  # why it is not valid

    def __bool__(self) -> bool:
        return self.valid


class _InvalidError(Exception):
    pass


def verify(report_path: Path, *, trusted_fingerprint: str | None = None) -> VerifyResult:
    """Check ``report.json`` (or a folder holding it) against the .sig and .pub beside it.

    With ``trusted_fingerprint`` (hex; case, ``:`` and spaces ignored) the key must also be that one.
    """
    report = report_path / "report.json" if report_path.is_dir() else report_path
    found: str | None = None
    try:
        trusted = None if trusted_fingerprint is None else _normalise_fingerprint(trusted_fingerprint)
        signature_path, public_key_path = signature_paths(report)
        data = _read(report, limit=None, what="the report")
        claimed, signature = _parse_signature_file(_read(signature_path, limit=_SMALL_FILE, what="the signature"))
        public_key = _parse_public_key(_read(public_key_path, limit=_SMALL_FILE, what="the public key"))
        found = fingerprint(public_key)
        if found != claimed:
            raise _InvalidError(
                f"the public key beside the report ({found}) is not the one the signature names ({claimed})"
            )
        try:
            public_key.verify(signature, data)
        except InvalidSignature:
            raise _InvalidError(
                f"the signature does not match the bytes of {report.name} (the report or its signature was changed)"
            ) from None
        if trusted is not None and found != trusted:
            raise _InvalidError(f"signed with key {found}, not with the trusted key {trusted}")
    except _InvalidError as exc:
        return VerifyResult(False, report, found, False, str(exc))
    return VerifyResult(True, report, found, trusted is not None)


def _normalise_fingerprint(text: str) -> str:
    cleaned = re.sub(r"[\s:]", "", text).lower()
    if not _FINGERPRINT.fullmatch(cleaned):
        raise _InvalidError(f"the trusted fingerprint must be 64 hex digits (sha256), got {len(cleaned)} characters")
    return cleaned


def _read(path: Path, *, limit: int | None, what: str) -> bytes:
    try:
        with path.open("rb") as file:
            data = file.read() if limit is None else file.read(limit + 1)
    except FileNotFoundError:
        raise _InvalidError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise _InvalidError(f"cannot read {what} {path}: {exc.strerror}") from None
    if limit is not None and len(data) > limit:
        raise _InvalidError(f"{what} {path} is too large to be one")
    return data


def _parse_signature_file(raw: bytes) -> tuple[str, bytes]:
    """(claimed fingerprint, signature bytes) from the exact bytes ``Signature.signature_file`` writes."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _InvalidError("the signature file is not JSON") from None
    if not isinstance(document, dict) or set(document) != {"algorithm", "fingerprint", "signature"}:
        raise _InvalidError("the signature file must hold exactly algorithm, fingerprint and signature")
    if not all(isinstance(value, str) for value in document.values()):
        raise _InvalidError("the signature file's fields must be strings")
    if document["algorithm"] != ALGORITHM:
        raise _InvalidError(f"unsupported signature algorithm {document['algorithm']!r} (expected {ALGORITHM!r})")
    if not _FINGERPRINT.fullmatch(document["fingerprint"]):
        raise _InvalidError("the signature file's fingerprint is not 64 lower-case hex digits")
    try:
        signature = base64.b64decode(document["signature"], validate=True)
    except (binascii.Error, ValueError):
        raise _InvalidError("the signature is not base64") from None
    # b64decode ignores the unused low bits of the last character: without this check, a changed
    # character could decode to the same signature and the change would go unnoticed.
    if len(signature) != _SIGNATURE_BYTES or base64.b64encode(signature).decode("ascii") != document["signature"]:
        raise _InvalidError("the signature is not the canonical base64 of 64 bytes")
    if raw != _canonical(document):
        raise _InvalidError("the signature file has been edited (it is not in the form the signer writes)")
    return document["fingerprint"], signature


def _parse_public_key(raw: bytes) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(raw)
    except (ValueError, UnsupportedAlgorithm):
        raise _InvalidError("the public key file is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise _InvalidError("the public key is not an Ed25519 key")
    if raw != _pem(key):
        raise _InvalidError("the public key file has been edited (it is not in the form the signer writes)")
    return key
