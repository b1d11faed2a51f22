"""Contexts: a language, a working directory and a kernel that keeps state between runs.

``Contexts`` is the registry behind the ``/contexts`` routes and the per-language defaults
``/execute`` falls back to. A ``Context`` owns its kernel's life (start, restart, close, a
fresh start after the kernel died) and its environment variables:

- sandbox-global variables come from envd ``GET /envs`` (forwarding the request's
  ``X-Access-Token``), once per kernel, before its first run; an envd that cannot be
  reached is logged and asked again on the next run;
- a run's own ``env_vars`` are set before it and restored afterwards (``_languages``).

Both are applied as silent executions, so they leave no trace in output or execution counts.
Two locks: ``run_lock`` serializes executions (held for a whole run, see ``_execution``);
``_life`` serializes start/restart/close and is only ever held briefly by runs, so a restart
never waits for a running execution (it tells the run instead, which then ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

from contract.protocol import ACCESS_TOKEN_HEADER, ENVD_PORT

from . import _languages
from ._kernels import Kernel, KernelSpecs, KernelStartError
from ._limits import MAX_CONTEXTS
from ._messages import Tracker

logger = logging.getLogger(__name__)

ENVD_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class Settings:
    """What the server is started with (``python -m runtime.interpreter --help``)."""

    kernel_python: str = "/opt/e2b-compat/kernel/bin/python"
    envd_url: str = f"http://127.0.0.1:{ENVD_PORT}"
    cwd: str = "/home/user"
    keepalive_interval: float = 5.0  # seconds of silence before a keepalive line (upstream: 5)
    startup_timeout: float = 60.0  # seconds a new kernel gets to answer
    tick: float = 1.0  # how often a waiting run checks that its kernel is alive


class ContextClosedError(Exception):
    """The context was removed while a request was using it."""


class TooManyContextsError(Exception):
    """``MAX_CONTEXTS`` contexts exist already: no kernel is started for another one."""

    def __init__(self) -> None:
        super().__init__(f"Too many contexts: at most {MAX_CONTEXTS} can exist at once; remove one first")


class ContextRestartedError(Exception):
    """The context was restarted while the server was setting up a run."""


class EnvdClient:
    """Reads the sandbox-global environment variables from envd."""

    def __init__(self, base_url: str) -> None:
        self._url = base_url.rstrip("/") + "/envs"
        self._warned = False
        # One client for the server's life, made at start: a new one per first run cost ~40 ms
        # (its TLS context), paid by every sandbox's first run_code. trust_env off: a proxy from
        # the sandbox's environment must not see these requests.
        self._client = httpx.AsyncClient(timeout=ENVD_TIMEOUT_S, trust_env=False)

    async def fetch(self, access_token: str | None) -> dict[str, str] | None:
        """The variables, or None when envd cannot be asked (logged, never raised).

        The token is sent, never logged.
        """
        headers = {ACCESS_TOKEN_HEADER: access_token} if access_token else {}
        try:
            response = await self._client.get(self._url, headers=headers)
        except httpx.HTTPError as exc:
            self._warn("not reachable (%s)", type(exc).__name__)
            return None
        if response.status_code != 200:
            self._warn("answered %d", response.status_code)
            return None
        try:
            data: Any = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            self._warn("answered something that is not a string map")
            return None
        return {str(name): value for name, value in data.items()}

    async def warm(self) -> None:
        """One request whose answer is dropped: a first fetch pays ~35 ms of first use, paid here at start."""
        with contextlib.suppress(httpx.HTTPError):
            await self._client.get(self._url)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _warn(self, what: str, *args: object) -> None:
        # Every run asks again while envd fails: one warning, then debug lines.
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        logger.log(level, "envd %s " + what + "; running without the sandbox-global env vars", self._url, *args)


class Context:
    def __init__(self, registry: Contexts, language: str, cwd: str) -> None:
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.run_lock = asyncio.Lock()
        self._registry = registry
        self._life = asyncio.Lock()
        self._kernel: Kernel | None = None
        self._launch_env: dict[str, str] = {}
        self._sandbox_env: dict[str, str] | None = None  # None: not applied to this kernel yet
        self.closed = False

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    @property
    def settings(self) -> Settings:
        return self._registry.settings

    async def ensure_started(self) -> Kernel:
        """The context's kernel, started now if it never was or has died since."""
        async with self._life:
            if self.closed:
                raise ContextClosedError(self.id)
            if self._kernel is not None:
                if await self._kernel.is_alive():
                    return self._kernel
                logger.warning("context %s: kernel died, starting a new one", self.id)
                await self._kernel.shutdown()
                self._kernel = None
            self._launch_env = dict(os.environ)
            self._kernel = await Kernel.start(
                specs=self._registry.specs,
                language=self.language,
                kernel_id=self.id,
                runtime_dir=self._registry.runtime_dir,
                cwd=self.cwd,
                env=self._launch_env,
                timeout=self.settings.startup_timeout,
            )
            self._sandbox_env = None
            logger.info("context %s: %s kernel ready in %s", self.id, self.language, self.cwd)
            return self._kernel

    async def restart(self) -> None:
        """New kernel process, same id, language and cwd; a running execution ends with
        ``ContextRestarting`` (its stream is told, the lock it holds is not waited for)."""
        async with self._life:
            if self.closed:
                raise ContextClosedError(self.id)
            self._sandbox_env = None
            if self._kernel is None:
                return  # never started: the next run starts a fresh kernel anyway
            self._kernel.notify("restarting")
            try:
                await self._kernel.restart(self.settings.startup_timeout)
            except KernelStartError:
                await self._kernel.shutdown()
                self._kernel = None  # the next run tries a fresh start
                raise

    async def close(self) -> None:
        async with self._life:
            self.closed = True
            if self._kernel is not None:
                self._kernel.notify("closed")
                await self._kernel.shutdown()
                self._kernel = None

    async def prepare_env(self, kernel: Kernel, access_token: str | None) -> None:
        """Apply the sandbox-global variables to a kernel that has not got them yet."""
        if self._sandbox_env is not None:
            return
        fetched = await self._registry.envd.fetch(access_token)
        if fetched is None:
            return  # asked again before the next run
        usable, skipped = _languages.split_env(self.language, fetched)
        if skipped:
            logger.warning("context %s: sandbox variables %s cannot be set in %s", self.id, skipped, self.language)
        if usable and not await self.run_silently(kernel, _languages.set_code(self.language, usable)):
            logger.warning("context %s: setting the sandbox variables failed", self.id)
        self._sandbox_env = usable

    async def apply_run_env(self, kernel: Kernel, env: Mapping[str, str]) -> str:
        """Set a run's variables; returns the code that restores them (empty: nothing to do)."""
        usable, skipped = _languages.split_env(self.language, env)
        if skipped:
            logger.warning("context %s: env_vars %s cannot be set in %s", self.id, skipped, self.language)
        if not usable:
            return ""
        if not await self.run_silently(kernel, _languages.set_code(self.language, usable)):
            logger.warning("context %s: setting the run's env_vars failed", self.id)
        return _languages.restore_code(self.language, usable, self._sandbox_env or {}, self._launch_env)

    async def run_silently(self, kernel: Kernel, code: str) -> bool:
        """Run server code in the kernel (no output, no history, no execution count).

        True when it finished without an error; ContextRestartedError / ContextClosedError
        when the kernel was restarted or closed under it. Values are never logged: they may
        be secrets.
        """
        msg_id, queue = kernel.execute(code, silent=True)
        tracker = Tracker()
        try:
            while not tracker.finished:
                try:
                    channel, message = await asyncio.wait_for(queue.get(), self.settings.tick)
                except TimeoutError:
                    if not await kernel.is_alive():
                        return False
                    continue
                if channel == "iopub":
                    tracker.iopub(message)
                elif channel == "shell":
                    tracker.shell(message)
                elif channel == "restarting":
                    raise ContextRestartedError(self.id)
                elif channel == "closed":
                    raise ContextClosedError(self.id)
            failed = tracker.errored or bool(tracker.closing_lines())
            return not failed
        finally:
            kernel.unsubscribe(msg_id)


class Contexts:
    """Every context of this server, and which one is each language's default."""

    def __init__(self, settings: Settings, runtime_dir: Path) -> None:
        self.settings = settings
        self.runtime_dir = runtime_dir
        self.specs = KernelSpecs(settings.kernel_python)
        self.envd = EnvdClient(settings.envd_url)
        self._contexts: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}
        self._default_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._starting = 0  # contexts whose kernel is starting (counted against MAX_CONTEXTS)

    def start_default(self) -> list[Context]:
        """The startup languages' default contexts (python first), listed at once; their
        kernels start in the background (an execution on one waits for it)."""
        started = []
        for language in _languages.STARTUP_LANGUAGES:
            context = Context(self, language, self.settings.cwd)
            self._contexts[context.id] = context
            self._defaults[language] = context.id
            self._in_background(self._warm_up(context), f"default-{language}-kernel")
            started.append(context)
        self._in_background(self.envd.warm(), "envd-client")
        return started

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def starting_defaults(self) -> bool:
        """Whether the startup work (default kernels, the envd client's first use) is still under way."""
        return bool(self._background)

    async def _warm_up(self, context: Context) -> None:
        """Start the kernel, then one silent run: a kernel's first run costs ~20 ms more than the next.

        Under the context's ``run_lock``, like every other request the server sends a kernel: a
        first run that arrived meanwhile waits for the warm-up instead of being sent beside it.
        With the two sent side by side, about one first run in ten on gVisor never ended (the
        kernel idle, other contexts fine); serialized, none did (docs/PROTOCOL-NOTES.md).
        """
        try:
            async with context.run_lock:
                kernel = await context.ensure_started()
                if not await context.run_silently(kernel, _languages.WARM_UP[context.language]):
                    logger.warning("default %s kernel: the warm-up run failed", context.language)
        except (KernelStartError, ContextClosedError, ContextRestartedError) as exc:
            logger.error("default %s kernel did not start: %s", context.language, exc)

    def list(self) -> list[Context]:
        return list(self._contexts.values())

    def get(self, context_id: str) -> Context | None:
        return self._contexts.get(context_id)

    async def create(self, language: str, cwd: str) -> Context:
        """A new context with a ready kernel (KernelStartError when it cannot start).

        The slot is taken before the kernel starts, so parallel creates cannot pass the cap.
        """
        if len(self._contexts) + self._starting >= MAX_CONTEXTS:
            raise TooManyContextsError()
        context = Context(self, language, cwd)
        self._starting += 1
        try:
            await context.ensure_started()
        finally:
            self._starting -= 1
        self._contexts[context.id] = context
        return context

    async def default_for(self, language: str) -> Context:
        """The language's default context, created on first use (like upstream)."""
        async with self._default_lock:
            context = self._contexts.get(self._defaults.get(language, ""))
            if context is None:
                context = await self.create(language, self.settings.cwd)
                self._defaults[language] = context.id
            return context

    async def remove(self, context_id: str) -> bool:
        context = self._contexts.pop(context_id, None)
        if context is None:
            return False
        for language, default_id in list(self._defaults.items()):
            if default_id == context_id:
                del self._defaults[language]  # the next run in that language makes a new one
        await context.close()
        return True

    async def close_all(self) -> None:
        for task in list(self._background):
            task.cancel()
        contexts = list(self._contexts.values())
        self._contexts.clear()
        self._defaults.clear()
        results = await asyncio.gather(*(context.close() for context in contexts), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                logger.warning("closing a context failed: %r", result)
        await self.envd.aclose()
