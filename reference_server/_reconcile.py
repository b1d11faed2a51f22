"""Startup reconciliation: make the store and the runtime agree after any kind of stop.

The server may have been killed between writing a record and acting on the runtime (or the
other way round). On start, before it answers anything, every record is compared with what the
runtime has and settled by the table ``DECISIONS`` (record state and what the runtime has →
decision), which reads:

    record      runtime RUNNING      runtime PAUSED/STOPPED    runtime absent/other
    running     keep                 to paused                 release
    paused      release              keep                      release
    pausing     back to running      finish: paused            release
    resuming    finish: init, run    back to paused            release
    creating    release (the client never got an answer: nobody knows the sandbox)
    killing     release (finish the kill)
    failed      release

"release" kills what the runtime has and deletes the record, so the sandbox is cleanly gone;
"keep" and "finish" leave it usable. "to paused" is a host restart: the runtime kept the files of a
running sandbox whose processes ended with the host, so it is recorded paused (E2B's nearest state),
and a resume or connect boots it afresh on those files. A sandbox the runtime could not re-create
at all (``ReconcileReport.failed``: a layer it needs is gone) is recorded failed, whatever the table
says, and answered as missing; the runtime keeps its files aside for the operator, and once they are
removed there the next start releases the record. A decision that cannot be carried out (the agent does not
answer ``/init``, the record moved on) falls back to release. A runtime sandbox with no record at
all is an orphan and is killed. The runtime reconciles its own resources first (half-made mounts,
networks, bundles).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from runtime.backend import SandboxInfo, SandboxRuntimeError, State

from ._errors import ApiError
from ._events import append_event
from ._records import SandboxRecord, SandboxState
from ._sandboxes import SandboxService

__all__ = ["DECISIONS", "Decision", "Reconciliation", "Seen", "reconcile", "seen"]

log = logging.getLogger(__name__)


class Seen(enum.Enum):
    """What the runtime has for a record's sandbox."""

    RUNNING = "running"
    IDLE = "paused or stopped"
    ABSENT = "absent or other"


class Decision(enum.Enum):
    KEEP = "keep"
    BACK_TO_RUNNING = "back to running"  # an interrupted pause that never reached the runtime
    TO_PAUSED = "to paused"  # its processes ended with the host; the runtime kept its files
    FINISH_PAUSE = "finish: paused"
    BACK_TO_PAUSED = "back to paused"  # an interrupted resume that never reached the runtime
    FINISH_RESUME = "finish: init, run"
    RELEASE = "release"


def seen(info: SandboxInfo | None) -> Seen:
    if info is None:
        return Seen.ABSENT
    if info.state is State.RUNNING:
        return Seen.RUNNING
    if info.state in (State.PAUSED, State.STOPPED):
        return Seen.IDLE
    return Seen.ABSENT


_S, _D = SandboxState, Decision
# The table of the module docstring, as data. Every (state, seen) pair has a decision.
DECISIONS: dict[tuple[SandboxState, Seen], Decision] = {
    (_S.RUNNING, Seen.RUNNING): _D.KEEP,
    (_S.RUNNING, Seen.IDLE): _D.TO_PAUSED,
    (_S.RUNNING, Seen.ABSENT): _D.RELEASE,
    (_S.PAUSED, Seen.RUNNING): _D.RELEASE,
    (_S.PAUSED, Seen.IDLE): _D.KEEP,
    (_S.PAUSED, Seen.ABSENT): _D.RELEASE,
    (_S.PAUSING, Seen.RUNNING): _D.BACK_TO_RUNNING,
    (_S.PAUSING, Seen.IDLE): _D.FINISH_PAUSE,
    (_S.PAUSING, Seen.ABSENT): _D.RELEASE,
    (_S.RESUMING, Seen.RUNNING): _D.FINISH_RESUME,
    (_S.RESUMING, Seen.IDLE): _D.BACK_TO_PAUSED,
    (_S.RESUMING, Seen.ABSENT): _D.RELEASE,
    **{(state, view): _D.RELEASE for state in (_S.CREATING, _S.KILLING, _S.FAILED, _S.KILLED) for view in Seen},
}
# How each decision is reported; the others count as "finished".
_OUTCOME = {_D.KEEP: "kept", _D.RELEASE: "released"}
_FAILED = "sandbox failed: it could not be re-created after a host restart; its files are kept for the operator"
_RESTARTED = "sandbox paused: its processes ended with a host restart; resuming starts it again on its files"


@dataclass(frozen=True)
class Reconciliation:
    kept: tuple[str, ...]
    finished: tuple[str, ...]  # an interrupted pause or resume completed or rolled back
    released: tuple[str, ...]  # records whose sandbox is now gone
    orphans: tuple[str, ...]  # runtime sandboxes with no record, killed
    failed: tuple[str, ...] = ()  # records marked failed: the runtime could not re-create them (files kept)


async def reconcile(service: SandboxService) -> Reconciliation:
    report = await service.backend.reconcile()
    runtime = {info.sandbox_id: info for info in await service.backend.list()}
    kept: list[str] = []
    finished: list[str] = []
    released: list[str] = []
    failed: list[str] = []
    for record in await service.store.all():
        info = runtime.pop(record.sandbox_id, None)
        async with service.lock(record.sandbox_id):
            if record.sandbox_id in report.failed and info is None:
                outcome = await _mark_failed(service, record)
            else:
                outcome = await _settle(service, record, info)
        {"kept": kept, "finished": finished, "released": released, "failed": failed}[outcome].append(record.sandbox_id)
    orphans = []
    for sandbox_id in runtime:
        try:
            await service.backend.kill(sandbox_id)
            orphans.append(sandbox_id)
        except SandboxRuntimeError as exc:
            log.error("could not kill orphaned sandbox %s: %s", sandbox_id, exc)
    result = Reconciliation(tuple(kept), tuple(finished), tuple(released), tuple(orphans), tuple(failed))
    log.info(
        "reconciled: %d kept, %d finished, %d released, %d orphans killed, %d failed (files kept)",
        len(kept),
        len(finished),
        len(released),
        len(orphans),
        len(failed),
    )
    return result


async def _mark_failed(service: SandboxService, record: SandboxRecord) -> str:
    """The runtime set the sandbox aside (files kept): keep the record as failed, never release it."""
    if record.state != SandboxState.FAILED:
        details = append_event(record.with_details(address=None), service.now(), "error", _FAILED)
        await service.store.compare_and_swap(
            record.sandbox_id, record.generation, {"state": SandboxState.FAILED, "details": details}
        )
    log.error("sandbox %s could not be re-created after a restart; the runtime keeps its files", record.sandbox_id)
    return "failed"


async def _settle(service: SandboxService, record: SandboxRecord, info: SandboxInfo | None) -> str:
    decision = DECISIONS[(record.state, seen(info))]
    if decision is not Decision.RELEASE:
        try:
            await _carry_out(service, record, info, decision)
            return _OUTCOME.get(decision, "finished")
        except (ApiError, SandboxRuntimeError, OSError) as exc:
            log.warning("could not keep %s (%s); releasing it", record.sandbox_id, exc)
    await service.release(record)
    return "released"


async def _carry_out(
    service: SandboxService, record: SandboxRecord, info: SandboxInfo | None, decision: Decision
) -> None:
    store, sandbox_id, generation = service.store, record.sandbox_id, record.generation
    if decision is Decision.KEEP:
        if info is not None and info.host and info.host != record.details.address:  # a running sandbox moved
            await store.compare_and_swap(sandbox_id, generation, {"details": record.with_details(address=info.host)})
    elif decision is Decision.TO_PAUSED:  # the store moves running → paused only through pausing
        paused_memory = info is not None and info.state is State.PAUSED
        details = append_event(
            record.with_details(address=None, paused_memory=paused_memory), service.now(), "warning", _RESTARTED
        )
        pausing = await store.compare_and_swap(sandbox_id, generation, {"state": SandboxState.PAUSING})
        await store.compare_and_swap(sandbox_id, pausing.generation, {"state": SandboxState.PAUSED, "details": details})
    elif decision is Decision.BACK_TO_RUNNING:
        await store.compare_and_swap(sandbox_id, generation, {"state": SandboxState.RUNNING})
    elif decision is Decision.FINISH_PAUSE:
        paused_memory = info is not None and info.state is State.PAUSED
        details = record.with_details(address=None, paused_memory=paused_memory)
        await store.compare_and_swap(sandbox_id, generation, {"state": SandboxState.PAUSED, "details": details})
    elif decision is Decision.BACK_TO_PAUSED:
        await store.compare_and_swap(sandbox_id, generation, {"state": SandboxState.PAUSED})
    elif decision is Decision.FINISH_RESUME:
        await service.finish_start(record, None if info is None else info.host, record.details.timeout_s)
