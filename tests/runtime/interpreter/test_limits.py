"""The interpreter server's bounds (``runtime.interpreter._limits``), in-process with small limits patched in.

No kernel runs here: the app is served with a kernel interpreter that does not exist, so the
default context is registered (it counts against the cap) while its kernel fails to start.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import pytest

from runtime.interpreter import _app, _contexts, _execution
from runtime.interpreter._contexts import Context, Contexts, Settings, TooManyContextsError
from runtime.interpreter._execution import Run

T = TypeVar("T")


def _with_app(tmp_path: Path, scenario: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    """Run ``scenario`` against the app, inside its lifespan."""
    settings = Settings(kernel_python=str(tmp_path / "no-python"), cwd=str(tmp_path), startup_timeout=5)
    app = _app.create_app(settings)

    async def main() -> T:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://interpreter") as client,
        ):
            return await scenario(client)

    return asyncio.run(asyncio.wait_for(main(), 30))


def test_creating_more_contexts_than_the_cap_is_429(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_contexts, "MAX_CONTEXTS", 2)  # the default python and javascript contexts fill it

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.post("/contexts", json={"language": "python"})
        assert response.status_code == 429
        assert response.text == "Too many contexts: at most 2 can exist at once; remove one first"
        first_bash_run = await client.post("/execute", json={"code": "echo", "language": "bash"})
        assert first_bash_run.status_code == 429, "a language's default context counts too"
        assert len((await client.get("/contexts")).json()) == 2

    _with_app(tmp_path, scenario)


def test_a_body_over_the_cap_is_413(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_app, "MAX_REQUEST_BODY", 1000)

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.post("/execute", json={"code": "x" * 2000})
        assert response.status_code == 413
        assert response.text == "Request body is larger than 1000 bytes"
        assert (await client.post("/contexts", content=b"{" + b" " * 2000 + b"}")).status_code == 413

    _with_app(tmp_path, scenario)


def test_the_cap_counts_contexts_whose_kernel_is_still_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_contexts, "MAX_CONTEXTS", 2)
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow_start(self: Context) -> None:
        started.set()
        await release.wait()

    monkeypatch.setattr(Context, "ensure_started", slow_start)

    async def scenario() -> int:
        registry = Contexts(Settings(kernel_python="/nonexistent"), tmp_path)
        tasks = [asyncio.create_task(registry.create("python", "/")) for _ in range(3)]
        await started.wait()
        await asyncio.sleep(0.01)
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert sum(isinstance(r, TooManyContextsError) for r in results) == 1, results
        return len(registry.list())

    assert asyncio.run(scenario()) == 2


def _lines(run: Run) -> list[dict[str, Any]]:
    out = []
    while not run.outbox.empty():
        data = asyncio.run(run.next_line())
        assert data is not None
        out.append(json.loads(data))
    return out


def test_output_a_client_does_not_read_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap, output is dropped and counted; a stderr note reports it once there is room."""
    monkeypatch.setattr(_execution, "MAX_PENDING_OUTPUT", 10_000)
    run = Run(cast(Context, object()), "code", env_vars={}, access_token=None)
    line = {"type": "stdout", "text": "x" * 1000, "timestamp": "2026-01-01T00:00:00Z"}
    for _ in range(100):
        run._emit(line)
    assert run._queued <= 10_000
    kept = _lines(run)
    assert 5 <= len(kept) <= 10
    run._emit(line)  # room again: the note first, then the line
    run._emit({"type": "error", "name": "E", "value": "v", "traceback": ""})
    after = _lines(run)
    assert after[0]["type"] == "stderr"
    assert after[0]["text"] == f"[{100 - len(kept)} output lines dropped: the client did not read them in time]\n"
    assert "timestamp" in after[0]
    assert [entry["type"] for entry in after[1:]] == ["stdout", "error"]


def test_errors_and_the_end_are_never_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_execution, "MAX_PENDING_OUTPUT", 2000)
    run = Run(cast(Context, object()), "code", env_vars={}, access_token=None)
    for _ in range(10):
        run._emit({"type": "stdout", "text": "x" * 1000, "timestamp": "t"})
    run._emit({"type": "end_of_execution"})
    types = [entry["type"] for entry in _lines(run)]
    assert types[-2:] == ["stderr", "end_of_execution"], "the note comes before the end, even when full"
