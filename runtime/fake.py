"""An in-memory backend for unit tests of everything above the runtime.

It follows the lifecycle table exactly and keeps a per-sandbox "filesystem" (a dict) so
snapshot and pause semantics can be checked without real sandboxes: files survive both
kinds of pause, a snapshot copies them, a sandbox started from a snapshot sees them.
It is the ``fake`` entry of ``runtime.backends`` (held to the shared state machine like every
backend); a server cannot run on it, since no agent would answer ``/init``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .backend import (
    DEFAULT_FEATURES,
    Action,
    BackendError,
    Feature,
    Metrics,
    ReconcileReport,
    SandboxInfo,
    SandboxNotFoundError,
    SandboxSpec,
    State,
    TemplateNotFoundError,
    TransitionError,
    next_state,
)

if TYPE_CHECKING:
    from .backends import BackendOptions

__all__ = ["FEATURES", "FakeBackend", "open_backend", "prepare_host"]


@dataclass
class _Sandbox:
    spec: SandboxSpec
    state: State
    files: dict[str, bytes] = field(default_factory=dict)
    boot: int = 0  # increments each time processes start afresh
    continued_from: str | None = None  # the memory snapshot whose processes its first start continued


class FakeBackend:
    name = "fake"

    def __init__(
        self,
        templates: dict[str, dict[str, bytes]] | None = None,
        *,
        features: frozenset[Feature] = DEFAULT_FEATURES,  # fewer: for tests of how the server refuses the rest
    ) -> None:
        self.features = features
        self.templates: dict[str, dict[str, bytes]] = templates if templates is not None else {"base": {}}
        self._sandboxes: dict[str, _Sandbox] = {}
        self._snapshot_ids = itertools.count(1)
        self._taken_from: dict[str, str] = {}  # snapshot → the template of the sandbox it was taken of
        self._kept_memory: set[str] = set()  # snapshots taken with memory
        self._released: set[str] = set()  # snapshots deleted once nothing stands on them
        self._transient: set[str] = set()  # a fork's snapshots: released at the latest by reconcile

    def _get(self, sandbox_id: str) -> _Sandbox:
        found = self._sandboxes.get(sandbox_id)
        if found is None:
            raise SandboxNotFoundError(sandbox_id)
        return found

    def _info(self, sandbox: _Sandbox) -> SandboxInfo:
        host = "127.0.0.1" if sandbox.state is State.RUNNING else None
        return SandboxInfo(sandbox.spec.sandbox_id, sandbox.spec.template, sandbox.state, host)

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        if spec.sandbox_id in self._sandboxes:
            raise TransitionError(f"sandbox {spec.sandbox_id} already exists")
        if spec.template not in self.templates:
            raise TemplateNotFoundError(spec.template)
        sandbox = _Sandbox(spec, State.CREATED, dict(self.templates[spec.template]))
        self._sandboxes[spec.sandbox_id] = sandbox
        return self._info(sandbox)

    def _apply(self, sandbox_id: str, action: Action) -> _Sandbox:
        sandbox = self._get(sandbox_id)
        sandbox.state = next_state(sandbox.state, action)
        return sandbox

    async def start(self, sandbox_id: str) -> SandboxInfo:
        sandbox = self._apply(sandbox_id, Action.START)
        if sandbox.spec.template in self._kept_memory:
            sandbox.continued_from = sandbox.spec.template
        else:
            sandbox.boot += 1
        return self._info(sandbox)

    async def pause(self, sandbox_id: str, *, memory: bool) -> SandboxInfo:
        return self._info(self._apply(sandbox_id, Action.PAUSE_MEMORY if memory else Action.PAUSE_FILESYSTEM))

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        sandbox = self._get(sandbox_id)
        fresh = sandbox.state is State.STOPPED
        self._apply(sandbox_id, Action.RESUME)
        if fresh:
            sandbox.boot += 1  # a filesystem-only pause restarts the processes
        return self._info(sandbox)

    async def discard_memory(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self._apply(sandbox_id, Action.DISCARD_MEMORY))

    async def kill(self, sandbox_id: str) -> bool:
        killed = self._sandboxes.pop(sandbox_id, None) is not None
        for snapshot_id in sorted(self._released):
            with contextlib.suppress(TransitionError):
                await self.delete_snapshot(snapshot_id)
        return killed

    async def inspect(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self._get(sandbox_id))

    async def list(self) -> list[SandboxInfo]:
        return [self._info(s) for s in self._sandboxes.values()]

    async def metrics(self, sandbox_id: str) -> Metrics:
        sandbox = self._get(sandbox_id)
        limits = sandbox.spec.limits
        running = sandbox.state is State.RUNNING
        used = sum(len(data) for data in sandbox.files.values())
        return Metrics(
            limits.cpu_count,
            0,
            1 << 20 if running else 0,
            limits.memory_mb << 20,
            1 if running else 0,
            used,
            (limits.disk_mb or 1024) << 20,
        )

    async def snapshot(self, sandbox_id: str, *, memory: bool = False, transient: bool = False) -> str:
        sandbox = self._get(sandbox_id)
        next_state(sandbox.state, Action.SNAPSHOT)
        if memory and Feature.SNAPSHOT_MEMORY not in self.features:
            raise BackendError("this fake keeps no memory in snapshots")
        if memory and sandbox.state is not State.RUNNING:
            raise TransitionError(f"sandbox {sandbox_id} is not running: its memory cannot be kept")
        snapshot_id = f"snap-fake-{next(self._snapshot_ids)}"
        self.templates[snapshot_id] = dict(sandbox.files)
        self._taken_from[snapshot_id] = sandbox.spec.template
        if memory:
            self._kept_memory.add(snapshot_id)
        if transient:
            self._transient.add(snapshot_id)
        return snapshot_id

    async def release_snapshot(self, snapshot_id: str) -> None:
        if snapshot_id not in self.templates:
            return
        self._released.add(snapshot_id)
        self._kept_memory.discard(snapshot_id)
        with contextlib.suppress(TransitionError):
            await self.delete_snapshot(snapshot_id)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        if not snapshot_id.startswith("snap-") or snapshot_id not in self.templates:
            return False
        # Like crun's layers: a snapshot is in use while a sandbox runs on it or a snapshot sits on it.
        if any(sandbox.spec.template == snapshot_id for sandbox in self._sandboxes.values()) or any(
            parent == snapshot_id for parent in self._taken_from.values()
        ):
            raise TransitionError(f"snapshot {snapshot_id} is in use")
        del self.templates[snapshot_id]
        del self._taken_from[snapshot_id]
        self._kept_memory.discard(snapshot_id)
        self._released.discard(snapshot_id)
        self._transient.discard(snapshot_id)
        return True

    async def update_network(
        self, sandbox_id: str, *, allow_internet_access: bool, allow_out: tuple[str, ...], deny_out: tuple[str, ...]
    ) -> None:
        sandbox = self._get(sandbox_id)
        sandbox.spec = replace(
            sandbox.spec, allow_internet_access=allow_internet_access, allow_out=allow_out, deny_out=deny_out
        )

    async def address(self, sandbox_id: str, port: int) -> tuple[str, int]:
        sandbox = self._get(sandbox_id)
        if sandbox.state is not State.RUNNING:
            raise TransitionError(f"sandbox {sandbox_id} is {sandbox.state.value}")
        return "127.0.0.1", port

    async def reconcile(self) -> ReconcileReport:
        for snapshot_id in sorted(self._transient & set(self.templates)):
            await self.release_snapshot(snapshot_id)
        return ReconcileReport(tuple(sorted(self._sandboxes)), ())

    # Test helpers standing in for the agent's file API.
    def write(self, sandbox_id: str, path: str, data: bytes) -> None:
        sandbox = self._get(sandbox_id)
        if sandbox.state is not State.RUNNING:
            raise TransitionError("not running")
        sandbox.files[path] = data

    def read(self, sandbox_id: str, path: str) -> bytes | None:
        return self._get(sandbox_id).files.get(path)


# What the ``fake`` entry's backends provide (a FakeBackend made with fewer is for tests of refusals).
FEATURES: frozenset[Feature] = DEFAULT_FEATURES


def open_backend(options: BackendOptions) -> FakeBackend:
    """The ``fake`` entry of ``runtime.backends``: every template offered is an empty file tree."""
    return FakeBackend({template.name: {} for template in options.templates} if options.templates else None)


def prepare_host(say: Callable[[str], None]) -> None:
    """Nothing to install or check: the fake keeps everything in memory."""
