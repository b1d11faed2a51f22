"""The volume content API on ``api.<domain>``: ``/volumecontent/{volumeID}/{path,dir,file}``.

Authenticated by the volume's own token (``Authorization: Bearer <token>``, from create or get),
not by an API key: the token is the capability, scoped to that one volume. A missing volume and a
wrong token answer alike (401), so a token never tells whether another volume exists.

Routes (operation ids of ``contract/derived/volume-content.openapi.json``)::

    GET    /path   stat            200 VolumeEntryStat
    PATCH  /path   update_metadata 200 VolumeEntryStat   body {uid?, gid?, mode?}
    DELETE /path   remove          204                   a folder with everything in it
    GET    /dir    list_dir        200 [VolumeEntryStat] depth 1.. (default 1)
    POST   /dir    make_dir        201 VolumeEntryStat   force: make missing parents too (and
                                                         take a folder that exists)
    GET    /file   read_file       200 the bytes, streamed
    PUT    /file   write_file      201 VolumeEntryStat   the body streamed to the file; missing
                                                         folders are made; an existing file is replaced

``uid``, ``gid`` and ``mode`` are decimal query parameters (mode 0..0o7777). ``force`` on a write
is accepted and changes nothing: a write replaces an existing file either way, as the clients
document. Refusals are ``{"code": "<status>", "message"}`` (the schema's ``Error``, whose code is a
string); the file operations and their refusals are ``_volume_files``'.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ._errors import ApiError
from ._requests import check_query, integer_query, read_json, single
from ._volume_files import MAX_DEPTH, Entry, Owner, VolumeFileError, VolumeFiles
from ._volumes import VolumeService

__all__ = ["PREFIX", "content_routes", "entry_body", "error_body"]

PREFIX = "/volumecontent/{volume_id}"
MAX_ID = 0xFFFF_FFFE  # uid and gid: (uint32)-1 means "unchanged" to chown
MAX_MODE = 0o7777


def error_body(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": str(status), "message": message}, status_code=status)


def _time(moment: Any) -> str:
    return str(moment.isoformat(timespec="microseconds").replace("+00:00", "Z"))


def entry_body(entry: Entry) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": entry.name,
        "type": entry.type,
        "path": entry.path,
        "size": entry.size,
        "mode": entry.mode,
        "uid": entry.uid,
        "gid": entry.gid,
        "atime": _time(entry.atime),
        "mtime": _time(entry.mtime),
        "ctime": _time(entry.ctime),
    }
    if entry.target is not None:
        body["target"] = entry.target
    return body


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _path(request: Request) -> str:
    path = single(request.query_params.getlist("path"), "path")
    if path is None:
        raise ApiError(400, "Query parameter path is required")
    return path


def _id(request: Request, name: str) -> int | None:
    return integer_query(request, name, default=None, low=0, high=MAX_ID)


def _mode(value: int | None) -> int | None:
    if value is not None and value > MAX_MODE:
        raise ApiError(400, f"mode must be between 0 and {MAX_MODE} (0o7777)")
    return value


def _force(request: Request) -> bool:
    value = single(request.query_params.getlist("force"), "force")
    if value is None:
        return False
    if value not in ("true", "false"):
        raise ApiError(400, "Query parameter force must be true or false")
    return value == "true"


class _Content:
    """The handlers, each: authenticate, parse, run the file operation in a worker thread, answer."""

    def __init__(self, volumes: VolumeService) -> None:
        self._volumes = volumes

    async def _files(self, request: Request, allowed: tuple[str, ...]) -> VolumeFiles:
        record = await self._volumes.authorize(request.path_params["volume_id"], _bearer(request))
        check_query(request, allowed)
        return VolumeFiles(self._volumes.mount_point(record.volume_id))

    async def stat(self, request: Request) -> Response:
        files = await self._files(request, ("path",))
        entry = await anyio.to_thread.run_sync(files.stat, _path(request))
        return JSONResponse(entry_body(entry))

    async def update(self, request: Request) -> Response:
        files = await self._files(request, ("path",))
        path = _path(request)
        body = await read_json(request, None, optional=True)
        values: dict[str, int | None] = {}
        for name, high in (("uid", MAX_ID), ("gid", MAX_ID), ("mode", MAX_MODE)):
            value = body.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high):
                raise ApiError(400, f"Invalid request body: {name}: must be a whole number between 0 and {high}")
            values[name] = value
        entry = await anyio.to_thread.run_sync(files.update, path, values["uid"], values["gid"], values["mode"])
        return JSONResponse(entry_body(entry))

    async def remove(self, request: Request) -> Response:
        files = await self._files(request, ("path",))
        await anyio.to_thread.run_sync(files.remove, _path(request))
        return Response(status_code=204)

    async def list_dir(self, request: Request) -> Response:
        files = await self._files(request, ("path", "depth"))
        depth = integer_query(request, "depth", default=1, low=1, high=MAX_DEPTH) or 1
        entries = await anyio.to_thread.run_sync(files.list_dir, _path(request), depth)
        return JSONResponse([entry_body(entry) for entry in entries])

    async def make_dir(self, request: Request) -> Response:
        files = await self._files(request, ("path", "uid", "gid", "mode", "force"))
        path, owner, mode, force = _path(request), _owner(request), _mode(_id(request, "mode")), _force(request)
        entry = await anyio.to_thread.run_sync(lambda: files.make_dir(path, owner, mode, parents=force))
        return JSONResponse(entry_body(entry), status_code=201)

    async def read_file(self, request: Request) -> Response:
        files = await self._files(request, ("path",))
        fd, size = await anyio.to_thread.run_sync(files.read, _path(request))
        return StreamingResponse(
            _streamed(fd), media_type="application/octet-stream", headers={"content-length": str(size)}
        )

    async def write_file(self, request: Request) -> Response:
        files = await self._files(request, ("path", "uid", "gid", "mode", "force"))
        path, owner, mode = _path(request), _owner(request), _mode(_id(request, "mode"))
        _force(request)  # checked, then as documented: a write replaces the file either way
        body = request.stream().__aiter__()

        def chunks() -> Iterator[bytes]:  # in the worker thread: each chunk fetched from the event loop
            while (chunk := anyio.from_thread.run(_next_chunk, body)) is not None:
                if chunk:
                    yield chunk

        entry = await anyio.to_thread.run_sync(files.write, path, chunks(), owner, mode)
        return JSONResponse(entry_body(entry), status_code=201)


def _owner(request: Request) -> Owner:
    default = Owner()
    uid, gid = _id(request, "uid"), _id(request, "gid")
    return Owner(default.uid if uid is None else uid, default.gid if gid is None else gid)


async def _next_chunk(body: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await body.__anext__()
    except StopAsyncIteration:
        return None


async def _streamed(fd: int) -> AsyncIterator[bytes]:
    """The file's chunks, each read in a worker thread; the descriptor is closed however the answer ends."""
    try:
        chunks = VolumeFiles.chunks(fd)
        while chunk := await anyio.to_thread.run_sync(next, chunks, b""):
            yield chunk
    finally:
        await anyio.to_thread.run_sync(os.close, fd)


def content_routes(volumes: VolumeService) -> list[Route]:
    """The routes, each answering its own refusals in the content API's shape."""
    content = _Content(volumes)
    table = (
        ("GET", "/path", content.stat),
        ("PATCH", "/path", content.update),
        ("DELETE", "/path", content.remove),
        ("GET", "/dir", content.list_dir),
        ("POST", "/dir", content.make_dir),
        ("GET", "/file", content.read_file),
        ("PUT", "/file", content.write_file),
    )
    return [
        Route(PREFIX + suffix, _answering(handler), methods=[method], name=f"volume_{handler.__name__}")
        for method, suffix, handler in table
    ]


Handler = Callable[[Request], Awaitable[Response]]


def _answering(handler: Handler) -> Handler:
    async def endpoint(request: Request) -> Response:
        try:
            response: Response = await handler(request)
        except VolumeFileError as exc:
            return error_body(exc.status, exc.message)
        except ApiError as exc:
            return error_body(exc.status, exc.message)
        return response

    endpoint.__name__ = handler.__name__
    return endpoint
