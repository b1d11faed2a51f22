"""envd's plain HTTP routes: ``/health``, ``/metrics``, ``/envs``, ``/init`` (docs/PROTOCOL-NOTES.md, envd HTTP routes).

Refusals are ``AgentError``s in envd's forms: ``/init`` answers plain text, ``/metrics`` the
status alone (``_errors.answers_errors``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import _metadata
from ._errors import AgentError, ErrorKind, HttpBody, answers_errors
from ._limits import MAX_INIT_BODY
from ._metrics import MetricsCollector
from ._processes import env_problem
from ._state import INTERNAL_NAMES, AgentState

_NO_STORE = {"Cache-Control": "no-store"}
_FRACTION = re.compile(r"(\.\d{6})\d+")


async def health(request: Request) -> Response:
    return Response(status_code=204, headers=_NO_STORE)


@answers_errors(HttpBody.EMPTY, headers=_NO_STORE)
async def metrics(request: Request) -> Response:
    collector: MetricsCollector = request.app.state.metrics
    try:
        sample = collector.sample()
    except OSError as exc:
        raise AgentError(ErrorKind.INTERNAL, f"error reading metrics: {exc}") from None
    return JSONResponse(sample, headers=_NO_STORE)


async def envs(request: Request) -> Response:
    state: AgentState = request.app.state.agent
    return JSONResponse(state.global_env(), headers=_NO_STORE)


def parse_timestamp(value: str) -> datetime:
    # Python 3.11 parses at most microseconds; envd sends up to nanoseconds.
    return datetime.fromisoformat(_FRACTION.sub(r"\1", value).replace("Z", "+00:00"))


async def read_capped(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is longer than ``limit`` (never buffered past it)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise AgentError(ErrorKind.CONTENT_TOO_LARGE, f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _init_authorized(state: AgentState, presented: str | None, expected_hash: str | None) -> bool:
    """envd's rule: the current token repeated; else the published hash matched; else a first /init."""
    if state.access_token is not None and presented is not None and state.token_matches(presented):
        return True
    if expected_hash:
        return _metadata.matches_hash(presented, expected_hash)
    return state.access_token is None


def _parse_init(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    data = json.loads(body)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("body is not an object")
    token = data.get("accessToken")
    if token is not None and (not isinstance(token, str) or token == "" or "\\" in token):
        raise ValueError("invalid accessToken")
    env_vars = data.get("envVars")
    if env_vars is not None and not (isinstance(env_vars, dict) and all(isinstance(v, str) for v in env_vars.values())):
        raise ValueError("invalid envVars")
    if env_vars is not None and env_problem(env_vars) is not None:
        raise ValueError("invalid envVars")  # stored, it would fail every later start
    for key in ("defaultUser", "defaultWorkdir", "timestamp"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"invalid {key}")
    if data.get("timestamp"):
        data["timestamp"] = parse_timestamp(data["timestamp"])
    return data


@answers_errors(HttpBody.TEXT)
async def init(request: Request) -> Response:
    """Set token, environment, default user and workdir; idempotent; stale bodies ignored.

    The system clock is never set from ``timestamp``: in a container it is the host's clock.
    ``hyperloopIP``, ``caBundle`` and ``volumeMounts`` are accepted and ignored.
    """
    state: AgentState = request.app.state.agent
    try:
        data = _parse_init(await read_capped(request, MAX_INIT_BODY))
    except ValueError:
        raise AgentError(ErrorKind.INVALID_ARGUMENT, "") from None  # envd answers a bare 400
    async with state.init_lock:
        presented = data.get("accessToken")
        if not _init_authorized(state, presented, _metadata.expected_token_hash(state.metadata_dir)):
            reason = "access token validation failed" if presented is not None else "access token reset not authorized"
            raise AgentError(ErrorKind.UNAUTHENTICATED, reason)
        state.internal.update(_metadata.published_ids(state.metadata_dir))  # a restored agent's new identity
        stamp = data.get("timestamp")
        if stamp is not None and state.last_init is not None and stamp < state.last_init:
            return Response(status_code=204, headers=_NO_STORE)
        if stamp is not None:
            state.last_init = stamp
        if data.get("envVars") is not None:
            state.env_vars = {k: v for k, v in data["envVars"].items() if k not in INTERNAL_NAMES}
        state.access_token = presented
        if data.get("defaultUser"):
            state.default_user = data["defaultUser"]
        if data.get("defaultWorkdir"):
            state.default_workdir = data["defaultWorkdir"]
    return Response(status_code=204, headers=_NO_STORE)
