"""Running one scenario with one official client flavour, in that client's own environment.

Scenario scripts (``scenarios/<family>/py_sync.py``, ``py_async.py``, ``js.cjs``) import only the
official packages and the standard library, run a named scenario against whatever endpoint the
environment variables describe, print ``client:case:stage`` traces on stderr and one JSON object
on stdout. Python scripts run with ``-I`` in the client's virtualenv; the JS script runs with
``NODE_PATH`` at the client's ``node_modules``: nothing of this project is importable from them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._clients import NodeClients, PythonClients

__all__ = ["FLAVOURS", "SCENARIOS", "ScenarioError", "ScenarioRun", "ScenarioRunner"]

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
FLAVOURS = ("py-sync", "py-async", "js")
_SCRIPTS = {"py-sync": "py_sync.py", "py-async": "py_async.py", "js": "js.cjs"}


class ScenarioError(AssertionError):
    """The scenario script failed: its exit status and the tail of its output."""


@dataclass(frozen=True)
class ScenarioRun:
    result: dict[str, Any]
    traces: tuple[str, ...]
    duration_s: float


# Python e2b from 2.50 on sends through pyqwest (a Rust HTTP client on its own tokio runtime). In
# about one asyncio run in ten, pyqwest (0.10 and 0.12) aborts the process (SIGABRT, "Fatal Python error:
# Aborted", no Python frame) while the interpreter shuts down, when the script ends right after
# envd calls; waiting a second before the end avoids it, a script that only creates, runs one
# command and exits shows it, and every answer was complete before it. A run that
# printed its "done" trace and its whole result before that abort is a finished run: the result
# is checked as any other, and the abort is kept as an "aborted-at-exit" trace in the report.
# The abort's message names the race: "PyGILState_Release: thread state ... must be current when
# releasing", "Python runtime state: finalizing" (a pyqwest thread calling back into an interpreter
# that is being torn down; 3 of 120 runs of sandbox/kill-is-running with 2.50). The same race
# ended one sweep run with SIGSEGV after its done trace and result (py-async 2.50); a crash of any
# other kind, or either signal before the done trace, is a failure.
AT_EXIT_SIGNALS = {-signal.SIGABRT: "SIGABRT", -signal.SIGSEGV: "SIGSEGV"}


def parse(proc: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if (proc.returncode != 0 and not finished_before_abort(proc)) or not lines:
        raise ScenarioError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def finished_before_abort(proc: subprocess.CompletedProcess[str]) -> bool:
    """The script crashed at exit after its "done" trace and its result line (see ``AT_EXIT_SIGNALS``)."""
    if proc.returncode not in AT_EXIT_SIGNALS:
        return False
    traces = [line for line in proc.stderr.splitlines() if line.startswith(("py-sync:", "py-async:", "js:"))]
    out = proc.stdout.rstrip("\n").splitlines()
    return bool(traces) and traces[-1].endswith(":done") and bool(out) and out[-1].startswith("{")


class ScenarioRunner:
    """Runs one named scenario with one client flavour and returns its JSON result.

    ``env`` configures the clients (endpoint variables only), ``workdir`` names the scenario's
    working folder as the sandbox sees it, and ``scripts`` is the folder of one scenario family.
    """

    def __init__(
        self,
        python: PythonClients,
        node: NodeClients,
        *,
        env: dict[str, str],
        workdir: Callable[[str], str],
        scripts: Path = SCENARIOS / "envd",
    ) -> None:
        self.python = python
        self.node = node
        self.env = env
        self.workdir = workdir
        self.scripts = scripts

    def work(self, flavour: str, name: str) -> str:
        return self.workdir(f"{flavour}-{name.replace('/', '-')}")

    def command(self, flavour: str, name: str, *args: str) -> tuple[list[str], dict[str, str]]:
        script = self.scripts / _SCRIPTS[flavour]
        if flavour == "js":
            return ["node", str(script), name, self.work(flavour, name), *args], {
                **self.env,
                "NODE_PATH": str(self.node.root / "node_modules"),
            }
        return [str(self.python.python), "-I", str(script), name, self.work(flavour, name), *args], dict(self.env)

    def run(self, flavour: str, name: str, timeout: float = 180, *args: str) -> ScenarioRun:
        if flavour not in _SCRIPTS:
            raise ValueError(f"unknown client flavour {flavour!r} (known: {', '.join(FLAVOURS)})")
        cmd, env = self.command(flavour, name, *args)
        start = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        duration = time.monotonic() - start
        traces = tuple(line for line in proc.stderr.splitlines() if line.startswith(f"{flavour}:"))
        result = parse(proc, f"{flavour}:{name}")
        if proc.returncode in AT_EXIT_SIGNALS:
            signal_name = AT_EXIT_SIGNALS[proc.returncode]
            traces += (
                f"{flavour}:{name}:aborted-at-exit ({signal_name} after the result; the client's, see AT_EXIT_SIGNALS)",
            )
        return ScenarioRun(result, traces, duration)

    def __call__(self, flavour: str, name: str, timeout: float = 180, *args: str) -> dict[str, Any]:
        return self.run(flavour, name, timeout, *args).result
