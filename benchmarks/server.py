"""Benchmark of the reference server: ``Sandbox.create()`` to the first ``commands.run`` result.

The pinned official Python client, configured only by the variables the server prints, creates
``--sandboxes`` sandboxes one after another on a real server (TLS edge, crun sandboxes) and times
create, the first command and their sum: first with the server's default warm pool
(``docs/SERVER.md``), each create ``--pace-seconds`` after the last so that the pool has refilled,
then on a second server with the pool off (``warm_pool_memory_mb = 0``), where every create boots
its sandbox. The floor, measured in the same run on the same runtime folder once the server has
stopped: the crun backend's own create → agent healthy (what a create without a warm sandbox
cannot avoid). Prints p50/p90 and the ratios to the floor; writes JSON. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from conformance import ensure_python_clients
from reference_server import READY_LINE
from runtime.backend import SandboxSpec
from runtime.crun import CrunBackend, host_checkpoint_tools

from ._stats import quantiles_ms

HERE = Path(__file__).parent
REPO = HERE.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


NO_POOL = {"E2B_COMPAT_SERVER_WARM_POOL_MEMORY_MB": "0"}
COLD = " (no warm pool)"


def _start_server(data_dir: Path, port: int, log: Path, extra: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_COMPAT_SERVER_DATA_DIR=str(data_dir), E2B_COMPAT_SERVER_PORT=str(port), **extra)
    process = subprocess.Popen(
        [sys.executable, "-m", "e2b_compat", "serve"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        with process.stdout, log.open("w") as out:
            for line in process.stdout:
                out.write(line)
                if line.strip() == READY_LINE:
                    ready.set()

    threading.Thread(target=pump, daemon=True).start()
    while not ready.wait(0.2):
        if process.poll() is not None:
            raise SystemExit(f"the server did not start; see {log}")
    return process


def _stop(process: subprocess.Popen[str]) -> None:
    os.killpg(process.pid, signal.SIGTERM)  # the group this benchmark created
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


async def _floor(backend: CrunBackend, count: int) -> list[float]:
    samples = []
    for index in range(count):
        sandbox_id = f"floor{index}"
        start = time.perf_counter()
        await backend.create(SandboxSpec(sandbox_id, "base"))
        await backend.start(sandbox_id)
        samples.append(time.perf_counter() - start)
        await backend.kill(sandbox_id)
    return samples


def _client_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON"))}
    for line in (data_dir / "client.env").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value
    return env


def _client_run(data_dir: Path, sandboxes: int, pace_s: float, extra: dict[str, str]) -> dict[str, list[float]]:
    clients = ensure_python_clients()
    data_dir.mkdir(mode=0o755)  # idmapped sandbox users traverse it
    server = _start_server(data_dir, _free_port(), data_dir / "server.log", extra)
    try:
        out = subprocess.run(
            [str(clients.python), "-I", str(HERE / "server_client.py"), str(sandboxes), str(pace_s)],
            env=_client_env(data_dir),
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
    finally:
        _stop(server)
    if out.returncode != 0:
        raise SystemExit(f"client run failed:\n{out.stderr[-3000:]}")
    samples: dict[str, list[float]] = json.loads(out.stdout.splitlines()[-1])
    return samples


def run(sandboxes: int, pace_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="e2b-compat-bench-", dir="/var/tmp") as tmp:
        data_dir = Path(tmp)
        data_dir.chmod(0o755)  # idmapped sandbox users traverse it
        warm = _client_run(data_dir / "pool", sandboxes, pace_s, {})
        cold = _client_run(data_dir / "cold", sandboxes, 0.0, NO_POOL)
        backend = CrunBackend(data_dir / "cold" / "runtime", checkpoint_tools=host_checkpoint_tools())  # as served
        floor = asyncio.run(_floor(backend, sandboxes))
    report = {name: quantiles_ms(samples) for name, samples in warm.items()}
    report.update({name + COLD: quantiles_ms(samples) for name, samples in cold.items()})
    report["floor: crun create -> agent healthy"] = quantiles_ms(floor)
    floor_p50 = report["floor: crun create -> agent healthy"]["p50_ms"]
    report["ratio: create -> first run / floor (p50)"] = {"ratio": report["total"]["p50_ms"] / floor_p50}
    report["ratio: create -> first run" + COLD + " / floor (p50)"] = {
        "ratio": report["total" + COLD]["p50_ms"] / floor_p50
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sandboxes", type=int, default=30)
    parser.add_argument("--pace-seconds", type=float, default=1.0, help="between creates with the warm pool (0..30)")
    parser.add_argument("--output", type=Path, default=REPO / "reports" / "bench" / "server.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the server benchmark runs real crun sandboxes: it needs root")
    if not 1 <= args.sandboxes <= 500 or not 0 <= args.pace_seconds <= 30:
        raise SystemExit("--sandboxes must be 1..500 and --pace-seconds 0..30")
    report = run(args.sandboxes, args.pace_seconds)
    write_report(report, args.output, width=45)


def write_report(report: dict[str, Any], output: Path, *, width: int) -> None:
    """Write ``report`` as JSON to ``output`` and print it: quantiles, ratios, anything else as is."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    for name, values in report.items():
        if isinstance(values, dict) and "ratio" in values:
            print(f"{name:{width}} {values['ratio']:8.2f}")
        elif isinstance(values, dict) and "p50_ms" in values:
            print(f"{name:{width}} p50 {values['p50_ms']:8.1f} ms   p90 {values['p90_ms']:8.1f} ms   n={values['n']}")
        else:
            print(f"{name:{width}} {values}")
    print(f"written to {output}")


if __name__ == "__main__":
    main()
