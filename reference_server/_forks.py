"""``POST /sandboxes/{id}/fork``: ``count`` new sandboxes that continue a running sandbox's processes.

The source is snapshotted once with its memory (``Backend.snapshot(memory=True)``: frozen while
its files are copied and its processes written, then it runs on with its id and expiry
untouched), and each fork is a create from that snapshot (``SandboxService.create`` with the
snapshot as the runtime template): its own id, tokens, address, id range and hostname, the
source's template, environment, metadata, network settings, volumes and size. Forks are made
side by side and each succeeds or fails on its own: the answer is one entry per fork, the
created sandbox or the error a create would have answered. The snapshot is never listed; the
backend removes it once the last fork standing on its files is gone (``release_snapshot``).

Refusals of the whole request, before anything is made: 404 for a sandbox that is not the
caller's, 409 for one that is not running, 501 where the backend keeps no memory in snapshots.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from runtime.backend import Feature, Limits, SandboxRuntimeError

from ._errors import ApiError
from ._records import SandboxRecord
from ._sandbox_templates import Resolved, resolve_template
from ._sandboxes import CreateRequest, Opened, SandboxService

__all__ = ["FORK_UNAVAILABLE", "ForkFailed", "fork"]

FORK_UNAVAILABLE = "Forking a sandbox is unavailable: it needs memory snapshots, which this server does not take"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForkFailed:
    """One fork that did not start: the status and message its create would have answered."""

    status: int
    message: str


async def fork(
    service: SandboxService, owner: str, sandbox_id: str, *, count: int, timeout_s: int | None
) -> list[Opened | ForkFailed]:
    if Feature.SNAPSHOT_MEMORY not in service.backend.features:  # as a route not served: whichever sandbox
        raise ApiError(501, FORK_UNAVAILABLE)
    if timeout_s is not None:
        service.check_timeout(timeout_s)
    source, snapshot_id = await service.snapshot_to_fork(owner, sandbox_id, count)
    try:
        request = _request_like(source, timeout_s)
        resolved = await _resolved(service, owner, source, snapshot_id)
        size = Limits(cpu_count=source.details.cpu_count, memory_mb=source.details.memory_mb)
        made = await asyncio.gather(
            *(_one(service, owner, request, resolved, size) for _ in range(count)), return_exceptions=False
        )
    finally:
        try:
            await service.backend.release_snapshot(snapshot_id)
        except SandboxRuntimeError as exc:  # kept on disk; the operator's log says which
            log.error("releasing the fork snapshot %s of %s failed: %s", snapshot_id, sandbox_id, exc)
    return list(made)


def _request_like(source: SandboxRecord, timeout_s: int | None) -> CreateRequest:
    details = source.details
    return CreateRequest(
        template_id=source.template_id,
        timeout_s=details.timeout_s if timeout_s is None else timeout_s,
        env_vars=dict(source.env_vars),
        metadata=dict(source.metadata),
        secure=details.secure,
        allow_internet_access=details.allow_internet_access,
        auto_pause=source.auto_pause,
        auto_pause_memory=details.auto_pause_memory,
        auto_resume=details.auto_resume,
        network=details.network,
        # The restored processes had these mounted; a restore needs each mount back.
        volume_mounts=tuple((mount.name, mount.path) for mount in details.volume_mounts),
    )


async def _resolved(service: SandboxService, owner: str, source: SandboxRecord, snapshot_id: str) -> Resolved:
    """The source's template chain (its memory floor, its build's user and workdir), started from the snapshot."""
    try:
        below = await resolve_template(
            service.settings.templates, service.built, service.snapshots, owner, source.template_id
        )
    except ApiError:  # its template was deleted since: the snapshot stands alone
        return Resolved(runtime_template=snapshot_id, root=source.template_id, reported=source.template_id)
    return replace(below, runtime_template=snapshot_id, reported=source.template_id)


async def _one(
    service: SandboxService, owner: str, request: CreateRequest, resolved: Resolved, size: Limits
) -> Opened | ForkFailed:
    try:
        return await service.create(owner, request, resolved=resolved, at_least=size)
    except ApiError as exc:
        return ForkFailed(exc.status, exc.message)
    except Exception:  # the create logged it; the other forks go on
        log.exception("a fork of a sandbox failed")
        return ForkFailed(500, "Failed to start the forked sandbox")
