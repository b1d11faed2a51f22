"""Command line: ``e2b-compat <group> <action>``.

Each group registers its own subcommands; a group appears here only once it works.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from contract import ArtifactStore, ContractError, DriftError, check, load_inventory, load_lock, write
from contract.protocol import ENVD_PORT

from . import __version__

if TYPE_CHECKING:  # the server stack is imported only by the commands that use it
    from reference_server import KeyStore


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
    from runtime.agent import DEFAULT_HOSTS, serve  # noqa: PLC0415

    serve(tuple(args.hosts or DEFAULT_HOSTS), args.port, default_user=args.default_user)
    return 0


def _host_prepare(args: argparse.Namespace) -> int:
    # Only this command needs the runtime; the table is cheap, a backend's module loads when used.
    from runtime.backend import BackendError  # noqa: PLC0415
    from runtime.backends import DEFAULT_BACKEND, UnknownBackendError, backend_entry, serving_backends  # noqa: PLC0415

    names = serving_backends() if args.backend == "all" else (args.backend or DEFAULT_BACKEND,)
    try:
        entries = [backend_entry(name) for name in names]
    except UnknownBackendError as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 2
    from reference_server import ConfigError, NameResolutionError, ensure_name_resolution, load_config  # noqa: PLC0415

    def say(message: str) -> None:
        print(f"host set-up: {message}")

    try:
        for entry in entries:
            entry.prepare_host(say)
        # The server's names (api.<domain>, <port>-<id>.<domain>) must resolve to loopback for the
        # clients on this host, the tests included: the same check and fix as ``serve`` makes.
        domain = load_config(args.config, os.environ).domain
        ensure_name_resolution(domain, say)
    except ConfigError as exc:
        print(f"e2b-compat: configuration: {exc}", file=sys.stderr)
        return 2
    except (BackendError, NameResolutionError) as exc:
        print(f"e2b-compat: host not ready: {exc}", file=sys.stderr)
        return 1
    print(f"host ready for {', '.join(entry.name for entry in entries)} sandboxes and for names under {domain}")
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


def _write_lock(write: Callable[[], Path]) -> int:
    from runtime.templates import TemplateError  # noqa: PLC0415

    try:
        path = write()
    except TemplateError as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


def _template_lock_kernels(args: argparse.Namespace) -> int:
    from runtime.templates import WHEEL_LOCKS, write_kernel_lock  # noqa: PLC0415

    for requirements in WHEEL_LOCKS:
        if status := _write_lock(functools.partial(write_kernel_lock, requirements)):
            return status
    return 0


def _template_lock_packages(args: argparse.Namespace) -> int:
    from runtime.templates import lock_packages  # noqa: PLC0415

    return _write_lock(lock_packages)


def _template_list(args: argparse.Namespace) -> int:
    from runtime.templates import list_templates  # noqa: PLC0415

    for template in list_templates(args.cache):
        print(f"{template.name:19} {template.key[:16]}  {template.path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import os  # noqa: PLC0415

    from reference_server import ConfigError, load_config, render_toml  # noqa: PLC0415

    try:
        config = load_config(args.config, os.environ)
    except ConfigError as exc:
        print(f"e2b-compat: configuration: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(render_toml(config), end="")
        return 0
    from reference_server import ServerStartError, serve  # noqa: PLC0415 - loads the server stack

    try:
        return serve(config)
    except ServerStartError as exc:
        print(f"e2b-compat: cannot start the server: {exc}", file=sys.stderr)
        return 1


def _keys_data_dir(args: argparse.Namespace) -> Path:
    if args.data_dir is not None:
        return Path(args.data_dir)
    import os  # noqa: PLC0415

    from reference_server import load_config  # noqa: PLC0415 - only the server commands need it

    return load_config(None, os.environ).data_dir


def _keys_run(args: argparse.Namespace, action: Callable[[KeyStore], Awaitable[int]], *, create: bool) -> int:
    """Open ``<data_dir>/server.db`` (migrating it) and run ``action`` with a ``KeyStore`` on it."""
    import asyncio  # noqa: PLC0415

    from reference_server import ConfigError, KeyStore, Store, StoreError, UnknownMigrationHistory  # noqa: PLC0415

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


def _conformance_verify(args: argparse.Namespace) -> int:
    from conformance import verify  # noqa: PLC0415 - only this command needs cryptography

    result = verify(args.report, trusted_fingerprint=args.fingerprint)
    if not result.valid:
        print(f"e2b-compat: {result.report_path}: signature NOT valid: {result.problem}", file=sys.stderr)
        return 1
    print(result.fingerprint)  # stdout holds the fingerprint alone, for $(e2b-compat conformance verify ...)
    if result.trusted:
        print(f"{result.report_path}: valid signature by the trusted key", file=sys.stderr)
    else:
        # Anyone can sign a report with a key of their own: only a published fingerprint says whose it is.
        print(
            f"{result.report_path}: valid signature, but the key was not checked against a trusted "
            "fingerprint (pass --fingerprint HEX)",
            file=sys.stderr,
        )
    return 0


def _conformance_run(args: argparse.Namespace) -> int:
    from conformance import (  # noqa: PLC0415
        RunOptions,
        available_node_versions,
        available_python_versions,
        endpoint_from_environment,
        main_run,
    )

    endpoint_env = None
    if args.endpoint_domain is not None:
        if args.endpoint_api_key is None:
            print("e2b-compat: --endpoint-domain needs --endpoint-api-key (or E2B_API_KEY)", file=sys.stderr)
            return 2
        endpoint_env = {"E2B_API_KEY": args.endpoint_api_key, "E2B_DOMAIN": args.endpoint_domain}
        if args.endpoint_ca is not None:
            endpoint_env |= {"SSL_CERT_FILE": str(args.endpoint_ca), "NODE_EXTRA_CA_CERTS": str(args.endpoint_ca)}
    elif args.endpoint_from_env:
        endpoint_env = endpoint_from_environment()
        if endpoint_env is None:
            print("e2b-compat: --endpoint-from-env needs E2B_API_KEY and E2B_DOMAIN", file=sys.stderr)
            return 2
    # Our server runs on the backend named (default crun, or every serving one for "all");
    # for another endpoint the name is only a label for its report.
    backend = args.backend or ("unknown" if endpoint_env is not None else "crun")
    options = RunOptions(
        endpoint_env=endpoint_env,
        second_api_key=args.second_api_key,
        python_versions=tuple(available_python_versions() if args.sweep else args.python_version or ()),
        node_versions=tuple(available_node_versions() if args.sweep else args.node_version or ()),
        match=args.match,
        output=args.output,
        reports_root=args.reports,
        features=args.features,
        signing_key=args.signing_key,
        server_name=args.server_name,
        backend=backend,
        jobs=args.jobs,
        mutants=args.mutants,
        local_registry=args.local_registry,
    )
    return main_run(options)


def _conformance_mutants(args: argparse.Namespace) -> int:
    from conformance import HEAVY_LOCK, MutantOptions, main_mutants  # noqa: PLC0415

    options = MutantOptions(
        match=args.match,
        budget_s=args.budget_minutes * 60,
        mutant_timeout_s=args.mutant_timeout,
        case_timeout_s=args.case_timeout,
        jobs=args.jobs,
        output=args.output,
        reports_root=args.reports,
        lock=None if args.no_lock else (args.lock or HEAVY_LOCK),
        keep=args.keep,
        list_only=args.list,
    )
    return main_mutants(options)


def _conformance_matrix(args: argparse.Namespace) -> int:
    from conformance import (  # noqa: PLC0415
        MatrixError,
        SigningKeyError,
        load_or_create_signing_key,
        load_report,
        write_matrix,
    )

    try:
        reports = [load_report(path, trusted_fingerprint=args.fingerprint) for path in args.reports]
        key = None if args.unsigned else load_or_create_signing_key(args.signing_key)
        written = write_matrix(reports, args.output, signing_key=key)
    except (MatrixError, SigningKeyError) as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 1
    print(f"{written.markdown}\n{written.json}")
    if written.unexplained:
        print(f"e2b-compat: {written.unexplained} difference(s) between backends unexplained", file=sys.stderr)
        return 1
    return 0


def _add_matrix_action(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    matrix = actions.add_parser(
        "matrix",
        help="merge several reports (backends, template sets, client versions) into one compatibility matrix",
        description="Each report is validated and its signature checked; writes OUTPUT/matrix.md and "
        "OUTPUT/matrix.json, signed like a report (docs/REPORT.md). Exit 1 when a report cannot be merged "
        "or a difference between backends has no declared reason.",
    )
    matrix.add_argument("reports", type=Path, nargs="+", metavar="REPORT", help="a report folder or its report.json")
    matrix.add_argument("--output", type=Path, required=True, help="the folder for matrix.md and matrix.json")
    matrix.add_argument("--fingerprint", default=None, help="require every report signed by this key")
    matrix.add_argument("--signing-key", type=Path, default=None, help="Ed25519 key (default: as for conformance run)")
    matrix.add_argument("--unsigned", action="store_true", help="do not sign matrix.json")
    matrix.set_defaults(func=_conformance_matrix)


def _add_mutants_action(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mutants = actions.add_parser(
        "mutants",
        help="plant the curated mutants in copies of this tree and report which the harness kills",
        description="Each mutant is one behavioural change of the server or the agent "
        "(conformance/_mutant_catalog.py), run against a server started from a mutated copy; writes "
        "reports/mutants/<time>/mutants.json and "
        "mutants.md (docs/MUTANTS.md). Exit 1 when a mutant no longer fits the code, 2 when the baseline fails.",
    )
    mutants.add_argument("--match", default="", help="only mutants whose id contains this")
    mutants.add_argument("--list", action="store_true", help="list the mutants, checked against the checkout, and exit")
    mutants.add_argument("--budget-minutes", type=float, default=30.0, help="the whole session (default 30)")
    mutants.add_argument("--mutant-timeout", type=float, default=300.0, help="seconds per mutant (default 300)")
    mutants.add_argument("--case-timeout", type=float, default=150.0, help="seconds per case run (default 150)")
    mutants.add_argument(
        "--jobs", type=int, default=2, choices=range(1, 9), metavar="N", help="case runs side by side (default 2)"
    )
    mutants.add_argument("--output", type=Path, default=None, help="the output folder (default: under --reports)")
    mutants.add_argument("--reports", type=Path, default=Path("reports"), help="where reports/mutants/<time>/ is made")
    lock = mutants.add_mutually_exclusive_group()
    lock.add_argument("--lock", type=Path, default=None, help="lock file taken per mutant (default: the shared one)")
    lock.add_argument("--no-lock", action="store_true", help="take no lock (the caller holds the shared one)")
    mutants.add_argument("--keep", action="store_true", help="keep the scratch copies and logs")
    mutants.set_defaults(func=_conformance_mutants)


def _add_conformance_group(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``e2b-compat conformance ACTION``: each action is one subparser here with its own ``func``."""
    conformance = groups.add_parser("conformance", help="compatibility reports of E2B-style endpoints")
    actions = conformance.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = actions.add_parser(
        "verify",
        help="check a report's Ed25519 signature (exit 0 and print the key fingerprint, else 1)",
        description="Check report.json against report.json.sig and report.json.pub beside it (docs/REPORT.md).",
    )
    verify.add_argument("report", type=Path, metavar="REPORT_DIR_OR_JSON", help="a report folder or its report.json")
    verify.add_argument(
        "--fingerprint",
        metavar="HEX",
        default=None,
        help="require the signing key to be this one (sha256 of the raw public key, as the signer published it)",
    )
    verify.set_defaults(func=_conformance_verify)

    run = actions.add_parser(
        "run",
        help="run every suite against an endpoint and write a signed report; exit 1 when the gate or a case fails",
        description="Without endpoint options it starts the reference server on its embedded defaults (root), "
        "on --backend (default crun; 'all': every serving backend in turn, one report each and a matrix). "
        "Reports go to reports/<time>-<backend>-<template>/ (docs/REPORT.md).",
    )
    run.add_argument(
        "--backend",
        default=None,
        metavar="NAME",
        help="our server's sandbox backend (the host is prepared for it), or 'all'; with another "
        "endpoint only a label for its report (default: crun, or unknown for another endpoint)",
    )
    endpoint = run.add_argument_group("another endpoint (any E2B-compatible service)")
    endpoint.add_argument("--endpoint-domain", default=None, metavar="DOMAIN[:PORT]", help="its E2B_DOMAIN")
    endpoint.add_argument(
        "--endpoint-api-key", default=os.environ.get("E2B_API_KEY"), metavar="KEY", help="its E2B_API_KEY"
    )
    endpoint.add_argument("--endpoint-ca", type=Path, default=None, help="a CA file to trust for it")
    endpoint.add_argument(
        "--endpoint-from-env",
        action="store_true",
        help="take E2B_API_KEY, E2B_DOMAIN, SSL_CERT_FILE from the environment",
    )
    endpoint.add_argument("--second-api-key", default=None, help="another owner's key (owner isolation cases)")
    endpoint.add_argument(
        "--local-registry",
        action="store_true",
        help="offer the image cases a registry on this host (for an endpoint on this host; ours always gets one)",
    )
    endpoint.add_argument("--server-name", default="external", help="how the report names the endpoint")
    endpoint.add_argument("--features", type=Path, default=None, help="its declared unsupported features (JSON)")
    sweep = run.add_argument_group("SDK-version sweep")
    sweep.add_argument("--python-version", action="append", metavar="VERSION", help="a Python e2b version (repeatable)")
    sweep.add_argument("--node-version", action="append", metavar="VERSION", help="an npm e2b version (repeatable)")
    sweep.add_argument(
        "--sweep",
        action="store_true",
        help="every committed client lock (conformance/clients), paired in order; also writes versions.md",
    )
    run.add_argument("--match", default="", help="only cases whose name contains this")
    run.add_argument(
        "--jobs", type=int, default=2, choices=range(1, 9), metavar="N", help="cases run side by side (1-8; default 2)"
    )
    run.add_argument("--output", type=Path, default=None, help="the report folder (default: a new one under --reports)")
    run.add_argument("--reports", type=Path, default=Path("reports"), help="where report folders are made")
    run.add_argument(
        "--signing-key",
        type=Path,
        default=None,
        help="Ed25519 key (default: $E2B_COMPAT_SIGNING_KEY or ~/.config/e2b-compat)",
    )
    run.add_argument(
        "--mutants",
        type=Path,
        default=None,
        metavar="PATH",
        help="a mutants session's mutants.json (or its folder): its score and survivors go into the report",
    )
    run.set_defaults(func=_conformance_run)
    _add_matrix_action(actions)
    _add_mutants_action(actions)


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
    agent.add_argument("--port", type=int, default=ENVD_PORT)
    agent.add_argument("--default-user", default=None, help="user for requests that name none (default root)")
    agent.set_defaults(func=_agent)

    host = groups.add_parser("host", help="the machine that runs sandboxes")
    host_actions = host.add_subparsers(dest="action", required=True, metavar="ACTION")
    prepare = host_actions.add_parser(
        "prepare",
        help="install and check what a sandbox backend needs (crun: crun/nftables/debootstrap, the cgroup fix; root)",
    )
    prepare.add_argument(
        "--backend",
        metavar="NAME",
        default=None,
        help="the sandbox backend to prepare the host for (default: crun; all: every backend a server can run on)",
    )
    prepare.add_argument(
        "--config", type=Path, default=None, help="the server's configuration file, whose domain must resolve"
    )
    prepare.set_defaults(func=_host_prepare)

    template = groups.add_parser("template", help="sandbox templates (root filesystems)")
    template.add_argument("--cache", type=Path, default=None, help="cache folder (default: as for contract)")
    template_actions = template.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = template_actions.add_parser("build", help="build a template ahead of time (cached by content)")
    build.add_argument("name", nargs="?", default="base", choices=["base", "code-interpreter-v1", "mcp-gateway", "os"])
    build.set_defaults(func=_template_build)
    template_actions.add_parser("list", help="list the built templates").set_defaults(func=_template_list)
    template_actions.add_parser(
        "lock-kernels",
        help="re-resolve runtime/templates/kernels.in and mcp-gateway.in into hashed locks for this python and machine",
    ).set_defaults(func=_template_lock_kernels)
    template_actions.add_parser(
        "lock-packages",
        help="re-resolve runtime/templates/packages.in (Debian packages of the kernels) into the lock (root)",
    ).set_defaults(func=_template_lock_packages)

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

    _add_conformance_group(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except ContractError as exc:
        print(f"e2b-compat: {exc}", file=sys.stderr)
        return 2
    return result
