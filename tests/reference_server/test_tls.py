"""The TLS edge's certificates: creation, reuse, leaf renewal, refusals, and real handshakes on loopback."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from reference_server._tls import (
    CA_KEY_FILE,
    EdgeCertificateError,
    EdgeCertificates,
    ensure_certificates,
    ssl_context,
)

DOMAIN = "e2b.localhost"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def _files(certs: EdgeCertificates) -> dict[str, bytes]:
    paths = {"ca": certs.ca_cert_path, "ca_key": certs.ca_cert_path.parent / CA_KEY_FILE}
    paths.update(cert=certs.cert_path, key=certs.key_path)
    return {name: path.read_bytes() for name, path in paths.items()}


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _names(cert: x509.Certificate) -> set[str]:
    return {str(name.value) for name in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- creation and reuse ---------------------------------------------------------


def test_first_call_creates_private_keys_and_public_certificates(tmp_path: Path) -> None:
    certs = ensure_certificates(tmp_path / "tls", DOMAIN, now=NOW)
    assert _mode(certs.ca_cert_path) == 0o644
    assert _mode(certs.cert_path) == 0o644
    assert _mode(certs.key_path) == 0o600
    assert _mode(certs.ca_cert_path.parent / CA_KEY_FILE) == 0o600
    assert not list((tmp_path / "tls").glob("*.tmp"))
    assert certs.ca_fingerprint_sha256 == _cert(certs.ca_cert_path).fingerprint(hashes.SHA256()).hex()
    assert all(data.startswith(b"-----BEGIN ") for data in _files(certs).values())


def test_ca_is_a_p256_ca_that_may_only_sign_leaves(tmp_path: Path) -> None:
    ca = _cert(ensure_certificates(tmp_path, DOMAIN, now=NOW).ca_cert_path)
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    assert isinstance(key.curve, ec.SECP256R1)
    assert ca.issuer == ca.subject
    (common_name,) = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert str(common_name.value).startswith("e2b-compat local CA ")
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert usage.crl_sign
    assert not usage.digital_signature
    assert ca.not_valid_after_utc - NOW >= timedelta(days=3649)


def test_leaf_names_the_domain_its_wildcard_api_and_loopback(tmp_path: Path) -> None:
    certs = ensure_certificates(tmp_path, "e2b.localhost:8443", now=NOW)
    leaf = _cert(certs.cert_path)
    assert _names(leaf) == {"e2b.localhost", "*.e2b.localhost", "api.e2b.localhost", "127.0.0.1", "::1"}
    addresses = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(addresses.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf.verify_directly_issued_by(_cert(certs.ca_cert_path))
    assert leaf.not_valid_after_utc - NOW == timedelta(days=365)


def test_second_call_reuses_every_file(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, DOMAIN, now=NOW)
    before = _files(first)
    second = ensure_certificates(tmp_path, f"{DOMAIN}:8443", now=NOW + timedelta(days=100))
    assert second == first
    assert _files(second) == before


def test_changed_domain_reissues_the_leaf_under_the_same_ca(tmp_path: Path) -> None:
    before = _files(ensure_certificates(tmp_path, DOMAIN, now=NOW))
    certs = ensure_certificates(tmp_path, "sandboxes.example.test", now=NOW)
    after = _files(certs)
    assert (after["ca"], after["ca_key"]) == (before["ca"], before["ca_key"])
    assert after["cert"] != before["cert"]
    assert after["key"] != before["key"]
    leaf = _cert(certs.cert_path)
    assert "*.sandboxes.example.test" in _names(leaf)
    assert "*.e2b.localhost" not in _names(leaf)
    leaf.verify_directly_issued_by(_cert(certs.ca_cert_path))


@pytest.mark.parametrize(("days_later", "reissued"), [(334, False), (336, True), (400, True)])
def test_leaf_is_reissued_within_30_days_of_expiry(tmp_path: Path, days_later: int, reissued: bool) -> None:
    before = _files(ensure_certificates(tmp_path, DOMAIN, now=NOW))
    later = NOW + timedelta(days=days_later)
    certs = ensure_certificates(tmp_path, DOMAIN, now=later)
    after = _files(certs)
    assert after["ca"] == before["ca"]
    assert (after["cert"] != before["cert"]) is reissued
    assert _cert(certs.cert_path).not_valid_after_utc - later >= timedelta(days=30)


def test_leaf_with_a_mismatched_key_is_reissued(tmp_path: Path) -> None:
    certs = ensure_certificates(tmp_path, DOMAIN, now=NOW)
    other = ensure_certificates(tmp_path / "other", DOMAIN, now=NOW)
    certs.key_path.write_bytes(other.key_path.read_bytes())  # as if a start died between key and certificate
    stale = certs.cert_path.read_bytes()
    ensure_certificates(tmp_path, DOMAIN, now=NOW)
    assert certs.cert_path.read_bytes() != stale
    ssl_context(certs)  # load_cert_chain checks that key and certificate belong together


# -- refusals -------------------------------------------------------------------


@pytest.mark.parametrize("domain", ["localhost", "localhost:8443", "e2b"])
def test_single_label_domain_is_refused(tmp_path: Path, domain: str) -> None:
    with pytest.raises(EdgeCertificateError, match="single label"):
        ensure_certificates(tmp_path, domain, now=NOW)
    assert not (tmp_path / "ca.pem").exists()


@pytest.mark.parametrize("domain", ["E2B.localhost", "e2b.localhost:0", "e2b.localhost.", "1.2.3.4"])
def test_malformed_domain_is_refused(tmp_path: Path, domain: str) -> None:
    with pytest.raises(EdgeCertificateError, match="domain"):
        ensure_certificates(tmp_path, domain, now=NOW)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_ca_key_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    ensure_certificates(tmp_path, DOMAIN, now=NOW)
    (tmp_path / CA_KEY_FILE).chmod(mode)
    with pytest.raises(EdgeCertificateError, match=r"group and others must have no access \(chmod 600"):
        ensure_certificates(tmp_path, DOMAIN, now=NOW)


def test_ca_without_its_key_is_refused_not_replaced(tmp_path: Path) -> None:
    ca = ensure_certificates(tmp_path, DOMAIN, now=NOW).ca_cert_path.read_bytes()
    (tmp_path / CA_KEY_FILE).unlink()
    with pytest.raises(EdgeCertificateError, match="has no key"):
        ensure_certificates(tmp_path, DOMAIN, now=NOW)
    assert (tmp_path / "ca.pem").read_bytes() == ca


def test_expiring_ca_is_refused(tmp_path: Path) -> None:
    ensure_certificates(tmp_path, DOMAIN, now=NOW)
    with pytest.raises(EdgeCertificateError, match="new CA"):
        ensure_certificates(tmp_path, DOMAIN, now=NOW + timedelta(days=3640))


def test_naive_now_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        ensure_certificates(tmp_path, DOMAIN, now=datetime(2026, 6, 1))


# -- real handshakes ------------------------------------------------------------


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> EdgeCertificates:
    return ensure_certificates(tmp_path_factory.mktemp("edge"), DOMAIN)


def _handshake(certs: EdgeCertificates, server_hostname: str, alpn: tuple[str, ...] = ("h2", "http/1.1")) -> str | None:
    """Connect to a one-shot TLS server on 127.0.0.1 with a client trusting only the CA; the agreed ALPN."""
    server_context = ssl_context(certs)
    client_context = ssl.create_default_context(cafile=str(certs.ca_cert_path))
    client_context.set_alpn_protocols(list(alpn))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)

        def serve() -> None:
            try:
                connection, _ = listener.accept()
                with server_context.wrap_socket(connection, server_side=True) as tls:
                    tls.sendall(b"ok")
            except OSError:  # the client refused the certificate: its side is what the tests check
                pass

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with (
                socket.create_connection(listener.getsockname(), timeout=10) as raw,
                client_context.wrap_socket(raw, server_hostname=server_hostname) as tls,
            ):
                assert tls.recv(2) == b"ok"
                return tls.selected_alpn_protocol()
        finally:
            thread.join(10)
            assert not thread.is_alive()


@pytest.mark.parametrize("server_hostname", ["api.e2b.localhost", "49983-abc.e2b.localhost", "e2b.localhost"])
def test_handshake_verifies_for_names_under_the_domain(edge: EdgeCertificates, server_hostname: str) -> None:
    assert _handshake(edge, server_hostname) == "http/1.1"


def test_handshake_verifies_for_loopback_address(edge: EdgeCertificates) -> None:
    assert _handshake(edge, "127.0.0.1") == "http/1.1"


@pytest.mark.parametrize("server_hostname", ["evil.example", "a.b.e2b.localhost", "e2b.localhost.evil.example"])
def test_handshake_fails_for_other_names(edge: EdgeCertificates, server_hostname: str) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(edge, server_hostname)


def test_server_never_agrees_to_h2(edge: EdgeCertificates) -> None:
    assert _handshake(edge, "api.e2b.localhost", alpn=("h2",)) is None


def test_server_context_requires_tls12(edge: EdgeCertificates) -> None:
    assert ssl_context(edge).minimum_version == ssl.TLSVersion.TLSv1_2
