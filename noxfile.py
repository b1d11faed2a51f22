"""Task entry points: ``nox -s tests``, ``nox -s lint``, ``nox -s contract``, ``nox -s reliability``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import nox

HERE = Path(__file__).parent


def _envdir() -> str:
    """Session virtualenvs live in the cache, keyed by what decides their contents.

    A fresh clone with the same ``pyproject.toml`` and ``noxfile.py`` reuses them, so a
    second CI run does not reinstall the toolchain. The cache folder follows the same
    rule as ``contract._fetch.default_cache_root`` (this file cannot import the project).
    """
    cache = Path(
        os.environ.get("E2B_COMPAT_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "e2b-compat"
    )
    key = hashlib.sha256((HERE / "pyproject.toml").read_bytes() + Path(__file__).read_bytes()).hexdigest()[:16]
    return str(cache / "nox" / key)


nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.envdir = _envdir()

PYTHON = "3.11"
LINT_PATHS = [
    "contract",
    "conformance",
    "reference_server",
    "runtime",
    "e2b_compat",
    "benchmarks",
    "tests",
    "noxfile.py",
]

# Debian packages only the tests use → the file that shows each is installed: the OCI registry
# the image-template tests and cases start and push to (conformance/_registry.py).
TEST_PACKAGES = {"docker-registry": "/usr/bin/docker-registry"}


def _test_packages(session: nox.Session) -> None:
    missing = [package for package, marker in TEST_PACKAGES.items() if not Path(marker).exists()]
    if missing:
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-qq", external=True, env=env)
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True, env=env)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (pass pytest arguments after ``--``)."""
    session.install("-e", ".[contract,dev]")
    if os.geteuid() == 0:  # every backend's sandboxes need host packages (and crun a cgroup fix); say what is done
        session.run("e2b-compat", "host", "prepare", "--backend", "all")
        _test_packages(session)
    # The slowest tests in the closing summary: CI's time budget is spent where this says.
    session.run("pytest", "--durations=40", *session.posargs)


@nox.session(python=PYTHON)
def reliability(session: nox.Session) -> None:
    """The load, fault and hostile-tenant scenarios (docs/RELIABILITY.md); as root, real sandboxes.

    Figures go to reports/reliability/summary.json and pytest's closing summary; pass pytest
    arguments after ``--`` (``-- -k hostile``).
    """
    session.install("-e", ".[contract,dev]")
    if os.geteuid() == 0:
        session.run("e2b-compat", "host", "prepare", "--backend", "all")
    session.run(
        "pytest",
        "tests/reliability",
        *session.posargs,
        env={"E2B_COMPAT_RELIABILITY_BACKENDS": os.environ.get("E2B_COMPAT_RELIABILITY_BACKENDS", "all")},
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check) and mypy --strict over the code, the tests and this file."""
    session.install("-e", ".[contract,dev]")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)
    session.run("mypy", *LINT_PATHS)


@nox.session(python=PYTHON)
def contract(session: nox.Session) -> None:
    """Regenerate the contract from the pinned artifacts; fail with a diff on drift.

    ``nox -s contract -- --write`` replaces the committed files instead.
    """
    session.install("-e", ".[contract]")
    action = "generate" if "--write" in session.posargs else "check"
    session.run("e2b-compat", "contract", action)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks reported against floors measured in the same run, never asserted.

    ``nox -s bench -- --iterations 500`` for more samples; results go to reports/bench/.
    As root it also runs crun, the reference server and its code interpreter, and the reference
    server on every serving backend side by side (reports/bench/backends.md), each with its own
    bounded defaults (``python -m benchmarks.backends --help``, ``benchmarks.interpreter --help``).
    """
    session.install("-e", ".[contract,dev]")
    session.run("python", "-m", "benchmarks.agent", *session.posargs)
    if os.geteuid() == 0:
        session.run("e2b-compat", "host", "prepare")
        session.run("python", "-m", "benchmarks.crun", *session.posargs)
        session.run("python", "-m", "benchmarks.server")
        session.run("python", "-m", "benchmarks.interpreter")
        # Every serving backend of the table side by side (each prepares its own host set-up).
        session.run("python", "-m", "benchmarks.backends")


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """Run the conformance harness and write a signed report under reports/; fails when the gate fails.

    With no arguments it starts the reference server on its embedded defaults (root: crun
    sandboxes) and tests it with the pinned clients; ``-- --backend gvisor`` on another backend of
    the table, ``-- --backend all`` on each in turn (one signed report each, and a signed matrix).
    Everything after ``--`` goes to ``e2b-compat conformance run`` (``--help`` lists the options:
    another endpoint, other client versions, ``--sweep`` for every committed lock, a case filter).
    """
    session.install("-e", ".[conformance]")
    if os.geteuid() == 0 and not any(arg.startswith("--endpoint") for arg in session.posargs):
        # The run prepares the host for each backend it starts our server on; this also makes the
        # server's names resolve. "all" (or none) prepares for crun here, the rest in the run.
        backend = _option(session.posargs, "--backend")
        named = [] if backend in (None, "all") else ["--backend", backend]
        session.run("e2b-compat", "host", "prepare", *named)
        _test_packages(session)  # the registry the image cases pull from
    session.run("e2b-compat", "conformance", "run", *session.posargs)


def _option(args: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` in ``args`` (the last one), else None."""
    found = None
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith(name + "="):
            found = arg.partition("=")[2]
    return found


@nox.session(python=PYTHON)
def mutants(session: nox.Session) -> None:
    """Plant the curated mutants (conformance/_mutant_catalog.py) and report which the harness kills.

    Each mutant runs in a copy of this tree against a server started from that copy, under the
    shared heavy-test lock taken per mutant (do not wrap this session in that lock: pass
    ``-- --no-lock`` if you must). Writes reports/mutants/<time>/mutants.json and mutants.md and
    stops by itself (``-- --budget-minutes N``, default 30). ``-- --list`` shows the mutants;
    ``-- --match server/list`` runs some (docs/MUTANTS.md).
    """
    session.install("-e", ".[conformance]")
    if os.geteuid() == 0:
        session.run("e2b-compat", "host", "prepare")
    session.run("e2b-compat", "conformance", "mutants", *session.posargs)
