"""The gateway's configuration, as the clients send it, checked without doing any I/O.

The mapping's keys name servers. ``github/<owner>/<repo>`` is a server whose repository is
cloned and whose ``runCmd`` starts a stdio MCP server in it (after ``installCmd``, if given),
with ``envs`` added to its environment; every other key names a server of the clients'
catalogue, which this gateway cannot run (see the package docstring).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["GATEWAY_PORT", "GITHUB_PREFIX", "TOKEN_PATH", "ConfigError", "StdioServer", "parse_config"]

GATEWAY_PORT = 50005  # the port the clients build the MCP URL with
TOKEN_PATH = "/etc/mcp-gateway/.token"  # noqa: S105 (a path: where the clients read the token back)
GITHUB_PREFIX = "github/"
# GitHub's own rules: an owner is 1-39 letters, digits and inner hyphens; a repository name is
# letters, digits, '.', '_' and '-', and neither '.' nor '..' (both become folder names here).
_OWNER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")
_REPO = re.compile(r"[A-Za-z0-9._-]{1,100}")
_FIELDS = {"runCmd", "installCmd", "envs"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_COMMAND = 8192


class ConfigError(ValueError):
    """The configuration cannot be run; the message says which server and why."""


@dataclass(frozen=True)
class StdioServer:
    """A ``github/<owner>/<repo>`` server: its repository and how to install and start it."""

    key: str
    owner: str
    repo: str
    run_cmd: str
    install_cmd: str | None = None
    envs: Mapping[str, str] = field(default_factory=dict)

    @property
    def clone_url(self) -> str:
        return f"https://github.com/{self.owner}/{self.repo}.git"


def _command(key: str, name: str, value: object, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"MCP server {key!r}: {name} must be a non-empty string")
    if len(value) > MAX_COMMAND or "\0" in value:
        raise ConfigError(f"MCP server {key!r}: {name} must be at most {MAX_COMMAND} characters, without NUL")
    return value


def _envs(key: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"MCP server {key!r}: envs must be an object of strings")
    for name, item in value.items():
        if not isinstance(name, str) or _ENV_NAME.fullmatch(name) is None:
            raise ConfigError(f"MCP server {key!r}: {name!r} is not an environment variable name")
        if not isinstance(item, str) or "\0" in item:
            raise ConfigError(f"MCP server {key!r}: envs[{name!r}] must be a string without NUL")
    return dict(value)


def _github(key: str, value: object) -> StdioServer:
    parts = key.removeprefix(GITHUB_PREFIX).split("/")
    if len(parts) != 2 or _OWNER.fullmatch(parts[0]) is None or _REPO.fullmatch(parts[1]) is None:
        raise ConfigError(f"MCP server {key!r}: expected 'github/<owner>/<repository>'")
    owner, repo = parts
    if repo in {".", ".."}:
        raise ConfigError(f"MCP server {key!r}: {repo!r} is not a repository name")
    if not isinstance(value, dict):
        raise ConfigError(f"MCP server {key!r}: expected an object with runCmd (and installCmd, envs)")
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise ConfigError(f"MCP server {key!r}: unknown fields {', '.join(unknown)} (known: runCmd, installCmd, envs)")
    run_cmd = _command(key, "runCmd", value.get("runCmd"), required=True)
    assert run_cmd is not None
    install_cmd = _command(key, "installCmd", value.get("installCmd"), required=False)
    return StdioServer(key, owner, repo, run_cmd, install_cmd, _envs(key, value.get("envs")))


def parse_config(value: object) -> tuple[StdioServer, ...]:
    """The servers of ``value`` (the clients' ``mcp`` mapping), in its order; ``ConfigError`` if any is refused."""
    if not isinstance(value, dict):
        raise ConfigError("the MCP configuration must be an object of servers")
    servers = []
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError("an MCP server's name must be a non-empty string")
        if not key.startswith(GITHUB_PREFIX):
            raise ConfigError(
                f"MCP server {key!r} is from the catalogue, which this gateway cannot run (its servers are "
                f"container images); use 'github/<owner>/<repository>' with a runCmd"
            )
        servers.append(_github(key, item))
    return tuple(servers)
