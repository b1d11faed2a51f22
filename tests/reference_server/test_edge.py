"""The edge over the in-memory backend: host routing, 502 for sandboxes that do not run, traffic tokens.

The fake backend places every running sandbox at 127.0.0.1, so ``<port>-<id>.<domain>`` reaches
a real local upstream on that port through the real proxy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from reference_server._control_plane import create_control_plane
from reference_server._edge import Edge
from reference_server._proxy import SandboxProxy
from reference_server._routing import parse_domain

from .conftest import ALICE, EVERY_EVENT_LOOP, DictKeys, Plane
from .test_proxy import ServerThread

pytestmark = pytest.mark.anyio


@pytest.fixture(params=EVERY_EVENT_LOOP)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


DOMAIN = "e2b.test:8443"


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path, "headers": dict(request.headers)})


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerThread]:
    with ServerThread(Starlette(routes=[Route("/{rest:path}", _echo)])) as server:
        yield server


@pytest.fixture
async def edge(plane: Plane) -> AsyncIterator[httpx.AsyncClient]:
    proxy = SandboxProxy()
    app = Edge(
        domain=parse_domain(DOMAIN),
        control_plane=create_control_plane(plane.service, DictKeys()),
        service=plane.service,
        proxy=proxy,
        vault=plane.service.vault,
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
        yield client
    await proxy.aclose()


def sandbox_url(port: int, sandbox_id: str, path: str = "/x") -> str:
    return f"https://{port}-{sandbox_id}.{DOMAIN}{path}"


def refused(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.json()["code"] == status


async def test_the_api_host_reaches_the_control_plane(edge: httpx.AsyncClient) -> None:
    response = await edge.get(f"https://api.{DOMAIN}/v2/sandboxes", headers={"X-API-Key": ALICE})
    assert response.status_code == 200


async def test_foreign_and_malformed_hosts(edge: httpx.AsyncClient) -> None:
    refused(await edge.get("https://api.e2b.test.evil.invalid:8443/v2/sandboxes"), 404)
    refused(await edge.get(f"https://0-abc.{DOMAIN}/"), 400)
    refused(await edge.get(f"https://sandbox.{DOMAIN}/"), 400)


async def test_a_running_sandbox_is_proxied_by_host_and_by_shared_host(
    edge: httpx.AsyncClient, plane: Plane, upstream: ServerThread
) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    direct = await edge.get(sandbox_url(upstream.port, sandbox_id, "/hello"))
    assert direct.status_code == 200
    assert direct.json()["path"] == "/hello"
    shared = await edge.get(
        f"https://sandbox.{DOMAIN}/via-headers",
        headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(upstream.port)},
    )
    assert shared.json()["path"] == "/via-headers"


async def test_unknown_paused_and_killed_sandboxes_answer_502(
    edge: httpx.AsyncClient, plane: Plane, upstream: ServerThread
) -> None:
    refused(await edge.get(sandbox_url(upstream.port, "nosuchsandbox")), 502)
    sandbox_id = (await plane.create())["sandboxID"]
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers={"X-API-Key": ALICE})
    refused(await edge.get(sandbox_url(upstream.port, sandbox_id)), 502)
    await plane.client.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": ALICE})
    refused(await edge.get(sandbox_url(upstream.port, sandbox_id)), 502)


async def test_a_paused_sandbox_with_auto_resume_is_resumed_by_traffic(
    edge: httpx.AsyncClient, plane: Plane, upstream: ServerThread
) -> None:
    sandbox_id = (await plane.create(autoResume={"enabled": True}))["sandboxID"]
    await plane.client.post(f"/sandboxes/{sandbox_id}/pause", headers={"X-API-Key": ALICE})
    response = await edge.get(sandbox_url(upstream.port, sandbox_id))
    assert response.status_code == 200
    detail = await plane.client.get(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": ALICE})
    assert detail.json()["state"] == "running"


async def test_traffic_tokens_guard_user_ports_and_are_not_forwarded(
    edge: httpx.AsyncClient, plane: Plane, upstream: ServerThread
) -> None:
    created: dict[str, Any] = await plane.create(network={"allowPublicTraffic": False})
    sandbox_id, traffic, envd = created["sandboxID"], created["trafficAccessToken"], created["envdAccessToken"]
    url = sandbox_url(upstream.port, sandbox_id)
    refused(await edge.get(url), 403)
    refused(await edge.get(url, headers={"E2B-Traffic-Access-Token": envd}), 403)
    refused(await edge.get(url, headers=[("E2B-Traffic-Access-Token", traffic)] * 2), 403)
    passed = await edge.get(url, headers={"E2B-Traffic-Access-Token": traffic})
    assert passed.status_code == 200
    assert "e2b-traffic-access-token" not in passed.json()["headers"]
    public = (await plane.create())["sandboxID"]
    assert (await edge.get(sandbox_url(upstream.port, public))).status_code == 200


@pytest.mark.parametrize("routing", ["host", "headers"])
async def test_header_routing_has_the_host_routings_token_rules(
    edge: httpx.AsyncClient, plane: Plane, upstream: ServerThread, routing: str
) -> None:
    """Newer interpreter clients reach port 49999 through the shared host with routing headers."""
    created: dict[str, Any] = await plane.create(network={"allowPublicTraffic": False})
    sandbox_id, traffic = created["sandboxID"], created["trafficAccessToken"]

    async def get(token: str | None) -> httpx.Response:
        extra = {} if token is None else {"E2B-Traffic-Access-Token": token}
        if routing == "host":
            return await edge.get(sandbox_url(upstream.port, sandbox_id), headers=extra)
        routed = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(upstream.port), **extra}
        return await edge.get(f"https://sandbox.{DOMAIN}/x", headers=routed)

    refused(await get(None), 403)
    refused(await get(created["envdAccessToken"]), 403)
    passed = await get(traffic)
    assert passed.status_code == 200
    assert "e2b-traffic-access-token" not in passed.json()["headers"]


async def test_a_host_mask_is_what_servers_inside_see_on_user_ports(
    edge: httpx.AsyncClient, plane: Plane, upstream: ServerThread
) -> None:
    created: dict[str, Any] = await plane.create(network={"maskRequestHost": "${PORT}-masked.example"})
    passed = await edge.get(sandbox_url(upstream.port, created["sandboxID"]))
    assert passed.status_code == 200
    assert passed.json()["headers"]["host"] == f"{upstream.port}-masked.example"
    unmasked = (await plane.create())["sandboxID"]
    seen = (await edge.get(sandbox_url(upstream.port, unmasked))).json()["headers"]["host"]
    assert seen.startswith(f"{upstream.port}-{unmasked}."), seen
