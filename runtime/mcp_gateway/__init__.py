"""The MCP gateway of the ``mcp-gateway`` template: one MCP endpoint in front of stdio MCP servers.

The official clients' ``Sandbox.create(mcp={...})`` makes a sandbox of the template
``mcp-gateway``, then runs ``mcp-gateway --config '<the mapping as JSON>'`` in it as root with
``GATEWAY_ACCESS_TOKEN`` set, and expects it to return once the gateway serves. They reach it
at ``https://50005-<sandbox id>.<domain>/mcp`` with ``Authorization: Bearer <token>``, and read
the token back from ``/etc/mcp-gateway/.token`` when they connect to an existing sandbox.

- ``parse_config`` (sans-IO, ``_config``) turns the mapping into ``StdioServer`` values or a
  ``ConfigError``; the control plane checks a create's ``mcp`` with it, so a refusal is a 400
  and no sandbox is made;
- ``_repos`` clones a ``github/<owner>/<repo>`` server's repository and runs its ``installCmd``;
- ``_upstreams`` starts each ``runCmd`` and talks MCP to it over stdio (the MCP SDK's client);
- ``_gateway`` serves their tools, prompts and resources as one streamable-HTTP endpoint (the
  MCP SDK's server) behind the bearer token;
- ``_cli`` is the ``mcp-gateway`` command: it reports a failure on stderr with status 1, and
  detaches the serving process only once it serves.

Servers from the clients' catalogue (``{"duckduckgo": {}}`` and the like) are container images
upstream pulls and runs; this gateway runs no images and refuses them by name.

Inside a template the package runs in its own locked environment (``mcp-gateway.in``), copied
there as a package of its own: it imports nothing from the rest of the project.
"""

from __future__ import annotations

from ._config import (
    GATEWAY_PORT,
    GITHUB_PREFIX,
    TOKEN_PATH,
    ConfigError,
    StdioServer,
    parse_config,
)

__all__ = ["GATEWAY_PORT", "GITHUB_PREFIX", "TOKEN_PATH", "ConfigError", "StdioServer", "parse_config"]
