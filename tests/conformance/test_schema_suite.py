"""The property-based contract suites against our control plane, and against broken wrappers of it.

The control plane runs in-process over the fake backend (as in tests/reference_server/conftest.py);
schemathesis reaches it through its ASGI transport, in its own event loop thread, so the plane is
built here synchronously instead of by the async ``plane`` fixture.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from conformance._schema_suite import (
    EXCLUDED,
    SANDBOX_CREATORS,
    ContractValidator,
    SuiteResult,
    control_plane_url,
    run_schemathesis,
)
from reference_server._control_plane import create_control_plane
from reference_server._credentials import TokenVault
from reference_server._metrics import MetricsBook
from reference_server._sandboxes import SandboxService, ServiceSettings
from reference_server._snapshots import SnapshotStore
from reference_server._store import Store
from reference_server._tls import ensure_certificates
from reference_server._volumes import VolumeService, VolumeStore
from runtime.fake import FakeBackend
from runtime.volumes import VolumeStorage
from tests.reference_server.conftest import ALICE, Clock, DictKeys, RecordingInitializer

BASE_URL = "https://api.e2b.test"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class InProcess:
    app: App
    backend: FakeBackend
    volumes: VolumeStorage | None  # None: not root, so no loop-mounted volumes (and no /volumes answers)

    def live_sandboxes(self) -> list[str]:
        return [info.sandbox_id for info in asyncio.run(self.backend.list())]


@pytest.fixture
def ours(tmp_path: Path) -> Iterator[InProcess]:
    # aiosqlite answers on whichever loop awaits it, so the store opened here serves schemathesis's loop.
    store = asyncio.run(Store.open(tmp_path / "server.db"))
    backend = FakeBackend()
    clock = Clock()
    service = SandboxService(
        store=store,
        snapshots=SnapshotStore(store.db),
        backend=backend,
        vault=TokenVault(b"k" * 32),
        settings=ServiceSettings(domain="e2b.test:8443", envd_version="0.6.4", templates=frozenset({"base"})),
        initialize=RecordingInitializer(),
        metrics=MetricsBook(backend, clock=clock),
        clock=clock,
    )
    storage = VolumeStorage(Path(tempfile.mkdtemp(prefix="e2b-schema-", dir="/var/tmp")) / "volumes")
    if os.geteuid() == 0:
        vault = TokenVault(b"k" * 32)
        volume_store = VolumeStore(store.db)
        service.volumes = VolumeService(
            store=volume_store, storage=storage, vault=vault, size_mb=16, in_use=service.volume_in_use
        )
    try:
        yield InProcess(create_control_plane(service, DictKeys()), backend, storage if service.volumes else None)
    finally:
        storage.release_all()
        shutil.rmtree(storage.root.parent)
        asyncio.run(store.close())


def run(app: App, **options: Any) -> SuiteResult:
    options.setdefault("max_examples", 4)
    return run_schemathesis(BASE_URL, ALICE, ca_file=None, app=app, **options)


# -- ContractValidator ----------------------------------------------------------------------------

VALIDATOR = ContractValidator()
ERROR_404 = json.dumps({"code": 404, "message": "Sandbox not found"})
JSON = {"content-type": "application/json"}


def test_validator_accepts_conforming_responses() -> None:
    assert VALIDATOR.validate_response("GET", "/v2/sandboxes", 200, {**JSON, "x-next-token": "abc"}, "[]") == []
    assert VALIDATOR.validate_response("DELETE", "/sandboxes/sbx-1", 204, {}, None) == []
    assert VALIDATOR.validate_response("get", "/sandboxes/{sandboxID}", 404, JSON, ERROR_404) == []
    assert VALIDATOR.operation("GET", "/sandboxes/metrics?sandbox_ids=a") == "GET /sandboxes/metrics"
    assert VALIDATOR.operation("GET", "/sandboxes/sbx-1") == "GET /sandboxes/{sandboxID}"


def test_validator_reports_undeclared_statuses_for_the_caller_to_classify() -> None:
    problems = VALIDATOR.validate_response("POST", "/sandboxes/sbx-1/timeout", 409, JSON, ERROR_404)
    assert problems == [
        "status 409 is not declared for POST /sandboxes/{sandboxID}/timeout (declared: 204, 401, 404, 500)"
    ]
    assert VALIDATOR.declared_statuses("POST", "/sandboxes/sbx-1/timeout") == (204, 401, 404, 500)


def test_validator_reports_body_problems_without_quoting_values() -> None:
    secret = "envd-token-that-must-not-be-printed"
    created = {"sandboxID": 7, "templateID": "base", "clientID": "x", "envdAccessToken": secret}
    problems = VALIDATOR.validate_response("POST", "/sandboxes", 201, JSON, json.dumps(created))
    assert "body: sandboxID: must be of type string" in problems
    assert any("'envdVersion' is a required property" in problem for problem in problems)
    assert secret not in repr(problems)

    error = VALIDATOR.validate_response("GET", "/sandboxes/x", 404, JSON, json.dumps({"code": "404"}))
    assert error == ["body: code: must be of type integer", "body: (root): 'message' is a required property"]


def test_validator_reports_content_type_missing_body_and_unknown_operations() -> None:
    [content] = VALIDATOR.validate_response("GET", "/sandboxes/x", 404, {"content-type": "text/plain"}, "nope")
    assert "content type 'text/plain' is not declared for status 404" in content
    [missing] = VALIDATOR.validate_response("GET", "/sandboxes/x", 404, JSON, b"")
    assert VALIDATOR.validate_response("GET", "/sandboxes/x", 404, JSON, b"{nope") == [
        "body: cannot be read as application/json"
    ]
    assert missing == "body: missing (status 404 declares content)"
    assert VALIDATOR.validate_response("PUT", "/sandboxes", 405, JSON, "{}") == [
        "PUT /sandboxes: no such operation in the contract"
    ]


def test_error_bodies_carry_their_status_as_code() -> None:
    assert VALIDATOR.error_body_problems(404, ERROR_404) == []
    assert VALIDATOR.error_body_problems(401, ERROR_404) == ["body: code is not the HTTP status 401"]
    assert VALIDATOR.error_body_problems(401, "Unauthorized") == ["body: not JSON (an Error object was expected)"]


# -- the suites against our control plane ---------------------------------------------------------


def test_suite_passes_against_our_control_plane(ours: InProcess) -> None:
    result = run(ours.app)
    assert result.passed, result.report()
    assert "POST /sandboxes" in result.operations
    assert "DELETE /templates/{templateID}" in result.operations
    assert not any(label.startswith(("GET /templates", "POST /v3/")) for label in result.operations)
    assert {label for label, _ in result.excluded} >= {"POST /v3/templates", "GET /teams"}
    assert all(reason for _, reason in result.excluded)
    # Real servers answer statuses upstream never declared: warnings, each with its reason.
    assert any("tolerated:" in finding.message for finding in result.warnings)
    # Every sandbox and snapshot the run created is gone.
    assert result.sandboxes_created >= 2
    assert result.snapshots_created >= 1
    assert ours.live_sandboxes() == []
    assert set(ours.backend.templates) == {"base"}
    if ours.volumes is not None:  # every volume operation is fuzzed, and what it made is gone
        assert {"POST /volumes", "GET /volumes", "GET /volumes/{volumeID}", "DELETE /volumes/{volumeID}"} <= set(
            result.operations
        )
        assert result.volumes_created >= 1
        assert ours.volumes.ids() == set()


def test_wrong_credentials_suite_passes_against_our_control_plane(ours: InProcess) -> None:
    result = run(ours.app, wrong_credentials=True, max_examples=3)
    assert result.passed, result.report()
    assert result.suite == "schemathesis-wrong-credentials"
    assert ours.live_sandboxes() == []


def test_wrong_credentials_on_delete_template(ours: InProcess) -> None:
    result = run(ours.app, wrong_credentials=True, max_examples=40, operations=["control.templates.delete"])
    assert result.passed, result.report()


def test_delete_template_with_a_newline_authenticates_first(ours: InProcess) -> None:
    import httpx

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=ours.app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            return await client.delete("/templates/a%0Ab", headers={"X-API-Key": "not-an-api-key"})

    response = asyncio.run(call())
    assert response.status_code == 401, response.text


@dataclass
class Served:
    base_url: str
    ca_file: Path


@pytest.fixture
def served(ours: InProcess, tmp_path: Path) -> Iterator[Served]:
    """Our control plane behind TLS on 127.0.0.1 (the edge's leaf certifies loopback addresses too)."""
    certs = ensure_certificates(tmp_path / "tls", "e2b.localhost")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        ours.app,
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=1,
        ssl_certfile=str(certs.cert_path),
        ssl_keyfile=str(certs.key_path),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield Served(f"https://127.0.0.1:{port}", certs.ca_cert_path)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


NETWORK_OPERATIONS = ["POST /sandboxes", "GET /sandboxes/{sandboxID}", "GET /v2/sandboxes", "control.sandboxes.kill"]


def test_suite_over_tls_with_the_endpoints_ca(ours: InProcess, served: Served) -> None:
    result = run_schemathesis(
        served.base_url, ALICE, ca_file=served.ca_file, max_examples=3, operations=NETWORK_OPERATIONS
    )
    assert result.passed, result.report()
    assert len(result.operations) == 4
    assert ours.live_sandboxes() == []


def test_an_untrusted_endpoint_fails_every_request(served: Served) -> None:
    result = run_schemathesis(served.base_url, ALICE, ca_file=None, max_examples=2, operations=NETWORK_OPERATIONS)
    assert not result.passed
    assert {f.check for f in result.failures} == {"setup", "request_failed"}
    assert all("SSLError" in f.message for f in result.failures)
    assert result.cleanup_problems == ()  # nothing was created, so nothing had to be deleted


def test_unknown_operation_names_are_refused(ours: InProcess) -> None:
    with pytest.raises(ValueError, match="unknown operations: GET /nope"):
        run(ours.app, operations=["GET /nope"])


def test_the_control_plane_is_api_dot_domain() -> None:
    assert control_plane_url("e2b.localhost:8443") == "https://api.e2b.localhost:8443"


def test_exclusions_keep_their_reasons() -> None:
    assert all(exclusion.reason for exclusion in EXCLUDED)
    assert any(e.matches("POST", "/v3/templates") for e in EXCLUDED)
    assert not any(e.matches("DELETE", "/templates/{templateID}") for e in EXCLUDED)
    assert not any(e.matches("POST", "/sandboxes") for e in EXCLUDED)


# -- broken servers are caught, and the failing operation is named ----------------------------------


def counting(app: App, counts: dict[str, int]) -> App:
    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            label = f"{scope['method']} {scope['path']}"
            counts[label] = counts.get(label, 0) + 1
        await app(scope, receive, send)

    return wrapper


def created_with_200(app: App) -> App:
    """Answers 200 where the contract says 201 (the Python client then finds no body)."""

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        async def rewrite(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 201:
                message = {**message, "status": 200}
            await send(message)

        is_create = scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/sandboxes"
        await app(scope, receive, rewrite if is_create else send)

    return wrapper


def crashes_on_malformed_body(app: App) -> App:
    """A 500 whenever POST /sandboxes gets a body that is not an object with a string templateID."""

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/sandboxes"):
            await app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
            well_formed = isinstance(body, dict) and isinstance(body.get("templateID"), str)
        except ValueError:
            well_formed = False
        if not well_formed:
            payload = json.dumps({"code": 500, "message": "boom"}).encode()
            await send(
                {"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": payload})
            return

        async def replay() -> Message:
            return {"type": "http.request", "body": raw, "more_body": False}

        await app(scope, replay, send)

    return wrapper


def without_envd_version(app: App) -> App:
    """Create answers lose their required ``envdVersion`` (and keep the secret ``envdAccessToken``)."""

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/sandboxes"):
            await app(scope, receive, send)
            return
        start: Message = {}
        chunks: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if start["status"] == 201:
                created = json.loads(body)
                created.pop("envdVersion")
                created["envdAccessToken"] = SECRET
                body = json.dumps(created).encode()
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await app(scope, receive, rewrite)

    return wrapper


SECRET = "envd-token-that-must-not-be-printed"


def lets_anyone_list(app: App) -> App:
    """GET /v2/sandboxes without a valid key answers as if Alice asked."""

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v2/sandboxes" and scope["method"] == "GET":
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"x-api-key"]
            scope = {**scope, "headers": [*headers, (b"x-api-key", ALICE.encode())]}
        await app(scope, receive, send)

    return wrapper


def test_a_wrong_success_status_fails_and_names_the_operation(ours: InProcess) -> None:
    counts: dict[str, int] = {}
    result = run(counting(created_with_200(ours.app), counts), operations=["POST /sandboxes"], max_examples=10)
    assert not result.passed
    assert result.failing_operations == ("POST /sandboxes",)
    [finding] = [f for f in result.failures if f.check == "status_code_conformance"]
    assert finding.status == 200
    assert finding.operation_id == "control.sandboxes.create"
    assert "status 200 is not declared (declared: 201, 400, 401, 500)" in finding.message
    assert finding.request.method == "POST"
    assert finding.request.path == "/sandboxes"
    # Creations are limited (2 valid + 2 invalid examples here), and what was created despite the
    # wrong status is still found in the body and killed.
    assert counts["POST /sandboxes"] <= 4
    assert result.sandboxes_created >= 1
    assert ours.live_sandboxes() == []


def test_a_server_error_on_a_malformed_body_fails_and_names_the_operation(ours: InProcess) -> None:
    result = run(crashes_on_malformed_body(ours.app), operations=["control.sandboxes.create"])
    assert not result.passed
    assert result.failing_operations == ("POST /sandboxes",)
    assert {f.check for f in result.failures} == {"not_a_server_error"}
    assert all(f.status == 500 for f in result.failures)
    report = result.report()
    assert "POST /sandboxes [not_a_server_error] Server error: status 500" in report
    assert ALICE not in report
    for finding in result.failures:  # string values are redacted, only templateID is shown verbatim
        assert set(re.findall(r"([^\s{,]+): \"", finding.request.body)) <= {"templateID"}
    assert ours.live_sandboxes() == []


def test_a_body_violating_the_schema_fails_without_quoting_it(ours: InProcess) -> None:
    result = run(without_envd_version(ours.app), operations=["POST /sandboxes"])
    assert result.failing_operations == ("POST /sandboxes",)
    [finding] = [f for f in result.failures if f.check == "response_schema_conformance"]
    assert finding.status == 201
    assert finding.message == "Response violates schema: status 201 body: (root): 'envdVersion' is a required property"
    assert SECRET not in result.report()
    assert ours.live_sandboxes() == []


def test_accepting_wrong_credentials_fails_and_names_the_operation(ours: InProcess) -> None:
    result = run(lets_anyone_list(ours.app), wrong_credentials=True, operations=["GET /v2/sandboxes", "GET /snapshots"])
    assert result.operations == ("GET /snapshots", "GET /v2/sandboxes")
    assert result.failing_operations == ("GET /v2/sandboxes",)
    assert {f.check for f in result.failures} == {"wrong_credentials"}
    assert any("API key answered 200, not 401" in f.message for f in result.failures)


def test_creators_are_data() -> None:
    assert "POST /sandboxes" in SANDBOX_CREATORS
