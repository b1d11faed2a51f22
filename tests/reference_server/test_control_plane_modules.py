"""The control plane's resource modules: plain handlers a test can call, route tables as data.

Every endpoint of every resource module must be an operation of the derived contract (no invented
routes), every handler is found by name in its module, and a handler called directly with a
request and a ``Caller`` does what the route does.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest
from starlette.requests import Request

from reference_server._control_plane import RESOURCES, Caller, sandboxes, snapshots, volumes
from reference_server._errors import ApiError

from .conftest import Plane

pytestmark = pytest.mark.anyio


def _contract_routes() -> set[tuple[str, str]]:
    document = json.loads(resources.files("contract").joinpath("derived", "control-plane.openapi.json").read_text())
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item}


def _request(method: str, path: str, body: dict[str, Any] | None = None, **path_params: str) -> Request:
    raw = b"" if body is None else json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        "path_params": path_params,
    }
    return Request(scope, receive)


# Served beyond the pinned contract, with the reason: the newer clients' routes.
BEYOND_THE_PIN = {
    ("POST", "/v2/sandboxes"): "clients from 2.51 on create here (v2 defaults)",
    ("POST", "/v2/sandboxes/{sandboxID}/connect"): "newer clients connect here",
    ("POST", "/sandboxes/{sandboxID}/fork"): "fork(count=...) from e2b 2.34 (npm 2.35); 501 without memory snapshots",
}


def test_every_endpoint_is_a_contract_operation() -> None:
    known = _contract_routes() | set(BEYOND_THE_PIN)
    for module in RESOURCES:
        for endpoint in module.ENDPOINTS:
            path = (
                endpoint.path.replace("{template_id:anything}", "{templateID}")
                .replace("{sandbox_id}", "{sandboxID}")
                .replace("{volume_id}", "{volumeID}")
            )
            assert (endpoint.method, path) in known, f"{module.__name__}: {endpoint.method} {endpoint.path}"


def test_every_handler_is_a_named_module_function() -> None:
    for module in RESOURCES:
        for endpoint in module.ENDPOINTS:
            assert getattr(module, endpoint.handler.__name__) is endpoint.handler
            assert endpoint.handler.__name__ in module.__all__


def test_no_route_is_listed_twice() -> None:
    rows = [(endpoint.method, endpoint.path) for module in RESOURCES for endpoint in module.ENDPOINTS]
    assert len(rows) == len(set(rows))


def test_volumes_serves_every_volume_operation_of_the_contract() -> None:
    served = {(endpoint.method, endpoint.path.replace("{volume_id}", "{volumeID}")) for endpoint in volumes.ENDPOINTS}
    assert served == {route for route in _contract_routes() if route[1].startswith("/volumes")}


async def test_a_handler_called_directly(plane: Plane) -> None:
    caller = Caller("alice", plane.service)
    created = await sandboxes.create_v2(_request("POST", "/v2/sandboxes", {"templateID": "base"}), caller)
    assert created.status_code == 201
    sandbox_id = json.loads(bytes(created.body))["sandboxID"]
    record = await plane.store.get(sandbox_id)
    assert record is not None
    assert record.details.timeout_s == 300  # the v2 default
    assert record.details.envd_token is not None  # v2 sandboxes always get a token

    taken = await snapshots.snapshot(_request("POST", "/", {"name": "mine"}, sandbox_id=sandbox_id), caller)
    assert taken.status_code == 201

    gone = await sandboxes.kill(_request("DELETE", "/", sandbox_id=sandbox_id), caller)
    assert gone.status_code == 204
    with pytest.raises(ApiError) as refused:
        await sandboxes.kill(_request("DELETE", "/", sandbox_id=sandbox_id), caller)
    assert refused.value.status == 404


async def test_another_owner_is_answered_as_missing(plane: Plane) -> None:
    alice = Caller("alice", plane.service)
    created = await sandboxes.create_v1(_request("POST", "/sandboxes", {"templateID": "base"}), alice)
    sandbox_id = json.loads(bytes(created.body))["sandboxID"]
    with pytest.raises(ApiError) as refused:
        await sandboxes.get(_request("GET", "/", sandbox_id=sandbox_id), Caller("bob", plane.service))
    assert refused.value.status == 404
