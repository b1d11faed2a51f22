"""The interpreter wire cases against an in-memory endpoint: a conforming one passes, each fault is named.

``httpx.MockTransport`` plays the control plane (create and kill) and the interpreter of one
``code-interpreter-v1`` sandbox; each fault changes one thing a real server could get wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from conformance._wire import (
    WIRE_CASES,
    Wire,
    WireMismatchError,
    interpreter_execute_ndjson,
    interpreter_health,
    interpreter_statuses,
)

DOMAIN = "e2b.test:8443"
SANDBOX = "isbx1"
ENVD_TOKEN, TRAFFIC_TOKEN = "envd-token", "traffic-token"
STAMP = "2026-01-01T00:00:00.000000+00:00"

GOOD_LINES: list[dict[str, Any]] = [
    {"type": "number_of_executions", "execution_count": 1},
    {"type": "stdout", "text": "out\n", "timestamp": STAMP},
    {"type": "keepalive"},
    {"type": "result", "text": "2", "is_main_result": True},
    {"type": "end_of_execution"},
]


def ndjson(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@dataclass
class FakeEndpoint:
    """A control plane and one sandbox's interpreter; the fields are the answers to change."""

    execute_body: bytes = field(default_factory=lambda: ndjson(GOOD_LINES))
    health: httpx.Response = field(default_factory=lambda: httpx.Response(200, json="OK"))
    both_status: int = 400
    unknown_status: int = 404
    contexts: list[dict[str, str]] = field(
        default_factory=lambda: [{"id": "k-python", "language": "python", "cwd": "/home/user"}]
    )
    created: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    headers_seen: list[httpx.Headers] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        if host == "api.e2b.test":
            return self.control(request)
        assert host == f"49999-{SANDBOX}.e2b.test", host
        self.headers_seen.append(request.headers)
        if request.headers.get("E2B-Traffic-Access-Token") != TRAFFIC_TOKEN:
            return httpx.Response(403, json={"code": 403, "message": "traffic token"})
        if path == "/health":
            return self.health
        if path == "/contexts":
            return httpx.Response(200, json=self.contexts)
        if path == "/execute":
            body = json.loads(request.content)
            if body.get("context_id") and body.get("language"):
                return httpx.Response(self.both_status, text="Only one of context_id or language can be provided")
            if body.get("context_id") and body["context_id"] not in {c["id"] for c in self.contexts}:
                return httpx.Response(self.unknown_status, text=f"Context {body['context_id']} not found")
            return httpx.Response(200, content=self.execute_body)
        if path.startswith("/contexts/"):
            return httpx.Response(self.unknown_status, text="Context no-such-context not found")
        return httpx.Response(404, text="no route")

    def control(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/sandboxes":
            body = json.loads(request.content)
            self.created.append(body["templateID"])
            return httpx.Response(
                201,
                json={
                    "sandboxID": SANDBOX,
                    "templateID": body["templateID"],
                    "clientID": "c",
                    "envdVersion": "0.6.4",
                    "envdAccessToken": ENVD_TOKEN,
                    "trafficAccessToken": TRAFFIC_TOKEN,
                },
            )
        if request.method == "DELETE":
            self.killed.append(request.url.path.rsplit("/", 1)[-1])
            return httpx.Response(204)
        return httpx.Response(404, json={"code": 404, "message": "no route"})


@pytest.fixture
def endpoint() -> FakeEndpoint:
    return FakeEndpoint()


@pytest.fixture
def wire(endpoint: FakeEndpoint) -> Iterator[Wire]:
    with httpx.Client(transport=httpx.MockTransport(endpoint)) as http:
        yield Wire(http, DOMAIN, "e2b_" + "0" * 40)


CASES = [interpreter_health, interpreter_execute_ndjson, interpreter_statuses]


def test_the_interpreter_cases_are_registered_with_their_operations() -> None:
    by_name = {case.name: case for case in WIRE_CASES}
    assert "interpreter.health" in by_name["wire/interpreter/health"].operations
    assert "interpreter.execute" in by_name["wire/interpreter/execute-ndjson"].operations
    assert {"interpreter.contexts.remove", "interpreter.contexts.restart"} <= set(
        by_name["wire/interpreter/statuses"].operations
    )


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_a_conforming_interpreter_passes(case: Callable[[Wire], None], wire: Wire, endpoint: FakeEndpoint) -> None:
    case(wire)
    assert endpoint.created == ["code-interpreter-v1"]
    assert endpoint.killed == [SANDBOX], "the case kills its sandbox"
    for headers in endpoint.headers_seen:
        assert headers["X-Access-Token"] == ENVD_TOKEN, "the clients' headers, as the Python client sends them"


def _lines(change: Callable[[list[dict[str, Any]]], None]) -> bytes:
    lines = json.loads(json.dumps(GOOD_LINES))
    change(lines)
    return ndjson(lines)


NDJSON_FAULTS = {
    "no final newline": ndjson(GOOD_LINES)[:-1],
    "a blank line": ndjson(GOOD_LINES[:2]) + b"\n" + ndjson(GOOD_LINES[2:]),
    "a line that is not JSON": ndjson(GOOD_LINES[:2]) + b"out\n" + ndjson(GOOD_LINES[2:]),
    "a JSON array line": ndjson(GOOD_LINES[:2]) + b"[1]\n" + ndjson(GOOD_LINES[2:]),
    "the whole answer as one JSON array": json.dumps(GOOD_LINES).encode() + b"\n",
    "no end_of_execution": ndjson(GOOD_LINES[:-1]),
    "end_of_execution twice": ndjson([*GOOD_LINES, GOOD_LINES[-1]]),
    "a line after end_of_execution": ndjson([*GOOD_LINES, {"type": "keepalive"}]),
    "output before number_of_executions": ndjson([GOOD_LINES[1], GOOD_LINES[0], *GOOD_LINES[2:]]),
    "no number_of_executions": ndjson(GOOD_LINES[1:]),
    "execution_count not a number": _lines(lambda lines: lines[0].update(execution_count="1")),
    "stdout without timestamp": _lines(lambda lines: lines[1].pop("timestamp")),
    "stdout text changed": _lines(lambda lines: lines[1].update(text="out")),
    "result not main": _lines(lambda lines: lines[3].update(is_main_result=False)),
    "result missing": ndjson([line for line in GOOD_LINES if line["type"] != "result"]),
}


@pytest.mark.parametrize("body", NDJSON_FAULTS.values(), ids=NDJSON_FAULTS.keys())
def test_execute_framing_faults_are_named(body: bytes, wire: Wire, endpoint: FakeEndpoint) -> None:
    endpoint.execute_body = body
    with pytest.raises(WireMismatchError, match=r"POST https://49999-isbx1\.e2b\.test:8443/execute"):
        interpreter_execute_ndjson(wire)
    assert endpoint.killed == [SANDBOX], "the sandbox is killed after a mismatch too"


@pytest.mark.parametrize(
    "health",
    [httpx.Response(200, text="OK"), httpx.Response(200, json="Request was successful"), httpx.Response(204)],
    ids=["plain text", "another text", "no body"],
)
def test_health_faults_are_named(health: httpx.Response, wire: Wire, endpoint: FakeEndpoint) -> None:
    endpoint.health = health
    with pytest.raises(WireMismatchError, match="/health"):
        interpreter_health(wire)


@pytest.mark.parametrize(
    ("fault", "value"),
    [("both_status", 500), ("both_status", 200), ("unknown_status", 500), ("unknown_status", 400)],
)
def test_status_faults_are_named(fault: str, value: int, wire: Wire, endpoint: FakeEndpoint) -> None:
    setattr(endpoint, fault, value)
    with pytest.raises(WireMismatchError, match="the contract says"):
        interpreter_statuses(wire)


def test_a_context_list_without_python_is_named(wire: Wire, endpoint: FakeEndpoint) -> None:
    endpoint.contexts = [{"id": "k1", "language": "bash", "cwd": "/home/user"}]
    with pytest.raises(WireMismatchError, match="no python context"):
        interpreter_statuses(wire)


def test_the_traffic_token_is_sent_when_create_returned_one(wire: Wire, endpoint: FakeEndpoint) -> None:
    # The fake refuses requests without it with 403, as the edge does for a private sandbox.
    interpreter_health(wire)
    assert [h["E2B-Traffic-Access-Token"] for h in endpoint.headers_seen] == [TRAFFIC_TOKEN]
