"""The edge: one ASGI app behind the TLS listener that sends each request where its Host says.

``_routing.route`` decides from the Host and the routing headers alone (control plane, or one
port of one sandbox); this module then asks the service where that sandbox is and hands the
request to the proxy, which streams it both ways. Refusals are the upstream ones:

- a malformed or foreign host: the router's 400/404 with ``{"code","message"}``;
- a sandbox that does not exist, was killed or is paused (without auto-resume): **502**. The
  clients' ``is_running()`` reads exactly that status from envd's ``/health`` as "not running";
- a sandbox that already has its share of requests or WebSockets in flight: the proxy's **429**;
- a user port of a sandbox created with ``allowPublicTraffic: false`` without the right
  ``E2B-Traffic-Access-Token``: 403. envd's own port is exempt: envd checks ``X-Access-Token``
  itself, and the two tokens are separate scopes (a traffic token is never an envd token).

The traffic token header is consumed here and never forwarded into the sandbox.
"""

from __future__ import annotations

import json
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from contract.protocol import ENVD_PORT, TRAFFIC_TOKEN_HEADER

from ._credentials import TokenScope, TokenVault
from ._proxy import SandboxProxy, Upstream
from ._routing import ControlPlane, Domain, RouteError, route
from ._sandboxes import SandboxService

__all__ = ["Edge"]

log = logging.getLogger(__name__)

TRAFFIC_HEADER = TRAFFIC_TOKEN_HEADER.lower()  # compared with lower-cased ASGI header names
NOT_RUNNING = "The sandbox was not found or is not running"
TRAFFIC_REFUSED = "Missing or invalid traffic access token"


class Edge:
    def __init__(
        self,
        *,
        domain: Domain,
        control_plane: ASGIApp,
        service: SandboxService,
        proxy: SandboxProxy,
        vault: TokenVault,
    ) -> None:
        self._domain = domain
        self._control_plane = control_plane
        self._service = service
        self._proxy = proxy
        self._vault = vault

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self._control_plane(scope, receive, send)  # lifespan
            return
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
        hosts = [value for name, value in headers if name.lower() == "host"]
        if len(hosts) != 1:
            await _refuse(scope, send, 400, "Exactly one Host header is required")
            return
        try:
            where = route(hosts[0], self._domain, headers)
        except RouteError as exc:
            await _refuse(scope, send, exc.status, exc.message)
            return
        if isinstance(where, ControlPlane):
            await self._control_plane(scope, receive, send)
            return
        target = await self._service.target(where.sandbox_id)
        if target is None:
            await _refuse(scope, send, 502, NOT_RUNNING)
            return
        if target.traffic_token is not None and where.port != ENVD_PORT:
            presented = [value for name, value in headers if name.lower() == TRAFFIC_HEADER]
            if len(presented) != 1 or not self._vault.matches(
                presented[0], target.traffic_token, TokenScope.TRAFFIC, where.sandbox_id
            ):
                await _refuse(scope, send, 403, TRAFFIC_REFUSED)
                return
        if target.mask_request_host is not None and where.port != ENVD_PORT:
            scope = _with_host(scope, target.mask_request_host.replace("${PORT}", str(where.port)))
        upstream = Upstream(target.host, where.port, sandbox_id=where.sandbox_id)
        await self._proxy.forward(scope, receive, send, upstream, drop_request_headers={TRAFFIC_HEADER})


def _with_host(scope: Scope, host: str) -> Scope:
    """The scope with its Host replaced: a sandbox asked (maskRequestHost) that its servers see this one."""
    headers = [(name, value) for name, value in scope["headers"] if name.lower() != b"host"]
    return {**scope, "headers": [(b"host", host.encode("latin-1")), *headers]}


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if scope["type"] == "websocket":
        # Before accepting, a WebSocket can still get an HTTP answer where the server supports it.
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
