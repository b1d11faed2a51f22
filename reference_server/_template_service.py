"""The template API's decisions: names and tags, builds asked for and started, uploads, deletion.

What the clients do (``Template.build``): ``POST /v3/templates`` with a name (``name:tag``
allowed), tags, cpu and memory, which makes the template (or a new build of one the owner has)
and answers its id and a build id; ``GET /templates/{id}/files/{hash}`` for each copied set of
files, uploading the archive with a ``PUT`` to the link when it is not here yet; ``POST
/v2/templates/{id}/builds/{build}`` with the steps, which queues the build; then the build status
with ``logsOffset`` until ``ready`` or ``error``. A template is found by its id or its name, only
by its owner; the server's own templates (``base``, ``code-interpreter-v1``) are public names
nobody can build over.

Names are lowercase letters, digits, ``-`` and ``_`` (as upstream's aliases); tags also take
``.``. A tag names one build of its template; a build's tags move to it once it is ready, so a
sandbox of ``name:tag`` never starts from a build that failed.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from runtime.backend import Feature, SandboxRuntimeError, TransitionError

from . import _errors as text
from ._build_files import BuildFiles
from ._build_plan import parse_plan
from ._builder import Builder, Job
from ._errors import ApiError
from ._events import LEVELS
from ._image_source import ImageSource
from ._sandboxes import SandboxService
from ._templates import (
    DEFAULT_TAG,
    BuildConfig,
    BuildLog,
    BuildRecord,
    Built,
    TagRecord,
    TemplateRecord,
    TemplateStore,
    new_build_id,
    new_template_id,
)

__all__ = ["TemplateService", "split_reference"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,127}")
_TAG = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
MAX_TAGS = 32
CPU_RANGE = (1, 64)
MEMORY_RANGE = (128, 1 << 17)  # MiB
RESTARTED = "the server stopped during the build; start the build again"


def split_reference(reference: str) -> tuple[str, str | None]:
    """``name:tag`` → (name, tag); a reference without a colon has no tag."""
    name, sep, tag = reference.partition(":")
    return name, (tag if sep else None)


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ApiError(
            400, f"Invalid template name {name[:80]!r}: use lowercase letters, digits, '-' and '_' (at most 128)"
        )
    return name


def _check_tags(tags: Sequence[object]) -> list[str]:
    if len(tags) > MAX_TAGS:
        raise ApiError(400, f"At most {MAX_TAGS} tags")
    checked: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            shown = tag[:80] if isinstance(tag, str) else type(tag).__name__
            raise ApiError(400, f"Invalid tag {shown!r}: use lowercase letters, digits, '.', '-' and '_'")
        if tag not in checked:
            checked.append(tag)
    return checked


def _bounded(value: object, name: str, low: int, high: int, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"{name} must be an integer from {low} to {high}")
    return value


def _storable(body: Mapping[str, Any]) -> dict[str, Any]:
    """The build-start body as the store keeps it: a registry password never reaches the disk."""
    kept = dict(body)
    registry = kept.get("fromImageRegistry")
    if isinstance(registry, Mapping):
        kept["fromImageRegistry"] = {k: v for k, v in registry.items() if k in ("type", "username")}
    return kept


def _at_least(level: str | None) -> tuple[str, ...] | None:
    """The levels an entry may have to pass a ``level`` filter (None: no filter)."""
    return None if level is None else LEVELS[LEVELS.index(level) :]


class TemplateService:
    def __init__(
        self,
        *,
        sandboxes: SandboxService,
        store: TemplateStore,
        files: BuildFiles,
        concurrency: int = 2,
        timeout_s: float = 3600.0,
        clock: Callable[[], datetime] | None = None,
        images: ImageSource | None = None,
    ) -> None:
        self.sandboxes = sandboxes
        self.store = store
        self.files = files
        self._clock = clock or (lambda: datetime.now(UTC))
        self.builder = Builder(
            service=sandboxes,
            store=store,
            files=files,
            resolve=self._layer_of,
            concurrency=concurrency,
            timeout_s=timeout_s,
            clock=self._clock,
            images=images,
        )

    def _require_builds(self) -> None:
        self.sandboxes.require(Feature.SNAPSHOT, "template builds")

    async def recover(self) -> list[str]:
        """At start: builds a stopped server cut off are failed (their sandboxes are orphans).

        A build requested but never started (no body yet) was not cut off: it may still be started.
        """
        failed = []
        for build in await self.store.unfinished_builds():
            if build.spec is None:
                continue
            if await self.store.fail_build(build.build_id, {"message": RESTARTED, "step": "finalize"}, self._clock()):
                failed.append(build.build_id)
        return failed

    async def aclose(self) -> None:
        await self.builder.aclose()

    # -- finding templates ---------------------------------------------------------------

    async def owned(self, owner: str, reference: str) -> TemplateRecord:
        """The owner's template by id or name (a ``:tag`` is ignored); 404 otherwise."""
        name, _tag = split_reference(reference)
        template = await self.store.template(name)
        if template is None or template.owner != owner:
            template = await self.store.template_by_name(owner, name)
        if template is None:
            raise ApiError(404, text.TEMPLATE_NOT_FOUND.format(template=reference))
        return template

    async def resolve(self, owner: str, reference: str) -> Built | None:
        """The ready build ``reference`` names for a create, None when it names no template of the owner's.

        ``name`` and the template id mean the ``default`` tag; without that tag, the newest ready
        build. A template with nothing ready is a 404, like a missing one.
        """
        name, tag = split_reference(reference)
        template = await self.store.template(name)
        if template is None or template.owner != owner:
            template = await self.store.template_by_name(owner, name)
        if template is None:
            return None
        build: BuildRecord | None = None
        pointer = await self.store.tag(template.template_id, tag or DEFAULT_TAG)
        if pointer is not None:
            build = await self.store.build(pointer.build_id)
        elif tag is None:
            ready = [b for b in await self.store.builds(template.template_id) if b.status == "ready"]
            build = ready[-1] if ready else None
        if build is None or build.status != "ready" or build.layer is None or build.config is None:
            raise ApiError(404, text.TEMPLATE_NOT_FOUND.format(template=reference))
        return Built(template, build, build.layer, build.config)

    async def _layer_of(self, owner: str, reference: str) -> tuple[str, BuildConfig] | None:
        try:
            found = await self.resolve(owner, reference)
        except ApiError:
            return None
        return None if found is None else (found.layer, found.config)

    async def spawned(self, template_id: str) -> None:
        await self.store.count_spawn(template_id, self._clock())

    # -- builds --------------------------------------------------------------------------

    async def request_build(self, owner: str, body: Mapping[str, Any]) -> tuple[TemplateRecord, BuildRecord]:
        self._require_builds()
        raw = body.get("name") if body.get("name") is not None else body.get("alias")
        if not isinstance(raw, str) or not raw:
            raise ApiError(400, "Invalid request body: name is required")
        name, tag = split_reference(raw)
        _check_name(name)
        if name in self.sandboxes.settings.templates:
            raise ApiError(400, f"Template name {name!r} is taken by a template this server offers")
        tags = _check_tags([*(body.get("tags") or []), *([tag] if tag is not None else [])]) or [DEFAULT_TAG]
        cpu = _bounded(body.get("cpuCount"), "cpuCount", *CPU_RANGE, default=2)
        memory = _bounded(body.get("memoryMB"), "memoryMB", *MEMORY_RANGE, default=1024)
        now = self._clock()
        existing = await self.store.template_by_name(owner, name)
        template = TemplateRecord(
            template_id=existing.template_id if existing else new_template_id(),
            owner=owner,
            name=name,
            cpu_count=cpu,
            memory_mb=memory,
            disk_mb=self.sandboxes.settings.disk_mb,
            public=existing.public if existing else False,
            created_at=existing.created_at if existing else now,
            updated_at=now,
            spawn_count=existing.spawn_count if existing else 0,
            last_spawned_at=existing.last_spawned_at if existing else None,
        )
        build = BuildRecord(
            build_id=new_build_id(),
            template_id=template.template_id,
            owner=owner,
            status="waiting",
            cpu_count=cpu,
            memory_mb=memory,
            created_at=now,
            updated_at=now,
            requested_tags=tuple(tags),
        )
        try:
            await self.store.insert_build(template, build, new=existing is None)
        except sqlite3.IntegrityError:  # the same name asked for twice at once: the other one made it
            raise ApiError(409, f"Template {name!r} is being created by another request; try again") from None
        return template, build

    async def _own_build(self, owner: str, reference: str, build_id: str) -> tuple[TemplateRecord, BuildRecord]:
        template = await self.owned(owner, reference)
        build = await self.store.build(build_id)
        if build is None or build.template_id != template.template_id:
            raise ApiError(404, f"Build '{build_id}' of template '{reference}' not found")
        return template, build

    async def start_build(self, owner: str, reference: str, build_id: str, body: Mapping[str, Any]) -> None:
        self._require_builds()
        template, build = await self._own_build(owner, reference, build_id)
        plan = parse_plan(body)
        if build.status != "waiting" or build.spec is not None:
            raise ApiError(400, f"Build '{build_id}' was already started")
        if not await self.store.start_build(build_id, _storable(body), self._clock()):
            raise ApiError(400, f"Build '{build_id}' was already started")
        self.builder.submit(Job(build, template, plan, build.requested_tags))

    async def build_status(
        self, owner: str, reference: str, build_id: str, *, offset: int, limit: int, level: str | None
    ) -> tuple[BuildRecord, list[BuildLog]]:
        _template, build = await self._own_build(owner, reference, build_id)
        return build, await self.store.logs(build_id, offset=offset, limit=limit, levels=_at_least(level))

    async def build_logs(
        self,
        owner: str,
        reference: str,
        build_id: str,
        *,
        cursor_ms: int | None,
        limit: int,
        forward: bool,
        level: str | None,
    ) -> list[BuildLog]:
        await self._own_build(owner, reference, build_id)
        cursor = None if cursor_ms is None else datetime.fromtimestamp(cursor_ms / 1000, UTC)
        return await self.store.logs(build_id, limit=limit, levels=_at_least(level), cursor=cursor, forward=forward)

    # -- files ---------------------------------------------------------------------------

    async def upload_link(self, owner: str, reference: str, files_hash: str) -> tuple[bool, str, str]:
        """(whether the owner's archive of that hash is present, the template's id, the link's token)."""
        self._require_builds()
        template = await self.owned(owner, reference)
        if not self.files.valid_hash(files_hash):
            raise ApiError(400, "Invalid files hash: 64 lowercase hex digits (sha256)")
        token = self.files.token(owner, template.template_id, files_hash)
        return self.files.present(owner, files_hash), template.template_id, token

    # -- reading and changing templates -------------------------------------------------

    async def templates(self, owner: str) -> list[tuple[TemplateRecord, list[BuildRecord]]]:
        return [(t, await self.store.builds(t.template_id)) for t in await self.store.templates(owner)]

    async def template(self, owner: str, reference: str) -> tuple[TemplateRecord, list[BuildRecord]]:
        template = await self.owned(owner, reference)
        return template, await self.store.builds(template.template_id)

    async def set_public(self, owner: str, reference: str, public: bool) -> TemplateRecord:
        template = await self.owned(owner, reference)
        await self.store.set_public(template.template_id, public, self._clock())
        return template

    async def delete(self, owner: str, reference: str) -> bool:
        """Delete the owner's template (False: no such template, maybe a snapshot is meant)."""
        try:
            template = await self.owned(owner, reference)
        except ApiError:
            return False
        builds = await self.store.builds(template.template_id)
        await self.builder.cancel([b.build_id for b in builds])
        # All its layers are retired; the sweep keeps (and forgets) any that another build or a
        # cache entry still names: an identical build of another template shares its layer.
        layers = [b.layer for b in builds if b.layer is not None]
        await self.store.delete_template(template.template_id, layers)
        await self.sweep()
        return True

    async def sweep(self) -> list[str]:
        """Delete retired layers no build, cache entry or sandbox uses any more; the ones deleted."""
        deleted: list[str] = []
        retired = await self.store.retired()
        if not retired:  # the reaper's every sweep: one cheap read
            return deleted
        in_use = await self.store.layers_in_use()
        for layer in retired:
            if layer in in_use:
                await self.store.forget_retired(layer)
                continue
            try:
                await self.sandboxes.backend.delete_snapshot(layer)
            except TransitionError:
                continue  # a sandbox or a snapshot still stands on it: a later sweep tries again
            except SandboxRuntimeError as exc:
                log.warning("deleting template layer %s failed: %s", layer, exc)
                continue
            await self.store.forget_retired(layer)
            deleted.append(layer)
        return deleted

    # -- names and tags ------------------------------------------------------------------

    async def alias(self, owner: str, alias: str) -> tuple[str, bool]:
        """(template id, public) of the name; 404 when the owner has no such template."""
        if alias in self.sandboxes.settings.templates:
            return alias, True
        template = await self.store.template_by_name(owner, alias)
        if template is None:
            raise ApiError(404, f"Template alias '{alias}' not found")
        return template.template_id, template.public

    async def assign_tags(self, owner: str, target: str, tags: Sequence[object]) -> tuple[list[str], str]:
        name, source_tag = split_reference(target)
        checked = _check_tags(tags)
        if not checked:
            raise ApiError(400, "Invalid request body: tags must not be empty")
        found = await self.resolve(owner, f"{name}:{source_tag or DEFAULT_TAG}")
        if found is None:
            raise ApiError(404, text.TEMPLATE_NOT_FOUND.format(template=target))
        await self.store.assign_tags(found.template.template_id, found.build.build_id, checked, self._clock())
        return checked, found.build.build_id

    async def remove_tags(self, owner: str, name: str, tags: Sequence[object]) -> None:
        template = await self.owned(owner, name)
        checked = _check_tags(tags)
        if not checked:
            raise ApiError(400, "Invalid request body: tags must not be empty")
        present = {t.tag for t in await self.store.tags(template.template_id)}
        missing = [t for t in checked if t not in present]
        if missing:
            raise ApiError(404, f"Tag '{missing[0]}' of template '{name}' not found")
        await self.store.remove_tags(template.template_id, checked)

    async def tags(self, owner: str, reference: str) -> list[TagRecord]:
        template = await self.owned(owner, reference)
        return await self.store.tags(template.template_id)
