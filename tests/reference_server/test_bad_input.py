"""Hostile input to the control plane: each is a 400 naming the field, nothing is stored, and later requests work.

The bodies are sent as raw bytes, so that what no client library would send (lone surrogates,
``NaN``, ``1e999``, 10 000 levels of nesting, bytes that are not UTF-8) reaches the server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_server import _requests
from reference_server._admission import Admission, AdmissionLimits

from .conftest import ALICE, Plane

pytestmark = pytest.mark.anyio

A = {"X-API-Key": ALICE, "content-type": "application/json"}
SECRET = "s3cr3t-Value-7f"  # put in every value the tests send, to show it is never echoed


def raw(**fields: Any) -> bytes:
    """A create body written with escapes only (so lone surrogates survive as ``\\udXXX``)."""
    return json.dumps({"templateID": "base", **fields}).encode()


async def state(plane: Plane) -> tuple[object, ...]:
    """Everything a refused request must leave alone: records (with generations), snapshots, sandboxes."""
    records = sorted((r.sandbox_id, r.generation, str(r.state), r.expires_at) for r in await plane.store.all())
    page = await plane.service.snapshots.list("alice", sandbox_id=None, limit=100, after=None)
    snapshots = sorted((s.snapshot_id, s.names) for s in page.records)
    sandboxes = sorted((info.sandbox_id, str(info.state)) for info in await plane.backend.list())
    return tuple(records), tuple(snapshots), tuple(sandboxes)


def refused_400(response: httpx.Response, *names: str) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == 400
    message = str(body["message"])
    assert message
    assert SECRET not in message
    for name in names:
        assert name in message, message
    return message


DEEP = b'{"templateID":"base","metadata":' + b"[" * 10_000 + b"]" * 10_000 + b"}"
CREATE_CASES: list[tuple[str, bytes, tuple[str, ...]]] = [
    ("timeout negative", raw(timeout=-1), ("imeout",)),
    ("timeout above int64", raw(timeout=2**63), ("imeout",)),
    ("timeout huge integer", b'{"templateID":"base","timeout":' + b"9" * 5000 + b"}", ("timeout", "out of range")),
    ("timeout fraction", raw(timeout=1.5), ("timeout",)),
    ("timeout float form", raw(timeout=10.0), ("timeout",)),
    ("timeout boolean", raw(timeout=True), ("timeout",)),
    ("timeout 1e999", b'{"templateID":"base","timeout":1e999}', ("timeout", "out of range")),
    ("timeout NaN", b'{"templateID":"base","timeout":NaN}', ("timeout", "NaN")),
    ("timeout -Infinity", b'{"templateID":"base","timeout":-Infinity}', ("timeout", "Infinity")),
    ("env name empty", raw(envVars={"": SECRET}), ("envVars", "empty")),
    ("env name with =", raw(envVars={"A=B": SECRET}), ("envVars", "'='")),
    ("env name with NUL", raw(envVars={"A\x00": SECRET}), ("envVars", "NUL")),
    ("env value with NUL", raw(envVars={"A": SECRET + "\x00"}), ("envVars/A", "NUL")),
    ("env value lone surrogate", raw(envVars={"A": SECRET + "\ud800"}), ("envVars/A", "surrogate")),
    ("env name lone surrogate", raw(envVars={"\udfff": SECRET}), ("envVars", "surrogate")),
    ("metadata key NUL", raw(metadata={"k\x00": SECRET}), ("metadata", "NUL")),
    ("metadata key surrogate", raw(metadata={"\udc00": SECRET}), ("metadata", "surrogate")),
    ("metadata value surrogate", raw(metadata={"k": SECRET + "\ud800"}), ("metadata/k", "surrogate")),
    ("template surrogate", raw(templateID="\ud800"), ("templateID", "surrogate")),
    ("template NUL", raw(templateID="ba\x00se"), ("templateID", "NUL")),
    ("netmask form", raw(network={"denyOut": ["10.0.0.0/255.0.0.0"]}), ("network/denyOut",)),
    ("host mask form", raw(network={"allowOut": ["10.0.0.0/0.255.255.255"]}), ("network/allowOut",)),
    ("prefix 33", raw(network={"denyOut": ["10.0.0.1/33"]}), ("network/denyOut",)),
    ("prefix with leading zero", raw(network={"denyOut": ["10.0.0.0/08"]}), ("network/denyOut",)),
    ("address leading zero", raw(network={"denyOut": ["010.0.0.1"]}), ("network/denyOut",)),
    ("prefix with spaces", raw(network={"denyOut": ["10.0.0.0/ 8"]}), ("network/denyOut",)),
    ("IPv6 range", raw(network={"denyOut": ["::/0"]}), ("network/denyOut", "IPv4")),
    ("too many ranges", raw(network={"denyOut": ["10.0.0.1"] * 1025}), ("network/denyOut", "1024")),
    ("mask host surrogate", raw(network={"maskRequestHost": "\ud800"}), ("maskRequestHost",)),
    ("nested 10 000 deep", DEEP, ("nested",)),
    ("object nested 10 000 deep", b'{"a":' * 10_000 + b"1" + b"}" * 10_000, ("nested",)),
    ("nested 40 deep", b'{"templateID":"base","metadata":{"k":' + b"[" * 40 + b"]" * 40 + b"}}", ("nested",)),
    ("not UTF-8", b'{"templateID":"base","metadata":{"k":"\xff"}}', ("UTF-8",)),
    ("UTF-16", '{"templateID":"base"}'.encode("utf-16"), ("UTF-8",)),
    ("duplicate keys, last one bad", b'{"templateID":"base","timeout":10,"timeout":-5}', ("imeout",)),
]


@pytest.mark.parametrize(("body", "names"), [case[1:] for case in CREATE_CASES], ids=[case[0] for case in CREATE_CASES])
@pytest.mark.parametrize("path", ["/sandboxes", "/v2/sandboxes"])
async def test_bad_create_bodies_are_400_and_store_nothing(
    plane: Plane, path: str, body: bytes, names: tuple[str, ...]
) -> None:
    existing = (await plane.create())["sandboxID"]
    before = await state(plane)
    refused_400(await plane.client.post(path, content=body, headers=A), *names)
    assert await state(plane) == before
    listed = await plane.client.get("/v2/sandboxes", headers=A)  # a stored bad value would break this
    assert listed.status_code == 200
    assert [item["sandboxID"] for item in listed.json()] == [existing]
    assert (await plane.client.post(path, content=raw(timeout=60, envVars={"A": "1"}), headers=A)).status_code == 201


async def test_accepted_edge_cases(plane: Plane) -> None:
    """What upstream takes: host bits set (the network is meant), timeout 0 (expires at once), unicode."""
    body = raw(network={"denyOut": ["10.0.0.1/8", "0.0.0.0/0", "192.168.1.1"]}, metadata={"k": "é✓"})
    assert (await plane.client.post("/sandboxes", content=body, headers=A)).status_code == 201
    assert (await plane.client.post("/sandboxes", content=raw(timeout=0), headers=A)).status_code == 201
    assert (await plane.client.post("/sandboxes", content=raw(envVars={"_a.b-c": "x=y"}), headers=A)).status_code == 201


SANDBOX_CASES: list[tuple[str, str, str, bytes, tuple[str, ...]]] = [
    ("timeout negative", "POST", "/timeout", b'{"timeout":-1}', ("imeout",)),
    ("timeout 1e999", "POST", "/timeout", b'{"timeout":1e999}', ("timeout", "out of range")),
    ("timeout NaN", "POST", "/timeout", b'{"timeout":NaN}', ("NaN",)),
    ("timeout 2**70", "POST", "/timeout", b'{"timeout":%d}' % 2**70, ("imeout",)),
    ("timeout float form", "POST", "/timeout", b'{"timeout":1.0}', ("timeout",)),
    ("refresh NaN", "POST", "/refreshes", b'{"duration":NaN}', ("duration", "NaN")),
    ("refresh 1e999", "POST", "/refreshes", b'{"duration":1e999}', ("duration", "out of range")),
    ("refresh huge", "POST", "/refreshes", b'{"duration":1e300}', ("imeout",)),
    ("connect 1e999", "POST", "/connect", b'{"timeout":1e999}', ("timeout", "out of range")),
    ("connect float form", "POST", "/connect", b'{"timeout":60.0}', ("timeout",)),
    ("connect 2**70", "POST", "/connect", b'{"timeout":%d}' % 2**70, ("imeout",)),
    ("resume NaN", "POST", "/resume", b'{"timeout":NaN}', ("NaN",)),
    ("resume float form", "POST", "/resume", b'{"timeout":60.0}', ("timeout",)),
    ("network netmask", "PUT", "/network", b'{"denyOut":["10.0.0.0/255.0.0.0"]}', ("denyOut",)),
    ("network surrogate", "PUT", "/network", b'{"allowOut":["\\ud800"]}', ("allowOut",)),
    ("snapshot name surrogate", "POST", "/snapshots", b'{"name":"\\ud800"}', ("name", "surrogate")),
    ("snapshot name NUL", "POST", "/snapshots", b'{"name":"a\\u0000"}', ("name", "NUL")),
    ("snapshot name long", "POST", "/snapshots", json.dumps({"name": "a" * 257}).encode(), ("name", "256")),
    ("pause nested 10 000 deep", "POST", "/pause", b"[" * 10_000 + b"]" * 10_000, ("nested",)),
]


@pytest.mark.parametrize(
    ("method", "suffix", "body", "names"), [case[1:] for case in SANDBOX_CASES], ids=[case[0] for case in SANDBOX_CASES]
)
async def test_bad_bodies_for_one_sandbox_are_400_and_change_nothing(
    plane: Plane, method: str, suffix: str, body: bytes, names: tuple[str, ...]
) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    before = await state(plane)
    refused_400(await plane.client.request(method, f"/sandboxes/{sandbox_id}{suffix}", content=body, headers=A), *names)
    assert await state(plane) == before
    assert (await plane.client.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 30}, headers=A)).is_success


QUERY_CASES = [
    ("/v2/sandboxes", "limit=0", "limit"),
    ("/v2/sandboxes", "limit=-1", "limit"),
    ("/v2/sandboxes", "limit=99999999999999999999999", "limit"),
    ("/v2/sandboxes", "limit=" + "9" * 5000, "limit"),
    ("/v2/sandboxes", "limit=abc", "limit"),
    ("/v2/sandboxes", "limit=1e999", "limit"),
    ("/v2/sandboxes", "limit=1e1", "limit"),
    ("/v2/sandboxes", "limit=10.0", "limit"),
    ("/v2/sandboxes", "limit=%D9%A1", "limit"),  # ARABIC-INDIC DIGIT ONE: int() would take it
    ("/v2/sandboxes", "limit=1_0", "limit"),
    ("/v2/sandboxes", "limit=nan", "limit"),
    ("/v2/sandboxes", "nextToken=%00%ff", "query string"),
    ("/v2/sandboxes", "nextToken=" + "A" * 5000, "cursor"),
    ("/v2/sandboxes", "nextToken=garbage!", "cursor"),
    ("/v2/sandboxes", "metadata=%ff%fe", "query string"),
    ("/v2/sandboxes", "metadata=a%3D%25ff", "metadata"),  # the inner layer is not UTF-8
    ("/v2/sandboxes", "metadata=novalue", "metadata"),
    ("/snapshots", "limit=1e999", "limit"),
    ("/snapshots", "nextToken=%ff", "query string"),
    ("/sandboxes/{id}/metrics", "start=1e999", "start"),
    ("/sandboxes/{id}/metrics", "end=-1", "end"),
    ("/sandboxes/{id}/logs", "limit=1e999", "limit"),
    ("/v2/sandboxes/{id}/logs", "limit=1e999", "limit"),
    ("/v2/sandboxes/{id}/logs", "cursor=inf", "cursor"),
]


@pytest.mark.parametrize(("path", "query", "name"), QUERY_CASES)
async def test_bad_queries_are_400(plane: Plane, path: str, query: str, name: str) -> None:
    sandbox_id = (await plane.create())["sandboxID"]
    before = await state(plane)
    response = await plane.client.get(f"{path.format(id=sandbox_id)}?{query}", headers=A)
    refused_400(response, name)
    assert await state(plane) == before
    assert (await plane.client.get(path.format(id=sandbox_id), headers=A)).status_code == 200


# -- a property: hostile bodies never give 5xx, and a 4xx changes nothing --------------------------

HOSTILE_TEXT = st.text(
    alphabet=st.sampled_from(["a", "=", "\x00", "\ud800", "\udfff", "é", "/", ".", "1", " ", "\n", "\ufffd"]),
    max_size=8,
)
HOSTILE_NUMBER = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 2**31, 2**63, 10.0, 1.5]),
)
SCALAR = st.one_of(st.none(), st.booleans(), HOSTILE_NUMBER, HOSTILE_TEXT)
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(HOSTILE_TEXT, inner, max_size=3),
    max_leaves=8,
)
NETWORK = st.fixed_dictionaries(
    {},
    optional={
        "allowOut": st.lists(st.sampled_from(["10.0.0.0/8", "10.0.0.0/255.0.0.0", "1.2.3.4/33", "::1"]) | HOSTILE_TEXT),
        "denyOut": st.lists(st.sampled_from(["0.0.0.0/0", "10.0.0.1/8", "300.1.1.1"]) | HOSTILE_TEXT),
        "maskRequestHost": HOSTILE_TEXT,
    },
)
CREATE_BODY = st.fixed_dictionaries(
    {"templateID": st.sampled_from(["base"]) | HOSTILE_TEXT},
    optional={
        "timeout": HOSTILE_NUMBER | VALUE,
        "envVars": st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=3) | VALUE,
        "metadata": st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=3) | VALUE,
        "secure": VALUE,
        "network": NETWORK | VALUE,
    },
)
SPLICES = st.sampled_from([b"", b"NaN", b"1e999", b"-Infinity", b"\xff", b"[" * 2000, b'"\\ud800"', b"9" * 30])


async def test_hostile_bodies_never_5xx_and_a_refusal_stores_nothing(plane: Plane) -> None:
    roomy = AdmissionLimits(
        owner_max_running=10**6, owner_create_burst=10**6, max_sandboxes=10**6, host_memory_mb=10**9
    )
    plane.service.admission = Admission(roomy, plane.store)  # only the input decides here

    async def attempt(body: bytes) -> None:
        before = await state(plane)
        response = await plane.client.post("/sandboxes", content=body, headers=A)
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            assert response.json()["code"] == response.status_code
            assert await state(plane) == before
        listed = await plane.client.get("/v2/sandboxes", headers=A)
        assert listed.status_code == 200, listed.text

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=CREATE_BODY, splice=SPLICES, where=st.integers(min_value=0, max_value=40))
    def examples(body: dict[str, Any], splice: bytes, where: int) -> None:
        text = json.dumps(body).encode()  # escapes only: surrogates arrive as \udXXX
        if splice:
            text = text[:where] + splice + text[where:]
        anyio.from_thread.run(attempt, text)

    await anyio.to_thread.run_sync(examples)
    assert (await plane.client.post("/sandboxes", content=raw(), headers=A)).status_code == 201


async def test_a_body_that_stalls_is_408_and_stores_nothing(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_requests, "BODY_TIMEOUT_S", 0.2)

    async def stalls() -> AsyncIterator[bytes]:
        yield b'{"templateID": "base",'
        await asyncio.sleep(30)
        yield b' "timeout": 60}'

    answer = await plane.client.post("/sandboxes", content=stalls(), headers=A)
    assert answer.status_code == 408, answer.text
    assert answer.json() == {"code": 408, "message": "The request body did not arrive within 0.2 s"}
    assert await plane.store.all() == []
    assert (await plane.client.post("/sandboxes", json={"templateID": "base"}, headers=A)).status_code == 201
