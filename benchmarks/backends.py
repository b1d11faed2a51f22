"""Benchmarks per isolation backend, side by side: one reference server per serving backend.

For every serving backend of ``runtime.backends`` (or those named with ``--backend``), the host is
prepared for it and ``e2b-compat serve`` is started on it in a scratch data folder; the pinned
official Python client (``backends_client.py``) then measures:

- create → first ``commands.run("true")`` result, ``--sandboxes`` sandboxes one after another;
- the warm ``commands.run("true")`` round trip, ``--iterations`` times on one sandbox;
- memory pause → resume (``pause()``, then ``connect()`` and a command), ``--pauses`` times;
- ``create_snapshot()`` (with the memory where the backend keeps it) and ``Sandbox.create`` of it up
  to its first command, ``--pauses`` times;
- an upload and a download of ``--transfer-mib`` random bytes through the files API, ``--transfers``
  times, as throughput (MB/s of the p50 time);
- idle memory per sandbox, with ``--idle`` idle sandboxes up: the backend's own memory figure
  (``Backend.metrics``: the sandbox's memory cgroup, read through a second instance of the
  backend on the server's runtime folder), and the drop of the host's MemAvailable divided by
  their number (whatever the backend's processes are, inside the cgroup or not: runsc's sentry,
  the engine's shim; noisy on a busy host).

Each against floors measured in the same run: a bare process spawn and a loopback HTTP round trip
from the same client process, the same bytes posted to and fetched from a loopback server at memory
speed with the client's own httpx, and for memory the resident size of an idle ``sleep`` process.
Ratios (p50 over p50) are reported, never asserted. Every count is bounded, each backend has
``--budget-seconds``; a backend that fails is reported with its error and the others still run.
Writes reports/bench/backends.json and backends.md (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from conformance import ManagedServer, ensure_python_clients
from runtime.backends import backend_entry, serving_backends

from ._stats import quantiles_ms

HERE = Path(__file__).parent
REPO = HERE.parent
MAX_COUNT = 50  # per measurement: bounded whatever is asked
MAX_IDLE = 300  # idle sandboxes: enough for the host's figure to rise above its noise
MERGE_SETTLE_S = 180.0  # the longest wait for ksmd to have merged the idle sandboxes' agents
MAX_TRANSFER_MIB = 1024
# (key, label, floor key or None, unit). A ratio is always the figure's cost over its floor's: time
# over time, memory over memory; throughput (MB/s of the p50 time) shows the same time ratio.
METRICS = (
    ("create_to_first_run", "create → first command", "floor_process_spawn", "ms"),
    ("warm_commands_run_true", "warm commands.run(true)", "floor_http_round_trip", "ms"),
    ("upload", "upload (files.write)", "floor_http_upload", "MB/s"),
    ("download", "download (files.read)", "floor_http_download", "MB/s"),
    ("pause_resume", "pause → resume → command", "floor_http_round_trip", "ms"),
    ("resume_to_first_run", "resume → first command (after a memory pause)", "floor_http_round_trip", "ms"),
    ("snapshot", "create_snapshot() (memory kept where the backend can)", "floor_http_round_trip", "ms"),
    ("snapshot_create_to_first_run", "create from that snapshot → first command", "floor_http_round_trip", "ms"),
    ("paused_memory", "memory of a memory-paused sandbox (backend metrics)", "floor_idle_process", "MiB"),
    ("idle_memory_per_sandbox", "idle memory per sandbox (backend metrics)", "floor_idle_process", "MiB"),
    ("idle_memory_host_drop", "idle memory per sandbox (host MemAvailable drop)", "floor_idle_process", "MiB"),
)


def mem_available() -> int:
    """The host's MemAvailable in bytes, the median of a few reads (it moves while pages settle)."""
    reads = []
    for _ in range(5):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                reads.append(int(line.split()[1]) * 1024)
        time.sleep(0.2)
    return int(statistics.median(reads))


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def idle_process_floor(count: int) -> float:
    """MiB resident in an idle ``sleep`` process (the median of ``count``): the memory floor."""
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        return statistics.median(resident_mib(sleeper.pid) for sleeper in sleepers)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def settle_merging(deadline: float, *, limit_s: float = MERGE_SETTLE_S, window_s: float = 10.0) -> dict[str, float]:
    """Wait until the host's same-page merging has merged what it will, then measure its CPU cost.

    Settled: ``pages_sharing`` moved less than 1% over one full scan of ksmd (bounded by
    ``limit_s`` and the backend's budget). Then ksmd's CPU time over ``window_s``, as a percentage
    of one core: what keeping the idle sandboxes merged costs. Empty without KSM, or with it off.
    """
    from runtime.host import KSM_ROOT, ksm_counters, ksmd_cpu_seconds  # noqa: PLC0415

    counters = ksm_counters()
    if not counters or (KSM_ROOT / "run").read_text().strip() != "1":
        return {}
    end = min(deadline, time.monotonic() + limit_s)
    sharing, started = -1, time.monotonic()
    while time.monotonic() < end:
        scans = ksm_counters().get("full_scans", 0)
        while ksm_counters().get("full_scans", 0) == scans and time.monotonic() < end:
            time.sleep(0.2)
        now = ksm_counters().get("pages_sharing", 0)
        if sharing >= 0 and abs(now - sharing) <= max(now, 1) * 0.01:
            break
        sharing = now
    settled_s = time.monotonic() - started
    cpu_before, window_start = ksmd_cpu_seconds(), time.monotonic()
    time.sleep(max(0.0, min(window_s, deadline - time.monotonic())))
    cpu_after, elapsed = ksmd_cpu_seconds(), time.monotonic() - window_start
    result = {"pages_sharing": float(ksm_counters().get("pages_sharing", 0)), "settle_s": settled_s}
    if cpu_before is not None and cpu_after is not None and elapsed > 0:
        result["ksmd_cpu_percent"] = 100 * (cpu_after - cpu_before) / elapsed
    return result


def backend_memory(server: ManagedServer) -> list[int]:
    """The memory figure of every running sandbox of ``server``, as its backend reports it."""
    from runtime.backend import State  # noqa: PLC0415
    from runtime.backends import BackendOptions, open_backend  # noqa: PLC0415

    # Read-only calls on a second instance of the backend on the server's own runtime folder.
    backend = open_backend(server.backend, BackendOptions(state_dir=server.data_dir / "runtime"))

    async def read() -> list[int]:
        running = [info.sandbox_id for info in await backend.list() if info.state is State.RUNNING]
        return [(await backend.metrics(sandbox_id)).memory_bytes for sandbox_id in running]

    return asyncio.run(read())


def sandbox_memory(server: ManagedServer, sandbox_id: str) -> int:
    """One sandbox's memory figure as its backend reports it (0 where it holds none: no cgroup)."""
    from runtime.backends import BackendOptions, open_backend  # noqa: PLC0415

    backend = open_backend(server.backend, BackendOptions(state_dir=server.data_dir / "runtime"))
    return asyncio.run(backend.metrics(sandbox_id)).memory_bytes


def _lines(stream: IO[str], out: queue.Queue[str | None]) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def _drive_client(server: ManagedServer, counts: tuple[int, ...], deadline: float) -> dict[str, Any]:
    """Run backends_client.py against ``server``: its samples and the idle memory it held."""
    clients = ensure_python_clients()
    process = subprocess.Popen(
        [str(clients.python), "-I", str(HERE / "backends_client.py"), *(str(c) for c in counts)],
        env=server.clients_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(process.stderr or ()), daemon=True).start()
    memory: dict[str, Any] = {}
    try:
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                raise TimeoutError("the backend's budget ran out") from None
            if line is None:
                raise RuntimeError(f"the client ended without a result: {''.join(errors)[-2000:]}")
            message = json.loads(line)
            if message.get("phase") == "idle-before":
                memory["before"] = mem_available()
            elif message.get("phase") == "idle-up":
                memory["ksm"] = settle_merging(deadline)  # the agents' pages merged first, where shared
                memory["after"], memory["count"] = mem_available(), int(message["count"])
                try:
                    memory["backend_bytes"] = backend_memory(server)
                except Exception as exc:  # noqa: BLE001 - a backend without metrics: the host figure stands
                    memory["backend_error"] = f"{type(exc).__name__}: {exc}"[:300]
            elif message.get("phase") in ("running", "paused"):
                try:
                    memory[message["phase"]] = sandbox_memory(server, str(message["sandbox"]))
                except Exception as exc:  # noqa: BLE001 - a backend without metrics: shown as an error
                    memory["paused_error"] = f"{type(exc).__name__}: {exc}"[:300]
            if "phase" in message:
                process.stdin.write("go\n")
                process.stdin.flush()
                continue
            result: dict[str, Any] = message["result"]
            result["idle_memory"] = memory
            return result
    finally:
        process.stdin.close()  # the client's idle wait ends on EOF too
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group started above, and nothing else
            process.wait()


def bench_backend(name: str, counts: tuple[int, ...], budget_s: float, *, boot_images: bool = True) -> dict[str, Any]:
    """One backend: prepare the host, serve on it, drive the client, stop and release everything."""
    deadline = time.monotonic() + budget_s
    backend_entry(name).prepare_host(lambda message: print(f"host set-up ({name}): {message}"))
    data_dir = Path(tempfile.mkdtemp(prefix=f"e2b-compat-bench-{name}-", dir="/var/tmp"))
    data_dir.chmod(0o755)  # idmapped sandbox users traverse it
    # No warm pool: the figures are each backend's own boot and idle cost (benchmarks.server has the pool's).
    settings = {
        "E2B_COMPAT_SERVER_WARM_POOL_MEMORY_MB": "0",
        # Density, not admission, is measured: up to MAX_IDLE idle sandboxes of the default 512 MiB
        # limit are let in (they use a few MiB each; the limits would add up past the host's).
        "E2B_COMPAT_SERVER_OWNER_MAX_RUNNING": str(MAX_IDLE + 10),
        "E2B_COMPAT_SERVER_MEMORY_OVERCOMMIT": "1000",
        # Creates restore the template's boot image where the backend can (the default); off, each boots.
        "E2B_COMPAT_SERVER_BOOT_IMAGES": "true" if boot_images else "false",
    }
    server = ManagedServer(data_dir, data_dir.with_suffix(".log"), backend=name, extra_env=settings)
    try:
        server.start()
        raw = _drive_client(server, counts, deadline)
    except Exception as exc:
        raise RuntimeError(f"{type(exc).__name__}: {exc} (server log: {server.log})") from exc
    finally:
        server.stop()
        server.release_everything()
        shutil.rmtree(data_dir, ignore_errors=True)
    server.log.unlink(missing_ok=True)  # kept only when something failed
    return summarise(raw)


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    """Quantiles of every sample list, idle memory per sandbox, and each metric's ratio to its floor."""
    out: dict[str, Any] = {key: quantiles_ms(value) for key, value in raw.items() if isinstance(value, list) and value}
    if "pause_error" in raw:
        out["pause_resume"] = {"error": raw["pause_error"]}
    if "snapshot_error" in raw:
        out["snapshot"] = {"error": raw["snapshot_error"]}
    memory = raw.get("idle_memory", {})
    if memory.get("count"):
        # Negative when something else on the host freed memory meanwhile: shown as it is.
        drop = (memory["before"] - memory["after"]) / memory["count"] / (1 << 20)
        out["idle_memory_host_drop"] = {"mib": drop, "n": memory["count"]}
    if memory.get("ksm"):
        out["same_page_merging"] = memory["ksm"]
    if memory.get("backend_bytes"):
        figures = memory["backend_bytes"]
        out["idle_memory_per_sandbox"] = {"mib": statistics.median(figures) / (1 << 20), "n": len(figures)}
    elif "backend_error" in memory:
        out["idle_memory_per_sandbox"] = {"error": memory["backend_error"]}
    if "paused" in memory:  # the same sandbox's figure while it ran is kept beside it
        out["paused_memory"] = {"mib": memory["paused"] / (1 << 20), "running_mib": memory["running"] / (1 << 20)}
    elif "paused_error" in memory:
        out["paused_memory"] = {"error": memory["paused_error"]}
    return out


def _value(entry: dict[str, Any] | None) -> float | None:
    if not entry:
        return None
    if "p50_ms" in entry:
        return float(entry["p50_ms"])
    return float(entry["mib"]) if "mib" in entry else None


def ratios(results: dict[str, Any], floors: dict[str, float]) -> dict[str, float]:
    """metric / its floor (p50 over p50; MiB over MiB), where both exist."""
    found = {}
    for key, _, floor_key, _ in METRICS:
        value = _value(results.get(key))
        floor = floors.get(floor_key or "")
        if value is not None and floor:
            found[key] = value / floor
    return found


def throughput(report: dict[str, Any], p50_ms: float) -> float:
    """MB/s (10^6 bytes a second) of one transfer of the run's size taking ``p50_ms``."""
    return float(report["counts"]["transfer_mib"] * (1 << 20) / 1e6 / (p50_ms / 1000))


def table(report: dict[str, Any]) -> str:
    """Markdown: one row per metric, one column per backend; value (x its floor)."""
    names = list(report["backends"])
    lines = [
        "# Benchmarks per backend",
        "",
        f"Run {report['started_at']}; counts {report['counts']}; boot images "
        f"{'on' if report.get('boot_images', True) else 'off'}. Value p50 (x its floor in the same run; p90).",
        "",
        "| metric | " + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for key, label, _, unit in METRICS:
        cells = []
        for name in names:
            found = report["backends"][name]
            entry = found.get("results", {}).get(key)
            value = _value(entry)
            if "error" in found:
                cells.append("failed")
            elif value is None:
                cells.append(f"n/a ({entry['error'][:60]})" if entry and "error" in entry else "n/a")
            else:
                ratio = found["ratios"].get(key)
                figure = throughput(report, value) if unit == "MB/s" else value
                notes = [f"x{ratio:.1f}"] if ratio is not None else []
                if entry and "running_mib" in entry:  # a paused sandbox beside itself running
                    notes.append(f"running {entry['running_mib']:.1f} MiB")
                if entry and "p90_ms" in entry:  # for a transfer, the p90 time is the lower rate
                    p90 = entry["p90_ms"]
                    notes.append(f"p90 {throughput(report, p90) if unit == 'MB/s' else p90:.1f}")
                cells.append(f"{figure:.1f} {unit}" + (f" ({'; '.join(notes)})" if notes else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += _merging_notes(report, names)
    run_floors = ", ".join(f"{k} {v:.2f}" for k, v in sorted(report.get("floors", {}).items())) or "none"
    lines += [
        "",
        f"Floors of the run (ms; MiB for memory; ms per transfer), the median of each backend run's: {run_floors}.",
        "",
    ]
    lines += ["Each backend run's own floors (the same client process as its figures, the same host):", ""]
    for name in names:
        floors = report["backends"][name].get("floors", {})
        shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(floors.items())) or "none"
        error = report["backends"][name].get("error")
        lines.append(f"- {name}: {shown}" + (f"; error: {error[:300]}" if error else ""))
    return "\n".join(lines) + "\n"


def _merging_notes(report: dict[str, Any], names: list[str]) -> list[str]:
    """Per backend: what same-page merging held and cost, and how many such idle sandboxes fit in 24 GiB."""
    notes = []
    for name in names:
        results = report["backends"][name].get("results", {})
        drop = _value(results.get("idle_memory_host_drop"))
        fit = f"; at that, {int(24 * 1024 / drop)} idle sandboxes in 24 GiB" if drop and drop > 0 else ""
        merging = results.get("same_page_merging")
        if merging:
            cpu = merging.get("ksmd_cpu_percent")
            notes.append(
                f"- {name}: ksmd shared {merging['pages_sharing'] * 4 / 1024:.0f} MiB of pages, settled in "
                f"{merging['settle_s']:.0f} s, then used {cpu:.1f}% of a core{fit}"
                if cpu is not None
                else f"- {name}: ksmd shared {merging['pages_sharing'] * 4 / 1024:.0f} MiB of pages{fit}"
            )
        elif fit:
            notes.append(f"- {name}: no same-page merging{fit}")
    return ["", "Idle memory, host view:", "", *notes] if notes else []


COUNTS = ("sandboxes", "iterations", "idle", "pauses", "transfers", "transfer_mib")


def run(
    backends: tuple[str, ...], counts: tuple[int, ...], budget_s: float, *, boot_images: bool = True
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "counts": dict(zip(COUNTS, counts, strict=True)),
        "boot_images": boot_images,
        "backends": {},
    }
    for name in backends:
        print(f"backend {name}: benchmarking (budget {budget_s:.0f} s)")
        entry: dict[str, Any] = {"features": sorted(f.value for f in backend_entry(name).features())}
        try:
            results = bench_backend(name, counts, budget_s, boot_images=boot_images)
        except Exception as exc:  # noqa: BLE001 - one backend failing must not hide the others
            entry["error"] = f"{type(exc).__name__}: {exc}"[-1000:]
            report["backends"][name] = entry
            continue
        floors = {
            "floor_process_spawn": results.get("floor_process_spawn", {}).get("p50_ms", 0.0),
            "floor_http_round_trip": results.get("floor_http_round_trip", {}).get("p50_ms", 0.0),
            "floor_http_upload": results.get("floor_http_upload", {}).get("p50_ms", 0.0),
            "floor_http_download": results.get("floor_http_download", {}).get("p50_ms", 0.0),
            "floor_idle_process": idle_process_floor(counts[2]),
        }
        entry |= {"results": results, "floors": floors}
        report["backends"][name] = entry
    # One set of floors for the whole run (the median of each backend run's own), so that the
    # ratios of the backends compare with each other and not with one client process's luck.
    measured = [entry["floors"] for entry in report["backends"].values() if "floors" in entry]
    report["floors"] = {key: statistics.median(f[key] for f in measured) for key in measured[0]} if measured else {}
    for entry in report["backends"].values():
        if "results" in entry:
            entry["ratios"] = ratios(entry["results"], report["floors"])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", action="append", metavar="NAME", help="only this backend (repeatable)")
    parser.add_argument("--sandboxes", type=int, default=5, help="create → first command samples (default 5)")
    parser.add_argument("--iterations", type=int, default=30, help="warm round trips and floor samples (default 30)")
    parser.add_argument(
        "--idle", type=int, default=5, help=f"idle sandboxes up at once for memory (default 5, at most {MAX_IDLE})"
    )
    parser.add_argument("--pauses", type=int, default=3, help="pause → resume samples (default 3)")
    parser.add_argument("--transfers", type=int, default=3, help="uploads and downloads (default 3)")
    parser.add_argument("--transfer-mib", type=int, default=100, help="MiB per transfer (default 100)")
    parser.add_argument("--budget-seconds", type=float, default=900.0, help="per backend (default 900)")
    parser.add_argument(
        "--no-boot-images", action="store_true", help="every create boots its agent (setting boot_images = false)"
    )
    parser.add_argument("--output", type=Path, default=REPO / "reports" / "bench" / "backends.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the backend benchmark runs real sandboxes: it needs root")
    serving = serving_backends()
    chosen = tuple(args.backend or serving)
    if unknown := [name for name in chosen if name not in serving]:
        raise SystemExit(f"not serving backends: {', '.join(unknown)} (serving: {', '.join(serving)})")
    counts = (
        max(1, min(args.sandboxes, MAX_COUNT)),
        max(1, min(args.iterations, MAX_COUNT)),
        max(1, min(args.idle, MAX_IDLE)),
        max(1, min(args.pauses, MAX_COUNT)),
        max(1, min(args.transfers, MAX_COUNT)),
        max(1, min(args.transfer_mib, MAX_TRANSFER_MIB)),
    )
    report = run(chosen, counts, args.budget_seconds, boot_images=not args.no_boot_images)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    markdown = table(report)
    args.output.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"written to {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
