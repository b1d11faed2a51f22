"""Backend names → implementations: the one table the server, the command line and the tests read.

``BACKENDS`` maps a name (the server's ``backend`` setting, ``e2b-compat host prepare
--backend``) to a ``BackendEntry``: how to open the backend on a state folder, how to prepare
the host for it, and a line saying what it is. ``open_backend`` and ``backend_entry`` look a
name up; an unknown one is an ``UnknownBackendError`` naming the known ones.

Adding an isolation backend is one module beside this one, providing
``open_backend(options) -> Backend`` and ``prepare_host(say)``, plus one line in ``BACKENDS``.
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

from .backend import Backend, BackendError

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


@dataclass(frozen=True)
class BackendEntry:
    name: str
    open: Callable[[BackendOptions], Backend]
    prepare_host: Callable[[Callable[[str], None]], None]  # installs/checks what it needs, saying what it does
    description: str
    serves: bool = True  # a reference server can run on it (real sandboxes with an agent inside)


def _entry(name: str, module: str, description: str, *, serves: bool = True) -> BackendEntry:
    """An entry for ``runtime.<module>``, which defines ``open_backend`` and ``prepare_host``; imported on first use."""

    def open_(options: BackendOptions) -> Backend:
        backend: Backend = importlib.import_module(f".{module}", __package__).open_backend(options)
        return backend

    def prepare_host(say: Callable[[str], None]) -> None:
        importlib.import_module(f".{module}", __package__).prepare_host(say)

    return BackendEntry(name, open_, prepare_host, description, serves)


DEFAULT_BACKEND = "crun"
BACKENDS: dict[str, BackendEntry] = {
    "crun": _entry("crun", "crun", "crun containers in user namespaces, one network namespace each (needs root)"),
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
