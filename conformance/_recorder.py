"""Wire recorder: what the official clients send, recorded against a fixture server, checked for drift.

A deterministic, stateful fixture server (plain HTTP on 127.0.0.1, an ephemeral port) answers like
an E2B endpoint well enough for one fixed script per client flavour (``recorder/py_sync.py``,
``py_async.py``, ``js.cjs``) to complete. The clients reach it through PROTOCOL.md §7 "Profile A"
(``E2B_API_URL`` and ``E2B_SANDBOX_URL`` both at the server, so envd requests carry
``E2b-Sandbox-Id``/``E2b-Sandbox-Port``). Every request is recorded as one canonical JSON line::

    {"method", "path", "query": {name: [values]}, "headers": {name: value}, "body": ..., "status"}

- ``path`` is the request target as sent (percent-encoding kept); ``query`` is parsed, keys sorted.
- ``headers``: every header the client sent (names lower-cased), so a new header is drift too.
  Values are kept exactly (the user agent carries the pinned version), except secrets (``<key>``,
  ``<token>``, ``<credentials>``), values that depend on the machine or the run (``host``,
  ``content-length``, ``lang_version``, ``system``) and multipart boundaries.
- ``body``: ``null`` when empty; ``{"json": ...}`` re-serialized with sorted keys; ``{"connect": [{"flags",
  "message"}]}`` for Connect envelopes (the JSON message parsed, so Python's pretty-printed and
  JS's compact messages compare equal); ``{"multipart": [{"name", "filename", "content_type",
  "length", "sha256"}]}`` (boundaries are random); anything else ``{"length", "sha256"}``.
  ISO-8601 timestamps in JSON bodies and query values become ``<timestamp>``.
- ``status`` is what the fixture answered, so a request it does not know (501) stands out.

``write_fixtures`` stores the lines as ``fixtures/wire/<flavour>-<client version>.jsonl``;
``check_drift`` records again and returns a unified diff per flavour that changed.
Run ``python -m conformance._recorder write|check`` to do either from a shell.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import gzip
import hashlib
import json
import os
import posixpath
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from email.message import Message as EmailMessage
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import uvicorn
from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from contract.generated.filesystem import filesystem_pb2
from contract.generated.process import process_pb2

from ._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients

__all__ = [
    "API_KEY",
    "FIXTURES_DIR",
    "FLAVOURS",
    "FixtureServer",
    "RecorderError",
    "Recording",
    "canonical_body",
    "canonical_headers",
    "canonical_request",
    "check_drift",
    "decode_envelopes",
    "diff_lines",
    "dumps_line",
    "encode_envelope",
    "fixture_path",
    "main",
    "record",
    "run_recording",
    "write_fixtures",
]

FLAVOURS = ("py-sync", "py-async", "js")
SCRIPTS_DIR = Path(__file__).resolve().parent / "recorder"
FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
_SCRIPTS = {"py-sync": "py_sync.py", "py-async": "py_async.py", "js": "js.cjs"}

# Fixed values the fixture answers with: the same in every run, so the clients send the same.
API_KEY = "e2b_" + "0123456789abcdef" * 2 + "01234567"  # the clients' format check: e2b_ + lower hex
ENVD_TOKEN = "fixture-envd-token"  # noqa: S105 - a fixed fixture value, not a secret
TRAFFIC_TOKEN = "fixture-traffic-token"  # noqa: S105
CLIENT_ID = "fixture-client"
ENVD_VERSION = "0.6.4"  # what the agent claims: the newest envd feature gate of the pinned clients
STARTED_AT = "2026-01-01T00:00:00.000Z"
END_AT = "2026-01-01T00:05:00.000Z"
_MODIFIED = "2026-01-01T00:00:00Z"  # of every file and folder the fixture reports
FILE_BYTES = b"fixture file\n"
PID = 4242
SANDBOX_HOME = "/home/user"
NOT_RECORDED = "not recorded"  # the message of the 501 for anything the scripts do not use

_REDACTED = {
    "x-api-key": "<key>",
    "x-access-token": "<token>",
    "e2b-traffic-access-token": "<token>",
    "x-supabase-token": "<token>",
}
# Values that differ between machines or runs while the request means the same.
_VOLATILE = {"host": "<host>", "content-length": "<length>", "lang_version": "<runtime version>", "system": "<system>"}
_BOUNDARY = re.compile(r"(boundary=)(\"[^\"]*\"|[^;\s]+)", re.IGNORECASE)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")
_END_STREAM = 0x02
_COMPRESSED = 0x01


class RecorderError(Exception):
    """A recording could not be made: the script failed, or it ran a client of another version."""


# --- canonicalization (pure) ---


def dumps_line(line: Mapping[str, Any]) -> str:
    """One canonical JSON line: sorted keys, no insignificant whitespace, UTF-8 kept readable."""
    return json.dumps(line, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _normalize(value: Any) -> Any:
    if isinstance(value, str):
        return "<timestamp>" if _TIMESTAMP.fullmatch(value) else value
    if isinstance(value, list):
        return [_normalize(item) for item in value]
    if isinstance(value, dict):
        return {key: _normalize(item) for key, item in value.items()}
    return value


def _digest(data: bytes) -> dict[str, Any]:
    return {"length": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _json(data: bytes) -> Any:
    """Parsed and normalized JSON, or the digest of bytes that are not JSON (itself drift worth seeing)."""
    try:
        return _normalize(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"not_json": _digest(data)}


def decode_envelopes(data: bytes) -> list[dict[str, Any]]:
    """Connect envelopes (1 flag byte, 4-byte big-endian length, message) with their JSON messages parsed."""
    frames: list[dict[str, Any]] = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < 5:
            frames.append({"truncated": _digest(data[offset:])})
            break
        flags = data[offset]
        length = int.from_bytes(data[offset + 1 : offset + 5], "big")
        message = data[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if len(message) < length:
            frames.append({"flags": flags, "truncated": _digest(message)})
            break
        if flags & _COMPRESSED:
            try:
                message = gzip.decompress(message)
            except (OSError, EOFError):
                frames.append({"flags": flags, "message": {"not_gzip": _digest(message)}})
                continue
        frames.append({"flags": flags, "message": _json(message)})
    return frames


def encode_envelope(message: bytes, flags: int = 0) -> bytes:
    """One Connect envelope around ``message``."""
    return bytes([flags]) + len(message).to_bytes(4, "big") + message


def _boundary(content_type: str) -> bytes | None:
    match = _BOUNDARY.search(content_type)
    return match[2].strip('"').encode("latin-1") if match else None


@dataclasses.dataclass(frozen=True)
class _Part:
    name: str | None
    filename: str | None
    content_type: str | None
    content: bytes


def _disposition(headers: EmailMessage, name: str) -> str | None:
    value = headers.get_param(name, header="content-disposition")
    return None if value is None else collapse_rfc2231_value(value)


def _multipart_parts(data: bytes, boundary: bytes) -> list[_Part]:
    """The parts of a multipart body: Content-Disposition name and filename, Content-Type, content."""
    parts = []
    delimiter = b"--" + boundary
    # The first chunk is the preamble, the last starts with the closing "--".
    for chunk in data.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, content = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n").partition(b"\r\n\r\n")
        headers = BytesHeaderParser().parsebytes(head + b"\r\n\r\n")
        name, filename = _disposition(headers, "name"), _disposition(headers, "filename")
        parts.append(_Part(name, filename, headers.get("content-type"), content))
    return parts


def canonical_body(content_type: str, body: bytes, content_encoding: str = "") -> dict[str, Any] | None:
    """A body reduced to what it means (see the module docstring); ``None`` for an empty body."""
    if content_encoding.strip().lower() == "gzip":
        try:
            body = gzip.decompress(body)  # a gzip header carries a time stamp: compare what it holds
        except (OSError, EOFError):
            return {"not_gzip": _digest(body)}
    if not body:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media.startswith("application/connect+"):
        return {"connect": decode_envelopes(body)}
    if media == "application/json" or media.endswith("+json"):
        return {"json": _json(body)}
    boundary = _boundary(content_type)
    if media.startswith("multipart/") and boundary:
        return {
            "multipart": [
                {
                    "name": part.name,
                    "filename": part.filename,
                    "content_type": part.content_type,
                    **_digest(part.content),
                }
                for part in _multipart_parts(body, boundary)
            ]
        }
    return _digest(body)


def canonical_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Every header by lower-case name; secrets, volatile values and boundaries replaced."""
    out: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.lower()
        if name in _REDACTED:
            value = _REDACTED[name]
        elif name in _VOLATILE:
            value = _VOLATILE[name]
        elif name == "authorization":
            # The scheme is a wire fact; the credentials are not for a fixture file.
            value = raw_value.split(" ", 1)[0] + " <credentials>"
        elif name == "content-type":
            value = _BOUNDARY.sub(r"\1<boundary>", raw_value)
        else:
            value = raw_value
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def canonical_request(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    status: int | None = None,
) -> dict[str, Any]:
    """The canonical line of one request; ``target`` is the path plus ``?query`` exactly as sent."""
    path, _, query_string = target.partition("?")
    query: dict[str, list[Any]] = {}
    for key, value in parse_qsl(query_string, keep_blank_values=True):
        query.setdefault(key, []).append(_normalize(value))
    lowered = {name.lower(): value for name, value in headers}
    line: dict[str, Any] = {
        "method": method.upper(),
        "path": path,
        "query": dict(sorted(query.items())),
        "headers": canonical_headers(headers),
        "body": canonical_body(lowered.get("content-type", ""), body, lowered.get("content-encoding", "")),
    }
    if status is not None:
        line["status"] = status
    return line


# --- the fixture server ---


@dataclasses.dataclass
class _Sandbox:
    sandbox_id: str
    template_id: str
    metadata: dict[str, str]
    state: str = "running"  # running | paused | killed
    dirs: set[str] = dataclasses.field(default_factory=lambda: {"/", "/home", SANDBOX_HOME})
    files: set[str] = dataclasses.field(default_factory=set)


def _error(status: int, message: str) -> JSONResponse:
    # The control plane's error body; JS tells 404 from 409 by its "code" (PROTOCOL.md §8.1).
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _connect_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def _message_json(message: Message) -> bytes:
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()


def _unary(message: Message) -> Response:
    return Response(_message_json(message), media_type="application/json")


def _entry(path: str, is_dir: bool) -> filesystem_pb2.EntryInfo:
    entry = filesystem_pb2.EntryInfo(
        name=posixpath.basename(path) or "/",
        type=filesystem_pb2.FILE_TYPE_DIRECTORY if is_dir else filesystem_pb2.FILE_TYPE_FILE,
        path=path,
        size=4096 if is_dir else len(FILE_BYTES),
        mode=0o755 if is_dir else 0o644,
        permissions="drwxr-xr-x" if is_dir else "-rw-r--r--",
        owner="user",
        group="user",
    )
    entry.modified_time.FromJsonString(_MODIFIED)
    return entry


class _Fixture:
    """The fixture's state and answers; requests arrive one at a time from one script."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, _Sandbox] = {}
        self.snapshots: dict[str, tuple[str, list[str]]] = {}  # id → (source sandbox, names)
        self.lines: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    # control plane

    def _sandbox_json(self, sbx: _Sandbox) -> dict[str, Any]:
        return {
            "sandboxID": sbx.sandbox_id,
            "templateID": sbx.template_id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": ENVD_TOKEN,
            "trafficAccessToken": TRAFFIC_TOKEN,
        }

    def _listed_json(self, sbx: _Sandbox) -> dict[str, Any]:
        return {
            "sandboxID": sbx.sandbox_id,
            "templateID": sbx.template_id,
            "clientID": CLIENT_ID,
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "envdVersion": ENVD_VERSION,
            "startedAt": STARTED_AT,
            "endAt": END_AT,
            "state": sbx.state,
            "metadata": sbx.metadata,
            "volumeMounts": [],
        }

    def _live(self, sandbox_id: str) -> _Sandbox | None:
        sbx = self.sandboxes.get(sandbox_id)
        return sbx if sbx is not None and sbx.state != "killed" else None

    @staticmethod
    def _page(items: list[Any], query: Mapping[str, str]) -> tuple[list[Any], dict[str, str]]:
        # The token is the offset of the next page. A full page always carries one (more may
        # follow), so a one-sandbox listing with limit=1 still exercises the nextToken parameter.
        offset = int(query.get("nextToken", "fixture-next-0").rsplit("-", 1)[-1])
        limit = int(query.get("limit", "100"))
        page = items[offset : offset + limit]
        headers = {"x-next-token": f"fixture-next-{offset + limit}"} if len(page) == limit else {}
        return page, headers

    def control_plane(self, method: str, parts: list[str], query: Mapping[str, str], body: Any) -> Response | None:
        """The answer to a control-plane request, or ``None`` when it is not one the scripts use."""
        match method, parts:
            case "POST", ["sandboxes"]:
                sandbox_id = f"fixture-sandbox-{len(self.sandboxes) + 1}"
                fields = body if isinstance(body, dict) else {}
                metadata = {str(k): str(v) for k, v in (fields.get("metadata") or {}).items()}
                self.sandboxes[sandbox_id] = _Sandbox(sandbox_id, str(fields.get("templateID", "base")), metadata)
                return JSONResponse(self._sandbox_json(self.sandboxes[sandbox_id]), status_code=201)
            case "GET", ["v2", "sandboxes"]:
                states = query.get("state", "running,paused").split(",")
                wanted = dict(parse_qsl(query.get("metadata", "")))
                items = [
                    self._listed_json(s)
                    for s in self.sandboxes.values()
                    if s.state in states and wanted.items() <= s.metadata.items()
                ]
                page, headers = self._page(items, query)
                return JSONResponse(page, headers=headers)
            case "GET", ["snapshots"]:
                source = query.get("sandboxID")
                snaps = [
                    {"snapshotID": sid, "names": names}
                    for sid, (origin, names) in self.snapshots.items()
                    if source is None or origin == source
                ]
                page, headers = self._page(snaps, query)
                return JSONResponse(page, headers=headers)
            case "DELETE", ["templates", template_id]:
                if self.snapshots.pop(template_id, None) is None:
                    return _error(404, f"template '{template_id}' not found")
                return Response(status_code=204)
            case (_, ["sandboxes", sandbox_id, *_]) if self._live(sandbox_id) is None:
                return _error(404, f"sandbox '{sandbox_id}' not found")
            case "GET", ["sandboxes", sandbox_id]:
                sbx = self.sandboxes[sandbox_id]
                detail = self._listed_json(sbx) | {"envdAccessToken": ENVD_TOKEN, "allowInternetAccess": True}
                del detail["volumeMounts"]
                return JSONResponse(detail)
            case "DELETE", ["sandboxes", sandbox_id]:
                self.sandboxes[sandbox_id].state = "killed"
                return Response(status_code=204)
            case "POST", ["sandboxes", sandbox_id, "pause"]:
                sbx = self.sandboxes[sandbox_id]
                if sbx.state == "paused":
                    return _error(409, f"sandbox '{sandbox_id}' is already paused")
                sbx.state = "paused"
                return Response(status_code=204)
            case "POST", ["sandboxes", sandbox_id, "connect"]:
                sbx = self.sandboxes[sandbox_id]
                resumed = sbx.state == "paused"
                sbx.state = "running"
                return JSONResponse(self._sandbox_json(sbx), status_code=201 if resumed else 200)
            case "POST", ["sandboxes", sandbox_id, "timeout"]:
                return Response(status_code=204)
            case "GET", ["sandboxes", sandbox_id, "metrics"]:
                return JSONResponse([])
            case "POST", ["sandboxes", sandbox_id, "snapshots"]:
                snapshot_id = f"fixture-snapshot-{len(self.snapshots) + 1}"
                names = [f"fixture/{snapshot_id}:default"]
                self.snapshots[snapshot_id] = (sandbox_id, names)
                return JSONResponse({"snapshotID": snapshot_id, "names": names}, status_code=201)
        return None

    # envd

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(SANDBOX_HOME, path))

    def envd(self, request: Request, sbx: _Sandbox, body: bytes) -> Response | None:
        """The answer to an envd request (HTTP or Connect), or ``None`` when it is not one the scripts use."""
        path, method = request.url.path, request.method
        if (method, path) == ("GET", "/health"):
            return Response(status_code=204)
        if (method, path) == ("GET", "/files"):
            return Response(FILE_BYTES, media_type="application/octet-stream")
        if (method, path) == ("POST", "/files"):
            return self._upload(request, sbx, body)
        if method != "POST":
            return None
        procedures: dict[str, tuple[type[Message], Callable[[Any], Response]]] = {
            "/process.Process/Start": (process_pb2.StartRequest, self._start),
            "/process.Process/List": (process_pb2.ListRequest, lambda _: _unary(process_pb2.ListResponse())),
            "/filesystem.Filesystem/Stat": (filesystem_pb2.StatRequest, lambda r: self._stat(sbx, r)),
            "/filesystem.Filesystem/MakeDir": (filesystem_pb2.MakeDirRequest, lambda r: self._make_dir(sbx, r)),
            "/filesystem.Filesystem/ListDir": (filesystem_pb2.ListDirRequest, lambda r: self._list_dir(sbx, r)),
        }
        if path not in procedures:
            return None
        message_type, answer = procedures[path]
        streaming = request.headers.get("content-type", "").startswith("application/connect+json")
        payload = body
        if streaming:
            frames = decode_envelopes(body)
            if len(frames) != 1 or "message" not in frames[0]:
                return _connect_error(400, "invalid_argument", "expected one request envelope")
            payload = json.dumps(frames[0]["message"]).encode()
        try:
            message = json_format.Parse(payload, message_type())
        except json_format.ParseError as exc:
            return _connect_error(400, "invalid_argument", f"undecodable {message_type.__name__}: {exc}")
        return answer(message)

    def _upload(self, request: Request, sbx: _Sandbox, body: bytes) -> Response:
        content_type = request.headers.get("content-type", "")
        query_path = request.query_params.get("path")
        boundary = _boundary(content_type)
        if content_type.startswith("multipart/") and boundary:
            parts = [part for part in _multipart_parts(body, boundary) if part.name == "file"]
            # The path parameter names the file only when exactly one is sent (PROTOCOL.md §7).
            targets = [query_path] if query_path and len(parts) == 1 else [part.filename or "" for part in parts]
        else:
            targets = [query_path or ""]
        written = []
        for target in targets:
            path = self._path(target)
            sbx.files.add(path)
            written.append({"name": posixpath.basename(path), "type": "file", "path": path})
        return JSONResponse(written)

    def _start(self, request: process_pb2.StartRequest) -> Response:
        events = [
            process_pb2.ProcessEvent(start=process_pb2.ProcessEvent.StartEvent(pid=PID)),
            process_pb2.ProcessEvent(data=process_pb2.ProcessEvent.DataEvent(stdout=b"fixture\n")),
            process_pb2.ProcessEvent(end=process_pb2.ProcessEvent.EndEvent(exit_code=0, exited=True, status="exit 0")),
        ]
        frames = b"".join(encode_envelope(_message_json(process_pb2.StartResponse(event=e))) for e in events)
        frames += encode_envelope(b"{}", _END_STREAM)
        return Response(frames, media_type="application/connect+json")

    def _stat(self, sbx: _Sandbox, request: filesystem_pb2.StatRequest) -> Response:
        path = self._path(request.path)
        if path not in sbx.dirs and path not in sbx.files:
            return _connect_error(404, "not_found", f"no such file or directory: {path}")
        return _unary(filesystem_pb2.StatResponse(entry=_entry(path, path in sbx.dirs)))

    def _make_dir(self, sbx: _Sandbox, request: filesystem_pb2.MakeDirRequest) -> Response:
        path = self._path(request.path)
        if path in sbx.dirs or path in sbx.files:
            return _connect_error(409, "already_exists", f"already exists: {path}")
        sbx.dirs.add(path)
        return _unary(filesystem_pb2.MakeDirResponse(entry=_entry(path, True)))

    def _list_dir(self, sbx: _Sandbox, request: filesystem_pb2.ListDirRequest) -> Response:
        path = self._path(request.path)
        if path not in sbx.dirs:
            return _connect_error(404, "not_found", f"no such directory: {path}")
        children = sorted(p for p in sbx.dirs | sbx.files if p != path and posixpath.dirname(p) == path)
        return _unary(filesystem_pb2.ListDirResponse(entries=[_entry(p, p in sbx.dirs) for p in children]))

    # dispatch

    def answer(self, request: Request, body: bytes) -> Response:
        """Route one request: envd when it names a sandbox by header (Profile A), else the control plane."""
        sandbox_id = request.headers.get("e2b-sandbox-id")
        if sandbox_id is not None:
            sbx = self._live(sandbox_id)
            if sbx is None:
                return _error(502, f"sandbox '{sandbox_id}' is not running")
            if request.headers.get("x-access-token") != ENVD_TOKEN:
                return _error(401, "missing or wrong access token")
            return self.envd(request, sbx, body) or _error(501, NOT_RECORDED)
        if request.headers.get("x-api-key") != API_KEY:
            return _error(401, "missing or wrong API key")
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError):
                return _error(400, "the body is not JSON")
        query = dict(request.query_params)
        parts = [p for p in request.url.path.split("/") if p]
        return self.control_plane(request.method, parts, query, parsed) or _error(501, NOT_RECORDED)

    async def endpoint(self, request: Request) -> Response:
        body = await request.body()
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        target = raw_path.decode("latin-1")
        if request.scope.get("query_string"):
            target += "?" + request.scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        with self.lock:
            # Recorded on arrival, in arrival order, before the answer can depend on anything.
            line = canonical_request(request.method, target, headers, body)
            self.lines.append(line)
            response = self.answer(request, body)
            line["status"] = response.status_code
        return response


_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class FixtureServer:
    """The fixture server on 127.0.0.1 (an ephemeral port) in a background thread; a context manager."""

    def __init__(self) -> None:
        self._fixture = _Fixture()
        app = Starlette(routes=[Route("/{path:path}", self._fixture.endpoint, methods=_METHODS)])
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            http="h11",
            ws="none",
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=2,
            # Never close a client's idle connection mid-script: a retried request would be recorded twice.
            timeout_keep_alive=600,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="wire-fixture-server", daemon=True)
        self._error: BaseException | None = None
        self.port = 0

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve())
        except BaseException as exc:  # noqa: BLE001 - reported by start(), which waits for this thread
            self._error = exc

    def start(self) -> None:
        """Serve until ``stop``; returns once the port is listening."""
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RecorderError(f"the fixture server did not start: {self._error!r}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> FixtureServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_env(self) -> dict[str, str]:
        """The clients' environment for Profile A: both base URLs at this server, a well-formed key."""
        return {"E2B_API_KEY": API_KEY, "E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url}

    def lines(self) -> list[dict[str, Any]]:
        """The canonical lines recorded so far, in arrival order (copies)."""
        with self._fixture.lock:
            return json.loads(json.dumps(self._fixture.lines))  # type: ignore[no-any-return]


# --- running the scripts ---


@dataclasses.dataclass(frozen=True)
class Recording:
    """One script run: the canonical request lines, what the script observed, and how long it took."""

    flavour: str
    version: str
    lines: list[dict[str, Any]]
    observed: dict[str, Any]
    seconds: float


def _check_flavour(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}; expected one of {FLAVOURS}")


def fixture_path(flavour: str, version: str, directory: Path = FIXTURES_DIR) -> Path:
    """``<directory>/wire/<flavour>-<client version>.jsonl``."""
    _check_flavour(flavour)
    if not re.fullmatch(r"\d[0-9A-Za-z.+-]*", version):
        raise ValueError(f"not a version: {version!r}")  # it becomes part of a file name
    return directory / "wire" / f"{flavour}-{version}.jsonl"


def _command(flavour: str, clients: PythonClients | NodeClients) -> tuple[list[str], dict[str, str]]:
    _check_flavour(flavour)
    script = SCRIPTS_DIR / _SCRIPTS[flavour]
    if flavour == "js":
        if not isinstance(clients, NodeClients):
            raise TypeError("the js flavour runs with NodeClients")
        return ["node", str(script)], {"NODE_PATH": str(clients.root / "node_modules")}
    if not isinstance(clients, PythonClients):
        raise TypeError(f"the {flavour} flavour runs with PythonClients")
    return [str(clients.python), "-I", str(script)], {}


def run_recording(flavour: str, clients: PythonClients | NodeClients, *, timeout: float = 120) -> Recording:
    """Run the flavour's script against a fresh fixture server; the lines it sent and what it saw."""
    version = clients.version
    cmd, extra = _command(flavour, clients)
    # Only the fixture's settings reach the client: nothing from this shell's E2B_*/PYTHON*/NODE_*.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON", "NODE_"))}
    started = time.monotonic()
    with FixtureServer() as server:
        env |= server.client_env() | extra
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RecorderError(f"{flavour}: the script did not finish within {timeout} s") from exc
        lines = server.lines()
    seconds = time.monotonic() - started
    outputs = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not outputs:
        tail = "\n".join(dumps_line(line) for line in lines[-3:])
        raise RecorderError(
            f"{flavour}: the script failed (exit {proc.returncode}) after {len(lines)} requests\n"
            f"last requests:\n{tail}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
    observed: dict[str, Any] = json.loads(outputs[-1])
    if observed.get("client_version") != version:
        raise RecorderError(f"{flavour}: the script ran e2b {observed.get('client_version')}, not {version}")
    return Recording(flavour, version, lines, observed, seconds)


def record(flavour: str, clients: PythonClients | NodeClients, *, timeout: float = 120) -> list[dict[str, Any]]:
    """The canonical request lines of one run of the flavour's script against a fresh fixture server."""
    return run_recording(flavour, clients, timeout=timeout).lines


def _clients_for(flavour: str, python: PythonClients | None, node: NodeClients | None) -> PythonClients | NodeClients:
    if flavour == "js":
        return node if node is not None else ensure_node_clients()
    return python if python is not None else ensure_python_clients()


def _describe(line: str) -> str:
    try:
        parsed = json.loads(line)
        return f"{parsed['method']} {parsed['path']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        return line[:80]


def diff_lines(flavour: str, committed: Sequence[str], recorded: Sequence[str], *, where: str = "") -> str:
    """A readable report of how ``recorded`` differs from ``committed``; empty when they are equal."""
    committed, recorded = list(committed), list(recorded)
    if committed == recorded:
        return ""
    index = next(
        (i for i, (a, b) in enumerate(zip(committed, recorded, strict=False)) if a != b),
        min(len(committed), len(recorded)),
    )
    first = (
        f"request #{index + 1}: committed {_describe(committed[index]) if index < len(committed) else '(none)'}, "
        f"recorded {_describe(recorded[index]) if index < len(recorded) else '(none)'}"
    )
    label = where or flavour
    diff = difflib.unified_diff(committed, recorded, f"{label} (committed)", f"{label} (recorded)", lineterm="")
    return (
        f"wire drift in {flavour}: {len(committed)} committed requests, {len(recorded)} recorded; "
        f"first difference at {first}\n" + "\n".join(diff) + "\n"
    )


def _record_twice(flavour: str, clients: PythonClients | NodeClients) -> list[str]:
    first = [dumps_line(line) for line in record(flavour, clients)]
    second = [dumps_line(line) for line in record(flavour, clients)]
    if first != second:
        raise RecorderError("the recording is not deterministic:\n" + diff_lines(flavour, first, second))
    return first


def write_fixtures(
    directory: Path = FIXTURES_DIR,
    flavours: Iterable[str] = FLAVOURS,
    *,
    python: PythonClients | None = None,
    node: NodeClients | None = None,
) -> list[Path]:
    """Record each flavour twice and write ``wire/<flavour>-<version>.jsonl``; refuses a non-deterministic run."""
    written = []
    for flavour in flavours:
        clients = _clients_for(flavour, python, node)
        lines = _record_twice(flavour, clients)
        path = fixture_path(flavour, clients.version, directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        written.append(path)
    return written


def check_drift(
    directory: Path = FIXTURES_DIR,
    flavours: Iterable[str] = FLAVOURS,
    *,
    python: PythonClients | None = None,
    node: NodeClients | None = None,
) -> str:
    """Record each flavour again and compare with its committed file: a report per drifted flavour, or ``""``.

    ``python``/``node`` choose the client environments (default: the pinned ones); each is compared
    with the file of its own version.
    """
    reports = []
    for flavour in flavours:
        clients = _clients_for(flavour, python, node)
        path = fixture_path(flavour, clients.version, directory)
        recorded = [dumps_line(line) for line in record(flavour, clients)]
        label = f"{flavour} (e2b {clients.version})"
        try:
            committed = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            reports.append(f"wire drift in {label}: no committed recording at {path}\n")
            continue
        reports.append(diff_lines(label, committed, recorded, where=path.name))
    return "".join(reports)


def main(argv: Sequence[str] | None = None) -> int:
    """``write`` the fixtures or ``check`` them for drift (exit 1 with the diff on drift)."""
    parser = argparse.ArgumentParser(prog="python -m conformance._recorder", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("--directory", type=Path, default=FIXTURES_DIR)
    parser.add_argument("--flavour", action="append", choices=FLAVOURS, help="default: all")
    parser.add_argument("--python-version", help="e2b version of a committed Python lock (default: the pin)")
    parser.add_argument("--node-version", help="e2b version of a committed JS lock (default: the pin)")
    args = parser.parse_args(argv)
    flavours = args.flavour or FLAVOURS
    python = ensure_python_clients(args.python_version) if any(f != "js" for f in flavours) else None
    node = ensure_node_clients(args.node_version) if "js" in flavours else None
    if args.action == "write":
        for path in write_fixtures(args.directory, flavours, python=python, node=node):
            print(path)
        return 0
    report = check_drift(args.directory, flavours, python=python, node=node)
    sys.stdout.write(report or "no wire drift\n")
    return 1 if report else 0


if __name__ == "__main__":
    raise SystemExit(main())
