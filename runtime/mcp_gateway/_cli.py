"""``mcp-gateway``: the command the clients run to start the gateway, and that templates' builds call.

``mcp-gateway --config JSON`` checks the configuration, clones and installs each server in the
foreground, then starts the serving process detached (its own session, its output in the log),
and returns 0 only once that process serves the endpoint and the token file is written. Every
failure is one line on stderr and status 1 (2 for a configuration it refuses), which the clients
turn into "Failed to start MCP gateway: <stderr>"; a failed start leaves no token behind.

``mcp-gateway pull NAME...`` (what the clients' template builder runs for ``addMcpServer``) adds
catalogue servers to a template; there is no catalogue here, so it is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._config import GATEWAY_PORT, TOKEN_PATH, ConfigError, StdioServer, parse_config
from ._repos import GatewayError, gateway_env, install, prepare

__all__ = ["main"]

STATE_DIR = "/var/lib/mcp-gateway"  # the servers' working copies, under <owner>/<repo>
LOG = "/var/log/mcp-gateway.log"
PID_FILE = "/run/mcp-gateway.pid"  # the detached gateway's pid: SIGTERM stops it and its servers
READY = b"ready\n"


def reason(exc: BaseException) -> str:
    """The message of the ``GatewayError`` behind ``exc`` (in a group or its context), else its type and text."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, GatewayError):
            return str(current)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                todo.append(linked)
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    return f"{type(leaf).__name__}: {leaf}"


def _write_token(path: Path, token: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".token.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _detached(args: argparse.Namespace, servers: Sequence[StdioServer], token: str) -> int:
    """Fork the serving process off (double fork, new session); wait until it serves or fails."""
    from . import _gateway  # noqa: PLC0415 (the SDK is imported only to serve)

    sock = _gateway.listen(args.host, args.port)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the forked processes)
        os.close(read_end)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        status = 0
        try:
            log = open(args.log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives as long as the process)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)

            def ready() -> None:
                Path(args.pid_file).write_text(f"{os.getpid()}\n", encoding="ascii")
                os.write(write_end, READY)
                os.close(write_end)

            asyncio.run(
                _gateway.serve(
                    servers,
                    sock=sock,
                    root=Path(args.state_dir),
                    token=token,
                    env=gateway_env(),
                    errlog=log,
                    ready=ready,
                )
            )
        except BaseException as exc:  # noqa: BLE001 (everything ends here: the parent reads the reason)
            message = reason(exc)
            print(f"mcp-gateway: {message}", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):  # already reported ready: the log has it
                os.write(write_end, message.encode(errors="replace")[:4000])
            status = 1
        os._exit(status)
    sock.close()
    os.close(write_end)
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read()
    if said != READY:
        why = said.decode(errors="replace").strip() or f"it exited before it served (see {args.log})"
        print(f"mcp-gateway: {why}", file=sys.stderr)
        return 1
    _write_token(Path(args.token_file), token)
    print(f"mcp-gateway: serving {len(servers)} server(s) on port {args.port}")
    return 0


def _foreground(args: argparse.Namespace, servers: Sequence[StdioServer], token: str) -> int:
    from . import _gateway  # noqa: PLC0415

    sock = _gateway.listen(args.host, args.port)

    def ready() -> None:
        _write_token(Path(args.token_file), token)
        print(f"mcp-gateway: serving {len(servers)} server(s) on port {args.port}", flush=True)

    kwargs = {"sock": sock, "root": Path(args.state_dir), "token": token, "env": gateway_env()}
    asyncio.run(_gateway.serve(servers, **kwargs, errlog=sys.stderr, ready=ready))  # type: ignore[arg-type]
    return 0


def _start(args: argparse.Namespace) -> int:
    try:
        servers = parse_config(json.loads(args.config))
    except json.JSONDecodeError as exc:
        print(f"mcp-gateway: --config is not JSON: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return 2
    token = os.environ.get("GATEWAY_ACCESS_TOKEN") or secrets.token_urlsafe(32)
    try:
        for server in servers:
            install(prepare(Path(args.state_dir), server), server)
        return (_foreground if args.foreground else _detached)(args, servers, token)
    except GatewayError as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return 1


def _pull(args: argparse.Namespace) -> int:
    names = ", ".join(args.names) or "nothing"
    print(
        f"mcp-gateway: cannot pull {names}: catalogue servers are container images, which this gateway "
        "does not run; configure 'github/<owner>/<repository>' servers with a runCmd instead",
        file=sys.stderr,
    )
    return 1


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="mcp-gateway", description="One MCP endpoint in front of stdio MCP servers.")
    top.add_argument("--config", help="the servers, as the clients' mcp mapping in JSON")
    top.add_argument("--host", default="0.0.0.0", help="address to listen on (default: every address)")  # noqa: S104
    top.add_argument("--port", type=int, default=GATEWAY_PORT, help=f"port to listen on (default {GATEWAY_PORT})")
    top.add_argument("--state-dir", default=STATE_DIR, help="where the servers' repositories are cloned")
    top.add_argument("--token-file", default=TOKEN_PATH, help="where the access token is written once serving")
    top.add_argument("--log", default=LOG, help="the detached gateway's log")
    top.add_argument("--pid-file", default=PID_FILE, help="where the detached gateway writes its pid")
    top.add_argument("--foreground", action="store_true", help="serve in this process instead of detaching")
    actions = top.add_subparsers(dest="action")
    pull = actions.add_parser("pull", help="add catalogue servers to a template (refused: no catalogue here)")
    pull.add_argument("names", nargs="*")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.action == "pull":
        return _pull(args)
    if args.config is None:
        parser().print_usage(sys.stderr)
        print("mcp-gateway: --config is required", file=sys.stderr)
        return 2
    return _start(args)
