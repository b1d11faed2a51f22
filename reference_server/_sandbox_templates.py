"""What a create needs of templates: which layer the runtime starts, and a built template's start command.

A create's ``templateID`` names one of the server's templates, one of the owner's built
templates (its id or ``name[:tag]``: the runtime starts the ready build's layer), or a snapshot,
which may stand on either (or on a template deleted since: it stands alone then, as upstream's
snapshots do); the chain of snapshots is followed down to say which server template
is at the bottom (its memory floor applies) and which built template (its user, working
directory, environment and start command apply). A built template's start command is started
and its ready command run until it passes before the create answers (``START_READY_TIMEOUT_S``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from runtime.backend import SandboxRuntimeError

from . import _errors as text
from ._agent_session import AgentCallError, SessionFactory, start_and_wait
from ._errors import ApiError
from ._records import SandboxRecord
from ._snapshots import SnapshotStore
from ._templates import Built

__all__ = ["START_READY_TIMEOUT_S", "BuiltTemplates", "Resolved", "resolve_template", "start_command"]

log = logging.getLogger(__name__)

START_READY_TIMEOUT_S = 45.0  # a built template's ready command, within the clients' 60 s create timeout


class BuiltTemplates(Protocol):
    """The owner's built templates (``_template_service``), as a create needs them."""

    async def resolve(self, owner: str, reference: str) -> Built | None: ...

    async def spawned(self, template_id: str) -> None: ...

    async def delete(self, owner: str, reference: str) -> bool: ...


@dataclass(frozen=True)
class Resolved:
    """What a create's ``templateID`` names: what the runtime starts, the server template below, the build."""

    runtime_template: str  # a server template, a snapshot id or a build's layer
    root: str  # the server template at the bottom (its memory floor applies)
    built: Built | None = None  # the built template at the bottom of the chain, if any
    reported: str | None = None  # the templateID the sandbox reports, when not the one asked for


async def resolve_template(
    served: Collection[str], built: BuiltTemplates | None, snapshots: SnapshotStore, owner: str, template_id: str
) -> Resolved:
    """What ``template_id`` names for ``owner``; 404 when nothing of theirs (or the server's) has that name."""
    asked, seen = template_id, set()
    while True:
        if template_id in served:
            return Resolved(asked, template_id)
        found = await built.resolve(owner, template_id) if built is not None else None
        if found is not None:
            if asked == template_id:  # a template's id or name[:tag]: the runtime starts its layer
                return Resolved(found.layer, found.config.root, found, found.template.template_id)
            return Resolved(asked, found.config.root, found)
        snapshot = await snapshots.get(template_id)
        if snapshot is None or snapshot.owner != owner:
            if template_id != asked:  # a snapshot of a template deleted since: the snapshot stands alone
                return Resolved(asked, template_id)
            raise ApiError(404, text.TEMPLATE_NOT_FOUND.format(template=template_id))
        seen.add(template_id)
        if snapshot.template_id in seen:  # never written so; a loop must not hang a create
            return Resolved(asked, template_id)
        template_id = snapshot.template_id


@dataclass(frozen=True)
class _Start:
    start_cmd: str | None
    ready_cmd: str | None
    user: str
    workdir: str | None
    env: Mapping[str, str] = field(default_factory=dict)  # the agent's own: the sandbox's env vars


async def start_command(
    sessions: SessionFactory, agent_port: int, record: SandboxRecord, envd_token: str | None
) -> None:
    """The sandbox's template's start command, and its ready command until it passes; 500 when it does not.

    The commands are the record's (``SandboxDetails.start_cmd``, ``ready_cmd``), run as the
    template's user in its working directory; the agent gives them the sandbox's environment.
    """
    details = record.details
    if details.start_cmd is None and details.ready_cmd is None:
        return
    if details.address is None:
        raise SandboxRuntimeError(f"{record.sandbox_id}: no address for the start command")
    spec = _Start(details.start_cmd, details.ready_cmd, details.default_user or "user", details.default_workdir)
    session = sessions(details.address, agent_port, access_token=envd_token)
    try:
        await start_and_wait(session, spec, timeout_s=START_READY_TIMEOUT_S)
    except AgentCallError as exc:
        log.error("start command of %s failed: %s", record.sandbox_id, exc)
        raise ApiError(500, f"The template's start command did not become ready: {exc}") from None
    finally:
        await session.aclose()
