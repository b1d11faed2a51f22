"""What the server does with a backend's feature list (``runtime.backend.Feature``).

An operation that needs a feature the backend lacks is refused with a 501 naming the backend,
before anything is stored or changed, and is never done another way (a memory pause is not
turned into a filesystem one). A backend whose memory pause writes memory to disk frees the
sandbox's RAM, so admission stops counting paused sandboxes against the host's memory.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from reference_server._admission import Admission, AdmissionLimits
from runtime.backend import DEFAULT_FEATURES, Feature, State

from .conftest import ALICE, Plane

pytestmark = pytest.mark.anyio

A = {"X-API-Key": ALICE}


def without(plane: Plane, *missing: Feature) -> None:
    plane.backend.features = DEFAULT_FEATURES - set(missing)


def not_on_backend(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 501, response.text
    body = response.json()
    assert body["code"] == 501
    for word in ("isolation backend (fake)", "does not support", *words):
        assert word in body["message"], body["message"]


async def test_a_snapshot_is_refused_without_the_feature_and_nothing_is_stored(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    without(plane, Feature.SNAPSHOT)
    not_on_backend(await plane.client.post(f"/sandboxes/{sandbox_id}/snapshots", json={}, headers=A), "snapshots")
    listed = await plane.client.get("/snapshots", headers=A)
    assert listed.status_code == 200
    assert listed.json() == []
    assert (await plane.backend.inspect(sandbox_id)).state is State.RUNNING


async def test_a_memory_pause_is_refused_not_turned_into_a_filesystem_pause(plane: Plane) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    without(plane, Feature.PAUSE_MEMORY)
    not_on_backend(await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers=A), "pausing with memory")
    assert (await plane.backend.inspect(sandbox_id)).state is State.RUNNING
    detail = (await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)).json()
    assert detail["state"] == "running"
    # What the backend can do still works.
    paused = await plane.client.post(f"/sandboxes/{sandbox_id}/pause", json={"memory": False}, headers=A)
    assert paused.status_code == 204
    assert (await plane.backend.inspect(sandbox_id)).state is State.STOPPED


async def test_auto_pause_with_memory_is_refused_at_create(plane: Plane) -> None:
    without(plane, Feature.PAUSE_MEMORY)
    body = {"templateID": "base", "timeout": 300, "autoPause": True}
    not_on_backend(await plane.client.post("/sandboxes", json=body, headers=A), "timeout ends")
    assert await plane.store.all() == []
    plain = await plane.client.post("/sandboxes", json={"templateID": "base", "timeout": 300}, headers=A)
    assert plain.status_code == 201, plain.text


async def test_network_rules_are_refused_without_the_feature(plane: Plane) -> None:
    without(plane, Feature.EGRESS_RULES)
    body: dict[str, Any] = {"templateID": "base", "timeout": 300, "network": {"denyOut": ["0.0.0.0/0"]}}
    not_on_backend(await plane.client.post("/sandboxes", json=body, headers=A), "allow and deny lists")
    assert await plane.store.all() == [], "nothing stored from a refused create"
    sandbox_id = (await plane.create())["sandboxID"]
    update = {"denyOut": ["0.0.0.0/0"]}
    not_on_backend(await plane.client.put(f"/sandboxes/{sandbox_id}/network", json=update, headers=A), "network rules")
    detail = (await plane.client.get(f"/sandboxes/{sandbox_id}", headers=A)).json()
    assert not detail.get("network", {}).get("denyOut"), detail


async def test_every_feature_present_changes_nothing(plane: Plane) -> None:
    """The same requests on the full list pass: the refusals above come from the list alone."""
    body: dict[str, Any] = {"templateID": "base", "timeout": 300, "autoPause": True}
    body["network"] = {"denyOut": ["1.2.3.4"]}
    created = await plane.client.post("/sandboxes", json=body, headers=A)
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["sandboxID"]
    assert (await plane.client.post(f"/sandboxes/{sandbox_id}/snapshots", json={}, headers=A)).status_code == 201
    assert (await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers=A)).status_code == 204


@pytest.mark.parametrize("on_disk", [False, True])
async def test_a_pause_that_writes_memory_to_disk_frees_the_hosts_memory(plane: Plane, on_disk: bool) -> None:
    limits = AdmissionLimits(
        owner_max_running=100,
        owner_create_rate=1000.0,
        owner_create_burst=1000,
        max_sandboxes=100,
        memory_overcommit=1.0,
        host_memory_mb=512,  # room for one sandbox of the plane's 512 MiB
    )
    plane.service.admission = Admission(limits, plane.store, paused_on_disk=on_disk)
    first = (await plane.create())["sandboxID"]
    assert (await plane.client.post(f"/sandboxes/{first}/pause", headers=A)).status_code == 204
    second = await plane.client.post("/sandboxes", json={"templateID": "base", "timeout": 300}, headers=A)
    assert second.status_code == (201 if on_disk else 429), second.text
