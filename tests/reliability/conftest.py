"""Servers for the reliability scenarios, and the figures each scenario reports.

Each scenario ends with ``report(name, **figures)``: one ``RELIABILITY: {...}`` line (printed, and
repeated in pytest's closing summary), and all of them together in
``reports/reliability/summary.json`` with the run's duration. The servers are real ``e2b-compat
serve`` processes (crun sandboxes, TLS), each on a data folder of its own under ``/var/tmp``
(idmapped sandbox users must traverse to their layers), started in a process group of their own;
at the end every sandbox they made is gone and nothing of theirs is left mounted; a server's log is
kept only when the scenario using it failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from conformance._endpoint import ManagedServer
from reference_server._config import ServerConfig
from tests.servers import managed_server

from ._harness import Api

REPO = Path(__file__).resolve().parents[2]
SUMMARY = REPO / "reports" / "reliability" / "summary.json"
FIGURES: list[dict[str, Any]] = []
_STARTED = time.monotonic()

# Settings every reliability server gets: small sandboxes, fast sweeps. Keys this server version
# does not know are left out (and named in the figures), so the suite runs against any version.
SETTINGS: dict[str, str] = {
    "reaper_interval_seconds": "0.5",
    "metrics_interval_seconds": "1",
    "memory_mb": "512",
    "disk_mb": "256",  # the disk filler writes this much to the host: small, whatever the host has free
    "templates": "base",
    "request_head_timeout_seconds": "5",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="the reliability scenarios start crun sandboxes: they need root")
    for item in items:
        if "tests/reliability/" in str(item.path):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for figures in FIGURES:
        terminalreporter.write_line("RELIABILITY: " + json.dumps(figures, sort_keys=True))


def pytest_sessionfinish() -> None:
    if not FIGURES:
        return
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    summary = {"seconds": round(time.monotonic() - _STARTED, 1), "scenarios": FIGURES}
    SUMMARY.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def report(scenario: str, **figures: Any) -> None:
    """One scenario's figures: printed as one ``RELIABILITY:`` line and kept for the summary."""
    line = {"scenario": scenario, **figures}
    FIGURES.append(line)
    print("RELIABILITY: " + json.dumps(line, sort_keys=True))


def known_settings(wanted: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """``wanted`` as server variables, minus the keys this server does not have (returned too)."""
    known = {f.name for f in fields(ServerConfig)}
    env = {f"E2B_COMPAT_SERVER_{k.upper()}": v for k, v in wanted.items() if k in known}
    return env, sorted(set(wanted) - known)


@contextlib.contextmanager
def running_server(name: str, failed: Callable[[], bool] = lambda: False, **settings: str) -> Iterator[ManagedServer]:
    """A started server on a fresh data folder; stopped, emptied and removed afterwards.

    Its log is kept when the block raised or ``failed()`` says a test using it failed.
    """
    env, _ = known_settings({**SETTINGS, **settings})
    with managed_server(f"reliability-{name}", env, keep_log=failed) as server:
        yield server


@pytest.fixture(scope="package")
def shared_server(request: pytest.FixtureRequest) -> Iterator[ManagedServer]:
    """One server for the scenarios that do not stop it (creates, hostile tenants, slow clients)."""
    failures = request.session.testsfailed
    with running_server("shared", lambda: request.session.testsfailed > failures) as server:
        yield server


@pytest.fixture
def closing() -> Iterator[Callable[[Api], Api]]:
    """``closing(Api(...))``: the client is closed when the test ends, however it ends."""
    made: list[Api] = []

    def keep(api: Api) -> Api:
        made.append(api)
        return api

    yield keep
    for api in made:
        api.close()
