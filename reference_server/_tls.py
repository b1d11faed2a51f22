"""The TLS edge's certificates: a local CA made once, and a leaf for the domain that it signs.

The official clients verify TLS and cannot be told to skip it, but both accept an extra trust
anchor from the environment (``SSL_CERT_FILE`` for Python, ``NODE_EXTRA_CA_CERTS`` for Node).
So the server makes its own CA on first start and the user points the clients at that one file.

- **The CA is kept for good.** Clients were told to trust it, so it is never replaced behind
  their back: a later start reuses it, and only the leaf is re-issued when it nears expiry or the
  domain changes. A CA that cannot be used (missing or loose key, expiring) is an error whose
  message says what to do, never a silent new CA.
- **The leaf covers the whole domain**: ``<domain>``, ``*.<domain>`` (one name per sandbox port)
  and ``api.<domain>`` (named for clarity, though the wildcard already covers it), plus the
  loopback addresses for ``E2B_API_URL=https://127.0.0.1:…``. A port in the configured domain is
  not part of any name. A single-label domain is refused: both clients reject ``*.localhost``.
- **Keys are private**: written 0600 through a temporary file and a rename, so no reader ever
  sees a partial or briefly readable key; a CA key readable by group or others is refused.
- **HTTP/1.1 only**: the server context advertises ``http/1.1`` and never ``h2``, because a
  client that negotiates h2 would speak it to a server that does not.

Concurrent first starts are serialised with a lock file in the directory.

Exceptions::

    EdgeCertificateError  the domain or the certificate directory is unusable (message says why)
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import secrets
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from reference_server._credentials import require_private_file
from reference_server._files import replace_file
from reference_server._routing import parse_domain

__all__ = ["EdgeCertificateError", "EdgeCertificates", "ensure_certificates", "ssl_context"]

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
_LOCK_FILE = ".lock"

CA_VALIDITY = timedelta(days=3650)
LEAF_VALIDITY = timedelta(days=365)
RENEW_BEFORE = timedelta(days=30)  # a certificate with less left than this is not reused
_BACKDATE = timedelta(minutes=5)  # tolerates a client clock slightly behind ours
_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


class EdgeCertificateError(Exception):
    """The domain cannot be certified, or the certificate directory is unusable."""


@dataclass(frozen=True)
class EdgeCertificates:
    """Where the edge's PEM files are; ``ca_fingerprint_sha256`` is lowercase hex of the CA's DER."""

    ca_cert_path: Path
    cert_path: Path
    key_path: Path
    ca_fingerprint_sha256: str


def ensure_certificates(directory: Path, domain: str, *, now: datetime | None = None) -> EdgeCertificates:
    """The CA and the leaf for ``domain`` (``name`` or ``name:port``) in ``directory``, made or renewed as needed."""
    name = _certificate_name(domain)
    moment = datetime.now(UTC) if now is None else now
    if moment.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = os.open(directory / _LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ca_cert, ca_key = _load_or_create_ca(directory, moment)
        if not _leaf_is_usable(directory, name, ca_cert, moment):
            _issue_leaf(directory, name, ca_cert, ca_key, moment)
    finally:
        os.close(lock)  # releases the lock
    return EdgeCertificates(
        ca_cert_path=directory / CA_CERT_FILE,
        cert_path=directory / CERT_FILE,
        key_path=directory / KEY_FILE,
        ca_fingerprint_sha256=ca_cert.fingerprint(hashes.SHA256()).hex(),
    )


def ssl_context(certs: EdgeCertificates) -> ssl.SSLContext:
    """A server-side context: TLS 1.2 or later, the edge's leaf and key, ALPN ``http/1.1`` only."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=certs.cert_path, keyfile=certs.key_path)
    context.set_alpn_protocols(["http/1.1"])
    return context


def _certificate_name(domain: str) -> str:
    try:
        name = parse_domain(domain).name
    except ValueError as exc:
        raise EdgeCertificateError(str(exc)) from exc
    if "." not in name:
        raise EdgeCertificateError(
            f"domain {domain!r} has a single label: both official clients reject a wildcard certificate "
            f"for *.{name}; use two labels such as e2b.{name}"
        )
    return name


def _expected_names(name: str) -> set[x509.GeneralName]:
    names: set[x509.GeneralName] = {x509.DNSName(name), x509.DNSName(f"*.{name}"), x509.DNSName(f"api.{name}")}
    names.update(x509.IPAddress(address) for address in _LOOPBACK)
    return names


# -- the CA ---------------------------------------------------------------------


def _load_or_create_ca(directory: Path, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / CA_CERT_FILE, directory / CA_KEY_FILE
    if not cert_path.exists():
        # Keys are written before certificates, so a key alone is an interrupted first start.
        return _create_ca(directory, now)
    try:
        ca_cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError as exc:
        raise EdgeCertificateError(f"the CA certificate {cert_path} is not a PEM certificate: {exc}") from exc
    if not key_path.exists():
        raise EdgeCertificateError(
            f"the CA certificate {cert_path} has no key {key_path}; remove {directory} to make a new CA, "
            "then give the clients the new CA file"
        )
    ca_key = _load_key(key_path)
    if ca_key is None or ca_key.public_key() != ca_cert.public_key():
        raise EdgeCertificateError(f"the CA key {key_path} is not the key of {cert_path}")
    if ca_cert.not_valid_after_utc - now < RENEW_BEFORE or ca_cert.not_valid_before_utc > now:
        raise EdgeCertificateError(
            f"the local CA {cert_path} is valid {ca_cert.not_valid_before_utc:%Y-%m-%d} to "
            f"{ca_cert.not_valid_after_utc:%Y-%m-%d}, too close to or outside now; remove {directory} to make "
            "a new CA, then give the clients the new CA file"
        )
    return ca_cert, ca_key


def _create_ca(directory: Path, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"e2b-compat local CA {secrets.token_hex(4)}")])
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(directory / CA_KEY_FILE, key)
    _write_file(directory / CA_CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


# -- the leaf -------------------------------------------------------------------


def _leaf_is_usable(directory: Path, name: str, ca_cert: x509.Certificate, now: datetime) -> bool:
    """True when the leaf on disk is signed by the CA, names exactly ``name`` and lasts long enough."""
    try:
        leaf = x509.load_pem_x509_certificate((directory / CERT_FILE).read_bytes())
        leaf.verify_directly_issued_by(ca_cert)
        names = set(leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except (OSError, ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False  # missing, corrupt or from another CA: issue a new one
    key = _load_key(directory / KEY_FILE) if (directory / KEY_FILE).exists() else None
    return (
        key is not None
        and key.public_key() == leaf.public_key()
        and names == _expected_names(name)
        and leaf.not_valid_before_utc <= now
        and leaf.not_valid_after_utc - now >= RENEW_BEFORE
    )


def _issue_leaf(
    directory: Path, name: str, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, now: datetime
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    ca_key_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + LEAF_VALIDITY, ca_cert.not_valid_after_utc))  # never outlives its CA
        .add_extension(x509.SubjectAlternativeName(sorted(_expected_names(name), key=str)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    # Key first: a start interrupted between the two files finds a mismatch and issues again.
    _write_key(directory / KEY_FILE, key)
    _write_file(directory / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644)


# -- files ----------------------------------------------------------------------


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey | None:
    """The EC key at ``path``; None if it is not one. Refuses a key that group or others can read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        require_private_file(file.fileno(), path, "the key", EdgeCertificateError)
        data = file.read()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_file(path, pem, 0o600)


def _write_file(path: Path, data: bytes, mode: int) -> None:
    replace_file(path, data, mode=mode)
