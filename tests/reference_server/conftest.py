"""A control plane over the in-memory backend: the real service, store and routes, no sandboxes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import referencing
from referencing.jsonschema import DRAFT202012

from reference_server._config import EVENT_LOOPS
from reference_server._control_plane import create_control_plane
from reference_server._credentials import TokenVault
from reference_server._metrics import MetricsBook
from reference_server._sandboxes import SandboxService, ServiceSettings
from reference_server._server import loop_factory
from reference_server._snapshots import SnapshotStore
from reference_server._store import Store
from runtime.fake import FakeBackend

KEYS = {"e2b_" + "a" * 40: "alice", "e2b_" + "b" * 40: "bob"}
ALICE, BOB = list(KEYS)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class DictKeys:
    async def authenticate(self, presented: str | None) -> str | None:
        return KEYS.get(presented or "")


@dataclass
class RecordingInitializer:
    calls: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    fail: bool = False

    async def __call__(self, host: str, port: int, body: Mapping[str, Any]) -> None:
        from runtime.backend import BackendError

        if self.fail:
            raise BackendError("agent did not answer")
        self.calls.append((host, port, dict(body)))


@dataclass
class Plane:
    client: httpx.AsyncClient
    service: SandboxService
    backend: FakeBackend
    clock: Clock
    initializer: RecordingInitializer
    store: Store

    async def create(self, key: str = ALICE, **body: Any) -> dict[str, Any]:
        response = await self.client.post(
            "/sandboxes",
            json={"templateID": "base", "timeout": 300, "secure": True, **body},
            headers={"X-API-Key": key},
        )
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created


def plane_settings(**changes: Any) -> ServiceSettings:
    """The service settings of the test planes, with ``changes``."""
    values: dict[str, Any] = {"domain": "e2b.test:8443", "envd_version": "0.6.4", "templates": frozenset({"base"})}
    return ServiceSettings(**{**values, **changes})


def sandbox_service(
    store: Store,
    backend: FakeBackend,
    clock: Clock,
    initializer: RecordingInitializer,
    *,
    settings: ServiceSettings | None = None,
    **extra: Any,
) -> SandboxService:
    """The sandbox service every in-process control plane of these tests stands on."""
    return SandboxService(
        store=store,
        snapshots=SnapshotStore(store.db),
        backend=backend,
        vault=TokenVault(b"k" * 32),
        settings=settings or plane_settings(),
        initialize=initializer,
        metrics=MetricsBook(backend, clock=clock),
        clock=clock,
        **extra,
    )


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    store = await Store.open(tmp_path / "server.db")
    backend = FakeBackend()
    clock = Clock()
    initializer = RecordingInitializer()
    service = sandbox_service(store, backend, clock, initializer)
    app = create_control_plane(service, DictKeys())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://api.e2b.test") as client:
        yield Plane(client, service, backend, clock, initializer, store)
    await store.close()


# -- response validation against the derived contract ------------------------------------------

_URI = "urn:test:control-plane"


def _registry() -> referencing.Registry[Any]:
    text = resources.files("contract").joinpath("derived", "control-plane.openapi.json").read_text()
    resource: referencing.Resource[Any] = referencing.Resource.from_contents(
        json.loads(text), default_specification=DRAFT202012
    )
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(_URI, resource)
    return registry


REGISTRY = _registry()


def conforms(schema: str, value: object, *, array: bool = False) -> None:
    """Fail unless ``value`` is valid for the contract's component schema (or an array of it)."""
    ref: dict[str, Any] = {"$ref": f"{_URI}#/components/schemas/{schema}"}
    jsonschema.Draft202012Validator({"type": "array", "items": ref} if array else ref, registry=REGISTRY).validate(
        value
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# The server runs on either event loop (setting event_loop, ``_server.loop_factory``): the modules
# that face clients (the edge, its connections, the proxy) run their tests on each.
EVERY_EVENT_LOOP = [pytest.param(("asyncio", {"loop_factory": loop_factory(name)}), id=name) for name in EVENT_LOOPS]
