"""The wire recorder: canonical request lines, the fixture server, and drift against the committed recordings."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format

from conformance import _fixture_server
from conformance._canonical import canonical_request, decode_envelopes, dumps_line, encode_envelope
from conformance._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from conformance._fixture_server import API_KEY, ENVD_TOKEN, FixtureServer
from conformance._recorder import (
    FIXTURES_DIR,
    FLAVOURS,
    check_drift,
    diff_lines,
    fixture_path,
    record,
    run_recording,
    write_fixtures,
)
from contract.generated.process import process_pb2

SECRET = "e2b_" + "ab" * 20


def _line(method: str, target: str, headers: dict[str, str], body: bytes) -> str:
    return dumps_line(canonical_request(method, target, list(headers.items()), body))


# --- canonicalization ---


def test_json_bodies_compare_by_content_not_key_order_or_whitespace() -> None:
    headers = {"content-type": "application/json"}
    compact = _line("POST", "/sandboxes", headers, b'{"templateID":"base","metadata":{"b":"2","a":"1"},"timeout":120}')
    pretty = _line(
        "post",
        "/sandboxes",
        headers,
        b'{\n  "timeout": 120,\n  "metadata": {"a": "1", "b": "2"},\n  "templateID": "base"\n}',
    )
    assert compact == pretty
    assert '"metadata":{"a":"1","b":"2"}' in compact, "keys are sorted at every level"
    assert _line("POST", "/sandboxes", headers, b'{"templateID":"base","timeout":300}') != compact


def test_query_is_parsed_and_sorted() -> None:
    a = canonical_request("GET", "/v2/sandboxes?metadata=k%3Dv&nextToken=t&limit=1", [], b"")
    b = canonical_request("GET", "/v2/sandboxes?limit=1&metadata=k%3Dv&nextToken=t", [], b"")
    assert dumps_line(a) == dumps_line(b)
    assert a["query"] == {"limit": ["1"], "metadata": ["k=v"], "nextToken": ["t"]}
    assert list(a["query"]) == ["limit", "metadata", "nextToken"]


def test_connect_envelopes_are_decoded_so_pretty_and_compact_messages_compare_equal() -> None:
    start = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo fixture"]}, "stdin": False}
    python_style = encode_envelope(json.dumps(start, indent=2).encode())  # the Python client pretty-prints
    js_style = encode_envelope(json.dumps(start, separators=(",", ":")).encode())
    headers = {"content-type": "application/connect+json"}
    assert python_style != js_style
    assert _line("POST", "/process.Process/Start", headers, python_style) == _line(
        "POST", "/process.Process/Start", headers, js_style
    )
    frames = decode_envelopes(js_style + encode_envelope(b"{}", 0x02))
    assert frames == [{"flags": 0, "message": start}, {"flags": 2, "message": {}}]


def test_truncated_or_non_json_envelopes_are_reported_not_dropped() -> None:
    frames = decode_envelopes(encode_envelope(b"not json") + encode_envelope(b'{"a":1}')[:7])
    assert frames[0]["message"]["not_json"]["length"] == 8
    assert frames[1]["flags"] == 0
    assert frames[1]["truncated"]["length"] == 2


def _multipart(boundary: str, content: bytes) -> tuple[dict[str, str], bytes]:
    body = (
        (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="file"; filename="/home/user/a.txt"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return {"content-type": f"multipart/form-data; boundary={boundary}"}, body


def test_multipart_bodies_do_not_depend_on_the_boundary() -> None:
    headers, body = _multipart("a1b2c3", b"hello\n")  # httpx-style boundary
    first = canonical_request("POST", "/files", list(headers.items()), body)
    headers, body = _multipart("----formdata-undici-012345678901", b"hello\n")  # undici-style
    second = canonical_request("POST", "/files", list(headers.items()), body)
    assert dumps_line(first) == dumps_line(second)
    assert first["headers"]["content-type"] == "multipart/form-data; boundary=<boundary>"
    (part,) = first["body"]["multipart"]
    assert part["name"] == "file"
    assert part["filename"] == "/home/user/a.txt"
    assert part["content_type"] == "application/octet-stream"
    assert part["length"] == 6
    changed_headers, changed_body = _multipart("a1b2c3", b"hellO\n")
    changed = canonical_request("POST", "/files", list(changed_headers.items()), changed_body)
    assert changed["body"]["multipart"][0]["sha256"] != part["sha256"], "the content still counts"


def test_secrets_are_redacted() -> None:
    headers = {
        "X-API-KEY": SECRET,
        "X-Access-Token": "envd-secret-token",
        "Authorization": "Basic dXNlcjo=",
        "E2B-Traffic-Access-Token": "traffic-secret",
    }
    line = canonical_request("GET", "/health", list(headers.items()), b"")
    assert line["headers"] == {
        "x-api-key": "<key>",
        "x-access-token": "<token>",
        "authorization": "Basic <credentials>",
        "e2b-traffic-access-token": "<token>",
    }
    text = dumps_line(line)
    assert SECRET not in text
    assert "envd-secret-token" not in text
    assert "dXNlcjo=" not in text
    assert "traffic-secret" not in text


def test_volatile_values_are_normalized_and_other_headers_kept_exactly() -> None:
    headers = {
        "Host": "127.0.0.1:40123",
        "Content-Length": "17",
        "lang_version": "3.11.2",
        "system": "Linux",
        "User-Agent": "e2b-python-sdk/2.32.0",
        "Transfer-Encoding": "chunked",
        "Connect-Timeout-Ms": "60000",
        "content-type": "application/json",
    }
    line = canonical_request(
        "GET",
        "/sandboxes/x/metrics?start=2026-05-01T10:00:00Z",
        list(headers.items()),
        b'{"at":"2026-05-01T10:00:00.123Z"}',
    )
    assert line["headers"] == {
        "host": "<host>",
        "content-length": "<length>",
        "lang_version": "<runtime version>",
        "system": "<system>",
        "user-agent": "e2b-python-sdk/2.32.0",
        "transfer-encoding": "chunked",
        "connect-timeout-ms": "60000",
        "content-type": "application/json",
    }
    assert line["query"] == {"start": ["<timestamp>"]}
    assert line["body"] == {"json": {"at": "<timestamp>"}}


def test_other_bodies_are_digested_and_gzip_is_compared_by_content() -> None:
    raw = canonical_request("POST", "/files", [("content-type", "application/octet-stream")], b"abc")
    assert raw["body"] == {"length": 3, "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}
    zipped = [("content-type", "application/octet-stream"), ("content-encoding", "gzip")]
    one = canonical_request("POST", "/files", zipped, gzip.compress(b"abc", mtime=1))
    two = canonical_request("POST", "/files", zipped, gzip.compress(b"abc", mtime=2))
    assert one["body"] == two["body"] == raw["body"]
    assert canonical_request("GET", "/files", [], b"")["body"] is None


def test_diff_names_the_flavour_and_the_first_differing_request() -> None:
    committed = [
        _line("POST", "/sandboxes", {}, b""),
        _line("POST", "/sandboxes/fixture-sandbox-1/pause", {"content-type": "application/json"}, b'{"memory":true}'),
        _line("DELETE", "/sandboxes/fixture-sandbox-1", {}, b""),
    ]
    recorded = [*committed]
    recorded[1] = _line("POST", "/sandboxes/fixture-sandbox-1/pause", {"content-type": "application/json"}, b"{}")
    assert diff_lines("py-sync", committed, list(committed)) == ""
    report = diff_lines("py-sync", committed, recorded)
    assert report.startswith("wire drift in py-sync: 3 committed requests, 3 recorded; first difference at request #2")
    assert "POST /sandboxes/fixture-sandbox-1/pause" in report
    assert f"-{committed[1]}" in report.splitlines()
    assert f"+{recorded[1]}" in report.splitlines()
    shorter = diff_lines("js", committed, committed[:2])
    assert "request #3: committed DELETE /sandboxes/fixture-sandbox-1, recorded (none)" in shorter


def test_fixture_files_are_named_by_flavour_and_client_version(tmp_path: Path) -> None:
    assert fixture_path("py-sync", "2.32.0", tmp_path) == tmp_path / "wire" / "py-sync-2.32.0.jsonl"
    assert fixture_path("js", "2.33.0") == FIXTURES_DIR / "wire" / "js-2.33.0.jsonl"
    with pytest.raises(ValueError, match="unknown flavour"):
        fixture_path("ruby", "1.0.0", tmp_path)
    with pytest.raises(ValueError, match="not a version"):
        fixture_path("js", "../2.33.0", tmp_path)


def test_a_flavour_needs_its_own_kind_of_clients(tmp_path: Path) -> None:
    python = PythonClients(python=tmp_path / "python", site_packages=tmp_path, version="2.32.0")
    with pytest.raises(TypeError, match="NodeClients"):
        record("js", python)
    with pytest.raises(TypeError, match="PythonClients"):
        record("py-async", NodeClients(root=tmp_path, version="2.33.0"))


# --- the fixture server, driven by hand ---


@pytest.fixture
def server() -> Iterator[FixtureServer]:
    with FixtureServer() as running:
        yield running


def _api(server: FixtureServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"X-API-Key": API_KEY})


def _envd(server: FixtureServer, sandbox_id: str) -> httpx.Client:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": ENVD_TOKEN}
    return httpx.Client(base_url=server.url, headers=headers)


def test_fixture_control_plane_is_stateful_and_deterministic(server: FixtureServer) -> None:
    with _api(server) as api:
        created = api.post("/sandboxes", json={"templateID": "base", "metadata": {"k": "v"}, "timeout": 60})
        assert created.status_code == 201
        assert created.json() == {
            "sandboxID": "fixture-sandbox-1",
            "templateID": "base",
            "clientID": "fixture-client",
            "envdVersion": "0.6.4",
            "envdAccessToken": "fixture-envd-token",
            "trafficAccessToken": "fixture-traffic-token",
        }
        assert api.post("/sandboxes", json={"templateID": "other"}).json()["sandboxID"] == "fixture-sandbox-2"
        detail = api.get("/sandboxes/fixture-sandbox-1").json()
        assert (detail["state"], detail["metadata"], detail["startedAt"]) == (
            "running",
            {"k": "v"},
            _fixture_server.STARTED_AT,
        )

        first = api.get("/v2/sandboxes", params={"limit": 1})
        assert [s["sandboxID"] for s in first.json()] == ["fixture-sandbox-1"]
        token = first.headers["x-next-token"]
        second = api.get("/v2/sandboxes", params={"limit": 1, "nextToken": token})
        assert [s["sandboxID"] for s in second.json()] == ["fixture-sandbox-2"]
        assert "x-next-token" in second.headers, "a full page carries a token"
        last = api.get("/v2/sandboxes", params={"limit": 1, "nextToken": second.headers["x-next-token"]})
        assert (last.json(), "x-next-token" in last.headers) == ([], False)
        assert [s["sandboxID"] for s in api.get("/v2/sandboxes", params={"metadata": "k=v"}).json()] == [
            "fixture-sandbox-1"
        ]

        assert api.post("/sandboxes/fixture-sandbox-1/pause", json={"memory": True}).status_code == 204
        again = api.post("/sandboxes/fixture-sandbox-1/pause", json={"memory": True})
        assert (again.status_code, again.json()["code"]) == (409, 409)
        assert api.post("/sandboxes/fixture-sandbox-1/connect", json={"timeout": 60}).status_code == 201
        assert api.post("/sandboxes/fixture-sandbox-1/connect", json={"timeout": 60}).status_code == 200
        assert api.post("/sandboxes/fixture-sandbox-1/timeout", json={"timeout": 30}).status_code == 204
        assert api.get("/sandboxes/fixture-sandbox-1/metrics").json() == []

        snapshot = api.post("/sandboxes/fixture-sandbox-1/snapshots", json={})
        assert snapshot.status_code == 201
        snapshot_id = snapshot.json()["snapshotID"]
        assert snapshot_id == "fixture-snapshot-1"
        assert api.get("/snapshots", params={"sandboxID": "fixture-sandbox-1"}).json() == [snapshot.json()]
        assert api.delete(f"/templates/{snapshot_id}").status_code == 204
        assert api.delete(f"/templates/{snapshot_id}").status_code == 404

        assert api.delete("/sandboxes/fixture-sandbox-1").status_code == 204
        gone = api.delete("/sandboxes/fixture-sandbox-1")
        assert (gone.status_code, gone.json()["code"]) == (404, 404)
        assert api.get("/sandboxes/fixture-sandbox-1").status_code == 404
    assert httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-Key": "e2b_00"}).status_code == 401


def test_unknown_requests_get_501_and_are_still_recorded(server: FixtureServer) -> None:
    with _api(server) as api:
        response = api.put("/sandboxes/nothing/network?x=1", json={"allowOut": []})
    assert response.status_code == 404  # a sandbox path first needs a sandbox
    with _api(server) as api:
        response = api.get("/teams")
    assert (response.status_code, response.json()) == (501, {"code": 501, "message": "not recorded"})
    lines = server.lines()
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("PUT", "/sandboxes/nothing/network", 404),
        ("GET", "/teams", 501),
    ]
    assert lines[0]["query"] == {"x": ["1"]}
    assert lines[0]["body"] == {"json": {"allowOut": []}}
    assert lines[1]["headers"]["x-api-key"] == "<key>"


def test_fixture_envd_answers_connect_with_the_contract_messages(server: FixtureServer) -> None:
    with _api(server) as api:
        api.post("/sandboxes", json={"templateID": "base"})
    request = process_pb2.StartRequest(process=process_pb2.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", "x"]))
    with _envd(server, "fixture-sandbox-1") as envd:
        assert envd.get("/health").status_code == 204
        stream = envd.post(
            "/process.Process/Start",
            content=encode_envelope(json_format.MessageToJson(request).encode()),
            headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"},
        )
        assert stream.headers["content-type"] == "application/connect+json"
        frames = decode_envelopes(stream.content)
        events = [json_format.ParseDict(f["message"], process_pb2.StartResponse()).event for f in frames[:-1]]
        assert [e.WhichOneof("event") for e in events] == ["start", "data", "end"]
        assert (events[0].start.pid, events[1].data.stdout, events[2].end.exit_code) == (
            _fixture_server.PID,
            b"fixture\n",
            0,
        )
        assert frames[-1] == {"flags": 2, "message": {}}

        bad = envd.post("/process.Process/List", content=b'{"nope": 1}', headers={"Content-Type": "application/json"})
        assert (bad.status_code, bad.json()["code"]) == (400, "invalid_argument")
        assert (
            envd.post("/process.Process/List", content=b"{}", headers={"Content-Type": "application/json"}).json() == {}
        )

        upload = envd.post("/files", params={"path": "/home/user/a.txt"}, files={"file": ("/home/user/a.txt", b"x")})
        assert upload.json() == [{"name": "a.txt", "type": "file", "path": "/home/user/a.txt"}]
        assert envd.get("/files", params={"path": "/home/user/a.txt"}).content == _fixture_server.FILE_BYTES
        stat = envd.post("/filesystem.Filesystem/Stat", json={"path": "a.txt"})
        assert (stat.json()["entry"]["path"], stat.json()["entry"]["type"]) == ("/home/user/a.txt", "FILE_TYPE_FILE")
        missing = envd.post("/filesystem.Filesystem/Stat", json={"path": "/nope"})
        assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
        assert envd.post("/filesystem.Filesystem/MakeDir", json={"path": "/home/user/d"}).status_code == 200
        assert envd.post("/filesystem.Filesystem/MakeDir", json={"path": "/home/user/d"}).status_code == 409
        listed = envd.post("/filesystem.Filesystem/ListDir", json={"path": "/home/user", "depth": 1}).json()
        assert [e["name"] for e in listed["entries"]] == ["a.txt", "d"]
        assert envd.post("/process.Process/SendSignal", json={}).status_code == 501
    with _envd(server, "fixture-sandbox-9") as envd:
        assert envd.get("/health").status_code == 502
    assert httpx.get(f"{server.url}/health", headers={"E2b-Sandbox-Id": "fixture-sandbox-1"}).status_code == 401
    start = server.lines()[2]
    assert start["body"]["connect"][0]["message"]["process"]["args"] == ["-l", "-c", "x"]
    assert start["headers"]["x-access-token"] == "<token>"


# --- the official clients ---


@pytest.fixture(scope="module")
def python_clients() -> PythonClients:
    return ensure_python_clients()


@pytest.fixture(scope="module")
def node_clients() -> NodeClients:
    return ensure_node_clients()


def _clients(flavour: str, python: PythonClients, node: NodeClients) -> PythonClients | NodeClients:
    return node if flavour == "js" else python


OBSERVED: dict[str, Any] = {
    "sandbox_id": "fixture-sandbox-1",
    "info": {"state": "running", "metadata": {"recorder": "wire"}, "template_id": "base"},
    "run": {"stdout": "fixture\n", "stderr": "", "exit_code": 0},
    "processes": [],
    "written": {"name": "fixture.txt", "path": "/home/user/fixture.txt", "type": "file"},
    "read": "fixture file\n",
    "made_dir": True,
    "listed": ["fixture-dir", "fixture.txt"],
    "exists": True,
    "pages": [["fixture-sandbox-1"], []],
    "paused": True,
    "paused_again": False,
    "connected": "fixture-sandbox-1",
    "snapshot": {"id": "fixture-snapshot-1", "names": ["fixture/fixture-snapshot-1:default"]},
    "snapshots": ["fixture-snapshot-1"],
    "deleted_snapshot": True,
    "metrics": 0,
    "killed": True,
    "killed_again": False,
}


@pytest.mark.artifacts
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_recording_is_deterministic_and_the_script_completes(
    flavour: str, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    clients = _clients(flavour, python_clients, node_clients)
    first = run_recording(flavour, clients)
    second = run_recording(flavour, clients)
    assert [dumps_line(line) for line in first.lines] == [dumps_line(line) for line in second.lines]
    assert first.version == clients.version
    assert first.observed == {"client_version": clients.version, **OBSERVED}
    assert all(line["status"] != 501 for line in first.lines), "the fixture answers everything the script sends"


@pytest.mark.artifacts
def test_committed_fixtures_match(python_clients: PythonClients, node_clients: NodeClients) -> None:
    for flavour in FLAVOURS:
        path = fixture_path(flavour, _clients(flavour, python_clients, node_clients).version)
        assert path.is_file(), f"{path} is committed"
    assert check_drift(python=python_clients, node=node_clients) == ""


@pytest.mark.artifacts
def test_a_changed_fixture_line_is_reported_with_a_diff(python_clients: PythonClients, tmp_path: Path) -> None:
    version = python_clients.version
    committed = fixture_path("py-sync", version).read_text(encoding="utf-8").splitlines()
    changed = fixture_path("py-sync", version, tmp_path)
    changed.parent.mkdir(parents=True)
    lines = list(committed)
    pause = next(i for i, line in enumerate(lines) if json.loads(line)["path"].endswith("/pause"))
    edited = json.loads(lines[pause])
    edited["body"]["json"]["memory"] = False
    lines[pause] = dumps_line(edited)
    changed.write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    report = check_drift(tmp_path, ("py-sync", "py-async"), python=python_clients)
    assert f"wire drift in py-sync (e2b {version}): {len(lines)} committed requests, {len(lines)} recorded" in report
    assert f"first difference at request #{pause + 1}: committed POST /sandboxes/fixture-sandbox-1/pause" in report
    diff = report.splitlines()
    assert f"--- {changed.name} (committed)" in diff
    assert f"-{lines[pause]}" in diff
    assert f"+{committed[pause]}" in diff
    assert sum(line.startswith(("-{", "+{")) for line in diff) == 2, "only the changed request differs"
    missing = fixture_path("py-async", version, tmp_path)
    assert f"wire drift in py-async (e2b {version}): no committed recording at {missing}" in report


@pytest.mark.artifacts
def test_write_fixtures_reproduces_the_committed_file(node_clients: NodeClients, tmp_path: Path) -> None:
    (written,) = write_fixtures(tmp_path, ("js",), node=node_clients)
    assert written == fixture_path("js", node_clients.version, tmp_path)
    assert written.read_bytes() == fixture_path("js", node_clients.version).read_bytes()


def test_committed_fixtures_are_canonical_lines() -> None:
    # A cheap guard against hand edits: every committed line is what dumps_line writes.
    paths = sorted((FIXTURES_DIR / "wire").glob("*.jsonl"))
    assert {p.name for p in paths} >= {"py-sync-2.32.0.jsonl", "py-async-2.32.0.jsonl", "js-2.33.0.jsonl"}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            assert dumps_line(json.loads(line)) == line, path.name
