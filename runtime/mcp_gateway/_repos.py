"""A ``github/<owner>/<repo>`` server's working copy: cloned once, then its ``installCmd`` run in it.

The clone uses the sandbox's own git and network, so it needs egress to github.com unless the
environment points git elsewhere (``url.<base>.insteadOf``, for example through
``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n`` in the sandbox's envs). A copy that
is already there is reused as it is, so a second ``mcp-gateway`` call does not clone again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from ._config import StdioServer

__all__ = ["GatewayError", "gateway_env", "install", "prepare", "server_env", "working_copy"]

TAIL = 2000  # characters of a failed command's output in the error


class GatewayError(RuntimeError):
    """The gateway could not start; the message is what ``mcp-gateway`` prints on stderr."""


def working_copy(root: Path, server: StdioServer) -> Path:
    return root / server.owner / server.repo


def _tail(output: str) -> str:
    text = output.strip()
    return text if len(text) <= TAIL else "…" + text[-TAIL:]


def _run(argv: list[str], *, cwd: Path, env: Mapping[str, str], what: str) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise GatewayError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        raise GatewayError(f"{what} failed with status {done.returncode}: {_tail(done.stderr or done.stdout)}")


def _marker(target: Path) -> Path:
    return target.with_name(f".{target.name}.cloned")


def _clone(server: StdioServer, target: Path, env: Mapping[str, str]) -> None:
    if shutil.which("git", path=env.get("PATH")) is None:
        raise GatewayError(f"MCP server {server.key!r}: git is not installed, so its repository cannot be cloned")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Cloned in place, then marked done beside it: a copy without its mark (an interrupted clone)
    # is removed and cloned again.
    shutil.rmtree(target, ignore_errors=True)
    clone = ["git", "clone", "--quiet", "--depth", "1", "--", server.clone_url, str(target)]
    try:
        _run(clone, cwd=target.parent, env=env, what=f"MCP server {server.key!r}: git clone of {server.clone_url}")
    except GatewayError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    _marker(target).write_text(server.clone_url + "\n", encoding="utf-8")


def gateway_env() -> dict[str, str]:
    """The environment the servers' commands start from: the gateway's, without its access token."""
    return {name: value for name, value in os.environ.items() if name != "GATEWAY_ACCESS_TOKEN"}


def server_env(server: StdioServer, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a server's commands: the gateway's own, with the server's ``envs`` over it."""
    return {**base, **server.envs}


def prepare(root: Path, server: StdioServer, base_env: Mapping[str, str] | None = None) -> Path:
    """The server's working copy under ``root``, cloned if absent; returns its folder."""
    target = working_copy(root, server)
    env = server_env(server, gateway_env() if base_env is None else base_env)
    if not (target.is_dir() and _marker(target).is_file()):
        _clone(server, target, env)
    return target


def install(folder: Path, server: StdioServer, base_env: Mapping[str, str] | None = None) -> None:
    """Run the server's ``installCmd`` (if any) with bash in its working copy."""
    if server.install_cmd is None:
        return
    env = server_env(server, gateway_env() if base_env is None else base_env)
    _run(["bash", "-c", server.install_cmd], cwd=folder, env=env, what=f"MCP server {server.key!r}: installCmd")
