"""``python -m runtime.agent``: run the agent (the same as ``e2b-compat agent``)."""

from __future__ import annotations

import gc

# The start-up imports (some 440 modules) make hundreds of thousands of objects and almost no
# garbage: the cyclic collector's passes over them were ~5% of the agent's start. It is back on
# once the agent listens (``_server``). Only when run: a process that imports this module (for
# ``build_parser``) keeps its collector.
if __name__ == "__main__":
    gc.disable()

import argparse

from ._server import DEFAULT_HOSTS, DEFAULT_PORT, serve
from ._services import parse_service


def build_parser(prog: str = "python -m runtime.agent") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Serve envd (our agent) over HTTP/1.1.")
    parser.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="ADDRESS",
        help="address to listen on; repeat for several (default 0.0.0.0; for the clients' "
        "debug mode on this machine use --host 127.0.0.1 --host ::1)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--default-user", default=None, help="user for requests that name none (envd default: root)")
    parser.add_argument(
        "--service",
        action="append",
        dest="services",
        default=[],
        metavar="PORT=COMMAND",
        help="a template service to start before serving, ready once PORT accepts connections; repeatable",
    )
    parser.add_argument("--service-user", default=None, help="user the services run as (default: the agent's)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        services = tuple(parse_service(text) for text in args.services)
    except ValueError as exc:
        parser.error(str(exc))
    serve(
        tuple(args.hosts or DEFAULT_HOSTS),
        args.port,
        default_user=args.default_user,
        services=services,
        service_user=args.service_user,
    )


if __name__ == "__main__":
    main()
