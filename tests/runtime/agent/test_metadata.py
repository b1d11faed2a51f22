"""What the runtime publishes in /run/e2b: the identity an /init reads, and the token hash that authorizes a reset.

An agent restored from another sandbox's memory (a fork) holds that sandbox's token and ids; the
runtime publishes the new sandbox's ids and the SHA-512 of its token, as envd's metadata service
does. These run the agent's app in-process with the folder pointed at a scratch one.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import httpx

from runtime.agent._app import create_app
from runtime.agent._metadata import ACCESS_TOKEN_HASH_FILE, expected_token_hash, matches_hash, published_ids
from runtime.agent._state import AgentState, internal_env


def _publish(folder: Path, sandbox_id: str, token: str | None) -> None:
    (folder / ".E2B_SANDBOX_ID").write_text(sandbox_id)
    (folder / ".E2B_TEMPLATE_ID").write_text("base")
    (folder / ACCESS_TOKEN_HASH_FILE).write_text(hashlib.sha512((token or "").encode()).hexdigest())


def _inits(state: AgentState, *bodies: dict[str, object]) -> list[tuple[int, str]]:
    async def go() -> list[tuple[int, str]]:
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            answers = [await client.post("/init", json=body) for body in bodies]
        return [(answer.status_code, answer.text) for answer in answers]

    return asyncio.run(go())


def test_the_published_hash_lets_a_restored_agent_take_its_new_token_and_identity(tmp_path: Path) -> None:
    state = AgentState(internal=internal_env({"E2B_SANDBOX_ID": "source", "E2B_TEMPLATE_ID": "base"}))
    state.metadata_dir = tmp_path
    state.access_token = "source-token"  # what the restored memory holds
    _publish(tmp_path, "fork-1", "fork-token")
    answers = _inits(
        state,
        {"accessToken": "guess"},  # neither the current token nor the published one
        {},  # no token: the hash of "" is not the published one
        {"accessToken": "fork-token", "envVars": {"A": "1"}},
        {"accessToken": "fork-token"},  # repeated: the current token
    )
    assert answers == [
        (401, "access token validation failed"),
        (401, "access token reset not authorized"),
        (204, ""),
        (204, ""),
    ]
    assert state.access_token == "fork-token"
    assert state.internal["E2B_SANDBOX_ID"] == "fork-1"
    assert state.global_env()["E2B_SANDBOX_ID"] == "fork-1"


def test_a_refused_init_changes_no_identity(tmp_path: Path) -> None:
    state = AgentState(internal=internal_env({"E2B_SANDBOX_ID": "source"}))
    state.metadata_dir = tmp_path
    state.access_token = "source-token"
    _publish(tmp_path, "fork-2", "fork-token")
    assert _inits(state, {"accessToken": "wrong"})[0][0] == 401
    assert (state.access_token, state.internal["E2B_SANDBOX_ID"]) == ("source-token", "source")


def test_a_published_empty_token_allows_clearing_only(tmp_path: Path) -> None:
    state = AgentState()
    state.metadata_dir = tmp_path
    state.access_token = "source-token"
    _publish(tmp_path, "fork-3", None)  # the new sandbox is not secured
    assert [code for code, _ in _inits(state, {"accessToken": "anything"}, {})] == [401, 204]
    assert state.access_token is None


def test_without_a_published_folder_the_first_init_sets_the_token(tmp_path: Path) -> None:
    state = AgentState()
    state.metadata_dir = tmp_path / "absent"
    assert [code for code, _ in _inits(state, {"accessToken": "t1"}, {"accessToken": "t2"})] == [204, 401]
    assert published_ids(tmp_path / "absent") == {}
    assert expected_token_hash(tmp_path / "absent") is None


def test_matches_hash_is_sha512_hex_of_the_token() -> None:
    assert matches_hash("x", hashlib.sha512(b"x").hexdigest())
    assert matches_hash(None, hashlib.sha512(b"").hexdigest())
    assert not matches_hash("x", hashlib.sha512(b"y").hexdigest())
