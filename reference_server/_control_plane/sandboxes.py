"""Sandbox operations: create, connect, resume, get, list, kill, timeouts, pause, network, metrics, logs.

Status codes are exactly the contract's (``docs/PROTOCOL-NOTES.md``, "Control plane"), because the
Python client parses bodies only for the codes the specification lists. ``GET /v2/sandboxes``
pages with an opaque cursor returned in the ``x-next-token`` header, which the clients read
although the specification does not declare it. The v2 routes have their own defaults (a 300 s
timeout, always an envd token): clients from 2.51 on send only what differs from them.
"""

from __future__ import annotations

import math
import posixpath
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contract.protocol import IDEMPOTENCY_KEY_HEADER, NEXT_TOKEN_HEADER
from reference_server import _views as views
from reference_server._errors import ApiError
from reference_server._events import LEVELS, LogQuery
from reference_server._idempotency import fingerprint, parse_key
from reference_server._records import Defaults, NetworkSettings
from reference_server._requests import check_query, integer_query, list_query, read_json, single
from reference_server._sandboxes import MAX_PAGE, CreateRequest
from runtime.mcp_gateway import ConfigError as McpConfigError
from runtime.mcp_gateway import parse_config as parse_mcp_config

from ._common import (
    Caller,
    Endpoint,
    bool_field,
    metadata_filter,
    newer_bool_field,
    no_content,
    ranges,
    rfc3339_query,
    unix_ms_query,
    unix_query,
)

__all__ = [
    "ENDPOINTS",
    "batch_metrics",
    "connect_v1",
    "connect_v2",
    "create_v1",
    "create_v2",
    "get",
    "kill",
    "list_v1",
    "list_v2",
    "logs_v1",
    "logs_v2",
    "metrics",
    "network",
    "pause",
    "refresh",
    "resume",
    "set_timeout",
]


# Features the create and network bodies can ask for that this server does not have: refused
# with a 400 that says so, rather than accepted and silently not applied.
RULES_UNAVAILABLE = "Network transform rules are unavailable"
# What the newer clients' create bodies can carry beyond the pinned contract, refused the same way
# when given (a client leaves each out unless its caller asks for it).
NEWER_UNAVAILABLE = {
    "iam": "IAM workload identity is unavailable",
    "network/dnsServers": "Custom DNS servers are unavailable",
    "network/egressProxy": "Egress proxy is unavailable",
    "network/httpsPorts": "HTTPS ports are unavailable",
}
_HOST_MASK = re.compile(r"[!-~]{1,253}")  # printable ASCII without spaces: it becomes a Host header


def _host_mask(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _HOST_MASK.fullmatch(value):
        raise ApiError(
            400, "Invalid request body: network/maskRequestHost: must be a host name (printable ASCII, no spaces)"
        )
    return value


def _integer(body: dict[str, Any], name: str, default: int) -> int:
    """A whole number as JSON writes one: ``10.0`` is refused, as Go refuses it for an int32 field."""
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"Invalid request body: {name}: must be of type integer")
    return value


def _env_vars(value: object) -> dict[str, str]:
    """``envVars`` (the schema made it a string map): a name is non-empty and has no ``=``.

    ``NAME=VALUE`` is how the environment is passed to a process, so a name holding ``=`` would
    set a different variable than asked; NUL in names or values is already refused for the body.
    """
    found = dict(value) if isinstance(value, dict) else {}
    for name in found:
        if not name:
            raise ApiError(400, "Invalid request body: envVars: a variable name must not be empty")
        if "=" in name:
            raise ApiError(400, "Invalid request body: envVars: a variable name must not contain '='")
    return found


MAX_VOLUME_MOUNTS = 16
# Where a volume may not be seen: the kernel's own file systems, and the files the runtime binds itself.
_RESERVED_PATHS = ("/proc", "/sys", "/dev")
_RUNTIME_FILES = frozenset({"/etc/hosts", "/etc/resolv.conf"})


def _volume_mounts(value: object) -> tuple[tuple[str, str], ...]:
    """``volumeMounts``: (volume name, absolute path) pairs; the names are resolved by the service.

    A path is absolute and clean (``/data``, not ``/data/`` or ``/a/../data``), is not the root,
    is not under ``/proc``, ``/sys`` or ``/dev`` nor one of the files the runtime binds, and is not
    given twice.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ApiError(400, "Invalid request body: volumeMounts: must be a list")
    if len(value) > MAX_VOLUME_MOUNTS:
        raise ApiError(400, f"Invalid request body: volumeMounts: at most {MAX_VOLUME_MOUNTS} entries")
    mounts: list[tuple[str, str]] = []
    for entry in value:
        name, path = (entry.get("name"), entry.get("path")) if isinstance(entry, dict) else (None, None)
        if not isinstance(name, str) or not name or not isinstance(path, str):
            raise ApiError(400, "Invalid request body: volumeMounts: each entry needs a name and a path")
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
            raise ApiError(400, f"Invalid request body: volumeMounts: {path!r} is not a clean absolute path")
        reserved = any(path == top or path.startswith(top + "/") for top in _RESERVED_PATHS)
        if reserved or path in _RUNTIME_FILES:
            raise ApiError(400, f"Invalid request body: volumeMounts: a volume cannot be mounted at {path}")
        if any(path == seen for _, seen in mounts):
            raise ApiError(400, f"Invalid request body: volumeMounts: {path} is given twice")
        mounts.append((name, path))
    return tuple(mounts)


# -- create, connect, resume ---------------------------------------------------------------------


def _refuse_newer(body: dict[str, Any], network: dict[str, Any]) -> None:
    asked = {"iam": body.get("iam"), **{f"network/{name}": network.get(name) for name in _NEWER_NETWORK}}
    for field, value in asked.items():
        if value not in (None, [], {}):
            raise ApiError(400, NEWER_UNAVAILABLE[field])


_NEWER_NETWORK = ("dnsServers", "egressProxy", "httpsPorts")


async def create_v1(request: Request, caller: Caller) -> Response:
    return await _create(request, caller, default_timeout=Defaults.TIMEOUT_S, default_secure=Defaults.SECURE_V1)


async def create_v2(request: Request, caller: Caller) -> Response:
    return await _create(request, caller, default_timeout=Defaults.V2_TIMEOUT_S, default_secure=Defaults.SECURE_V2)


async def _create(request: Request, caller: Caller, *, default_timeout: int, default_secure: bool) -> Response:
    check_query(request, ())
    key = parse_key(request.headers.get(IDEMPOTENCY_KEY_HEADER))
    body = await read_json(request, "NewSandbox")
    if body.get("mcp") is not None:
        # The clients start the gateway themselves, in the sandbox (``runtime.mcp_gateway``); a
        # configuration it would refuse is refused here, before a sandbox is made for it.
        try:
            parse_mcp_config(body["mcp"])
        except McpConfigError as exc:
            raise ApiError(400, str(exc)) from None
    network = body.get("network") or {}
    if network.get("rules"):
        raise ApiError(400, RULES_UNAVAILABLE)
    _refuse_newer(body, network)
    opened = await caller.service.create_once(
        caller.owner,
        CreateRequest(
            template_id=body["templateID"],
            timeout_s=_integer(body, "timeout", default_timeout),
            env_vars=_env_vars(body.get("envVars")),
            metadata=dict(body.get("metadata") or {}),
            secure=bool_field(body, "secure", default_secure),
            allow_internet_access=bool_field(body, "allow_internet_access", Defaults.ALLOW_INTERNET_ACCESS),
            auto_pause=bool_field(body, "autoPause", Defaults.AUTO_PAUSE),
            auto_pause_memory=bool_field(body, "autoPauseMemory", Defaults.AUTO_PAUSE_MEMORY),
            auto_resume=bool((body.get("autoResume") or {}).get("enabled", Defaults.AUTO_RESUME)),
            volume_mounts=_volume_mounts(body.get("volumeMounts")),
            network=NetworkSettings(
                allow_public_traffic=bool_field(network, "allowPublicTraffic", Defaults.ALLOW_PUBLIC_TRAFFIC),
                allow_out=ranges(network.get("allowOut"), "network/allowOut"),
                deny_out=ranges(network.get("denyOut"), "network/denyOut"),
                mask_request_host=_host_mask(network.get("maskRequestHost")),
            ),
        ),
        key,
        fingerprint(body),
    )
    return JSONResponse(views.sandbox(opened, caller.domain), status_code=201)


async def connect_v1(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "ConnectSandbox")
    return await _connect(request, caller, body, _integer(body, "timeout", 0))


async def connect_v2(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, None, optional=True)
    return await _connect(request, caller, body, _integer(body, "timeout", Defaults.V2_TIMEOUT_S))


async def _connect(request: Request, caller: Caller, body: dict[str, Any], timeout: int) -> Response:
    # memory: false (Python e2b from 2.48 and npm from 2.49 on /connect, both from 2.51 on
    # /v2/.../connect) asks for a fresh boot of a sandbox paused with its memory, never a memory
    # restore in its place.
    memory = body.get("memory", True)
    if not isinstance(memory, bool):
        raise ApiError(400, "Invalid request body: memory: must be of type boolean")
    sandbox_id = request.path_params["sandbox_id"]
    opened, resumed = await caller.service.connect(caller.owner, sandbox_id, timeout, memory=memory)
    return JSONResponse(views.sandbox(opened, caller.domain), status_code=201 if resumed else 200)


async def resume(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "ResumedSandbox", optional=True)
    auto_pause = body.get("autoPause")
    opened = await caller.service.resume(
        caller.owner,
        request.path_params["sandbox_id"],
        _integer(body, "timeout", Defaults.TIMEOUT_S),
        None if auto_pause is None else bool(auto_pause),
    )
    return JSONResponse(views.sandbox(opened, caller.domain), status_code=201)


# -- reading ---------------------------------------------------------------------------------------


async def get(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    opened = await caller.service.detail(caller.owner, request.path_params["sandbox_id"])
    return JSONResponse(views.detail(opened.record, opened.envd_token, caller.domain))


async def list_v1(request: Request, caller: Caller) -> Response:
    check_query(request, ("metadata",))
    metadata = metadata_filter(single(request.query_params.getlist("metadata"), "metadata"))
    records = await caller.service.list_running(caller.owner, metadata)
    return JSONResponse([views.listed(record) for record in records])


_ORDERS = ("asc", "desc")


async def list_v2(request: Request, caller: Caller) -> Response:
    check_query(request, ("metadata", "state", "limit", "nextToken", "order", "startedAfter", "template"))
    metadata = metadata_filter(single(request.query_params.getlist("metadata"), "metadata"))
    limit = integer_query(request, "limit", default=MAX_PAGE, low=1, high=MAX_PAGE) or MAX_PAGE
    after = single(request.query_params.getlist("nextToken"), "nextToken")
    order = single(request.query_params.getlist("order"), "order") or "desc"  # the specification's default
    if order not in _ORDERS:
        raise ApiError(400, f"Invalid order: {order!r} (known: asc, desc)")
    template = single(request.query_params.getlist("template"), "template") or None
    page = await caller.service.list_page(
        caller.owner,
        states=list_query(request, "state"),
        metadata=metadata,
        limit=limit,
        after=after,
        order=order,
        started_after=rfc3339_query(request, "startedAfter"),
        template=template,
    )
    headers = {NEXT_TOKEN_HEADER: page.next_token} if page.next_token else {}
    return JSONResponse([views.listed(record) for record in page.records], headers=headers)


async def metrics(request: Request, caller: Caller) -> Response:
    check_query(request, ("start", "end"))
    start, end = unix_query(request, "start"), unix_query(request, "end")
    samples = await caller.service.metric_series(caller.owner, request.path_params["sandbox_id"], start, end)
    return JSONResponse([views.metric(sample) for sample in samples])


async def batch_metrics(request: Request, caller: Caller) -> Response:
    check_query(request, ("sandbox_ids",))
    found = await caller.service.latest_metrics(caller.owner, list_query(request, "sandbox_ids"))
    return JSONResponse({"sandboxes": {sandbox_id: views.metric(sample) for sandbox_id, sample in found.items()}})


async def logs_v1(request: Request, caller: Caller) -> Response:
    check_query(request, ("start", "limit"))
    start = unix_ms_query(request, "start")
    limit = integer_query(request, "limit", default=1000, low=0, high=10_000) or 0
    events = await caller.service.logs_since(caller.owner, request.path_params["sandbox_id"], start, limit)
    return JSONResponse(
        {"logs": [views.log_line(event) for event in events], "logEntries": [views.log_entry(e) for e in events]}
    )


async def logs_v2(request: Request, caller: Caller) -> Response:
    check_query(request, ("cursor", "limit", "direction", "level", "search"))
    query = LogQuery(
        cursor_ms=unix_ms_query(request, "cursor"),
        limit=integer_query(request, "limit", default=1000, low=0, high=10_000) or 0,
        direction=single(request.query_params.getlist("direction"), "direction") or "forward",
        level=single(request.query_params.getlist("level"), "level"),
        search=single(request.query_params.getlist("search"), "search"),
    )
    if query.direction not in ("forward", "backward"):
        raise ApiError(400, "direction must be forward or backward")
    if query.level is not None and query.level not in LEVELS:
        raise ApiError(400, f"level must be one of {', '.join(LEVELS)}")
    events = await caller.service.logs(caller.owner, request.path_params["sandbox_id"], query)
    return JSONResponse({"logs": [views.log_entry(event) for event in events]})


# -- changing ----------------------------------------------------------------------------------------


async def kill(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    await caller.service.kill(caller.owner, request.path_params["sandbox_id"])
    return no_content()


async def set_timeout(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, None)
    if "timeout" not in body:
        raise ApiError(400, "Invalid request body: timeout: must be of type integer")
    await caller.service.set_timeout(caller.owner, request.path_params["sandbox_id"], _integer(body, "timeout", 0))
    return no_content()


async def refresh(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, None, optional=True)
    duration = body.get("duration", Defaults.REFRESH_S)
    if isinstance(duration, bool) or not isinstance(duration, int | float) or not math.isfinite(duration):
        raise ApiError(400, "Invalid request body: duration: must be of type number")
    await caller.service.refresh(caller.owner, request.path_params["sandbox_id"], int(duration))
    return no_content()


async def pause(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "SandboxPauseRequest", optional=True)
    memory = bool_field(body, "memory", Defaults.PAUSE_MEMORY)
    strict = newer_bool_field(body, "requireHealthyGuest", False)  # Python e2b 2.63's pause(strict=True)
    await caller.service.pause(
        caller.owner, request.path_params["sandbox_id"], memory=memory, require_healthy_guest=strict
    )
    return no_content()


async def network(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "SandboxNetworkUpdateConfig")
    if body.get("rules"):
        raise ApiError(400, RULES_UNAVAILABLE)
    internet = body.get("allow_internet_access")
    # The update replaces the egress lists as a whole (the clients document it so): a list left
    # out is cleared, not kept. Internet access left out keeps its setting.
    await caller.service.update_network(
        caller.owner,
        request.path_params["sandbox_id"],
        allow_internet_access=None if internet is None else bool(internet),
        allow_out=ranges(body.get("allowOut"), "allowOut"),
        deny_out=ranges(body.get("denyOut"), "denyOut"),
    )
    return no_content()


_ONE = "/sandboxes/{sandbox_id}"
ENDPOINTS = (
    Endpoint("POST", "/sandboxes", create_v1),
    Endpoint("POST", "/v2/sandboxes", create_v2),
    Endpoint("GET", "/sandboxes", list_v1),
    Endpoint("GET", "/v2/sandboxes", list_v2),
    Endpoint("GET", "/sandboxes/metrics", batch_metrics),  # before {sandbox_id}: "metrics" is not an id
    Endpoint("GET", _ONE, get),
    Endpoint("DELETE", _ONE, kill),
    Endpoint("POST", f"{_ONE}/connect", connect_v1),
    Endpoint("POST", f"/v2{_ONE}/connect", connect_v2),
    Endpoint("POST", f"{_ONE}/resume", resume),
    Endpoint("POST", f"{_ONE}/timeout", set_timeout),
    Endpoint("POST", f"{_ONE}/refreshes", refresh),
    Endpoint("POST", f"{_ONE}/pause", pause),
    Endpoint("PUT", f"{_ONE}/network", network),
    Endpoint("GET", f"{_ONE}/metrics", metrics),
    Endpoint("GET", f"{_ONE}/logs", logs_v1),
    Endpoint("GET", f"/v2{_ONE}/logs", logs_v2),
)
