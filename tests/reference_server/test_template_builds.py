"""The template API over the in-memory backend and a recording agent: the flow the clients drive.

Every answer is checked against the contract's schema; the agent stand-in records what each
step ran (command, user, folder, environment) and answers as a shell would for the few commands
whose output a build reads (a WORKDIR's folder, an ENV value, a user's home).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from reference_server import _sandbox_templates
from reference_server._agent_session import AgentCallError, OutputSink
from reference_server._build_files import BuildFiles
from reference_server._control_plane import create_control_plane
from reference_server._image_source import ImageSourceError, PulledBase, Say
from reference_server._sandboxes import SandboxService
from reference_server._store import Store
from reference_server._template_service import RESTARTED, TemplateService
from reference_server._templates import TemplateStore
from runtime.fake import FakeBackend
from runtime.templates import RegistryCredentials

from .conftest import ALICE, BOB, Clock, DictKeys, RecordingInitializer, conforms, sandbox_service

pytestmark = pytest.mark.anyio
HASH = "0123456789abcdef" * 4


@dataclass
class Call:
    command: str
    user: str
    cwd: str | None
    env: dict[str, str]
    background: bool = False


@dataclass
class FakeAgents:
    """Every agent session of the test; ``exit_codes`` maps a command's text to its exit code."""

    calls: list[Call] = field(default_factory=list)
    uploads: list[tuple[str, bytes]] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    unknown_users: set[str] = field(default_factory=set)
    hanging: asyncio.Event = field(default_factory=asyncio.Event)  # set once a "hang" command runs

    def __call__(self, host: str, port: int, *, access_token: str | None = None) -> FakeAgent:
        return FakeAgent(self)


class FakeAgent:
    def __init__(self, agents: FakeAgents) -> None:
        self._agents = agents

    async def run(
        self,
        command: str,
        *,
        user: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        output: OutputSink | None = None,
        timeout_s: float,
    ) -> int:
        if user in self._agents.unknown_users:
            raise AgentCallError(f"unauthenticated: invalid username: '{user}'")
        self._agents.calls.append(Call(command, user, cwd, dict(env or {})))
        if command == "hang":
            self._agents.hanging.set()
            await asyncio.sleep(3600)
        if output is not None:
            if command.startswith("mkdir -p -- "):
                await output("stdout", command.split(" ")[3].strip("'").encode() + b"\n")
            elif command.startswith("printf %s "):
                await output("stdout", command[len('printf %s "') : -1].encode())
            elif command.startswith("getent passwd"):
                await output("stdout", b"/home/" + command.split()[2].encode() + b"\n")
            else:
                await output("stdout", f"ran: {command}\n".encode())
                await output("stderr", b"a warning\n")
        return self._agents.exit_codes.get(command, 0)

    async def start(
        self, command: str, *, user: str, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> int:
        self._agents.calls.append(Call(command, user, cwd, dict(env or {}), background=True))
        return 4242

    async def upload(self, path: str, source: Path, *, user: str, timeout_s: float = 600) -> None:
        self._agents.uploads.append((path, source.read_bytes()))

    async def aclose(self) -> None:
        pass


class FakeImages:
    """An image source whose images are templates of the fake backend; it records what it was asked."""

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend
        self.asked: list[tuple[str, RegistryCredentials | None]] = []
        self.refuse: dict[str, str] = {}

    async def pull(self, reference: str, credentials: RegistryCredentials | None, say: Say) -> PulledBase:
        self.asked.append((reference, credentials))
        await say(f"Resolving {reference}")
        if reference in self.refuse:
            raise ImageSourceError(self.refuse[reference])
        layer = "image-" + hashlib.sha256(reference.encode()).hexdigest()[:16]
        self.backend.templates.setdefault(layer, {})
        env = (("PATH", "/usr/local/bin:/usr/bin:/bin"), ("IMAGE_VAR", "from-image"))
        return PulledBase(layer=layer, digest="sha256:" + "1" * 64, env=env, workdir="/ignored", cached=False)


@dataclass
class BuildPlane:
    client: httpx.AsyncClient
    service: SandboxService
    templates: TemplateService
    backend: FakeBackend
    agents: FakeAgents
    initializer: RecordingInitializer
    store: TemplateStore
    images: FakeImages

    async def request(self, method: str, path: str, key: str = ALICE, **kwargs: Any) -> httpx.Response:
        return await self.client.request(method, path, headers={"X-API-Key": key}, **kwargs)

    async def new_build(self, name: str = "my-app", key: str = ALICE, **body: Any) -> dict[str, Any]:
        response = await self.request("POST", "/v3/templates", key, json={"name": name, **body})
        assert response.status_code == 202, response.text
        answer: dict[str, Any] = response.json()
        conforms("TemplateRequestResponseV3", answer)
        return answer

    async def start(self, created: dict[str, Any], key: str = ALICE, **body: Any) -> httpx.Response:
        path = f"/v2/templates/{created['templateID']}/builds/{created['buildID']}"
        return await self.request("POST", path, key, json={"fromImage": "e2bdev/base", **body})

    async def finished(self, created: dict[str, Any], key: str = ALICE) -> dict[str, Any]:
        path = f"/templates/{created['templateID']}/builds/{created['buildID']}/status"
        for _ in range(200):
            response = await self.request("GET", path, key)
            assert response.status_code == 200, response.text
            info: dict[str, Any] = response.json()
            conforms("TemplateBuildInfo", info)
            if info["status"] in ("ready", "error"):
                logs = await self.request("GET", path, key, params={"logsOffset": 0, "limit": 100})
                info["logEntries"] = logs.json()["logEntries"]
                return info
            await asyncio.sleep(0.01)
        raise AssertionError("the build did not finish")

    async def build(self, name: str = "my-app", steps: list[dict[str, Any]] | None = None, **body: Any) -> Any:
        created = await self.new_build(name)
        response = await self.start(created, steps=steps or [], **body)
        assert response.status_code == 202, response.text
        return created, await self.finished(created)


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[BuildPlane]:
    store = await Store.open(tmp_path / "server.db")
    templates_store = await TemplateStore.open(tmp_path / "server.db")
    backend = FakeBackend()
    clock = Clock()
    initializer = RecordingInitializer()
    agents = FakeAgents()
    service = sandbox_service(store, backend, clock, initializer, agent_sessions=agents)
    images = FakeImages(backend)
    templates = TemplateService(
        sandboxes=service, store=templates_store, files=BuildFiles(tmp_path / "files", max_bytes=1 << 16), images=images
    )
    service.built = templates
    app = create_control_plane(service, DictKeys(), templates)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://api.e2b.test") as client:
        yield BuildPlane(client, service, templates, backend, agents, initializer, templates_store, images)
    await templates.aclose()
    await templates_store.close()
    await store.close()


STEPS = [
    {"type": "RUN", "args": ["apt-get update", "root"]},
    {"type": "COPY", "args": ["app", "./app/", "", "0755"], "filesHash": HASH},
    {"type": "ENV", "args": ["GREETING", "hello"]},
    {"type": "USER", "args": ["guest", "true"]},
    {"type": "WORKDIR", "args": ["/srv/work"]},
    {"type": "RUN", "args": ["make"]},
]


async def upload(plane: BuildPlane, created: dict[str, Any], data: bytes = b"archive") -> None:
    link = await plane.request("GET", f"/templates/{created['templateID']}/files/{HASH}")
    assert link.status_code == 201, link.text
    conforms("TemplateBuildFileUpload", link.json())
    if link.json()["present"]:
        return
    put = await plane.client.put(link.json()["url"], content=data)  # no API key: the link is the authority
    assert put.status_code == 200, put.text


async def test_a_build_runs_each_step_as_the_clients_expect_and_a_sandbox_starts_from_it(plane: BuildPlane) -> None:
    created = await plane.new_build("my-app", tags=["v1"])
    assert created["tags"] == ["v1"]
    assert created["names"] == ["my-app"]
    await upload(plane, created)
    again = await plane.request("GET", f"/templates/{created['templateID']}/files/{HASH}")
    assert again.json()["present"] is True
    response = await plane.start(created, steps=STEPS, startCmd="serve", readyCmd="check")
    assert response.status_code == 202, response.text
    info = await plane.finished(created)
    assert info["status"] == "ready", info
    messages = [entry["message"] for entry in info["logEntries"]]
    assert "[1/6] RUN apt-get update root" in messages
    assert "ran: apt-get update" in messages
    assert "a warning" in messages
    assert {entry["step"] for entry in info["logEntries"] if entry["message"].startswith("[2/6]")} == {"2"}

    foreground = [c for c in plane.agents.calls if not c.background]
    run_update = next(c for c in foreground if c.command == "apt-get update")
    assert run_update.user == "root"
    assert run_update.cwd is None
    copy = next(c for c in foreground if "tar -xf" in c.command)
    assert copy.user == "root"
    assert copy.cwd == "/home/user"
    assert "chown -h user:user" in copy.command
    assert "chmod 0755" in copy.command
    assert plane.agents.uploads == [(f"/tmp/.e2b-build-{HASH}.tar", b"archive")]
    make = next(c for c in foreground if c.command == "make")
    assert (make.user, make.cwd, make.env) == ("guest", "/srv/work", {"GREETING": "hello"})
    assert [c.command for c in plane.agents.calls if c.background] == ["serve"]  # proved once at the build
    assert not await plane.backend.list()  # the build's sandbox is gone

    plane.agents.calls.clear()
    sandbox = await plane.request("POST", "/sandboxes", json={"templateID": "my-app:v1", "envVars": {"A": "1"}})
    assert sandbox.status_code == 201, sandbox.text
    assert sandbox.json()["templateID"] == created["templateID"]
    (running,) = await plane.backend.list()
    assert running.template.startswith("snap-fake-")  # the build's layer
    init = plane.initializer.calls[-1][2]
    assert init["defaultUser"] == "guest"
    assert init["defaultWorkdir"] == "/srv/work"
    assert init["envVars"] == {"GREETING": "hello", "A": "1"}
    assert [(c.command, c.user, c.background) for c in plane.agents.calls] == [
        ("serve", "guest", True),
        ("check", "guest", False),
    ]
    listed = await plane.request("GET", "/templates")
    conforms("Template", listed.json(), array=True)
    assert listed.json()[0]["spawnCount"] == 1
    assert listed.json()[0]["buildStatus"] == "ready"


async def test_a_second_build_of_the_same_steps_comes_from_the_cache(plane: BuildPlane) -> None:
    steps = [{"type": "RUN", "args": ["one"]}, {"type": "RUN", "args": ["two"]}]
    _first, info = await plane.build("cached", steps)
    assert info["status"] == "ready"
    runs = len(plane.agents.calls)
    _second, again = await plane.build("cached", steps)
    assert again["status"] == "ready"
    assert len(plane.agents.calls) == runs  # nothing ran again
    assert [e["message"] for e in again["logEntries"] if e["message"].startswith("CACHED")] == [
        "CACHED [1/2] RUN one",
        "CACHED [2/2] RUN two",
    ]
    _third, changed = await plane.build("cached", [*steps, {"type": "RUN", "args": ["three"]}])
    assert changed["status"] == "ready"
    assert [c.command for c in plane.agents.calls[runs:]] == ["three"]  # from the layer after "two"
    _forced, forced = await plane.build("cached", steps, force=True)
    assert forced["status"] == "ready"
    assert [c.command for c in plane.agents.calls[runs + 1 :]] == ["one", "two"]


async def test_a_failing_step_fails_the_build_with_its_output_and_moves_no_tag(plane: BuildPlane) -> None:
    _good, ready = await plane.build("app", [{"type": "RUN", "args": ["good"]}])
    assert ready["status"] == "ready"
    plane.agents.exit_codes["broken"] = 3
    created = await plane.new_build("app")
    await plane.start(created, steps=[{"type": "RUN", "args": ["fine"]}, {"type": "RUN", "args": ["broken"]}])
    info = await plane.finished(created)
    assert info["status"] == "error"
    assert info["reason"]["step"] == "2"
    assert info["reason"]["message"].startswith("Command failed with exit code 3: broken")
    assert "ran: broken" in info["reason"]["message"]  # the step's output, which the clients show
    assert any(e["message"] == "ran: broken" for e in info["reason"]["logEntries"])
    sandbox = await plane.request("POST", "/sandboxes", json={"templateID": "app"})
    assert sandbox.status_code == 201  # the default tag still names the good build
    assert (await plane.backend.list())[0].template != "base"


async def test_a_missing_user_fails_its_step(plane: BuildPlane) -> None:
    plane.agents.unknown_users.add("ghost")
    _created, info = await plane.build("who", [{"type": "RUN", "args": ["id", "ghost"]}])
    assert info["status"] == "error"
    assert "invalid username" in info["reason"]["message"]


async def test_copy_of_files_never_uploaded_fails(plane: BuildPlane) -> None:
    _created, info = await plane.build("nofiles", [{"type": "COPY", "args": ["a", "/b"], "filesHash": HASH}])
    assert info["status"] == "error"
    assert "were not uploaded" in info["reason"]["message"]


async def test_tags_point_names_at_builds(plane: BuildPlane) -> None:
    created, _info = await plane.build("tagged", [{"type": "RUN", "args": ["x"]}])
    assigned = await plane.request("POST", "/templates/tags", json={"target": "tagged", "tags": ["prod", "v2"]})
    assert assigned.status_code == 201, assigned.text
    conforms("AssignedTemplateTags", assigned.json())
    assert assigned.json() == {"tags": ["prod", "v2"], "buildID": created["buildID"]}
    listed = await plane.request("GET", "/templates/tagged/tags")
    conforms("TemplateTag", listed.json(), array=True)
    assert sorted(t["tag"] for t in listed.json()) == ["default", "prod", "v2"]
    assert (await plane.request("POST", "/sandboxes", json={"templateID": "tagged:prod"})).status_code == 201
    removed = await plane.request("DELETE", "/templates/tags", json={"name": "tagged", "tags": ["prod"]})
    assert removed.status_code == 204
    gone = await plane.request("POST", "/sandboxes", json={"templateID": "tagged:prod"})
    assert gone.status_code == 404
    missing = await plane.request("DELETE", "/templates/tags", json={"name": "tagged", "tags": ["nope"]})
    assert missing.status_code == 404
    bad = await plane.request("POST", "/templates/tags", json={"target": "tagged", "tags": ["Not Valid"]})
    assert bad.status_code == 400


async def test_another_owners_template_is_missing_to_everyone_else(plane: BuildPlane) -> None:
    created, _info = await plane.build("private", [{"type": "RUN", "args": ["x"]}])
    template_id, build_id = created["templateID"], created["buildID"]
    for method, path, body in [
        ("GET", f"/templates/{template_id}/builds/{build_id}/status", None),
        ("GET", f"/templates/{template_id}", None),
        ("GET", f"/templates/{template_id}/tags", None),
        ("GET", f"/templates/{template_id}/files/{HASH}", None),
        ("GET", "/templates/aliases/private", None),
        ("POST", "/sandboxes", {"templateID": "private"}),
        ("DELETE", f"/templates/{template_id}", None),
    ]:
        response = await plane.request(method, path, BOB, json=body)
        assert response.status_code == 404, (method, path, response.text)
    assert (await plane.request("GET", "/templates", BOB)).json() == []
    mine = await plane.request("GET", "/templates/aliases/private")
    assert mine.status_code == 200
    assert mine.json() == {"templateID": template_id, "public": False}
    public = await plane.request("GET", "/templates/aliases/base", BOB)
    assert public.json() == {"templateID": "base", "public": True}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"name": "Bad Name"}, 400, "Invalid template name"),
        ({"name": "base"}, 400, "taken by a template this server offers"),
        ({"name": "ok", "tags": ["bad tag"]}, 400, "Invalid tag"),
        ({"name": "ok", "cpuCount": 0}, 400, "cpuCount"),
        ({"name": "ok", "memoryMB": 64}, 400, "memoryMB"),
        ({}, 400, "name is required"),
    ],
)
async def test_bad_build_requests_are_refused_and_store_nothing(
    plane: BuildPlane, body: dict[str, Any], status: int, message: str
) -> None:
    response = await plane.request("POST", "/v3/templates", json=body)
    assert response.status_code == status
    assert message in response.json()["message"]
    assert (await plane.request("GET", "/templates")).json() == []


async def test_a_build_starts_once_and_with_a_body_it_can_carry_out(plane: BuildPlane) -> None:
    created = await plane.new_build("once")
    bad = await plane.start(created, steps=[{"type": "NOPE"}])
    assert bad.status_code == 400
    assert (await plane.start(created, steps=[])).status_code == 202  # the bad body was not stored
    twice = await plane.start(created, steps=[])
    assert twice.status_code == 400
    assert "already started" in twice.json()["message"]
    registry = await plane.new_build("img")
    refused = await plane.request(
        "POST",
        f"/v2/templates/{registry['templateID']}/builds/{registry['buildID']}",
        json={"fromImage": "Nginx Latest"},
    )
    assert refused.status_code == 400
    assert "is not an image reference" in refused.json()["message"]


async def test_upload_links_are_their_own_authority(plane: BuildPlane) -> None:
    created = await plane.new_build("files")
    bad_hash = await plane.request("GET", f"/templates/{created['templateID']}/files/xyz")
    assert bad_hash.status_code == 400
    url = (await plane.request("GET", f"/templates/{created['templateID']}/files/{HASH}")).json()["url"]
    # The signature is hex: its last digit swapped for another is a different one, always.
    forged = await plane.client.put(url[:-1] + ("0" if url[-1] != "0" else "1"), content=b"x")
    assert forged.status_code == 403
    other = await plane.client.put(url.replace(HASH, "f" * 64), content=b"x")
    assert other.status_code == 403
    too_big = await plane.client.put(url, content=b"x" * (1 << 17))
    assert too_big.status_code == 413
    link = await plane.request("GET", f"/templates/{created['templateID']}/files/{HASH}")
    assert link.json()["present"] is False  # nothing of the refused upload is kept
    assert (await plane.client.put(url, content=b"ok")).status_code == 200


async def test_deleting_a_template_deletes_its_layers_once_nothing_runs_on_them(plane: BuildPlane) -> None:
    created, _info = await plane.build("doomed", [{"type": "RUN", "args": ["x"]}])
    # The step cache keeps the layer for later builds; a full cache retires the oldest entries.
    await plane.store.remember(
        "alice", plane_entry := await _only_cache_entry(plane), plane.service.now(), keep=0
    )  # fmt: skip
    layer = plane_entry.layer
    sandbox = await plane.request("POST", "/sandboxes", json={"templateID": "doomed"})
    assert sandbox.status_code == 201
    deleted = await plane.request("DELETE", f"/templates/{created['templateID']}")
    assert deleted.status_code == 204
    assert layer in plane.backend.templates  # a sandbox runs on it
    assert (await plane.request("POST", "/sandboxes", json={"templateID": "doomed"})).status_code == 404
    await plane.request("DELETE", f"/sandboxes/{sandbox.json()['sandboxID']}")
    assert await plane.templates.sweep() == [layer]
    assert layer not in plane.backend.templates


async def _only_cache_entry(plane: BuildPlane) -> Any:
    rows = await plane.store._db.execute_fetchall("SELECT key FROM build_cache")
    (key,) = [str(row[0]) for row in rows]
    entry = await plane.store.cached("alice", key)
    assert entry is not None
    return entry


async def test_a_build_cut_off_by_a_stop_is_recorded_failed(plane: BuildPlane) -> None:
    created = await plane.new_build("cut")
    queued = await plane.new_build("queued")
    requested = await plane.new_build("requested")  # asked for, files being uploaded, not started
    await plane.store.start_build(created["buildID"], {"fromImage": "e2bdev/base"}, plane.service.now())
    await plane.store.set_building(created["buildID"], plane.service.now())
    await plane.store.start_build(queued["buildID"], {"fromImage": "e2bdev/base"}, plane.service.now())
    assert sorted(await plane.templates.recover()) == sorted([created["buildID"], queued["buildID"]])
    for cut in (created, queued):
        info = await plane.finished(cut)
        assert info["status"] == "error"
        assert info["reason"]["message"] == RESTARTED
    status = await plane.request("GET", f"/templates/{requested['templateID']}/builds/{requested['buildID']}/status")
    assert status.json()["status"] == "waiting"
    started = await plane.start(requested, steps=[])  # a client that started it after the restart
    assert started.status_code == 202, started.text
    assert (await plane.finished(requested))["status"] == "ready"


async def test_a_ready_command_that_never_passes_fails_the_create(
    plane: BuildPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    _created, info = await plane.build("slow", [], startCmd="serve", readyCmd="check")
    assert info["status"] == "ready"
    plane.agents.exit_codes["check"] = 1
    monkeypatch.setattr(_sandbox_templates, "START_READY_TIMEOUT_S", 0.3)
    response = await plane.request("POST", "/sandboxes", json={"templateID": "slow"})
    assert response.status_code == 500
    assert "did not become ready" in response.json()["message"]
    assert await plane.backend.list() == []  # released


async def test_the_legacy_dockerfile_routes_name_the_builder(plane: BuildPlane) -> None:
    for method, path in [("POST", "/templates"), ("POST", "/templates/x"), ("POST", "/templates/x/builds/y")]:
        response = await plane.request(method, path, json={"dockerfile": "FROM x"})
        assert response.status_code == 400
        assert "from_dockerfile" in response.json()["message"]


async def test_get_update_and_logs_of_a_template(plane: BuildPlane) -> None:
    created, _info = await plane.build("seen", [{"type": "RUN", "args": ["x"]}])
    got = await plane.request("GET", "/templates/seen")
    conforms("TemplateWithBuilds", got.json())
    assert [b["status"] for b in got.json()["builds"]] == ["ready"]
    updated = await plane.request("PATCH", f"/v2/templates/{created['templateID']}", json={"public": True})
    assert updated.status_code == 200
    assert updated.json() == {"names": ["seen"]}
    assert (await plane.request("GET", "/templates/aliases/seen")).json()["public"] is True
    logs = await plane.request(
        "GET", f"/templates/{created['templateID']}/builds/{created['buildID']}/logs", params={"level": "info"}
    )
    conforms("TemplateBuildLogsResponse", logs.json())
    assert any(e["message"] == "[1/1] RUN x" for e in logs.json()["logs"])
    backward = await plane.request(
        "GET", f"/templates/{created['templateID']}/builds/{created['buildID']}/logs", params={"direction": "backward"}
    )
    assert backward.json()["logs"][0]["message"].startswith("Build finished")
    assert json.dumps(backward.json())  # plain JSON


async def test_a_layer_two_templates_share_outlives_the_first_ones_deletion(plane: BuildPlane) -> None:
    steps = [{"type": "RUN", "args": ["same"]}]
    first, _ = await plane.build("twin-a", steps)
    await plane.build("twin-b", steps)  # from the cache: the same layer
    assert (await plane.request("DELETE", f"/templates/{first['templateID']}")).status_code == 204
    assert (await plane.request("POST", "/sandboxes", json={"templateID": "twin-b"})).status_code == 201
    (running,) = await plane.backend.list()
    assert running.template in plane.backend.templates
    await plane.request("DELETE", f"/sandboxes/{running.sandbox_id}")
    await plane.store.remember("alice", await _only_cache_entry(plane), plane.service.now(), keep=0)
    assert (await plane.request("DELETE", "/templates/twin-b")).status_code == 204
    assert running.template not in plane.backend.templates  # the last name gone, the layer too


async def test_deleting_a_template_cancels_its_build_and_ends_the_build_sandbox(plane: BuildPlane) -> None:
    created = await plane.new_build("endless")
    await plane.start(created, steps=[{"type": "RUN", "args": ["hang"]}])
    await asyncio.wait_for(plane.agents.hanging.wait(), 10)
    assert len(await plane.backend.list()) == 1  # the build's sandbox
    assert (await plane.request("DELETE", "/templates/endless")).status_code == 204
    assert await plane.backend.list() == []
    status = await plane.request("GET", f"/templates/{created['templateID']}/builds/{created['buildID']}/status")
    assert status.status_code == 404


async def test_parallel_builds_and_tag_changes_of_one_server_do_not_collide(plane: BuildPlane) -> None:
    """The clients of one server build at once (the harness runs three): every write must stay its own."""

    async def one(index: int) -> dict[str, Any]:
        created, info = await plane.build(f"par-{index}", [{"type": "RUN", "args": [f"step {index}"]}])
        assert info["status"] == "ready", info
        tagged = await plane.request("POST", "/templates/tags", json={"target": f"par-{index}", "tags": ["x", "y"]})
        assert tagged.status_code == 201, tagged.text
        removed = await plane.request("DELETE", "/templates/tags", json={"name": f"par-{index}", "tags": ["x"]})
        assert removed.status_code == 204, removed.text
        ids: dict[str, Any] = created
        return ids

    created = await asyncio.gather(*(one(index) for index in range(12)))
    for index, build in enumerate(created):
        tags = await plane.request("GET", f"/templates/{build['templateID']}/tags")
        assert sorted(t["tag"] for t in tags.json()) == ["default", "y"], index


async def test_a_snapshot_outlives_the_template_its_sandbox_came_from(plane: BuildPlane) -> None:
    created, _info = await plane.build("source", [{"type": "RUN", "args": ["x"]}])
    sandbox = await plane.request("POST", "/sandboxes", json={"templateID": "source"})
    snapshot = await plane.request("POST", f"/sandboxes/{sandbox.json()['sandboxID']}/snapshots", json={})
    assert snapshot.status_code == 201, snapshot.text
    await plane.request("DELETE", f"/sandboxes/{sandbox.json()['sandboxID']}")
    assert (await plane.request("DELETE", f"/templates/{created['templateID']}")).status_code == 204
    again = await plane.request("POST", "/sandboxes", json={"templateID": snapshot.json()["snapshotID"]})
    assert again.status_code == 201, again.text


async def test_a_registry_image_is_the_base_with_its_environment_and_the_credentials_given(
    plane: BuildPlane, tmp_path: Path
) -> None:
    registry = {"type": "registry", "username": "robot", "password": "hunter2-secret"}
    steps = [{"type": "ENV", "args": ["STEP_VAR", "x"]}, {"type": "RUN", "args": ["make"]}]
    created = await plane.new_build("from-image")
    response = await plane.start(
        created, fromImage="127.0.0.1:5000/team/app:1", fromImageRegistry=registry, steps=steps
    )
    assert response.status_code == 202, response.text
    info = await plane.finished(created)
    assert info["status"] == "ready", info
    ((reference, credentials),) = plane.images.asked
    assert reference == "127.0.0.1:5000/team/app:1"
    assert credentials is not None
    assert credentials.password == "hunter2-secret"
    messages = [entry["message"] for entry in info["logEntries"]]
    assert "Resolving 127.0.0.1:5000/team/app:1" in messages  # the source's lines reach the build log
    assert not any("hunter2-secret" in message for message in messages)
    make = next(c for c in plane.agents.calls if c.command == "make")
    # The image's environment, then the steps'; steps run as user in its home, not the image's workdir.
    assert make.env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "IMAGE_VAR": "from-image", "STEP_VAR": "x"}
    assert (make.user, make.cwd) == ("user", None)
    sandbox = await plane.request("POST", "/sandboxes", json={"templateID": "from-image"})
    assert sandbox.status_code == 201, sandbox.text
    assert plane.initializer.calls[-1][2]["envVars"]["IMAGE_VAR"] == "from-image"
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("server.db*"))
    assert b"robot" in stored  # the build's body is kept ...
    assert b"hunter2-secret" not in stored  # ... without the registry password


async def test_the_base_image_is_never_pulled(plane: BuildPlane) -> None:
    _created, info = await plane.build("on-base", [{"type": "RUN", "args": ["make"]}])
    assert info["status"] == "ready"
    assert plane.images.asked == []


async def test_an_image_that_cannot_be_pulled_fails_the_build_at_its_base(plane: BuildPlane) -> None:
    plane.images.refuse["127.0.0.1:5000/team/app:1"] = "reading manifest 1: unauthorized: authentication required"
    created = await plane.new_build("no-pull")
    await plane.start(created, fromImage="127.0.0.1:5000/team/app:1", steps=[{"type": "RUN", "args": ["make"]}])
    info = await plane.finished(created)
    assert info["status"] == "error"
    assert info["reason"]["step"] == "base"
    assert "Pulling 127.0.0.1:5000/team/app:1 failed: reading manifest 1: unauthorized" in info["reason"]["message"]
    assert not any(c.command == "make" for c in plane.agents.calls)
    assert not await plane.backend.list()
    sandbox = await plane.request("POST", "/sandboxes", json={"templateID": "no-pull"})
    assert sandbox.status_code == 404  # nothing half-built is usable


@pytest.mark.parametrize(("memory", "again"), [(False, True), (True, False)])
async def test_a_resume_whose_processes_start_afresh_runs_the_start_command_again(
    plane: BuildPlane, memory: bool, again: bool
) -> None:
    _created, info = await plane.build(
        "served", [{"type": "RUN", "args": ["make"]}], startCmd="serve", readyCmd="check"
    )
    assert info["status"] == "ready"
    sandbox = await plane.request("POST", "/sandboxes", json={"templateID": "served"})
    assert sandbox.status_code == 201, sandbox.text
    sandbox_id = sandbox.json()["sandboxID"]
    plane.agents.calls.clear()
    # Without memory only the files are kept, as a host restart leaves a sandbox.
    paused = await plane.request("POST", f"/sandboxes/{sandbox_id}/pause", json={"memory": memory})
    assert paused.status_code == 204, paused.text
    resumed = await plane.request("POST", f"/sandboxes/{sandbox_id}/connect", json={"timeout": 60})
    assert resumed.status_code == 201, resumed.text
    ran = [(c.command, c.user, c.background) for c in plane.agents.calls]
    assert ran == ([("serve", "user", True), ("check", "user", False)] if again else [])
