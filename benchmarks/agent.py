"""Benchmark of the agent through the official Python client, with floors from the same run.

Measures ``commands.run("true")`` and a 1 MiB write+read through the pinned client in debug
mode against a real agent process, and the floors: spawning ``/bin/true``, spawning
``/bin/bash -l -c true`` (what ``commands.run`` executes), and a raw loopback HTTP request.
Prints p50/p90 and the ratio of each operation to its floor; writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from conformance import ensure_python_clients
from contract.protocol import ENVD_PORT

from ._stats import quantiles_ms

HERE = Path(__file__).parent
PORT = ENVD_PORT


def _spawn_samples(argv: list[str], iterations: int) -> list[float]:
    # The environment the agent gives a command it starts as root (PATH, HOME, USER, LOGNAME):
    # a login shell's start-up depends on it, so the floor must use the same.
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "USER": "root",
        "LOGNAME": "root",
        "E2B_SANDBOX": "true",
    }
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        subprocess.run(argv, check=True, env=env, cwd="/root")
        samples.append(time.perf_counter() - start)
    return samples


def _start_agent() -> subprocess.Popen[bytes]:
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", PORT)) == 0:
            raise SystemExit(f"port {PORT} is busy; the clients' debug mode needs it for the agent")
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.agent", "--host", "127.0.0.1", "--host", "::1", "--port", str(PORT)],
        cwd=HERE.parent,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=1).status_code == 204:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("the agent did not start")


def run(iterations: int) -> dict[str, Any]:
    clients = ensure_python_clients()
    agent = _start_agent()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")} | {"E2B_DEBUG": "true"}
        out = subprocess.run(
            [str(clients.python), "-I", str(HERE / "client_roundtrip.py"), str(iterations)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        client = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(10)
    floors = {
        "floor_spawn_true": _spawn_samples(["/bin/true"], iterations),
        "floor_spawn_bash_login": _spawn_samples(["/bin/bash", "-l", "-c", "true"], iterations),
    }
    summary = {name: quantiles_ms(samples) for name, samples in {**client, **floors}.items()}
    ratios = {
        "commands_run_true / floor_spawn_bash_login": summary["commands_run_true"]["p50_ms"]
        / summary["floor_spawn_bash_login"]["p50_ms"],
        "commands_run_true overhead over bash -l (ms)": summary["commands_run_true"]["p50_ms"]
        - summary["floor_spawn_bash_login"]["p50_ms"],
        "files_write_read_1mib / floor_http_request": summary["files_write_read_1mib"]["p50_ms"]
        / summary["floor_http_request"]["p50_ms"],
    }
    return {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "iterations": iterations,
        "results": summary,
        "ratios": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--output", type=Path, default=HERE.parent / "reports" / "bench" / "agent.json")
    args = parser.parse_args()
    report = run(args.iterations)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'measurement':45} {'p50 ms':>9} {'p90 ms':>9}")
    for name, values in report["results"].items():
        print(f"{name:45} {values['p50_ms']:9.3f} {values['p90_ms']:9.3f}")
    for name, value in report["ratios"].items():
        print(f"{name:45} {value:9.3f}")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
