"""The agent's bounds (``runtime.agent._limits``): over-limit input gets a clear error, never unbounded memory.

Wire tests use an agent process of their own; the bounds whose real size would make a slow test
(entry and event counts) are checked in-process with a smaller limit patched in.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from connectrpc.errors import ConnectError

from contract.protocol import FLAG_COMPRESSED, decode_envelopes, encode_envelope
from runtime.agent import _files, _filesystem, _filesystem_service
from runtime.agent._app import create_app
from runtime.agent._errors import AgentError, ErrorKind
from runtime.agent._limits import INFLATE_STEP, MAX_MESSAGE_BYTES, MAX_UPLOAD_PARTS, BoundedGzip, inflate
from runtime.agent._users import UserDatabase

from .conftest import Agent

JSON_HEADERS = {"content-type": "application/json", "connect-protocol-version": "1"}
STREAM_HEADERS = {"content-type": "application/connect+json", "connect-protocol-version": "1"}
TOO_LARGE = {"code": "resource_exhausted", "message": f"message is larger than configured max {MAX_MESSAGE_BYTES}"}


def _stream_end(response: httpx.Response) -> dict[str, Any]:
    frames = list(decode_envelopes(response.content))
    assert frames, response.content[:200]
    last: dict[str, Any] = json.loads(frames[-1].payload)
    return last


# -- Connect request messages -----------------------------------------------------------


def test_a_unary_message_over_the_cap_is_resource_exhausted(private_agent: Agent) -> None:
    body = b'{"path": "' + b"a" * (MAX_MESSAGE_BYTES + 1024) + b'"}'
    response = httpx.post(
        f"{private_agent.base}/filesystem.Filesystem/Stat", content=body, headers=JSON_HEADERS, timeout=30
    )
    assert response.status_code == 429, response.text[:200]
    assert response.json() == TOO_LARGE
    assert httpx.get(f"{private_agent.base}/health").status_code == 204


def test_a_gzip_bomb_is_refused_before_it_is_inflated(private_agent: Agent) -> None:
    """200 KiB of gzip that would inflate to 200 MiB: refused at the cap, in well under a second."""
    bomb = gzip.compress(b'{"path": "' + b"a" * (200 << 20) + b'"}', compresslevel=9)
    started = time.monotonic()
    response = httpx.post(
        f"{private_agent.base}/filesystem.Filesystem/Stat",
        content=bomb,
        headers={**JSON_HEADERS, "content-encoding": "gzip"},
        timeout=60,
    )
    assert response.status_code == 429, response.text[:200]
    assert response.json() == TOO_LARGE
    assert time.monotonic() - started < 5


def test_a_compressed_stream_message_over_the_cap_ends_the_stream(private_agent: Agent) -> None:
    message = json.dumps({"process": {"cmd": "/bin/true", "args": ["x" * (MAX_MESSAGE_BYTES + 10)]}}).encode()
    body = encode_envelope(gzip.compress(message), flags=FLAG_COMPRESSED)
    response = httpx.post(
        f"{private_agent.base}/process.Process/Start",
        content=body,
        headers={**STREAM_HEADERS, "connect-content-encoding": "gzip"},
        timeout=30,
    )
    assert response.status_code == 200
    assert _stream_end(response) == {"error": TOO_LARGE}


def test_a_client_stream_envelope_announcing_too_much_is_refused(private_agent: Agent) -> None:
    """StreamInput: an envelope header announcing 1 GiB is refused before its payload is waited for."""
    header = bytes([0]) + (1 << 30).to_bytes(4, "big")

    def body() -> Any:
        yield header
        yield b"{" * 1000  # a start of the payload; the rest never comes

    response = httpx.post(
        f"{private_agent.base}/process.Process/StreamInput", content=body(), headers=STREAM_HEADERS, timeout=30
    )
    assert response.status_code == 200
    assert _stream_end(response) == {"error": TOO_LARGE}


def test_bounded_gzip_round_trips_and_refuses_bombs() -> None:
    codec = BoundedGzip()
    assert codec.decompress(codec.compress(b"hello")) == b"hello"
    with pytest.raises(ConnectError, match="larger than configured max") as raised:
        codec.decompress(gzip.compress(b"\0" * (MAX_MESSAGE_BYTES + 1)))
    assert raised.value.code.value == "resource_exhausted"
    with pytest.raises(ConnectError, match="error decompressing message") as broken:
        codec.decompress(b"not gzip")
    assert broken.value.code.value == "invalid_argument"
    assert inflate(gzip.compress(b"x" * 100), 100) == b"x" * 100


# -- envd HTTP routes -------------------------------------------------------------------


def test_an_init_body_over_the_cap_is_413(private_agent: Agent) -> None:
    body = json.dumps({"envVars": {"BIG": "x" * (5 << 20)}})
    response = httpx.post(f"{private_agent.base}/init", content=body, timeout=30)
    assert response.status_code == 413, response.text[:200]
    assert "larger than" in response.text
    assert httpx.get(f"{private_agent.base}/envs").json().get("BIG") is None, "nothing was applied"


def test_an_upload_of_too_many_parts_is_413(private_agent: Agent, tmp_path: Path) -> None:
    part = b'--X\r\nContent-Disposition: form-data; name="other"\r\n\r\nv\r\n'
    body = part * (MAX_UPLOAD_PARTS + 1) + b"--X--\r\n"
    response = httpx.post(
        f"{private_agent.base}/files",
        params={"path": str(tmp_path / "f")},
        content=body,
        headers={"content-type": "multipart/form-data; boundary=X"},
        timeout=30,
    )
    assert response.status_code == 413, response.text[:200]
    assert response.json() == {
        "code": 413,
        "message": f"error parsing multipart form: more than {MAX_UPLOAD_PARTS} parts",
    }


def test_many_files_and_a_large_file_still_upload(private_agent: Agent, tmp_path: Path) -> None:
    """The bounds leave the clients' uploads alone: a multi-MiB gzip upload, a hundred files in one."""
    data = os.urandom(1 << 20) * 8
    raw = httpx.post(
        f"{private_agent.base}/files",
        params={"path": str(tmp_path / "big.bin")},
        content=gzip.compress(data, compresslevel=1),
        headers={"content-type": "application/octet-stream", "content-encoding": "gzip"},
        timeout=60,
    )
    assert raw.status_code == 200, raw.text
    assert (tmp_path / "big.bin").read_bytes() == data
    files = [("file", (str(tmp_path / f"m{i}.txt"), f"n{i}".encode())) for i in range(100)]
    multi = httpx.post(f"{private_agent.base}/files", files=files, timeout=60)
    assert multi.status_code == 200, multi.text
    assert len(multi.json()) == 100


class _GzipRequest:
    """What ``_files._body`` reads of a request: its headers and its body stream."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.headers = {"content-encoding": "gzip"}
        self._chunks = chunks

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def test_gzip_uploads_inflate_in_bounded_steps() -> None:
    """One 64 KiB chunk of a gzip bomb inflates to 64 MiB; the agent never holds more than a step of it."""
    compressed = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    chunks = [compressed[i : i + 65536] for i in range(0, len(compressed), 65536)]

    async def sizes() -> list[int]:
        return [len(out) async for out in _files._body(_GzipRequest(chunks))]  # type: ignore[arg-type]

    produced = asyncio.run(sizes())
    assert sum(produced) == 64 << 20
    assert max(produced) <= INFLATE_STEP


# -- ListDir ----------------------------------------------------------------------------


def test_list_dir_of_a_tree_deeper_than_the_python_stack(private_agent: Agent, tmp_path: Path) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    try:  # relative to a directory fd: the full path would pass PATH_MAX
        current = fd
        for _ in range(1500):
            os.mkdir("d", dir_fd=current)
            inner = os.open("d", os.O_RDONLY, dir_fd=current)
            if current != fd:
                os.close(current)
            current = inner
        os.close(current)
    finally:
        os.close(fd)
    try:
        response = httpx.post(
            f"{private_agent.base}/filesystem.Filesystem/ListDir",
            json={"path": str(root), "depth": 1_000_000},
            headers=JSON_HEADERS,
            timeout=60,
        )
    finally:  # pytest's own clean-up recurses, and this tree is deeper than Python's stack
        subprocess.run(["rm", "-rf", str(root)], check=True)
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["entries"]) == 1500


def test_list_dir_refuses_more_entries_than_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("")
    monkeypatch.setattr(_filesystem, "MAX_LIST_ENTRIES", 5)
    assert len(_filesystem.list_dir(str(tmp_path), str(tmp_path), 1, UserDatabase())) == 3
    with pytest.raises(AgentError) as raised:
        _filesystem.list_dir(str(tmp_path), str(tmp_path), 2, UserDatabase())
    assert raised.value.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert "more than 5 entries" in raised.value.message


# -- polling watchers -------------------------------------------------------------------


def test_a_polling_watcher_nobody_polls_overflows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap of unpolled events the watcher fails as an inotify overflow: every poll is that error."""
    monkeypatch.setattr(_filesystem_service, "MAX_POLLED_EVENTS", 50)

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=create_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:

            async def call(method: str, body: dict[str, Any]) -> httpx.Response:
                return await client.post(f"/filesystem.Filesystem/{method}", json=body, headers=JSON_HEADERS)

            created = await call("CreateWatcher", {"path": str(tmp_path)})
            watcher_id = created.json()["watcherId"]
            for i in range(20):
                (tmp_path / f"early{i}").write_text("")
            await asyncio.sleep(0.2)
            few = await call("GetWatcherEvents", {"watcherId": watcher_id})
            assert len(few.json()["events"]) >= 20, "below the cap, events are delivered"
            for i in range(100):
                (tmp_path / f"f{i}").write_text("")
                if i % 10 == 0:
                    await asyncio.sleep(0.01)  # let the watcher collect, so the kernel queue never overflows
            await asyncio.sleep(0.2)
            first = await call("GetWatcherEvents", {"watcherId": watcher_id})
            again = await call("GetWatcherEvents", {"watcherId": watcher_id})
            await call("RemoveWatcher", {"watcherId": watcher_id})
            return few, first, again

    _, first, again = asyncio.run(asyncio.wait_for(scenario(), 30))
    for response in (first, again):
        assert response.status_code == 500, response.text
        assert response.json() == {"code": "internal", "message": "watcher error: event queue overflow"}


def test_inflate_keeps_gzip_errors() -> None:
    with pytest.raises(zlib.error):
        inflate(b"not gzip at all", 100)
    with pytest.raises(EOFError):
        inflate(gzip.compress(b"abc")[:-10], 100)
