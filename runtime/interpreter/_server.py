"""``python -m runtime.interpreter``: the command line and uvicorn around the app.

Started by the sandbox agent as the sandbox user when a code-interpreter sandbox starts. The
port is open as soon as uvicorn runs (the default python kernel starts in the background),
and on SIGTERM/SIGINT uvicorn's shutdown stops every kernel through the app's lifespan.
"""

from __future__ import annotations

import argparse
import logging
from typing import Final

import uvicorn

from contract.protocol import INTERPRETER_PORT

from ._app import create_app
from ._contexts import Settings

DEFAULT_HOST: Final = "0.0.0.0"  # noqa: S104 - inside a sandbox the server must be reachable from the host
DEFAULT_PORT: Final = INTERPRETER_PORT
KEEPALIVE_S: Final = 640  # idle HTTP keep-alive, as upstream's uvicorn
GRACEFUL_SHUTDOWN_S: Final = 5  # then open streams are cancelled and kernels stopped


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, settings: Settings | None = None) -> None:
    """Serve until interrupted (one process, one event loop: contexts live in memory)."""
    config = uvicorn.Config(
        create_app(settings or Settings()),
        host=host,
        port=port,
        lifespan="on",
        loop="asyncio",  # as the agent's (runtime.agent._server): kernels are processes of the sandbox user
        http="h11",
        ws="none",
        timeout_keep_alive=KEEPALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_level="warning",
        access_log=False,
        server_header=False,
    )
    uvicorn.Server(config).run()


def build_parser(prog: str = "python -m runtime.interpreter") -> argparse.ArgumentParser:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog=prog, description="Serve the Code Interpreter API on Jupyter kernels.")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--kernel-python",
        default=defaults.kernel_python,
        help="interpreter of the kernel environment (ipykernel, bash_kernel, …)",
    )
    parser.add_argument("--envd-url", default=defaults.envd_url, help="envd, for the sandbox-global env vars")
    parser.add_argument("--cwd", default=defaults.cwd, help="working directory of contexts that name none")
    parser.add_argument(
        "--keepalive-interval",
        type=float,
        default=defaults.keepalive_interval,
        help="seconds of silence in an execution before a keepalive line",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.keepalive_interval <= 0:
        raise SystemExit("--keepalive-interval must be positive")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every envd request at INFO; the runs' own lines say what matters.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    settings = Settings(
        kernel_python=args.kernel_python,
        envd_url=args.envd_url,
        cwd=args.cwd,
        keepalive_interval=args.keepalive_interval,
    )
    serve(args.host, args.port, settings)
