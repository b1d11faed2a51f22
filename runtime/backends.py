"""Backend names → implementations: the one table the server, the command line and the tests read.

``BACKENDS`` maps a name (the server's ``backend`` setting, ``e2b-compat host prepare
--backend``) to a ``BackendEntry``: how to open the backend on a state folder, how to prepare
the host for it, and a line saying what it is. ``open_backend`` and ``backend_entry`` look a
name up; an unknown one is an ``UnknownBackendError`` naming the known ones.

Adding an isolation backend is one module beside this one, providing
``open_backend(options) -> Backend``, ``prepare_host(say)`` and ``FEATURES`` (what its backends'
``features`` say), plus one line in ``BACKENDS``.
The shared state machine (tests/runtime/test_backend_conformance.py) is parametrized over
this table, so the new backend is held to the lifecycle from that line on.

Importing this module is cheap: a backend's module is imported when it is opened or its host
prepared, never before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .backend import DEFAULT_FEATURES, Backend, BackendError, Feature

if TYPE_CHECKING:
    from .templates import Template

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "BackendEntry",
    "BackendOptions",
    "UnknownBackendError",
    "backend_entry",
    "open_backend",
    "serving_backends",
]


class UnknownBackendError(BackendError, ValueError):
    """No backend of that name; the message lists the known ones."""


@dataclass(frozen=True)
class BackendOptions:
    """What any backend is opened with."""

    state_dir: Path  # the backend's own folder: records, layers, its runtime's state
    templates: Sequence[Template] = ()  # built already: served as they are, never rebuilt while running
    templates_root: Path | None = None  # the template cache, for templates not given (default: the user's cache)
    share_agent_memory: bool = False  # agents' start-up pages merged by the host, where the backend can (crun)
    boot_images: bool = False  # first starts restore a checkpoint of the template's booted agent, where the backend can


@dataclass(frozen=True)
class BackendEntry:
    name: str
    open: Callable[[BackendOptions], Backend]
    prepare_host: Callable[[Callable[[str], None]], None]  # installs/checks what it needs, saying what it does
    description: str
    serves: bool = True  # a reference server can run on it (real sandboxes with an agent inside)
    # What it provides (its module's FEATURES), read without opening it: reports and benchmarks
    # list it for every backend in the table, the host prepared for it or not.
    features: Callable[[], frozenset[Feature]] = lambda: DEFAULT_FEATURES


def _entry(name: str, module: str, description: str, *, serves: bool = True) -> BackendEntry:
    """An entry for ``runtime.<module>`` (``open_backend``, ``prepare_host``, ``FEATURES``), imported on first use."""

    def open_(options: BackendOptions) -> Backend:
        backend: Backend = importlib.import_module(f".{module}", __package__).open_backend(options)
        return backend

    def prepare_host(say: Callable[[str], None]) -> None:
        importlib.import_module(f".{module}", __package__).prepare_host(say)

    def features() -> frozenset[Feature]:
        found = getattr(importlib.import_module(f".{module}", __package__), "FEATURES", None)
        if not isinstance(found, frozenset) or not all(isinstance(item, Feature) for item in found):
            raise BackendError(f"runtime.{module} declares no FEATURES (a frozenset of runtime.backend.Feature)")
        return found

    return BackendEntry(name, open_, prepare_host, description, serves, features)


DEFAULT_BACKEND = "crun"
BACKENDS: dict[str, BackendEntry] = {
    "crun": _entry("crun", "crun", "crun containers in user namespaces, one network namespace each (needs root)"),
    "docker": _entry("docker", "docker", "containers of our own Docker Engine, crun's network isolation (needs root)"),
    "gvisor": _entry("gvisor", "gvisor", "gVisor (runsc, ptrace): a user-space kernel per sandbox (needs root)"),
    # Nothing runs in the fake, so no agent answers /init: the server does not offer it.
    "fake": _entry("fake", "fake", "in memory, nothing runs: for tests above the runtime", serves=False),
}


def serving_backends() -> tuple[str, ...]:
    """The names a reference server's ``backend`` setting may take."""
    return tuple(name for name, entry in BACKENDS.items() if entry.serves)


def backend_entry(name: str) -> BackendEntry:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnknownBackendError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})") from None


def open_backend(name: str, options: BackendOptions) -> Backend:
    """The backend called ``name`` on ``options.state_dir``; its set-up failures are ``BackendError``."""
    return backend_entry(name).open(options)
