"""Command line: ``e2b-compat <group> <action>``.

Each group registers its own subcommands; a group appears here only once it works.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from contract import ArtifactStore, ContractError, DriftError, check, load_inventory, load_lock, write

from . import __version__


def _store(args: argparse.Namespace) -> ArtifactStore:
    return ArtifactStore(root=args.cache, log=lambda msg: print(msg, file=sys.stderr))


def _contract_fetch(args: argparse.Namespace) -> int:
    store = _store(args)
    for artifact in load_lock().artifacts.values():
        path = store.fetch(artifact)
        print(f"{artifact.key:26} {artifact.spec:34} sha256 {artifact.sha256[:16]}…  {path}")
    return 0


def _contract_generate(args: argparse.Namespace) -> int:
    store = _store(args)
    changed = write(store=store)
    print("\n".join(f"updated {rel}" for rel in changed) or "contract already up to date")
    return 0


def _contract_check(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        check(store=store)
    except DriftError as exc:
        print(exc.report, file=sys.stderr)
        return 1
    print("contract: no drift (derived files match the pinned artifacts)")
    return 0


def _contract_inventory(args: argparse.Namespace) -> int:
    for op in load_inventory():
        if args.surface and op.surface != args.surface:
            continue
        where = op.procedure or f"{op.method} {op.path}"
        sdk = "sdk" if op.called_by_sdk else "-"
        print(f"{op.id:38} {op.surface:15} {op.streaming:14} {sdk:4} {where}")
    return 0


def _agent(args: argparse.Namespace) -> int:
    # Imported here so the contract commands do not load the server stack.
    from runtime.agent._server import DEFAULT_HOSTS, serve  # noqa: PLC0415

    serve(tuple(args.hosts or DEFAULT_HOSTS), args.port, default_user=args.default_user)
    return 0


def _host_prepare(args: argparse.Namespace) -> int:
    from runtime import _host  # noqa: PLC0415 - only this command needs the runtime

    try:
        _host.prepare(say=lambda msg: print(f"host set-up: {msg}"))
    except _host.HostNotReadyError as exc:
        print(f"e2b-compat: host not ready: {exc}", file=sys.stderr)
        return 1
    print("host ready for crun sandboxes")
    return 0


def _template_build(args: argparse.Namespace) -> int:
    from runtime.templates import TemplateError, ensure_template  # noqa: PLC0415

    try:
        template = ensure_template(args.name, cache_root=args.cache)
    except TemplateError as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 1
    print(f"{template.name}: {template.path}")
    return 0


def _template_list(args: argparse.Namespace) -> int:
    from runtime.templates import list_templates  # noqa: PLC0415

    for template in list_templates(args.cache):
        print(f"{template.name:6} {template.key[:16]}  {template.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="e2b-compat", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    groups = parser.add_subparsers(dest="group", required=True, metavar="GROUP")

    contract = groups.add_parser("contract", help="the pinned upstream contract")
    contract.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="artifact cache folder (default: $E2B_COMPAT_CACHE or ~/.cache/e2b-compat)",
    )
    actions = contract.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("fetch", help="download and verify the pinned artifacts").set_defaults(func=_contract_fetch)
    actions.add_parser("generate", help="regenerate the derived contract in place").set_defaults(
        func=_contract_generate
    )
    actions.add_parser("check", help="fail with a diff when the committed contract has drifted").set_defaults(
        func=_contract_check
    )
    inventory = actions.add_parser("inventory", help="list every operation of the inventory")
    inventory.add_argument(
        "--surface", choices=["control-plane", "envd-http", "envd-rpc", "volume-content", "interpreter"]
    )
    inventory.set_defaults(func=_contract_inventory)

    agent = groups.add_parser("agent", help="run the sandbox agent (our envd) in the foreground")
    agent.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="ADDRESS",
        help="address to listen on, repeatable (default 0.0.0.0; for the clients' debug mode on "
        "this machine: --host 127.0.0.1 --host ::1)",
    )
    agent.add_argument("--port", type=int, default=49983)
    agent.add_argument("--default-user", default=None, help="user for requests that name none (default root)")
    agent.set_defaults(func=_agent)

    host = groups.add_parser("host", help="the machine that runs sandboxes")
    host_actions = host.add_subparsers(dest="action", required=True, metavar="ACTION")
    host_actions.add_parser(
        "prepare", help="install crun/nftables/debootstrap and apply the cgroup fix (root)"
    ).set_defaults(func=_host_prepare)

    template = groups.add_parser("template", help="sandbox templates (root filesystems)")
    template.add_argument("--cache", type=Path, default=None, help="cache folder (default: as for contract)")
    template_actions = template.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = template_actions.add_parser("build", help="build a template ahead of time (cached by content)")
    build.add_argument("name", nargs="?", default="base", choices=["base", "os"])
    build.set_defaults(func=_template_build)
    template_actions.add_parser("list", help="list the built templates").set_defaults(func=_template_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except ContractError as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 2
    return result
