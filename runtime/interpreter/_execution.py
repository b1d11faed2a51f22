"""One ``POST /execute``: a task that runs the code on its context and an outbox of lines.

The task holds the context's ``run_lock`` for the whole run, so executions on one context
happen one after another while different contexts run side by side. It always drives the
kernel until the execution is really over, even after the client left: ``abandon()`` (the
HTTP side saw the client go) stops collecting output and interrupts the kernel, and the lock
is released only once the kernel is idle again, so the next run starts on a free kernel.

What ends a run early, and the last lines it writes before ``end_of_execution``:

- the kernel process died: ``UnexpectedEndOfExecution`` (the next run starts a new kernel);
- the context was restarted: ``ContextRestarting``; removed: ``UnexpectedEndOfExecution``.

The outbox holds encoded lines and is bounded by ``MAX_PENDING_OUTPUT`` bytes (``_limits``):
output past it is dropped and counted, and a ``stderr`` line reports the loss once there is
room again (or before the run's last lines).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Final, Literal

from . import _messages
from ._contexts import Context, ContextClosedError, ContextRestartedError
from ._kernels import Event, Kernel, KernelStartError
from ._limits import MAX_PENDING_OUTPUT
from ._messages import Line, Tracker

logger = logging.getLogger(__name__)

# How the user's code ended: ran to its end (or never ran: the client left first), or not.
Outcome = Literal["done", "skipped", "dead", "restarting", "closed"]

# After the kernel went idle, how long to wait for the execute_reply. It normally comes
# first; ipykernel sends none when an interrupt lands before the user's code started
# ("KeyboardInterrupt caught in kernel"), and the run must end anyway.
REPLY_GRACE_S: Final = 2.0
# At most this long is spent on a kernel's late messages after its run finished.
LATE_IOPUB_LIMIT_S: Final = 1.0
# While abandoned and still busy, how often to send the interrupt again (user code that
# swallowed one KeyboardInterrupt gets another).
REINTERRUPT_S: Final = 5.0
# Lines that may be dropped when the client falls behind; the others are small and few.
_DROPPABLE: Final = frozenset({"stdout", "stderr", "result"})


class Run:
    def __init__(
        self,
        context: Context,
        code: str,
        *,
        env_vars: Mapping[str, str],
        access_token: str | None,
    ) -> None:
        self.context = context
        self.code = code
        self.env_vars = dict(env_vars)
        self._access_token = access_token
        # Encoded lines for the HTTP side (``next_line``); None after the last one. Bounded in
        # bytes: upstream's queue is not, so a client that stops reading grows it for ever.
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._queued = 0  # bytes in the outbox
        self._dropped = 0  # lines dropped since the last note about it
        self._abandoned = False
        self._events: asyncio.Queue[Event] | None = None
        self._task: asyncio.Task[None] | None = None

    async def next_line(self) -> bytes | None:
        """The next encoded line for the client; None after the last one."""
        data = await self.outbox.get()
        if data is not None:
            self._queued -= len(data)
        return data

    def start(self) -> None:
        self._task = asyncio.create_task(self._main(), name=f"run-{self.context.id}")

    def abandon(self) -> None:
        """The client is gone: drop output from now on and interrupt the kernel if the code
        is running (a run still waiting for the lock will not run at all)."""
        if self._abandoned:
            return
        self._abandoned = True
        while not self.outbox.empty():
            self.outbox.get_nowait()
        if self._events is not None:
            self._events.put_nowait(("abandoned", {}))  # wakes the run up to interrupt

    def _emit(self, line: Mapping[str, object]) -> None:
        if self._abandoned:
            return
        data = _messages.encode(line)
        droppable = line.get("type") in _DROPPABLE
        if self._dropped and (not droppable or self._queued + len(data) <= MAX_PENDING_OUTPUT // 2):
            note = f"[{self._dropped} output lines dropped: the client did not read them in time]\n"
            self._dropped = 0
            self._put(_messages.encode({"type": "stderr", "text": note, "timestamp": _messages.timestamp(None)}))
        if droppable and (self._dropped or self._queued + len(data) > MAX_PENDING_OUTPUT):
            self._dropped += 1
            return
        self._put(data)

    def _put(self, data: bytes) -> None:
        self._queued += len(data)
        self.outbox.put_nowait(data)

    async def _main(self) -> None:
        try:
            async with self.context.run_lock:
                if not self._abandoned:
                    await self._locked()
        except ContextClosedError:
            self._emit(_messages.unexpected_end("The context was removed"))
        except ContextRestartedError:  # while its variables were being set
            self._emit(_messages.context_restarting())
        except KernelStartError as exc:
            self._emit(_messages.unexpected_end(f"The context's kernel could not be started: {exc}"))
        except Exception:
            logger.exception("context %s: execution failed", self.context.id)
            self._emit(_messages.unexpected_end("The execution failed in the server"))
        finally:
            self._emit(_messages.END_OF_EXECUTION)
            self.outbox.put_nowait(None)

    async def _locked(self) -> None:
        context = self.context
        kernel = await context.ensure_started()
        await context.prepare_env(kernel, self._access_token)
        restore = await context.apply_run_env(kernel, self.env_vars)
        outcome: Outcome = "skipped" if self._abandoned else await self._execute(kernel)
        if not restore or outcome not in ("done", "skipped"):
            return  # a restarted, closed or dead kernel has lost the run's variables anyway
        try:
            restored = await context.run_silently(kernel, restore)
        except (ContextRestartedError, ContextClosedError):
            restored = True
        if not restored:
            logger.warning("context %s: restoring the run's env_vars failed", context.id)

    async def _execute(self, kernel: Kernel) -> Outcome:
        """Stream the user's code to the outbox until the execution is over."""
        loop = asyncio.get_running_loop()
        msg_id, events = kernel.execute(self.code, silent=False)
        self._events = events
        tracker = Tracker()
        idle_since: float | None = None
        interrupted_at: float | None = None
        try:
            while not tracker.finished:
                if self._abandoned and not tracker.idle:
                    now = loop.time()
                    if interrupted_at is None or now - interrupted_at >= REINTERRUPT_S:
                        interrupted_at = now
                        logger.info("context %s: client left, interrupting the kernel", self.context.id)
                        await kernel.interrupt()
                try:
                    channel, message = await asyncio.wait_for(events.get(), self.context.settings.tick)
                except TimeoutError:
                    if not await kernel.is_alive():
                        self._emit(_messages.unexpected_end("The kernel died during the execution"))
                        return "dead"
                    if idle_since is not None and loop.time() - idle_since >= REPLY_GRACE_S:
                        break
                    continue
                if channel == "iopub":
                    self._emit_all(tracker.iopub(message))
                    if tracker.idle and idle_since is None:
                        idle_since = loop.time()
                elif channel == "shell":
                    tracker.shell(message)
                elif channel == "restarting":
                    self._emit(_messages.context_restarting())
                    return "restarting"
                elif channel == "closed":
                    self._emit(_messages.unexpected_end("The context was removed"))
                    return "closed"
            await self._late_messages(kernel, events, tracker)
            self._emit_all(tracker.closing_lines())
            return "done"
        finally:
            self._events = None
            kernel.unsubscribe(msg_id)

    async def _late_messages(self, kernel: Kernel, events: asyncio.Queue[Event], tracker: Tracker) -> None:
        """A kernel that publishes after its idle status (Deno's): its run's iopub until quiet."""
        deadline = asyncio.get_running_loop().time() + LATE_IOPUB_LIMIT_S
        while kernel.late_iopub_s and asyncio.get_running_loop().time() < deadline:
            try:
                channel, message = await asyncio.wait_for(events.get(), kernel.late_iopub_s)
            except TimeoutError:
                return
            if channel == "iopub":
                self._emit_all(tracker.iopub(message))

    def _emit_all(self, lines: list[Line]) -> None:
        for line in lines:
            self._emit(line)
