"""Runtime: sandbox backends behind one interface, templates, and the in-sandbox agent (envd).

Public modules (everything else here is private to the runtime)::

    runtime.backend      the Backend protocol, SandboxSpec/SandboxInfo/Metrics/Limits, the error
                         tree, the lifecycle table TRANSITIONS, the Feature list
    runtime.backends     backend names → implementations: BACKENDS, open_backend, BackendOptions
    runtime.crun         CrunBackend: sandboxes as crun containers (on the shared OCI backend)
    runtime.fake         FakeBackend: in memory, for tests above the runtime
    runtime.host         host set-up for crun sandboxes: prepare, HostNotReadyError
    runtime.templates    template root filesystems, built once and cached by content
    runtime.volumes      volumes' files on the host: a size-limited image per volume, mounted
    runtime.agent        the in-sandbox agent (envd)
    runtime.interpreter  the Code Interpreter server inside code-interpreter templates

The names below are loaded on first use, so ``import runtime`` stays cheap (the agent inside
every sandbox imports this package). Depends on ``contract``. See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from contract.lazy import lazy_getattr as _lazy_getattr

if _TYPE_CHECKING:
    from .backend import (
        Backend,
        BackendError,
        Feature,
        SandboxInfo,
        SandboxNotFoundError,
        SandboxRuntimeError,
        SandboxSpec,
        State,
        TemplateNotFoundError,
        TransitionError,
    )
    from .backends import (
        BACKENDS,
        DEFAULT_BACKEND,
        BackendEntry,
        BackendOptions,
        UnknownBackendError,
        backend_entry,
        open_backend,
    )

_LAZY = {
    **dict.fromkeys(
        (
            "Backend",
            "BackendError",
            "Feature",
            "SandboxInfo",
            "SandboxNotFoundError",
            "SandboxRuntimeError",
            "SandboxSpec",
            "State",
            "TemplateNotFoundError",
            "TransitionError",
        ),
        "backend",
    ),
    **dict.fromkeys(
        (
            "BACKENDS",
            "DEFAULT_BACKEND",
            "BackendEntry",
            "BackendOptions",
            "UnknownBackendError",
            "backend_entry",
            "open_backend",
        ),
        "backends",
    ),
}

__getattr__ = _lazy_getattr(__name__, _LAZY, globals())

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "Backend",
    "BackendEntry",
    "BackendError",
    "BackendOptions",
    "Feature",
    "SandboxInfo",
    "SandboxNotFoundError",
    "SandboxRuntimeError",
    "SandboxSpec",
    "State",
    "TemplateNotFoundError",
    "TransitionError",
    "UnknownBackendError",
    "backend_entry",
    "open_backend",
]
