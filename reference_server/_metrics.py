"""Resource samples per sandbox, taken periodically from the runtime and kept in memory.

E2B reports metrics as a time series (``GET /sandboxes/{id}/metrics`` with ``start``/``end``),
so one reading is not enough: CPU use is a rate, the difference of the cgroup's CPU time between
two readings divided by the wall time between them and the CPU count. The book keeps a bounded
window per sandbox (an hour at the default interval); samples are observations, not state, so a
restarted server starts a new window rather than persisting them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from runtime.backend import Backend, Metrics, SandboxRuntimeError

__all__ = ["MetricsBook", "Sample"]

log = logging.getLogger(__name__)

WINDOW = 720  # samples kept per sandbox: one hour at five seconds


@dataclass(frozen=True)
class Sample:
    at: datetime
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    disk_used: int
    disk_total: int


@dataclass(frozen=True)
class _Reading:
    at: datetime
    metrics: Metrics


class MetricsBook:
    def __init__(self, backend: Backend, *, clock: Callable[[], datetime] | None = None, window: int = WINDOW) -> None:
        self._backend = backend
        self._clock = clock or (lambda: datetime.now(UTC))
        self._window = window
        self._samples: dict[str, deque[Sample]] = {}
        self._last: dict[str, _Reading] = {}

    async def sample(self, sandbox_id: str) -> Sample | None:
        """Read the runtime's counters now and record a sample; None when the sandbox is gone."""
        try:
            metrics = await self._backend.metrics(sandbox_id)
        except SandboxRuntimeError:
            return None
        now = self._clock()
        previous = self._last.get(sandbox_id)
        self._last[sandbox_id] = _Reading(now, metrics)
        cpu = 0.0
        if previous is not None:
            elapsed_ns = (now - previous.at).total_seconds() * 1e9
            used_ns = metrics.cpu_usage_ns - previous.metrics.cpu_usage_ns
            if elapsed_ns > 0 and used_ns >= 0 and metrics.cpu_count > 0:
                cpu = min(100.0, 100.0 * used_ns / (elapsed_ns * metrics.cpu_count))
        sample = Sample(
            at=now,
            cpu_count=metrics.cpu_count,
            cpu_used_pct=round(cpu, 2),
            mem_used=metrics.memory_bytes,
            mem_total=metrics.memory_limit_bytes,
            disk_used=metrics.disk_used_bytes,
            disk_total=metrics.disk_total_bytes,
        )
        self._samples.setdefault(sandbox_id, deque(maxlen=self._window)).append(sample)
        return sample

    def series(self, sandbox_id: str, start: datetime | None = None, end: datetime | None = None) -> list[Sample]:
        return [
            sample
            for sample in self._samples.get(sandbox_id, ())
            if (start is None or sample.at >= start) and (end is None or sample.at <= end)
        ]

    def latest(self, sandbox_id: str) -> Sample | None:
        samples = self._samples.get(sandbox_id)
        return samples[-1] if samples else None

    def drop(self, sandbox_id: str) -> None:
        self._samples.pop(sandbox_id, None)
        self._last.pop(sandbox_id, None)

    async def run(self, running: Callable[[], Awaitable[Iterable[str]]], interval: float) -> None:
        """Sample every running sandbox every ``interval`` seconds until cancelled."""
        while True:
            try:
                ids = list(await running())
                for sandbox_id in ids:
                    await self.sample(sandbox_id)
                for gone in set(self._samples) - set(ids):
                    # Paused sandboxes keep their history; only the runtime's absence drops it.
                    if await self._gone(gone):
                        self.drop(gone)
            except Exception:  # a failed sweep must not end sampling for good
                log.exception("metrics sweep failed")
            await asyncio.sleep(interval)

    async def _gone(self, sandbox_id: str) -> bool:
        try:
            await self._backend.inspect(sandbox_id)
        except SandboxRuntimeError:
            return True
        return False
