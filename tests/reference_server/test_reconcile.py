"""Startup reconciliation: every (record state, runtime state) pair ends usable or cleanly gone."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reference_server._reconcile import reconcile
from reference_server._store import SandboxRecord
from runtime._backend import SandboxSpec, State

from .conftest import Plane

pytestmark = pytest.mark.anyio


async def _made(plane: Plane) -> SandboxRecord:
    created = await plane.create()
    record = await plane.store.get(created["sandboxID"])
    assert record is not None
    return record


async def _as(plane: Plane, record: SandboxRecord, *states: str) -> SandboxRecord:
    for state in states:
        record = await plane.store.compare_and_swap(record.sandbox_id, record.generation, {"state": state})
    return record


async def _runtime(plane: Plane, sandbox_id: str, state: State | None) -> None:
    """Put the runtime's copy of a running sandbox into ``state`` (None: gone)."""
    if state is None:
        await plane.backend.kill(sandbox_id)
    elif state is State.PAUSED:
        await plane.backend.pause(sandbox_id, memory=True)
    elif state is State.STOPPED:
        await plane.backend.pause(sandbox_id, memory=False)


@pytest.mark.parametrize(
    ("record_states", "runtime", "outcome", "final"),
    [
        ((), State.RUNNING, "kept", "running"),
        ((), None, "released", None),
        ((), State.PAUSED, "released", None),
        (("pausing", "paused"), State.PAUSED, "kept", "paused"),
        (("pausing", "paused"), State.STOPPED, "kept", "paused"),
        (("pausing", "paused"), None, "released", None),
        (("pausing",), State.RUNNING, "finished", "running"),
        (("pausing",), State.PAUSED, "finished", "paused"),
        (("pausing", "paused", "resuming"), State.PAUSED, "finished", "paused"),
        (("pausing", "paused", "resuming"), State.RUNNING, "finished", "running"),
        (("killing",), State.RUNNING, "released", None),
        (("failed",), State.RUNNING, "released", None),
    ],
)
async def test_each_record_state_against_each_runtime_state(
    plane: Plane, record_states: tuple[str, ...], runtime: State | None, outcome: str, final: str | None
) -> None:
    record = await _as(plane, await _made(plane), *record_states)
    await _runtime(plane, record.sandbox_id, runtime)
    inits = len(plane.initializer.calls)
    result = await reconcile(plane.service)
    assert record.sandbox_id in getattr(result, outcome)
    after = await plane.store.get(record.sandbox_id)
    if final is None:
        assert after is None
        assert record.sandbox_id not in {info.sandbox_id for info in await plane.backend.list()}
    else:
        assert after is not None
        assert after.state == final
        assert (await plane.backend.inspect(record.sandbox_id)).state in (
            {State.RUNNING} if final == "running" else {State.PAUSED, State.STOPPED}
        )
    if record_states[-1:] == ("resuming",) and final == "running":
        assert len(plane.initializer.calls) == inits + 1, "a finished resume initializes the agent again"


async def test_a_create_the_client_never_saw_answered_is_released(plane: Plane) -> None:
    now = plane.clock()
    record = SandboxRecord(
        sandbox_id="halfmade",
        owner="alice",
        template_id="base",
        state="creating",
        created_at=now,
        expires_at=now + timedelta(seconds=60),
        data={"envd_version": "0.6.4"},
    )
    await plane.store.insert(record)
    await plane.backend.create(SandboxSpec("halfmade", "base"))
    await plane.backend.start("halfmade")
    result = await reconcile(plane.service)
    assert result.released == ("halfmade",)
    assert await plane.store.get("halfmade") is None
    assert await plane.backend.list() == []


async def test_runtime_sandboxes_nobody_recorded_are_killed(plane: Plane) -> None:
    kept = await _made(plane)
    await plane.backend.create(SandboxSpec("orphan", "base"))
    await plane.backend.start("orphan")
    result = await reconcile(plane.service)
    assert result.orphans == ("orphan",)
    assert result.kept == (kept.sandbox_id,)
    assert [info.sandbox_id for info in await plane.backend.list()] == [kept.sandbox_id]
