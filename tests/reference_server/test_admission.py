"""Admission control: per-owner running and create-rate limits, the host's memory, a cap on sandboxes.

Every refusal is a 429 with the ``{"code", "message"}`` body the clients turn into their
rate-limit error, and leaves nothing stored; slots come back when a sandbox is killed or paused,
or when its start fails.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from reference_server._admission import Admission, AdmissionLimits, TokenBucket, host_memory_mb
from runtime.backend import SandboxInfo
from runtime.host import MemoryLedger

from .conftest import ALICE, BOB, Plane

pytestmark = pytest.mark.anyio

A = {"X-API-Key": ALICE}
B = {"X-API-Key": BOB}
MEMORY_MB = 512  # ServiceSettings' default: what each sandbox of the test plane is given


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limit(plane: Plane, clock: Ticks | None = None, ledger: MemoryLedger | None = None, **limits: Any) -> None:
    """Give the plane's service these limits (everything else unlimited for the test)."""
    values: dict[str, Any] = {
        "owner_max_running": 10_000,
        "owner_create_rate": 1000.0,
        "owner_create_burst": 10_000,
        "max_sandboxes": 10_000,
        "memory_overcommit": 1.0,
        "host_memory_mb": 10_000 * MEMORY_MB,
        **limits,
    }
    plane.service.admission = Admission(AdmissionLimits(**values), plane.store, clock=clock or Ticks(), ledger=ledger)


def rate_limited(response: httpx.Response, *words: str) -> str:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["code"] == 429
    message = str(body["message"])
    for word in words:
        assert word in message, message
    return message


async def create(plane: Plane, key: dict[str, str] = A) -> httpx.Response:
    return await plane.client.post("/sandboxes", json={"templateID": "base", "timeout": 300}, headers=key)


def slow_starts(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every start take a while, so that parallel creates are really in flight together."""
    start = plane.backend.start

    async def slowly(sandbox_id: str) -> SandboxInfo:
        await asyncio.sleep(0.02)
        return await start(sandbox_id)

    monkeypatch.setattr(plane.backend, "start", slowly)


async def test_fifty_parallel_creates_with_room_for_ten(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    limit(plane, owner_max_running=10)
    slow_starts(plane, monkeypatch)
    answers = await asyncio.gather(*(create(plane) for _ in range(50)))
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [201] * 10 + [429] * 40
    for answer in answers:
        if answer.status_code == 429:
            rate_limited(answer, "Concurrent sandbox limit", "10")
    made = {answer.json()["sandboxID"] for answer in answers if answer.status_code == 201}
    assert {record.sandbox_id for record in await plane.store.all()} == made
    assert {info.sandbox_id for info in await plane.backend.list()} == made
    rate_limited(await create(plane))
    assert (await create(plane, B)).status_code == 201  # another owner has slots of its own


async def test_a_killed_sandbox_frees_its_slot(plane: Plane) -> None:
    limit(plane, owner_max_running=2)
    first = (await create(plane)).json()["sandboxID"]
    assert (await create(plane)).status_code == 201
    rate_limited(await create(plane))
    assert (await plane.client.delete(f"/sandboxes/{first}", headers=A)).status_code == 204
    assert (await create(plane)).status_code == 201
    assert len(await plane.store.all()) == 2


async def test_a_failed_create_frees_its_reservation(plane: Plane) -> None:
    limit(plane, owner_max_running=1)
    plane.initializer.fail = True
    assert (await create(plane)).status_code == 500
    assert await plane.store.all() == []
    plane.initializer.fail = False
    assert (await create(plane)).status_code == 201


async def test_paused_sandboxes_do_not_count_but_a_resume_does(plane: Plane) -> None:
    limit(plane, owner_max_running=1)
    paused = (await create(plane)).json()["sandboxID"]
    assert (await plane.client.post(f"/sandboxes/{paused}/pause", headers=A)).status_code == 204
    other = (await create(plane)).json()["sandboxID"]  # the paused one holds no running slot
    rate_limited(await plane.client.post(f"/sandboxes/{paused}/resume", json={"timeout": 60}, headers=A))
    rate_limited(await plane.client.post(f"/sandboxes/{paused}/connect", json={"timeout": 60}, headers=A))
    detail = await plane.client.get(f"/sandboxes/{paused}", headers=A)
    assert detail.json()["state"] == "paused"  # a refused resume leaves it as it was
    assert (await plane.client.delete(f"/sandboxes/{other}", headers=A)).status_code == 204
    assert (await plane.client.post(f"/sandboxes/{paused}/connect", json={"timeout": 60}, headers=A)).status_code == 201


async def test_parallel_resumes_are_admitted_exactly(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    limit(plane, owner_max_running=3)
    ids = []
    for _ in range(6):
        sandbox_id = (await create(plane)).json()["sandboxID"]
        assert (await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers=A)).status_code == 204
        ids.append(sandbox_id)
    resume = plane.backend.resume

    async def slowly(sandbox_id: str) -> SandboxInfo:
        await asyncio.sleep(0.02)
        return await resume(sandbox_id)

    monkeypatch.setattr(plane.backend, "resume", slowly)
    answers = await asyncio.gather(
        *(plane.client.post(f"/sandboxes/{i}/connect", json={"timeout": 60}, headers=A) for i in ids)
    )
    assert sorted(answer.status_code for answer in answers) == [201] * 3 + [429] * 3


async def test_the_create_rate_is_a_token_bucket(plane: Plane) -> None:
    clock = Ticks()
    limit(plane, clock, owner_create_rate=2.0, owner_create_burst=3)
    for _ in range(3):
        assert (await create(plane)).status_code == 201
    rate_limited(await create(plane), "rate limit", "2 per second", "3")
    assert len(await plane.store.all()) == 3
    assert (await create(plane, B)).status_code == 201  # each owner has a bucket
    clock.now += 0.5  # one token back
    assert (await create(plane)).status_code == 201
    rate_limited(await create(plane))
    clock.now += 100  # never more than the burst
    for _ in range(3):
        assert (await create(plane)).status_code == 201
    rate_limited(await create(plane))


async def test_refusals_tell_the_retrying_clients_whether_to_retry(plane: Plane) -> None:
    """Python clients from 2.60 retry a 429 unless told not to, after ``Retry-After`` when it is given."""
    clock = Ticks()
    limit(plane, clock, owner_create_rate=0.1, owner_create_burst=1, owner_max_running=2)
    assert (await create(plane)).status_code == 201
    rated = await create(plane)
    rate_limited(rated, "rate limit")
    assert rated.headers["Should-Retry"] == "true"
    assert rated.headers["Retry-After"] == "10", "one token comes back every 10 s"
    clock.now += 7.5
    rated = await create(plane)
    assert rated.headers["Retry-After"] == "3", "2.5 s are left, rounded up"
    clock.now += 2.5
    assert (await create(plane)).status_code == 201
    clock.now += 10
    full = await create(plane)
    rate_limited(full, "Concurrent sandbox limit")
    assert full.headers["Should-Retry"] == "false", "only a kill or pause makes room: no retry loop"
    assert "Retry-After" not in full.headers


async def test_bad_input_takes_no_token(plane: Plane) -> None:
    limit(plane, owner_create_burst=1, owner_create_rate=0.001)
    bad = await plane.client.post("/sandboxes", json={"templateID": "base", "timeout": -1}, headers=A)
    assert bad.status_code == 400
    missing = await plane.client.post("/sandboxes", json={"templateID": "nope"}, headers=A)
    assert missing.status_code == 404
    assert (await create(plane)).status_code == 201


async def test_the_hosts_memory_bounds_running_sandboxes(plane: Plane) -> None:
    limit(plane, host_memory_mb=4 * MEMORY_MB, memory_overcommit=0.5)  # room for two
    first = (await create(plane)).json()["sandboxID"]
    assert (await create(plane, B)).status_code == 201
    rate_limited(await create(plane), "memory", f"{2 * MEMORY_MB} of {2 * MEMORY_MB} MiB")
    assert (await plane.client.post(f"/sandboxes/{first}/pause", headers=A)).status_code == 204
    rate_limited(await create(plane), "memory")  # paused with its memory: frozen, still on the host
    assert (await plane.client.delete(f"/sandboxes/{first}", headers=A)).status_code == 204
    first = (await create(plane)).json()["sandboxID"]
    paused = await plane.client.post(f"/sandboxes/{first}/pause", json={"memory": False}, headers=A)
    assert paused.status_code == 204
    third = await create(plane)  # paused to its files only: its memory is free
    assert third.status_code == 201
    rate_limited(await plane.client.post(f"/sandboxes/{first}/connect", json={"timeout": 60}, headers=A), "memory")
    assert (await plane.client.delete(f"/sandboxes/{third.json()['sandboxID']}", headers=A)).status_code == 204
    assert (await plane.client.post(f"/sandboxes/{first}/connect", json={"timeout": 60}, headers=A)).status_code == 201


async def test_max_sandboxes_counts_paused_ones_of_every_owner(plane: Plane) -> None:
    limit(plane, max_sandboxes=2)
    first = (await create(plane)).json()["sandboxID"]
    assert (await plane.client.post(f"/sandboxes/{first}/pause", headers=A)).status_code == 204
    assert (await create(plane, B)).status_code == 201
    rate_limited(await create(plane), "most sandboxes", "2")
    rate_limited(await create(plane, B))
    assert len(await plane.store.all()) == 2
    assert (await plane.client.post(f"/sandboxes/{first}/connect", json={"timeout": 60}, headers=A)).status_code == 201
    assert (await plane.client.delete(f"/sandboxes/{first}", headers=A)).status_code == 204
    assert (await create(plane)).status_code == 201


async def test_counts_come_from_the_store_after_a_restart(plane: Plane) -> None:
    """A new Admission (a restarted server) sees the sandboxes the store already has."""
    for _ in range(2):
        assert (await create(plane)).status_code == 201
    limit(plane, owner_max_running=2)
    rate_limited(await create(plane))


def test_token_bucket_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=1.0, burst=2)
    assert [bucket.take(0.0), bucket.take(0.0), bucket.take(0.0)] == [True, True, False]
    assert not bucket.take(0.5)
    assert bucket.take(1.0)


def test_host_memory_is_memtotal_in_mib(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree:   1024 kB\nMemTotal:       24683652 kB\n")
    assert host_memory_mb(meminfo) == 24683652 // 1024
    assert host_memory_mb() > 0  # this host's
    meminfo.write_text("MemFree: 1 kB\n")
    with pytest.raises(ValueError, match="MemTotal"):
        host_memory_mb(meminfo)


async def test_the_memory_budget_is_shared_with_the_other_servers_of_the_host(plane: Plane, tmp_path: Path) -> None:
    ledger = MemoryLedger(tmp_path / "run")
    with ledger.committing("/var/lib/another-server/server.db") as (_, publish):
        publish(2 * MEMORY_MB)  # another live server (this process stands in for it) holds two sandboxes
    limit(plane, ledger=ledger, host_memory_mb=4 * MEMORY_MB, memory_overcommit=1.0)  # room for four in all
    first = (await create(plane)).json()["sandboxID"]
    assert (await create(plane, B)).status_code == 201
    rate_limited(await create(plane), "memory", f"{4 * MEMORY_MB} of {4 * MEMORY_MB} MiB", "other servers")
    with ledger.committing("/elsewhere") as (elsewhere, _):
        assert elsewhere == 4 * MEMORY_MB, "this server published its two"
    assert (await plane.client.delete(f"/sandboxes/{first}", headers=A)).status_code == 204
    await plane.service.reap()  # each sweep publishes what the server holds now
    with ledger.committing("/elsewhere") as (elsewhere, _):
        assert elsewhere == 3 * MEMORY_MB
    assert (await create(plane)).status_code == 201
