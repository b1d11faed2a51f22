"""Reference server: control plane, data-plane edge and proxy, store, credentials, TLS.

Depends on ``contract`` and on ``runtime`` through its backend interface only.
See docs/ARCHITECTURE.md (the modules and their order) and docs/SERVER.md (configuration).

Exceptions::

    ApiError            a refusal with its HTTP status, answered as {"code", "message"}
    ConfigError         a configuration value that is unknown, of the wrong type or out of range
    ServerStartError    something the server needs is missing and could not be provided
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from contract.lazy import lazy_getattr as _lazy_getattr

if _TYPE_CHECKING:
    from ._config import ConfigError, ServerConfig, load_config
    from ._errors import ApiError
    from ._server import RunningServer, ServerStartError, open_server, serve

# Loaded on first use (PEP 562): ``e2b-compat keys`` needs the configuration, not the web stack.
_LAZY = {
    "ApiError": "_errors",
    "ConfigError": "_config",
    "ServerConfig": "_config",
    "load_config": "_config",
    "RunningServer": "_server",
    "ServerStartError": "_server",
    "open_server": "_server",
    "serve": "_server",
}


__getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "ApiError",
    "ConfigError",
    "RunningServer",
    "ServerConfig",
    "ServerStartError",
    "load_config",
    "open_server",
    "serve",
]
