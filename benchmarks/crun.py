"""Benchmark of crun sandboxes: create→agent healthy and kill, cold and warm, with floors.

Floors measured in the same run: ``crun run /bin/true`` on the same template (overlay
root filesystem, same namespaces but no network and no agent). "Cold" drops the page
cache first, so the template's files come from disk. Also reports idle memory per
sandbox (from each sandbox's memory cgroup) and how many idle sandboxes fit in the
memory this host has available. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime import host
from runtime.backend import Limits, SandboxSpec
from runtime.crun import CrunBackend, host_checkpoint_tools
from runtime.templates import ensure_template

from ._stats import quantiles_ms

HERE = Path(__file__).parent
LIMITS = Limits(cpu_count=1, memory_mb=512, pids=256)


def _drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _floor(rootfs: Path, iterations: int) -> list[float]:
    """``crun run /bin/true`` over an overlay of the template: the mechanism's own cost."""
    samples = []
    with tempfile.TemporaryDirectory(prefix="crun-floor-", dir="/var/tmp") as tmp:
        bundle = Path(tmp)
        for name in ("upper", "work", "rootfs"):
            (bundle / name).mkdir()
        subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={rootfs},upperdir={bundle / 'upper'},workdir={bundle / 'work'}",
                str(bundle / "rootfs"),
            ],
            check=True,
        )
        try:
            subprocess.run(["crun", "spec"], cwd=bundle, check=True)
            config = json.loads((bundle / "config.json").read_text())
            config["process"].update(args=["/bin/true"], terminal=False)
            (bundle / "config.json").write_text(json.dumps(config))
            state = bundle / "state"
            for index in range(iterations):
                start = time.perf_counter()
                subprocess.run(["crun", "--root", str(state), "run", f"floor{index}"], cwd=bundle, check=True)
                samples.append(time.perf_counter() - start)
        finally:
            subprocess.run(["umount", str(bundle / "rootfs")], check=True)
    return samples


async def _lifecycle(backend: CrunBackend, prefix: str, count: int, cold: bool) -> tuple[list[float], list[float]]:
    up, down = [], []
    for index in range(count):
        sandbox_id = f"{prefix}{index}"
        if cold:
            _drop_caches()
        start = time.perf_counter()
        await backend.create(SandboxSpec(sandbox_id, "base", limits=LIMITS))
        await backend.start(sandbox_id)
        up.append(time.perf_counter() - start)
        start = time.perf_counter()
        await backend.kill(sandbox_id)
        down.append(time.perf_counter() - start)
    return up, down


async def _idle_memory(backend: CrunBackend, count: int) -> list[int]:
    ids = [f"idle{i}" for i in range(count)]
    try:
        for sandbox_id in ids:
            await backend.create(SandboxSpec(sandbox_id, "base", limits=LIMITS))
            await backend.start(sandbox_id)
        await asyncio.sleep(3)
        return [(await backend.metrics(sandbox_id)).memory_bytes for sandbox_id in ids]
    finally:
        for sandbox_id in ids:
            await backend.kill(sandbox_id)


def _available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def run(iterations: int, idle: int) -> dict[str, Any]:
    host.prepare()
    template = ensure_template("base")
    state = Path(tempfile.mkdtemp(prefix="crun-bench-", dir="/var/tmp"))
    state.chmod(0o755)  # sandbox root is an unprivileged host uid that must reach its bundle
    try:
        backend = CrunBackend(state, checkpoint_tools=host_checkpoint_tools())  # as a server opens it
        floor = _floor(template.rootfs, iterations)
        cold_up, cold_down = asyncio.run(_lifecycle(backend, "cold", max(3, iterations // 5), cold=True))
        warm_up, warm_down = asyncio.run(_lifecycle(backend, "warm", iterations, cold=False))
        idle_bytes = asyncio.run(_idle_memory(backend, idle))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    per_sandbox = statistics.median(idle_bytes)
    results = {
        "floor_crun_run_true": quantiles_ms(floor),
        "create_to_healthy_cold": quantiles_ms(cold_up),
        "create_to_healthy_warm": quantiles_ms(warm_up),
        "kill_cold": quantiles_ms(cold_down),
        "kill_warm": quantiles_ms(warm_down),
    }
    return {
        "results": results,
        "ratios": {
            "create_to_healthy_warm / floor": results["create_to_healthy_warm"]["p50_ms"]
            / results["floor_crun_run_true"]["p50_ms"],
            "create_to_healthy_cold / warm": results["create_to_healthy_cold"]["p50_ms"]
            / results["create_to_healthy_warm"]["p50_ms"],
        },
        "idle_memory_per_sandbox_mib": per_sandbox / (1 << 20),
        "idle_sandboxes_that_fit_in_available_memory": int(_available_memory() // per_sandbox) if per_sandbox else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--idle", type=int, default=10, help="sandboxes started at once to measure idle memory")
    parser.add_argument("--output", type=Path, default=HERE.parent / "reports" / "bench" / "crun.json")
    args = parser.parse_args()
    report = run(args.iterations, args.idle)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    for name, values in report["results"].items():
        print(
            f"{name:35} p50 {values['p50_ms']:9.1f} ms   p90 {values['p90_ms']:9.1f} ms   "
            f"max {values['max_ms']:9.1f} ms   n={values['n']}"
        )
    for name, value in report["ratios"].items():
        print(f"{name:35} {value:9.2f}")
    print(
        f"idle memory per sandbox: {report['idle_memory_per_sandbox_mib']:.1f} MiB; "
        f"idle sandboxes that fit in available memory: {report['idle_sandboxes_that_fit_in_available_memory']}"
    )
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
