"""Command line: ``e2b-compat <group> <action>``.

Each group registers its own subcommands; a group appears here only once it works.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from contract import ArtifactStore, ContractError, DriftError, check, load_inventory, load_lock, write

from . import __version__

if TYPE_CHECKING:  # the server stack is imported only by the commands that use it
    from reference_server._keys import KeyStore


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


def _serve(args: argparse.Namespace) -> int:
    import os  # noqa: PLC0415

    from reference_server._config import ConfigError, load_config, render_toml  # noqa: PLC0415

    try:
        config = load_config(args.config, os.environ)
    except ConfigError as exc:
        print(f"e2b-compat: configuration: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(render_toml(config), end="")
        return 0
    from reference_server._server import ServerStartError, serve  # noqa: PLC0415 - loads the server stack

    try:
        return serve(config)
    except ServerStartError as exc:
        print(f"e2b-compat: cannot start the server: {exc}", file=sys.stderr)
        return 1


def _keys_data_dir(args: argparse.Namespace) -> Path:
    if args.data_dir is not None:
        return Path(args.data_dir)
    import os  # noqa: PLC0415

    from reference_server._config import load_config  # noqa: PLC0415 - only the server commands need it

    return load_config(None, os.environ).data_dir


def _keys_run(args: argparse.Namespace, action: Callable[[KeyStore], Awaitable[int]], *, create: bool) -> int:
    """Open ``<data_dir>/server.db`` (migrating it) and run ``action`` with a ``KeyStore`` on it."""
    import asyncio  # noqa: PLC0415

    from reference_server._config import ConfigError  # noqa: PLC0415
    from reference_server._keys import KeyStore  # noqa: PLC0415
    from reference_server._migrations import UnknownMigrationHistory  # noqa: PLC0415
    from reference_server._store import Store, StoreError  # noqa: PLC0415

    try:
        data_dir = _keys_data_dir(args)
    except ConfigError as exc:
        print(f"e2b-compat: configuration: {exc}", file=sys.stderr)
        return 2
    database = data_dir / "server.db"
    if not create and not database.is_file():
        # Opening would create an empty database: a mistyped --data-dir must not pass for "no keys".
        print(f"e2b-compat: no server database at {database} (wrong --data-dir, or no key issued yet)", file=sys.stderr)
        return 1
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    async def scenario() -> int:
        async with await Store.open(database) as store:
            return await action(KeyStore(store.db))

    try:
        return asyncio.run(scenario())
    except ValueError as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 2
    except (StoreError, UnknownMigrationHistory) as exc:
        print(f"e2b-compat: {database}: {exc}", file=sys.stderr)
        return 1


def _keys_issue(args: argparse.Namespace) -> int:
    async def issue(keys: KeyStore) -> int:
        issued = await keys.issue(args.owner, args.name)
        print(issued.key)  # stdout holds the key alone, so that $(e2b-compat keys issue ...) captures it
        print(f"issued key {issued.key_id} for owner {issued.owner}; it is shown only this once", file=sys.stderr)
        return 0

    return _keys_run(args, issue, create=True)


def _keys_revoke(args: argparse.Namespace) -> int:
    async def revoke(keys: KeyStore) -> int:
        if await keys.revoke(args.key_id):
            print(f"revoked key {args.key_id}")
            return 0
        print(f"e2b-compat: no unrevoked key with id {args.key_id}", file=sys.stderr)
        return 1

    return _keys_run(args, revoke, create=False)


def _keys_list(args: argparse.Namespace) -> int:
    async def show(keys: KeyStore) -> int:
        rows = [("KEY ID", "OWNER", "NAME", "CREATED", "REVOKED")]
        rows += [
            (
                info.key_id,
                info.owner,
                info.name or "-",
                _when(info.created_at),
                _when(info.revoked_at) if info.revoked_at is not None else "-",
            )
            for info in await keys.list(args.owner)
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        return 0

    return _keys_run(args, show, create=False)


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


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

    serve = groups.add_parser(
        "serve",
        help="run the reference server (sets up the host as root, prints the client environment)",
        description="Run the reference server on its embedded defaults (SQLite, crun, e2b.localhost:8443). "
        "Configuration: --config FILE, else $E2B_COMPAT_SERVER_CONFIG, else <data_dir>/server.toml; "
        "E2B_COMPAT_SERVER_<KEY> variables override (docs/SERVER.md).",
    )
    serve.add_argument("--config", type=Path, default=None, help="a TOML configuration file")
    serve.add_argument("--print-config", action="store_true", help="print the effective configuration and exit")
    serve.set_defaults(func=_serve)

    keys = groups.add_parser("keys", help="API keys of the reference server")
    key_actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    data_dir_help = "the server's data folder (default: data_dir of the server configuration)"
    issue = key_actions.add_parser("issue", help="issue a key: the key on stdout, its id and owner on stderr")
    issue.add_argument("--owner", required=True, help="who the key acts for (1-64 of A-Z a-z 0-9 . _ -)")
    issue.add_argument("--name", default="", help="a note to recognise the key by")
    issue.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    issue.set_defaults(func=_keys_issue)
    revoke = key_actions.add_parser("revoke", help="revoke a key at once (running servers included)")
    revoke.add_argument("key_id", metavar="KEY_ID", help="the key's id, as listed")
    revoke.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    revoke.set_defaults(func=_keys_revoke)
    listing = key_actions.add_parser("list", help="list keys (ids, owners, names, dates; never a key or hash)")
    listing.add_argument("--owner", default=None, help="only this owner's keys")
    listing.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    listing.set_defaults(func=_keys_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except ContractError as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 2
    return result
