"""The agent on the wire: envd HTTP routes, auth, Connect codecs, and hostile input.

These talk HTTP directly (httpx) or through the Connect project's own Python client
(binary protobuf, gzip), to cover what the official SDKs never send.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from connectrpc.errors import ConnectError

from contract.generated.filesystem import filesystem_connect
from contract.generated.filesystem import filesystem_pb2 as fpb
from contract.generated.process import process_connect
from contract.generated.process import process_pb2 as ppb
from contract.protocol import decode_envelopes, encode_envelope
from runtime.agent._files import signature

from .conftest import Agent

JSON_HEADERS = {"content-type": "application/json", "connect-protocol-version": "1"}


def _stream_frames(response: httpx.Response) -> list[tuple[int, dict[str, Any]]]:
    return [(envelope.flags, json.loads(envelope.payload)) for envelope in decode_envelopes(response.content)]


def _envelope(message: dict[str, Any]) -> bytes:
    return encode_envelope(json.dumps(message).encode())


def _run(base: str, cmd: str, headers: dict[str, str] | None = None) -> list[tuple[int, dict[str, Any]]]:
    body = _envelope({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": False})
    response = httpx.post(
        f"{base}/process.Process/Start",
        content=body,
        timeout=30,
        headers={"content-type": "application/connect+json", "connect-protocol-version": "1", **(headers or {})},
    )
    assert response.status_code == 200
    return _stream_frames(response)


# -- plain HTTP routes ----------------------------------------------------------------


def test_health_metrics_envs(agent: Agent) -> None:
    health = httpx.get(f"{agent.base}/health")
    assert (health.status_code, health.content, health.headers["cache-control"]) == (204, b"", "no-store")
    metrics = httpx.get(f"{agent.base}/metrics").json()
    assert list(metrics) == [
        "ts",
        "cpu_count",
        "cpu_used_pct",
        "mem_total_mib",
        "mem_used_mib",
        "mem_total",
        "mem_used",
        "mem_cache",
        "disk_total",
        "disk_used",
    ]
    assert metrics["cpu_count"] >= 1
    assert 0 <= metrics["cpu_used_pct"] <= 100
    assert 0 < metrics["mem_used"] <= metrics["mem_total"]
    assert 0 < metrics["disk_used"] <= metrics["disk_total"]
    assert abs(metrics["ts"] - time.time()) < 5
    assert httpx.get(f"{agent.base}/envs").json()["E2B_SANDBOX"] == "true"


def test_unknown_route_and_method(agent: Agent) -> None:
    assert httpx.get(f"{agent.base}/nope").status_code == 404
    assert httpx.delete(f"{agent.base}/files").status_code == 405


def test_init_sets_env_user_workdir_and_token(private_agent: Agent, tmp_path: Path) -> None:
    base = private_agent.base
    stamp = "2030-01-01T00:00:00.123456789Z"
    body = {
        "envVars": {"FOO": "bar", "E2B_SANDBOX": "hijack"},
        "defaultWorkdir": str(tmp_path),
        "accessToken": "secret-token",
        "timestamp": stamp,
    }
    assert httpx.post(f"{base}/init", json=body).status_code == 204
    assert httpx.post(f"{base}/init", json=body).status_code == 204, "idempotent with the same token"
    # Everything but the exempt routes now needs the token.
    denied = httpx.get(f"{base}/envs")
    assert denied.status_code == 401
    assert denied.json()["code"] == 401
    assert httpx.get(f"{base}/health").status_code == 204
    token = {"X-Access-Token": "secret-token"}
    assert httpx.get(f"{base}/envs", headers=token).json() == {"FOO": "bar", "E2B_SANDBOX": "true"}
    frames = _run(base, "echo $FOO; pwd", token)
    stdout = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for _, m in frames if "data" in m.get("event", {}))
    assert stdout.decode() == f"bar\n{tmp_path}\n"
    assert httpx.post(f"{base}/process.Process/List", json={}, headers=JSON_HEADERS).status_code == 401
    # Another token, or none, cannot take over; a stale body is ignored.
    assert httpx.post(f"{base}/init", json={"accessToken": "other"}).status_code == 401
    assert httpx.post(f"{base}/init", json={}).text == "access token reset not authorized"
    stale = {"accessToken": "secret-token", "envVars": {}, "timestamp": "2029-01-01T00:00:00Z"}
    assert httpx.post(f"{base}/init", json=stale).status_code == 204
    assert httpx.get(f"{base}/envs", headers=token).json()["FOO"] == "bar"
    assert httpx.post(f"{base}/init", content=b"{not json").status_code == 400


BAD_ENVIRONMENTS = [{"A=B": "x"}, {"": "x"}, {"A\u0000B": "x"}, {"A": "x\u0000y"}]


@pytest.mark.parametrize("env", BAD_ENVIRONMENTS, ids=["equals-in-name", "empty-name", "nul-in-name", "nul-in-value"])
def test_a_bad_environment_is_refused_and_never_breaks_a_later_start(private_agent: Agent, env: dict[str, str]) -> None:
    base = private_agent.base
    assert httpx.post(f"{base}/init", json={"envVars": {"KEPT": "yes"}}).status_code == 204
    refused = httpx.post(f"{base}/init", json={"envVars": env})
    assert refused.status_code == 400, "nothing of it is stored: every later start would fail"
    assert httpx.get(f"{base}/envs").json()["KEPT"] == "yes"
    body = _envelope({"process": {"cmd": "/bin/true", "envs": env}, "stdin": False})
    response = httpx.post(
        f"{base}/process.Process/Start",
        content=body,
        timeout=30,
        headers={"content-type": "application/connect+json", "connect-protocol-version": "1"},
    )
    flags, end = _stream_frames(response)[-1]
    assert flags & 0x02, "the stream ends with an error"
    assert end["error"]["code"] == "invalid_argument"
    assert end["error"]["message"].startswith("invalid envs: ")
    assert all(value not in end["error"]["message"] for value in env.values()), "values may be secrets"
    frames = _run(base, "echo $KEPT")
    stdout = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for _, m in frames if "data" in m.get("event", {}))
    assert stdout == b"yes\n", "the agent still starts processes"


def test_signed_file_urls(private_agent: Agent, tmp_path: Path) -> None:
    base = private_agent.base
    assert httpx.post(f"{base}/init", json={"accessToken": "tok"}).status_code == 204
    path = str(tmp_path / "signed.txt")
    write_sig = signature(path, "write", "", "tok", None)
    up = httpx.post(
        f"{base}/files",
        params={"path": path, "signature": write_sig},
        content=b"signed",
        headers={"content-type": "application/octet-stream"},
    )
    assert up.status_code == 200, up.text
    expires = int(time.time()) + 60
    read_sig = signature(path, "read", "", "tok", expires)
    ok = httpx.get(f"{base}/files", params={"path": path, "signature": read_sig, "signature_expiration": expires})
    assert ok.content == b"signed"
    assert httpx.get(f"{base}/files", params={"path": path, "signature": write_sig}).json()["message"] == (
        "invalid signature"
    )
    assert httpx.get(f"{base}/files", params={"path": path}).json()["message"] == "missing signature query parameter"
    old = int(time.time()) - 10
    expired = httpx.get(
        f"{base}/files",
        params={"path": path, "signature": signature(path, "read", "", "tok", old), "signature_expiration": old},
    )
    assert expired.json()["message"] == "signature is already expired"
    assert httpx.get(f"{base}/files", params={"path": path}, headers={"X-Access-Token": "tok"}).content == b"signed"
    wrong = httpx.get(f"{base}/files", params={"path": path}, headers={"X-Access-Token": "nope"})
    assert wrong.status_code == 401


def test_file_errors(agent: Agent, tmp_path: Path) -> None:
    base = agent.base
    missing = httpx.get(f"{base}/files", params={"path": str(tmp_path / "missing")})
    assert missing.status_code == 404
    assert missing.json() == {"code": 404, "message": f"path '{tmp_path / 'missing'}' does not exist"}
    assert httpx.get(f"{base}/files", params={"path": str(tmp_path)}).status_code == 400
    assert httpx.get(f"{base}/files", params={"path": "~other/x"}).status_code == 400
    unknown = httpx.get(f"{base}/files", params={"path": "/etc/hostname", "username": "no-such-user"})
    assert unknown.status_code == 401
    assert httpx.post(f"{base}/files", content=b"x", headers={"content-type": "text/plain"}).status_code == 400
    raw = httpx.post(f"{base}/files", content=b"x", headers={"content-type": "application/octet-stream"})
    assert raw.json()["message"] == "path query parameter is required for raw body upload"
    onto_dir = httpx.post(
        f"{base}/files",
        params={"path": str(tmp_path)},
        content=b"x",
        headers={"content-type": "application/octet-stream"},
    )
    assert onto_dir.status_code == 400
    refused = httpx.get(f"{base}/files", params={"path": "/etc/hostname"}, headers={"accept-encoding": "identity;q=0"})
    assert refused.status_code == 406


def test_downloads_are_gzipped_only_where_deflate_pays(private_agent: Agent, tmp_path: Path) -> None:
    """The start of the file decides: text goes out gzipped, random bytes as they are, with a length."""
    text, noise = tmp_path / "text.log", tmp_path / "noise.bin"
    text.write_bytes(b"line of a log\n" * 200_000)  # several reads of the file
    noise.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    base, gzip_first = private_agent.base, {"accept-encoding": "gzip, deflate"}
    zipped = httpx.get(f"{base}/files", params={"path": str(text)}, headers=gzip_first)
    assert zipped.headers["content-encoding"] == "gzip"
    assert "content-length" not in zipped.headers
    assert zipped.content == text.read_bytes()
    plain = httpx.get(f"{base}/files", params={"path": str(noise)}, headers=gzip_first)
    assert "content-encoding" not in plain.headers
    assert plain.headers["content-length"] == str(noise.stat().st_size)
    assert "Accept-Encoding" in plain.headers["vary"]
    assert plain.content == noise.read_bytes()
    # A client that refuses the plain body still gets gzip (its stored blocks), whatever the bytes.
    only_gzip = {"accept-encoding": "gzip, identity;q=0"}
    insisted = httpx.get(f"{base}/files", params={"path": str(noise)}, headers=only_gzip)
    assert insisted.headers["content-encoding"] == "gzip"
    assert insisted.content == noise.read_bytes()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    nothing = httpx.get(f"{base}/files", params={"path": str(empty)}, headers=gzip_first)
    assert (nothing.status_code, nothing.headers["content-length"], nothing.content) == (200, "0", b"")


def test_gzip_both_ways_and_multipart(agent: Agent, tmp_path: Path) -> None:
    base = agent.base
    target = tmp_path / "g" / "z.txt"
    up = httpx.post(
        f"{base}/files",
        params={"path": str(target)},
        content=gzip.compress(b"zipped" * 100),
        headers={"content-type": "application/octet-stream", "content-encoding": "gzip"},
    )
    assert up.status_code == 200
    assert up.json() == [{"name": "z.txt", "path": str(target), "type": "file"}]
    down = httpx.get(f"{base}/files", params={"path": str(target)}, headers={"accept-encoding": "gzip"})
    assert down.headers["content-encoding"] == "gzip"
    assert down.content == b"zipped" * 100  # httpx decodes
    files = [
        ("file", (str(tmp_path / "m" / "one.txt"), b"1")),
        ("file", (str(tmp_path / "m" / "two.txt"), b"2")),
        ("other", ("ignored", b"?")),
    ]
    multi = httpx.post(f"{base}/files", files=files)
    assert [e["path"] for e in multi.json()] == [str(tmp_path / "m" / "one.txt"), str(tmp_path / "m" / "two.txt")]
    same = [("file", (str(tmp_path / "dup.txt"), b"1")), ("file", (str(tmp_path / "dup.txt"), b"2"))]
    assert httpx.post(f"{base}/files", files=same).status_code == 400


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A scratch folder other users can traverse (pytest's own temp root is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="agent-perm-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_permissions_are_the_users(agent: Agent, public_tmp: Path) -> None:
    """Work runs with the user's credentials: nobody cannot write where root owns the folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    tmp_path = public_tmp
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    denied = httpx.post(
        f"{agent.base}/files",
        params={"path": str(locked / "x"), "username": "nobody"},
        content=b"x",
        headers={"content-type": "application/octet-stream"},
    )
    assert denied.status_code == 403
    assert not (locked / "x").exists()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    made = httpx.post(
        f"{agent.base}/files",
        params={"path": str(open_dir / "n" / "f"), "username": "nobody"},
        content=b"x",
        headers={"content-type": "application/octet-stream"},
    )
    assert made.status_code == 200
    assert (open_dir / "n" / "f").stat().st_uid == 65534, "new files belong to the user"
    assert (open_dir / "n").stat().st_uid == 65534, "so do the parents created for them"
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    assert httpx.get(f"{agent.base}/files", params={"path": str(secret), "username": "nobody"}).status_code == 403


# -- Connect ------------------------------------------------------------------------------


def test_process_stream_framing(agent: Agent) -> None:
    frames = _run(agent.base, "printf 'a\\377b'; exit 7")
    assert frames[0][1]["event"]["start"]["pid"] > 0
    end_flags, end = frames[-1]
    assert (end_flags, end) == (2, {}), "the stream closes with an empty end-of-stream frame"
    last = frames[-2][1]["event"]["end"]
    assert last == {"exitCode": 7, "exited": True, "status": "exit status 7", "error": "exit status 7"}
    data = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for _, m in frames if "data" in m.get("event", {}))
    assert data == b"a\xffb", "binary output arrives byte for byte"


def test_keepalives_and_deadline(agent: Agent) -> None:
    frames = _run(agent.base, "sleep 5", {"keepalive-ping-interval": "1", "connect-timeout-ms": "2500"})
    kinds = [next(iter(m["event"])) if "event" in m else "eos" for _, m in frames]
    assert kinds[0] == "start"
    assert kinds.count("keepalive") == 2
    assert frames[-1] == (2, {"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}})


def test_unknown_basic_user(agent: Agent) -> None:
    auth = "Basic " + base64.b64encode(b"ghost:").decode()
    unary = httpx.post(f"{agent.base}/process.Process/List", json={}, headers={**JSON_HEADERS, "authorization": auth})
    assert unary.status_code == 401
    assert unary.json() == {"code": "unauthenticated", "message": "invalid username: 'ghost'"}
    frames = _run(agent.base, "true", {"authorization": auth})
    assert frames == [(2, {"error": {"code": "unauthenticated", "message": "invalid username: 'ghost'"}})]


def test_malformed_requests_get_protocol_errors(agent: Agent) -> None:
    bad_json = httpx.post(f"{agent.base}/filesystem.Filesystem/Stat", content=b"{nope", headers=JSON_HEADERS)
    assert bad_json.status_code == 400
    assert bad_json.json()["code"] == "invalid_argument"
    bad_proto = httpx.post(
        f"{agent.base}/filesystem.Filesystem/Stat",
        content=b"\xff\xff\xff",
        headers={"content-type": "application/proto", "connect-protocol-version": "1"},
    )
    assert bad_proto.status_code == 400
    broken_multipart = httpx.post(
        f"{agent.base}/files",
        content=b"--b\r\nContent-Disposition: form-data; name=",
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert broken_multipart.status_code in (400, 500)
    try:  # uvicorn refuses the request and closes; the refusal may or may not be read before the reset
        huge = httpx.get(f"{agent.base}/health", headers={"x-huge": "a" * 200_000})
        assert huge.status_code in (400, 431)
    except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
        pass
    assert httpx.get(f"{agent.base}/health").status_code == 204, "the agent survived all of it"


def test_binary_codec_with_the_connect_client(agent: Agent, tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("b")
    fs = filesystem_connect.FilesystemClientSync(agent.base)  # binary protobuf, gzip-compressed requests
    entry = fs.stat(fpb.StatRequest(path=str(tmp_path / "b.txt"))).entry
    assert (entry.name, entry.type, entry.size) == ("b.txt", fpb.FILE_TYPE_FILE, 1)
    with pytest.raises(ConnectError) as info:
        fs.stat(fpb.StatRequest(path=str(tmp_path / "none")))
    assert info.value.code.value == "not_found"
    with pytest.raises(ConnectError) as exists:
        fs.make_dir(fpb.MakeDirRequest(path=str(tmp_path)))
    assert exists.value.code.value == "already_exists"
    process = process_connect.ProcessClientSync(agent.base)
    events = list(process.start(ppb.StartRequest(process=ppb.ProcessConfig(cmd="echo", args=["proto"]))))
    assert events[0].event.HasField("start")
    assert events[1].event.data.stdout == b"proto\n"
    assert events[-1].event.end.exited
    with pytest.raises(ConnectError) as signal_error:
        process.send_signal(ppb.SendSignalRequest(process=ppb.ProcessSelector(pid=1), signal=ppb.SIGNAL_UNSPECIFIED))
    assert signal_error.value.code.value in ("not_found", "unimplemented")


def test_listing_edge_cases(agent: Agent, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("f")
    (tmp_path / bytes.fromhex("ff").decode("utf-8", "surrogateescape")).write_text("x")
    os.symlink(tmp_path / "d", tmp_path / "link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    fs = filesystem_connect.FilesystemClientSync(agent.base)
    entries = {e.name: e for e in fs.list_dir(fpb.ListDirRequest(path=str(tmp_path), depth=2)).entries}
    assert "\ufffd" in entries, "a name that is not UTF-8 is reported, lossily, instead of failing the listing"
    link = entries["link"]
    assert (link.type, link.symlink_target, link.permissions[0]) == (fpb.FILE_TYPE_DIRECTORY, str(tmp_path / "d"), "L")
    assert link.is_symlink, "the link itself is marked (the newest contract's field), its type is its target's"
    assert not entries["d"].is_symlink
    assert not entries["d"].HasField("symlink_target")
    assert str(tmp_path / "link" / "f") not in [e.path for e in entries.values()], "symlinks are not descended"
    dangling = entries["dangling"]
    assert (dangling.type, dangling.mode, dangling.is_symlink) == (fpb.FILE_TYPE_UNSPECIFIED, 0, True)
    assert [e.path for e in fs.list_dir(fpb.ListDirRequest(path=str(tmp_path / "link"))).entries] == [
        str(tmp_path / "link" / "f")
    ], "listing through a symlinked root keeps the requested path"


def test_background_process_outlives_its_stream_and_is_found_by_tag(agent: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "go"
    script = f"while [ ! -e {marker} ]; do sleep 0.05; done; echo after-reconnect"
    body = _envelope({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "tag": "bg-job", "stdin": False})
    headers = {"content-type": "application/connect+json", "connect-protocol-version": "1"}
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", f"{agent.base}/process.Process/Start", content=body, headers=headers) as response,
    ):
        first = next(response.iter_raw())
        pid = json.loads(first[5:])["event"]["start"]["pid"]
    # The stream is gone; the process is not.
    process = process_connect.ProcessClientSync(agent.base)
    listed = {p.pid: p.tag for p in process.list(ppb.ListRequest()).processes}
    assert listed.get(pid) == "bg-job"
    events = process.connect(ppb.ConnectRequest(process=ppb.ProcessSelector(tag="bg-job")))
    start = next(events)
    assert start.event.start.pid == pid
    marker.write_text("")
    rest = list(events)
    assert b"".join(e.event.data.stdout for e in rest) == b"after-reconnect\n"
    assert rest[-1].event.end.exited


def test_stream_input_and_close_stdin(agent: Agent) -> None:
    """StreamInput (client streaming; the SDKs never call it) and stdin misuse errors."""
    process = process_connect.ProcessClientSync(agent.base)
    events = process.start(ppb.StartRequest(process=ppb.ProcessConfig(cmd="cat"), stdin=True))
    pid = next(events).event.start.pid
    selector = ppb.ProcessSelector(pid=pid)
    inputs = [
        ppb.StreamInputRequest(start=ppb.StreamInputRequest.StartEvent(process=selector)),
        ppb.StreamInputRequest(data=ppb.StreamInputRequest.DataEvent(input=ppb.ProcessInput(stdin=b"streamed\n"))),
    ]
    process.stream_input(iter(inputs))
    process.close_stdin(ppb.CloseStdinRequest(process=selector))
    rest = list(events)
    assert b"".join(e.event.data.stdout for e in rest) == b"streamed\n"
    with pytest.raises(ConnectError) as closed:
        process.send_input(
            ppb.SendInputRequest(process=ppb.ProcessSelector(pid=pid), input=ppb.ProcessInput(stdin=b"x"))
        )
    assert closed.value.code.value == "not_found", "the process has ended and is gone"
    no_stdin = process.start(ppb.StartRequest(process=ppb.ProcessConfig(cmd="sleep", args=["2"]), stdin=False))
    other = next(no_stdin).event.start.pid
    with pytest.raises(ConnectError) as misuse:
        process.send_input(
            ppb.SendInputRequest(process=ppb.ProcessSelector(pid=other), input=ppb.ProcessInput(stdin=b"x"))
        )
    assert misuse.value.code.value == "internal"
    process.send_signal(ppb.SendSignalRequest(process=ppb.ProcessSelector(pid=other), signal=ppb.SIGNAL_SIGTERM))
    assert list(no_stdin)[-1].event.end.status == "signal: terminated"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_disk_is_507(agent: Agent, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        full = httpx.post(
            f"{agent.base}/files",
            params={"path": str(small / "big.bin")},
            content=b"x" * (3 << 20),
            headers={"content-type": "application/octet-stream"},
            timeout=30,
        )
        assert full.status_code == 507
        assert full.json()["message"] == "not enough disk space available"
    finally:
        subprocess.run(["umount", str(small)], check=True)
