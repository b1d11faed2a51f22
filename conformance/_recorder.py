"""Wire recorder: what the official clients send, recorded against a fixture server, checked for drift.

A deterministic, stateful fixture server (plain HTTP on 127.0.0.1, an ephemeral port) answers like
an E2B endpoint well enough for one fixed script per client flavour (``recorder/py_sync.py``,
``py_async.py``, ``js.cjs``) to complete. The clients reach it through one base URL for everything
(``E2B_API_URL`` and ``E2B_SANDBOX_URL`` both at the server, so envd requests carry
``E2b-Sandbox-Id``/``E2b-Sandbox-Port``). Every request is recorded as one canonical JSON line::

    {"method", "path", "query": {name: [values]}, "headers": {name: value}, "body": ..., "status"}

- ``path`` is the request target as sent (percent-encoding kept); ``query`` is parsed, keys sorted.
- ``headers``: every header the client sent (names lower-cased), so a new header is drift too.
  Values are kept exactly (the user agent carries the pinned version), except secrets (``<key>``,
  ``<token>``, ``<credentials>``), values that depend on the machine or the run (``host``,
  ``content-length``, ``lang_version``, ``system``) and multipart boundaries.
- ``body``: ``null`` when empty; ``{"json": ...}`` re-serialized with sorted keys; ``{"connect": [{"flags",
  "message"}]}`` for Connect envelopes (the JSON message parsed, so Python's pretty-printed and
  JS's compact messages compare equal); ``{"multipart": [{"name", "filename", "content_type",
  "length", "sha256"}]}`` (boundaries are random); anything else ``{"length", "sha256"}``.
  ISO-8601 timestamps in JSON bodies and query values become ``<timestamp>``.
- ``status`` is what the fixture answered, so a request it does not know (501) stands out.

``write_fixtures`` stores the lines as ``fixtures/wire/<flavour>-<client version>.jsonl``;
``check_drift`` records again and returns a unified diff per flavour that changed.
Run ``python -m conformance._recorder write|check`` to do either from a shell.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ._canonical import dumps_line
from ._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients
from ._fixture_server import FixtureServer, RecorderError

__all__ = [
    "FIXTURES_DIR",
    "FLAVOURS",
    "RecorderError",
    "Recording",
    "check_drift",
    "diff_lines",
    "fixture_path",
    "main",
    "record",
    "run_recording",
    "write_fixtures",
]

FLAVOURS = ("py-sync", "py-async", "js")
SCRIPTS_DIR = Path(__file__).resolve().parent / "recorder"
FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
_SCRIPTS = {"py-sync": "py_sync.py", "py-async": "py_async.py", "js": "js.cjs"}

# Fixed values the fixture answers with: the same in every run, so the clients send the same.

# Values that differ between machines or runs while the request means the same.


# --- running the scripts ---


@dataclasses.dataclass(frozen=True)
class Recording:
    """One script run: the canonical request lines, what the script observed, and how long it took."""

    flavour: str
    version: str
    lines: list[dict[str, Any]]
    observed: dict[str, Any]
    seconds: float


def _check_flavour(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}; expected one of {FLAVOURS}")


def fixture_path(flavour: str, version: str, directory: Path = FIXTURES_DIR) -> Path:
    """``<directory>/wire/<flavour>-<client version>.jsonl``."""
    _check_flavour(flavour)
    if not re.fullmatch(r"\d[0-9A-Za-z.+-]*", version):
        raise ValueError(f"not a version: {version!r}")  # it becomes part of a file name
    return directory / "wire" / f"{flavour}-{version}.jsonl"


def _command(flavour: str, clients: PythonClients | NodeClients) -> tuple[list[str], dict[str, str]]:
    _check_flavour(flavour)
    script = SCRIPTS_DIR / _SCRIPTS[flavour]
    if flavour == "js":
        if not isinstance(clients, NodeClients):
            raise TypeError("the js flavour runs with NodeClients")
        return ["node", str(script)], {"NODE_PATH": str(clients.root / "node_modules")}
    if not isinstance(clients, PythonClients):
        raise TypeError(f"the {flavour} flavour runs with PythonClients")
    return [str(clients.python), "-I", str(script)], {}


def run_recording(flavour: str, clients: PythonClients | NodeClients, *, timeout: float = 120) -> Recording:
    """Run the flavour's script against a fresh fixture server; the lines it sent and what it saw."""
    version = clients.version
    cmd, extra = _command(flavour, clients)
    # Only the fixture's settings reach the client: nothing from this shell's E2B_*/PYTHON*/NODE_*.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON", "NODE_"))}
    started = time.monotonic()
    with FixtureServer() as server:
        env |= server.client_env() | extra
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RecorderError(f"{flavour}: the script did not finish within {timeout} s") from exc
        lines = server.lines()
    seconds = time.monotonic() - started
    outputs = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not outputs:
        tail = "\n".join(dumps_line(line) for line in lines[-3:])
        raise RecorderError(
            f"{flavour}: the script failed (exit {proc.returncode}) after {len(lines)} requests\n"
            f"last requests:\n{tail}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
    observed: dict[str, Any] = json.loads(outputs[-1])
    if observed.get("client_version") != version:
        raise RecorderError(f"{flavour}: the script ran e2b {observed.get('client_version')}, not {version}")
    return Recording(flavour, version, lines, observed, seconds)


def record(flavour: str, clients: PythonClients | NodeClients, *, timeout: float = 120) -> list[dict[str, Any]]:
    """The canonical request lines of one run of the flavour's script against a fresh fixture server."""
    return run_recording(flavour, clients, timeout=timeout).lines


def _clients_for(flavour: str, python: PythonClients | None, node: NodeClients | None) -> PythonClients | NodeClients:
    if flavour == "js":
        return node if node is not None else ensure_node_clients()
    return python if python is not None else ensure_python_clients()


def _describe(line: str) -> str:
    try:
        parsed = json.loads(line)
        return f"{parsed['method']} {parsed['path']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        return line[:80]


def diff_lines(flavour: str, committed: Sequence[str], recorded: Sequence[str], *, where: str = "") -> str:
    """A readable report of how ``recorded`` differs from ``committed``; empty when they are equal."""
    committed, recorded = list(committed), list(recorded)
    if committed == recorded:
        return ""
    index = next(
        (i for i, (a, b) in enumerate(zip(committed, recorded, strict=False)) if a != b),
        min(len(committed), len(recorded)),
    )
    first = (
        f"request #{index + 1}: committed {_describe(committed[index]) if index < len(committed) else '(none)'}, "
        f"recorded {_describe(recorded[index]) if index < len(recorded) else '(none)'}"
    )
    label = where or flavour
    diff = difflib.unified_diff(committed, recorded, f"{label} (committed)", f"{label} (recorded)", lineterm="")
    return (
        f"wire drift in {flavour}: {len(committed)} committed requests, {len(recorded)} recorded; "
        f"first difference at {first}\n" + "\n".join(diff) + "\n"
    )


def _record_twice(flavour: str, clients: PythonClients | NodeClients) -> list[str]:
    first = [dumps_line(line) for line in record(flavour, clients)]
    second = [dumps_line(line) for line in record(flavour, clients)]
    if first != second:
        raise RecorderError("the recording is not deterministic:\n" + diff_lines(flavour, first, second))
    return first


def write_fixtures(
    directory: Path = FIXTURES_DIR,
    flavours: Iterable[str] = FLAVOURS,
    *,
    python: PythonClients | None = None,
    node: NodeClients | None = None,
) -> list[Path]:
    """Record each flavour twice and write ``wire/<flavour>-<version>.jsonl``; refuses a non-deterministic run."""
    written = []
    for flavour in flavours:
        clients = _clients_for(flavour, python, node)
        lines = _record_twice(flavour, clients)
        path = fixture_path(flavour, clients.version, directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        written.append(path)
    return written


def check_drift(
    directory: Path = FIXTURES_DIR,
    flavours: Iterable[str] = FLAVOURS,
    *,
    python: PythonClients | None = None,
    node: NodeClients | None = None,
) -> str:
    """Record each flavour again and compare with its committed file: a report per drifted flavour, or ``""``.

    ``python``/``node`` choose the client environments (default: the pinned ones); each is compared
    with the file of its own version.
    """
    reports = []
    for flavour in flavours:
        clients = _clients_for(flavour, python, node)
        path = fixture_path(flavour, clients.version, directory)
        recorded = [dumps_line(line) for line in record(flavour, clients)]
        label = f"{flavour} (e2b {clients.version})"
        try:
            committed = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            reports.append(f"wire drift in {label}: no committed recording at {path}\n")
            continue
        reports.append(diff_lines(label, committed, recorded, where=path.name))
    return "".join(reports)


def main(argv: Sequence[str] | None = None) -> int:
    """``write`` the fixtures or ``check`` them for drift (exit 1 with the diff on drift)."""
    parser = argparse.ArgumentParser(prog="python -m conformance._recorder", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("--directory", type=Path, default=FIXTURES_DIR)
    parser.add_argument("--flavour", action="append", choices=FLAVOURS, help="default: all")
    parser.add_argument("--python-version", help="e2b version of a committed Python lock (default: the pin)")
    parser.add_argument("--node-version", help="e2b version of a committed JS lock (default: the pin)")
    args = parser.parse_args(argv)
    flavours = args.flavour or FLAVOURS
    python = ensure_python_clients(args.python_version) if any(f != "js" for f in flavours) else None
    node = ensure_node_clients(args.node_version) if "js" in flavours else None
    if args.action == "write":
        for path in write_fixtures(args.directory, flavours, python=python, node=node):
            print(path)
        return 0
    report = check_drift(args.directory, flavours, python=python, node=node)
    sys.stdout.write(report or "no wire drift\n")
    return 1 if report else 0


if __name__ == "__main__":
    raise SystemExit(main())
