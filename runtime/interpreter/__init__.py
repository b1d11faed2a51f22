"""The Code Interpreter server of code-interpreter sandboxes (port 49999, docs/PROTOCOL-NOTES.md, Code Interpreter).

A Starlette app on Jupyter kernels driven directly with jupyter_client (no Jupyter server):
contexts (a kernel each), ``/execute`` NDJSON streams with rich results, errors, keepalives,
and an interrupt when the client goes away. Started inside the sandbox as
``python -m runtime.interpreter``; see docs/ARCHITECTURE.md.

Modules, by concern::

    _languages   language names and env-var statements per kernel (pure)
    _messages    Jupyter messages → NDJSON lines (pure)
    _kernels     in-memory kernel specs, kernel processes, message routing
    _contexts    contexts, their registry and environment, envd /envs
    _execution   one execution: serialized per context, interrupt when abandoned
    _app         routes, request checks, the streamed response
    _server      command line and uvicorn
    kernel_startup  runs inside python kernels: e2b/chart, e2b/data and JSON formatters

Nothing else in ``runtime`` imports this package: the agent must not load jupyter_client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from contract.lazy import lazy_getattr as _lazy_getattr

from ._languages import SUPPORTED_LANGUAGES

if _TYPE_CHECKING:
    from ._app import create_app
    from ._contexts import Settings
    from ._server import main, serve

# Loaded on first use (PEP 562): the pure modules do not need the web stack or jupyter_client.
_LAZY = {
    "Settings": "_contexts",
    "create_app": "_app",
    "main": "_server",
    "serve": "_server",
}


__getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = ["SUPPORTED_LANGUAGES", "Settings", "create_app", "main", "serve"]
