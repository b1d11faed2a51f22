"""The recorder's fixture server: a deterministic, stateful stand-in for an E2B endpoint.

It answers the control-plane and envd requests of the recorder scripts with fixed values (ids,
tokens, timestamps), so every run makes the clients send the same requests, and records each
request in canonical form (``_canonical``). Anything the scripts do not use gets 501 and is
still recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import posixpath
import threading
import time
from collections.abc import Callable, Mapping
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
from contract.protocol import (
    ACCESS_TOKEN_HEADER,
    API_KEY_HEADER,
    CONNECT_JSON,
    CONNECT_STREAM_JSON,
    NEXT_TOKEN_HEADER,
    SANDBOX_ID_HEADER,
)

from ._canonical import END_STREAM, boundary_of, canonical_request, decode_envelopes, encode_envelope, multipart_parts

# Fixed values the fixture answers with: the same in every run, so the clients send the same.
__all__ = ["API_KEY", "FixtureServer", "RecorderError"]

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

# Values that differ between machines or runs while the request means the same.


class RecorderError(Exception):
    """A recording could not be made: the script failed, or it ran a client of another version."""


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
    # The control plane's error body; JS tells 404 from 409 by its "code" (docs/PROTOCOL-NOTES.md).
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _connect_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def _message_json(message: Message) -> bytes:
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()


def _unary(message: Message) -> Response:
    return Response(_message_json(message), media_type=CONNECT_JSON)


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
        headers = {NEXT_TOKEN_HEADER: f"fixture-next-{offset + limit}"} if len(page) == limit else {}
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
        streaming = request.headers.get("content-type", "").startswith(CONNECT_STREAM_JSON)
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
        boundary = boundary_of(content_type)
        if content_type.startswith("multipart/") and boundary:
            parts = [part for part in multipart_parts(body, boundary) if part.name == "file"]
            # The path parameter names the file only when exactly one is sent
            # (docs/PROTOCOL-NOTES.md, envd HTTP routes).
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
        frames += encode_envelope(b"{}", END_STREAM)
        return Response(frames, media_type=CONNECT_STREAM_JSON)

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
        sandbox_id = request.headers.get(SANDBOX_ID_HEADER)
        if sandbox_id is not None:
            sbx = self._live(sandbox_id)
            if sbx is None:
                return _error(502, f"sandbox '{sandbox_id}' is not running")
            if request.headers.get(ACCESS_TOKEN_HEADER) != ENVD_TOKEN:
                return _error(401, "missing or wrong access token")
            return self.envd(request, sbx, body) or _error(501, NOT_RECORDED)
        if request.headers.get(API_KEY_HEADER) != API_KEY:
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
