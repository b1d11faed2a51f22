"""Reference server: control plane, data-plane edge and proxy, store, credentials, TLS.

Depends on ``contract`` and on ``runtime`` through its backend interface only.
See docs/ARCHITECTURE.md (the modules and their order) and docs/SERVER.md (configuration).

Exceptions::

    ApiError                 a refusal with its HTTP status, answered as {"code", "message"}
    ConfigError              a configuration value that is unknown, of the wrong type or out of range
    ServerStartError         something the server needs is missing and could not be provided
    NameResolutionError      names under the domain do not resolve to loopback and could not be fixed
    StoreError               a store operation failed (its subclasses say how; see ``_store``)
    UnknownMigrationHistory  the database was written by code this server does not know
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from contract.lazy import lazy_getattr as _lazy_getattr

if _TYPE_CHECKING:
    from ._config import ConfigError, ServerConfig, load_config, render_toml
    from ._errors import ApiError
    from ._keys import KeyStore
    from ._migrations import UnknownMigrationHistory
    from ._nameres import NameResolutionError, ensure_name_resolution
    from ._server import READY_LINE, RunningServer, ServerStartError, open_server, serve
    from ._store import Store, StoreError

# Loaded on first use (PEP 562): ``e2b-compat keys`` needs the configuration, not the web stack.
_LAZY = {
    "ApiError": "_errors",
    "ConfigError": "_config",
    "ServerConfig": "_config",
    "load_config": "_config",
    "render_toml": "_config",
    "KeyStore": "_keys",
    "UnknownMigrationHistory": "_migrations",
    "NameResolutionError": "_nameres",
    "ensure_name_resolution": "_nameres",
    "READY_LINE": "_server",
    "RunningServer": "_server",
    "ServerStartError": "_server",
    "open_server": "_server",
    "serve": "_server",
    "Store": "_store",
    "StoreError": "_store",
}


__getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "READY_LINE",
    "ApiError",
    "ConfigError",
    "KeyStore",
    "NameResolutionError",
    "RunningServer",
    "ServerConfig",
    "ServerStartError",
    "Store",
    "StoreError",
    "UnknownMigrationHistory",
    "ensure_name_resolution",
    "load_config",
    "open_server",
    "render_toml",
    "serve",
]
