"""Snapshot operations: take one of a sandbox (``POST /sandboxes/{id}/snapshots``) and list them.

``POST /sandboxes/{id}/fork`` (the newer clients' ``fork(count=…)``, beyond the pinned contract):
``count`` sandboxes (1 by default) that continue a running sandbox's processes (``_forks``),
answered 201 with one entry per fork, ``{"sandbox": …}`` as a create answers it or ``{"error":
{"code", "message"}}``. Where the backend keeps no memory in snapshots a fork with a valid body
is 501 with the error body, whichever sandbox it names (as a route a deployment does not serve);
never sandboxes that silently start afresh. A malformed body is 400 first.

A snapshot's body may say ``memory`` (the newer clients' ``mode``: true for "full", false for
"filesystem"); without it the memory is kept where the backend can (``SandboxService.snapshot``).

A snapshot works as a template for its owner: ``Sandbox.create(template=<snapshot id or name>)``
starts from it, and ``DELETE /templates/{id}`` removes it (``templates``). Pages use the same
opaque ``x-next-token`` cursor as the sandbox list.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contract.protocol import NEXT_TOKEN_HEADER
from reference_server import _forks as forks
from reference_server import _views as views
from reference_server._errors import ApiError
from reference_server._forks import FORK_UNAVAILABLE
from reference_server._requests import check_query, integer_query, read_json, single
from reference_server._sandboxes import MAX_PAGE, Opened

from ._common import Caller, Endpoint

__all__ = ["ENDPOINTS", "FORK_UNAVAILABLE", "fork", "list_snapshots", "snapshot"]

MAX_NAME = 256
MAX_FORKS = 20  # the newer clients refuse more before sending
DEFAULT_FORKS = 1  # a body without count


async def snapshot(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, None, optional=True)
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ApiError(400, "Invalid request body: name: must be a non-empty string")
    # A name is later given as a template id; NUL and lone surrogates are refused for every body.
    if name is not None and len(name) > MAX_NAME:
        raise ApiError(400, f"Invalid request body: name: at most {MAX_NAME} characters")
    memory = body.get("memory")  # newer clients' mode: "full" (true) or "filesystem" (false)
    if memory is not None and not isinstance(memory, bool):
        raise ApiError(400, "Invalid request body: memory: must be of type boolean")
    record = await caller.service.snapshot(caller.owner, request.path_params["sandbox_id"], name, memory=memory)
    return JSONResponse(views.snapshot(record), status_code=201)


async def fork(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, None, optional=True)
    values: dict[str, int | None] = {}
    for name, low, high in (("count", 1, MAX_FORKS), ("timeout", 0, None)):
        value = body.get(name)
        values[name] = None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"Invalid request body: {name}: must be of type integer")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ApiError(400, f"Invalid request body: {name}: must be {bound}")
        values[name] = value
    results = await forks.fork(
        caller.service,
        caller.owner,
        request.path_params["sandbox_id"],
        count=values["count"] or DEFAULT_FORKS,
        timeout_s=values["timeout"],
    )
    return JSONResponse(
        [
            {"sandbox": views.sandbox(result, caller.domain)}
            if isinstance(result, Opened)
            else {"error": {"code": result.status, "message": result.message}}
            for result in results
        ],
        status_code=201,
    )


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
