"""``POST /init`` to a sandbox's agent: the step that makes a started sandbox usable.

E2B's control plane initializes envd after every start and resume with the access token, the
sandbox's environment variables, the default user and the time; until then the agent has no
token (anyone could take it over) and no environment. The sandbox is only reported running once
this succeeded. A refusal or silence is a ``BackendError``, so the service treats it as the
runtime failing (the sandbox is settled or released, the client gets a 500).

The agent runs inside the sandbox, where its tenant is root and may replace it: the answer is
read at most ``MAX_ANSWER_BYTES`` far (the rest is never read) and the whole call, retries
included, ends after ``timeout_s``, however slowly the agent dribbles its bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from runtime.backend import BackendError

__all__ = ["HEALTH_TIMEOUT_S", "HttpAgentInitializer", "agent_answers"]

ATTEMPTS = 5  # the runtime reports a sandbox started once /health answered; these cover a slow first /init
MAX_ANSWER_BYTES = 64 * 1024  # a refusal is a short reason; nothing longer is read
_REASON_CHARS = 200
_STEP_TIMEOUT_S = 10.0


class HttpAgentInitializer:
    def __init__(self, *, timeout_s: float = 30.0) -> None:
        self._timeout_s = timeout_s
        # Per step (connect, each read): one slow step must leave room for a retry within timeout_s.
        self._client = httpx.AsyncClient(timeout=min(_STEP_TIMEOUT_S, timeout_s), trust_env=False)

    async def __call__(self, host: str, port: int, body: Mapping[str, Any]) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._initialize(host, port, body)
        except TimeoutError:
            raise BackendError(f"agent at {host}:{port} did not finish /init within {self._timeout_s:g} s") from None

    async def _initialize(self, host: str, port: int, body: Mapping[str, Any]) -> None:
        url = f"http://{_bracketed(host)}:{port}/init"
        problem = ""
        for attempt in range(ATTEMPTS):
            try:
                async with self._client.stream("POST", url, json=dict(body)) as response:
                    if response.status_code == 204:
                        return
                    answer = await _read_bounded(response)  # closing it unread drops the connection
            except httpx.TransportError as exc:
                problem = type(exc).__name__
                await asyncio.sleep(0.1 * (attempt + 1))
                continue
            # The body is the agent's short reason; the token we sent is never echoed back.
            reason = answer.decode("utf-8", "replace")[:_REASON_CHARS]
            raise BackendError(f"agent at {host}:{port} refused /init: {response.status_code} {reason}")
        raise BackendError(f"agent at {host}:{port} did not answer /init ({problem})")

    async def aclose(self) -> None:
        await self._client.aclose()


async def _read_bounded(response: httpx.Response) -> bytes:
    """At most ``MAX_ANSWER_BYTES`` of the body, undecoded (a gzip bomb stays a small read)."""
    answer = bytearray()
    async for chunk in response.aiter_raw():
        answer += chunk[: MAX_ANSWER_BYTES - len(answer)]
        if len(answer) >= MAX_ANSWER_BYTES:
            break
    return bytes(answer)


HEALTH_TIMEOUT_S = 3.0  # a pause with requireHealthyGuest waits this long for the agent's /health


async def agent_answers(host: str, port: int, *, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether the agent answers ``GET /health`` with a success within ``timeout_s`` (the guest is healthy)."""
    try:
        # Plain HTTP to a sandbox: no certificate store to load (~28 ms of the event loop per client).
        async with (
            httpx.AsyncClient(timeout=timeout_s, trust_env=False, verify=False) as client,  # noqa: S501 - http:// only
            asyncio.timeout(timeout_s),
        ):
            response = await client.get(f"http://{_bracketed(host)}:{port}/health")
    except (httpx.TransportError, TimeoutError):
        return False
    return response.is_success


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
