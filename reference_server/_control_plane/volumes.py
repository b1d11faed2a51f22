"""Volume operations: create, list, get (the clients' ``connect`` and ``get_info``), delete.

A volume is its owner's: another owner's answers as a missing one (404 "Volume not found"). A
name is unique per owner (409 "Volume already exists"). Create and get answer the volume's token,
which authenticates the content API (``_volume_content``); the list does not. A volume that a
sandbox which is not gone mounts cannot be deleted (409 "Volume is in use"). The decisions are
``_volumes.VolumeService``'s.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reference_server._errors import ApiError
from reference_server._requests import check_query, read_json
from reference_server._volumes import VolumeRecord, VolumeService

from ._common import Caller, Endpoint, no_content

__all__ = ["ENDPOINTS", "create_volume", "delete_volume", "get_volume", "list_volumes"]


def _volumes(caller: Caller) -> VolumeService:
    if caller.service.volumes is None:  # a plane assembled without volumes (some tests)
        raise ApiError(501, "Volumes are not offered by this server")
    return caller.service.volumes


def _listed(record: VolumeRecord) -> dict[str, str]:
    return {"volumeID": record.volume_id, "name": record.name}


async def create_volume(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "NewVolume")
    record, token = await _volumes(caller).create(caller.owner, body.get("name"))
    return JSONResponse({**_listed(record), "token": token}, status_code=201)


async def list_volumes(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    return JSONResponse([_listed(record) for record in await _volumes(caller).list(caller.owner)])


async def get_volume(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    record, token = await _volumes(caller).get(caller.owner, request.path_params["volume_id"])
    return JSONResponse({**_listed(record), "token": token})


async def delete_volume(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    await _volumes(caller).delete(caller.owner, request.path_params["volume_id"])
    return no_content()


ENDPOINTS = (
    Endpoint("POST", "/volumes", create_volume),
    Endpoint("GET", "/volumes", list_volumes),
    Endpoint("GET", "/volumes/{volume_id}", get_volume),
    Endpoint("DELETE", "/volumes/{volume_id}", delete_volume),
)
