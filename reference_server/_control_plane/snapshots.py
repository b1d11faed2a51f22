"""Snapshot operations: take one of a sandbox (``POST /sandboxes/{id}/snapshots``) and list them.

``POST /sandboxes/{id}/fork`` (the newer clients' ``fork(count=…)``, beyond the pinned contract)
is a memory snapshot of a running sandbox and ``count`` sandboxes that go on from it, processes
and all. No backend here takes memory snapshots, so the operation is not offered: a fork with a
valid body is 501 with the error body, whichever sandbox it names (as a route a deployment does
not serve), declared in the harness's feature list; never sandboxes that silently start afresh.
A malformed body is 400 first.

A snapshot works as a template for its owner: ``Sandbox.create(template=<snapshot id or name>)``
starts from it, and ``DELETE /templates/{id}`` removes it (``templates``). Pages use the same
opaque ``x-next-token`` cursor as the sandbox list.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contract.protocol import NEXT_TOKEN_HEADER
from reference_server import _views as views
from reference_server._errors import ApiError
from reference_server._requests import check_query, integer_query, read_json, single
from reference_server._sandboxes import MAX_PAGE

from ._common import Caller, Endpoint

__all__ = ["ENDPOINTS", "FORK_UNAVAILABLE", "fork", "list_snapshots", "snapshot"]

MAX_NAME = 256
MAX_FORKS = 20  # the newer clients refuse more before sending
FORK_UNAVAILABLE = "Forking a sandbox is unavailable: it needs memory snapshots, which this server does not take"


async def snapshot(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, None, optional=True)
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ApiError(400, "Invalid request body: name: must be a non-empty string")
    # A name is later given as a template id; NUL and lone surrogates are refused for every body.
    if name is not None and len(name) > MAX_NAME:
        raise ApiError(400, f"Invalid request body: name: at most {MAX_NAME} characters")
    record = await caller.service.snapshot(caller.owner, request.path_params["sandbox_id"], name)
    return JSONResponse(views.snapshot(record), status_code=201)


async def fork(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, None, optional=True)
    for name, low, high in (("count", 1, MAX_FORKS), ("timeout", 0, None)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"Invalid request body: {name}: must be of type integer")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ApiError(400, f"Invalid request body: {name}: must be {bound}")
    raise ApiError(501, FORK_UNAVAILABLE)


async def list_snapshots(request: Request, caller: Caller) -> Response:
    check_query(request, ("sandboxID", "limit", "nextToken", "name"))
    limit = integer_query(request, "limit", default=MAX_PAGE, low=1, high=MAX_PAGE) or MAX_PAGE
    sandbox_id = single(request.query_params.getlist("sandboxID"), "sandboxID")
    after = single(request.query_params.getlist("nextToken"), "nextToken")
    name = single(request.query_params.getlist("name"), "name") or None  # newer clients: an id or a name
    page = await caller.service.list_snapshots(caller.owner, sandbox_id=sandbox_id, limit=limit, after=after, name=name)
    headers = {NEXT_TOKEN_HEADER: page.next_token} if page.next_token else {}
    return JSONResponse([views.snapshot(record) for record in page.records], headers=headers)


ENDPOINTS = (
    Endpoint("POST", "/sandboxes/{sandbox_id}/snapshots", snapshot),
    Endpoint("GET", "/snapshots", list_snapshots),
    Endpoint("POST", "/sandboxes/{sandbox_id}/fork", fork),
)
