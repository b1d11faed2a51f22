"""Servers for the reliability scenarios, per serving backend, and the figures each scenario reports.

Every scenario runs once per backend of the run (the package-scoped ``backend`` fixture: the
default one, or those ``E2B_COMPAT_RELIABILITY_BACKENDS`` names, ``all`` under ``nox -s
reliability``; the host is prepared for each as
``e2b-compat host prepare --backend`` does). Where what a scenario may expect depends on a
feature the backend declares (``runtime.backend.Feature``), ``NEEDS`` says so: on a backend
without it the test is a strict xfail naming the shortfall, never a skip.

Each scenario ends with ``report(name, backend, **figures)``: one ``RELIABILITY: {...}`` line
(printed, and repeated in pytest's closing summary), and all of them together in
``reports/reliability/summary.json``, grouped by backend, with the run's duration. The servers are
real ``e2b-compat serve`` processes (TLS), each on a data folder of its own under ``/var/tmp``
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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from conformance._endpoint import ManagedServer
from reference_server._config import ServerConfig
from runtime import _docker_engine
from runtime.backend import Feature
from runtime.backends import DEFAULT_BACKEND, backend_entry, serving_backends
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
    # The scenarios account for every runtime sandbox against the store; warm sandboxes have no
    # record (the pool's own crash and load behaviour: tests/reference_server/live/test_crash.py).
    "warm_pool_memory_mb": "0",
}


def _backends() -> tuple[str, ...]:
    """Which backends this run covers: ``E2B_COMPAT_RELIABILITY_BACKENDS`` (names, comma-separated, or all).

    The test suite (CI) runs the scenarios on the default backend; ``nox -s reliability`` runs every
    serving backend (docker's creates and removals are too slow for CI's budget: docs/RELIABILITY.md).
    """
    wanted = os.environ.get("E2B_COMPAT_RELIABILITY_BACKENDS", DEFAULT_BACKEND)
    if wanted == "all":
        return serving_backends()
    names = tuple(name.strip() for name in wanted.split(",") if name.strip())
    unknown = [name for name in names if name not in serving_backends()]
    if unknown:
        raise pytest.UsageError(f"E2B_COMPAT_RELIABILITY_BACKENDS names no serving backend: {', '.join(unknown)}")
    return names


BACKENDS = _backends()


@dataclass(frozen=True)
class Counts:
    """How much of each bounded loop a backend's run makes; every scenario runs on every backend."""

    creates: int = 64  # concurrent-creates: the burst, half per owner
    creates_in_flight: int = 16
    per_server: int = 16  # two-servers: sandboxes made by each server at once
    crash_rounds: int = 5  # sigkill: SIGKILLs at random points
    creates_per_round: int = 8


# The counts per backend (``counts(name)``); a backend not named here gets crun's. gVisor's and
# docker's creates and kills take several times crun's on two cores (docker's removals, btrfs
# subvolumes, go one at a time), so their runs make fewer sandboxes, to keep CI within its budget.
_SMALLER = Counts(creates=24, creates_in_flight=8, per_server=8, crash_rounds=3, creates_per_round=6)
COUNTS: dict[str, Counts] = {"crun": Counts(), "docker": _SMALLER, "gvisor": _SMALLER}


def counts(backend: str) -> Counts:
    return COUNTS.get(backend, Counts())


# Scenario (test function) → the feature its expectation rests on, and what a backend without it
# cannot promise. A backend lacking it runs the scenario as a strict xfail with that reason: the
# shortfall is shown in every run, and a backend that meets the expectation anyway fails the run
# (XPASS) until its feature list says so.
NEEDS: dict[str, tuple[Feature, str]] = {
    "test_disk_filler_gets_enospc_and_spares_the_host": (
        Feature.DISK_LIMIT,
        "no per-sandbox disk limit: a sandbox's writes land on the host filesystem that holds the store",
    ),
    # crun bounds inotify per sandbox in the sandbox's own user namespace over its own host ids;
    # sandboxes sharing host ids share the host-wide per-user bounds, so one can take them all.
    "test_inotify_hog_leaves_others_their_watches": (
        Feature.OWN_ID_RANGE,
        "no host id range of its own: inotify instances are not bounded per sandbox",
    ),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ours = [item for item in items if "tests/reliability/" in str(item.path)]
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="the reliability scenarios start real sandboxes: they need root")
        for item in ours:
            item.add_marker(skip)
        return
    for item in ours:
        need = NEEDS.get(getattr(item, "originalname", item.name))
        backend = getattr(item, "callspec", None) and item.callspec.params.get("backend")  # type: ignore[attr-defined]
        if need and isinstance(backend, str) and need[0] not in backend_entry(backend).features():
            reason = f"{backend} declares no {need[0].value}: {need[1]}"
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for figures in sorted(FIGURES, key=lambda line: BACKENDS.index(line["backend"])):
        terminalreporter.write_line("RELIABILITY: " + json.dumps(figures, sort_keys=True))


def pytest_sessionfinish() -> None:
    if not FIGURES:
        return
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    backends = {
        name: {
            "features": sorted(feature.value for feature in backend_entry(name).features()),
            "seconds": round(sum(line["seconds"] for line in lines), 1),
            "scenarios": lines,
        }
        for name in BACKENDS
        if (lines := [line for line in FIGURES if line["backend"] == name])
    }
    summary = {"seconds": round(time.monotonic() - _STARTED, 1), "backends": backends}
    SUMMARY.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def report(scenario: str, backend: str, **figures: Any) -> None:
    """One scenario's figures on one backend: printed as one ``RELIABILITY:`` line and kept for the summary."""
    line = {"scenario": scenario, "backend": backend, **figures}
    FIGURES.append(line)
    print("RELIABILITY: " + json.dumps(line, sort_keys=True))


def known_settings(wanted: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """``wanted`` as server variables, minus the keys this server does not have (returned too)."""
    known = {f.name for f in fields(ServerConfig)}
    env = {f"E2B_COMPAT_SERVER_{k.upper()}": v for k, v in wanted.items() if k in known}
    return env, sorted(set(wanted) - known)


@contextlib.contextmanager
def running_server(
    name: str, backend: str, failed: Callable[[], bool] = lambda: False, **settings: str
) -> Iterator[ManagedServer]:
    """A started server on ``backend`` and a fresh data folder; stopped, emptied and removed afterwards.

    Its log is kept when the block raised or ``failed()`` says a test using it failed.
    """
    env, _ = known_settings({**SETTINGS, **settings})
    with managed_server(f"reliability-{backend}-{name}", env, keep_log=failed, backend=backend) as server:
        yield server


@pytest.fixture(scope="package", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each serving backend in turn, its host prepared (installs nothing when it is ready)."""
    name: str = request.param
    backend_entry(name).prepare_host(lambda message: print(f"host set-up ({name}): {message}"))
    return name


@pytest.fixture(scope="session", autouse=True)
def _engine_restored() -> Iterator[None]:
    """Our Docker Engine stops again at the end when this run started it (as tests/runtime/test_docker.py)."""
    yield
    engine = _docker_engine.default_engine()
    if engine.pidfile in _docker_engine.STARTED_HERE:
        engine.stop()
        _docker_engine.STARTED_HERE.discard(engine.pidfile)


@pytest.fixture(scope="package")
def shared_server(request: pytest.FixtureRequest, backend: str) -> Iterator[ManagedServer]:
    """One server per backend for the scenarios that do not stop it (creates, hostile tenants, slow clients)."""
    failures = request.session.testsfailed
    with running_server("shared", backend, lambda: request.session.testsfailed > failures) as server:
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
