"""The warm pool: started sandboxes that creates claim, indistinguishable from booted ones.

On the fake backend with a recording initializer: filling within the pool's and the host's memory,
claims through the control plane (the id, the ``/init`` body and the runtime spec are a cold
create's), shapes that do not match, a claim refused by admission given back, a warm sandbox whose
agent is gone replaced under the same id, dead entries dropped, shedding while tenants hold the
budget, the interpreter's readiness probe, parallel claims, closing and a restart's reconciliation.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reference_server import _warm_pool
from reference_server._admission import AdmissionLimits
from reference_server._control_plane import create_control_plane
from reference_server._reconcile import reconcile
from reference_server._sandboxes import SandboxService
from reference_server._store import Store
from reference_server._warm_pool import Shape, WarmPool
from runtime.backend import BackendError, Limits, SandboxInfo, SandboxSpec, State
from runtime.fake import FakeBackend
from runtime.templates import INTERPRETER_TEMPLATE

from .conftest import ALICE, Clock, DictKeys, RecordingInitializer, plane_settings, sandbox_service

pytestmark = pytest.mark.anyio

A = {"X-API-Key": ALICE}
BASE = Shape("base", Limits(cpu_count=2, memory_mb=512, disk_mb=2048))
ROOMY = AdmissionLimits(host_memory_mb=100_000, memory_overcommit=1.0)


class CountingBackend(FakeBackend):
    """The fake backend, counting creates (a claim must not make one) and able to hold starts."""

    def __init__(self) -> None:
        super().__init__({"base": {}, INTERPRETER_TEMPLATE: {}})
        self.created: list[SandboxSpec] = []
        self.hold = asyncio.Event()
        self.hold.set()

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        self.created.append(spec)
        return await super().create(spec)

    async def start(self, sandbox_id: str) -> SandboxInfo:
        await self.hold.wait()
        return await super().start(sandbox_id)

    def running(self) -> set[str]:
        return {sid for sid, sandbox in self._sandboxes.items() if sandbox.state is State.RUNNING}


@dataclass
class Pool:
    client: httpx.AsyncClient
    service: SandboxService
    backend: CountingBackend
    initializer: RecordingInitializer
    store: Store

    @property
    def pool(self) -> WarmPool:
        return self.service.pool

    def warm_ids(self) -> set[str]:
        return {warm.sandbox_id for entries in self.pool._ready.values() for warm in entries}

    async def create(self, **body: Any) -> httpx.Response:
        return await self.client.post(
            "/sandboxes", json={"templateID": "base", "timeout": 300, "secure": True, **body}, headers=A
        )


async def _pool(
    tmp_path: Path,
    warm: Mapping[str, int],
    *,
    memory_mb: int = 4096,
    admission: AdmissionLimits = ROOMY,
    initializer: RecordingInitializer | None = None,
    store: Store | None = None,
    backend: CountingBackend | None = None,
) -> Pool:
    store = store or await Store.open(tmp_path / "server.db")
    backend = backend or CountingBackend()
    initializer = initializer or RecordingInitializer()
    settings = plane_settings(
        templates=frozenset({"base", INTERPRETER_TEMPLATE}),
        template_memory_mb={INTERPRETER_TEMPLATE: 2048},
        warm_pool=dict(warm),
        warm_pool_memory_mb=memory_mb,
        admission=admission,
    )
    service = sandbox_service(store, backend, Clock(), initializer, settings=settings)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_control_plane(service, DictKeys())), base_url="https://api.e2b.test"
    )
    return Pool(client, service, backend, initializer, store)


@pytest.fixture
async def warm2(tmp_path: Path) -> AsyncIterator[Pool]:
    pool = await _pool(tmp_path, {"base": 2})
    await pool.pool.sweep()
    yield pool
    await pool.client.aclose()
    await pool.pool.aclose()
    await pool.store.close()


async def test_a_sweep_fills_the_pool_with_running_sandboxes_nobody_owns(warm2: Pool) -> None:
    assert warm2.pool.ready() == {BASE: 2}
    assert warm2.backend.running() == warm2.warm_ids()
    assert await warm2.store.all(["creating", "running"]) == []  # no record: nobody can see them
    assert warm2.initializer.calls == []  # no /init before a create's own
    for spec in warm2.backend.created:
        assert spec.hostname == spec.sandbox_id
        assert spec == BASE.spec(spec.sandbox_id)
    await warm2.pool.sweep()
    assert len(warm2.backend.created) == 2  # full: nothing more started


async def test_a_create_claims_a_warm_sandbox_and_initializes_it_as_a_cold_one(warm2: Pool, tmp_path: Path) -> None:
    warm = set(warm2.warm_ids())
    response = await warm2.create(envVars={"A": "1"}, metadata={"m": "x"})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["sandboxID"] in warm
    assert len(warm2.backend.created) == 2  # claimed, not booted
    (call,) = warm2.initializer.calls
    assert call[2]["envVars"] == {"A": "1"}
    assert call[2]["accessToken"] == body["envdAccessToken"]

    (tmp_path / "cold").mkdir()
    cold = await _pool(tmp_path / "cold", {})
    try:
        cold_body = (await cold.create(envVars={"A": "1"}, metadata={"m": "x"})).json()
        (cold_call,) = cold.initializer.calls
        # Everything a client or the agent sees has the same form; the runtime got the same spec.
        assert set(cold_body) == set(body)
        assert set(cold_call[2]) == set(call[2])
        assert {k: v for k, v in cold_call[2].items() if k not in {"accessToken", "timestamp"}} == {
            k: v for k, v in call[2].items() if k not in {"accessToken", "timestamp"}
        }
        (cold_spec,) = cold.backend.created
        claimed = next(spec for spec in warm2.backend.created if spec.sandbox_id == body["sandboxID"])
        assert claimed == BASE.spec(body["sandboxID"])
        # A cold create also publishes its token's hash (runtime.agent._metadata); a warm sandbox
        # was made before its token existed, and its agent takes the first /init's.
        token_hash = hashlib.sha512(cold_body["envdAccessToken"].encode()).hexdigest()
        assert cold_spec == BASE.spec(cold_body["sandboxID"], access_token_hash=token_hash)
    finally:
        await cold.client.aclose()
        await cold.store.close()

    await warm2.pool.sweep()  # the claim woke the refill: two warm again, besides the claimed one
    assert warm2.pool.ready() == {BASE: 2}
    assert body["sandboxID"] not in warm2.warm_ids()
    assert len(warm2.backend.running()) == 3
    assert (warm2.pool.claims, warm2.pool.misses) == (1, 0)


async def test_creates_of_another_shape_boot_their_own(warm2: Pool) -> None:
    warm = set(warm2.warm_ids())
    response = await warm2.create(network={"denyOut": ["10.0.0.0/8"]})
    assert response.status_code == 201, response.text
    assert response.json()["sandboxID"] not in warm
    assert warm2.warm_ids() == warm
    assert len(warm2.backend.created) == 3


async def test_a_claim_refused_by_admission_is_given_back(tmp_path: Path) -> None:
    pool = await _pool(tmp_path, {"base": 1}, admission=AdmissionLimits(owner_max_running=1, host_memory_mb=100_000))
    try:
        await pool.pool.sweep()
        first = await pool.create()
        assert first.status_code == 201
        await pool.pool.sweep()
        (waiting,) = pool.warm_ids()
        refused = await pool.create()
        assert refused.status_code == 429, refused.text
        assert pool.warm_ids() == {waiting}  # still offered: the next create gets it
        assert [r.sandbox_id for r in await pool.store.all(["creating", "running"])] == [first.json()["sandboxID"]]
        await pool.client.delete(f"/sandboxes/{first.json()['sandboxID']}", headers=A)
        again = await pool.create()
        assert again.json()["sandboxID"] == waiting
    finally:
        await pool.client.aclose()
        await pool.pool.aclose()
        await pool.store.close()


@dataclass
class FailingOnce(RecordingInitializer):
    failures: int = 1

    async def __call__(self, host: str, port: int, body: Mapping[str, Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise BackendError("agent did not answer")
        await super().__call__(host, port, body)


async def test_a_warm_sandbox_whose_agent_is_gone_is_booted_again_under_its_id(tmp_path: Path) -> None:
    pool = await _pool(tmp_path, {"base": 1}, initializer=FailingOnce())
    try:
        await pool.pool.sweep()
        (warm,) = pool.warm_ids()
        response = await pool.create()
        assert response.status_code == 201, response.text
        assert response.json()["sandboxID"] == warm
        assert [spec.sandbox_id for spec in pool.backend.created] == [warm, warm]  # killed, then booted
        assert len(pool.initializer.calls) == 1
        assert pool.backend.running() == {warm}
    finally:
        await pool.client.aclose()
        await pool.pool.aclose()
        await pool.store.close()


async def test_a_sweep_drops_warm_sandboxes_that_stopped_running(warm2: Pool) -> None:
    gone = sorted(warm2.warm_ids())[0]
    await warm2.backend.kill(gone)  # behind the pool's back (an OOM, a crash)
    await warm2.pool.sweep()
    assert gone not in warm2.warm_ids()
    assert warm2.pool.ready() == {BASE: 2}
    assert warm2.backend.running() == warm2.warm_ids()


async def test_the_pool_stays_within_its_own_memory(tmp_path: Path) -> None:
    pool = await _pool(tmp_path, {"base": 3}, memory_mb=1024)
    try:
        await pool.pool.sweep()
        assert pool.pool.ready() == {BASE: 2}
        assert pool.pool.held_mb == 1024
    finally:
        await pool.pool.aclose()
        await pool.client.aclose()
        await pool.store.close()


async def test_tenants_never_count_the_pool_and_it_sheds_while_they_hold_the_budget(tmp_path: Path) -> None:
    # A host of 1536 MiB: three sandboxes of 512. The pool takes two while the host is idle.
    pool = await _pool(tmp_path, {"base": 2}, admission=AdmissionLimits(host_memory_mb=1536, memory_overcommit=1.0))
    try:
        await pool.pool.sweep()
        assert pool.pool.ready() == {BASE: 2}
        # Two creates with egress lists (another shape) take 1024 MiB: admitted, the pool's not counted.
        for _ in range(2):
            created = await pool.create(network={"denyOut": ["10.0.0.0/8"]})
            assert created.status_code == 201, created.text
        assert await pool.service.admission.over_budget()
        await pool.pool.sweep()
        assert pool.pool.ready() == {BASE: 1}  # shed to fit: 3 x 512
        assert not await pool.service.admission.over_budget()
        # A third tenant sandbox: claims the warm one, and nothing is started while there is no room.
        third = await pool.create()
        assert third.status_code == 201, third.text
        await pool.pool.sweep()
        assert pool.pool.ready() == {}
        assert len(pool.backend.running()) == 3
        refused = await pool.create()
        assert refused.status_code == 429  # the host is full for tenants too
    finally:
        await pool.pool.aclose()
        await pool.client.aclose()
        await pool.store.close()


async def test_an_interpreter_sandbox_is_offered_once_its_probe_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = [False, False, True]
    asked: list[tuple[int, str]] = []

    async def probe(host: str, port: int, path: str) -> bool:
        asked.append((port, path))
        return answers.pop(0)

    pool = await _pool(tmp_path, {INTERPRETER_TEMPLATE: 1})
    pool.pool._probe = probe
    monkeypatch.setattr(_warm_pool, "PROBE_STEP_S", 0.0)
    try:
        await pool.pool.sweep()
        shape = Shape(INTERPRETER_TEMPLATE, Limits(cpu_count=2, memory_mb=2048, disk_mb=2048))
        assert pool.pool.ready() == {shape: 1}
        assert len(asked) == 3
        assert set(asked) == {_warm_pool.PROBES[INTERPRETER_TEMPLATE]}
    finally:
        await pool.pool.aclose()
        await pool.client.aclose()
        await pool.store.close()


async def test_a_sandbox_whose_probe_never_answers_is_killed_and_the_shape_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never(host: str, port: int, path: str) -> bool:
        return False

    pool = await _pool(tmp_path, {INTERPRETER_TEMPLATE: 1})
    pool.pool._probe = never
    monkeypatch.setattr(_warm_pool, "PROBE_TIMEOUT_S", 0.05)
    monkeypatch.setattr(_warm_pool, "PROBE_STEP_S", 0.01)
    try:
        await pool.pool.sweep()
        assert pool.pool.ready() == {}
        assert pool.backend.running() == set()
        assert pool.pool.held_mb == 0
        await pool.pool.sweep()  # within the back-off: no second try
        assert len(pool.backend.created) == 1
    finally:
        await pool.pool.aclose()
        await pool.client.aclose()
        await pool.store.close()


async def test_parallel_creates_each_get_a_sandbox_of_their_own(warm2: Pool) -> None:
    warm = set(warm2.warm_ids())
    responses = await asyncio.gather(*(warm2.create() for _ in range(10)))
    assert [r.status_code for r in responses] == [201] * 10
    ids = [r.json()["sandboxID"] for r in responses]
    assert len(set(ids)) == 10
    assert set(ids) & warm == warm  # both warm ones claimed, once each
    assert warm2.backend.running() == set(ids)
    assert len(warm2.backend.created) == 2 + 8


async def test_a_cancelled_refill_lets_its_start_finish_and_closing_kills_it(tmp_path: Path) -> None:
    """A runtime start cut off midway could leave half a sandbox (its threads run on): it is never cancelled."""
    pool = await _pool(tmp_path, {"base": 1})
    pool.backend.hold.clear()
    try:
        task = asyncio.create_task(pool.pool.run())
        while not pool.backend.created:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        closing = asyncio.create_task(pool.pool.aclose())
        await asyncio.sleep(0.05)
        assert not closing.done()  # waits for the start under way
        pool.backend.hold.set()
        await closing
        assert pool.backend.running() == set()
        assert pool.backend._sandboxes == {}
        assert pool.pool.held_mb == 0
        assert pool.service.admission._warm == {}
    finally:
        await pool.client.aclose()
        await pool.store.close()


async def test_closing_stops_a_start_that_waits_for_its_probe(tmp_path: Path) -> None:
    async def never(host: str, port: int, path: str) -> bool:
        return False

    pool = await _pool(tmp_path, {INTERPRETER_TEMPLATE: 1})
    pool.pool._probe = never
    try:
        task = asyncio.create_task(pool.pool.run())
        while not pool.backend.running():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        async with asyncio.timeout(5):  # not the probe's 60 s
            await pool.pool.aclose()
        assert pool.backend._sandboxes == {}
        assert pool.service.admission._warm == {}
    finally:
        await pool.client.aclose()
        await pool.store.close()


async def test_closing_kills_every_warm_sandbox(warm2: Pool) -> None:
    await warm2.pool.aclose()
    assert warm2.backend._sandboxes == {}
    assert warm2.service.admission._warm == {}
    assert warm2.pool.claim(BASE) is None


async def test_after_a_crash_reconciliation_kills_the_warm_sandboxes(tmp_path: Path) -> None:
    first = await _pool(tmp_path, {"base": 2})
    await first.pool.sweep()
    warm = first.warm_ids()
    await first.client.aclose()  # killed: the pool is never closed
    second = await _pool(tmp_path, {"base": 2}, store=first.store, backend=first.backend)
    try:
        report = await reconcile(second.service)
        assert set(report.orphans) == warm
        assert second.backend.running() == set()
    finally:
        await second.client.aclose()
        await second.store.close()


async def test_a_claim_wakes_the_refill_at_once(warm2: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_warm_pool, "REFILL_INTERVAL_S", 3600.0)
    task = asyncio.create_task(warm2.pool.run())
    try:
        await asyncio.sleep(0.05)  # the first sweep: full already
        assert (await warm2.create()).status_code == 201
        async with asyncio.timeout(5):
            while warm2.pool.ready() != {BASE: 2}:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
