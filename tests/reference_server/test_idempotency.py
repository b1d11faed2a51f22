"""Idempotent creates: the same ``Idempotency-Key`` makes one sandbox, whatever the timing of the repeats.

Over the in-memory backend with the real service, store and routes (``reference_server._idempotency``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from reference_server._idempotency import RULES, WINDOW, Found, fingerprint

from .conftest import ALICE, BOB, Plane

pytestmark = pytest.mark.anyio

BODY = {"templateID": "base", "timeout": 300, "secure": True, "metadata": {"run": "1"}}


async def create(
    plane: Plane,
    key: str | bytes | None,
    body: dict[str, Any] | None = None,
    api_key: str = ALICE,
    path: str = "/v2/sandboxes",
) -> httpx.Response:
    headers = [(b"X-API-Key", api_key.encode())]
    if key is not None:
        headers.append((b"Idempotency-Key", key if isinstance(key, bytes) else key.encode()))
    return await plane.client.post(path, json=BODY if body is None else body, headers=headers)


async def sandboxes(plane: Plane) -> set[str]:
    return {info.sandbox_id for info in await plane.backend.list()}


async def keys(plane: Plane) -> list[tuple[Any, ...]]:
    rows = await plane.store.db.execute_fetchall("SELECT owner, key, sandbox_id FROM create_keys ORDER BY key")
    return [tuple(row) for row in rows]


async def test_a_repeated_create_answers_the_first_sandbox(plane: Plane) -> None:
    first = await create(plane, "run-1")
    assert first.status_code == 201, first.text
    again = await create(plane, "run-1")
    assert again.status_code == 201, again.text
    assert again.json() == first.json(), "the same sandbox, tokens and all"
    assert await sandboxes(plane) == {first.json()["sandboxID"]}
    other = await create(plane, "run-2")
    assert other.json()["sandboxID"] != first.json()["sandboxID"]
    plain = [await create(plane, None), await create(plane, None)]
    assert len({answer.json()["sandboxID"] for answer in plain}) == 2, "without a key every create is new"
    assert len(await sandboxes(plane)) == 4


async def test_keys_belong_to_their_owner(plane: Plane) -> None:
    alice = (await create(plane, "shared")).json()["sandboxID"]
    bob = await create(plane, "shared", api_key=BOB)
    assert bob.status_code == 201
    assert bob.json()["sandboxID"] != alice, "bob's key names bob's create, never alice's sandbox"


async def test_the_same_object_in_another_encoding_is_the_same_request(plane: Plane) -> None:
    first = (await create(plane, "enc")).json()["sandboxID"]
    reordered = json.dumps(dict(reversed(list(BODY.items()))), indent=2).encode()
    again = await plane.client.post(
        "/v2/sandboxes",
        content=reordered,
        headers={"X-API-Key": ALICE, "Idempotency-Key": "enc", "Content-Type": "application/json"},
    )
    assert again.status_code == 201, again.text
    assert again.json()["sandboxID"] == first
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


async def test_another_body_with_the_same_key_is_refused(plane: Plane) -> None:
    first = (await create(plane, "k")).json()["sandboxID"]
    other = await create(plane, "k", {**BODY, "metadata": {"run": "2"}})
    assert other.status_code == 422, other.text
    assert other.json() == {"code": 422, "message": RULES[Found.OTHER_BODY][1]}
    assert other.headers["Should-Retry"] == "false"
    assert await sandboxes(plane) == {first}


async def test_a_repeat_while_the_first_is_creating_is_told_to_retry(plane: Plane) -> None:
    """The retrying client's second attempt may arrive while the first still creates: 409, retry in 1 s."""
    release = asyncio.Event()
    started = asyncio.Event()
    start = plane.backend.start

    async def held(sandbox_id: str) -> Any:
        started.set()
        await release.wait()
        return await start(sandbox_id)

    plane.backend.start = held  # type: ignore[method-assign]
    first = asyncio.create_task(create(plane, "slow"))
    await started.wait()
    repeats = await asyncio.gather(*(create(plane, "slow") for _ in range(5)))
    for repeat in repeats:
        assert repeat.status_code == 409, repeat.text
        assert repeat.headers["Should-Retry"] == "true"
        assert repeat.headers["Retry-After"] == "1"
    release.set()
    made = await first
    assert made.status_code == 201, made.text
    assert (await create(plane, "slow")).json()["sandboxID"] == made.json()["sandboxID"]
    assert await sandboxes(plane) == {made.json()["sandboxID"]}


async def test_parallel_first_creates_with_one_key_make_one_sandbox(plane: Plane) -> None:
    answers = await asyncio.gather(*(create(plane, "burst") for _ in range(20)))
    made = [answer for answer in answers if answer.status_code == 201]
    assert made, [answer.text for answer in answers]
    assert all(answer.status_code in (201, 409) for answer in answers)
    assert len({answer.json()["sandboxID"] for answer in made}) == 1
    assert len(await sandboxes(plane)) == 1


async def test_a_failed_create_frees_its_key(plane: Plane) -> None:
    plane.initializer.fail = True
    failed = await create(plane, "retry-me")
    assert failed.status_code >= 500, failed.text
    assert await sandboxes(plane) == set()
    assert await keys(plane) == [], "nothing was made, so nothing is remembered"
    plane.initializer.fail = False
    made = await create(plane, "retry-me")
    assert made.status_code == 201, made.text
    assert await sandboxes(plane) == {made.json()["sandboxID"]}
    refused = await create(plane, "refused", {**BODY, "templateID": "no-such-template"})
    assert refused.status_code == 404
    assert [row[1] for row in await keys(plane)] == ["retry-me"]


async def test_a_key_whose_sandbox_is_gone_is_refused(plane: Plane) -> None:
    sandbox_id = (await create(plane, "gone")).json()["sandboxID"]
    assert (await plane.client.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": ALICE})).status_code == 204
    again = await create(plane, "gone")
    assert again.status_code == 409, again.text
    assert again.headers["Should-Retry"] == "false"
    assert await sandboxes(plane) == set()


@pytest.mark.parametrize("bad", ["", "UPPER", "with space", "under_score", "a" * 256, "é".encode()])
async def test_a_key_the_clients_would_not_send_is_refused_and_nothing_is_made(plane: Plane, bad: str | bytes) -> None:
    answer = await create(plane, bad)
    assert answer.status_code == 400, answer.text
    assert "Idempotency-Key" in answer.json()["message"]
    assert answer.headers["Should-Retry"] == "false"
    assert await sandboxes(plane) == set()
    assert await keys(plane) == []


async def test_the_longest_key_and_the_v1_route(plane: Plane) -> None:
    key = "a" * 255
    first = await create(plane, key, path="/sandboxes")
    assert first.status_code == 201, first.text
    assert (await create(plane, key, path="/sandboxes")).json()["sandboxID"] == first.json()["sandboxID"]


async def test_a_key_is_forgotten_after_the_window(plane: Plane) -> None:
    first = (await create(plane, "daily", {**BODY, "timeout": 3600})).json()["sandboxID"]
    plane.clock.advance(WINDOW.total_seconds() - 1)
    assert (await create(plane, "daily", {**BODY, "timeout": 3600})).json()["sandboxID"] == first
    plane.clock.advance(2)
    later = await create(plane, "daily", {**BODY, "timeout": 3600})
    assert later.status_code == 201
    assert later.json()["sandboxID"] != first


async def test_open_frees_the_keys_a_stop_cut_off(plane: Plane) -> None:
    bound = (await create(plane, "bound")).json()["sandboxID"]
    await plane.store.db.execute(
        "INSERT INTO create_keys (owner, key, fingerprint, sandbox_id, created_at) VALUES (?, ?, ?, NULL, ?)",
        ("alice", "cut-off", fingerprint(BODY), "2026-11-30T12:00:00.000000Z"),
    )
    assert (await create(plane, "cut-off")).status_code == 409, "pending until the server starts again"
    assert await plane.service.create_keys.open() == 1
    made = await create(plane, "cut-off")
    assert made.status_code == 201, made.text
    assert (await create(plane, "bound")).json()["sandboxID"] == bound, "bound keys survive a restart"
