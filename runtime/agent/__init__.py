"""The in-sandbox agent: our implementation of envd (HTTP routes, ``process`` and ``filesystem``).

Started inside every sandbox as ``python -m runtime.agent`` (or ``e2b-compat agent``); see
docs/ARCHITECTURE.md, "The agent". The reference server uses the listener's helpers
(``NoDelayH11Protocol``, ``bind``) and the advertised ``ENVD_VERSION``; the runtime names the
pipe the agent signals on once it listens (``READY_FD_ENV``, see ``_ready``) and asks it to offer
its start-up memory for merging (``SHARE_MEMORY_ENV``, see ``_memory``), and publishes the hash
of the token /init must bring (``ACCESS_TOKEN_HASH_FILE``, see ``_metadata``). Importing this package
loads nothing else: every name is loaded on first use.

Exceptions (``_errors``): one type, whose ``ErrorKind`` is both the HTTP status of an envd route
and the Connect code of an RPC::

    AgentError          a refusal: a kind and the message sent
    ├── UserError       the request names a user that does not exist (UNAUTHENTICATED)  _state
    ├── PathError       a path that cannot be resolved (INVALID_ARGUMENT)               _paths
    ├── ProcessError    the process table cannot do what was asked                     _processes
    ├── FsError         the filesystem work was refused                                 _filesystem
    └── WatcherError    a directory watch failed (INTERNAL)                             _inotify
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from contract.lazy import lazy_getattr as _lazy_getattr

if _TYPE_CHECKING:
    from ._errors import AgentError, ErrorKind
    from ._memory import SHARE_MEMORY_ENV
    from ._metadata import ACCESS_TOKEN_HASH_FILE
    from ._ready import READY_FD_ENV
    from ._server import DEFAULT_HOSTS, DEFAULT_PORT, NoDelayH11Protocol, bind, serve
    from ._version import ENVD_VERSION

# Loaded on first use (PEP 562): the template build imports this package to check the agent's
# environment; ``_server`` brings the whole web stack with it.
_LAZY = {
    "AgentError": "_errors",
    "ErrorKind": "_errors",
    "DEFAULT_HOSTS": "_server",
    "DEFAULT_PORT": "_server",
    "NoDelayH11Protocol": "_server",
    "bind": "_server",
    "serve": "_server",
    "ENVD_VERSION": "_version",
    "READY_FD_ENV": "_ready",
    "SHARE_MEMORY_ENV": "_memory",
    "ACCESS_TOKEN_HASH_FILE": "_metadata",
}


__getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "ACCESS_TOKEN_HASH_FILE",
    "DEFAULT_HOSTS",
    "DEFAULT_PORT",
    "ENVD_VERSION",
    "READY_FD_ENV",
    "SHARE_MEMORY_ENV",
    "AgentError",
    "ErrorKind",
    "NoDelayH11Protocol",
    "bind",
    "serve",
]
