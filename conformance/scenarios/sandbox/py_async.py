"""Control-plane scenarios for the official Python client (async flavour) against the reference server.

Run by the pinned client's own interpreter (``python -I py_async.py <scenario> <workdir>``) with
only ``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE`` and ``NODE_EXTRA_CA_CERTS`` set (plus
``SECOND_API_KEY``, another owner's key, passed explicitly where a scenario needs it). Each
scenario makes its own sandboxes, kills them in ``finally`` and prints one JSON object; the
scenario names and result keys are the same as in ``py_sync.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from e2b import AsyncSandbox, AuthenticationException, NotFoundException, SandboxException, SandboxQuery, SandboxState

Scenario = Callable[[str], Awaitable[dict[str, Any]]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = fn
        return fn

    return register


def trace(name: str, stage: str) -> None:
    print(f"py-async:{name}:{stage}", file=sys.stderr, flush=True)


async def wait_until(check: Callable[[], Awaitable[bool]], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.2)
    return await check()


@scenario("sandbox/create-env-metadata")
async def _create(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(envs={"FROM_CREATE": "yes"}, metadata={"case": "create", "n": "1"}, timeout=120)
    try:
        info = await sbx.get_info()
        run = await sbx.commands.run("echo $FROM_CREATE; whoami; pwd")
        return {
            "stdout": run.stdout,
            "metadata": info.metadata,
            "template": info.template_id,
            "state": info.state.value,
            "same_id": info.sandbox_id == sbx.sandbox_id,
            "ends_after_start": info.end_at > info.started_at,
        }
    finally:
        await sbx.kill()


@scenario("sandbox/get-host")
async def _get_host(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.files.write("/home/user/site/index.html", "hello from inside")
        await sbx.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
        host = sbx.get_host(8000)
        body = ""
        async with httpx.AsyncClient(timeout=5) as client:

            async def served() -> bool:
                nonlocal body
                try:
                    response = await client.get(f"https://{host}/index.html")
                except httpx.HTTPError:
                    return False
                body = response.text
                return response.status_code == 200

            ok = await wait_until(served)
        return {"host": host, "ok": ok, "body": body}
    finally:
        await sbx.kill()


@scenario("sandbox/list-filter-paginate")
async def _list(work: str) -> dict[str, Any]:
    suite = uuid.uuid4().hex[:12]
    made: list[Any] = []
    try:
        for i in range(3):
            made.append(await AsyncSandbox.create(metadata={"suite": suite, "i": str(i)}, timeout=120))
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"suite": suite}), limit=2)
        pages, seen = 0, []
        while paginator.has_next:
            items = await paginator.next_items()
            pages += 1
            seen += [item.sandbox_id for item in items]
        await made[0].pause()
        paused = await AsyncSandbox.list(
            query=SandboxQuery(metadata={"suite": suite}, state=[SandboxState.PAUSED])
        ).next_items()
        running = await AsyncSandbox.list(
            query=SandboxQuery(metadata={"suite": suite}, state=[SandboxState.RUNNING])
        ).next_items()
        return {
            "pages": pages,
            "all_found": sorted(seen) == sorted(s.sandbox_id for s in made),
            "paused": [s.sandbox_id for s in paused] == [made[0].sandbox_id],
            "paused_state": [s.state.value for s in paused],
            "running": sorted(s.sandbox_id for s in running) == sorted(s.sandbox_id for s in made[1:]),
        }
    finally:
        for sbx in made:
            await sbx.kill()


@scenario("sandbox/timeout")
async def _timeout(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.set_timeout(2)

        async def stopped() -> bool:
            return not await sbx.is_running()

        gone = await wait_until(stopped, 30)
        try:
            await sbx.get_info()
            info_error = None
        except NotFoundException as exc:
            info_error = type(exc).__name__
        return {"gone": gone, "info_error": info_error}
    finally:
        await sbx.kill()


@scenario("sandbox/pause-memory-connect")
async def _pause_memory(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        handle = await sbx.commands.run("while true; do date +%s%N > /tmp/tick; sleep 0.1; done", background=True)
        first = await sbx.pause()
        second = await sbx.pause()
        listed_items = await AsyncSandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        listed = [s.sandbox_id for s in listed_items]
        state = (await AsyncSandbox.get_info(sbx.sandbox_id)).state.value
        again = await AsyncSandbox.connect(sbx.sandbox_id, timeout=120)
        pids = [p.pid for p in await again.commands.list()]
        before = await again.files.read("/tmp/tick")

        async def ticked() -> bool:
            return bool(await again.files.read("/tmp/tick") != before)

        ticking = await wait_until(ticked, 10)
        return {
            "first": first,
            "second": second,
            "listed_paused": sbx.sandbox_id in listed,
            "state": state,
            "process_survived": handle.pid in pids,
            "still_ticking": ticking,
            "running_after": await again.is_running(),
        }
    finally:
        await sbx.kill()


@scenario("sandbox/pause-filesystem-connect")
async def _pause_filesystem(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(envs={"KEEP": "env"}, timeout=120)
    try:
        await sbx.files.write("/home/user/kept.txt", "kept across the pause")
        handle = await sbx.commands.run("sleep 600", background=True)
        paused = await sbx.pause(keep_memory=False)
        again = await AsyncSandbox.connect(sbx.sandbox_id, timeout=120)
        return {
            "paused": paused,
            "file": await again.files.read("/home/user/kept.txt"),
            "process_gone": handle.pid not in [p.pid for p in await again.commands.list()],
            "env": (await again.commands.run("echo $KEEP")).stdout,
        }
    finally:
        await sbx.kill()


@scenario("sandbox/snapshot-restore")
async def _snapshot(work: str) -> dict[str, Any]:
    source = await AsyncSandbox.create(timeout=120)
    restored = None
    snapshot_id = None
    try:
        await source.files.write("/home/user/snap.txt", "snapshot content")
        snapshot = await source.create_snapshot()
        snapshot_id = snapshot.snapshot_id
        listed_items = await AsyncSandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()
        listed = [s.snapshot_id for s in listed_items]
        source_running = await source.is_running()
        await source.kill()
        restored = await AsyncSandbox.create(snapshot_id, timeout=120)
        content = await restored.files.read("/home/user/snap.txt")
        await restored.files.write("/home/user/snap.txt", "changed")
        try:
            await AsyncSandbox.delete_snapshot(snapshot_id)
            in_use = "deleted while in use"
        except SandboxException as exc:
            in_use = str(exc)[:3]
        await restored.kill()
        return {
            "listed": snapshot_id in listed,
            "names": snapshot.names,
            "source_running": source_running,
            "content": content,
            "in_use": in_use,
            "deleted": await AsyncSandbox.delete_snapshot(snapshot_id),
            "deleted_again": await AsyncSandbox.delete_snapshot(snapshot_id),
        }
    finally:
        await source.kill()
        if restored is not None:
            await restored.kill()


@scenario("sandbox/metrics")
async def _metrics(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.commands.run("head -c 20000000 /dev/urandom | sha256sum")
        metrics: list[Any] = []

        async def sampled() -> bool:
            nonlocal metrics
            metrics = await sbx.get_metrics()
            return len(metrics) >= 2  # the server samples every second in these tests

        await wait_until(sampled, 15)
        first = metrics[0] if metrics else None
        return {
            "count": len(metrics),
            "cpu_count": first.cpu_count if first else None,
            "mem_total": first.mem_total if first else None,
            "mem_used_positive": bool(first and first.mem_used > 0),
            "has_timestamp": bool(first and first.timestamp),
        }
    finally:
        await sbx.kill()


@scenario("sandbox/kill-is-running")
async def _kill(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        running = await sbx.is_running()
        killed = await sbx.kill()
        try:
            await AsyncSandbox.connect(sbx.sandbox_id)
            connect_error = None
        except NotFoundException as exc:
            connect_error = type(exc).__name__
        return {
            "running": running,
            "killed": killed,
            "running_after": await sbx.is_running(),
            "killed_again": await AsyncSandbox.kill(sbx.sandbox_id),
            "connect_error": connect_error,
        }
    finally:
        await sbx.kill()


@scenario("sandbox/other-owner")
async def _other_owner(work: str) -> dict[str, Any]:
    second = os.environ["SECOND_API_KEY"]
    sbx = await AsyncSandbox.create(metadata={"owner-test": "yes"}, timeout=120)
    try:
        theirs = [s.sandbox_id for s in await AsyncSandbox.list(api_key=second).next_items()]
        try:
            await AsyncSandbox.connect(sbx.sandbox_id, api_key=second)
            connect_error = None
        except NotFoundException as exc:
            connect_error = type(exc).__name__
        return {
            "listed_for_other": sbx.sandbox_id in theirs,
            "connect_error": connect_error,
            "other_kill": await AsyncSandbox.kill(sbx.sandbox_id, api_key=second),
            "still_running": await sbx.is_running(),
        }
    finally:
        await sbx.kill()


BURST = 32  # parallel creates, half for each owner

# Who answers: the runtime's hostname and id, the marker from the create's environment, the upload.
IDENTITY = (
    'printf "%s|%s|%s|%s" "$(hostname)" "$E2B_COMPAT_MARKER" "$E2B_SANDBOX_ID" "$(cat /tmp/identity 2>/dev/null)"'
)


@scenario("sandbox/parallel-creates")
async def _parallel_creates(work: str) -> dict[str, Any]:
    """A burst of creates from two owners at once; each sandbox says who it is through every path."""
    keys = {"first": os.environ["E2B_API_KEY"], "second": os.environ["SECOND_API_KEY"]}
    made: list[AsyncSandbox] = []

    async def one(n: int) -> dict[str, Any]:
        owner = "first" if n % 2 == 0 else "second"
        marker = uuid.uuid4().hex
        sbx = await AsyncSandbox.create(
            envs={"E2B_COMPAT_MARKER": marker}, metadata={"marker": marker}, api_key=keys[owner]
        )
        made.append(sbx)
        found: dict[str, Any] = {"owner": owner, "id": sbx.sandbox_id, "marker": marker}
        try:  # a request that reached another sandbox may fail there: that is an answer too
            await sbx.files.write("/tmp/identity", marker)
            hostname, env_marker, env_id, file_marker = (await sbx.commands.run(IDENTITY)).stdout.split("|")
            found["seen"] = {
                "hostname": hostname,
                "env_marker": env_marker,
                "env_id": env_id,
                "file_marker": file_marker,
                "read_marker": await sbx.files.read("/tmp/identity"),
                "metadata_marker": (await sbx.get_info()).metadata.get("marker"),
            }
        except (SandboxException, AuthenticationException) as exc:
            found["error"] = f"{type(exc).__name__}: {exc}"
        return found

    try:
        return {"sandboxes": list(await asyncio.gather(*(one(n) for n in range(BURST))))}
    finally:
        await asyncio.gather(*(sbx.kill() for sbx in made), return_exceptions=True)


async def run(name: str, work: str) -> dict[str, Any]:
    return await SCENARIOS[name](work)


def main() -> None:
    name, work = sys.argv[1], sys.argv[2]
    trace(name, "start")
    result = asyncio.run(run(name, work))
    trace(name, "done")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
