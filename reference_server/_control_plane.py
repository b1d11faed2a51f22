"""The control plane on ``api.<domain>``: the sandbox and snapshot operations the clients call.

Each handler authenticates, parses (``_requests``), calls the service (``_sandboxes``) and maps
the result (``_views``); status codes are exactly the contract's (PROTOCOL.md §8.1), because the
Python client parses bodies only for the codes the specification lists. Both list operations
page with an opaque cursor returned in the ``x-next-token`` header, which the clients read
although the specification does not declare it.

Authentication is the ``X-API-Key`` header (PROTOCOL.md §2); the key's owner scopes everything,
so another owner's sandbox answers exactly as a missing one. Bearer access tokens and the
Supabase/admin schemes are not offered: a request carrying only those is 401.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import _errors as text
from . import _views as views
from ._errors import ApiError, error_response
from ._requests import check_query, integer_query, list_query, read_json, single
from ._sandboxes import API_STATES, CreateRequest, SandboxService
from ._store import InvalidCursor, SandboxRecord

__all__ = ["Authenticator", "create_control_plane"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 15  # the specification's default for create and resume when the body has none
V2_DEFAULT_TIMEOUT_S = 300  # the v2 routes' default (newer clients omit the field)
DEFAULT_REFRESH_S = 15
MAX_PAGE = 100


class Authenticator(Protocol):
    async def authenticate(self, presented: str | None) -> str | None: ...


Handler = Callable[[Request, str], Awaitable[Response]]


def _no_content() -> Response:
    return Response(status_code=204)


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    return default if value is None else bool(value)


def _strings(value: object) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else ()


def _ranges(value: object, field: str) -> tuple[str, ...]:
    """``allowOut``/``denyOut``: IPv4 addresses or CIDR ranges (the sandboxes' networks are IPv4).

    Upstream also takes domain names in ``allowOut``; this server's egress rules are address
    based, so a name is refused with a 400 that says so rather than silently not applied.
    """
    ranges = _strings(value)
    for entry in ranges:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ApiError(
                400, f"Invalid request body: {field}: entries must be IPv4 addresses or CIDR ranges"
            ) from None
        if network.version != 4:
            raise ApiError(400, f"Invalid request body: {field}: sandboxes have IPv4 networking only")
    return ranges


def _parse_metadata_filter(raw: str | None) -> dict[str, str]:
    """The clients send ``urlencode({quote(k): quote(v)})`` as one parameter: undo both layers."""
    if raw is None:
        return {}
    try:
        pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise ApiError(400, "Invalid metadata filter: expected key=value pairs joined by &") from None
    return {urllib.parse.unquote(key): urllib.parse.unquote(value) for key, value in pairs}


def _states(request: Request) -> set[str] | None:
    wanted = list_query(request, "state")
    if not wanted:
        return None
    unknown = sorted(set(wanted) - set(API_STATES))
    if unknown:
        raise ApiError(400, f"Invalid state filter: {unknown[0]} (known: {', '.join(API_STATES)})")
    return set().union(*(API_STATES[state] for state in wanted))


def _unix(request: Request, name: str) -> datetime | None:
    seconds = integer_query(request, name, default=None, low=0, high=2**40)
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class AnythingConvertor(Convertor[str]):
    """Like Starlette's ``path``, but newlines too: an id that is not even a name must still reach
    the handler, which authenticates first (401) and then answers that no such template exists."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anything", AnythingConvertor())


def create_control_plane(service: SandboxService, keys: Authenticator) -> Starlette:
    domain = service.settings.domain

    def authenticated(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            presented = request.headers.get("x-api-key")
            if presented is None:
                raise ApiError(401, text.MISSING_KEY)
            owner = await keys.authenticate(presented)
            if owner is None:
                raise ApiError(401, text.UNAUTHORIZED)
            return await handler(request, owner)

        return endpoint

    async def create_v1(request: Request, owner: str) -> Response:
        return await create(request, owner, default_timeout=DEFAULT_TIMEOUT_S, default_secure=False)

    async def create_v2(request: Request, owner: str) -> Response:
        # Clients from 2.51 on send only what differs from the v2 defaults: a 300 s timeout, and
        # no ``secure`` field at all (v2 sandboxes always get an envd token).
        return await create(request, owner, default_timeout=V2_DEFAULT_TIMEOUT_S, default_secure=True)

    async def create(request: Request, owner: str, *, default_timeout: int, default_secure: bool) -> Response:
        check_query(request, ())
        body = await read_json(request, "NewSandbox")
        if body.get("volumeMounts"):
            raise ApiError(400, "Volume mount is unavailable")
        network = body.get("network") or {}
        opened = await service.create(
            owner,
            CreateRequest(
                template_id=body["templateID"],
                timeout_s=int(body.get("timeout", default_timeout)),
                env_vars=dict(body.get("envVars") or {}),
                metadata=dict(body.get("metadata") or {}),
                secure=_bool(body, "secure", default_secure),
                allow_internet_access=_bool(body, "allow_internet_access", True),
                auto_pause=_bool(body, "autoPause", False),
                auto_pause_memory=_bool(body, "autoPauseMemory", True),
                auto_resume=bool((body.get("autoResume") or {}).get("enabled", False)),
                allow_public_traffic=_bool(network, "allowPublicTraffic", True),
                allow_out=_ranges(network.get("allowOut"), "network/allowOut"),
                deny_out=_ranges(network.get("denyOut"), "network/denyOut"),
                mask_request_host=network.get("maskRequestHost"),
            ),
        )
        return JSONResponse(views.sandbox(opened, domain), status_code=201)

    async def connect_v1(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, "ConnectSandbox")
        return await connect(request, owner, int(body["timeout"]))

    async def connect_v2(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, None, optional=True)
        timeout = body.get("timeout", V2_DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int):
            raise ApiError(400, "Invalid request body: timeout: must be of type integer")
        if not isinstance(body.get("memory", True), bool):
            raise ApiError(400, "Invalid request body: memory: must be of type boolean")
        return await connect(request, owner, timeout)

    async def connect(request: Request, owner: str, timeout: int) -> Response:
        opened, resumed = await service.connect(owner, request.path_params["sandbox_id"], timeout)
        return JSONResponse(views.sandbox(opened, domain), status_code=201 if resumed else 200)

    async def resume(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, "ResumedSandbox", optional=True)
        auto_pause = body.get("autoPause")
        opened = await service.resume(
            owner,
            request.path_params["sandbox_id"],
            int(body.get("timeout", DEFAULT_TIMEOUT_S)),
            None if auto_pause is None else bool(auto_pause),
        )
        return JSONResponse(views.sandbox(opened, domain), status_code=201)

    async def get(request: Request, owner: str) -> Response:
        check_query(request, ())
        record = await service.owned(owner, request.path_params["sandbox_id"])
        return JSONResponse(views.detail(record, service.tokens(record).envd_token, domain))

    async def kill(request: Request, owner: str) -> Response:
        check_query(request, ())
        if not await service.kill(owner, request.path_params["sandbox_id"]):
            raise ApiError(404, text.SANDBOX_NOT_FOUND)
        return _no_content()

    async def list_v1(request: Request, owner: str) -> Response:
        check_query(request, ("metadata",))
        metadata = _parse_metadata_filter(single(request.query_params.getlist("metadata"), "metadata"))
        records: list[SandboxRecord] = []
        token: str | None = None
        while True:  # v1 has no pagination: every running sandbox in one answer
            page = await service.store.list(
                owner, states=API_STATES["running"], metadata=metadata, limit=MAX_PAGE, after=token
            )
            records.extend(page.records)
            token = page.next_token
            if token is None:
                break
        return JSONResponse([views.listed(record) for record in records])

    async def list_v2(request: Request, owner: str) -> Response:
        check_query(request, ("metadata", "state", "limit", "nextToken"))
        metadata = _parse_metadata_filter(single(request.query_params.getlist("metadata"), "metadata"))
        limit = integer_query(request, "limit", default=MAX_PAGE, low=1, high=MAX_PAGE) or MAX_PAGE
        states = _states(request) or set(API_STATES["running"] | API_STATES["paused"])
        after = single(request.query_params.getlist("nextToken"), "nextToken")
        try:
            page = await service.store.list(owner, states=states, metadata=metadata, limit=limit, after=after)
        except InvalidCursor:
            raise ApiError(400, text.INVALID_CURSOR) from None
        headers = {"x-next-token": page.next_token} if page.next_token else {}
        return JSONResponse([views.listed(record) for record in page.records], headers=headers)

    async def set_timeout(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, None)
        timeout = body.get("timeout")
        if isinstance(timeout, bool) or not isinstance(timeout, int):
            raise ApiError(400, "Invalid request body: timeout: must be of type integer")
        await service.set_timeout(owner, request.path_params["sandbox_id"], timeout)
        return _no_content()

    async def refresh(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, None, optional=True)
        duration = body.get("duration", DEFAULT_REFRESH_S)
        if isinstance(duration, bool) or not isinstance(duration, int | float):
            raise ApiError(400, "Invalid request body: duration: must be of type number")
        await service.refresh(owner, request.path_params["sandbox_id"], int(duration))
        return _no_content()

    async def pause(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, "SandboxPauseRequest", optional=True)
        await service.pause(owner, request.path_params["sandbox_id"], memory=_bool(body, "memory", True))
        return _no_content()

    async def network(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, "SandboxNetworkUpdateConfig")
        internet = body.get("allow_internet_access")
        await service.update_network(
            owner,
            request.path_params["sandbox_id"],
            allow_internet_access=None if internet is None else bool(internet),
            allow_out=None if "allowOut" not in body else _ranges(body["allowOut"], "allowOut"),
            deny_out=None if "denyOut" not in body else _ranges(body["denyOut"], "denyOut"),
        )
        return _no_content()

    async def metrics(request: Request, owner: str) -> Response:
        check_query(request, ("start", "end"))
        start, end = _unix(request, "start"), _unix(request, "end")
        if start is not None and end is not None and start > end:
            raise ApiError(400, "start must not be after end")
        record = await service.owned(owner, request.path_params["sandbox_id"])
        samples = service.metrics.series(record.sandbox_id, start, end)
        return JSONResponse([views.metric(sample) for sample in samples])

    async def batch_metrics(request: Request, owner: str) -> Response:
        check_query(request, ("sandbox_ids",))
        wanted = list_query(request, "sandbox_ids")
        if not wanted:
            raise ApiError(400, "Query parameter sandbox_ids is required")
        if len(wanted) > MAX_PAGE:
            raise ApiError(400, f"At most {MAX_PAGE} sandbox ids per request")
        found: dict[str, Any] = {}
        for sandbox_id in dict.fromkeys(wanted):
            record = await service.store.get(sandbox_id)
            sample = service.metrics.latest(sandbox_id) if record is not None and record.owner == owner else None
            if sample is not None:
                found[sandbox_id] = views.metric(sample)
        return JSONResponse({"sandboxes": found})

    async def logs_v1(request: Request, owner: str) -> Response:
        check_query(request, ("start", "limit"))
        start = _unix_ms(request, "start")
        limit = integer_query(request, "limit", default=1000, low=0, high=10_000) or 0
        record = await service.owned(owner, request.path_params["sandbox_id"])
        entries = [e for e in views.log_entries(record) if start is None or _ms(e["timestamp"]) >= start][:limit]
        lines = [{"timestamp": e["timestamp"], "line": e["message"]} for e in entries]
        return JSONResponse({"logs": lines, "logEntries": entries})

    async def logs_v2(request: Request, owner: str) -> Response:
        check_query(request, ("cursor", "limit", "direction", "level", "search"))
        cursor = _unix_ms(request, "cursor")
        limit = integer_query(request, "limit", default=1000, low=0, high=10_000) or 0
        direction = single(request.query_params.getlist("direction"), "direction") or "forward"
        level = single(request.query_params.getlist("level"), "level")
        search = single(request.query_params.getlist("search"), "search")
        if direction not in ("forward", "backward"):
            raise ApiError(400, "direction must be forward or backward")
        levels = ("debug", "info", "warn", "error")
        if level is not None and level not in levels:
            raise ApiError(400, f"level must be one of {', '.join(levels)}")
        record = await service.owned(owner, request.path_params["sandbox_id"])
        entries = views.log_entries(record)
        if direction == "backward":
            entries.reverse()
        keep = []
        for entry in entries:
            at = _ms(entry["timestamp"])
            if cursor is not None and (at < cursor if direction == "forward" else at > cursor):
                continue
            if level is not None and levels.index(entry["level"]) < levels.index(level):
                continue
            if search and search not in entry["message"]:
                continue
            keep.append(entry)
        return JSONResponse({"logs": keep[:limit]})

    async def snapshot(request: Request, owner: str) -> Response:
        check_query(request, ())
        body = await read_json(request, None, optional=True)
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ApiError(400, "Invalid request body: name: must be a non-empty string")
        record = await service.snapshot(owner, request.path_params["sandbox_id"], name)
        return JSONResponse(views.snapshot(record), status_code=201)

    async def list_snapshots(request: Request, owner: str) -> Response:
        check_query(request, ("sandboxID", "limit", "nextToken"))
        limit = integer_query(request, "limit", default=MAX_PAGE, low=1, high=MAX_PAGE) or MAX_PAGE
        sandbox_id = single(request.query_params.getlist("sandboxID"), "sandboxID")
        after = single(request.query_params.getlist("nextToken"), "nextToken")
        try:
            page = await service.snapshots.list(owner, sandbox_id=sandbox_id, limit=limit, after=after)
        except InvalidCursor:
            raise ApiError(400, text.INVALID_CURSOR) from None
        headers = {"x-next-token": page.next_token} if page.next_token else {}
        return JSONResponse([views.snapshot(record) for record in page.records], headers=headers)

    async def delete_template(request: Request, owner: str) -> Response:
        check_query(request, ())
        # The JS client percent-encodes "/" and ":" in the id, Python sends them raw: the route
        # captures the rest of the path, and Starlette has already decoded it once.
        template_id = request.path_params["template_id"]
        if not await service.delete_template(owner, template_id):
            raise ApiError(404, f"Template '{template_id}' not found")
        return _no_content()

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    sandbox = "/sandboxes/{sandbox_id}"
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/sandboxes", authenticated(create_v1), methods=["POST"]),
        Route("/v2/sandboxes", authenticated(create_v2), methods=["POST"]),
        Route("/sandboxes", authenticated(list_v1), methods=["GET"]),
        Route("/v2/sandboxes", authenticated(list_v2), methods=["GET"]),
        Route("/sandboxes/metrics", authenticated(batch_metrics), methods=["GET"]),
        Route(sandbox, authenticated(get), methods=["GET"]),
        Route(sandbox, authenticated(kill), methods=["DELETE"]),
        Route(f"{sandbox}/connect", authenticated(connect_v1), methods=["POST"]),
        Route(f"/v2{sandbox}/connect", authenticated(connect_v2), methods=["POST"]),
        Route(f"{sandbox}/resume", authenticated(resume), methods=["POST"]),
        Route(f"{sandbox}/timeout", authenticated(set_timeout), methods=["POST"]),
        Route(f"{sandbox}/refreshes", authenticated(refresh), methods=["POST"]),
        Route(f"{sandbox}/pause", authenticated(pause), methods=["POST"]),
        Route(f"{sandbox}/network", authenticated(network), methods=["PUT"]),
        Route(f"{sandbox}/metrics", authenticated(metrics), methods=["GET"]),
        Route(f"{sandbox}/logs", authenticated(logs_v1), methods=["GET"]),
        Route(f"/v2{sandbox}/logs", authenticated(logs_v2), methods=["GET"]),
        Route(f"{sandbox}/snapshots", authenticated(snapshot), methods=["POST"]),
        Route("/snapshots", authenticated(list_snapshots), methods=["GET"]),
        Route("/templates/{template_id:anything}", authenticated(delete_template), methods=["DELETE"]),
    ]

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.message)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = {404: text.ROUTE_NOT_FOUND, 405: text.METHOD_NOT_ALLOWED}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, dict(exc.headers or {}))

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, text.INTERNAL)

    return Starlette(
        routes=routes,
        exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: internal_error},
    )


def _unix_ms(request: Request, name: str) -> int | None:
    return integer_query(request, name, default=None, low=0, high=2**53)


def _ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
