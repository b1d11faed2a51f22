"""Property-based tests: file round trips and command output through the agent.

Hypothesis drives the real agent process with the Connect project's client (binary
protobuf) and plain HTTP, so each example costs a few milliseconds.
"""

from __future__ import annotations

import posixpath
import shlex
import uuid
from pathlib import Path

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.generated.filesystem import filesystem_connect
from contract.generated.filesystem import filesystem_pb2 as fpb
from contract.generated.process import process_connect
from contract.generated.process import process_pb2 as ppb

from .conftest import Agent

# Names a Linux filesystem accepts that survive as protobuf strings: no "/", no NUL,
# not "." or "..", valid UTF-8, at most 255 bytes.
NAMES = st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=40).filter(
    lambda n: n not in (".", "..") and len(n.encode()) <= 255
)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(parts=st.lists(NAMES, min_size=1, max_size=4), data=st.binary(max_size=70_000), gzip=st.booleans())
def test_file_round_trip(agent: Agent, tmp_path: Path, parts: list[str], data: bytes, gzip: bool) -> None:
    path = posixpath.join(str(tmp_path), uuid.uuid4().hex, *parts)  # examples must not collide
    up = httpx.post(
        f"{agent.base}/files", params={"path": path}, content=data, headers={"content-type": "application/octet-stream"}
    )
    assert up.status_code == 200, up.text
    assert up.json() == [{"name": parts[-1], "path": path, "type": "file"}]
    down = httpx.get(
        f"{agent.base}/files", params={"path": path}, headers={"accept-encoding": "gzip" if gzip else "identity"}
    )
    assert down.status_code == 200
    assert down.content == data
    entry = filesystem_connect.FilesystemClientSync(agent.base).stat(fpb.StatRequest(path=path)).entry
    assert (entry.name, entry.size, entry.path) == (parts[-1], len(data), path)


@SETTINGS
@given(stdout=st.binary(max_size=5000), stderr=st.binary(max_size=5000), code=st.integers(0, 255))
def test_command_output_and_exit_code(agent: Agent, tmp_path: Path, stdout: bytes, stderr: bytes, code: int) -> None:
    (tmp_path / "out").write_bytes(stdout)
    (tmp_path / "err").write_bytes(stderr)
    script = f"cat {shlex.quote(str(tmp_path / 'out'))}; cat {shlex.quote(str(tmp_path / 'err'))} >&2; exit {code}"
    client = process_connect.ProcessClientSync(agent.base)
    events = [
        r.event for r in client.start(ppb.StartRequest(process=ppb.ProcessConfig(cmd="/bin/sh", args=["-c", script])))
    ]
    assert events[0].HasField("start")
    assert events[-1].HasField("end")
    got_out = b"".join(e.data.stdout for e in events if e.HasField("data"))
    got_err = b"".join(e.data.stderr for e in events if e.HasField("data"))
    assert (got_out, got_err) == (stdout, stderr)
    end = events[-1].end
    assert (end.exit_code, end.exited, end.status) == (code, True, f"exit status {code}")
    assert end.HasField("error") == (code != 0)


@SETTINGS
@given(
    env=st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True),
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=50),
        max_size=5,
    )
)
def test_environment_reaches_the_process(agent: Agent, env: dict[str, str]) -> None:
    client = process_connect.ProcessClientSync(agent.base)
    request = ppb.StartRequest(process=ppb.ProcessConfig(cmd="/usr/bin/env", args=["-0"], envs=env))
    output = b"".join(r.event.data.stdout for r in client.start(request) if r.event.HasField("data"))
    seen = dict(item.split("=", 1) for item in output.decode().split("\x00") if item)
    for key, value in env.items():
        assert seen[key] == value
    for key in {"HOME", "USER", "LOGNAME", "PATH"} - set(env):
        assert seen[key], f"{key} is always set"
