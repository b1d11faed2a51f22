"""``POST /init`` to a sandbox's agent: the step that makes a started sandbox usable.

E2B's control plane initializes envd after every start and resume with the access token, the
sandbox's environment variables, the default user and the time; until then the agent has no
token (anyone could take it over) and no environment. The sandbox is only reported running once
this succeeded. A refusal or silence is a ``BackendError``, so the service treats it as the
runtime failing (the sandbox is settled or released, the client gets a 500).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from runtime.backend import BackendError

__all__ = ["HttpAgentInitializer"]

ATTEMPTS = 5  # the runtime reports a sandbox started once /health answered; these cover a slow first /init


class HttpAgentInitializer:
    def __init__(self, *, timeout_s: float = 10.0) -> None:
        self._client = httpx.AsyncClient(timeout=timeout_s, trust_env=False)

    async def __call__(self, host: str, port: int, body: Mapping[str, Any]) -> None:
        url = f"http://{_bracketed(host)}:{port}/init"
        problem = ""
        for attempt in range(ATTEMPTS):
            try:
                response = await self._client.post(url, json=dict(body))
            except httpx.TransportError as exc:
                problem = type(exc).__name__
                await asyncio.sleep(0.1 * (attempt + 1))
                continue
            if response.status_code == 204:
                return
            # The body is the agent's short reason; the token we sent is never echoed back.
            raise BackendError(f"agent at {host}:{port} refused /init: {response.status_code} {response.text[:200]}")
        raise BackendError(f"agent at {host}:{port} did not answer /init ({problem})")

    async def aclose(self) -> None:
        await self._client.aclose()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
