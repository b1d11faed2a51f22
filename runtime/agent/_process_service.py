"""``process.Process`` over Connect: the wire side of ``_processes``.

Refusals are ``AgentError``s (``ProcessError``, ``PathError``, ``UserError`` and the ones raised
here); ``_errors.ConnectErrors`` turns them into Connect errors.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.request import RequestContext

from contract.generated.process import process_pb2 as pb

from ._errors import AgentError, ErrorKind
from ._paths import resolve
from ._processes import Exit, ManagedProcess, Output, ProcessTable, Spec, build_env, env_problem
from ._state import AgentState
from ._users import User

DEFAULT_KEEPALIVE_S = 90.0
_SIGNALS = {pb.SIGNAL_SIGTERM: signal.SIGTERM, pb.SIGNAL_SIGKILL: signal.SIGKILL}
DEADLINE_MESSAGE = "context deadline exceeded"  # connect-go's words for a passed deadline


def keepalive_interval(ctx: RequestContext[Any, Any]) -> float:
    """``Keepalive-Ping-Interval`` in whole seconds; missing, malformed or ≤ 0 means 90 s."""
    raw = ctx.request_headers().get("keepalive-ping-interval")
    try:
        value = float(int(raw)) if raw is not None else DEFAULT_KEEPALIVE_S
    except ValueError:
        return DEFAULT_KEEPALIVE_S
    return value if value > 0 else DEFAULT_KEEPALIVE_S


def _event_message(event: Output | Exit) -> pb.ProcessEvent:
    if isinstance(event, Output):
        return pb.ProcessEvent(data=pb.ProcessEvent.DataEvent(**{event.stream: event.data}))
    end = pb.ProcessEvent.EndEvent(exit_code=event.exit_code, exited=event.exited, status=event.status)
    if event.error is not None:
        end.error = event.error
    return pb.ProcessEvent(end=end)


async def _events(
    managed: ManagedProcess, queue: asyncio.Queue[Output | Exit], ctx: RequestContext[Any, Any]
) -> AsyncIterator[pb.ProcessEvent]:
    """start, then data and keepalives, then end; ``deadline_exceeded`` when the deadline passes.

    For Start the process table kills the process at the same deadline; Connect's own
    deadline only ends its stream.
    """
    interval = keepalive_interval(ctx)
    remaining = ctx.timeout_ms()
    loop = asyncio.get_running_loop()
    deadline = None if remaining is None else loop.time() + remaining / 1000.0
    try:
        yield pb.ProcessEvent(start=pb.ProcessEvent.StartEvent(pid=managed.pid))
        while True:
            wait = interval if deadline is None else min(interval, deadline - loop.time())
            if wait <= 0:
                raise AgentError(ErrorKind.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
            try:
                if queue.empty():
                    async with asyncio.timeout(wait):
                        event = await queue.get()
                else:
                    event = queue.get_nowait()
            except TimeoutError:
                if deadline is None or loop.time() < deadline:
                    yield pb.ProcessEvent(keepalive=pb.ProcessEvent.KeepAlive())
                continue
            yield _event_message(event)
            if isinstance(event, Exit):
                return
    finally:
        managed.unsubscribe(queue)


class ProcessService:
    """Implements the generated ``Process`` protocol."""

    def __init__(self, state: AgentState, table: ProcessTable) -> None:
        self._state = state
        self._table = table

    def _user(self, ctx: RequestContext[Any, Any]) -> User:
        return self._state.user_from_basic(ctx.request_headers().get("authorization"))

    def _find(self, selector: pb.ProcessSelector) -> ManagedProcess:
        which = selector.WhichOneof("selector")
        if which == "pid":
            return self._table.find(pid=selector.pid)
        if which == "tag":
            return self._table.find(tag=selector.tag)
        return self._table.find()

    async def start(self, request: pb.StartRequest, ctx: RequestContext[Any, Any]) -> AsyncIterator[pb.StartResponse]:
        user = self._user(ctx)
        config = request.process
        cwd = resolve(config.cwd if config.HasField("cwd") else "", user, self._state.default_workdir)
        if not os.path.exists(cwd):
            raise AgentError(ErrorKind.INVALID_ARGUMENT, f"cwd '{cwd}' does not exist")
        if (problem := env_problem(config.envs)) is not None:
            raise AgentError(ErrorKind.INVALID_ARGUMENT, f"invalid envs: {problem}")
        size = None
        if request.HasField("pty"):
            size = (request.pty.size.cols, request.pty.size.rows)
        spec = Spec(
            cmd=config.cmd,
            args=tuple(config.args),
            env=build_env(user, self._state.global_env(), dict(config.envs)),
            cwd=cwd,
            user=user,
            stdin=request.stdin if request.HasField("stdin") else True,
            pty_size=size,
            tag=request.tag if request.HasField("tag") else None,
            config=config,
        )
        remaining = ctx.timeout_ms()
        deadline = None if remaining is None else asyncio.get_running_loop().time() + remaining / 1000.0
        managed, queue = await self._table.start(spec, deadline)
        async for event in _events(managed, queue, ctx):
            yield pb.StartResponse(event=event)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        self._user(ctx)
        managed = self._find(request.process)
        queue = managed.subscribe()
        async for event in _events(managed, queue, ctx):
            yield pb.ConnectResponse(event=event)

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any]) -> pb.ListResponse:
        self._user(ctx)
        infos = []
        for managed in self._table.list():
            info = pb.ProcessInfo(pid=managed.pid, config=managed.spec.config)
            if managed.spec.tag is not None:
                info.tag = managed.spec.tag
            infos.append(info)
        return pb.ListResponse(processes=infos)

    async def send_input(self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any]) -> pb.SendInputResponse:
        self._user(ctx)
        managed = self._find(request.process)
        which = request.input.WhichOneof("input")
        if which == "stdin":
            await managed.write_stdin(request.input.stdin)
        elif which == "pty":
            await managed.write_pty(request.input.pty)
        else:
            raise AgentError(ErrorKind.UNIMPLEMENTED, "input is empty")
        return pb.SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any]
    ) -> pb.StreamInputResponse:
        self._user(ctx)
        managed: ManagedProcess | None = None
        async for message in request:
            which = message.WhichOneof("event")
            if which == "start":
                managed = self._find(message.start.process)
            elif which == "data":
                if managed is None:
                    raise AgentError(ErrorKind.FAILED_PRECONDITION, "data sent before start")
                if message.data.input.WhichOneof("input") == "pty":
                    await managed.write_pty(message.data.input.pty)
                else:
                    await managed.write_stdin(message.data.input.stdin)
        return pb.StreamInputResponse()

    async def send_signal(self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any]) -> pb.SendSignalResponse:
        self._user(ctx)
        managed = self._find(request.process)
        sig = _SIGNALS.get(request.signal)
        if sig is None:
            raise AgentError(ErrorKind.UNIMPLEMENTED, f"invalid signal: {request.signal}")
        managed.send_signal(sig)
        return pb.SendSignalResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any]) -> pb.CloseStdinResponse:
        self._user(ctx)
        managed = self._find(request.process)
        managed.close_stdin()
        return pb.CloseStdinResponse()

    async def update(self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any]) -> pb.UpdateResponse:
        self._user(ctx)
        managed = self._find(request.process)
        if request.HasField("pty"):
            managed.resize(request.pty.size.cols, request.pty.size.rows)
        return pb.UpdateResponse()
