"""``GET /metrics``: CPU, memory and disk of the sandbox.

Inside a sandbox the agent's cgroup *is* the sandbox, so its limits and usage are the
sandbox's (``/proc/meminfo`` would show the host's memory). Both cgroup v2 and v1 are read;
without a cgroup limit the agent falls back to ``/proc``. CPU use is the share of the
available CPU time used since the previous sample, as envd reports it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_UNLIMITED = 1 << 60  # v1 reports "no limit" as a huge page-aligned number


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _stat_map(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


@dataclass(frozen=True)
class CgroupPaths:
    """Where this process's cgroup files are (v2 unified, or the v1 controllers)."""

    unified: Path | None
    memory: Path | None
    cpu: Path | None  # v1 cpuacct (usage)
    quota: Path | None = None  # v1 cpu (CFS quota)

    @staticmethod
    def discover(
        proc_self_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
    ) -> CgroupPaths:
        unified = memory = cpu = quota = None
        for line in (_read(proc_self_cgroup) or "").splitlines():
            hierarchy, controllers, path = [*line.split(":", 2), "", "", ""][:3]
            rel = path.lstrip("/")
            if hierarchy == "0" and controllers == "":
                candidate = root / rel
                if (candidate / "memory.current").exists() or (candidate / "cpu.stat").exists():
                    unified = candidate
            names = controllers.split(",")
            if "memory" in names and (root / "memory" / rel).exists():
                memory = root / "memory" / rel
            if "cpu" in names:
                for folder in ("cpu", "cpu,cpuacct"):
                    if (root / folder / rel / "cpu.cfs_quota_us").exists():
                        quota = root / folder / rel
            if "cpuacct" in names:
                for folder in ("cpuacct", "cpu,cpuacct"):
                    if (root / folder / rel / "cpuacct.usage").exists():
                        cpu = root / folder / rel
        return CgroupPaths(unified, memory, cpu, quota)


class MetricsCollector:
    """Takes samples; the first CPU baseline is taken at construction (agent start)."""

    def __init__(self, cgroups: CgroupPaths | None = None, disk_path: str = "/") -> None:
        self._cgroups = cgroups or CgroupPaths.discover()
        self._disk = disk_path
        self._last = self._cpu_times()

    def cpu_count(self) -> int:
        count = len(os.sched_getaffinity(0))
        quota = _read(self._cgroups.unified / "cpu.max") if self._cgroups.unified else None
        if quota:
            limit, _, period = quota.partition(" ")
            if limit != "max" and period:
                count = min(count, max(1, math.ceil(int(limit) / int(period))))
        elif self._cgroups.quota is not None:
            limit_us = _int(_read(self._cgroups.quota / "cpu.cfs_quota_us"))
            period_us = _int(_read(self._cgroups.quota / "cpu.cfs_period_us"))
            if limit_us is not None and period_us and limit_us > 0:
                count = min(count, max(1, math.ceil(limit_us / period_us)))
        return count

    def _cpu_times(self) -> tuple[float, float]:
        """(busy seconds, wall seconds times CPUs) since an arbitrary origin."""
        now = time.monotonic()
        usage = None
        if self._cgroups.unified is not None:
            usec = _stat_map(_read(self._cgroups.unified / "cpu.stat")).get("usage_usec")
            usage = usec / 1e6 if usec is not None else None
        elif self._cgroups.cpu is not None:
            nsec = _int(_read(self._cgroups.cpu / "cpuacct.usage"))
            usage = nsec / 1e9 if nsec is not None else None
        if usage is not None:
            return usage, now * self.cpu_count()
        fields = (_read(Path("/proc/stat")) or "cpu 0 0 0 0").splitlines()[0].split()[1:]
        ticks = [int(v) for v in fields[:8]]
        total = sum(ticks)
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        hz = os.sysconf("SC_CLK_TCK")
        return (total - idle) / hz, total / hz

    def cpu_used_pct(self) -> float:
        busy, total = self._cpu_times()
        last_busy, last_total = self._last
        self._last = (busy, total)
        if busy <= last_busy:
            return 0.0
        if total <= last_total:
            return 100.0
        return round(min(100.0, max(0.0, 100.0 * (busy - last_busy) / (total - last_total))), 2)

    def memory(self) -> tuple[int, int, int]:
        """(total, used, cache) in bytes."""
        meminfo = {}
        for line in (_read(Path("/proc/meminfo")) or "").splitlines():
            key, _, rest = line.partition(":")
            meminfo[key] = int(rest.split()[0]) * 1024 if rest.split() else 0
        total = meminfo.get("MemTotal", 0)
        used = total - meminfo.get("MemAvailable", 0)
        cache = meminfo.get("Cached", 0) + meminfo.get("SReclaimable", 0)
        if self._cgroups.unified is not None:
            limit = _read(self._cgroups.unified / "memory.max")
            current = _int(_read(self._cgroups.unified / "memory.current"))
            stats = _stat_map(_read(self._cgroups.unified / "memory.stat"))
            if current is not None:
                if limit and limit != "max":
                    total = min(total, int(limit))
                cache = stats.get("file", 0)
                used = max(0, current - stats.get("inactive_file", 0))
        elif self._cgroups.memory is not None:
            limit_v1 = _int(_read(self._cgroups.memory / "memory.limit_in_bytes"))
            current = _int(_read(self._cgroups.memory / "memory.usage_in_bytes"))
            stats = _stat_map(_read(self._cgroups.memory / "memory.stat"))
            if current is not None:
                if limit_v1 is not None and limit_v1 < _UNLIMITED:
                    total = min(total, limit_v1)
                cache = stats.get("total_cache", stats.get("cache", 0))
                used = max(0, current - stats.get("total_inactive_file", stats.get("inactive_file", 0)))
        return total, used, cache

    def sample(self) -> dict[str, Any]:
        total, used, cache = self.memory()
        disk = os.statvfs(self._disk)
        return {
            "ts": int(time.time()),
            "cpu_count": self.cpu_count(),
            "cpu_used_pct": self.cpu_used_pct(),
            "mem_total_mib": total // (1024 * 1024),
            "mem_used_mib": used // (1024 * 1024),
            "mem_total": total,
            "mem_used": used,
            "mem_cache": cache,
            "disk_total": disk.f_blocks * disk.f_frsize,
            "disk_used": (disk.f_blocks - disk.f_bavail) * disk.f_frsize,
        }
