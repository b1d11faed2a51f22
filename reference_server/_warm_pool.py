"""Started sandboxes kept ready per template, so that a create claims one instead of booting one.

A create whose runtime shape (``Shape``: the layer the runtime starts, the limits, the network)
matches a warm sandbox takes it (``claim``). The warm sandbox was created and started under an id
drawn like any other and shown to nobody, with the host name, limits and network that create
would have given it; the claim writes the record and sends ``/init`` (env vars, token, user,
working directory, clock), which a cold create also sends only after its start. So a claimed
sandbox is a cold one that booted sooner: what its boot started (the interpreter's kernels) saw
no tenant's data in either case, and everything a client can observe comes from the record and
``/init``. A warm sandbox whose agent no longer answers is killed and the create goes cold under
the same id (``SandboxService.create``).

What is kept: ``warm_pool`` (template → count) of the server's own templates, within
``warm_pool_memory_mb`` of memory limits (``docs/SERVER.md``). The pool is refilled in the
background one start at a time, so refilling never takes the host from the creates it serves,
after every claim and every ``REFILL_INTERVAL_S``. An entry is offered once the runtime has
started it and, for a template whose boot starts more than the agent, once its probe (``PROBES``)
answers 200: a claimed interpreter sandbox's first run then finds its kernels up.

Memory (``Admission.hold_warm``): a warm sandbox's memory is held only while the host's budget has
room for it with everything counted, and is published to the host's ledger, but no tenant's
admission counts it; while the budget is over (tenants took the room) the refill kills warm
sandboxes instead of starting them. The pool lives on memory nobody else needs.

Restarts: warm sandboxes have no record. A server that stops closes its pool (``aclose`` kills
them); one that was killed leaves orphans, which start-up reconciliation kills, and the new server
refills. Each sweep also drops entries the runtime no longer runs and shapes nobody wants any more
(a changed setting, a template rebuilt on another layer).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import httpx

from contract.protocol import INTERPRETER_PORT
from runtime.backend import Backend, Limits, SandboxRuntimeError, SandboxSpec, State, VolumeMount
from runtime.templates import INTERPRETER_TEMPLATE

from ._admission import Admission

__all__ = ["PROBES", "REFILL_INTERVAL_S", "Shape", "Warm", "WarmPool"]

log = logging.getLogger(__name__)

REFILL_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 60.0  # a warm interpreter's kernels; past it the entry is dropped
PROBE_STEP_S = 0.05
FAILURE_BACKOFF_S = 30.0  # after a failed start, that shape waits before the next try
# Template → (port, path) that answers 200 once what the template's boot starts is ready.
PROBES: Mapping[str, tuple[int, str]] = {INTERPRETER_TEMPLATE: (INTERPRETER_PORT, "/startup")}


@dataclass(frozen=True)
class Shape:
    """Everything of a sandbox that is fixed when the runtime creates it; equal shapes are interchangeable."""

    template: str  # what the runtime starts: a server template (warm pools hold only these)
    limits: Limits
    allow_internet_access: bool = False
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    volumes: tuple[VolumeMount, ...] = ()  # never pooled: no configured shape has any

    def spec(self, sandbox_id: str, *, access_token_hash: str | None = None) -> SandboxSpec:
        return SandboxSpec(
            sandbox_id=sandbox_id,
            access_token_hash=access_token_hash,
            template=self.template,
            limits=self.limits,
            hostname=sandbox_id,
            allow_internet_access=self.allow_internet_access,
            allow_out=self.allow_out,
            deny_out=self.deny_out,
            volumes=self.volumes,
        )


@dataclass(frozen=True)
class Warm:
    sandbox_id: str
    host: str  # where the agent answers
    shape: Shape
    ready_at: float  # monotonic


class _PoolClosedError(Exception):
    """The pool closed while a start waited for its probe."""


class WarmPool:
    def __init__(
        self,
        *,
        backend: Backend,
        admission: Admission,
        wanted: Callable[[], Mapping[Shape, int]],  # shape → how many to keep (the server's settings)
        new_id: Callable[[], str],
        memory_mb: int,  # the most the pool's memory limits may add up to
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[str, int, str], Awaitable[bool]] | None = None,
    ) -> None:
        self._backend = backend
        self._admission = admission
        self._wanted = wanted
        self._new_id = new_id
        self._memory_mb = memory_mb
        self._clock = clock
        self._probe = probe or _http_probe
        self._ready: dict[Shape, collections.deque[Warm]] = collections.defaultdict(collections.deque)
        self._starting: Shape | None = None
        self._in_flight: asyncio.Future[bool] | None = None  # the start under way, if any
        self._failed: dict[Shape, float] = {}  # shape → when its last start failed
        self._wake = asyncio.Event()
        self._closed = False
        self.claims = 0  # creates served warm
        self.misses = 0  # creates of a wanted shape that found none ready (the pool is too small for them)

    # -- what creates see ------------------------------------------------------------------

    def claim(self, shape: Shape) -> Warm | None:
        """A ready sandbox of ``shape``, now the caller's (``claimed`` or ``give_back`` it), or None."""
        ready = self._ready.get(shape)
        if not ready:
            if shape in self._wanted():
                self.misses += 1
            return None
        warm = ready.popleft()
        self.claims += 1
        self._wake.set()
        return warm

    def claimed(self, warm: Warm) -> None:
        """The claim's record exists: its memory counts there now."""
        self._admission.release_warm(warm.sandbox_id)

    async def discard(self, warm: Warm) -> None:
        """A claim that could not be recorded: the sandbox is killed."""
        await self._kill(warm.sandbox_id)

    def give_back(self, warm: Warm) -> None:
        """A claim that was refused before its record was written (a 429): offered again, first."""
        if self._closed:
            return
        self._ready[warm.shape].appendleft(warm)

    def ready(self) -> dict[Shape, int]:
        return {shape: len(entries) for shape, entries in self._ready.items() if entries}

    @property
    def held_mb(self) -> int:
        held = sum(warm.shape.limits.memory_mb for entries in self._ready.values() for warm in entries)
        return held + (self._starting.limits.memory_mb if self._starting else 0)

    # -- the refill task ---------------------------------------------------------------------

    async def run(self) -> None:
        """Refill until cancelled: after each claim, and every ``REFILL_INTERVAL_S``."""
        while True:
            self._wake.clear()  # before the sweep: a claim during it wakes the next one
            try:
                await self.sweep()
            except Exception:  # one failed sweep must not end the pool
                log.exception("warm pool sweep failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), REFILL_INTERVAL_S)

    async def sweep(self) -> None:
        """Drop what is dead or unwanted, shed while the host is over budget, then start what is missing."""
        wanted = self._wanted()
        await self._drop_unwanted(wanted)
        await self._drop_dead()
        while self.held_mb and await self._admission.over_budget():
            if not await self._drop_one():
                break
        started = 0
        for shape, count in wanted.items():
            while not self._closed and len(self._ready[shape]) < count and self._may_start(shape):
                if not await self._start(shape):
                    break
                started += 1
        if started:
            ready = ", ".join(f"{shape.template} {len(self._ready[shape])}/{count}" for shape, count in wanted.items())
            log.info("warm pool: %s ready (%d claimed, %d creates found none)", ready, self.claims, self.misses)

    def _may_start(self, shape: Shape) -> bool:
        failed = self._failed.get(shape)
        if failed is not None and self._clock() - failed < FAILURE_BACKOFF_S:
            return False
        return self.held_mb + shape.limits.memory_mb <= self._memory_mb

    async def _start(self, shape: Shape) -> bool:
        """One warm sandbox of ``shape``; False when there was no room or it failed.

        The start runs in a task of its own that a cancelled refill does not cancel: a runtime
        operation cut off midway (its threads run on) could leave half a sandbox behind. ``aclose``
        waits for it, then kills what it made.
        """
        task = asyncio.ensure_future(self._start_one(shape))
        self._in_flight = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._in_flight = None

    async def _start_one(self, shape: Shape) -> bool:
        sandbox_id = self._new_id()
        if not await self._admission.hold_warm(sandbox_id, shape.limits.memory_mb):
            return False
        self._starting = shape
        try:
            await self._backend.create(shape.spec(sandbox_id))
            info = await self._backend.start(sandbox_id)
            if info.host is None:
                raise SandboxRuntimeError(f"{sandbox_id}: the runtime gave no address")
            await self._wait_ready(sandbox_id, shape)
        except BaseException as exc:
            await self._kill(sandbox_id)  # whatever of it exists (a failed create may have left a part)
            if not isinstance(exc, (SandboxRuntimeError, OSError, TimeoutError, _PoolClosedError)):
                raise
            if not isinstance(exc, _PoolClosedError):
                self._failed[shape] = self._clock()
                log.warning("warm %s sandbox did not start: %s", shape.template, exc)
            return False
        finally:
            self._starting = None
        self._failed.pop(shape, None)
        self._ready[shape].append(Warm(sandbox_id, info.host, shape, self._clock()))
        return True

    async def _wait_ready(self, sandbox_id: str, shape: Shape) -> None:
        probe = PROBES.get(shape.template)
        if probe is None:
            return
        port, path = probe
        host, host_port = await self._backend.address(sandbox_id, port)
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            while not await self._probe(host, host_port, path):
                if self._closed:
                    raise _PoolClosedError()
                await asyncio.sleep(PROBE_STEP_S)

    async def _drop_unwanted(self, wanted: Mapping[Shape, int]) -> None:
        for shape, entries in list(self._ready.items()):
            while len(entries) > wanted.get(shape, 0):
                await self._kill(entries.pop().sandbox_id)  # the newest first: the oldest are surely ready

    async def _drop_dead(self) -> None:
        for entries in self._ready.values():
            for warm in list(entries):
                try:
                    alive = (await self._backend.inspect(warm.sandbox_id)).state is State.RUNNING
                except SandboxRuntimeError:
                    alive = False
                if not alive and warm in entries:  # a claim may have taken it meanwhile
                    entries.remove(warm)
                    log.warning("warm sandbox %s stopped running: dropped", warm.sandbox_id)
                    await self._kill(warm.sandbox_id)

    async def _drop_one(self) -> bool:
        largest = max(
            (entries for entries in self._ready.values() if entries),
            key=lambda entries: entries[0].shape.limits.memory_mb,
            default=None,
        )
        if largest is None:
            return False
        await self._kill(largest.pop().sandbox_id)
        return True

    async def _kill(self, sandbox_id: str) -> None:
        try:
            await self._backend.kill(sandbox_id)
        except SandboxRuntimeError as exc:  # an orphan now: the next start-up reconciliation kills it
            log.error("killing warm sandbox %s failed: %s", sandbox_id, exc)
        finally:
            self._admission.release_warm(sandbox_id)

    async def aclose(self) -> None:
        """Kill every warm sandbox, once a start in flight has ended (the refill task is cancelled first)."""
        self._closed = True
        if self._in_flight is not None:
            await asyncio.gather(self._in_flight, return_exceptions=True)
        for entries in self._ready.values():
            while entries:
                await self._kill(entries.popleft().sandbox_id)
        await self._admission.publish()


async def _http_probe(host: str, port: int, path: str) -> bool:
    host_part = f"[{host}]" if ":" in host else host
    try:
        # Plain HTTP to a sandbox: no certificate store to load (~28 ms of the event loop per client).
        async with httpx.AsyncClient(timeout=2.0, trust_env=False, verify=False) as client:  # noqa: S501 - http:// only
            return (await client.get(f"http://{host_part}:{port}{path}")).status_code == 200
    except httpx.TransportError:
        return False
