"""Carrying out template builds: each in a sandbox of the server's own backend, a few at a time.

A build waits for one of ``concurrency`` slots (its status stays ``waiting``), then is
``building``: it finds the longest run of its first steps in the owner's step cache, starts a
sandbox from the layer after them (the backend's own isolation, the operator's egress setting,
the template's cpu and memory, admitted like any sandbox), runs the remaining steps through the
sandbox's agent and snapshots the filesystem after each step that changes files, so every
prefix is cached for later builds. The start and ready commands then run once, to prove them.
The build's layer is the last snapshot (taken before the start command, which a sandbox of the
template runs again at its create: this backend keeps no memory in a layer).

Deleting the template cancels its builds (the sandbox is killed on the way out); a build past
``timeout_s`` fails. A server that stops mid-build finds the build unfinished at its next start
and records it failed (``TemplateService.recover``); the build sandbox, which has no sandbox
record, is an orphan that start-up reconciliation kills. A ready build is only recorded after
its layer exists, so nothing half-built is ever used.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from runtime.backend import Limits, SandboxRuntimeError, SandboxSpec

from ._agent_session import AgentCallError, AgentCalls, start_and_wait
from ._build_files import BuildFiles
from ._build_plan import (
    BuildPlan,
    Step,
    after_env,
    after_user,
    base_key,
    copy_script,
    copy_source,
    env_script,
    finalize_key,
    step_key,
    step_name,
    user_script,
    workdir_script,
)
from ._errors import ApiError
from ._events import rfc3339
from ._image_source import ImageSource, ImageSourceError
from ._sandboxes import SandboxService, new_sandbox_id
from ._templates import BuildConfig, BuildLog, BuildRecord, CacheEntry, TemplateRecord, TemplateStore

__all__ = ["BuildFailedError", "Builder", "ResolveTemplate"]

log = logging.getLogger(__name__)

CACHE_ENTRIES = 256  # per owner; the oldest entries' layers are retired past it
MAX_LOG_ENTRIES = 20_000  # per build; then one warning, and output is dropped
MAX_LINE_CHARS = 8192
TAIL_LINES = 20  # of a failed step's output, in the reason the clients show
READY_TIMEOUT_S = 300.0

# (owner, reference) → (layer, config) of a ready build of a template the owner may build from.
ResolveTemplate = Callable[[str, str], Awaitable[tuple[str, BuildConfig] | None]]


class BuildFailedError(Exception):
    def __init__(self, step: str, message: str, tail: Iterable[BuildLog] = ()) -> None:
        super().__init__(message)
        self.step = step
        self.message = message
        self.tail = tuple(tail)


@dataclass
class Job:
    build: BuildRecord
    template: TemplateRecord
    plan: BuildPlan
    tags: tuple[str, ...]


class _Log:
    """A build's log: entries in the store as they come, output split into bounded lines."""

    def __init__(self, store: TemplateStore, build_id: str, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._build_id = build_id
        self._clock = clock
        self._count = 0
        self._partial: dict[str, bytes] = {}
        self.tail: collections.deque[BuildLog] = collections.deque(maxlen=TAIL_LINES)

    async def write(self, level: str, message: str, step: str | None = None) -> BuildLog:
        entry = BuildLog(self._clock(), level, message[:MAX_LINE_CHARS], step)
        if self._count < MAX_LOG_ENTRIES:
            await self._store.append_logs(self._build_id, [entry])
        elif self._count == MAX_LOG_ENTRIES:
            await self._store.append_logs(
                self._build_id, [BuildLog(self._clock(), "warn", "more output than the log keeps: the rest is dropped")]
            )
        self._count += 1
        return entry

    def output(self, step: str) -> Callable[[str, bytes], Awaitable[None]]:
        self.tail.clear()

        async def sink(stream: str, data: bytes) -> None:
            buffered = self._partial.get(stream, b"") + data
            *lines, rest = buffered.split(b"\n")
            if len(rest) > MAX_LINE_CHARS:  # a line without end is logged in pieces
                lines.append(rest)
                rest = b""
            self._partial[stream] = rest
            for line in lines:
                self.tail.append(await self.write("info", line.decode("utf-8", "replace").rstrip("\r"), step))

        return sink

    async def flush(self, step: str) -> None:
        for stream, rest in list(self._partial.items()):
            if rest:
                self.tail.append(await self.write("info", rest.decode("utf-8", "replace"), step))
            self._partial[stream] = b""


class _Box:
    """The build's sandbox: its agent, and the homes of the users steps ran as."""

    def __init__(self, sandbox_id: str, session: AgentCalls) -> None:
        self.sandbox_id = sandbox_id
        self.session = session
        self._homes: dict[str, str] = {}

    async def capture(self, command: str, *, user: str, cwd: str | None, env: dict[str, str], what: str) -> str:
        out = bytearray()

        async def keep(stream: str, data: bytes) -> None:
            if stream == "stdout" and len(out) < 1 << 16:
                out.extend(data)

        code = await self.session.run(command, user=user, cwd=cwd, env=env, output=keep, timeout_s=60)
        if code != 0:
            raise AgentCallError(f"{what} failed with exit code {code}")
        return out.decode("utf-8", "replace")

    async def home(self, user: str) -> str:
        if user not in self._homes:
            script = f"getent passwd {user} | cut -d: -f6"
            found = (await self.capture(script, user="root", cwd="/", env={}, what=f"finding {user}'s home")).strip()
            if not found:
                raise AgentCallError(f"user {user!r} does not exist in the template")
            self._homes[user] = found
        return self._homes[user]


class Builder:
    def __init__(
        self,
        *,
        service: SandboxService,
        store: TemplateStore,
        files: BuildFiles,
        resolve: ResolveTemplate,
        concurrency: int = 2,
        timeout_s: float = 3600.0,
        clock: Callable[[], datetime] | None = None,
        images: ImageSource | None = None,
    ) -> None:
        self._service = service
        self._images = images
        self._store = store
        self._files = files
        self._resolve = resolve
        self._slots = asyncio.Semaphore(concurrency)
        self._timeout_s = timeout_s
        self._clock = clock or (lambda: datetime.now(UTC))
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def submit(self, job: Job) -> None:
        task = asyncio.create_task(self._run(job), name=f"template build {job.build.build_id}")
        self._tasks[job.build.build_id] = task
        task.add_done_callback(lambda _done: self._tasks.pop(job.build.build_id, None))

    async def cancel(self, build_ids: Iterable[str]) -> None:
        tasks = [task for build_id in build_ids if (task := self._tasks.get(build_id)) is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        await self.cancel(list(self._tasks))

    async def _run(self, job: Job) -> None:
        build = job.build
        logbook = _Log(self._store, build.build_id, self._clock)
        try:
            async with self._slots:
                await self._store.set_building(build.build_id, self._clock())
                building = replace(build, status="building")
                async with asyncio.timeout(self._timeout_s):
                    layer, config = await self._build(job, logbook)
                await self._store.finish_build(building, layer, config, job.tags, self._clock())
                await logbook.write("info", f"Build finished: {job.template.name} ({', '.join(job.tags)})", "finalize")
        except BuildFailedError as failed:
            await logbook.write("error", failed.message, failed.step)
            await self._fail(build, failed)
        except TimeoutError:
            await self._fail(
                build, BuildFailedError("finalize", f"the build did not finish within {self._timeout_s:g} s")
            )
        except asyncio.CancelledError:
            raise  # the template was deleted with its builds
        except Exception as exc:
            log.exception("build %s failed", build.build_id)
            await self._fail(build, BuildFailedError("finalize", f"internal error: {type(exc).__name__}"))

    async def _fail(self, build: BuildRecord, failed: BuildFailedError) -> None:
        reason = {
            "message": failed.message,
            "step": failed.step,
            "logEntries": [
                {"timestamp": rfc3339(entry.timestamp), "level": entry.level, "message": entry.message}
                for entry in failed.tail
            ],
        }
        await self._store.fail_build(build.build_id, reason, self._clock())

    # -- the build -----------------------------------------------------------------------

    async def _base(self, job: Job, logbook: _Log) -> tuple[str, BuildConfig]:
        plan, settings = job.plan, self._service.settings
        if plan.from_image is not None and plan.from_base:
            if "base" not in settings.templates:
                raise BuildFailedError("base", f"this server does not serve the base image {plan.from_image!r}")
            return "base", BuildConfig(root="base")
        if plan.from_image is not None:
            if self._images is None:
                raise BuildFailedError("base", f"this server pulls no images ({plan.from_image!r})")

            async def say(line: str) -> None:
                await logbook.write("info", line, "base")

            try:
                pulled = await self._images.pull(plan.from_image, plan.credentials, say)
            except ImageSourceError as exc:
                raise BuildFailedError("base", f"Pulling {plan.from_image} failed: {exc}") from None
            # The image's own environment (PATH above all) is what its programs expect; its
            # working directory and user are not carried: steps run as ``user`` in its home.
            return pulled.layer, BuildConfig(root=pulled.layer, env=dict(pulled.env))
        reference = plan.from_template or ""
        if reference in settings.templates:
            return reference, BuildConfig(root=reference)
        found = await self._resolve(job.template.owner, reference)
        if found is None:
            raise BuildFailedError("base", f"template {reference!r} not found, or it has no ready build")
        layer, config = found
        return layer, replace(config, start_cmd=None, ready_cmd=None)

    async def _build(self, job: Job, logbook: _Log) -> tuple[str, BuildConfig]:
        plan, owner = job.plan, job.template.owner
        await logbook.write("info", f"Base: {plan.from_image or plan.from_template}", "base")
        layer, config = await self._base(job, logbook)
        key = base_key(layer, config)
        first = 0
        total = len(plan.steps)
        if not plan.force:
            for index, step in enumerate(plan.steps):
                if step.force:
                    break
                hit = await self._store.cached(owner, step_key(key, step))
                if hit is None:
                    break
                key, layer, config, first = hit.key, hit.layer, hit.config, index + 1
                await logbook.write("info", f"CACHED [{index + 1}/{total}] {step.describe()}", step_name(index))
        final_key = finalize_key(key, plan.start_cmd, plan.ready_cmd)
        needs_finalize = plan.start_cmd is not None or plan.ready_cmd is not None
        done = first == total and not plan.force
        if done and (not needs_finalize or await self._store.cached(owner, final_key) is not None):
            return layer, replace(config, start_cmd=plan.start_cmd, ready_cmd=plan.ready_cmd)
        async with self._sandbox(job, layer, config) as box:
            for index in range(first, total):
                step = plan.steps[index]
                name = step_name(index)
                await logbook.write("info", f"[{index + 1}/{total}] {step.describe()}", name)
                config, changed = await self._step(box, job, step, config=config, logbook=logbook, name=name)
                key = step_key(key, step)
                if changed:
                    layer = await self._snapshot(box, name)
                await self._remember(owner, CacheEntry(key, layer, config))
            final_key = finalize_key(key, plan.start_cmd, plan.ready_cmd)
            if needs_finalize:
                await logbook.write("info", "Starting the start command and waiting for the ready command", "finalize")
                try:
                    finished = replace(config, start_cmd=plan.start_cmd, ready_cmd=plan.ready_cmd)
                    took = await start_and_wait(box.session, finished, timeout_s=READY_TIMEOUT_S)
                except AgentCallError as exc:
                    raise BuildFailedError("finalize", f"Start command not ready: {exc}") from None
                await logbook.write("info", f"Ready after {took:.1f} s", "finalize")
                await self._remember(owner, CacheEntry(final_key, layer, config))
        return layer, replace(config, start_cmd=plan.start_cmd, ready_cmd=plan.ready_cmd)

    async def _remember(self, owner: str, entry: CacheEntry) -> None:
        evicted = await self._store.remember(owner, entry, self._clock(), keep=CACHE_ENTRIES)
        if evicted:
            log.info("step cache of an owner is full: %d layers retired", len(evicted))

    async def _snapshot(self, box: _Box, step: str) -> str:
        try:
            return await self._service.backend.snapshot(box.sandbox_id)
        except SandboxRuntimeError as exc:
            raise BuildFailedError(step, f"capturing the filesystem failed: {exc}") from None

    @contextlib.asynccontextmanager
    async def _sandbox(self, job: Job, layer: str, config: BuildConfig) -> AsyncIterator[_Box]:
        service = self._service
        settings = service.settings
        sandbox_id = new_sandbox_id()
        memory_mb = max(job.template.memory_mb, settings.template_memory_mb.get(config.root, 0))
        try:
            async with service.admission.create(job.template.owner, sandbox_id, memory_mb):
                spec = SandboxSpec(
                    sandbox_id=sandbox_id,
                    template=layer,
                    limits=Limits(cpu_count=job.template.cpu_count, memory_mb=memory_mb, disk_mb=settings.disk_mb),
                    hostname=sandbox_id,
                    allow_internet_access=settings.egress_enabled,
                )
                session: AgentCalls | None = None
                try:
                    await service.backend.create(spec)
                    info = await service.backend.start(sandbox_id)
                    if info.host is None:
                        raise BuildFailedError("base", "the build sandbox has no address")
                    await service.initialize_agent(info.host, {"envVars": {}, "timestamp": rfc3339(self._clock())})
                    session = service.agent_sessions(info.host, settings.agent_port)
                    yield _Box(sandbox_id, session)
                except SandboxRuntimeError as exc:
                    raise BuildFailedError("base", f"the build sandbox could not start: {exc}") from None
                finally:
                    if session is not None:
                        await session.aclose()
                    with contextlib.suppress(SandboxRuntimeError):
                        await asyncio.shield(service.backend.kill(sandbox_id))
        except ApiError as exc:  # admission: no room for the build's sandbox now
            raise BuildFailedError("base", f"no room for the build's sandbox: {exc.message}") from None

    async def _step(
        self, box: _Box, job: Job, step: Step, *, config: BuildConfig, logbook: _Log, name: str
    ) -> tuple[BuildConfig, bool]:
        """Run one step; the context after it, and whether it may have changed files."""
        env = dict(config.env)
        try:
            if step.type == "RUN":
                command, user = step.args[0], (step.args[1] if len(step.args) > 1 and step.args[1] else config.user)
                code = await box.session.run(
                    command,
                    user=user,
                    cwd=config.workdir,
                    env=env,
                    output=logbook.output(name),
                    timeout_s=self._timeout_s,
                )
                await logbook.flush(name)
                if code != 0:
                    raise BuildFailedError(
                        name, _failure(f"Command failed with exit code {code}: {command}", logbook), logbook.tail
                    )
                return config, True
            if step.type == "COPY":
                code = await self._copy(box, job, step, config, logbook.output(name))
                await logbook.flush(name)
                if code != 0:
                    raise BuildFailedError(name, _failure(f"Copying {step.args[0]} failed", logbook), logbook.tail)
                return config, True
            if step.type == "WORKDIR":
                cwd = config.workdir or await box.home(config.user)
                found = await box.capture(
                    workdir_script(step.args[0]), user=config.user, cwd=cwd, env=env, what="WORKDIR"
                )
                return replace(config, workdir=found.strip() or step.args[0]), True
            if step.type == "USER":
                sudo = len(step.args) > 1 and step.args[1] == "true"
                await box.capture(user_script(step.args[0], sudo), user="root", cwd="/", env={}, what="USER")
                return after_user(config, step.args[0]), True
            values: list[tuple[str, str]] = []
            current = dict(env)
            for key, raw in zip(step.args[::2], step.args[1::2], strict=True):
                value = await box.capture(
                    env_script(raw), user=config.user, cwd=config.workdir, env=current, what="ENV"
                )
                current[key] = value
                values.append((key, value))
            return after_env(config, values), False
        except AgentCallError as exc:
            await logbook.flush(name)
            raise BuildFailedError(name, _failure(f"{step.type} failed: {exc}", logbook), logbook.tail) from None

    async def _copy(
        self, box: _Box, job: Job, step: Step, config: BuildConfig, output: Callable[[str, bytes], Awaitable[None]]
    ) -> int:
        assert step.files_hash is not None  # parse_plan requires it
        archive = self._files.path(job.template.owner, step.files_hash)
        if not archive.is_file():
            raise AgentCallError(f"the files of {step.args[0]!r} were not uploaded (hash {step.files_hash[:12]}…)")
        inside = f"/tmp/.e2b-build-{step.files_hash}.tar"  # noqa: S108 - the build sandbox's own /tmp
        await box.session.upload(inside, archive, user="root")
        owner = step.args[2] if len(step.args) > 2 and step.args[2] else config.user
        if ":" not in owner:
            owner = f"{owner}:{owner}"
        mode = step.args[3] if len(step.args) > 3 and step.args[3] else None
        unpack = f"/tmp/.e2b-build-{step.files_hash}"  # noqa: S108
        source = copy_source(step.args[0])
        script = copy_script(
            archive=inside,
            unpack=unpack,
            source=f"{unpack}/{source}" if source else unpack,
            target=step.args[1],
            owner=owner,
            mode=mode,
        )
        cwd = config.workdir or await box.home(config.user)
        return await box.session.run(script, user="root", cwd=cwd, env={}, output=output, timeout_s=self._timeout_s)


def _failure(headline: str, logbook: _Log) -> str:
    """The clients show only the reason's message: the step's last output lines go in it."""
    lines = [entry.message for entry in logbook.tail]
    return headline if not lines else headline + "\n" + "\n".join(lines)
