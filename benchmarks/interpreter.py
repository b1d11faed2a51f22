"""Benchmark of the code interpreter through the reference server, against floors from the same run.

The pinned official Python clients (``e2b_code_interpreter`` and ``e2b``), configured only by the
variables the server prints, run ``interpreter_client.py`` on a real server (TLS edge, crun
sandboxes of ``code-interpreter-v1`` and ``base``):

- first-run latency: ``Sandbox.create()`` → first ``run_code("1+1")`` result, over ``--sandboxes``
  sandboxes; floor: ``base`` ``Sandbox.create()`` → first ``commands.run("true")``, interleaved.
  Twice, one server after the other: with the server's default warm pool (``docs/SERVER.md``),
  each create ``--pace-seconds`` after the last so that the pool has refilled, and with the pool
  off (``warm_pool_memory_mb = 0``), where every create boots its sandbox;
- warm round trip: p50/p90 of ``--runs`` ``run_code("1+1")`` on one sandbox; floor:
  ``commands.run("true")`` on the same sandbox (envd, the same edge and network path), interleaved;
  then ``--runs`` warm runs in each other language (JavaScript, TypeScript, R, Java, Bash), each
  with its ratio to the same floor.

Prints p50/p90 and the ratios to the floors, writes JSON. Nothing is asserted. Counts are capped
and the client run has a time budget; every sandbox is killed by the client, and whatever the
server's runtime still holds after it stopped is released.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from conformance import EndpointError, ManagedServer, ensure_python_clients

from ._stats import quantiles_ms
from .server import write_report

HERE = Path(__file__).parent
REPO = HERE.parent
MAX_SANDBOXES = 50  # each is two creates (interpreter and base): bounded so a typo cannot run for hours
MAX_RUNS = 500
# Beyond the sampling budget: the untimed warm-up creates (the client allows a first one 1800 s for
# a template build) and the last sandboxes' teardown.
CLIENT_MARGIN_S = 2400

FIRST = "interpreter: create -> first run_code('1+1')"
FIRST_FLOOR = "floor: base create -> first commands.run('true')"
COLD = " (no warm pool)"
NO_POOL = {"E2B_COMPAT_SERVER_WARM_POOL_MEMORY_MB": "0"}
WARM = "interpreter: warm run_code('1+1')"
WARM_FLOOR = "floor: warm commands.run('true'), same sandbox"


def _bounded(value: int, limit: int, what: str) -> int:
    if not 1 <= value <= limit:
        raise SystemExit(f"--{what} must be between 1 and {limit}")
    return value


def _client_run(server: ManagedServer, sandboxes: int, runs: int, budget_s: float, pace_s: float) -> dict[str, Any]:
    clients = ensure_python_clients()
    arguments = [str(sandboxes), str(runs), str(budget_s), str(pace_s)]
    out = subprocess.run(
        [str(clients.python), "-I", str(HERE / "interpreter_client.py"), *arguments],
        env=server.clients_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=budget_s + CLIENT_MARGIN_S,
    )
    if out.returncode != 0:
        raise SystemExit(f"client run failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def _on_server(env: dict[str, str], sandboxes: int, runs: int, budget_s: float, pace_s: float) -> dict[str, Any]:
    # Not under a private temp root: idmapped sandbox users must traverse to their layers.
    data_dir = Path(tempfile.mkdtemp(prefix="e2b-compat-bench-interpreter-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    server = ManagedServer(data_dir, data_dir.with_suffix(".log"), extra_env=env)
    print(f"server log: {server.log}")
    try:
        try:
            server.start()
        except EndpointError as exc:
            raise SystemExit(str(exc)) from exc
        try:
            return _client_run(server, sandboxes, runs, budget_s, pace_s)
        finally:
            server.stop()
            server.release_everything()  # anything a failed client run left behind
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _ratio(report: dict[str, Any], name: str, floor: str) -> None:
    report[f"ratio: {name} / floor (p50)"] = {"ratio": report[name]["p50_ms"] / report[floor]["p50_ms"]}


def run(sandboxes: int, runs: int, budget_s: float, pace_s: float) -> dict[str, Any]:
    client = _on_server({}, sandboxes, runs, budget_s, pace_s)
    cold = _on_server(NO_POOL, sandboxes, 0, budget_s, 0.0)["samples"]
    samples: dict[str, list[float]] = client["samples"]
    if not samples["interpreter_total"] or not samples["warm_run_code"]:
        raise SystemExit(f"no samples within the budget: {client['done']}")
    report: dict[str, Any] = {
        "interpreter: create": quantiles_ms(samples["interpreter_create"]),
        "interpreter: first run_code after create": quantiles_ms(samples["interpreter_first_run"]),
        FIRST: quantiles_ms(samples["interpreter_total"]),
        FIRST_FLOOR: quantiles_ms(samples["base_total"]),
        WARM: quantiles_ms(samples["warm_run_code"]),
        WARM_FLOOR: quantiles_ms(samples["warm_commands_run"]),
    }
    _ratio(report, FIRST, FIRST_FLOOR)
    report["interpreter: create" + COLD] = quantiles_ms(cold["interpreter_create"])
    report[FIRST + COLD] = quantiles_ms(cold["interpreter_total"])
    report[FIRST_FLOOR + COLD] = quantiles_ms(cold["base_total"])
    _ratio(report, FIRST + COLD, FIRST_FLOOR + COLD)
    _ratio(report, WARM, WARM_FLOOR)
    for name, values in samples.items():
        language = name.removeprefix("warm_run_code_")
        if language != name and values:
            label = f"interpreter: warm run_code in {language}"
            report[label] = quantiles_ms(values)
            _ratio(report, label, WARM_FLOOR)
    report["done"] = client["done"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, default=10, help=f"first-run samples (1..{MAX_SANDBOXES})")
    parser.add_argument("--runs", type=int, default=30, help=f"warm round-trip samples (1..{MAX_RUNS})")
    parser.add_argument("--budget-seconds", type=float, default=900, help="stop sampling after this long")
    parser.add_argument(
        "--pace-seconds", type=float, default=3.0, help="between first-run creates with the warm pool (0..30)"
    )
    parser.add_argument("--output", type=Path, default=REPO / "reports" / "bench" / "interpreter.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the interpreter benchmark runs real crun sandboxes: it needs root")
    sandboxes = _bounded(args.sandboxes, MAX_SANDBOXES, "sandboxes")
    runs = _bounded(args.runs, MAX_RUNS, "runs")
    if not 0 <= args.pace_seconds <= 30:
        raise SystemExit("--pace-seconds must be between 0 and 30")
    report = run(sandboxes, runs, args.budget_seconds, args.pace_seconds)
    write_report(report, args.output, width=55)


if __name__ == "__main__":
    main()
