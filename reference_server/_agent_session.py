"""The server's own calls into a sandbox's agent: run a command, start one in the background, upload a file.

Template builds run their steps this way, and a sandbox of a template with a start command gets
it started (and its ready command polled) this way before its create answers. These are the
same envd calls the clients make (``process.Process/Start`` over Connect, ``POST /files``), as
the sandbox's own user or root chosen by the Basic ``Authorization`` header.

The agent runs inside the sandbox, where whatever ran before may have replaced it: every call
has a deadline, and output is handed on in pieces as it comes, never gathered without bound.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import httpx
from connectrpc.errors import ConnectError

from contract.generated.process import process_connect
from contract.generated.process import process_pb2 as pb
from contract.protocol import ACCESS_TOKEN_HEADER

__all__ = [
    "AgentCallError",
    "AgentCalls",
    "AgentSession",
    "OutputSink",
    "SessionFactory",
    "StartSpec",
    "start_and_wait",
]

OutputSink = Callable[[str, bytes], Awaitable[None]]  # (stream name, bytes) as they come
_UPLOAD_CHUNK = 1 << 20


class AgentCallError(Exception):
    """The agent refused or did not answer (the message says what it said, never a token)."""


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode("ascii")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class AgentCalls(Protocol):
    """What the server asks of an agent; ``AgentSession`` over the wire, a recorder in tests."""

    async def run(
        self,
        command: str,
        *,
        user: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        output: OutputSink | None = None,
        timeout_s: float,
    ) -> int: ...

    async def start(
        self, command: str, *, user: str, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> int: ...

    async def upload(self, path: str, source: Path, *, user: str, timeout_s: float = 600) -> None: ...

    async def aclose(self) -> None: ...


class SessionFactory(Protocol):
    def __call__(self, host: str, port: int, *, access_token: str | None = None) -> AgentCalls: ...


class AgentSession:
    def __init__(self, host: str, port: int, *, access_token: str | None = None) -> None:
        self._base = f"http://{_bracketed(host)}:{port}"
        self._token = access_token
        self._process = process_connect.ProcessClient(self._base)

    def _headers(self, user: str) -> dict[str, str]:
        headers = {"Authorization": _basic(user)}
        if self._token is not None:
            headers[ACCESS_TOKEN_HEADER] = self._token
        return headers

    @staticmethod
    def _request(command: str, *, cwd: str | None, env: Mapping[str, str]) -> pb.StartRequest:
        config = pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command], envs=dict(env))
        if cwd:
            config.cwd = cwd
        return pb.StartRequest(process=config)

    async def run(
        self,
        command: str,
        *,
        user: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        output: OutputSink | None = None,
        timeout_s: float,
    ) -> int:
        """Run ``command`` with bash to its end; its exit code (the agent kills it at the deadline)."""
        request = self._request(command, cwd=cwd, env=env or {})
        code: int | None = None
        error = ""
        try:
            async with asyncio.timeout(timeout_s + 5):
                stream = self._process.start(request, headers=self._headers(user), timeout_ms=int(timeout_s * 1000))
                async for response in stream:
                    event = response.event
                    if event.HasField("data") and output is not None:
                        if event.data.stdout:
                            await output("stdout", event.data.stdout)
                        if event.data.stderr:
                            await output("stderr", event.data.stderr)
                    if event.HasField("end"):
                        code = event.end.exit_code
                        error = event.end.error
        except ConnectError as exc:
            raise AgentCallError(f"{exc.code.name.lower()}: {exc.message}") from None
        except TimeoutError:
            raise AgentCallError(f"the command did not end within {timeout_s:g} s") from None
        if code is None:
            raise AgentCallError("the agent ended the command's stream without its exit")
        if code == -1 and error:
            raise AgentCallError(error)
        return code

    async def start(
        self, command: str, *, user: str, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> int:
        """Start ``command`` in the background (it keeps running once this returns); its pid."""
        request = self._request(command, cwd=cwd, env=env or {})
        try:
            async with asyncio.timeout(30):
                stream = self._process.start(request, headers=self._headers(user))
                async for response in stream:
                    if response.event.HasField("start"):
                        pid = response.event.start.pid
                        await stream.aclose()  # type: ignore[attr-defined]  # an async generator
                        return pid
        except ConnectError as exc:
            raise AgentCallError(f"{exc.code.name.lower()}: {exc.message}") from None
        except TimeoutError:
            raise AgentCallError("the agent did not start the command within 30 s") from None
        raise AgentCallError("the agent ended the command's stream before it started")

    async def upload(self, path: str, source: Path, *, user: str, timeout_s: float = 600) -> None:
        """Write the file ``source`` (on the host) at ``path`` in the sandbox, as ``user``."""

        async def chunks() -> object:
            with source.open("rb") as handle:
                while chunk := await asyncio.to_thread(handle.read, _UPLOAD_CHUNK):
                    yield chunk

        headers = self._headers(user)
        headers["Content-Type"] = "application/octet-stream"
        try:
            async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
                response = await client.post(
                    f"{self._base}/files",
                    params={"path": path, "username": user},
                    headers=headers,
                    content=chunks(),  # type: ignore[arg-type]  # an async iterator of bytes
                )
        except httpx.HTTPError as exc:
            raise AgentCallError(f"upload to {path} failed: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise AgentCallError(f"upload to {path} refused: {response.status_code} {response.text[:200]}")

    async def aclose(self) -> None:
        await self._process.close()


READY_POLL_S = 0.2


class StartSpec(Protocol):
    """What starting a template needs (a ``_templates.BuildConfig`` is one)."""

    @property
    def start_cmd(self) -> str | None: ...
    @property
    def ready_cmd(self) -> str | None: ...
    @property
    def user(self) -> str: ...
    @property
    def workdir(self) -> str | None: ...
    @property
    def env(self) -> Mapping[str, str]: ...


async def start_and_wait(session: AgentCalls, spec: StartSpec, *, timeout_s: float) -> float:
    """Start the start command in the background, then run the ready command until it exits 0; seconds it took.

    A template's start and ready commands, at the end of its build and before a create of it
    answers, as its user, in its working directory, with its environment. Without a ready
    command the start command counts as ready once started. ``AgentCallError`` when the ready
    command has not succeeded within ``timeout_s``.
    """
    start_cmd, ready_cmd, user, cwd, env = spec.start_cmd, spec.ready_cmd, spec.user, spec.workdir, dict(spec.env)
    loop = asyncio.get_running_loop()
    began = loop.time()
    if start_cmd:
        await session.start(start_cmd, user=user, cwd=cwd, env=env)
    if not ready_cmd:
        return loop.time() - began
    last: int | str | None = None
    while (left := timeout_s - (loop.time() - began)) > 0:
        try:
            last = await session.run(ready_cmd, user=user, cwd=cwd, env=env, timeout_s=max(1.0, min(left, 30.0)))
        except AgentCallError as exc:
            last = str(exc)
        if last == 0:
            return loop.time() - began
        await asyncio.sleep(READY_POLL_S)
    detail = f"its last exit code was {last}" if isinstance(last, int) else f"last: {last}"
    raise AgentCallError(f"the ready command did not succeed within {timeout_s:g} s ({detail})")
