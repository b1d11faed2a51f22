"""Startup reconciliation: make the store and the runtime agree after any kind of stop.

The server may have been killed between writing a record and acting on the runtime (or the
other way round). On start, before it answers anything, every record is compared with what the
runtime has and settled by this table (record state and runtime state → action):

    record      runtime RUNNING      runtime PAUSED/STOPPED    runtime absent/other
    running     keep                 release                   release
    paused      release              keep                      release
    pausing     back to running      finish: paused            release
    resuming    finish: init, run    back to paused            release
    creating    release (the client never got an answer: nobody knows the sandbox)
    killing     release (finish the kill)
    failed      release

"release" kills what the runtime has and deletes the record, so the sandbox is cleanly gone;
"keep" and "finish" leave it usable. A runtime sandbox with no record at all is an orphan and is
killed. The runtime reconciles its own resources first (half-made mounts, networks, bundles).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runtime._backend import SandboxInfo, SandboxRuntimeError, State

from ._errors import ApiError
from ._sandboxes import SandboxService
from ._store import SandboxRecord

__all__ = ["Reconciliation", "reconcile"]

log = logging.getLogger(__name__)

_IDLE = (State.PAUSED, State.STOPPED)


@dataclass(frozen=True)
class Reconciliation:
    kept: tuple[str, ...]
    finished: tuple[str, ...]  # an interrupted pause or resume completed or rolled back
    released: tuple[str, ...]  # records whose sandbox is now gone
    orphans: tuple[str, ...]  # runtime sandboxes with no record, killed


async def reconcile(service: SandboxService) -> Reconciliation:
    await service.backend.reconcile()
    runtime = {info.sandbox_id: info for info in await service.backend.list()}
    kept: list[str] = []
    finished: list[str] = []
    released: list[str] = []
    for record in await service.store.all():
        info = runtime.pop(record.sandbox_id, None)
        async with service.lock(record.sandbox_id):
            outcome = await _settle(service, record, info)
        {"kept": kept, "finished": finished, "released": released}[outcome].append(record.sandbox_id)
    orphans = []
    for sandbox_id in runtime:
        try:
            await service.backend.kill(sandbox_id)
            orphans.append(sandbox_id)
        except SandboxRuntimeError as exc:
            log.error("could not kill orphaned sandbox %s: %s", sandbox_id, exc)
    result = Reconciliation(tuple(kept), tuple(finished), tuple(released), tuple(orphans))
    log.info(
        "reconciled: %d kept, %d finished, %d released, %d orphans killed",
        len(kept),
        len(finished),
        len(released),
        len(orphans),
    )
    return result


async def _settle(service: SandboxService, record: SandboxRecord, info: SandboxInfo | None) -> str:
    state = info.state if info is not None else None
    try:
        if record.state == "running" and state is State.RUNNING:
            if info is not None and info.host and info.host != record.data.get("address"):
                await service.store.compare_and_swap(
                    record.sandbox_id, record.generation, {"data": dict(record.data, address=info.host)}
                )
            return "kept"
        if record.state == "paused" and state in _IDLE:
            return "kept"
        if record.state == "pausing" and state is State.RUNNING:
            await service.store.compare_and_swap(record.sandbox_id, record.generation, {"state": "running"})
            return "finished"
        if record.state == "pausing" and state in _IDLE:
            data = dict(record.data, address=None, paused_memory=state is State.PAUSED)
            await service.store.compare_and_swap(
                record.sandbox_id, record.generation, {"state": "paused", "data": data}
            )
            return "finished"
        if record.state == "resuming" and state in _IDLE:
            await service.store.compare_and_swap(record.sandbox_id, record.generation, {"state": "paused"})
            return "finished"
        if record.state == "resuming" and state is State.RUNNING and info is not None:
            timeout_s = int(record.data.get("timeout_s") or 300)
            await service.finish_start(record, info.host, timeout_s)
            return "finished"
    except (ApiError, SandboxRuntimeError, OSError) as exc:
        log.warning("could not keep %s (%s); releasing it", record.sandbox_id, exc)
    await service.release(record)
    return "released"
