"""Startup reconciliation: every (record state, runtime state) pair ends usable or cleanly gone."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reference_server import _reconcile
from reference_server._reconcile import DECISIONS, Decision, Seen, reconcile
from reference_server._records import SandboxDetails, SandboxRecord, SandboxState
from runtime.backend import BackendError, ReconcileReport, SandboxSpec, State

from .conftest import ALICE, Plane

pytestmark = pytest.mark.anyio


def test_every_state_and_runtime_view_has_a_decision() -> None:
    assert set(DECISIONS) == {(state, view) for state in SandboxState for view in Seen}


def test_the_docstring_table_is_the_decision_table() -> None:
    """The table a reader sees in the module docstring says what ``DECISIONS`` does."""
    doc = _reconcile.__doc__ or ""
    words = {"keep": Decision.KEEP, "release": Decision.RELEASE, "back to running": Decision.BACK_TO_RUNNING}
    words |= {"finish: paused": Decision.FINISH_PAUSE, "finish: init, run": Decision.FINISH_RESUME}
    words |= {"back to paused": Decision.BACK_TO_PAUSED, "to paused": Decision.TO_PAUSED}
    rows = {}
    for line in doc.splitlines():
        cells = [cell.strip() for cell in line.strip().split("  ") if cell.strip()]
        if cells and cells[0] in {str(state) for state in SandboxState}:
            rows[SandboxState(cells[0])] = cells[1:]
    assert rows, "the docstring has no decision table"
    for state, cells in rows.items():
        if len(cells) == 3:
            for view, cell in zip((Seen.RUNNING, Seen.IDLE, Seen.ABSENT), cells, strict=True):
                assert DECISIONS[(state, view)] is words[cell], (state, view)
        else:  # one decision for every runtime view, with a reason in brackets
            assert all(DECISIONS[(state, view)] is words[cells[0].split(" (")[0]] for view in Seen), state


async def _made(plane: Plane) -> SandboxRecord:
    created = await plane.create()
    record = await plane.store.get(created["sandboxID"])
    assert record is not None
    return record


async def _as(plane: Plane, record: SandboxRecord, *states: str) -> SandboxRecord:
    for state in states:
        record = await plane.store.compare_and_swap(
            record.sandbox_id, record.generation, {"state": SandboxState(state)}
        )
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
        # A host restart: the processes are gone, the files kept; the sandbox is paused, resumable.
        ((), State.PAUSED, "finished", "paused"),
        ((), State.STOPPED, "finished", "paused"),
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
        state=SandboxState.CREATING,
        created_at=now,
        expires_at=now + timedelta(seconds=60),
        details=SandboxDetails(envd_version="0.6.4"),
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


async def test_a_sandbox_whose_processes_ended_with_the_host_is_resumed_by_connect(plane: Plane) -> None:
    """After a host restart the runtime keeps the files (STOPPED); the client's connect boots it again."""
    record = await _made(plane)
    await _runtime(plane, record.sandbox_id, State.STOPPED)  # what the runtime's reconcile leaves
    result = await reconcile(plane.service)
    assert result.finished == (record.sandbox_id,)
    after = await plane.store.get(record.sandbox_id)
    assert after is not None
    assert after.state == "paused"
    assert after.details.address is None
    assert "host restart" in after.details.events[-1].message
    headers = {"X-API-Key": ALICE}
    connected = await plane.client.post(
        f"/sandboxes/{record.sandbox_id}/connect", json={"timeout": 60}, headers=headers
    )
    assert connected.status_code == 201, connected.text
    assert (await plane.backend.inspect(record.sandbox_id)).state is State.RUNNING


async def test_a_sandbox_the_runtime_set_aside_is_recorded_failed_until_its_files_are_removed(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = await _made(plane)
    await plane.backend.kill(record.sandbox_id)  # set aside: the runtime lists it no more
    failed = ReconcileReport((), (), (), (record.sandbox_id,))

    async def set_aside() -> ReconcileReport:
        return failed

    monkeypatch.setattr(plane.backend, "reconcile", set_aside)
    for _ in range(2):  # and again at the next start: still failed, never released
        result = await reconcile(plane.service)
        assert result.failed == (record.sandbox_id,)
        after = await plane.store.get(record.sandbox_id)
        assert after is not None
        assert after.state == "failed"
    answer = await plane.client.get(f"/sandboxes/{record.sandbox_id}", headers={"X-API-Key": ALICE})
    assert answer.status_code == 404
    failed = ReconcileReport((), ())  # the operator removed the kept files
    result = await reconcile(plane.service)
    assert result.released == (record.sandbox_id,)
    assert await plane.store.get(record.sandbox_id) is None


async def test_a_kill_the_runtime_fails_stays_killing_and_the_reaper_finishes_it(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = await _made(plane)
    real_kill = plane.backend.kill
    broken = True

    async def kill(sandbox_id: str) -> bool:
        if broken:
            raise BackendError("killing sandbox: umount: target is busy")
        return await real_kill(sandbox_id)

    monkeypatch.setattr(plane.backend, "kill", kill)
    answer = await plane.client.delete(f"/sandboxes/{record.sandbox_id}", headers={"X-API-Key": ALICE})
    assert answer.status_code == 500
    assert answer.json() == {"code": 500, "message": answer.json()["message"]}
    assert "busy" not in answer.text
    stuck = await plane.store.get(record.sandbox_id)
    assert stuck is not None, "never forgotten while the runtime holds it"
    assert stuck.state == "killing"
    assert await plane.service.reap() == []  # still failing: kept for the next sweep
    assert (await plane.store.get(record.sandbox_id)) is not None
    broken = False
    assert await plane.service.reap() == [record.sandbox_id]
    assert await plane.store.get(record.sandbox_id) is None
    assert await plane.backend.list() == []
