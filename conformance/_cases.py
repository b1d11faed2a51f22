"""The conformance cases, as data: hierarchical name, scenario, client flavours, operations, check.

A case runs one scenario (``scenarios/<family>/``) with each of its client flavours and passes
when the scenario's JSON result satisfies the check. ``operations`` are the contract inventory
ids the case exercises; coverage accounting in the report is computed from them, so a case that
starts using another operation must say so here. Names are ``<family>/<area>/<what>``.

Families:

- ``envd``: the agent's surface (processes, files, PTY, watches, and commands and file round
  trips in parallel on one sandbox) on one sandbox the script creates; runs against a bare agent
  in the clients' debug mode or through any control plane.
- ``sandbox``: the control plane's lifecycle (create, list, pause, connect, snapshots, metrics,
  owners) with real sandboxes, and a burst of 32 parallel creates from two owners in which every
  sandbox proves its identity (``parallel-creates``); needs a control plane.
- ``interpreter``: the code interpreter (port 49999: ``/execute`` and ``/contexts``) through the
  official interpreter clients (``e2b_code_interpreter``, ``@e2b/code-interpreter``), on sandboxes
  of their default template ``code-interpreter-v1``: results and their MIME forms (DataFrame HTML,
  matplotlib PNG and chart, display calls), errors, execution counts, contexts, per-run
  environment variables, interrupting an abandoned run, concurrent contexts, bash and the
  languages the template has no kernel for, and the traffic token on a private sandbox's port.
  Needs a control plane and that template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _checks as checks

__all__ = ["CASES", "FAMILY_TEMPLATES", "Case", "Check", "cases"]

Check = Callable[[dict[str, Any], str], None]
ALL = ("py-sync", "py-async", "js")

# Every scenario creates its sandbox and kills it in ``finally``.
LIFE = ("control.sandboxes.create", "control.sandboxes.kill")
START = "envd.process.Start"
UPLOAD, DOWNLOAD = "envd.http.files_upload", "envd.http.files_download"
EXECUTE = "interpreter.execute"
CONTEXTS = (
    "interpreter.contexts.create",
    "interpreter.contexts.list",
    "interpreter.contexts.remove",
    "interpreter.contexts.restart",
)

CREATE = "control.sandboxes.create"
NETWORK = ("allowOut", "denyOut", "allowPublicTraffic", "maskRequestHost")
# The control-plane operations on one sandbox (and its snapshot) that another owner must not reach.
OWNED = (
    "control.sandboxes.get",
    "control.sandboxes.set_timeout",
    "control.sandboxes.update_network",
    "control.sandboxes.metrics",
    "control.sandboxes.pause",
    "control.snapshots.create",
    "control.snapshots.list",
    "control.sandboxes.connect",
    "control.sandboxes.list",
    "control.templates.delete",
)  # and kill, which every case has (LIFE)
FILESYSTEM = tuple(f"envd.filesystem.{name}" for name in ("MakeDir", "ListDir", "Stat", "Move", "Remove"))
PROCESS = ("message.process.cmd", "message.process.args")  # what every command sends

# The template each family's scenarios create their sandboxes from (the clients' defaults).
FAMILY_TEMPLATES = {"envd": "base", "sandbox": "base", "interpreter": "code-interpreter-v1"}


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    scenario: str  # the name the scenario scripts know it by
    flavours: tuple[str, ...]
    operations: tuple[str, ...]
    check: Check
    second_owner: bool = False  # the scenario also acts as another owner (SECOND_API_KEY)
    # Request fields (contract.load_fields ids) whose effect the check shows: not merely sent, but
    # observed through the client (a value read back, a behaviour that differs without it).
    fields: tuple[str, ...] = ()


def on(operation: str, *keys: str) -> tuple[str, ...]:
    """Field ids of one operation: ``on("envd.process.Start", "message.process.cwd")``."""
    return tuple(f"{operation}:{key}" for key in keys)


def _envd(
    scenario: str,
    flavours: tuple[str, ...],
    operations: tuple[str, ...],
    check: Check,
    *,
    fields: tuple[str, ...] = (),
) -> Case:
    return Case(f"envd/{scenario}", "envd", scenario, flavours, (*LIFE, *operations), check, fields=fields)


def _sandbox(
    scenario: str,
    flavours: tuple[str, ...],
    operations: tuple[str, ...],
    check: Check,
    *,
    second_owner: bool = False,
    fields: tuple[str, ...] = (),
) -> Case:
    area, _, what = scenario.partition("/")
    return Case(
        f"{area}/lifecycle/{what}", "sandbox", scenario, flavours, (*LIFE, *operations), check, second_owner, fields
    )


def _interpreter(
    scenario: str,
    flavours: tuple[str, ...],
    operations: tuple[str, ...],
    check: Check,
    *,
    fields: tuple[str, ...] = (),
) -> Case:
    return Case(scenario, "interpreter", scenario, flavours, (*LIFE, EXECUTE, *operations), check, fields=fields)


CASES: tuple[Case, ...] = (
    _envd(
        "commands/foreground",
        ALL,
        (START,),
        checks.envd_foreground,
        fields=on(START, *PROCESS, "message.process.envs", "message.process.cwd"),
    ),
    _envd("commands/exit-code", ALL, (START,), checks.envd_exit_code),
    _envd("commands/ordering", ("py-sync",), (START,), checks.envd_ordering),
    _envd(
        "commands/background-connect",
        ALL,
        (START, "envd.process.List", "envd.process.Connect"),
        checks.envd_background,
        fields=on("envd.process.Connect", "message.process.pid"),
    ),
    _envd(
        "commands/stdin",
        ALL,
        (START, "envd.process.List", "envd.process.SendInput", "envd.process.CloseStdin"),
        checks.envd_stdin,
        fields=(
            *on(START, "message.stdin"),
            *on("envd.process.SendInput", "message.process.pid", "message.input.stdin"),
            *on("envd.process.CloseStdin", "message.process.pid"),
        ),
    ),
    _envd(
        "commands/kill",
        ALL,
        (START, "envd.process.SendSignal", "envd.process.List"),
        checks.envd_kill,
        fields=on("envd.process.SendSignal", "message.process.pid", "message.signal"),
    ),
    _envd(
        "commands/timeout", ("py-sync",), (START,), checks.envd_timeout, fields=on(START, "header.Connect-Timeout-Ms")
    ),
    _envd("commands/user-and-env", ("py-sync",), (START,), checks.envd_user, fields=on(START, "header.Authorization")),
    _envd(
        "pty/session",
        ALL,
        (START, "envd.process.Update", "envd.process.SendInput"),
        checks.envd_pty,
        fields=(
            *on("envd.process.Update", "message.process.pid", "message.pty.size.cols", "message.pty.size.rows"),
            *on("envd.process.SendInput", "message.input.pty"),
        ),
    ),
    _envd(
        "files/text-bytes-stream",
        ALL,
        (UPLOAD, DOWNLOAD),
        checks.envd_text_bytes,
        fields=(*on(UPLOAD, "query.path"), *on(DOWNLOAD, "query.path")),
    ),
    _envd("files/write-many", ("py-sync", "js"), (UPLOAD,), checks.envd_write_many),
    _envd(
        "files/list-stat-exists",
        ALL,
        (UPLOAD, "envd.filesystem.ListDir", "envd.filesystem.Stat"),
        checks.envd_list,
        fields=(
            *on("envd.filesystem.ListDir", "message.path", "message.depth"),
            *on("envd.filesystem.Stat", "message.path"),
        ),
    ),
    _envd(
        "files/make-dir-rename-remove",
        ALL,
        (UPLOAD, DOWNLOAD, "envd.filesystem.MakeDir", "envd.filesystem.Move", "envd.filesystem.Remove"),
        checks.envd_mkdir,
        fields=(
            *on("envd.filesystem.MakeDir", "message.path"),
            *on("envd.filesystem.Move", "message.source", "message.destination"),
            *on("envd.filesystem.Remove", "message.path"),
        ),
    ),
    _envd("files/metadata", ("py-sync",), (UPLOAD, "envd.filesystem.Stat"), checks.envd_metadata),
    _envd(
        "watch/polling",
        ("py-sync",),
        (
            UPLOAD,
            "envd.filesystem.CreateWatcher",
            "envd.filesystem.GetWatcherEvents",
            "envd.filesystem.RemoveWatcher",
        ),
        checks.envd_watch,
        fields=(
            *on("envd.filesystem.CreateWatcher", "message.path", "message.recursive"),
            *on("envd.filesystem.GetWatcherEvents", "message.watcher_id"),
        ),
    ),
    _envd(
        "watch/stream",
        ("py-async", "js"),
        (UPLOAD, "envd.filesystem.WatchDir"),
        checks.envd_watch,
        fields=on("envd.filesystem.WatchDir", "message.path", "message.recursive"),
    ),
    _envd("concurrency/commands-and-files", ALL, (START, UPLOAD, DOWNLOAD), checks.envd_parallel_traffic),
    _sandbox(
        "sandbox/create-env-metadata",
        ALL,
        ("control.sandboxes.get", START),
        checks.sandbox_create,
        fields=on(CREATE, "body.envVars", "body.metadata", "body.templateID"),
    ),
    _sandbox("sandbox/get-host", ALL, (UPLOAD, START), checks.sandbox_get_host),
    _sandbox(
        "sandbox/list-filter-paginate",
        ALL,
        ("control.sandboxes.list", "control.sandboxes.pause"),
        checks.sandbox_list,
        fields=on("control.sandboxes.list", "query.limit", "query.nextToken", "query.metadata", "query.state"),
    ),
    _sandbox(
        "sandbox/timeout",
        ALL,
        ("control.sandboxes.set_timeout", "control.sandboxes.get", "envd.http.health"),
        checks.sandbox_timeout,
        fields=on("control.sandboxes.set_timeout", "body.timeout"),
    ),
    _sandbox(
        "sandbox/pause-memory-connect",
        ALL,
        (
            "control.sandboxes.pause",
            "control.sandboxes.list",
            "control.sandboxes.get",
            "control.sandboxes.connect",
            START,
            "envd.process.List",
            DOWNLOAD,
            "envd.http.health",
        ),
        checks.sandbox_pause_memory,
    ),
    _sandbox(
        "sandbox/pause-filesystem-connect",
        ALL,
        ("control.sandboxes.pause", "control.sandboxes.connect", UPLOAD, DOWNLOAD, START, "envd.process.List"),
        checks.sandbox_pause_filesystem,
        fields=on("control.sandboxes.pause", "body.memory"),
    ),
    _sandbox(
        "sandbox/snapshot-restore",
        ALL,
        (
            "control.snapshots.create",
            "control.snapshots.list",
            "control.templates.delete",
            UPLOAD,
            DOWNLOAD,
            "envd.http.health",
        ),
        checks.sandbox_snapshot,
    ),
    _sandbox("sandbox/metrics", ALL, ("control.sandboxes.metrics", START), checks.sandbox_metrics),
    _sandbox(
        "sandbox/kill-is-running",
        ALL,
        ("envd.http.health", "control.sandboxes.connect"),
        checks.sandbox_kill,
    ),
    _sandbox(
        "sandbox/other-owner",
        ALL,
        ("control.sandboxes.list", "control.sandboxes.connect", "envd.http.health"),
        checks.sandbox_other_owner,
        second_owner=True,
    ),
    _sandbox("sandbox/websocket", ("js",), (UPLOAD, START), checks.sandbox_websocket),
    _sandbox(
        "sandbox/parallel-creates",
        ALL,
        (UPLOAD, DOWNLOAD, START, "control.sandboxes.get"),
        checks.sandbox_parallel_creates,
        second_owner=True,
    ),
    _sandbox(
        "sandbox/network-settings",
        ALL,
        (UPLOAD, START, "control.sandboxes.get", "control.sandboxes.update_network"),
        checks.sandbox_network_settings,
        fields=(
            *on(CREATE, "body.allow_internet_access", *(f"body.network.{k}" for k in NETWORK)),
            *on("control.sandboxes.update_network", "body.allow_internet_access", "body.allowOut", "body.denyOut"),
        ),
    ),
    _sandbox(
        "sandbox/lifecycle-on-timeout",
        ALL,
        (
            UPLOAD,
            DOWNLOAD,
            START,
            "envd.process.List",
            "control.sandboxes.get",
            "control.sandboxes.connect",
            "control.sandboxes.pause",
        ),
        checks.sandbox_on_timeout,
        fields=(
            *on(CREATE, "body.timeout", "body.autoPause", "body.autoPauseMemory", "body.autoResume.enabled"),
            *on("control.sandboxes.connect", "body.timeout"),
        ),
    ),
    _sandbox(
        "sandbox/owners-every-operation",
        ALL,
        OWNED,
        checks.sandbox_owners_every_operation,
        second_owner=True,
        fields=tuple(f"{op}:header.X-API-Key" for op in (*LIFE, *OWNED)),
    ),
    _sandbox(
        "sandbox/users-and-tokens",
        ALL,
        (UPLOAD, DOWNLOAD, START, *FILESYSTEM, "envd.process.List"),
        checks.sandbox_users_and_tokens,
        fields=(
            *on(CREATE, "body.secure"),
            *on(UPLOAD, "query.username", "header.X-Access-Token"),
            *on(DOWNLOAD, "query.username", "header.X-Access-Token"),
            *on(START, "header.Authorization", "header.X-Access-Token"),
            *(f"{op}:header.Authorization" for op in FILESYSTEM),
            *(f"{op}:header.X-Access-Token" for op in FILESYSTEM),
            *on("envd.process.List", "header.X-Access-Token"),
        ),
    ),
    _interpreter("interpreter/run/basic", ALL, (), checks.interpreter_basic, fields=on(EXECUTE, "body.code")),
    _interpreter("interpreter/results/dataframe", ALL, (), checks.interpreter_dataframe),
    _interpreter("interpreter/results/matplotlib", ALL, (), checks.interpreter_matplotlib),
    _interpreter("interpreter/results/display", ALL, (), checks.interpreter_display),
    _interpreter("interpreter/errors/traceback", ALL, (), checks.interpreter_traceback),
    _interpreter("interpreter/execution-count", ALL, (), checks.interpreter_execution_count),
    _interpreter(
        "interpreter/contexts/lifecycle",
        ALL,
        CONTEXTS,
        checks.interpreter_contexts,
        fields=(*on("interpreter.contexts.create", "body.cwd", "body.language"), *on(EXECUTE, "body.context_id")),
    ),
    _interpreter(
        "interpreter/env-vars/per-run", ALL, (), checks.interpreter_env_vars, fields=on(EXECUTE, "body.env_vars")
    ),
    _interpreter("interpreter/interrupt/timeout-then-run", ALL, (), checks.interpreter_timeout),
    _interpreter(
        "interpreter/contexts/concurrent", ALL, ("interpreter.contexts.create",), checks.interpreter_concurrent
    ),
    _interpreter(
        "interpreter/languages/bash", ALL, (), checks.interpreter_languages, fields=on(EXECUTE, "body.language")
    ),
    # Its raw GET /health probes test the edge's traffic-token rule, not the route (the SDKs never
    # call it; wire/interpreter/health covers it), so interpreter.health is not claimed here.
    _interpreter(
        "interpreter/network/private-traffic",
        ALL,
        (),
        checks.interpreter_private_traffic,
        fields=on(EXECUTE, "header.E2B-Traffic-Access-Token"),
    ),
)


def cases(family: str | None = None) -> tuple[Case, ...]:
    return tuple(case for case in CASES if family is None or case.family == family)
