"""Credential primitives: API key hashes, sealed sandbox tokens, master key file, redaction, file signatures."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import re
import stat
import threading
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_server._credentials import (
    DEFAULT_ITERATIONS,
    MASTER_KEY_BYTES,
    MasterKeyError,
    SealedToken,
    TokenError,
    TokenScope,
    TokenVault,
    file_signature,
    hash_api_key,
    is_api_key,
    key_id,
    load_or_create_master_key,
    new_api_key,
    new_sandbox_token,
    redact,
    verify_api_key,
)

SDK_KEY_RE = re.compile(r"^e2b_[0-9a-f]+$")  # what the official SDKs check before any request
HASH_RE = re.compile(r"pbkdf2-sha256\$([0-9]+)\$([0-9a-f]{32})\$([0-9a-f]{64})")
FAST = 1_000  # iterations for tests that do not measure the default

MASTER_1 = bytes(range(32))
MASTER_2 = bytes(range(100, 132))
SANDBOX = "sandbox-0d6f3c1e-8f0b-4c59-9a57-6b2f1e0c7a41"
VAULT = TokenVault(MASTER_1)


# -- API keys -------------------------------------------------------------------


def test_new_api_key_is_what_the_sdks_accept() -> None:
    keys = {new_api_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert SDK_KEY_RE.fullmatch(key)
        assert len(key) == len("e2b_") + 40
        assert is_api_key(key)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("e2b_a1b2c3", True),
        ("e2b_" + "0" * 40, True),
        ("e2b_", False),
        ("E2B_abc", False),
        ("e2b_ABC", False),
        ("e2b_abcg", False),
        ("e2b_abc\n", False),
        ("xe2b_abc", False),
        ("e2b_ab c", False),
    ],
)
def test_is_api_key_matches_the_sdk_regex(value: str, valid: bool) -> None:
    # Stricter than the Python SDK's re.match, whose `$` would also let a trailing newline through.
    assert is_api_key(value) is valid


def test_hash_has_the_stored_format_and_is_pbkdf2_sha256() -> None:
    key = new_api_key()
    stored = hash_api_key(key, iterations=FAST)
    match = HASH_RE.fullmatch(stored)
    assert match is not None
    iterations, salt, digest = int(match[1]), bytes.fromhex(match[2]), bytes.fromhex(match[3])
    assert iterations == FAST
    assert digest == hashlib.pbkdf2_hmac("sha256", key.encode(), salt, FAST)
    assert key not in stored


def test_default_iterations_are_at_least_200k() -> None:
    assert DEFAULT_ITERATIONS >= 200_000
    stored = hash_api_key("e2b_a1b2c3")
    match = HASH_RE.fullmatch(stored)
    assert match is not None
    assert int(match[1]) == DEFAULT_ITERATIONS
    assert verify_api_key("e2b_a1b2c3", stored)


def test_hashes_of_one_key_are_salted_differently() -> None:
    key = new_api_key()
    first, second = hash_api_key(key, iterations=FAST), hash_api_key(key, iterations=FAST)
    assert first != second
    assert verify_api_key(key, first)
    assert verify_api_key(key, second)


def test_verify_with_a_wrong_key_is_false() -> None:
    key = new_api_key()
    stored = hash_api_key(key, iterations=FAST)
    assert not verify_api_key(new_api_key(), stored)
    assert not verify_api_key(key[:-1], stored)
    assert not verify_api_key(key.upper(), stored)
    assert not verify_api_key("", stored)


STORED = hash_api_key("e2b_a1b2c3", iterations=FAST)
_, _ITER, _SALT, _DIGEST = STORED.split("$")


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "garbage",
        "$$$",
        f"pbkdf2-sha512${_ITER}${_SALT}${_DIGEST}",
        f"pbkdf2-sha256${_ITER}${_SALT}",
        f"pbkdf2-sha256${_ITER}${_SALT}${_DIGEST}$",
        f"pbkdf2-sha256$0${_SALT}${_DIGEST}",
        f"pbkdf2-sha256$-1${_SALT}${_DIGEST}",
        f"pbkdf2-sha256$01000${_SALT}${_DIGEST}",
        f"pbkdf2-sha256$ 1000${_SALT}${_DIGEST}",
        f"pbkdf2-sha256$99999999${_SALT}${_DIGEST}",
        f"pbkdf2-sha256$\N{ARABIC-INDIC DIGIT ONE}000${_SALT}${_DIGEST}",
        f"pbkdf2-sha256$abc${_SALT}${_DIGEST}",
        f"pbkdf2-sha256${_ITER}$${_DIGEST}",
        f"pbkdf2-sha256${_ITER}${_SALT[:-1]}${_DIGEST}",
        f"pbkdf2-sha256${_ITER}${_SALT.upper()}${_DIGEST}",
        f"pbkdf2-sha256${_ITER}${_SALT}${_DIGEST[:-2]}",
        f"pbkdf2-sha256${_ITER}${_SALT}${_DIGEST}00",
        f"pbkdf2-sha256${_ITER}${_SALT}${_DIGEST[:-1]}z",
    ],
)
def test_malformed_stored_hash_is_false_not_an_error(stored: str) -> None:
    assert not verify_api_key("e2b_a1b2c3", stored)


def test_the_unaltered_stored_hash_verifies() -> None:
    assert verify_api_key("e2b_a1b2c3", STORED)


@pytest.mark.parametrize("stored", [None, 42, b"pbkdf2-sha256$1$00$00"])
def test_stored_values_of_other_types_are_false(stored: object) -> None:
    assert not verify_api_key("e2b_a1b2c3", cast(str, stored))


@pytest.mark.parametrize("key", ["E2B_A1B2C3", "e2b_", "sk_abc", "e2b_a1b2\N{BLACK STAR}"])
def test_hash_refuses_what_is_not_a_key(key: str) -> None:
    with pytest.raises(ValueError, match="not an API key"):
        hash_api_key(key, iterations=FAST)


def test_a_refused_key_is_not_echoed() -> None:
    almost = new_api_key().upper()
    with pytest.raises(ValueError, match="not an API key") as error:
        hash_api_key(almost, iterations=FAST)
    assert almost not in str(error.value)
    assert almost[4:] not in str(error.value)


@pytest.mark.parametrize("iterations", [0, -5, 10_000_001])
def test_hash_refuses_iterations_out_of_range(iterations: int) -> None:
    with pytest.raises(ValueError, match="iterations"):
        hash_api_key("e2b_a1b2c3", iterations=iterations)


def test_key_id_is_a_short_stable_fingerprint() -> None:
    key = new_api_key()
    assert re.fullmatch(r"[0-9a-f]{12}", key_id(key))
    assert key_id(key) == key_id(key)
    assert key_id(key) not in key
    assert len({key_id(new_api_key()) for _ in range(200)}) == 200
    assert re.fullmatch(r"[0-9a-f]{12}", key_id("not a key \udcff"))  # any presented header value


# -- sandbox tokens -------------------------------------------------------------


def test_sandbox_tokens_are_32_random_bytes_in_hex() -> None:
    tokens = {new_sandbox_token() for _ in range(50)}
    assert len(tokens) == 50
    assert all(re.fullmatch(r"[0-9a-f]{64}", token) for token in tokens)


def test_token_scopes_have_fixed_numbers() -> None:
    assert [(s.name, int(s)) for s in TokenScope] == [("ENVD", 1), ("TRAFFIC", 2), ("VOLUME", 3)]


def test_seal_open_and_match() -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, TokenScope.ENVD, SANDBOX)
    assert sealed.version == 1
    assert VAULT.open(sealed, TokenScope.ENVD, SANDBOX) == token
    assert VAULT.matches(token, sealed, TokenScope.ENVD, SANDBOX)


def test_each_seal_uses_a_fresh_nonce() -> None:
    token = new_sandbox_token()
    first, second = (VAULT.seal(token, TokenScope.ENVD, SANDBOX) for _ in range(2))
    assert first.nonce != second.nonce
    assert first.ciphertext != second.ciphertext
    assert first.digest != second.digest


def test_matches_is_false_for_other_or_missing_tokens() -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, TokenScope.ENVD, SANDBOX)
    for presented in (None, "", new_sandbox_token(), token[:-1], token.upper(), token + "0"):
        assert not VAULT.matches(presented, sealed, TokenScope.ENVD, SANDBOX)


@pytest.mark.parametrize("sealed_as", list(TokenScope))
@pytest.mark.parametrize("checked_as", list(TokenScope))
def test_a_token_never_validates_in_another_scope(sealed_as: TokenScope, checked_as: TokenScope) -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, sealed_as, SANDBOX)
    same = sealed_as is checked_as
    assert VAULT.matches(token, sealed, checked_as, SANDBOX) is same
    if same:
        assert VAULT.open(sealed, checked_as, SANDBOX) == token
    else:
        with pytest.raises(TokenError):
            VAULT.open(sealed, checked_as, SANDBOX)


def test_a_token_never_validates_for_another_sandbox() -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, TokenScope.TRAFFIC, SANDBOX)
    for other in (SANDBOX + "x", SANDBOX[:-1], "", SANDBOX.upper()):
        assert not VAULT.matches(token, sealed, TokenScope.TRAFFIC, other)
        with pytest.raises(TokenError):
            VAULT.open(sealed, TokenScope.TRAFFIC, other)


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.mark.parametrize("field", ["nonce", "ciphertext", "digest"])
@pytest.mark.parametrize("where", [0, -1])
def test_any_flipped_byte_fails_open_and_matches(field: str, where: int) -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, TokenScope.ENVD, SANDBOX)
    original: bytes = getattr(sealed, field)
    tampered = SealedToken(**(dataclasses.asdict(sealed) | {field: _flip(original, where % len(original))}))
    with pytest.raises(TokenError):
        VAULT.open(tampered, TokenScope.ENVD, SANDBOX)
    assert not VAULT.matches(token, tampered, TokenScope.ENVD, SANDBOX)


def test_every_ciphertext_byte_is_covered() -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, TokenScope.VOLUME, SANDBOX)
    for index in range(len(sealed.ciphertext)):
        tampered = dataclasses.replace(sealed, ciphertext=_flip(sealed.ciphertext, index))
        with pytest.raises(TokenError):
            VAULT.open(tampered, TokenScope.VOLUME, SANDBOX)
        assert not VAULT.matches(token, tampered, TokenScope.VOLUME, SANDBOX)


def test_another_master_key_neither_opens_nor_matches() -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, TokenScope.ENVD, SANDBOX)
    stranger = TokenVault(MASTER_2)
    with pytest.raises(TokenError):
        stranger.open(sealed, TokenScope.ENVD, SANDBOX)
    assert not stranger.matches(token, sealed, TokenScope.ENVD, SANDBOX)


def test_rotation_keeps_old_blobs_and_seals_with_the_newest() -> None:
    token = new_sandbox_token()
    old_vault = TokenVault(MASTER_1, 1)
    old = old_vault.seal(token, TokenScope.ENVD, SANDBOX)
    rotated = TokenVault(MASTER_2, 2, previous={1: MASTER_1})
    assert rotated.versions == (1, 2)
    assert rotated.open(old, TokenScope.ENVD, SANDBOX) == token
    assert rotated.matches(token, old, TokenScope.ENVD, SANDBOX)
    new = rotated.seal(token, TokenScope.ENVD, SANDBOX)
    assert new.version == 2
    assert rotated.open(new, TokenScope.ENVD, SANDBOX) == token
    # The vault that never had version 2 fails closed on it.
    with pytest.raises(TokenError, match="key version 2"):
        old_vault.open(new, TokenScope.ENVD, SANDBOX)
    assert not old_vault.matches(token, new, TokenScope.ENVD, SANDBOX)


def test_dropping_an_old_key_makes_its_blobs_fail_closed() -> None:
    token = new_sandbox_token()
    old = TokenVault(MASTER_1, 1).seal(token, TokenScope.TRAFFIC, SANDBOX)
    retired = TokenVault(MASTER_2, 2)
    with pytest.raises(TokenError, match="key version 1"):
        retired.open(old, TokenScope.TRAFFIC, SANDBOX)
    assert not retired.matches(token, old, TokenScope.TRAFFIC, SANDBOX)


def test_relabelling_the_key_version_fails() -> None:
    token = new_sandbox_token()
    same_master = TokenVault(MASTER_1, 2, previous={1: MASTER_1})
    sealed = same_master.seal(token, TokenScope.ENVD, SANDBOX)
    relabelled = dataclasses.replace(sealed, version=1)
    with pytest.raises(TokenError):
        same_master.open(relabelled, TokenScope.ENVD, SANDBOX)
    assert not same_master.matches(token, relabelled, TokenScope.ENVD, SANDBOX)


@pytest.mark.parametrize(
    ("master", "version", "previous"),
    [
        (MASTER_1[:31], 1, None),
        (MASTER_1 + b"\x00", 1, None),
        (MASTER_1, 0, None),
        (MASTER_1, True, None),
        (MASTER_1, 2**32, None),
        (MASTER_1, 1, {2: MASTER_2}),
        (MASTER_1, 1, {1: MASTER_2}),
        (MASTER_1, 2, {1: MASTER_2[:16]}),
    ],
)
def test_vault_refuses_bad_key_material(master: bytes, version: int, previous: dict[int, bytes] | None) -> None:
    with pytest.raises(ValueError, match=r"version|bytes"):
        TokenVault(master, version, previous=previous)


def test_seal_refuses_an_empty_token_or_sandbox() -> None:
    with pytest.raises(ValueError, match="empty token"):
        VAULT.seal("", TokenScope.ENVD, SANDBOX)
    with pytest.raises(ValueError, match="sandbox id"):
        VAULT.seal(new_sandbox_token(), TokenScope.ENVD, "")


def test_sealed_token_survives_json() -> None:
    sealed = VAULT.seal(new_sandbox_token(), TokenScope.ENVD, SANDBOX)
    record = json.loads(json.dumps(sealed.to_dict()))
    assert SealedToken.from_dict(record) == sealed


def _record() -> dict[str, Any]:
    return dict(VAULT.seal(new_sandbox_token(), TokenScope.ENVD, SANDBOX).to_dict())


@pytest.mark.parametrize(
    "change",
    [
        {"version": "1"},
        {"version": True},
        {"version": 0},
        {"version": None},
        {"nonce": "not base64!"},
        {"nonce": base64.b64encode(b"short").decode()},
        {"digest": base64.b64encode(b"\x00" * 31).decode()},
        {"ciphertext": base64.b64encode(b"\x00" * 16).decode()},
        {"ciphertext": 12},
        {"digest": "\N{BLACK STAR}"},
        {"extra": 1},
    ],
)
def test_malformed_records_are_token_errors(change: dict[str, object]) -> None:
    record = _record() | change
    with pytest.raises(TokenError):
        SealedToken.from_dict(record)


def test_a_record_missing_a_field_is_a_token_error() -> None:
    record = _record()
    del record["digest"]
    with pytest.raises(TokenError):
        SealedToken.from_dict(record)


@given(
    token=st.text(min_size=1, max_size=200),
    sandbox_id=st.text(min_size=1, max_size=64),
    scope=st.sampled_from(TokenScope),
)
def test_seal_open_round_trip(token: str, sandbox_id: str, scope: TokenScope) -> None:
    sealed = SealedToken.from_dict(json.loads(json.dumps(VAULT.seal(token, scope, sandbox_id).to_dict())))
    assert VAULT.open(sealed, scope, sandbox_id) == token
    assert VAULT.matches(token, sealed, scope, sandbox_id)
    assert not VAULT.matches(token + "x", sealed, scope, sandbox_id)


@given(token=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64), sandbox_id=st.uuids())
def test_hex_tokens_round_trip(token: str, sandbox_id: uuid.UUID) -> None:
    sandbox = f"sandbox-{sandbox_id}"
    sealed = VAULT.seal(token, TokenScope.ENVD, sandbox)
    assert VAULT.open(sealed, TokenScope.ENVD, sandbox) == token


# -- redaction ------------------------------------------------------------------


def test_redact() -> None:
    key = "e2b_" + "0123456789abcdef" * 2 + "00003f9a"
    assert redact(key) == "e2b_\N{HORIZONTAL ELLIPSIS}3f9a"
    token = new_sandbox_token()
    assert redact(token) == f"\N{HORIZONTAL ELLIPSIS}{token[-4:]}"
    assert redact("e2b_a1b2c3") == "e2b_\N{HORIZONTAL ELLIPSIS}"
    assert redact("fixture") == "\N{HORIZONTAL ELLIPSIS}"
    assert redact("v1_" + "A" * 43).startswith("v1_")
    assert redact(None) == "<none>"
    assert redact("") == "<empty>"
    assert token not in redact(token)


def test_objects_holding_secrets_never_show_them(caplog: pytest.LogCaptureFixture) -> None:
    token = new_sandbox_token()
    vault = TokenVault(MASTER_2, 2, previous={1: MASTER_1})
    sealed = vault.seal(token, TokenScope.ENVD, SANDBOX)
    logger = logging.getLogger("tests.reference_server.credentials")
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        logger.info("sealed %s %r with %s %r", sealed, sealed, vault, vault)
        logger.info("fields %s", {"sealed": sealed, "vault": vault})
    shown = [caplog.text, repr(sealed), str(sealed), repr(vault), str(vault), f"{sealed} {vault!r}"]
    secrets = [token, MASTER_1.hex(), MASTER_2.hex(), sealed.digest.hex(), repr(MASTER_1), repr(MASTER_2)]
    assert "SealedToken(version=2" in caplog.text
    assert "TokenVault(versions=[1, 2]" in caplog.text
    for text in shown:
        for secret in secrets:
            assert secret not in text
        assert not re.search(r"[0-9a-f]{16,}", text)
    assert token not in json.dumps(sealed.to_dict())
    assert not hasattr(vault, "__dict__")


def test_errors_do_not_carry_the_token() -> None:
    token = new_sandbox_token()
    sealed = VAULT.seal(token, TokenScope.ENVD, SANDBOX)
    with pytest.raises(TokenError) as error:
        VAULT.open(sealed, TokenScope.TRAFFIC, SANDBOX)
    assert token not in str(error.value)


# -- master key file ------------------------------------------------------------


def test_master_key_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    previous = os.umask(0)
    try:
        key = load_or_create_master_key(path)
    finally:
        os.umask(previous)
    assert len(key) == MASTER_KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == key
    assert load_or_create_master_key(path) == key
    assert [p.name for p in tmp_path.iterdir()] == ["master.key"]  # no temporary file left behind


def test_concurrent_starts_agree_on_one_key(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    barrier = threading.Barrier(8)
    keys: list[bytes] = []

    def start() -> None:
        barrier.wait()
        keys.append(load_or_create_master_key(path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8
    assert set(keys) == {path.read_bytes()}
    assert [p.name for p in tmp_path.iterdir()] == ["master.key"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o620, 0o602, 0o610])
def test_master_key_with_group_or_world_access_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "master.key"
    path.write_bytes(os.urandom(MASTER_KEY_BYTES))
    path.chmod(mode)
    with pytest.raises(MasterKeyError, match=f"mode {mode:04o}.*chmod 600"):
        load_or_create_master_key(path)


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_master_key_of_the_wrong_length_is_refused(tmp_path: Path, length: int) -> None:
    path = tmp_path / "master.key"
    path.write_bytes(b"\x07" * length)
    path.chmod(0o600)
    with pytest.raises(MasterKeyError, match="exactly 32 bytes"):
        load_or_create_master_key(path)
    assert path.read_bytes() == b"\x07" * length  # never replaced


def test_master_key_in_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MasterKeyError, match="cannot create the master key"):
        load_or_create_master_key(tmp_path / "absent" / "master.key")


def test_master_key_path_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    path.mkdir(mode=0o700)
    with pytest.raises(MasterKeyError, match="not a regular file"):
        load_or_create_master_key(path)


def test_master_key_path_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    os.mkfifo(path, 0o600)
    with pytest.raises(MasterKeyError, match="not a regular file"):
        load_or_create_master_key(path)


# -- signed file URLs -----------------------------------------------------------


def _independent_signature(raw: str) -> str:
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")


def test_file_signature_vectors() -> None:
    # Literals from `printf '%s' RAW | sha256sum | xxd -r -p | base64`, padding stripped.
    assert (
        file_signature("/home/user/report.csv", "read", "user", "4f1c2a9e", 1767225600)
        == "v1_WWa5DqP4/7yoTX4mM8QXXoFG1lQRDPj9IHNVehLx/Rw"
    )
    assert (
        file_signature("notes.txt", "write", None, "4f1c2a9e", None) == "v1_NunfFKOmFr1nsv4kTuq5Kofl1UWx68wn1fZBaly6Y7I"
    )


@given(
    path=st.text(max_size=80),
    operation=st.sampled_from(["read", "write"]),
    user=st.none() | st.text(max_size=20),
    token=st.text(alphabet="0123456789abcdef", min_size=1, max_size=64),
    expiration=st.none() | st.integers(min_value=0, max_value=2**40),
)
def test_file_signature_matches_an_independent_computation(
    path: str, operation: str, user: str | None, token: str, expiration: int | None
) -> None:
    raw = f"{path}:{operation}:{user or ''}:{token}" + ("" if expiration is None else f":{expiration}")
    signature = file_signature(path, "read" if operation == "read" else "write", user, token, expiration)
    assert signature == _independent_signature(raw)
    assert "=" not in signature


def test_file_signature_is_what_our_agent_accepts() -> None:
    from runtime.agent._files import signature as agent_signature

    token = new_sandbox_token()
    for user, expiration in ((None, None), ("user", 1767225600)):
        ours = file_signature("/tmp/x", "write", user, token, expiration)
        assert ours == agent_signature("/tmp/x", "write", user or "", token, expiration)


def test_file_signature_refuses_other_operations() -> None:
    with pytest.raises(ValueError, match="operation"):
        file_signature("/x", cast(Any, "delete"), None, "t", None)
