"""The curated mutants: behavioural changes planted in the reference server and the agent.

Each row is one mutation of one file, written as data (``Mutant``): a hierarchical id
(``<part>/<area>/<what>``), the file, an ``old`` snippet that must occur exactly once there (the
runner refuses a mutant whose snippet is missing or ambiguous, so the list cannot rot silently),
the ``new`` snippet, one line saying which behaviour changes, and the cases to run against it.

A case selector is a case name (scenario or wire case), optionally ``@flavour[,flavour]`` or
``@*``; without one, a scenario case runs with ``py-sync`` (or its only flavour). Only cases that
pass on the unmutated tree count. The cases are the cheapest ones expected to notice the change
(one or two client runs): the point is to measure the harness, not to run all of it per mutant.

Ids start with the part that runs the mutated code: ``server`` (the reference server's process),
``agent`` (envd inside the sandbox), ``runtime`` (the crun backend, in the server's process) and
``interpreter`` (the code interpreter inside ``code-interpreter-v1`` sandboxes).
"""

from __future__ import annotations

from ._mutants import Mutant

__all__ = ["MUTANTS"]

CONTROL = "reference_server/_control_plane/sandboxes.py"
SERVICE = "reference_server/_sandboxes.py"
VIEWS = "reference_server/_views.py"
ERRORS = "reference_server/_errors.py"
PROCESSES = "runtime/agent/_processes.py"
PROCESS_RPC = "runtime/agent/_process_service.py"
FILESYSTEM = "runtime/agent/_filesystem.py"

CREATE = "sandbox/lifecycle/create-env-metadata"
LISTING = "sandbox/lifecycle/list-filter-paginate"
PAUSE_MEMORY = "sandbox/lifecycle/pause-memory-connect"
FOREGROUND = "envd/commands/foreground"
LIST_STAT = "envd/files/list-stat-exists"
MKDIR = "envd/files/make-dir-rename-remove"
KILL = "envd/commands/kill"
TEMPLATE_BUILD = "sandbox/lifecycle/template-build"
TEMPLATE_IMAGE = "sandbox/lifecycle/template-image"

MUTANTS: tuple[Mutant, ...] = (
    # --- the control plane: status codes, bodies, defaults, lists ---------------------------------
    Mutant(
        "server/create/status-200",
        CONTROL,
        "    return JSONResponse(views.sandbox(opened, caller.domain), status_code=201)\n\n\nasync def connect_v1(",
        "    return JSONResponse(views.sandbox(opened, caller.domain), status_code=200)\n\n\nasync def connect_v1(",
        "POST /sandboxes answers 200 instead of 201",
        ("wire/control/create-status", CREATE),
    ),
    Mutant(
        "server/connect/resumed-status-200",
        CONTROL,
        "status_code=201 if resumed else 200",
        "status_code=200",
        "connect answers 200 also when it resumed a paused sandbox (the contract says 201)",
        ("wire/control/connect-statuses", f"{PAUSE_MEMORY}@py-sync,js"),
    ),
    Mutant(
        "server/get/not-found-400",
        SERVICE,
        'raise ApiError(404, f"{text.SANDBOX_NOT_FOUND}: {sandbox_id}")',
        'raise ApiError(400, f"{text.SANDBOX_NOT_FOUND}: {sandbox_id}")',
        "a missing or foreign sandbox is answered 400 instead of 404",
        ("wire/control/error-shape", "sandbox/lifecycle/kill-is-running"),
    ),
    Mutant(
        "server/kill/missing-is-204",
        SERVICE,
        "            except ApiError:\n                raise ApiError(404, text.SANDBOX_NOT_FOUND) from None",
        "            except ApiError:\n                return",
        "DELETE of a sandbox that does not exist answers 204 instead of 404",
        ("sandbox/lifecycle/kill-is-running",),
    ),
    Mutant(
        "server/pause/already-paused-204",
        SERVICE,
        "            if record.state == S.PAUSED:\n                raise ApiError(409, text.ALREADY_PAUSED)",
        "            if record.state == S.PAUSED:\n                return",
        "pausing a paused sandbox answers 204 instead of 409",
        ("wire/control/pause-twice", f"{PAUSE_MEMORY}@js"),
    ),
    Mutant(
        "server/errors/body-code-dropped",
        ERRORS,
        'return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)',
        'return JSONResponse({"message": message}, status_code=status, headers=headers)',
        "error bodies lose their integer `code` (the JS client tells 404 and 409 apart by it)",
        ("wire/control/error-shape", f"{PAUSE_MEMORY}@js"),
    ),
    Mutant(
        "server/list/reversed-order",
        CONTROL,
        "    return JSONResponse([views.listed(record) for record in page.records], headers=headers)",
        "    return JSONResponse([views.listed(record) for record in reversed(page.records)], headers=headers)",
        "GET /v2/sandboxes returns each page in reverse order",
        (LISTING,),
    ),
    Mutant(
        "server/list/metadata-filter-ignored",
        CONTROL,
        '    check_query(request, ("metadata", "state", "limit", "nextToken", "order", "startedAfter", "template"))\n'
        '    metadata = metadata_filter(single(request.query_params.getlist("metadata"), "metadata"))',
        '    check_query(request, ("metadata", "state", "limit", "nextToken", "order", "startedAfter", "template"))\n'
        "    metadata: dict[str, str] = {}",
        "GET /v2/sandboxes ignores the metadata filter",
        (LISTING,),
    ),
    Mutant(
        "server/list/limit-ignored",
        CONTROL,
        'limit = integer_query(request, "limit", default=MAX_PAGE, low=1, high=MAX_PAGE) or MAX_PAGE',
        "limit = MAX_PAGE",
        "GET /v2/sandboxes ignores `limit` (every page holds up to 100)",
        (LISTING,),
    ),
    Mutant(
        "server/list/next-token-dropped",
        CONTROL,
        "headers = {NEXT_TOKEN_HEADER: page.next_token} if page.next_token else {}",
        "headers: dict[str, str] = {}",
        "GET /v2/sandboxes never sends the x-next-token header",
        (f"{LISTING}@js",),
    ),
    Mutant(
        "server/list/state-filter-ignored",
        SERVICE,
        'wanted = set(states or ("running", "paused"))',
        'wanted = {"running", "paused"}',
        "GET /v2/sandboxes ignores the state filter",
        (LISTING,),
    ),
    Mutant(
        "server/detail/metadata-dropped",
        VIEWS,
        '"metadata": record.metadata,',
        '"metadata": {},',
        "sandbox details and lists answer empty metadata",
        (CREATE,),
    ),
    Mutant(
        "server/detail/state-always-running",
        VIEWS,
        '"state": api_state(record.state),',
        '"state": "running",',
        "sandbox details and lists always say `running`, paused ones too",
        (PAUSE_MEMORY,),
    ),
    Mutant(
        "server/create/env-vars-not-sent",
        SERVICE,
        '"envVars": record.env_vars,',
        '"envVars": {},',
        "the create request's envVars never reach the agent's /init",
        (CREATE,),
    ),
    Mutant(
        "server/create/default-user-root",
        SERVICE,
        'default_user: str = "user"',
        'default_user: str = "root"',
        "sandboxes get `root` instead of `user` as the default user",
        (CREATE, "envd/files/text-bytes-stream"),
    ),
    Mutant(
        "server/create/secure-ignored",
        CONTROL,
        'secure=bool_field(body, "secure", default_secure),',
        "secure=False,",
        "`secure: true` is ignored: no envd access token, the agent open to anyone",
        ("wire/control/create-status", FOREGROUND),
    ),
    Mutant(
        "server/create/timeout-ignored",
        CONTROL,
        'timeout_s=_integer(body, "timeout", default_timeout),',
        "timeout_s=default_timeout,",
        "the create request's timeout is ignored (v1: 15 s, v2: 300 s)",
        (CREATE, f"{PAUSE_MEMORY}@js"),
    ),
    Mutant(
        "server/timeout/set-timeout-ignored",
        SERVICE,
        "                expires_at=self.now() + timedelta(seconds=timeout_s),\n"
        "                details=record.with_details(timeout_s=timeout_s),",
        "                details=record.with_details(timeout_s=timeout_s),",
        "POST /sandboxes/{id}/timeout answers 204 but leaves the expiry as it was",
        ("sandbox/lifecycle/timeout",),
    ),
    Mutant(
        "server/pause/memory-flag-ignored",
        CONTROL,
        'memory = bool_field(body, "memory", Defaults.PAUSE_MEMORY)',
        "memory = Defaults.PAUSE_MEMORY",
        "pause ignores `memory: false`: a filesystem-only pause keeps the processes",
        ("sandbox/lifecycle/pause-filesystem-connect",),
    ),
    Mutant(
        "server/owner/check-dropped",
        SERVICE,
        "if record is None or record.owner != owner or record.state in GONE:",
        "if record is None or record.state in GONE:",
        "any API key may get, connect to and kill any owner's sandbox",
        ("sandbox/lifecycle/other-owner",),
    ),
    Mutant(
        "server/snapshot/in-use-400",
        ERRORS,
        '("delete_template", TransitionError): (409, SNAPSHOT_IN_USE),',
        '("delete_template", TransitionError): (400, SNAPSHOT_IN_USE),',
        "deleting a snapshot that a sandbox runs from answers 400 instead of 409",
        ("sandbox/lifecycle/snapshot-restore",),
    ),
    Mutant(
        "server/metrics/cpu-count-wrong",
        VIEWS,
        '"cpuCount": sample.cpu_count,',
        '"cpuCount": 1,',
        "sandbox metrics report one vCPU whatever the sandbox has",
        ("sandbox/lifecycle/metrics",),
    ),
    Mutant(
        "server/metrics/window-ignored",
        CONTROL,
        'metric_series(caller.owner, request.path_params["sandbox_id"], start, end)',
        'metric_series(caller.owner, request.path_params["sandbox_id"], None, None)',
        "GET /sandboxes/{id}/metrics ignores start and end: every sample, whatever the window",
        ("sandbox/lifecycle/metrics",),
    ),
    Mutant(
        "server/snapshots/sandbox-filter-ignored",
        "reference_server/_control_plane/snapshots.py",
        "sandbox_id=sandbox_id, limit=limit, after=after",
        "sandbox_id=None, limit=limit, after=after",
        "GET /snapshots ignores sandboxID: every snapshot of the owner is listed",
        ("sandbox/lifecycle/snapshot-restore",),
    ),
    Mutant(
        "server/snapshots/name-ignored",
        SERVICE,
        "names=(name or snapshot_id,),",
        "names=(snapshot_id,),",
        "a snapshot's requested name is dropped: its names are only its id",
        ("sandbox/lifecycle/snapshot-restore",),
    ),
    Mutant(
        "server/edge/traffic-token-unchecked",
        "reference_server/_edge.py",
        "if target.traffic_token is not None and where.port != ENVD_PORT:",
        "if False:",
        "user ports of sandboxes without public traffic are reachable without the traffic token",
        ("interpreter/network/private-traffic",),
    ),
    Mutant(
        "server/proxy/content-type-dropped",
        "reference_server/_proxy.py",
        '_HOP_BY_HOP = frozenset({b"connection",',
        '_HOP_BY_HOP = frozenset({b"content-type", b"connection",',
        "the sandbox proxy drops the content-type header of every request and answer",
        (FOREGROUND,),
    ),
    # --- the agent: processes ------------------------------------------------------------------------
    Mutant(
        "agent/process/exit-code-off-by-one",
        PROCESSES,
        'return Exit(returncode, True, f"exit status {returncode}")',
        'return Exit(returncode + 1, True, f"exit status {returncode}")',
        "commands report their exit code plus one",
        ("envd/commands/exit-code",),
    ),
    Mutant(
        "agent/process/end-event-dropped",
        PROCESS_RPC,
        "            yield _event_message(event)\n            if isinstance(event, Exit):\n                return",
        "            if isinstance(event, Exit):\n                return\n            yield _event_message(event)",
        "process streams end without their `end` event",
        (FOREGROUND, "wire/envd/process-stream"),
    ),
    Mutant(
        "agent/process/stdout-dropped",
        PROCESSES,
        "        while chunk := await stream.read(STDOUT_CHUNK):\n"
        "            await managed.publish(Output(name, chunk))",
        "        while chunk := await stream.read(STDOUT_CHUNK):\n"
        '            if name == "stderr":\n'
        "                await managed.publish(Output(name, chunk))",
        "stdout data events are never sent (stderr still is)",
        (FOREGROUND,),
    ),
    Mutant(
        "agent/process/request-env-dropped",
        PROCESSES,
        "    env.update(global_env)\n    env.update(request_env)\n",
        "    env.update(global_env)\n",
        "a command's own envs are not passed to it",
        (FOREGROUND,),
    ),
    Mutant(
        "agent/process/cwd-ignored",
        PROCESS_RPC,
        "            cwd=cwd,\n",
        "            cwd=user.home,\n",
        "commands run in the user's home whatever cwd they ask for",
        (FOREGROUND, "envd/concurrency/commands-and-files"),
    ),
    Mutant(
        "agent/process/signal-ignored",
        PROCESSES,
        "        try:\n            os.kill(self.pid, sig)\n        except ProcessLookupError as exc:",
        "        try:\n            pass\n        except ProcessLookupError as exc:",
        "SendSignal answers success but sends no signal",
        (KILL,),
    ),
    Mutant(
        "agent/process/sigkill-sent-as-sigterm",
        PROCESS_RPC,
        "_SIGNALS = {pb.SIGNAL_SIGTERM: signal.SIGTERM, pb.SIGNAL_SIGKILL: signal.SIGKILL}",
        "_SIGNALS = {pb.SIGNAL_SIGTERM: signal.SIGTERM, pb.SIGNAL_SIGKILL: signal.SIGTERM}",
        "SIGKILL requests send SIGTERM (the end says `signal: terminated`)",
        (KILL,),
    ),
    Mutant(
        "agent/process/deadline-not-enforced",
        PROCESSES,
        "            managed.stop_waiting_for_output.set()\n"
        "            with contextlib.suppress(ProcessLookupError):\n"
        "                os.kill(managed.pid, signal.SIGKILL)",
        "            managed.stop_waiting_for_output.set()",
        "a command's deadline ends its stream but leaves the process running",
        ("envd/commands/timeout",),
    ),
    Mutant(
        "agent/process/list-empty",
        PROCESS_RPC,
        "for managed in self._table.list():",
        "for managed in []:",
        "process.List answers no processes",
        ("envd/commands/background-connect",),
    ),
    Mutant(
        "agent/pty/initial-size-ignored",
        PROCESSES,
        "            _set_winsize(master_fd, *spec.pty_size)\n",
        "",
        "a PTY starts with the kernel's default size instead of the one asked for",
        ("envd/pty/session",),
    ),
    Mutant(
        "agent/pty/resize-ignored",
        PROCESS_RPC,
        '        if request.HasField("pty"):\n            managed.resize(request.pty.size.cols, request.pty.size.rows)',
        '        if request.HasField("pty"):\n            pass',
        "process.Update (PTY resize) answers success but changes nothing",
        ("envd/pty/session",),
    ),
    # --- the agent: /init and environment --------------------------------------------------------------
    Mutant(
        "agent/init/default-user-ignored",
        "runtime/agent/_http.py",
        '        if data.get("defaultUser"):\n            state.default_user = data["defaultUser"]',
        '        if data.get("defaultUser"):\n            pass',
        "/init's defaultUser is ignored: requests that name no user run as root",
        (CREATE,),
    ),
    Mutant(
        "agent/init/token-not-kept",
        "runtime/agent/_http.py",
        "        state.access_token = presented\n",
        "        state.access_token = None\n",
        "/init's access token is not kept: the agent answers requests without any token",
        ("wire/envd/http-routes",),
    ),
    Mutant(
        "agent/env/internal-vars-dropped",
        "runtime/agent/_state.py",
        "return {**self.env_vars, **self.internal}",
        "return dict(self.env_vars)",
        "processes no longer get E2B_SANDBOX, E2B_SANDBOX_ID and E2B_TEMPLATE_ID",
        ("envd/commands/user-and-env",),
    ),
    # --- the agent: files and the filesystem ------------------------------------------------------------
    Mutant(
        "agent/files/mode-0600",
        "runtime/agent/_files.py",
        "fd = os.open(path, flags, 0o666)",
        "fd = os.open(path, flags, 0o600)",
        "uploaded files are created 0600 instead of 0666 less the umask (0644)",
        (LIST_STAT,),
    ),
    Mutant(
        "agent/files/metadata-not-cleared",
        "runtime/agent/_files.py",
        "                for name in os.listxattr(self.path):\n"
        "                    if name.startswith(METADATA_PREFIX):\n"
        "                        os.removexattr(self.path, name)\n",
        "",
        "an upload keeps the metadata of the file it replaces",
        ("envd/files/metadata",),
    ),
    Mutant(
        "agent/files/relative-from-root",
        "runtime/agent/_paths.py",
        "    return posixpath.normpath(posixpath.join(user.home, path))",
        '    return posixpath.normpath(posixpath.join("/", path))',
        "relative paths resolve against / instead of the user's home",
        ("envd/files/text-bytes-stream",),
    ),
    Mutant(
        "agent/files/signature-expiry-unchecked",
        "runtime/agent/_files.py",
        "if expiration is not None and expiration < int(time.time()):",
        "if expiration is not None and expiration < 0:",
        "an expired signed /files URL is still served",
        ("sandbox/lifecycle/signed-urls",),
    ),
    Mutant(
        "agent/auth/streams-unchecked",
        "runtime/agent/_app.py",
        "if (method, path) not in _EXEMPT and not self._state.token_matches(",
        'if (method, path) not in _EXEMPT and not headers.get("content-type", "").startswith("application/connect+") '
        "and not self._state.token_matches(",
        "the token gate lets streaming RPCs (process Connect, WatchDir) through without the token",
        ("sandbox/lifecycle/users-and-tokens",),
    ),
    Mutant(
        "agent/fs/list-depth-ignored",
        FILESYSTEM,
        "depth = max(depth, 1)",
        "depth = 1",
        "ListDir ignores depth: only the first level is listed",
        (LIST_STAT,),
    ),
    Mutant(
        "agent/fs/list-reversed",
        FILESYSTEM,
        "return iter(sorted(os.listdir(real_dir), key=os.fsencode))",
        "return iter(sorted(os.listdir(real_dir), key=os.fsencode, reverse=True))",
        "ListDir lists each folder in reverse name order",
        (LIST_STAT,),
    ),
    Mutant(
        "agent/fs/make-dir-exists-ok",
        FILESYSTEM,
        '            raise FsError(ErrorKind.ALREADY_EXISTS, f"directory already exists: {path}")\n'
        '        raise FsError(ErrorKind.INVALID_ARGUMENT, f"path already exists but it is not a directory',
        "            return entry_info(path, users)\n"
        '        raise FsError(ErrorKind.INVALID_ARGUMENT, f"path already exists but it is not a directory',
        "MakeDir of an existing folder succeeds instead of answering already_exists",
        (MKDIR,),
    ),
    Mutant(
        "agent/fs/remove-missing-not-found",
        FILESYSTEM,
        "        info = os.lstat(path)\n    except FileNotFoundError:\n        return\n",
        "        info = os.lstat(path)\n    except FileNotFoundError:\n"
        '        raise FsError(ErrorKind.NOT_FOUND, f"file not found: {path}") from None\n',
        "Remove of a missing path answers not_found instead of succeeding (rm -rf)",
        (MKDIR,),
    ),
    Mutant(
        "agent/watch/remove-event-dropped",
        "runtime/agent/_inotify.py",
        "(EventKind.REMOVE, IN_DELETE | IN_DELETE_SELF),",
        "(EventKind.REMOVE, 0),",
        "directory watches never report removals",
        ("envd/watch/polling", "envd/watch/stream@py-async"),
    ),
    Mutant(
        "agent/watch/rename-as-create",
        "runtime/agent/_filesystem_service.py",
        "EventKind.RENAME: pb.EVENT_TYPE_RENAME,",
        "EventKind.RENAME: pb.EVENT_TYPE_CREATE,",
        "watch events report a rename as a create",
        ("envd/watch/stream@js",),
    ),
    Mutant(
        "agent/watch/remove-watcher-kept",
        "runtime/agent/_filesystem_service.py",
        "        del self._watchers[request.watcher_id]\n",
        "",
        "RemoveWatcher stops the watcher but keeps its id: GetWatcherEvents on it still answers",
        ("envd/watch/polling",),
    ),
    Mutant(
        "agent/watch/entry-ignored",
        "runtime/agent/_filesystem_service.py",
        "if include_entry and event.kind in _WITH_ENTRY:",
        "if include_entry and event.kind in ():",
        "watch events never carry the entry, even when include_entry asks for it",
        ("envd/watch/polling-options", "envd/watch/stream-options@js"),
    ),
    Mutant(
        "agent/fs/user-ignored",
        "runtime/agent/_filesystem_service.py",
        'return self._state.user_from_basic(ctx.request_headers().get("authorization"))',
        "return self._state.user_from_basic(None)",
        "filesystem RPCs ignore Authorization: every call acts as the default user",
        ("envd/watch/polling-options",),
    ),
    Mutant(
        "agent/watch/deadline-ignored",
        "runtime/agent/_filesystem_service.py",
        "        remaining = ctx.timeout_ms()\n        deadline = None if remaining is None else loop.time()",
        "        remaining = None\n        deadline = None if remaining is None else loop.time()",
        "WatchDir ignores Connect-Timeout-Ms: the watch outlives its deadline",
        ("envd/watch/stream-deadline",),
    ),
    Mutant(
        "agent/process/stream-deadline-ignored",
        PROCESS_RPC,
        "    remaining = ctx.timeout_ms()\n    loop = asyncio.get_running_loop()",
        "    remaining = None\n    loop = asyncio.get_running_loop()",
        "process streams (Start, Connect) ignore Connect-Timeout-Ms: a Connect outlives its deadline",
        ("envd/commands/connect-timeout",),
    ),
    # --- the runtime and the code interpreter ---------------------------------------------------------
    Mutant(
        "runtime/pause/memory-not-kept",
        "runtime/_oci_backend.py",
        "                if memory and self._checkpoint_config is not None:\n"
        "                    await self._checkpoint(record, self._checkpoint_config)\n"
        "                elif memory:\n",
        "                if False:\n"
        "                    await self._checkpoint(record, self._checkpoint_config)\n"
        "                elif False:\n",
        "a memory pause stops the container instead of checkpointing or freezing it (processes and memory are lost)",
        (PAUSE_MEMORY,),
    ),
    Mutant(
        "interpreter/results/main-result-flag",
        "runtime/interpreter/_messages.py",
        '{"execute_result": True, "display_data": False}',
        '{"execute_result": False, "display_data": False}',
        "the cell's own value is no longer marked is_main_result",
        ("interpreter/run/basic",),
    ),
    Mutant(
        "interpreter/languages/refusal-unnamed",
        "runtime/interpreter/_languages.py",
        'f"Failed to create context: the {language!r} language is not supported by this template"',
        '"Failed to create context: the language is not supported by this template"',
        "the refusal of a language with no kernel no longer names the language",
        ("interpreter/languages/bash",),
    ),
    Mutant(
        "interpreter/envs/token-not-forwarded",
        "runtime/interpreter/_contexts.py",
        "headers = {ACCESS_TOKEN_HEADER: access_token} if access_token else {}",
        "headers: dict[str, str] = {}",
        "the interpreter asks envd /envs without the run's X-Access-Token (a secure sandbox's envs are lost)",
        ("interpreter/env-vars/sandbox-global",),
    ),
    # --- payload sizes and the texts of errors ---------------------------------------------------
    Mutant(
        "agent/files/download-loses-a-chunk",
        "runtime/agent/_files.py",
        "        while chunk:\n            yield chunk\n",
        "        skipped = False\n        while chunk:\n"
        "            if skipped or len(chunk) < READ_CHUNK:\n"
        "                yield chunk\n"
        "            skipped = True\n",
        "a download leaves out its first full chunk (a file larger than one chunk comes back short)",
        ("envd/files/size-classes",),
    ),
    Mutant(
        "agent/process/missing-cwd-text",
        PROCESS_RPC,
        "f\"cwd '{cwd}' does not exist\"",
        'f"no such directory: {cwd}"',
        "a command in a missing cwd is refused with another text than the documented one",
        ("envd/errors/messages",),
    ),
    Mutant(
        "agent/fs/make-dir-below-a-file-unknown",
        FILESYSTEM,
        "    except (FileNotFoundError, NotADirectoryError):  # a file on the way: ensure_parents names it\n",
        "    except FileNotFoundError:\n",
        "make_dir below a file answers code unknown with the implementation's errno text",
        ("envd/errors/messages",),
    ),
    Mutant(
        "server/templates/env-not-applied",
        SERVICE,
        "env_vars = {**(built.config.env if built else {}), **request.env_vars}",
        "env_vars = dict(request.env_vars)",
        "a sandbox of a built template lacks the environment its set_envs step gave it",
        (TEMPLATE_BUILD,),
    ),
    Mutant(
        "server/templates/start-command-skipped",
        SERVICE,
        "                    await start_command(self.agent_sessions, self.settings.agent_port, record, envd_token)",
        "                    pass",
        "a create of a template with a start command answers before (and without) starting it",
        (TEMPLATE_BUILD,),
    ),
    Mutant(
        "server/templates/tags-not-moved",
        "reference_server/_builder.py",
        "await self._store.finish_build(building, layer, config, job.tags, self._clock())",
        "await self._store.finish_build(building, layer, config, (), self._clock())",
        "a finished build gets none of the tags it was asked for, so name:tag names nothing",
        (TEMPLATE_BUILD,),
    ),
    Mutant(
        "server/templates/registry-credentials-dropped",
        "reference_server/_builder.py",
        "pulled = await self._images.pull(plan.from_image, plan.credentials, say)",
        "pulled = await self._images.pull(plan.from_image, None, say)",
        "a build from a private registry image pulls without the username and password it was given",
        (TEMPLATE_IMAGE,),
    ),
    Mutant(
        "server/templates/image-env-dropped",
        "reference_server/_builder.py",
        "return pulled.layer, BuildConfig(root=pulled.layer, env=dict(pulled.env))",
        "return pulled.layer, BuildConfig(root=pulled.layer)",
        "a template from an image loses the image's environment (its PATH and variables)",
        (TEMPLATE_IMAGE,),
    ),
    Mutant(
        "server/warm-pool/claim-under-a-new-id",
        SERVICE,
        "sandbox_id = warm.sandbox_id if warm is not None else new_sandbox_id()",
        "sandbox_id = new_sandbox_id()",
        "a create that claims a warm sandbox records it under a new id: its host name and E2B_SANDBOX_ID are another's",
        ("sandbox/lifecycle/parallel-creates",),
    ),
    # --- volumes: owners, in-use refusals, ownership of files ------------------------------------
    Mutant(
        "server/volumes/list-every-owners",
        "reference_server/_volumes.py",
        "        return await self.store.owned(owner)\n",
        "        return await self.store.all()\n",
        "a volume list answers every owner's volumes, not the caller's",
        ("volume/control/owners",),
    ),
    Mutant(
        "server/volumes/paused-not-in-use",
        SERVICE,
        "alive = frozenset(SandboxState) - {S.KILLED, S.FAILED}",
        "alive = frozenset({S.RUNNING})",
        "a volume that only a paused sandbox mounts can be deleted under it",
        ("volume/mounts/in-use", "volume/mounts/filesystem-pause"),
    ),
    Mutant(
        "server/volume-files/default-owner-root",
        "reference_server/_volume_files.py",
        "DEFAULT_OWNER = 1000  # uid and gid: the sandboxes' ``user``",
        "DEFAULT_OWNER = 0",
        "what the content API makes belongs to root unless asked, so the sandboxes' user cannot change it",
        ("volume/content/files", "volume/mounts/ownership"),
    ),
)
