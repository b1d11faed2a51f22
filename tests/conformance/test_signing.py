"""Ed25519 report signatures: the key file, signing, and a verify that any changed byte fails."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conformance._signing import (
    KEY_ENV,
    SigningKeyError,
    default_key_path,
    fingerprint,
    load_or_create_signing_key,
    sign,
    sign_report,
    verify,
)

REPORT = b'{\n  "schema_version": "1.0",\n  "target": {"server": "caf\xc3\xa9"}\n}\n'


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def signed(tmp_path: Path, key: Ed25519PrivateKey) -> Path:
    """A folder holding report.json, report.json.sig and report.json.pub."""
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "report.json").write_bytes(REPORT)
    sign_report(folder / "report.json", key)
    return folder


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


# --- keys ---


def test_a_key_is_created_private_once_and_then_reused(tmp_path: Path) -> None:
    path = tmp_path / "config" / "e2b-compat" / "key.pem"
    first = load_or_create_signing_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    pem = path.read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS#8, unencrypted
    again = load_or_create_signing_key(path)
    assert fingerprint(again.public_key()) == fingerprint(first.public_key())
    assert path.read_bytes() == pem
    assert [p.name for p in path.parent.iterdir()] == ["key.pem"]  # no temporary left behind


def test_the_key_path_comes_from_the_environment_or_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_key_path({}) == tmp_path / ".config" / "e2b-compat" / "report-signing-key.pem"
    assert default_key_path({KEY_ENV: ""}) == tmp_path / ".config" / "e2b-compat" / "report-signing-key.pem"
    assert default_key_path({KEY_ENV: "~/keys/k.pem"}) == tmp_path / "keys" / "k.pem"
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "from-env.pem"))
    load_or_create_signing_key()
    assert (tmp_path / "from-env.pem").is_file()


def test_a_key_others_can_read_is_refused_without_showing_it(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    load_or_create_signing_key(path)
    path.chmod(0o640)
    with pytest.raises(SigningKeyError, match="mode 0640") as info:
        load_or_create_signing_key(path)
    assert "PRIVATE" not in str(info.value)


def test_a_key_file_that_is_not_an_ed25519_key_is_refused_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0LXNlY3JldA==\n-----END PRIVATE KEY-----\n")
    os.close(fd)
    with pytest.raises(SigningKeyError, match="not an unencrypted PEM private key") as info:
        load_or_create_signing_key(path)
    assert "c2VjcmV0" not in str(info.value)
    assert info.value.__cause__ is None  # the library's message (which could quote input) is dropped

    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(ec_pem)
    with pytest.raises(SigningKeyError, match="not an Ed25519 key"):
        load_or_create_signing_key(path)


# --- signing ---


def test_sign_writes_the_signature_file_and_public_key(signed: Path, key: Ed25519PrivateKey) -> None:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    expected = hashlib.sha256(raw).hexdigest()
    document = json.loads((signed / "report.json.sig").read_bytes())
    assert set(document) == {"algorithm", "fingerprint", "signature"}
    assert document["algorithm"] == "ed25519"
    assert document["fingerprint"] == expected
    signature = base64.b64decode(document["signature"], validate=True)
    key.public_key().verify(signature, REPORT)  # over the exact bytes of report.json
    pub = serialization.load_pem_public_key((signed / "report.json.pub").read_bytes())
    assert pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == raw
    assert sign(REPORT, key).signature_file() == (signed / "report.json.sig").read_bytes()  # deterministic


# --- verify ---


def test_a_fresh_report_verifies_by_folder_or_file(signed: Path, key: Ed25519PrivateKey) -> None:
    for path in (signed, signed / "report.json"):
        result = verify(path)
        assert result.valid, result.problem
        assert result.fingerprint == fingerprint(key.public_key())
        assert result.trusted is False
    trusted = verify(signed, trusted_fingerprint=fingerprint(key.public_key()))
    assert trusted.valid
    assert trusted.trusted
    spaced = ":".join(fingerprint(key.public_key()).upper()[i : i + 2] for i in range(0, 64, 2))
    assert verify(signed, trusted_fingerprint=spaced).valid  # as people copy fingerprints around


@pytest.mark.parametrize("position", [0, 1, 17, len(REPORT) // 2, len(REPORT) - 2, len(REPORT) - 1])
def test_any_changed_byte_of_the_report_fails(signed: Path, position: int) -> None:
    flip(signed / "report.json", position)
    result = verify(signed)
    assert not result.valid
    assert "does not match the bytes of report.json" in result.problem


def test_an_appended_byte_of_the_report_fails(signed: Path) -> None:
    (signed / "report.json").write_bytes(REPORT + b"\n")
    assert not verify(signed).valid


def test_every_changed_byte_of_the_signature_file_fails(signed: Path) -> None:
    path = signed / "report.json.sig"
    original = path.read_bytes()
    for position in range(len(original)):
        flip(path, position)
        result = verify(signed)
        assert not result.valid, f"byte {position} ({chr(original[position])!r}) changed, still valid"
        assert result.problem
        path.write_bytes(original)
    assert verify(signed).valid


def test_a_signature_with_changed_unused_base64_bits_fails(signed: Path) -> None:
    path = signed / "report.json.sig"
    document = json.loads(path.read_bytes())
    encoded = document["signature"]
    assert encoded.endswith("==")  # 64 bytes: the last character carries 2 bits and 4 unused ones
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = encoded[-3]
    tweaked = encoded[:-3] + alphabet[alphabet.index(last) ^ 0x01] + "=="
    assert base64.b64decode(tweaked) == base64.b64decode(encoded)  # what a lenient verifier would accept
    document["signature"] = tweaked
    path.write_text(json.dumps(document, sort_keys=True, indent=2) + "\n", encoding="ascii")
    result = verify(signed)
    assert not result.valid
    assert "canonical base64" in result.problem


def test_a_reformatted_signature_file_fails(signed: Path) -> None:
    path = signed / "report.json.sig"
    path.write_text(json.dumps(json.loads(path.read_bytes())), encoding="ascii")  # same content, one line
    assert "edited" in verify(signed).problem


def test_every_changed_byte_of_the_public_key_fails(signed: Path) -> None:
    path = signed / "report.json.pub"
    original = path.read_bytes()
    for position in range(len(original)):
        flip(path, position)
        assert not verify(signed).valid, f"byte {position} ({chr(original[position])!r}) changed, still valid"
        path.write_bytes(original)


def test_another_keys_public_key_fails_and_a_consistent_resign_fails_the_fingerprint(
    signed: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    trusted = fingerprint(key.public_key())
    other = Ed25519PrivateKey.generate()
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / "report.json").write_bytes(REPORT)
    sign_report(elsewhere / "report.json", other)

    original_pub = (signed / "report.json.pub").read_bytes()
    (signed / "report.json.pub").write_bytes((elsewhere / "report.json.pub").read_bytes())
    swapped = verify(signed, trusted_fingerprint=trusted)
    assert not swapped.valid
    assert "not the one the signature names" in swapped.problem
    assert not verify(signed).valid  # the signature names its key even without a trusted fingerprint

    # Someone re-signs the report with their own key and ships both files: consistent, but not ours.
    (signed / "report.json.pub").write_bytes(original_pub)
    for name in ("report.json.sig", "report.json.pub"):
        (signed / name).write_bytes((elsewhere / name).read_bytes())
    assert verify(signed).valid
    impostor = verify(signed, trusted_fingerprint=trusted)
    assert not impostor.valid
    assert impostor.problem == f"signed with key {fingerprint(other.public_key())}, not with the trusted key {trusted}"


def test_missing_files_and_bad_fingerprints_are_reported(signed: Path) -> None:
    assert "must be 64 hex digits" in verify(signed, trusted_fingerprint="abc").problem
    (signed / "report.json.sig").unlink()
    missing = verify(signed)
    assert not missing.valid
    assert "report.json.sig does not exist" in missing.problem
    assert "does not exist" in verify(signed / "nothing.json").problem
