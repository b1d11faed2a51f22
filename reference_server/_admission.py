"""Admission control: whether a sandbox may start now, refused with a 429 the clients turn into RateLimit.

Both official clients map a control-plane 429 to their rate-limit error (Python
``RateLimitException``, JS ``RateLimitError``) and put the body's ``message`` in its text
(``../shared/docs/PROTOCOL.md`` §9). A 503 would be a plain ``SandboxError`` in JS (and is mapped
only by newer Python clients), so every limit here answers 429: each means "not now, try later".

The limits, checked on every create and, where a sandbox starts to run again, on every resume:

- **running per owner** (``owner_max_running``): sandboxes creating, running, pausing or resuming.
  Paused sandboxes do not count, as on E2B; resuming one counts again, so a resume past the limit
  is refused and the sandbox stays paused.
- **create rate per owner** (``owner_create_rate`` per second, ``owner_create_burst`` at once): a
  token bucket; every create that passed its input checks takes a token, admitted or not.
- **memory of the host**: the memory limits of the running sandboxes (and of those paused with
  their memory, which stays frozen on the host) together stay within
  ``MemTotal`` (``/proc/meminfo``) times ``memory_overcommit``; also checked on resume.
- **sandboxes in all** (``max_sandboxes``): running and paused, every owner.

Counts come from the store (the truth, also after a restart) plus this process's reservations
for starts in flight, read and reserved under one lock: of 50 parallel creates with room for 10,
exactly 10 are admitted. A reservation ends when its create or resume ends, so a failed start
frees it at once, and a kill frees its slot as soon as the record leaves the counted states.

Warm sandboxes (``_warm_pool``) are the server's own, started before any create asks for them.
Their memory is held (``hold_warm``: only while the budget has room for it, everything counted)
and published to the host's ledger, but a tenant's admission never counts it: the pool lives on
memory nobody else needs, and gives its sandboxes back while the budget is over (``over_budget``).
A claimed warm sandbox is counted once, as the create that claimed it.

Python clients retry a 429 by themselves (three times by default): from e2b 2.50 one that has a
``Retry-After``, waiting that long; from 2.60 any 429 unless the answer says ``Should-Retry: false``.
So the rate limit's 429 says when its next token is there (``Retry-After``, ``Should-Retry:
true``), and the other limits say ``Should-Retry: false``: only a kill or a pause makes room, so
a retry within seconds would only delay the refusal the caller has to act on.

Host-wide for memory: with a ``MemoryLedger`` (``runtime.host``; the serve command gives each
server the host's), the budget holds for every server on the host together. Each server
publishes what it holds when a start is admitted or ends and on every reaper sweep (kills and
pauses give memory back), and checks against the others' published totals under the host's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from contract.protocol import RETRY_AFTER_HEADER, SHOULD_RETRY_HEADER
from runtime.host import MemoryLedger

from ._config import ServerConfig
from ._errors import ApiError
from ._records import SandboxRecord, SandboxState
from ._store import Store

_NO_RETRY = {SHOULD_RETRY_HEADER: "false"}  # a capacity limit: waiting seconds does not make room

__all__ = ["RUNNING_STATES", "Admission", "AdmissionLimits", "TokenBucket", "admission_limits", "host_memory_mb"]

S = SandboxState
RUNNING_STATES = frozenset({S.CREATING, S.RUNNING, S.PAUSING, S.RESUMING})  # count against the owner
MEMORY_STATES = RUNNING_STATES | {S.KILLING}  # a kill that failed still holds the sandbox's memory
LIVE_STATES = RUNNING_STATES | {S.PAUSED}  # count against max_sandboxes
MEMINFO = Path("/proc/meminfo")


def _holds_memory(record: SandboxRecord, *, paused_on_disk: bool = False) -> bool:
    # A sandbox paused with its memory is frozen, not gone: its pages stay on the host, unless the
    # backend writes them to disk (``Feature.PAUSE_MEMORY_ON_DISK``) and frees the RAM.
    frozen = record.state is S.PAUSED and record.details.paused_memory is True and not paused_on_disk
    return record.state in MEMORY_STATES or frozen


def host_memory_mb(meminfo: Path = MEMINFO) -> int:
    """The host's ``MemTotal`` in MiB."""
    for line in meminfo.read_text(encoding="ascii").splitlines():
        name, _, rest = line.partition(":")
        if name == "MemTotal":
            kib = int(rest.split()[0])
            return kib // 1024
    raise ValueError(f"{meminfo}: no MemTotal line")


@dataclass(frozen=True)
class AdmissionLimits:
    """The configured limits (``docs/SERVER.md``); ``host_memory_mb`` None: read ``/proc/meminfo``."""

    owner_max_running: int = 100
    owner_create_rate: float = 5.0
    owner_create_burst: int = 100
    max_sandboxes: int = 1000
    memory_overcommit: float = 4.0
    host_memory_mb: int | None = None


def admission_limits(config: ServerConfig) -> AdmissionLimits:
    return AdmissionLimits(
        owner_max_running=config.owner_max_running,
        owner_create_rate=config.owner_create_rate,
        owner_create_burst=config.owner_create_burst,
        max_sandboxes=config.max_sandboxes,
        memory_overcommit=config.memory_overcommit,
    )


@dataclass
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; starts full."""

    rate: float
    burst: int
    tokens: float = field(init=False)
    stamp: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def wait_s(self) -> int:
        """Whole seconds, at least 1, until the next token (read after a ``take`` that failed)."""
        return max(1, math.ceil((1.0 - self.tokens) / self.rate)) if self.rate > 0 else 60

    def take(self, now: float) -> bool:
        if self.stamp is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass(frozen=True)
class _Reservation:
    owner: str
    memory_mb: int


class Admission:
    def __init__(
        self,
        limits: AdmissionLimits,
        store: Store,
        *,
        clock: Callable[[], float] = time.monotonic,
        ledger: MemoryLedger | None = None,  # the host's; None: this server's commitments only
        paused_on_disk: bool = False,  # the backend's memory pause frees RAM: paused sandboxes hold none
    ) -> None:
        self.limits = limits
        self._paused_on_disk = paused_on_disk
        self._store = store
        self._clock = clock
        self._ledger = ledger
        self._server = str(Path(store.path).absolute())  # one entry per data folder in the host's ledger
        self._lock = asyncio.Lock()
        self._reserved: dict[str, _Reservation] = {}  # sandbox id → a start in flight
        self._warm: dict[str, int] = {}  # sandbox id → MiB of a warm sandbox no create has claimed
        self._buckets: dict[str, TokenBucket] = {}
        memory = limits.host_memory_mb if limits.host_memory_mb is not None else host_memory_mb()
        self.memory_budget_mb = int(memory * limits.memory_overcommit)

    @contextlib.asynccontextmanager
    async def create(self, owner: str, sandbox_id: str, memory_mb: int) -> AsyncIterator[None]:
        """Hold a place for a new sandbox while it is created; 429 when there is none."""
        bucket = self._buckets.setdefault(
            owner, TokenBucket(self.limits.owner_create_rate, self.limits.owner_create_burst)
        )
        if not bucket.take(self._clock()):
            raise ApiError(
                429,
                f"Sandbox create rate limit reached: at most {self.limits.owner_create_rate:g} per second "
                f"(bursts of {self.limits.owner_create_burst})",
                {SHOULD_RETRY_HEADER: "true", RETRY_AFTER_HEADER: str(bucket.wait_s())},
            )
        async with self._reserve(owner, sandbox_id, memory_mb, new=True):
            yield

    @contextlib.asynccontextmanager
    async def resume(self, record: SandboxRecord) -> AsyncIterator[None]:
        """Hold a running place for a paused sandbox while it resumes; 429 when there is none."""
        async with self._reserve(record.owner, record.sandbox_id, record.details.memory_mb, new=False):
            yield

    @contextlib.asynccontextmanager
    async def _reserve(self, owner: str, sandbox_id: str, memory_mb: int, *, new: bool) -> AsyncIterator[None]:
        async with self._lock:  # counting and reserving are one step: parallel starts cannot all pass
            records = await self._store.all(LIVE_STATES | MEMORY_STATES)
            reserved = dict(self._reserved)
            # Published, never checked: warm sandboxes other than the one this create claims.
            warm_mb = sum(mb for key, mb in self._warm.items() if key != sandbox_id)
            if self._ledger is None:
                self._check(records, reserved, owner, sandbox_id, memory_mb, new=new, elsewhere_mb=0)
            else:  # the host's lock too: another server's check waits for this one's answer
                await asyncio.to_thread(
                    self._on_host,
                    lambda elsewhere: (
                        memory_mb
                        + warm_mb
                        + self._check(records, reserved, owner, sandbox_id, memory_mb, new=new, elsewhere_mb=elsewhere)
                    ),
                )
            self._reserved[sandbox_id] = _Reservation(owner, memory_mb)
        try:
            yield
        finally:
            self._reserved.pop(sandbox_id, None)
            await self.publish()

    def _on_host(self, total_mb: Callable[[int], int]) -> None:
        """Under the host's lock: publish ``total_mb(what the other servers hold)`` as this server's."""
        assert self._ledger is not None
        with self._ledger.committing(self._server) as (elsewhere_mb, publish):
            publish(total_mb(elsewhere_mb))

    async def publish(self) -> None:
        """Tell the host's ledger what this server holds now (kills, pauses and failed starts give memory back)."""
        if self._ledger is None:
            return
        async with self._lock:
            held = await self._held_mb()
            await asyncio.to_thread(self._on_host, lambda _elsewhere: held)

    async def _held_mb(self) -> int:
        """Everything this server holds: its sandboxes' memory, starts in flight, warm sandboxes."""
        records = await self._store.all(LIVE_STATES | MEMORY_STATES)
        memory = _memory(records, dict(self._reserved), paused_on_disk=self._paused_on_disk)
        return sum({**memory, **self._warm}.values())

    async def hold_warm(self, sandbox_id: str, memory_mb: int) -> bool:
        """Hold memory for a warm sandbox if the budget has room with everything counted; else False."""
        async with self._lock:
            held = await self._held_mb()
            if self._ledger is None:
                room = held + memory_mb <= self.memory_budget_mb
            else:

                def total(elsewhere_mb: int) -> int:
                    nonlocal room
                    room = elsewhere_mb + held + memory_mb <= self.memory_budget_mb
                    return held + memory_mb if room else held

                room = False
                await asyncio.to_thread(self._on_host, total)
            if room:
                self._warm[sandbox_id] = memory_mb
            return room

    def release_warm(self, sandbox_id: str) -> None:
        """A warm sandbox was claimed (its record counts it now) or killed; published with the next change."""
        self._warm.pop(sandbox_id, None)

    async def over_budget(self) -> bool:
        """Whether everything held on the host, warm sandboxes too, is past the budget (tenants took the room)."""
        async with self._lock:
            held = await self._held_mb()
            if self._ledger is None:
                return held > self.memory_budget_mb
            over = False

            def total(elsewhere_mb: int) -> int:
                nonlocal over
                over = elsewhere_mb + held > self.memory_budget_mb
                return held

            await asyncio.to_thread(self._on_host, total)
            return over

    def _check(
        self,
        records: list[SandboxRecord],
        reserved: dict[str, _Reservation],
        owner: str,
        sandbox_id: str,
        memory_mb: int,
        *,
        new: bool,
        elsewhere_mb: int,
    ) -> int:
        """Raise the 429 of the first limit the start would pass; else the memory this server holds without it."""
        # Each sandbox once: a reservation's record may already be in the store.
        running = {r.sandbox_id: r.owner for r in records if r.state in RUNNING_STATES}
        running.update({key: held.owner for key, held in reserved.items()})
        memory = _memory(records, reserved, paused_on_disk=self._paused_on_disk)
        live = {r.sandbox_id for r in records if r.state in LIVE_STATES} | set(reserved)
        for counted in (running, memory):
            counted.pop(sandbox_id, None)  # a resume's own record: counted below as the one to admit
        limits = self.limits
        owned = sum(1 for holder in running.values() if holder == owner)
        if owned >= limits.owner_max_running:
            raise ApiError(
                429,
                f"Concurrent sandbox limit reached: {owned} of at most {limits.owner_max_running} running; "
                "kill or pause one first",
                _NO_RETRY,
            )
        if new and len(live) >= limits.max_sandboxes:
            raise ApiError(
                429, f"This server holds its most sandboxes ({limits.max_sandboxes}, running and paused)", _NO_RETRY
            )
        committed = sum(memory.values())
        if elsewhere_mb + committed + memory_mb > self.memory_budget_mb:
            shared = f", {elsewhere_mb} MiB of it by other servers on this host" if elsewhere_mb else ""
            raise ApiError(
                429,
                f"The server has no memory for another sandbox "
                f"({elsewhere_mb + committed} of {self.memory_budget_mb} MiB committed{shared})",
                _NO_RETRY,
            )
        return committed


def _memory(
    records: list[SandboxRecord], reserved: dict[str, _Reservation], *, paused_on_disk: bool = False
) -> dict[str, int]:
    """Sandbox id → MiB for every sandbox whose memory this server holds, and every start in flight."""
    memory = {r.sandbox_id: r.details.memory_mb for r in records if _holds_memory(r, paused_on_disk=paused_on_disk)}
    memory.update({key: held.memory_mb for key, held in reserved.items()})
    return memory
