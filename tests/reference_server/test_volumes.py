"""Volumes through the control plane and the content API, in process (fake backend, real storage)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reference_server._control_plane import create_control_plane
from reference_server._credentials import TokenVault
from reference_server._store import Store
from reference_server._volumes import VolumeService, VolumeStore
from runtime.fake import FakeBackend
from runtime.volumes import VolumeStorage

from .conftest import ALICE, BOB, Clock, DictKeys, RecordingInitializer, conforms, sandbox_service

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="a volume is a loop-mounted image: root only"),
]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, VolumeService, FakeBackend]]:
    store = await Store.open(tmp_path / "server.db")
    backend = FakeBackend()
    service = sandbox_service(store, backend, Clock(), RecordingInitializer())
    base = Path(tempfile.mkdtemp(prefix="e2b-volumes-", dir="/var/tmp"))
    storage = VolumeStorage(base / "volumes")
    volumes = VolumeService(
        store=VolumeStore(store.db),
        storage=storage,
        vault=TokenVault(b"k" * 32),
        size_mb=32,
        in_use=service.volume_in_use,
    )
    service.volumes = volumes
    app = create_control_plane(service, DictKeys())
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://api.e2b.test") as client:
            yield client, volumes, backend
    finally:
        storage.release_all()
        await store.close()
        shutil.rmtree(base)


async def new_volume(client: httpx.AsyncClient, name: str, key: str = ALICE) -> dict[str, Any]:
    created = await client.post("/volumes", json={"name": name}, headers={"X-API-Key": key})
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    conforms("VolumeAndToken", body)
    return body


def bearer(volume: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {volume['token']}"}


async def test_volumes_are_their_owners(api: tuple[httpx.AsyncClient, VolumeService, FakeBackend]) -> None:
    client, _, _ = api
    volume = await new_volume(client, "data")
    twice = await client.post("/volumes", json={"name": "data"}, headers={"X-API-Key": ALICE})
    assert (twice.status_code, twice.json()["message"]) == (409, "Volume already exists")
    await new_volume(client, "data", key=BOB)  # names are per owner
    listed = await client.get("/volumes", headers={"X-API-Key": ALICE})
    assert listed.json() == [{"volumeID": volume["volumeID"], "name": "data"}]
    got = await client.get(f"/volumes/{volume['volumeID']}", headers={"X-API-Key": ALICE})
    assert got.json() == volume
    stranger = await client.get(f"/volumes/{volume['volumeID']}", headers={"X-API-Key": BOB})
    assert (stranger.status_code, stranger.json()["message"]) == (404, "Volume not found")
    for bad in ("", "../x", "a b", "x" * 129, 7):
        refused = await client.post("/volumes", json={"name": bad}, headers={"X-API-Key": ALICE})
        assert refused.status_code == 400, bad
    assert len((await client.get("/volumes", headers={"X-API-Key": ALICE})).json()) == 1, "nothing stored"


async def test_content_api_round_trip(api: tuple[httpx.AsyncClient, VolumeService, FakeBackend]) -> None:
    client, _, _ = api
    volume = await new_volume(client, "files")
    base = f"/volumecontent/{volume['volumeID']}"
    written = await client.put(
        f"{base}/file", params={"path": "/a/b.txt", "mode": "384"}, content=b"hello", headers=bearer(volume)
    )
    assert written.status_code == 201, written.text
    assert {k: written.json()[k] for k in ("path", "size", "mode", "uid", "gid", "type")} == {
        "path": "/a/b.txt",
        "size": 5,
        "mode": 0o600,
        "uid": 1000,
        "gid": 1000,
        "type": "file",
    }
    read = await client.get(f"{base}/file", params={"path": "a/b.txt"}, headers=bearer(volume))
    assert (read.status_code, read.content) == (200, b"hello")
    listing = await client.get(f"{base}/dir", params={"path": "/", "depth": "2"}, headers=bearer(volume))
    assert [entry["path"] for entry in listing.json()] == ["/a", "/a/b.txt"]
    patched = await client.patch(f"{base}/path", params={"path": "/a/b.txt"}, json={"uid": 0}, headers=bearer(volume))
    assert patched.json()["uid"] == 0
    made = await client.post(f"{base}/dir", params={"path": "/x/y", "force": "true"}, headers=bearer(volume))
    assert (made.status_code, made.json()["type"]) == (201, "directory")
    removed = await client.delete(f"{base}/path", params={"path": "/a"}, headers=bearer(volume))
    assert removed.status_code == 204
    missing = await client.get(f"{base}/path", params={"path": "/a"}, headers=bearer(volume))
    assert (missing.status_code, missing.json()) == (404, {"code": "404", "message": "Path /a not found"})


async def test_content_api_refusals(api: tuple[httpx.AsyncClient, VolumeService, FakeBackend]) -> None:
    client, _, _ = api
    volume, other = await new_volume(client, "one"), await new_volume(client, "two")
    base = f"/volumecontent/{volume['volumeID']}"
    for headers in ({}, bearer(other), {"Authorization": "Basic x"}, {"X-API-Key": ALICE}):
        refused = await client.get(f"{base}/path", params={"path": "/"}, headers=headers)
        assert (refused.status_code, refused.json()["message"]) == (401, "Invalid volume token"), headers
    unknown = await client.get("/volumecontent/volnothere/path", params={"path": "/"}, headers=bearer(volume))
    assert unknown.status_code == 401, "a missing volume answers as a wrong token"
    for params in ({}, {"path": "/", "depth": "0"}, {"path": "/", "extra": "1"}, {"path": "a\x00b"}):
        bad = await client.get(f"{base}/dir", params=params, headers=bearer(volume))
        assert bad.status_code == 400, params
    bad_mode = await client.put(
        f"{base}/file", params={"path": "f", "mode": "99999"}, content=b"", headers=bearer(volume)
    )
    assert bad_mode.status_code == 400
    full = await client.put(f"{base}/file", params={"path": "big"}, content=b"x" * (40 << 20), headers=bearer(volume))
    assert full.status_code == 507
    assert (await client.get(f"{base}/dir", params={"path": "/"}, headers=bearer(volume))).json() == [], "nothing kept"


async def test_a_mounted_volume_is_in_use(api: tuple[httpx.AsyncClient, VolumeService, FakeBackend]) -> None:
    client, volumes, backend = api
    volume = await new_volume(client, "shared")
    created = await client.post(
        "/sandboxes",
        json={"templateID": "base", "volumeMounts": [{"name": "shared", "path": "/mnt/shared"}]},
        headers={"X-API-Key": ALICE},
    )
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["sandboxID"]
    (mount,) = backend._sandboxes[sandbox_id].spec.volumes  # what the runtime was asked to bind
    assert (mount.source, mount.target) == (str(volumes.mount_point(volume["volumeID"])), "/mnt/shared")
    detail = await client.get(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": ALICE})
    assert detail.json()["volumeMounts"] == [{"name": "shared", "path": "/mnt/shared"}]
    busy = await client.delete(f"/volumes/{volume['volumeID']}", headers={"X-API-Key": ALICE})
    assert (busy.status_code, busy.json()["message"]) == (409, "Volume is in use")
    for mounts in (
        [{"name": "nope", "path": "/x"}],
        [{"name": "shared", "path": "relative"}],
        [{"name": "shared", "path": "/proc/x"}],
        [{"name": "shared", "path": "/a/../b"}],
        [{"name": "shared", "path": "/x"}, {"name": "shared", "path": "/x"}],
    ):
        refused = await client.post(
            "/sandboxes", json={"templateID": "base", "volumeMounts": mounts}, headers={"X-API-Key": ALICE}
        )
        assert refused.status_code == 400, mounts
    assert (await client.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": ALICE})).status_code == 204
    assert (await client.delete(f"/volumes/{volume['volumeID']}", headers={"X-API-Key": ALICE})).status_code == 204
    assert (await client.delete(f"/volumes/{volume['volumeID']}", headers={"X-API-Key": ALICE})).status_code == 404
    assert volumes.storage.ids() == set(), "its files are gone"


async def test_start_up_settles_records_and_files(api: tuple[httpx.AsyncClient, VolumeService, FakeBackend]) -> None:
    """Every crash state start-up can meet: each is settled, reported, and no file is deleted unasked."""
    client, volumes, _ = api
    kept = await new_volume(client, "kept")
    write = await client.put(
        f"/volumecontent/{kept['volumeID']}/file",
        params={"path": "/data.txt"},
        content=b"survives",
        headers={"Authorization": f"Bearer {kept['token']}"},
    )
    assert write.status_code == 201, write.text
    lost = await new_volume(client, "lost")  # a record whose files went (an operator's rm -rf)
    volumes.storage.remove(lost["volumeID"])
    half = await new_volume(client, "half-made")  # a create cut off before it answered
    assert await volumes.store.move(half["volumeID"], "ready", "creating")
    going = await new_volume(client, "half-deleted")  # a delete cut off after it marked the record
    assert await volumes.store.move(going["volumeID"], "ready", "deleting")
    stray = "vol" + "z" * 17  # files no record knows (a crash between files and record)
    volumes.storage.ensure(stray, 16)
    (volumes.storage.mount_point(stray) / "precious").write_text("not ours to delete")

    report = await volumes.open()

    assert report.remade == (lost["volumeID"],)
    assert report.undone == (half["volumeID"],)
    assert report.orphaned == (stray,)
    listed = await client.get("/volumes", headers={"X-API-Key": ALICE})
    assert sorted(volume["name"] for volume in listed.json()) == ["kept", "lost"]
    assert volumes.storage.ids() == {kept["volumeID"], lost["volumeID"]}
    aside = volumes.storage.root.parent / "volumes-orphaned" / stray
    assert (aside / "volume.img").is_file(), "files without a record are moved aside, never deleted"
    read = await client.get(
        f"/volumecontent/{kept['volumeID']}/file",
        params={"path": "/data.txt"},
        headers={"Authorization": f"Bearer {kept['token']}"},
    )
    assert (read.status_code, read.content) == (200, b"survives")
    relisted = await client.get(
        f"/volumecontent/{lost['volumeID']}/dir",
        params={"path": "/"},
        headers={"Authorization": f"Bearer {lost['token']}"},
    )
    assert (relisted.status_code, relisted.json()) == (200, []), "made again, empty"
    # A second start finds nothing left to settle.
    assert await volumes.open() == type(report)()
