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
  owners) with real sandboxes, a secure sandbox's envd token and signed file URLs, and a burst
  of 32 parallel creates from two owners in which every sandbox proves its identity
  (``parallel-creates``); needs a control plane.
- ``interpreter``: the code interpreter (port 49999: ``/execute`` and ``/contexts``) through the
  official interpreter clients (``e2b_code_interpreter``, ``@e2b/code-interpreter``), on sandboxes
  of their default template ``code-interpreter-v1``: results and their MIME forms (DataFrame HTML,
  matplotlib PNG and chart, display calls), errors, execution counts, contexts, per-run
  environment variables and a secure sandbox's own in every context, interrupting an abandoned
  run, concurrent contexts, bash and the languages the template has no kernel for, and the
  traffic token on a private sandbox's port (code runs and every contexts call).
  Needs a control plane and that template.
- ``volume``: volumes through the clients' ``Volume`` API: create, list, get, connect and destroy,
  as one owner and another; the content API (files, folders, owners and modes, listings by depth,
  refusals, a 100 MiB file streamed both ways, concurrent writers, ``..`` stopping at the volume's
  root); one volume mounted into two sandboxes at once (by the client's object and by name), the
  owners a sandbox sees, in-use refusals while a sandbox runs or is paused, and the files a paused
  sandbox finds on resume. Needs a control plane and ``base``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from . import _checks as checks
from . import _checks_interpreter as interpreter_checks
from . import _checks_sandbox as sandbox_checks
from . import _checks_volume as volume_checks
from ._clients import version_order

__all__ = ["CASES", "FAMILY_TEMPLATES", "Case", "Check", "cases"]

Check = Callable[[dict[str, Any], str], None]
ALL = ("py-sync", "py-async", "js")

# Every scenario creates its sandbox and kills it in ``finally``.
LIFE = ("control.sandboxes.create", "control.sandboxes.kill")
START = "envd.process.Start"
# What the clients' Template builders call, all scoped to the key's owner.
TEMPLATE_OPERATIONS = (
    "control.templates.create",
    "control.templates.files_upload_link",
    "control.templates.build_start",
    "control.templates.build_status",
    "control.templates.alias_exists",
    "control.templates.delete",
    "control.tags.assign",
    "control.tags.list",
    "control.tags.remove",
)
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
# The process and watch RPCs sandbox/users-and-tokens sends to a secure sandbox with and without its
# token (each flavour's client sends its own watch calls: CreateWatcher and the rest, or WatchDir).
TOKEN_RPCS = (
    *(f"envd.process.{name}" for name in ("Connect", "SendInput", "SendSignal", "CloseStdin", "Update")),
    *(f"envd.filesystem.{name}" for name in ("WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher")),
)

# The template each family's scenarios create their sandboxes from (the clients' defaults).
FAMILY_TEMPLATES = {"envd": "base", "sandbox": "base", "interpreter": "code-interpreter-v1", "volume": "base"}

# Volumes: every scenario makes its own and destroys it in ``finally``.
VOLUME_LIFE = ("control.volumes.create", "control.volumes.destroy")
VOLUME_CONTROL = (*VOLUME_LIFE, "control.volumes.list", "control.volumes.get")
WRITE, READ, STAT = "volume.content.write_file", "volume.content.read_file", "volume.content.stat"
MAKE_DIR, LIST_DIR = "volume.content.make_dir", "volume.content.list_dir"
UPDATE, REMOVE = "volume.content.update_metadata", "volume.content.remove"
CONTENT = (WRITE, READ, STAT, MAKE_DIR, LIST_DIR, UPDATE, REMOVE)


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    scenario: str  # the name the scenario scripts know it by
    flavours: tuple[str, ...]
    operations: tuple[str, ...]
    check: Check
    second_owner: bool = False  # the scenario also acts as another owner (SECOND_API_KEY)
    # The scenario builds from the harness's private registry image (IMAGE_REF, IMAGE_USERNAME,
    # IMAGE_PASSWORD; ``conformance._registry``), offered to endpoints on the harness's host.
    registry: bool = False
    # Request fields (contract.load_fields ids) whose effect the check shows: not merely sent, but
    # observed through the client (a value read back, a behaviour that differs without it).
    fields: tuple[str, ...] = ()
    # The first e2b version (Python and npm alike) whose API the scenario calls: older clients have
    # no way to make its requests, so it does not run for them (their report has no result for it).
    since: str = ""

    def predates(self, version: str) -> bool:
        """Whether a client of ``version`` is older than the API this case calls (``since``)."""
        return bool(self.since) and version_order(version) < version_order(self.since)


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
    since: str = "",
) -> Case:
    return Case(f"envd/{scenario}", "envd", scenario, flavours, (*LIFE, *operations), check, fields=fields, since=since)


def _sandbox(
    scenario: str,
    flavours: tuple[str, ...],
    operations: tuple[str, ...],
    check: Check,
    *,
    second_owner: bool = False,
    registry: bool = False,
    fields: tuple[str, ...] = (),
    since: str = "",
) -> Case:
    area, _, what = scenario.partition("/")
    name = f"{area}/lifecycle/{what}"
    operations = (*LIFE, *operations)
    return Case(
        name,
        "sandbox",
        scenario,
        flavours,
        operations,
        check,
        second_owner,
        fields=fields,
        registry=registry,
        since=since,
    )


def _volume(
    name: str,
    scenario: str,
    operations: tuple[str, ...],
    check: Check,
    *,
    second_owner: bool = False,
    fields: tuple[str, ...] = (),
) -> Case:
    operations = tuple(dict.fromkeys((*VOLUME_LIFE, *operations)))
    return Case(name, "volume", scenario, ALL, operations, check, second_owner, fields=fields)


def _interpreter(
    scenario: str,
    flavours: tuple[str, ...],
    operations: tuple[str, ...],
    check: Check,
    *,
    fields: tuple[str, ...] = (),
) -> Case:
    return Case(scenario, "interpreter", scenario, flavours, (*LIFE, EXECUTE, *operations), check, fields=fields)


VOLUME_CASES: tuple[Case, ...] = (
    _volume(
        "volume/control/lifecycle",
        "volume/control",
        VOLUME_CONTROL,
        volume_checks.volume_lifecycle,
        second_owner=True,
        fields=on("control.volumes.create", "body.name"),
    ),
    _volume(
        "volume/control/refusals", "volume/control", VOLUME_CONTROL, volume_checks.volume_refusals, second_owner=True
    ),
    # Another owner's key sees none of the first owner's volumes: the key is what the operation acts as.
    _volume(
        "volume/control/owners",
        "volume/control",
        VOLUME_CONTROL,
        volume_checks.volume_owners,
        second_owner=True,
        fields=tuple(f"{op}:header.X-API-Key" for op in VOLUME_CONTROL),
    ),
    _volume(
        "volume/content/files",
        "volume/content",
        CONTENT,
        volume_checks.volume_files,
        fields=(
            *on(WRITE, "query.path", "query.uid", "query.gid", "query.mode"),
            *on(READ, "query.path"),
            *on(STAT, "query.path"),
            *on(MAKE_DIR, "query.path", "query.uid", "query.gid", "query.mode", "query.force"),
            *on(LIST_DIR, "query.path", "query.depth"),
            *on(UPDATE, "query.path", "body.uid", "body.gid", "body.mode"),
            *on(REMOVE, "query.path"),
        ),
    ),
    _volume("volume/content/refusals", "volume/content", CONTENT, volume_checks.volume_content_refusals),
    _volume(
        "volume/content/large-file",
        "volume/large-and-concurrent",
        (WRITE, READ, LIST_DIR),
        volume_checks.volume_large_file,
    ),
    _volume(
        "volume/content/concurrent-writes",
        "volume/large-and-concurrent",
        (WRITE, READ, LIST_DIR),
        volume_checks.volume_concurrent_writes,
    ),
    *(
        _volume(
            f"volume/mounts/{what}",
            "volume/mounts",
            (*LIFE, WRITE, READ, STAT, "control.sandboxes.get", "control.sandboxes.list", *extra),
            check,
            fields=fields,
        )
        for what, check, extra, fields in (
            (
                "shared",
                volume_checks.volume_mounts,
                (),
                on(CREATE, "body.volumeMounts[].name", "body.volumeMounts[].path"),
            ),
            ("ownership", volume_checks.volume_mount_owners, (), ()),
            ("in-use", volume_checks.volume_in_use, ("control.sandboxes.pause",), ()),
            (
                "pause-resume",
                volume_checks.volume_pause_resume,
                ("control.sandboxes.pause", "control.sandboxes.connect"),
                (),
            ),
        )
    ),
    *(
        _volume(
            f"volume/mounts/{what}",
            "volume/snapshots",
            (*LIFE, WRITE, "control.sandboxes.get", "control.sandboxes.pause", "control.sandboxes.connect", *extra),
            check,
        )
        for what, check, extra in (
            ("filesystem-pause", volume_checks.volume_filesystem_pause, ()),
            ("snapshot", volume_checks.volume_snapshot, ("control.snapshots.create", "control.templates.delete")),
        )
    ),
)


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
        "commands/stream-input",
        ("py-sync", "py-async"),
        (START, "envd.process.StreamInput", "envd.process.CloseStdin"),
        checks.envd_stream_input,
        since="2.58.0",
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
        "commands/timeout",
        ALL,
        (START, "envd.filesystem.Stat"),
        checks.envd_timeout,
        fields=on(START, "header.Connect-Timeout-Ms"),
    ),
    # The JS client enforces a stream's deadline itself as well, so only the Python clients show the agent's.
    _envd(
        "commands/connect-timeout",
        ("py-sync", "py-async"),
        (START, "envd.process.Connect", "envd.process.List", "envd.filesystem.Stat"),
        checks.envd_connect_timeout,
        fields=on("envd.process.Connect", "header.Connect-Timeout-Ms"),
    ),
    _envd("commands/user-and-env", ("py-sync",), (START,), checks.envd_user, fields=on(START, "header.Authorization")),
    _envd(
        "pty/session",
        ALL,
        (START, "envd.process.Update", "envd.process.SendInput"),
        checks.envd_pty,
        fields=(
            *on(START, "message.pty.size.cols", "message.pty.size.rows"),
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
    _envd(
        "files/size-classes",
        ALL,
        (UPLOAD, DOWNLOAD, "envd.filesystem.Stat", START),
        checks.envd_size_classes,
    ),
    _envd(
        "errors/messages",
        ALL,
        (DOWNLOAD, UPLOAD, START, "envd.process.Connect", *FILESYSTEM),
        checks.envd_error_messages,
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
        "files/symlink",
        ALL,
        (UPLOAD, "envd.process.Start", "envd.filesystem.ListDir", "envd.filesystem.Stat"),
        checks.envd_symlink,
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
            *on("envd.filesystem.RemoveWatcher", "message.watcher_id"),
        ),
    ),
    _envd(
        "watch/stream",
        ("py-async", "js"),
        (UPLOAD, "envd.filesystem.WatchDir"),
        checks.envd_watch,
        fields=on("envd.filesystem.WatchDir", "message.path", "message.recursive"),
    ),
    _envd(
        "watch/polling-options",
        ("py-sync",),
        (
            START,
            UPLOAD,
            "envd.filesystem.CreateWatcher",
            "envd.filesystem.GetWatcherEvents",
            "envd.filesystem.RemoveWatcher",
        ),
        checks.envd_watch_options,
        fields=on("envd.filesystem.CreateWatcher", "message.include_entry", "header.Authorization"),
    ),
    _envd(
        "watch/stream-options",
        ("py-async", "js"),
        (START, UPLOAD, "envd.filesystem.WatchDir"),
        checks.envd_watch_options,
        fields=on("envd.filesystem.WatchDir", "message.include_entry", "header.Authorization"),
    ),
    # py-async only: the JS client ends a watch at its deadline itself, whatever the agent does.
    _envd(
        "watch/stream-deadline",
        ("py-async",),
        (START, "envd.filesystem.WatchDir"),
        checks.envd_watch_deadline,
        fields=on("envd.filesystem.WatchDir", "header.Connect-Timeout-Ms"),
    ),
    _envd("concurrency/commands-and-files", ALL, (START, UPLOAD, DOWNLOAD), checks.envd_parallel_traffic),
    _sandbox(
        "sandbox/create-env-metadata",
        ALL,
        ("control.sandboxes.get", START),
        sandbox_checks.sandbox_create,
        fields=on(CREATE, "body.envVars", "body.metadata", "body.templateID", "body.timeout"),
    ),
    _sandbox("sandbox/get-host", ALL, (UPLOAD, START), sandbox_checks.sandbox_get_host),
    _sandbox(
        "sandbox/list-filter-paginate",
        ALL,
        ("control.sandboxes.list", "control.sandboxes.pause"),
        sandbox_checks.sandbox_list,
        fields=on("control.sandboxes.list", "query.limit", "query.nextToken", "query.metadata", "query.state"),
    ),
    _sandbox(
        "sandbox/list-order",
        ALL,
        ("control.sandboxes.list", "control.sandboxes.get"),
        sandbox_checks.sandbox_list_order,
        since="2.45.0",
    ),
    _sandbox("sandbox/sudo", ALL, ("envd.process.Start",), sandbox_checks.sandbox_sudo),
    _sandbox(
        "sandbox/fork",
        ALL,
        ("control.sandboxes.list", "control.sandboxes.get", "envd.process.Start"),
        sandbox_checks.sandbox_fork,
        since="2.35.0",  # Python from 2.34, npm from 2.35
    ),
    _sandbox(
        "sandbox/mcp",
        ALL,
        (*VOLUME_LIFE, "control.sandboxes.connect", "envd.process.Start", UPLOAD),
        sandbox_checks.sandbox_mcp,
        fields=on("control.sandboxes.create", "body.mcp"),
    ),
    _sandbox(
        "sandbox/idempotent-create",
        ("py-sync", "py-async"),
        ("control.sandboxes.list",),
        sandbox_checks.sandbox_idempotent_create,
        since="2.61.0",
    ),
    _sandbox(
        "sandbox/timeout",
        ALL,
        ("control.sandboxes.set_timeout", "control.sandboxes.get", "envd.http.health"),
        sandbox_checks.sandbox_timeout,
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
        sandbox_checks.sandbox_pause_memory,
    ),
    _sandbox(
        "sandbox/pause-filesystem-connect",
        ALL,
        ("control.sandboxes.pause", "control.sandboxes.connect", UPLOAD, DOWNLOAD, START, "envd.process.List"),
        sandbox_checks.sandbox_pause_filesystem,
        fields=on("control.sandboxes.pause", "body.memory"),
    ),
    _sandbox(
        "sandbox/connect-reboot",
        ALL,
        ("control.sandboxes.pause", "control.sandboxes.connect", UPLOAD, DOWNLOAD, START, "envd.process.List"),
        sandbox_checks.sandbox_connect_reboot,
        since="2.49.0",  # on_resume / onResume: Python from 2.48, npm from 2.49.0
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
        sandbox_checks.sandbox_snapshot,
        fields=(
            *on("control.snapshots.create", "body.name"),
            *on("control.snapshots.list", "query.limit", "query.nextToken", "query.sandboxID"),
        ),
    ),
    _sandbox(
        "sandbox/template-build",
        ALL,
        (*TEMPLATE_OPERATIONS, START),
        sandbox_checks.sandbox_template_build,
        second_owner=True,
        fields=(
            *on("control.templates.create", "body.name", "body.tags", "body.cpuCount", "body.memoryMB"),
            *(f"{op}:header.X-API-Key" for op in TEMPLATE_OPERATIONS),
            *on(
                "control.templates.build_start",
                "body.fromImage",
                "body.fromTemplate",
                "body.force",
                "body.startCmd",
                "body.readyCmd",
                "body.steps[].type",
                "body.steps[].args",
                "body.steps[].filesHash",
                "body.steps[].force",
            ),
            *on("control.templates.build_status", "query.logsOffset"),
            *on("control.tags.assign", "body.target", "body.tags"),
            *on("control.tags.remove", "body.name", "body.tags"),
        ),
    ),
    _sandbox(
        "sandbox/template-image",
        ALL,
        ("control.templates.create", "control.templates.build_start", "control.templates.build_status", START),
        sandbox_checks.sandbox_template_image,
        registry=True,
        fields=on(
            "control.templates.build_start",
            "body.fromImageRegistry.type",
            "body.fromImageRegistry.username",
            "body.fromImageRegistry.password",
        ),
    ),
    _sandbox(
        "sandbox/metrics",
        ALL,
        ("control.sandboxes.metrics", "control.sandboxes.get", START),
        sandbox_checks.sandbox_metrics,
        fields=on("control.sandboxes.metrics", "query.start", "query.end"),
    ),
    _sandbox(
        "sandbox/kill-is-running",
        ALL,
        ("envd.http.health", "control.sandboxes.connect"),
        sandbox_checks.sandbox_kill,
    ),
    _sandbox(
        "sandbox/other-owner",
        ALL,
        ("control.sandboxes.list", "control.sandboxes.connect", "envd.http.health"),
        sandbox_checks.sandbox_other_owner,
        second_owner=True,
    ),
    _sandbox("sandbox/websocket", ("js",), (UPLOAD, START), sandbox_checks.sandbox_websocket),
    _sandbox(
        "sandbox/parallel-creates",
        ALL,
        (UPLOAD, DOWNLOAD, START, "control.sandboxes.get"),
        sandbox_checks.sandbox_parallel_creates,
        second_owner=True,
    ),
    _sandbox(
        "sandbox/network-settings",
        ALL,
        (UPLOAD, START, "control.sandboxes.get", "control.sandboxes.update_network"),
        sandbox_checks.sandbox_network_settings,
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
        sandbox_checks.sandbox_on_timeout,
        fields=(
            *on(CREATE, "body.timeout", "body.autoPause", "body.autoPauseMemory", "body.autoResume.enabled"),
            *on("control.sandboxes.connect", "body.timeout"),
        ),
    ),
    _sandbox(
        "sandbox/owners-every-operation",
        ALL,
        OWNED,
        sandbox_checks.sandbox_owners_every_operation,
        second_owner=True,
        fields=tuple(f"{op}:header.X-API-Key" for op in (*LIFE, *OWNED)),
    ),
    _sandbox(
        "sandbox/users-and-tokens",
        ALL,
        (UPLOAD, DOWNLOAD, START, *FILESYSTEM, "envd.process.List", *TOKEN_RPCS),
        sandbox_checks.sandbox_users_and_tokens,
        fields=(
            *on(CREATE, "body.secure"),
            *on(UPLOAD, "query.username", "header.X-Access-Token"),
            *on(DOWNLOAD, "query.username", "header.X-Access-Token"),
            *on(START, "header.Authorization", "header.X-Access-Token"),
            *(f"{op}:header.Authorization" for op in FILESYSTEM),
            *(f"{op}:header.X-Access-Token" for op in FILESYSTEM),
            *on("envd.process.List", "header.X-Access-Token"),
            *(f"{op}:header.X-Access-Token" for op in TOKEN_RPCS),
        ),
    ),
    _sandbox(
        "sandbox/signed-urls",
        ALL,
        (UPLOAD, DOWNLOAD, "envd.filesystem.Stat"),
        sandbox_checks.sandbox_signed_urls,
        fields=(
            *on(UPLOAD, "query.signature", "query.signature_expiration"),
            *on(DOWNLOAD, "query.signature", "query.signature_expiration"),
        ),
    ),
    _interpreter(
        "interpreter/run/basic", ALL, (), interpreter_checks.interpreter_basic, fields=on(EXECUTE, "body.code")
    ),
    _interpreter("interpreter/results/dataframe", ALL, (), interpreter_checks.interpreter_dataframe),
    _interpreter("interpreter/results/matplotlib", ALL, (), interpreter_checks.interpreter_matplotlib),
    _interpreter("interpreter/results/display", ALL, (), interpreter_checks.interpreter_display),
    _interpreter("interpreter/results/charts", ALL, (), interpreter_checks.interpreter_charts),
    _interpreter("interpreter/results/rich", ALL, (), interpreter_checks.interpreter_rich),
    _interpreter("interpreter/errors/traceback", ALL, (), interpreter_checks.interpreter_traceback),
    _interpreter("interpreter/execution-count", ALL, (), interpreter_checks.interpreter_execution_count),
    _interpreter(
        "interpreter/contexts/lifecycle",
        ALL,
        CONTEXTS,
        interpreter_checks.interpreter_contexts,
        fields=(*on("interpreter.contexts.create", "body.cwd", "body.language"), *on(EXECUTE, "body.context_id")),
    ),
    _interpreter(
        "interpreter/env-vars/per-run",
        ALL,
        (),
        interpreter_checks.interpreter_env_vars,
        fields=on(EXECUTE, "body.env_vars"),
    ),
    # A secure sandbox's envs reach the default context, a new one, a restarted one and bash's: the
    # interpreter reads them from envd /envs with the X-Access-Token of the run it serves. The
    # contexts calls' own tokens have no effect (their routes never ask envd).
    _interpreter(
        "interpreter/env-vars/sandbox-global",
        ALL,
        ("interpreter.contexts.create", "interpreter.contexts.restart"),
        interpreter_checks.interpreter_sandbox_global,
        fields=on(EXECUTE, "header.X-Access-Token"),
    ),
    _interpreter("interpreter/interrupt/timeout-then-run", ALL, (), interpreter_checks.interpreter_timeout),
    _interpreter(
        "interpreter/contexts/concurrent",
        ALL,
        ("interpreter.contexts.create",),
        interpreter_checks.interpreter_concurrent,
    ),
    *(
        _interpreter(
            f"interpreter/languages/{language}",
            ALL,
            ("interpreter.contexts.create", "interpreter.contexts.list", "interpreter.contexts.remove"),
            partial(interpreter_checks.interpreter_language, language=language),
            fields=(
                *on(EXECUTE, "body.language", "body.env_vars"),
                *on("interpreter.contexts.create", "body.language"),
            ),
        )
        for language in interpreter_checks.LANGUAGE_ANSWERS
    ),
    _interpreter(
        "interpreter/languages/unknown",
        ALL,
        (),
        interpreter_checks.interpreter_unknown_language,
        fields=on(EXECUTE, "body.language"),
    ),
    # Its raw GET /health probes test the edge's traffic-token rule, not the route (the SDKs never
    # call it; wire/interpreter/health covers it), so interpreter.health is not claimed here.
    _interpreter(
        "interpreter/network/private-traffic",
        ALL,
        CONTEXTS,
        interpreter_checks.interpreter_private_traffic,
        fields=tuple(f"{op}:header.E2B-Traffic-Access-Token" for op in (EXECUTE, *CONTEXTS)),
    ),
    *VOLUME_CASES,
)


def cases(family: str | None = None) -> tuple[Case, ...]:
    return tuple(case for case in CASES if family is None or case.family == family)
