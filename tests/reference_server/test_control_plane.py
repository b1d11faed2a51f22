"""The control plane's operations, status codes and bodies, over the in-memory backend.

Every success body is validated against the derived contract's schema; every refusal must be
``{"code": <status>, "message": ...}`` with the status the clients expect (docs/PROTOCOL-NOTES.md, Control plane).
"""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.parse
from datetime import timedelta, timezone
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.backend import BackendError, State

from .conftest import ALICE, BOB, Plane, conforms

pytestmark = pytest.mark.anyio

A = {"X-API-Key": ALICE}
B = {"X-API-Key": BOB}


def refused(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == status
    assert isinstance(body["message"], str)
    assert body["message"]
    return str(body["message"])


async def test_create_answers_201_with_the_contract_fields(plane: Plane) -> None:
    created = await plane.create(envVars={"A": "1"}, metadata={"team": "x"}, secure=True)
    conforms("Sandbox", created)
    assert created["templateID"] == "base"
    assert created["envdVersion"] == "0.6.4"
    assert created["domain"] == "e2b.test:8443"
    assert len(created["envdAccessToken"]) == 64
    assert created["trafficAccessToken"] is None
    (host, port, body) = plane.initializer.calls[-1]
    assert (host, port) == ("127.0.0.1", 49983)
    assert body["accessToken"] == created["envdAccessToken"]
    assert body["envVars"] == {"A": "1"}
    assert body["defaultUser"] == "user"
    assert (await plane.backend.inspect(created["sandboxID"])).state is State.RUNNING


async def test_insecure_and_private_traffic_tokens(plane: Plane) -> None:
    created = await plane.create(secure=False, network={"allowPublicTraffic": False})
    assert "envdAccessToken" not in created
    assert len(created["trafficAccessToken"]) == 64
    assert "accessToken" not in plane.initializer.calls[-1][2]


async def test_get_list_and_the_detail_schema(plane: Plane) -> None:
    created = await plane.create(metadata={"k": "v"})
    detail = await plane.client.get(f"/sandboxes/{created['sandboxID']}", headers=A)
    assert detail.status_code == 200
    conforms("SandboxDetail", detail.json())
    assert detail.json()["state"] == "running"
    assert detail.json()["metadata"] == {"k": "v"}
    # The disk limit the runtime was given (the server's disk_mb) is the one reported.
    assert plane.backend._sandboxes[created["sandboxID"]].spec.limits.disk_mb == 2048
    assert detail.json()["diskSizeMB"] == 2048
    listed = await plane.client.get("/v2/sandboxes", headers=A)
    conforms("ListedSandbox", listed.json(), array=True)
    assert [item["sandboxID"] for item in listed.json()] == [created["sandboxID"]]
    assert [item["diskSizeMB"] for item in listed.json()] == [2048]
    v1 = await plane.client.get("/sandboxes", headers=A)
    conforms("ListedSandbox", v1.json(), array=True)


async def listed_ids(plane: Plane, limit: int = 1, **params: str) -> list[str]:
    """Every page of a v2 list, ``limit`` at a time."""
    seen: list[str] = []
    token = None
    while True:
        query = {**params, "limit": str(limit), **({"nextToken": token} if token else {})}
        page = await plane.client.get("/v2/sandboxes", params=query, headers=A)
        assert page.status_code == 200, page.text
        seen += [item["sandboxID"] for item in page.json()]
        token = page.headers.get("x-next-token")
        if not token:
            return seen


async def test_list_order_started_after_and_template(plane: Plane) -> None:
    """The newer clients' list parameters (``Sandbox.list(order=..., query=SandboxQuery(...))``)."""
    ids, times = [], []
    for _ in range(4):
        times.append(plane.clock.now)
        ids.append((await plane.create())["sandboxID"])
        plane.clock.advance(1)
    assert await listed_ids(plane, order="asc") == ids
    assert await listed_ids(plane, order="desc") == ids[::-1]
    assert await listed_ids(plane, limit=3) == ids[::-1]
    assert await listed_ids(plane) == await listed_ids(plane, limit=100)
    third = times[2]
    assert await listed_ids(plane, order="asc", startedAfter=third.isoformat()) == ids[2:], "at or after"
    in_paris = third.astimezone(timezone(timedelta(hours=1))).isoformat()
    assert await listed_ids(plane, order="asc", startedAfter=in_paris) == ids[2:], "any offset names the instant"
    as_js = third.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert await listed_ids(plane, startedAfter=as_js) == ids[:1:-1]
    assert await listed_ids(plane, order="asc", template="base") == ids
    assert await listed_ids(plane, template="no-such-template") == []
    first = await plane.client.get("/v2/sandboxes", params={"order": "asc", "limit": 1}, headers=A)
    other_order = {"order": "desc", "nextToken": first.headers["x-next-token"]}
    refused(await plane.client.get("/v2/sandboxes", params=other_order, headers=A), 400)
    for bad in ({"order": "newest"}, {"startedAfter": "yesterday"}, {"startedAfter": "2026-11-30T12:00:00"}):
        refused(await plane.client.get("/v2/sandboxes", params=bad, headers=A), 400)


async def test_metadata_and_state_filters_and_pagination(plane: Plane) -> None:
    ids = []
    for n in range(5):
        ids.append((await plane.create(metadata={"team": "alpha beta", "n": str(n)}))["sandboxID"])
        plane.clock.advance(1)  # pages are in creation order, newest first unless asked otherwise
    await plane.create(metadata={"team": "other"})
    # What the Python client sends: urlencode of quoted keys and values, then encoded again by httpx.
    quoted = urllib.parse.urlencode({urllib.parse.quote("team"): urllib.parse.quote("alpha beta")})
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        params: dict[str, Any] = {"metadata": quoted, "limit": 2, "state": "running,paused"}
        if token:
            params["nextToken"] = token
        page = await plane.client.get("/v2/sandboxes", params=params, headers=A)
        assert page.status_code == 200
        seen += [item["sandboxID"] for item in page.json()]
        pages += 1
        token = page.headers.get("x-next-token")
        if not token:
            break
    assert seen == ids[::-1], "the specification's default order is newest first"
    assert pages == 3
    await plane.client.post(f"/sandboxes/{ids[0]}/pause", headers=A)
    paused = await plane.client.get("/v2/sandboxes", params={"state": "paused"}, headers=A)
    assert [item["sandboxID"] for item in paused.json()] == [ids[0]]
    assert paused.json()[0]["state"] == "paused"
    refused(await plane.client.get("/v2/sandboxes", params={"nextToken": "garbage!"}, headers=A), 400)
    refused(await plane.client.get("/v2/sandboxes", params={"state": "sleeping"}, headers=A), 400)
    refused(await plane.client.get("/v2/sandboxes", params={"limit": 0}, headers=A), 400)
    refused(await plane.client.get("/v2/sandboxes", params={"limit": 101}, headers=A), 400)
    refused(await plane.client.get("/v2/sandboxes", params={"colour": "red"}, headers=A), 400)


async def test_pause_twice_is_409_and_connect_resumes_with_201(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    assert (
        await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": True}, headers=A)
    ).status_code == 204
    assert (await plane.backend.inspect(sandbox_id)).state is State.PAUSED
    refused(await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers=A), 409)
    resumed = await plane.client.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 60}, headers=A)
    assert resumed.status_code == 201
    conforms("Sandbox", resumed.json())
    again = await plane.client.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 60}, headers=A)
    assert again.status_code == 200
    assert again.json()["envdAccessToken"] == resumed.json()["envdAccessToken"]
    refused(await plane.client.post(f"/sandboxes/{sandbox_id}/resume", json={}, headers=A), 409)


async def test_connect_without_memory_boots_a_memory_paused_sandbox_afresh(plane: Plane) -> None:
    """``memory: false`` (``on_resume="reboot"``): never a memory restore in its place; a no-op otherwise."""
    sandbox_id = (await plane.create(envVars={"E": "1"}))["sandboxID"]

    def boots() -> int:
        return plane.backend._sandboxes[sandbox_id].boot

    assert boots() == 1
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": True}, headers=A)
    calls = len(plane.initializer.calls)
    rebooted = await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={"memory": False}, headers=A)
    assert rebooted.status_code == 201, rebooted.text
    conforms("Sandbox", rebooted.json())
    assert boots() == 2, "the kept processes were resumed instead of a fresh boot"
    assert (await plane.backend.inspect(sandbox_id)).state is State.RUNNING
    assert len(plane.initializer.calls) == calls + 1
    assert plane.initializer.calls[-1][2]["envVars"] == {"E": "1"}
    # The older route carries the field too (Python e2b 2.50 sends it there).
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": True}, headers=A)
    v1 = await plane.client.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 60, "memory": False}, headers=A)
    assert v1.status_code == 201, v1.text
    assert boots() == 3
    for route in (f"/sandboxes/{sandbox_id}/connect", f"/v2/sandboxes/{sandbox_id}/connect"):
        refused(await plane.client.post(route, json={"timeout": 60, "memory": "no"}, headers=A), 400)
    # Running: nothing to do, 200. Memory kept and asked for: restored, no boot.
    running = await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={"memory": False}, headers=A)
    assert running.status_code == 200
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": True}, headers=A)
    restored = await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={"memory": True}, headers=A)
    assert restored.status_code == 201
    assert boots() == 3
    # Paused without memory: boots afresh either way (the in-memory backend refuses a discard there).
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": False}, headers=A)
    cold = await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={"memory": False}, headers=A)
    assert cold.status_code == 201, cold.text
    assert boots() == 4


async def test_parallel_reboot_connects_boot_the_sandbox_once(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": True}, headers=A)
    route = f"/v2/sandboxes/{sandbox_id}/connect"
    answers = await asyncio.gather(*(plane.client.post(route, json={"memory": False}, headers=A) for _ in range(6)))
    assert sorted(answer.status_code for answer in answers) == [200] * 5 + [201]
    assert plane.backend._sandboxes[sandbox_id].boot == 2, "one fresh boot, the others found it running"


async def test_a_reboot_that_fails_after_the_discard_is_remembered_as_memoryless(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": True}, headers=A)
    real_resume = plane.backend.resume

    async def failing_resume(sandbox_id: str) -> Any:
        raise BackendError("the boot failed")

    monkeypatch.setattr(plane.backend, "resume", failing_resume)
    failed = await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={"memory": False}, headers=A)
    assert failed.status_code == 500, failed.text
    assert (await plane.backend.inspect(sandbox_id)).state is State.STOPPED
    record = await plane.store.get(sandbox_id)
    assert record is not None
    assert record.details.paused_memory is False, "a later restore would find no processes to thaw"
    monkeypatch.setattr(plane.backend, "resume", real_resume)
    # A plain connect now boots afresh (and runs the start command again), as after a filesystem pause.
    again = await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={}, headers=A)
    assert again.status_code == 201, again.text
    assert plane.backend._sandboxes[sandbox_id].boot == 2


async def test_filesystem_pause_restarts_processes_and_resume_reinitializes(plane: Plane) -> None:
    sandbox_id = (await plane.create(envVars={"E": "1"}))["sandboxID"]
    calls = len(plane.initializer.calls)
    assert (
        await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": False}, headers=A)
    ).status_code == 204
    assert (await plane.backend.inspect(sandbox_id)).state is State.STOPPED
    resumed = await plane.client.post(f"/sandboxes/{sandbox_id}/resume", json={"timeout": 30}, headers=A)
    assert resumed.status_code == 201
    assert len(plane.initializer.calls) == calls + 1
    assert plane.initializer.calls[-1][2]["envVars"] == {"E": "1"}


async def test_kill_then_404_and_false(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    assert (await plane.client.delete(f"/sandboxes/{sandbox_id}", headers=A)).status_code == 204
    refused(await plane.client.delete(f"/sandboxes/{sandbox_id}", headers=A), 404)
    refused(await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A), 404)
    refused(await plane.client.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 5}, headers=A), 404)
    assert await plane.backend.list() == []


async def test_owners_are_isolated(plane: Plane) -> None:
    sandbox_id = (await plane.create(ALICE))["sandboxID"]
    assert (await plane.client.get("/v2/sandboxes", headers=B)).json() == []
    for request in (
        plane.client.get(f"/sandboxes/{sandbox_id}", headers=B),
        plane.client.delete(f"/sandboxes/{sandbox_id}", headers=B),
        plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers=B),
        plane.client.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 1}, headers=B),
        plane.client.post(f"/sandboxes/{sandbox_id}/snapshots", json={}, headers=B),
        plane.client.get(f"/sandboxes/{sandbox_id}/metrics", headers=B),
    ):
        refused(await request, 404)
    assert (await plane.backend.inspect(sandbox_id)).state is State.RUNNING


async def test_authentication_refusals(plane: Plane) -> None:
    refused(await plane.client.get("/v2/sandboxes"), 401)
    refused(await plane.client.get("/v2/sandboxes", headers={"X-API-Key": "e2b_" + "c" * 40}), 401)
    refused(await plane.client.get("/v2/sandboxes", headers={"Authorization": "Bearer " + "c" * 40}), 401)
    refused(await plane.client.post("/sandboxes", json={"templateID": "base"}), 401)


async def test_invalid_bodies_are_400_and_never_echo_values(plane: Plane) -> None:
    post = plane.client.post
    refused(await post("/sandboxes", content=b"{not json", headers=A), 400)
    refused(await post("/sandboxes", json=[1, 2], headers=A), 400)
    refused(await post("/sandboxes", json={}, headers=A), 400)
    message = refused(await post("/sandboxes", json={"templateID": "base", "envVars": {"K": 5}}, headers=A), 400)
    assert "envVars/K" in message
    secret = "s3cr3t-value-" + "x" * 20
    message = refused(await post("/sandboxes", json={"templateID": "base", "timeout": secret}, headers=A), 400)
    assert secret not in message
    refused(await post("/sandboxes", json={"templateID": "base", "timeout": -1}, headers=A), 400)
    refused(await post("/sandboxes", json={"templateID": "base", "timeout": 10**7}, headers=A), 400)
    refused(await post("/sandboxes", json={"templateID": "nope"}, headers=A), 404)
    refused(await post("/sandboxes", content=b"{" + b" " * (2 << 20) + b"}", headers=A), 413)
    assert await plane.backend.list() == []


async def test_chunked_bodies_are_read(plane: Plane) -> None:
    async def body() -> Any:
        yield b'{"templateID": '
        yield b'"base", "timeout": 30}'

    response = await plane.client.post("/sandboxes", content=body(), headers=A)
    assert response.status_code == 201


async def test_timeout_and_refresh(plane: Plane) -> None:
    sandbox_id = (await plane.create(timeout=100))["sandboxID"]

    async def end_at() -> str:
        return str((await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)).json()["endAt"])

    first = await end_at()
    assert (
        await plane.client.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 10}, headers=A)
    ).status_code == 204
    shorter = await end_at()
    assert shorter < first, "set_timeout may shorten"
    for body in (None, {}, {"duration": 5}):
        response = await plane.client.post(f"/sandboxes/{sandbox_id}/refreshes", json=body, headers=A)
        assert response.status_code == 204
    assert await end_at() >= shorter, "a refresh never shortens"
    refused(await plane.client.post(f"/sandboxes/{sandbox_id}/timeout", json={}, headers=A), 400)


async def test_the_reaper_kills_or_pauses_expired_sandboxes(plane: Plane) -> None:
    killed = (await plane.create(timeout=10))["sandboxID"]
    paused = (await plane.create(timeout=10, autoPause=True))["sandboxID"]
    kept = (await plane.create(timeout=100))["sandboxID"]
    plane.clock.advance(11)
    assert sorted(await plane.service.reap()) == sorted([killed, paused])
    refused(await plane.client.get(f"/sandboxes/{killed}", headers=A), 404)
    assert (await plane.client.get(f"/sandboxes/{paused}", headers=A)).json()["state"] == "paused"
    assert (await plane.client.get(f"/sandboxes/{kept}", headers=A)).json()["state"] == "running"


async def test_an_extension_that_wins_the_race_keeps_the_sandbox(plane: Plane) -> None:
    sandbox_id = (await plane.create(timeout=10))["sandboxID"]
    plane.clock.advance(11)
    expired = await plane.store.expired(plane.clock())
    assert [record.sandbox_id for record in expired] == [sandbox_id]
    # The extension lands after the reaper listed the record but before it acted.
    await plane.client.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 60}, headers=A)
    assert await plane.service.reap() == []
    assert (await plane.backend.inspect(sandbox_id)).state is State.RUNNING


async def test_a_strict_pause_leaves_a_sandbox_whose_agent_is_silent_running(plane: Plane) -> None:
    """``requireHealthyGuest`` (Python e2b 2.63's ``pause(strict=True)``): 503, retried, nothing changed."""
    sandbox_id = (await plane.create())["sandboxID"]
    asked: list[tuple[str, int]] = []
    healthy = False

    async def answers(host: str, port: int) -> bool:
        asked.append((host, port))
        return healthy

    plane.service.guest_answers = answers
    silent = await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"requireHealthyGuest": True}, headers=A)
    refused(silent, 503)
    assert silent.headers["Should-Retry"] == "true", "the newer clients retry it"
    assert asked == [("127.0.0.1", 49983)], "the agent's /health was asked"
    detail = await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)
    assert detail.json()["state"] == "running"
    assert (await plane.backend.inspect(sandbox_id)).state is State.RUNNING
    healthy = True
    paused = await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"requireHealthyGuest": True}, headers=A)
    assert paused.status_code == 204, paused.text
    other = (await plane.create())["sandboxID"]
    healthy = False
    lenient = await plane.client.post(f"/sandboxes/{other}/pause", json={"requireHealthyGuest": False}, headers=A)
    assert lenient.status_code == 204, "without the flag the agent is not asked"
    assert len(asked) == 2
    bad = await plane.client.post(f"/sandboxes/{other}/pause", json={"requireHealthyGuest": "yes"}, headers=A)
    refused(bad, 400)


async def test_snapshots(plane: Plane) -> None:
    source = (await plane.create())["sandboxID"]
    plane.backend.write(source, "/home/user/a.txt", b"kept")
    made = await plane.client.post(f"/sandboxes/{source}/snapshots", json={"name": "mine"}, headers=A)
    assert made.status_code == 201
    conforms("SnapshotInfo", made.json())
    snapshot_id = made.json()["snapshotID"]
    assert made.json()["names"] == ["mine"]
    second = (await plane.client.post(f"/sandboxes/{source}/snapshots", headers=A)).json()["snapshotID"]
    other = (await plane.create())["sandboxID"]
    await plane.client.post(f"/sandboxes/{other}/snapshots", json={}, headers=A)
    listed = await plane.client.get("/snapshots", params={"sandboxID": source, "limit": 1}, headers=A)
    conforms("SnapshotInfo", listed.json(), array=True)
    assert [item["snapshotID"] for item in listed.json()] == [snapshot_id]
    token = listed.headers["x-next-token"]
    rest = await plane.client.get("/snapshots", params={"sandboxID": source, "nextToken": token}, headers=A)
    assert [item["snapshotID"] for item in rest.json()] == [second]
    assert "x-next-token" not in rest.headers
    assert (await plane.client.get("/snapshots", headers=B)).json() == []
    # The newer clients' name filter: an id, a name, or a name without its tag.
    tagged = (await plane.client.post(f"/sandboxes/{other}/snapshots", json={"name": "app:v2"}, headers=A)).json()

    async def named(name: str, key: dict[str, str] = A) -> list[str]:
        answer = await plane.client.get("/snapshots", params={"name": name}, headers=key)
        assert answer.status_code == 200, answer.text
        return [item["snapshotID"] for item in answer.json()]

    assert await named("mine") == [snapshot_id]
    assert await named(second) == [second], "an id names its snapshot"
    assert await named("app") == await named("app:v2") == [tagged["snapshotID"]], "a name without its tag"
    assert await named("app:v1") == []
    assert await named("mi") == [], "not a prefix"
    assert await named("mine", B) == [], "another owner's names are not found"
    # A snapshot works as a template, for its owner only.
    restored = await plane.create(templateID=snapshot_id)
    assert plane.backend.read(restored["sandboxID"], "/home/user/a.txt") == b"kept"
    refused(await plane.client.post("/sandboxes", json={"templateID": snapshot_id}, headers=B), 404)
    refused(await plane.client.delete(f"/templates/{snapshot_id}", headers=A), 409)
    refused(await plane.client.delete(f"/templates/{snapshot_id}", headers=B), 404)
    await plane.client.delete(f"/sandboxes/{restored['sandboxID']}", headers=A)
    assert (await plane.client.delete(f"/templates/{snapshot_id}", headers=A)).status_code == 204
    refused(await plane.client.delete(f"/templates/{snapshot_id}", headers=A), 404)


async def test_fork_is_refused_as_not_offered_and_makes_nothing(plane: Plane) -> None:
    # The fake backend's default features keep no memory in snapshots (test_forks.py: one that does).
    source = (await plane.create())["sandboxID"]
    before = {info.sandbox_id for info in await plane.backend.list()}
    for body in ({}, {"count": 1}, {"count": 20, "timeout": 60}, None):
        answer = await plane.client.post(f"/sandboxes/{source}/fork", json=body, headers=A)
        assert refused(answer, 501).startswith("Forking a sandbox is unavailable")
    for bad in ({"count": 0}, {"count": 21}, {"count": "2"}, {"count": True}, {"count": 1.0}, {"timeout": -1}):
        message = refused(await plane.client.post(f"/sandboxes/{source}/fork", json=bad, headers=A), 400)
        assert message.startswith("Invalid request body: "), message
    refused(await plane.client.post(f"/sandboxes/{source}/fork", headers={}), 401)
    assert {info.sandbox_id for info in await plane.backend.list()} == before, "no sandbox was made"
    assert (await plane.backend.inspect(source)).state is State.RUNNING, "the source is left running"


async def test_metrics_single_batch_and_ranges(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    plane.clock.advance(5)
    await plane.service.metrics.sample(sandbox_id)
    series = await plane.client.get(f"/sandboxes/{sandbox_id}/metrics", headers=A)
    conforms("SandboxMetric", series.json(), array=True)
    assert len(series.json()) == 2
    assert series.json()[0]["memTotal"] == 512 << 20
    old = await plane.client.get(f"/sandboxes/{sandbox_id}/metrics", params={"start": 0, "end": 1000}, headers=A)
    assert old.json() == [], "a 1970 range has nothing"
    refused(await plane.client.get(f"/sandboxes/{sandbox_id}/metrics", params={"start": 9, "end": 1}, headers=A), 400)
    batch = await plane.client.get("/sandboxes/metrics", params={"sandbox_ids": f"{sandbox_id},missing"}, headers=A)
    conforms("SandboxesWithMetrics", batch.json())
    assert list(batch.json()["sandboxes"]) == [sandbox_id]
    assert (await plane.client.get("/sandboxes/metrics", params={"sandbox_ids": sandbox_id}, headers=B)).json() == {
        "sandboxes": {}
    }


async def test_logs_v1_and_v2(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers=A)
    v1 = await plane.client.get(f"/sandboxes/{sandbox_id}/logs", headers=A)
    conforms("SandboxLogs", v1.json())
    assert [line["line"] for line in v1.json()["logs"]] == ["sandbox creating", "sandbox started", "sandbox paused"]
    v2 = await plane.client.get(f"/v2/sandboxes/{sandbox_id}/logs", params={"direction": "backward"}, headers=A)
    conforms("SandboxLogsV2Response", v2.json())
    assert v2.json()["logs"][0]["message"] == "sandbox paused"
    refused(await plane.client.get(f"/v2/sandboxes/{sandbox_id}/logs", params={"level": "loud"}, headers=A), 400)


async def test_network_update(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    update = {"allow_internet_access": False, "allowOut": ["10.0.0.0/8"], "denyOut": ["0.0.0.0/0"]}
    assert (await plane.client.put(f"/sandboxes/{sandbox_id}/network", json=update, headers=A)).status_code == 204
    detail = (await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)).json()
    assert detail["network"]["allowOut"] == ["10.0.0.0/8"]
    assert detail["allowInternetAccess"] is False
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers=A)
    refused(await plane.client.put(f"/sandboxes/{sandbox_id}/network", json=update, headers=A), 409)


async def test_a_network_update_replaces_the_egress_lists(plane: Plane) -> None:
    """A list the update leaves out is cleared (as the clients document), internet access is kept."""
    sandbox_id = (await plane.create())["sandboxID"]
    first = {"allow_internet_access": False, "allowOut": ["10.0.0.0/8"], "denyOut": ["0.0.0.0/0"]}
    await plane.client.put(f"/sandboxes/{sandbox_id}/network", json=first, headers=A)
    await plane.client.put(f"/sandboxes/{sandbox_id}/network", json={"allowOut": ["10.1.0.0/16"]}, headers=A)
    detail = (await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)).json()
    assert detail["network"].get("allowOut") == ["10.1.0.0/16"]
    assert detail["network"].get("denyOut", []) == []
    assert detail["allowInternetAccess"] is False


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # The gateway runs github/<owner>/<repo> servers only; a catalogue server is an image.
        ({"mcp": {"github": {}}}, "MCP server 'github' is from the catalogue"),
        ({"mcp": {"duckduckgo": {}, "github/a/b": {"runCmd": "x"}}}, "'duckduckgo' is from the catalogue"),
        ({"mcp": {"github/a/b": {}}}, "runCmd must be a non-empty string"),
        ({"mcp": {"github/a/b": {"runCmd": "x", "env": {}}}}, "unknown fields env"),
        ({"mcp": {"github/a/..": {"runCmd": "x"}}}, "'..' is not a repository name"),
        ({"mcp": {"github/-a/b": {"runCmd": "x"}}}, "expected 'github/<owner>/<repository>'"),
        ({"mcp": {"github/a/b/c": {"runCmd": "x"}}}, "expected 'github/<owner>/<repository>'"),
        ({"mcp": {"github/a/b": {"runCmd": "x", "envs": {"A=B": "1"}}}}, "is not an environment variable name"),
        ({"network": {"rules": {"example.com": [{}]}}}, "Network transform rules are unavailable"),
        ({"network": {"maskRequestHost": "has space"}}, "maskRequestHost"),
        ({"network": {"maskRequestHost": "h\u00e9"}}, "maskRequestHost"),
        # What the newer clients can send beyond the pinned contract (each only when asked for).
        ({"iam": {"tokens": {"gcp": {"audience": "x"}}}}, "IAM workload identity is unavailable"),
        ({"network": {"dnsServers": ["1.1.1.1"]}}, "Custom DNS servers are unavailable"),
        ({"network": {"egressProxy": {"url": "https://proxy.test"}}}, "Egress proxy is unavailable"),
        ({"network": {"httpsPorts": [8443]}}, "HTTPS ports are unavailable"),
    ],
)
async def test_create_refuses_what_it_cannot_honour_and_keeps_nothing(
    plane: Plane, body: dict[str, object], message: str
) -> None:
    answer = await plane.client.post("/sandboxes", json={"templateID": "base", **body}, headers=A)
    refused(answer, 400)
    assert message in answer.json()["message"]
    assert await plane.store.all() == []


async def test_a_create_for_a_github_mcp_server_is_accepted(plane: Plane) -> None:
    """The clients start the gateway themselves once the sandbox exists: the create only checks the mapping."""
    servers = {"github/example/echo": {"runCmd": "python3 server.py", "installCmd": "true", "envs": {"A": "1"}}}
    answer = await plane.client.post("/sandboxes", json={"templateID": "base", "mcp": servers}, headers=A)
    assert answer.status_code == 201, answer.text
    empty = await plane.client.post("/sandboxes", json={"templateID": "base", "mcp": {}}, headers=A)
    assert empty.status_code == 201, empty.text


async def test_the_newer_fields_left_empty_are_no_request_for_them(plane: Plane) -> None:
    body: dict[str, object] = {"iam": {}, "network": {"dnsServers": [], "httpsPorts": [], "egressProxy": None}}
    answer = await plane.client.post("/sandboxes", json={"templateID": "base", **body}, headers=A)
    assert answer.status_code == 201, answer.text


async def test_network_update_refuses_rules(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    update: dict[str, object] = {"rules": {"example.com": [{}]}}
    answer = await plane.client.put(f"/sandboxes/{sandbox_id}/network", json=update, headers=A)
    refused(answer, 400)
    assert "rules are unavailable" in answer.json()["message"]


async def test_unknown_routes_and_methods_use_the_error_shape(plane: Plane) -> None:
    refused(await plane.client.get("/nothing-here", headers=A), 404)
    refused(await plane.client.patch("/sandboxes", headers=A), 405)
    # The newer clients' Secret API, declared unsupported (conformance/features.json, "secrets").
    refused(await plane.client.get("/secrets", headers=A), 404)
    refused(await plane.client.post("/secrets", json={"name": "n", "value": "v"}, headers=A), 404)
    refused(await plane.client.delete("/secrets/some-id", headers=A), 404)


async def test_a_failed_start_leaves_nothing(plane: Plane) -> None:
    plane.initializer.fail = True
    refused(await plane.client.post("/sandboxes", json={"templateID": "base"}, headers=A), 500)
    assert await plane.backend.list() == []
    assert await plane.store.all() == []


async def test_v2_create_and_connect_fill_in_what_newer_clients_omit(plane: Plane) -> None:
    created = await plane.client.post("/v2/sandboxes", json={"templateID": "base"}, headers=A)
    assert created.status_code == 201
    conforms("Sandbox", created.json())
    assert "envdAccessToken" in created.json(), "v2 sandboxes are always secure"
    sandbox_id = created.json()["sandboxID"]
    detail = (await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)).json()
    assert detail["lifecycle"] == {"autoResume": False, "onTimeout": "kill"}
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={}, headers=A)
    resumed = await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={}, headers=A)
    assert resumed.status_code == 201
    assert (await plane.client.post(f"/v2/sandboxes/{sandbox_id}/connect", headers=A)).status_code == 200
    refused(await plane.client.post("/v2/sandboxes/missing/connect", json={}, headers=A), 404)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["templateID", "timeout", "envVars", "metadata", "secure", "autoPause", "autoResume", "network", "volumeMounts"]
)
BODIES = st.dictionaries(FIELDS, JSON, max_size=6) | JSON
PATHS = st.sampled_from(
    [
        ("POST", "/sandboxes"),
        ("POST", "/v2/sandboxes"),
        ("POST", "/sandboxes/{id}/connect"),
        ("POST", "/v2/sandboxes/{id}/connect"),
        ("POST", "/sandboxes/{id}/timeout"),
        ("POST", "/sandboxes/{id}/refreshes"),
        ("POST", "/sandboxes/{id}/pause"),
        ("POST", "/sandboxes/{id}/resume"),
        ("POST", "/sandboxes/{id}/snapshots"),
        ("PUT", "/sandboxes/{id}/network"),
    ]
)
QUERIES = st.dictionaries(
    st.sampled_from(["limit", "state", "metadata", "nextToken", "start", "end", "x"]), st.text(max_size=12), max_size=3
)


async def test_hostile_input_is_never_a_500(plane: Plane) -> None:
    """Random bodies on every write route and random queries on the reads: 2xx or 4xx, always the error shape."""
    sandbox_id = (await plane.create())["sandboxID"]

    async def check(response: httpx.Response) -> None:
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            assert response.json()["code"] == response.status_code

    async def post(route: tuple[str, str], body: object) -> None:
        method, path = route
        await check(await plane.client.request(method, path.format(id=sandbox_id), json=body, headers=A))

    async def query(params: dict[str, str]) -> None:
        for path in (
            "/v2/sandboxes",
            "/snapshots",
            f"/sandboxes/{sandbox_id}/metrics",
            f"/v2/sandboxes/{sandbox_id}/logs",
        ):
            await check(await plane.client.get(path, params=params, headers=A))

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(route=PATHS, body=BODIES, params=QUERIES)
    def examples(route: tuple[str, str], body: object, params: dict[str, str]) -> None:
        anyio.from_thread.run(post, route, body)
        anyio.from_thread.run(query, params)

    await anyio.to_thread.run_sync(examples)
    for record in await plane.store.all():  # whatever was made is consistent with the runtime
        assert (await plane.backend.inspect(record.sandbox_id)).state.value in ("running", "paused", "stopped")


async def test_egress_ranges_must_be_ipv4_addresses_or_cidrs(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    url = f"/sandboxes/{sandbox_id}/network"
    for bad in (["example.com"], ["10.0.0.0/33"], ["::1/128"], ["\x00"]):
        refused(await plane.client.put(url, json={"allowOut": bad}, headers=A), 400)
        refused(await plane.client.put(url, json={"denyOut": bad}, headers=A), 400)
    refused(
        await plane.client.post("/sandboxes", json={"templateID": "base", "network": {"denyOut": ["x"]}}, headers=A),
        400,
    )
    assert (
        await plane.client.put(url, json={"allowOut": ["10.1.2.3", "192.168.0.0/16"]}, headers=A)
    ).status_code == 204


async def test_a_template_with_a_memory_size_of_its_own_gets_it_and_so_do_its_snapshots(plane: Plane) -> None:
    plane.service.settings = dataclasses.replace(
        plane.service.settings,
        templates=frozenset({"base", "code-interpreter-v1"}),
        template_memory_mb={"code-interpreter-v1": 2048, "base": 256},  # a floor: base keeps the default
    )
    plane.backend.templates["code-interpreter-v1"] = {}
    default = (await plane.create())["sandboxID"]
    big = (await plane.create(templateID="code-interpreter-v1"))["sandboxID"]
    snapshot = (await plane.client.post(f"/sandboxes/{big}/snapshots", json={}, headers=A)).json()["snapshotID"]
    from_snapshot = (await plane.create(templateID=snapshot))["sandboxID"]
    again = (await plane.client.post(f"/sandboxes/{from_snapshot}/snapshots", json={}, headers=A)).json()["snapshotID"]
    from_second = (await plane.create(templateID=again))["sandboxID"]
    for sandbox_id, memory_mb in [(default, 512), (big, 2048), (from_snapshot, 2048), (from_second, 2048)]:
        info = (await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)).json()
        assert info["memoryMB"] == memory_mb, sandbox_id
        assert (await plane.backend.metrics(sandbox_id)).memory_limit_bytes == memory_mb << 20, (
            "the limit the backend got"
        )
