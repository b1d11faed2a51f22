"""The control plane on ``api.<domain>``: one module per resource, assembled into one Starlette app.

``RESOURCES`` lists the resource modules; each has plain handlers and an ``ENDPOINTS`` table.
``create_control_plane`` wraps every endpoint in authentication and routes them. Adding a
resource is one module and one line here (``docs/CONTRIBUTING.md``).

Authentication is the ``X-API-Key`` header; the key's owner scopes everything, so another owner's
sandbox answers exactly as a missing one. Bearer access tokens and the Supabase/admin schemes are
not offered: a request carrying only those is 401. The volume content API (``/volumecontent/...``,
``_volume_content``) shares the host and authenticates by each volume's own bearer token. Every
refusal is ``{"code", "message"}`` (``_errors``), unknown routes and methods included.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from contract.protocol import API_KEY_HEADER
from reference_server import _errors as text
from reference_server._errors import ApiError, error_response
from reference_server._sandboxes import SandboxService
from reference_server._template_service import TemplateService
from reference_server._volume_content import content_routes

from . import sandboxes, snapshots, templates, volumes
from ._common import Caller, Endpoint

__all__ = ["RESOURCES", "Authenticator", "Caller", "create_control_plane"]

log = logging.getLogger(__name__)

RESOURCES = (sandboxes, snapshots, templates, volumes)


class Authenticator(Protocol):
    async def authenticate(self, presented: str | None) -> str | None: ...


async def health(request: Request) -> Response:
    return Response(status_code=200)


def _authenticated(
    endpoint: Endpoint, service: SandboxService, keys: Authenticator, builds: TemplateService | None
) -> Route:
    handler = endpoint.handler

    async def authenticate_then_handle(request: Request) -> Response:
        presented = request.headers.get(API_KEY_HEADER)
        if presented is None:
            raise ApiError(401, text.MISSING_KEY)
        owner = await keys.authenticate(presented)
        if owner is None:
            raise ApiError(401, text.UNAUTHORIZED)
        return await handler(request, Caller(owner, service, builds))

    return Route(endpoint.path, authenticate_then_handle, methods=[endpoint.method], name=handler.__name__)


def create_control_plane(
    service: SandboxService, keys: Authenticator, builds: TemplateService | None = None
) -> Starlette:
    routes = [Route("/health", health, methods=["GET"])]
    if builds is not None:

        async def upload(request: Request) -> Response:
            return await templates.upload_archive(request, builds)

        routes.append(Route(templates.UPLOAD_PATH, upload, methods=["PUT"], name="upload_archive"))
    routes += [_authenticated(endpoint, service, keys, builds) for module in RESOURCES for endpoint in module.ENDPOINTS]
    if service.volumes is not None:  # authenticated by each volume's own token, not by an API key
        routes += content_routes(service.volumes)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.message, exc.headers or None)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = {404: text.ROUTE_NOT_FOUND, 405: text.METHOD_NOT_ALLOWED}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, dict(exc.headers or {}))

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, text.INTERNAL)

    handlers: dict[type[Exception] | int, Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: api_error,
        HTTPException: http_error,
        Exception: internal_error,
    }
    return Starlette(routes=routes, exception_handlers=handlers)
