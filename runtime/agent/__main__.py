"""``python -m runtime.agent``: run the agent (the same as ``e2b-compat agent``)."""

from __future__ import annotations

import argparse

from ._server import DEFAULT_HOSTS, DEFAULT_PORT, serve


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
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    serve(tuple(args.hosts or DEFAULT_HOSTS), args.port, default_user=args.default_user)


if __name__ == "__main__":
    main()
