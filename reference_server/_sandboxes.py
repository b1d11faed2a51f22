"""The sandbox service: every lifecycle operation, as the store and the runtime see it.

Handlers parse and map; this module decides. Each operation on one sandbox runs under that
sandbox's lock (in this process) and moves its record by compare-and-swap (across processes and
against the reaper), in the order that keeps a crash recoverable:

    record first (creating / pausing / resuming / killing), then the runtime, then the record again

so a server killed between the two writes leaves a transitional state that startup
reconciliation (``_reconcile``) settles against what the runtime really has. A sandbox is
reported ``running`` only once its agent has answered ``/init``: its lifetime starts there.

Every refusal is an ``ApiError`` with the upstream status; the owner check makes another
owner's sandbox indistinguishable from a missing one (404), as upstream does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import string
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from hashlib import sha512
from typing import Any, Protocol, cast

from contract.protocol import ENVD_PORT, SHOULD_RETRY_HEADER
from runtime.backend import Backend, Feature, Limits, SandboxRuntimeError, State, VolumeMount
from runtime.host import MemoryLedger

from . import _errors as text
from ._admission import Admission, AdmissionLimits
from ._agent_init import agent_answers
from ._agent_session import AgentSession, SessionFactory
from ._credentials import SealedToken, TokenScope, TokenVault, new_sandbox_token
from ._errors import ApiError, runtime_refusal
from ._events import LogQuery, append_event, query_logs, rfc3339, since
from ._idempotency import CreateKeys
from ._metrics import MetricsBook, Sample
from ._records import (
    Defaults,
    LifecycleEvent,
    MountedVolume,
    NetworkSettings,
    SandboxDetails,
    SandboxRecord,
    SandboxState,
)
from ._sandbox_templates import BuiltTemplates, Resolved, resolve_template, start_command
from ._snapshots import SnapshotPage, SnapshotRecord, SnapshotStore
from ._store import Changes, GenerationConflict, InvalidCursor, NotFound, Page, Store, StoreError
from ._volumes import VolumeService
from ._warm_pool import Shape, Warm, WarmPool

__all__ = [
    "AgentInitializer",
    "CreateRequest",
    "Opened",
    "SandboxService",
    "ServiceSettings",
    "Target",
    "api_state",
    "new_sandbox_id",
]

log = logging.getLogger(__name__)

S = SandboxState
ID_ALPHABET = string.ascii_lowercase + string.digits
ID_LENGTH = 20
MAX_PAGE = 100  # the most records one list answer holds
# API states → the store states they cover. A sandbox in flight is shown as where it is heading.
API_STATES: dict[str, frozenset[SandboxState]] = {
    "running": frozenset({S.RUNNING, S.RESUMING}),
    "paused": frozenset({S.PAUSED, S.PAUSING}),
}
VISIBLE: frozenset[SandboxState] = frozenset().union(*API_STATES.values())
GONE = frozenset({S.KILLING, S.KILLED, S.FAILED})  # answered as missing


def new_sandbox_id() -> str:
    first = secrets.choice(string.ascii_lowercase)  # never all digits: ids appear in host names
    return first + "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH - 1))


def api_state(state: SandboxState) -> str:
    return next(name for name, states in API_STATES.items() if state in states) if state in VISIBLE else str(state)


class AgentInitializer(Protocol):
    """Sends ``POST /init`` to a sandbox's agent (the seam tests replace)."""

    async def __call__(self, host: str, port: int, body: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class ServiceSettings:
    domain: str  # reported in create/connect answers: "<name>:<port>" as the clients must use it
    envd_version: str
    templates: frozenset[str]  # names a sandbox may start from (snapshots come on top, per owner)
    cpu_count: int = Defaults.CPU_COUNT
    memory_mb: int = Defaults.MEMORY_MB  # of a sandbox whose template has no size of its own
    disk_mb: int = Defaults.DISK_MB
    # A template's own memory size (``runtime.templates.TEMPLATE_MEMORY_MB``): its floor, since its
    # processes need it; a sandbox of a snapshot gets its source template's.
    template_memory_mb: Mapping[str, int] = field(default_factory=dict)
    max_timeout_s: int = 86_400
    egress_enabled: bool = False  # the operator's switch; without it no sandbox reaches outside
    agent_port: int = ENVD_PORT
    default_user: str = "user"
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)  # who may start a sandbox now
    memory_ledger: MemoryLedger | None = None  # the host's, shared with other servers; None: this one only
    warm_pool: Mapping[str, int] = field(default_factory=dict)  # server template → started sandboxes kept ready
    warm_pool_memory_mb: int = 0  # the most the warm sandboxes' memory limits may add up to


@dataclass(frozen=True, kw_only=True)
class CreateRequest:
    """A parsed create body; every field the body may omit has its default in ``Defaults``."""

    template_id: str
    timeout_s: int
    env_vars: Mapping[str, str]
    metadata: Mapping[str, str]
    secure: bool
    allow_internet_access: bool = Defaults.ALLOW_INTERNET_ACCESS
    auto_pause: bool = Defaults.AUTO_PAUSE
    auto_pause_memory: bool = Defaults.AUTO_PAUSE_MEMORY
    auto_resume: bool = Defaults.AUTO_RESUME
    network: NetworkSettings = field(default_factory=NetworkSettings)
    volume_mounts: tuple[tuple[str, str], ...] = ()  # (volume name, path in the sandbox)


@dataclass(frozen=True)
class Opened:
    """A sandbox record with its tokens in the clear, for create/connect/resume answers only."""

    record: SandboxRecord
    envd_token: str | None
    traffic_token: str | None


@dataclass(frozen=True)
class Target:
    """Where the edge sends a request for one sandbox, and what it must check first."""

    host: str
    traffic_token: SealedToken | None
    # The Host the sandbox's servers see on user ports ("${PORT}" replaced), when the create asked
    # for one with network.maskRequestHost; None: the client's own Host.
    mask_request_host: str | None = None


class SandboxService:
    def __init__(
        self,
        *,
        store: Store,
        snapshots: SnapshotStore,
        backend: Backend,
        vault: TokenVault,
        settings: ServiceSettings,
        initialize: AgentInitializer,
        metrics: MetricsBook,
        clock: Callable[[], datetime] | None = None,
        agent_sessions: SessionFactory = AgentSession,
    ) -> None:
        self.store = store
        self.agent_sessions = agent_sessions  # the server's own calls to agents (start commands, builds)
        self.snapshots = snapshots
        self.backend = backend
        self.vault = vault
        self.settings = settings
        self.metrics = metrics
        self._initialize = initialize
        self._clock = clock or (lambda: datetime.now(UTC))
        self._locks: dict[str, asyncio.Lock] = {}
        self.built: BuiltTemplates | None = None  # set once the template service exists
        self.volumes: VolumeService | None = None  # set once the volume service exists
        self.create_keys = CreateKeys(store.db, self._clock)  # ``Idempotency-Key`` on create
        # (host, port) → whether the agent answers /health (a seam: the in-memory backend has no agent)
        self.guest_answers: Callable[[str, int], Awaitable[bool]] = agent_answers
        # Called with a sandbox's address once its processes stopped or froze (a pause, a kill): the
        # server's proxy closes its idle connections there. Processes that boot on that address
        # later (a resume afresh, another sandbox) never knew them, and gVisor's kernel ends with no
        # FIN, so a reused one would fail the next request with no answer.
        self.address_released: Callable[[str], Awaitable[None]] | None = None
        self.admission = Admission(
            settings.admission,
            store,
            ledger=settings.memory_ledger,
            paused_on_disk=Feature.PAUSE_MEMORY_ON_DISK in backend.features,
        )
        # What a create with no network fields makes of each configured template: equal shapes, one sandbox.
        default_network = NetworkSettings()
        warm_shapes = {
            self._shape(Resolved(name, name), Defaults.ALLOW_INTERNET_ACCESS, default_network): count
            for name, count in settings.warm_pool.items()
            if count > 0
        }
        self.pool = WarmPool(  # its refill task runs with the server (``_server.run``)
            backend=backend,
            admission=self.admission,
            wanted=lambda: warm_shapes,
            new_id=new_sandbox_id,
            memory_mb=settings.warm_pool_memory_mb,
        )

    def now(self) -> datetime:
        return self._clock()

    def require(self, feature: Feature, what: str) -> None:
        """Refuse, before anything is stored, what needs a feature the backend lacks (never done another way)."""
        if feature not in self.backend.features:
            raise ApiError(501, text.NOT_ON_BACKEND.format(what=what, backend=self.backend.name))

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    # -- reading -----------------------------------------------------------------------

    async def owned(self, owner: str, sandbox_id: str) -> SandboxRecord:
        record = await self.store.get(sandbox_id)
        if record is None or record.owner != owner or record.state in GONE:
            raise ApiError(404, f"{text.SANDBOX_NOT_FOUND}: {sandbox_id}")
        return record

    async def detail(self, owner: str, sandbox_id: str) -> Opened:
        """One sandbox with its envd token in the clear (``GET /sandboxes/{id}`` reports it)."""
        return self.tokens(await self.owned(owner, sandbox_id))

    async def list_running(self, owner: str, metadata: Mapping[str, str]) -> list[SandboxRecord]:
        """The v1 list: every running sandbox of ``owner`` in one answer (v1 has no pages)."""
        records: list[SandboxRecord] = []
        token: str | None = None
        while True:
            page = await self.store.list(
                owner, states=API_STATES["running"], metadata=metadata, limit=MAX_PAGE, after=token
            )
            records.extend(page.records)
            token = page.next_token
            if token is None:
                return records

    async def list_page(
        self,
        owner: str,
        *,
        states: Collection[str] | None,
        metadata: Mapping[str, str],
        limit: int,
        after: str | None,
        order: str = "desc",
        started_after: datetime | None = None,
        template: str | None = None,
    ) -> Page:
        """The v2 list: one page in the API states asked for (running and paused when none).

        ``order`` is by start (creation) time, newest first unless ``asc``; ``template`` is a template
        id or alias, resolved as a create resolves it (a name of nothing lists nothing).
        """
        wanted = set(states or ("running", "paused"))
        unknown = sorted(wanted - set(API_STATES))
        if unknown:
            raise ApiError(400, f"Invalid state filter: {unknown[0]} (known: {', '.join(API_STATES)})")
        covered = set().union(*(API_STATES[state] for state in wanted))
        template_id = None if template is None else await self._template_filter(owner, template)
        try:
            return await self.store.list(
                owner,
                states=covered,
                metadata=metadata,
                limit=limit,
                after=after,
                descending=order == "desc",
                started_after=started_after,
                template_id=template_id,
            )
        except InvalidCursor:
            raise ApiError(400, text.INVALID_CURSOR) from None

    async def _template_filter(self, owner: str, template: str) -> str:
        """The templateID the owner's sandboxes of ``template`` (an id or an alias) report."""
        try:
            resolved = await resolve_template(self.settings.templates, self.built, self.snapshots, owner, template)
        except ApiError:  # no such template: its name matches no sandbox either
            return template
        return resolved.reported or template

    async def metric_series(
        self, owner: str, sandbox_id: str, start: datetime | None, end: datetime | None
    ) -> list[Sample]:
        if start is not None and end is not None and start > end:
            raise ApiError(400, "start must not be after end")
        record = await self.owned(owner, sandbox_id)
        return self.metrics.series(record.sandbox_id, start, end)

    async def latest_metrics(self, owner: str, sandbox_ids: list[str]) -> dict[str, Sample]:
        """The newest sample of each of ``owner``'s sandboxes among ``sandbox_ids``; others are left out."""
        if not sandbox_ids:
            raise ApiError(400, "Query parameter sandbox_ids is required")
        if len(sandbox_ids) > MAX_PAGE:
            raise ApiError(400, f"At most {MAX_PAGE} sandbox ids per request")
        found: dict[str, Sample] = {}
        for sandbox_id in dict.fromkeys(sandbox_ids):
            record = await self.store.get(sandbox_id)
            sample = self.metrics.latest(sandbox_id) if record is not None and record.owner == owner else None
            if sample is not None:
                found[sandbox_id] = sample
        return found

    async def logs_since(self, owner: str, sandbox_id: str, start_ms: int | None, limit: int) -> list[LifecycleEvent]:
        record = await self.owned(owner, sandbox_id)
        return since(record.details.events, start_ms, limit)

    async def logs(self, owner: str, sandbox_id: str, query: LogQuery) -> list[LifecycleEvent]:
        record = await self.owned(owner, sandbox_id)
        return query_logs(record.details.events, query)

    def check_timeout(self, timeout_s: int) -> None:
        if timeout_s < 0:
            raise ApiError(400, "Timeout must not be negative")
        if timeout_s > self.settings.max_timeout_s:
            raise ApiError(400, f"Timeout cannot be greater than {self.settings.max_timeout_s // 3600} hours")

    def tokens(self, record: SandboxRecord) -> Opened:
        def opened(sealed: SealedToken | None, scope: TokenScope) -> str | None:
            return None if sealed is None else self.vault.open(sealed, scope, record.sandbox_id)

        details = record.details
        return Opened(
            record, opened(details.envd_token, TokenScope.ENVD), opened(details.traffic_token, TokenScope.TRAFFIC)
        )

    # -- create ------------------------------------------------------------------------

    async def create(
        self, owner: str, request: CreateRequest, *, resolved: Resolved | None = None, at_least: Limits | None = None
    ) -> Opened:
        """A new sandbox; a fork (``_forks``) gives ``resolved`` (its snapshot) and ``at_least`` (its source's size)."""
        self.check_timeout(request.timeout_s)
        if request.network.allow_out or request.network.deny_out:
            self.require(Feature.EGRESS_RULES, "network allow and deny lists")
        if request.auto_pause and request.auto_pause_memory:
            self.require(Feature.PAUSE_MEMORY, "pausing with memory when the timeout ends")
        if resolved is None:
            resolved = await resolve_template(
                self.settings.templates, self.built, self.snapshots, owner, request.template_id
            )
        built = resolved.built
        starts = built is not None and resolved.runtime_template == built.layer  # not a snapshot of one
        mounts = await self._volume_mounts(owner, request.volume_mounts)
        shape = self._shape(resolved, request.allow_internet_access, request.network, mounts)
        if at_least is not None:  # restored processes need what they had
            limits = shape.limits
            shape = replace(
                shape,
                limits=replace(
                    limits,
                    cpu_count=max(limits.cpu_count, at_least.cpu_count),
                    memory_mb=max(limits.memory_mb, at_least.memory_mb),
                ),
            )
        warm = self.pool.claim(shape)  # a sandbox of this shape the pool started: its id is this one's
        sandbox_id = warm.sandbox_id if warm is not None else new_sandbox_id()
        async with contextlib.AsyncExitStack() as held:
            try:
                record, envd_token, traffic_token = self._new_record(
                    owner, request, resolved, shape, sandbox_id=sandbox_id, starts=starts, mounts=mounts
                )
                # Admitted before anything is stored; the reservation lasts until the start succeeded or was undone.
                await held.enter_async_context(self.admission.create(owner, sandbox_id, shape.limits.memory_mb))
            except BaseException:
                if warm is not None:  # refused (a 429): nothing of it was stored, the next create may have it
                    self.pool.give_back(warm)
                raise
            await held.enter_async_context(self.lock(sandbox_id))
            try:
                record = await self.store.insert(record)
            except BaseException:
                if warm is not None:
                    await self.pool.discard(warm)
                raise
            if warm is not None:  # the record holds its memory now
                self.pool.claimed(warm)
            try:
                await self._check_volumes_stay(mounts)
                record = await self._boot(record, shape, warm, request.timeout_s)
                if starts:
                    await start_command(self.agent_sessions, self.settings.agent_port, record, envd_token)
            except BaseException as exc:
                await self._discard(record)
                if isinstance(exc, SandboxRuntimeError):
                    log.error("creating %s failed: %s", sandbox_id, exc)
                    raise runtime_refusal("create", exc, template=request.template_id) from None
                raise
        if built is not None and self.built is not None:
            await self.built.spawned(built.template.template_id)
        await self.metrics.sample(sandbox_id)
        return Opened(record, envd_token, traffic_token)

    async def create_once(self, owner: str, request: CreateRequest, key: str | None, body_print: str) -> Opened:
        """``create``, made once per ``Idempotency-Key`` of the owner; a repeat answers the first sandbox."""
        if key is None:
            return await self.create(owner, request)

        async def replay(sandbox_id: str) -> Opened | None:
            try:
                return await self.detail(owner, sandbox_id)
            except ApiError:  # gone (killed, or never this owner's)
                return None

        return await self.create_keys.once(
            owner,
            key,
            body_print,
            create=lambda: self.create(owner, request),
            bound_id=lambda opened: opened.record.sandbox_id,
            replay=replay,
        )

    async def _volume_mounts(self, owner: str, asked: tuple[tuple[str, str], ...]) -> tuple[MountedVolume, ...]:
        """The owner's ready volumes a create names, each with its path; 400 for a name there is no volume of."""
        if not asked:
            return ()
        if self.volumes is None:
            raise ApiError(400, text.VOLUME_MOUNT_UNAVAILABLE)
        mounts = []
        for name, path in asked:
            volume = await self.volumes.named(owner, name)
            if volume is None:
                raise ApiError(400, f"Invalid request body: volumeMounts: there is no volume named {name!r}")
            mounts.append(MountedVolume(volume.volume_id, name, path))
        return tuple(mounts)

    async def _check_volumes_stay(self, mounts: tuple[MountedVolume, ...]) -> None:
        """Read after the record is written: a delete of a volume marks it before it looks for sandboxes
        (``_volumes``), so either this sees the mark or that delete sees this sandbox."""
        for mount in mounts:
            if self.volumes is None or not await self.volumes.still_ready(mount.volume_id):
                raise ApiError(400, f"Invalid request body: volumeMounts: volume {mount.name!r} is being deleted")

    async def volume_in_use(self, volume_id: str) -> bool:
        """Whether a sandbox that is not gone mounts the volume (a delete of it is refused then)."""
        alive = frozenset(SandboxState) - {S.KILLED, S.FAILED}
        return any(
            mount.volume_id == volume_id
            for record in await self.store.all(alive)
            for mount in record.details.volume_mounts
        )

    def _new_record(
        self,
        owner: str,
        request: CreateRequest,
        resolved: Resolved,
        shape: Shape,
        *,
        sandbox_id: str,
        starts: bool,
        mounts: tuple[MountedVolume, ...] = (),
    ) -> tuple[SandboxRecord, str | None, str | None]:
        """A create's record (state creating) and its envd and traffic tokens in the clear."""
        built = resolved.built
        cpu_count, memory_mb = shape.limits.cpu_count, shape.limits.memory_mb
        env_vars = {**(built.config.env if built else {}), **request.env_vars}
        envd_token = new_sandbox_token() if request.secure else None
        traffic_token = None if request.network.allow_public_traffic else new_sandbox_token()
        now = self.now()
        details = SandboxDetails(
            envd_version=self.settings.envd_version,
            secure=request.secure,
            envd_token=None if envd_token is None else self.vault.seal(envd_token, TokenScope.ENVD, sandbox_id),
            traffic_token=None
            if traffic_token is None
            else self.vault.seal(traffic_token, TokenScope.TRAFFIC, sandbox_id),
            allow_internet_access=request.allow_internet_access,
            network=request.network,
            auto_pause_memory=request.auto_pause_memory,
            auto_resume=request.auto_resume,
            cpu_count=cpu_count,
            memory_mb=memory_mb,
            disk_mb=self.settings.disk_mb,
            timeout_s=request.timeout_s,
            default_user=built.config.user if built else None,
            default_workdir=built.config.workdir if built else None,
            start_cmd=built.config.start_cmd if built and starts else None,
            ready_cmd=built.config.ready_cmd if built and starts else None,
            volume_mounts=mounts,
        )
        record = SandboxRecord(
            sandbox_id=sandbox_id,
            owner=owner,
            template_id=resolved.reported or request.template_id,
            state=S.CREATING,
            created_at=now,
            expires_at=now + timedelta(seconds=request.timeout_s),
            metadata=dict(request.metadata),
            env_vars=env_vars,
            auto_pause=request.auto_pause,
            details=append_event(details, now, "info", "sandbox creating", template=request.template_id),
        )
        return record, envd_token, traffic_token

    def _shape(
        self,
        resolved: Resolved,
        allow_internet_access: bool,
        network: NetworkSettings,
        mounts: tuple[MountedVolume, ...] = (),
    ) -> Shape:
        """What the runtime is asked to create for a sandbox of ``resolved`` with that network and volumes."""
        built = resolved.built
        floor = self.settings.template_memory_mb.get(resolved.root, 0)  # its processes need it
        egress = self.settings.egress_enabled
        return Shape(
            template=resolved.runtime_template,
            limits=Limits(
                cpu_count=built.template.cpu_count if built else self.settings.cpu_count,
                memory_mb=max(built.template.memory_mb if built else self.settings.memory_mb, floor),
                disk_mb=self.settings.disk_mb,
            ),
            allow_internet_access=allow_internet_access and egress,
            allow_out=network.allow_out if egress else (),
            deny_out=network.deny_out,
            volumes=tuple(
                VolumeMount(str(self.volumes.mount_point(mount.volume_id)), mount.path)
                for mount in mounts
                if self.volumes is not None
            ),
        )

    async def _boot(self, record: SandboxRecord, shape: Shape, warm: Warm | None, timeout_s: int) -> SandboxRecord:
        """Initialize the claimed warm sandbox, or create and start one; then it is running."""
        if warm is not None:
            try:
                return await self._started(record, warm.host, timeout_s, "sandbox started")
            except SandboxRuntimeError as exc:  # its agent is gone: start one afresh under the same id
                log.warning("warm sandbox %s did not take /init, starting it afresh: %s", record.sandbox_id, exc)
                await self.backend.kill(record.sandbox_id)
        # The token's hash is published to the agent (runtime.agent._metadata): an agent restored
        # from a snapshot's memory holds another sandbox's token, and only that hash lets /init
        # replace it. The hash of "" for a sandbox without a token: /init may only clear it.
        token = self.tokens(record).envd_token or ""
        await self.backend.create(shape.spec(record.sandbox_id, access_token_hash=sha512(token.encode()).hexdigest()))
        info = await self.backend.start(record.sandbox_id)
        return await self._started(record, info.host, timeout_s, "sandbox started")

    async def initialize_agent(self, host: str, body: Mapping[str, Any]) -> None:
        """``POST /init`` to the agent at ``host`` (a template build's sandbox has no record to start)."""
        await self._initialize(host, self.settings.agent_port, body)

    async def _started(self, record: SandboxRecord, host: str | None, timeout_s: int, message: str) -> SandboxRecord:
        """The runtime runs it: initialize the agent, then record it running from now on."""
        if host is None:
            raise SandboxRuntimeError(f"{record.sandbox_id}: the runtime gave no address")
        body: dict[str, Any] = {
            "envVars": record.env_vars,
            "defaultUser": record.details.default_user or self.settings.default_user,
            "timestamp": rfc3339(self.now()),
        }
        if record.details.default_workdir:
            body["defaultWorkdir"] = record.details.default_workdir
        opened = self.tokens(record)
        if opened.envd_token is not None:
            body["accessToken"] = opened.envd_token
        await self._initialize(host, self.settings.agent_port, body)
        now = self.now()  # the lifetime starts once the agent is ready
        details = record.with_details(
            address=host, started_at=record.details.started_at or rfc3339(now), timeout_s=timeout_s
        )
        return await self.store.compare_and_swap(
            record.sandbox_id,
            record.generation,
            {
                "state": S.RUNNING,
                "expires_at": now + timedelta(seconds=timeout_s),
                "details": append_event(details, now, "info", message),
            },
        )

    async def finish_start(self, record: SandboxRecord, host: str | None, timeout_s: int) -> SandboxRecord:
        """Complete a start the runtime finished but the record does not show (reconciliation)."""
        return await self._started(record, host, timeout_s, "sandbox resumed after a server restart")

    async def release(self, record: SandboxRecord) -> None:
        """Kill whatever the runtime has for this record and delete the record."""
        current = await self.store.get(record.sandbox_id)
        if current is None:
            await self.backend.kill(record.sandbox_id)
            return
        await self._kill(current)

    async def _settle(self, record: SandboxRecord) -> None:
        """After a failed pause or resume: record what the runtime really has, or release it."""
        try:
            info = await self.backend.inspect(record.sandbox_id)
            current = await self.store.get(record.sandbox_id)
            if current is None:
                return
            if info.state is State.RUNNING and current.state == S.PAUSING:
                await self._swap(current, state=S.RUNNING)
            elif info.state in (State.PAUSED, State.STOPPED) and current.state == S.RESUMING:
                # A resume without memory may have ended the kept processes before it failed.
                kept = current.with_details(paused_memory=info.state is State.PAUSED)
                await self._swap(current, state=S.PAUSED, details=kept)
            else:
                await self._kill(current)
        except Exception:
            log.exception("settling %s after a failed operation", record.sandbox_id)
            await self._discard(record)

    async def _discard(self, record: SandboxRecord) -> None:
        """Release whatever a failed operation left and forget the sandbox; never raises."""
        try:
            current = await self.store.get(record.sandbox_id)
            if current is not None:
                await self._kill(current)
            else:
                await self.backend.kill(record.sandbox_id)
        except Exception:
            log.exception("could not clean up after %s", record.sandbox_id)

    # -- connect, resume, pause ---------------------------------------------------------

    async def connect(self, owner: str, sandbox_id: str, timeout_s: int, *, memory: bool = True) -> tuple[Opened, bool]:
        """200 (False) when it was running, 201 (True) when this call resumed it.

        ``memory=False`` (the newer clients' ``on_resume="reboot"``): a sandbox paused with its
        memory boots afresh from its files instead; for any other sandbox it changes nothing.
        """
        self.check_timeout(timeout_s)
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            if record.state == S.RUNNING:
                record = await self._keep_alive(record, timeout_s)
                return self.tokens(record), False
            if record.state == S.PAUSED:
                return self.tokens(await self._resume(record, timeout_s, memory=memory)), True
            raise ApiError(409, text.LIFECYCLE_CONFLICT)

    async def resume(self, owner: str, sandbox_id: str, timeout_s: int, auto_pause: bool | None) -> Opened:
        self.check_timeout(timeout_s)
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            if record.state == S.RUNNING:
                raise ApiError(409, text.ALREADY_RUNNING)
            if record.state != S.PAUSED:
                raise ApiError(409, text.LIFECYCLE_CONFLICT)
            if auto_pause is not None and auto_pause != record.auto_pause:
                record = await self._swap(record, auto_pause=auto_pause)
            return self.tokens(await self._resume(record, timeout_s))

    async def _resume(self, record: SandboxRecord, timeout_s: int, *, memory: bool = True) -> SandboxRecord:
        # A resumed sandbox runs again, so it is admitted like a new one (429 leaves it paused).
        async with self.admission.resume(record):
            return await self._resume_admitted(record, timeout_s, memory=memory)

    async def _resume_admitted(self, record: SandboxRecord, timeout_s: int, *, memory: bool) -> SandboxRecord:
        kept = record.details.paused_memory is True
        afresh = not (kept and memory)  # its processes, the start command's too, are gone (or are to go)
        record = await self._swap(record, state=S.RESUMING)
        try:
            if kept and not memory:
                # Never a memory restore in its place: the kept processes end before the boot.
                await self.backend.discard_memory(record.sandbox_id)
            info = await self.backend.resume(record.sandbox_id)
            started = await self._started(record, info.host, timeout_s, "sandbox resumed")
        except (SandboxRuntimeError, OSError) as exc:  # OSError: the agent did not answer /init
            log.error("resuming %s failed: %s", record.sandbox_id, exc)
            await self._settle(record)
            if isinstance(exc, SandboxRuntimeError):
                raise runtime_refusal("resume", exc) from None
            raise ApiError(500, text.INTERNAL) from None
        if afresh:
            # Like the create: the resume answers once the start command is ready. One that is not
            # leaves the sandbox running (its files are the user's), and the client sees the 500.
            envd_token = self.tokens(started).envd_token
            await start_command(self.agent_sessions, self.settings.agent_port, started, envd_token)
        return started

    async def pause(self, owner: str, sandbox_id: str, *, memory: bool, require_healthy_guest: bool = False) -> None:
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            if record.state == S.PAUSED:
                raise ApiError(409, text.ALREADY_PAUSED)
            if record.state != S.RUNNING:
                raise ApiError(409, text.LIFECYCLE_CONFLICT)
            if memory:
                self.require(Feature.PAUSE_MEMORY, "pausing with memory")
            if require_healthy_guest:
                # The newer clients' strict pause: a sandbox whose agent does not answer is left
                # running, with a 503 that they retry (docs/PROTOCOL-NOTES.md, "Retries").
                address = record.details.address
                if address is None or not await self.guest_answers(address, self.settings.agent_port):
                    raise ApiError(503, text.GUEST_NOT_RESPONDING, {SHOULD_RETRY_HEADER: "true"})
            await self._pause(record, memory=memory)

    async def _pause(self, record: SandboxRecord, *, memory: bool) -> SandboxRecord:
        record = await self._swap(record, state=S.PAUSING)
        try:
            await self.backend.pause(record.sandbox_id, memory=memory)
        except SandboxRuntimeError as exc:
            log.error("pausing %s failed: %s", record.sandbox_id, exc)
            await self._settle(record)
            raise runtime_refusal("pause", exc) from None
        await self._released(record.details.address)
        details = record.with_details(address=None, paused_memory=memory)
        return await self._swap(
            record, state=S.PAUSED, details=append_event(details, self.now(), "info", "sandbox paused")
        )

    # -- kill, timeouts ----------------------------------------------------------------

    async def kill(self, owner: str, sandbox_id: str) -> None:
        async with self.lock(sandbox_id):
            try:
                record = await self.owned(owner, sandbox_id)
            except ApiError:
                raise ApiError(404, text.SANDBOX_NOT_FOUND) from None
            try:
                await self._kill(record)
            except SandboxRuntimeError as exc:  # the record stays killing: the reaper tries again
                log.error("killing %s failed, left for the reaper: %s", sandbox_id, exc)
                raise ApiError(500, text.INTERNAL) from None
        self._locks.pop(sandbox_id, None)

    async def _kill(self, record: SandboxRecord) -> None:
        """killing → runtime released → record deleted. Repeating it after a crash is safe."""
        if record.state != S.KILLING:
            record = await self._swap(record, state=S.KILLING)
        await self.backend.kill(record.sandbox_id)
        await self._released(record.details.address)
        await self.store.delete(record.sandbox_id, record.generation)
        self.metrics.drop(record.sandbox_id)

    async def _released(self, address: str | None) -> None:
        """Tell ``address_released``; never raises (the pause or kill it follows is done)."""
        if address is not None and self.address_released is not None:
            try:
                await self.address_released(address)
            except Exception:
                log.exception("closing the proxy's connections to a released sandbox address")

    async def set_timeout(self, owner: str, sandbox_id: str, timeout_s: int) -> None:
        """E2B's set_timeout: the sandbox expires ``timeout_s`` from now, sooner or later than before."""
        self.check_timeout(timeout_s)
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            await self._swap(
                record,
                expires_at=self.now() + timedelta(seconds=timeout_s),
                details=record.with_details(timeout_s=timeout_s),
            )

    async def refresh(self, owner: str, sandbox_id: str, duration_s: int) -> None:
        """Keep it alive at least ``duration_s`` more; never shortens (upstream's refreshes)."""
        self.check_timeout(duration_s)
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            if record.state == S.RUNNING:
                await self._keep_alive(record, duration_s)

    async def _keep_alive(self, record: SandboxRecord, timeout_s: int) -> SandboxRecord:
        return await self._guard(
            self.store.extend_expiry(record.sandbox_id, record.generation, self.now() + timedelta(seconds=timeout_s))
        )

    async def update_network(
        self,
        owner: str,
        sandbox_id: str,
        *,
        allow_internet_access: bool | None,
        allow_out: tuple[str, ...] | None,
        deny_out: tuple[str, ...] | None,
    ) -> None:
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            if record.state != S.RUNNING:
                raise ApiError(409, text.SANDBOX_NOT_RUNNING)
            self.require(Feature.EGRESS_RULES, "changing a sandbox's network rules")
            network = record.details.network
            if allow_out is not None:
                network = replace(network, allow_out=allow_out)
            if deny_out is not None:
                network = replace(network, deny_out=deny_out)
            internet = record.details.allow_internet_access if allow_internet_access is None else allow_internet_access
            egress = self.settings.egress_enabled
            try:
                await self.backend.update_network(
                    sandbox_id,
                    allow_internet_access=internet and egress,
                    allow_out=network.allow_out if egress else (),
                    deny_out=network.deny_out,
                )
            except SandboxRuntimeError as exc:
                log.error("network update of %s failed: %s", sandbox_id, exc)
                raise runtime_refusal("update_network", exc) from None
            details = record.with_details(network=network, allow_internet_access=internet)
            await self._swap(record, details=append_event(details, self.now(), "info", "network updated"))

    # -- snapshots ---------------------------------------------------------------------

    async def snapshot(
        self, owner: str, sandbox_id: str, name: str | None, *, memory: bool | None = None
    ) -> SnapshotRecord:
        """A snapshot of the sandbox's files, and of its processes and memory when ``memory`` says so.

        ``memory`` None (the pinned clients, and newer ones without ``mode``): the memory is kept
        where the backend can (``Feature.SNAPSHOT_MEMORY``) and the sandbox runs with no volume
        (a sandbox made from the snapshot has none, and a restore needs every mount back),
        else the files alone, as before. True asks for it: refused where it cannot be kept.
        """
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            if record.state not in (S.RUNNING, S.PAUSED):
                raise ApiError(409, text.LIFECYCLE_CONFLICT)
            self.require(Feature.SNAPSHOT, "snapshots")
            if memory:
                self.require(Feature.SNAPSHOT_MEMORY, "snapshots that keep the memory")
                if record.state != S.RUNNING:
                    raise ApiError(409, text.SANDBOX_NOT_RUNNING)
                if record.details.volume_mounts:
                    raise ApiError(409, text.MEMORY_SNAPSHOT_WITH_VOLUMES)
            elif memory is None:
                memory = (
                    Feature.SNAPSHOT_MEMORY in self.backend.features
                    and record.state == S.RUNNING
                    and not record.details.volume_mounts
                )
            try:
                snapshot_id = await self.backend.snapshot(sandbox_id, memory=memory)
            except SandboxRuntimeError as exc:
                log.error("snapshot of %s failed: %s", sandbox_id, exc)
                raise runtime_refusal("snapshot", exc) from None
            snapshot = SnapshotRecord(
                snapshot_id=snapshot_id,
                owner=owner,
                sandbox_id=sandbox_id,
                template_id=record.template_id,
                names=(name or snapshot_id,),
                created_at=self.now(),
            )
            await self.snapshots.insert(snapshot)
            details = append_event(record.details, self.now(), "info", "snapshot taken", snapshot=snapshot_id)
            await self._swap(record, details=details)
            return snapshot

    async def snapshot_to_fork(self, owner: str, sandbox_id: str, count: int) -> tuple[SandboxRecord, str]:
        """The source of a fork (``_forks``), running, and a snapshot of it with its memory."""
        async with self.lock(sandbox_id):
            record = await self.owned(owner, sandbox_id)
            if record.state != S.RUNNING:
                raise ApiError(409, text.SANDBOX_NOT_RUNNING)
            try:
                snapshot_id = await self.backend.snapshot(sandbox_id, memory=True, transient=True)
            except SandboxRuntimeError as exc:
                log.error("the fork snapshot of %s failed: %s", sandbox_id, exc)
                raise runtime_refusal("snapshot", exc) from None
            details = append_event(record.details, self.now(), "info", "forked", count=str(count))
            return await self._swap(record, details=details), snapshot_id

    async def list_snapshots(
        self, owner: str, *, sandbox_id: str | None, limit: int, after: str | None, name: str | None = None
    ) -> SnapshotPage:
        try:
            return await self.snapshots.list(owner, sandbox_id=sandbox_id, name=name, limit=limit, after=after)
        except InvalidCursor:
            raise ApiError(400, text.INVALID_CURSOR) from None

    async def delete_template(self, owner: str, template_id: str) -> None:
        """``DELETE /templates/{id}``: a built template of the owner's, else a snapshot; 404 for anything else."""
        if self.built is not None and await self.built.delete(owner, template_id):
            return
        snapshot = await self.snapshots.get(template_id)
        if snapshot is None or snapshot.owner != owner:
            raise ApiError(404, text.TEMPLATE_NOT_FOUND.format(template=template_id))
        try:
            await self.backend.delete_snapshot(template_id)
        except SandboxRuntimeError as exc:
            raise runtime_refusal("delete_template", exc) from None
        await self.snapshots.delete(template_id)

    # -- the edge ----------------------------------------------------------------------

    async def target(self, sandbox_id: str) -> Target | None:
        """Where a data-plane request goes; resumes a paused sandbox that asked for it. None: 502.

        Asked on every proxied request, so the record may come from the store's memory (at most
        ``RECENT_S`` old, and never older than this server's own last change to it). Freed
        addresses wait 60 s before another sandbox gets them, so a late answer reaches no one else.
        """
        record = await self.store.get_recent(sandbox_id)
        if record is None:
            return None
        if record.state == S.PAUSED and record.details.auto_resume:
            async with self.lock(sandbox_id):
                record = await self.store.get(sandbox_id)
                if record is not None and record.state == S.PAUSED:
                    try:
                        record = await self._resume(record, record.details.timeout_s)
                    except ApiError:
                        return None
        if record is None or record.state != S.RUNNING or not record.details.address:
            return None
        return Target(record.details.address, record.details.traffic_token, record.details.network.mask_request_host)

    # -- the reaper ----------------------------------------------------------------------

    async def reap(self) -> list[str]:
        """Kill (or pause, when asked) every running sandbox past its expiry; returns their ids.

        A kill whose release failed left its record killing: each sweep tries it again.
        """
        acted = await self._retry_kills()
        for expired in await self.store.expired(self.now()):
            async with self.lock(expired.sandbox_id):
                record = await self.store.get(expired.sandbox_id)
                # Re-read under the lock: an extension that won the race leaves nothing to do.
                if record is None or record.state != S.RUNNING or record.expires_at > self.now():
                    continue
                try:
                    if record.auto_pause:
                        await self._pause(record, memory=record.details.auto_pause_memory)
                    else:
                        await self._kill(record)
                except (ApiError, StoreError, SandboxRuntimeError) as exc:
                    log.warning("expiring %s: %s", record.sandbox_id, exc)
                    continue
            acted.append(expired.sandbox_id)
        await self.admission.publish()  # kills and pauses, here or by request, gave memory back
        return acted

    async def _retry_kills(self) -> list[str]:
        done = []
        for stuck in await self.store.all([S.KILLING]):
            async with self.lock(stuck.sandbox_id):
                record = await self.store.get(stuck.sandbox_id)
                if record is None or record.state != S.KILLING:  # a kill in flight finished under the lock
                    continue
                try:
                    await self._kill(record)
                except (ApiError, StoreError, SandboxRuntimeError) as exc:
                    log.warning("killing %s again: %s", record.sandbox_id, exc)
                    continue
            self._locks.pop(stuck.sandbox_id, None)
            done.append(stuck.sandbox_id)
        return done

    # -- helpers -------------------------------------------------------------------------

    async def _swap(self, record: SandboxRecord, **changes: Any) -> SandboxRecord:
        typed = cast(Changes, changes)  # the store rejects any key Changes does not name
        return await self._guard(self.store.compare_and_swap(record.sandbox_id, record.generation, typed))

    @staticmethod
    async def _guard(operation: Any) -> SandboxRecord:
        try:
            result: SandboxRecord = await operation
        except GenerationConflict:
            raise ApiError(409, text.LIFECYCLE_CONFLICT) from None
        except NotFound:
            raise ApiError(404, text.SANDBOX_NOT_FOUND) from None
        return result
