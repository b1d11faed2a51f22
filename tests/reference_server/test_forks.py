"""``POST /sandboxes/{id}/fork`` and snapshots that keep memory, on the fake backend.

The fake backend with ``Feature.SNAPSHOT_MEMORY`` records which memory snapshot a sandbox's first
start continued (``continued_from``); the real restore is tested on crun
(tests/runtime/test_crun_memory_snapshots.py) and through the clients (the ``sandbox/lifecycle/fork``
case).
"""

from __future__ import annotations

from hashlib import sha512

import pytest

from runtime.backend import DEFAULT_FEATURES, BackendError, Feature, State

from .conftest import ALICE, BOB, Plane, conforms
from .test_control_plane import refused

pytestmark = pytest.mark.anyio

A = {"X-API-Key": ALICE}


def with_memory_snapshots(plane: Plane) -> None:
    plane.backend.features = DEFAULT_FEATURES | {Feature.SNAPSHOT_MEMORY}


async def test_forks_continue_the_source_under_their_own_ids_and_tokens(plane: Plane) -> None:
    with_memory_snapshots(plane)
    source = await plane.create(envVars={"A": "1"}, metadata={"team": "x"})
    plane.backend.write(source["sandboxID"], "/home/user/a.txt", b"kept")
    answer = await plane.client.post(f"/sandboxes/{source['sandboxID']}/fork", json={"count": 2}, headers=A)
    assert answer.status_code == 201, answer.text
    entries = answer.json()
    assert len(entries) == 2
    forks = [entry["sandbox"] for entry in entries]
    for fork in forks:
        conforms("Sandbox", fork)
        assert set(entries[0]) == {"sandbox"}
        assert fork["templateID"] == source["templateID"]
        assert fork["envdAccessToken"] not in (None, source["envdAccessToken"])
    ids = {fork["sandboxID"] for fork in forks}
    assert len(ids) == 2
    assert source["sandboxID"] not in ids
    continued = {plane.backend._sandboxes[i].continued_from for i in ids}
    assert len(continued) == 1
    assert None not in continued, "both forks continued the one memory snapshot"
    for fork_id in ids:
        assert plane.backend.read(fork_id, "/home/user/a.txt") == b"kept"
        detail = (await plane.client.get(f"/sandboxes/{fork_id}", headers=A)).json()
        assert detail["metadata"] == {"team": "x"}
        assert detail["state"] == "running"
    # Each fork's agent got its own token and the source's environment; the runtime was told the
    # token's hash, which is what lets a restored agent take it.
    inits = {body["accessToken"]: body for _, _, body in plane.initializer.calls}
    for fork in forks:
        assert inits[fork["envdAccessToken"]]["envVars"] == {"A": "1"}
        spec = plane.backend._sandboxes[fork["sandboxID"]].spec
        assert spec.access_token_hash == sha512(fork["envdAccessToken"].encode()).hexdigest()
    # The source runs on; the fork's snapshot is never listed and goes with the last fork.
    assert (await plane.backend.inspect(source["sandboxID"])).state is State.RUNNING
    assert (await plane.client.get("/snapshots", headers=A)).json() == []
    (snapshot,) = continued
    assert snapshot in plane.backend.templates
    for fork_id in ids:
        assert (await plane.client.delete(f"/sandboxes/{fork_id}", headers=A)).status_code == 204
    assert snapshot not in plane.backend.templates


async def test_each_fork_fails_on_its_own(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    with_memory_snapshots(plane)
    source = (await plane.create())["sandboxID"]
    starts = plane.backend.start
    calls = 0

    async def second_fails(sandbox_id: str) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise BackendError("restore failed")
        return await starts(sandbox_id)

    monkeypatch.setattr(plane.backend, "start", second_fails)
    entries = (await plane.client.post(f"/sandboxes/{source}/fork", json={"count": 2}, headers=A)).json()
    assert sorted(key for entry in entries for key in entry) == ["error", "sandbox"], entries
    error = next(entry["error"] for entry in entries if "error" in entry)
    assert error["code"] == 500
    assert "restore failed" not in error["message"], "the runtime's words stay in the log"
    listed = {item["sandboxID"] for item in (await plane.client.get("/sandboxes", headers=A)).json()}
    assert len(listed) == 2, "the source and the fork that started; nothing of the failed one"


async def test_a_fork_is_refused_for_a_sandbox_not_running_or_not_the_callers(plane: Plane) -> None:
    with_memory_snapshots(plane)
    source = (await plane.create())["sandboxID"]
    refused(await plane.client.post(f"/sandboxes/{source}/fork", json={}, headers={"X-API-Key": BOB}), 404)
    assert (await plane.client.post(f"/sandboxes/{source}/pause", json={"memory": False}, headers=A)).status_code == 204
    refused(await plane.client.post(f"/sandboxes/{source}/fork", json={}, headers=A), 409)
    assert len(plane.backend._sandboxes) == 1
    assert [name for name in plane.backend.templates if name.startswith("snap-")] == []


async def test_one_fork_by_default_with_the_sources_timeout(plane: Plane) -> None:
    with_memory_snapshots(plane)
    source = (await plane.create(timeout=600))["sandboxID"]
    (entry,) = (await plane.client.post(f"/sandboxes/{source}/fork", headers=A)).json()
    fork = entry["sandbox"]
    record = await plane.store.get(fork["sandboxID"])
    assert record is not None
    assert record.details.timeout_s == 600
    refused(await plane.client.post(f"/sandboxes/{source}/fork", json={"timeout": 10**9}, headers=A), 400)


async def test_a_snapshot_keeps_memory_where_it_can_and_says_no_where_asked_and_it_cannot(plane: Plane) -> None:
    source = (await plane.create())["sandboxID"]

    async def take(body: object) -> str:
        answer = await plane.client.post(f"/sandboxes/{source}/snapshots", json=body, headers=A)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["snapshotID"])

    async def stored() -> tuple[set[str], set[str]]:
        """The snapshots the server recorded, and the ones the backend holds."""
        return await plane.service.snapshots.all_ids(), {t for t in plane.backend.templates if t.startswith("snap-")}

    async def refused_storing_nothing(body: object, status: int) -> None:
        before = await stored()
        refused(await plane.client.post(f"/sandboxes/{source}/snapshots", json=body, headers=A), status)
        assert await stored() == before, f"a refused snapshot ({body}) left something behind"

    # Without the feature: the files only by default, and an explicit memory snapshot is refused.
    assert await take({}) not in plane.backend._kept_memory
    await refused_storing_nothing({"memory": True}, 501)
    await refused_storing_nothing({"memory": "yes"}, 400)
    await refused_storing_nothing({"memory": None, "name": 5}, 400)
    with_memory_snapshots(plane)
    assert await take({}) in plane.backend._kept_memory, "the API default is a full snapshot"
    assert await take({"memory": False}) not in plane.backend._kept_memory
    full = await take({"memory": True})
    assert full in plane.backend._kept_memory
    await refused_storing_nothing({"memory": 1}, 400)
    made = (await plane.create(templateID=full))["sandboxID"]
    assert plane.backend._sandboxes[made].continued_from == full
    # A paused sandbox has no running processes to keep: files only by default, 409 when asked.
    assert (await plane.client.post(f"/sandboxes/{source}/pause", json={"memory": False}, headers=A)).status_code == 204
    assert await take({}) not in plane.backend._kept_memory
    await refused_storing_nothing({"memory": True}, 409)


async def test_a_forks_snapshot_is_released_by_reconcile_when_the_server_stopped_first(plane: Plane) -> None:
    with_memory_snapshots(plane)
    source = (await plane.create())["sandboxID"]
    await plane.backend.snapshot(source, memory=True, transient=True)  # a fork cut short before its release
    snapshots = [name for name in plane.backend.templates if name.startswith("snap-")]
    assert len(snapshots) == 1
    await plane.backend.reconcile()
    assert [name for name in plane.backend.templates if name.startswith("snap-")] == []
