"""Control-plane scenarios for the official Python client (async flavour) against the reference server.

Run by the pinned client's own interpreter (``python -I py_async.py <scenario> <workdir>``) with
only ``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE`` and ``NODE_EXTRA_CA_CERTS`` set (plus
``SECOND_API_KEY``, another owner's key, passed explicitly where a scenario needs it). Each
scenario makes its own sandboxes, kills them in ``finally`` and prints one JSON object; the
scenario names and result keys are the same as in ``py_sync.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import math
import os
import ssl
import sys
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from e2b import (
    AsyncSandbox,
    AsyncTemplate,
    AsyncVolume,
    AuthenticationException,
    BuildException,
    CommandExitException,
    NotFoundException,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TemplateBuildStatus,
    wait_for_port,
)
from e2b.sandbox.commands.command_handle import PtySize

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
            "lifetime": (info.end_at - info.started_at).total_seconds(),
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
        # The same owner's sandbox of another suite (sharing "i": "0" with the first): the filter leaves it out.
        decoy = await AsyncSandbox.create(metadata={"suite": f"{suite}-decoy", "i": "0"}, timeout=120)
        made_ids = [s.sandbox_id for s in made]
        made.append(decoy)
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"suite": suite}), limit=2)
        pages, seen = 0, []
        while paginator.has_next:
            items = await paginator.next_items()
            pages += 1
            seen += [item.sandbox_id for item in items]
        # The same query paged by one, by two and not at all: pages of one show the cursor's order.
        walks: dict[str, list[list[str]]] = {}
        for name, limit in (("1", 1), ("2", 2), ("default", None)):
            query = SandboxQuery(metadata={"suite": suite})
            walk = AsyncSandbox.list(query=query) if limit is None else AsyncSandbox.list(query=query, limit=limit)
            walks[name] = []
            while walk.has_next:
                walks[name].append([item.sandbox_id for item in await walk.next_items()])
        await made[0].pause()
        paused = await AsyncSandbox.list(
            query=SandboxQuery(metadata={"suite": suite}, state=[SandboxState.PAUSED])
        ).next_items()
        running = await AsyncSandbox.list(
            query=SandboxQuery(metadata={"suite": suite}, state=[SandboxState.RUNNING])
        ).next_items()
        return {
            "suite": suite,
            "made": made_ids,
            "decoy": decoy.sandbox_id,
            "walks": walks,
            "pages": pages,
            "all_found": sorted(seen) == sorted(made_ids),
            "paused": [s.sandbox_id for s in paused] == [made[0].sandbox_id],
            "paused_state": [s.state.value for s in paused],
            "running": sorted(s.sandbox_id for s in running) == sorted(made_ids[1:]),
        }
    finally:
        for sbx in made:
            await sbx.kill()


@scenario("sandbox/list-order")
async def _list_order(work: str) -> dict[str, Any]:
    """The list's order, startedAfter and template (clients from 2.50), each walked a page of one at a time."""
    suite = uuid.uuid4().hex[:12]
    made: list[AsyncSandbox] = []
    try:
        for i in range(3):
            made.append(await AsyncSandbox.create(metadata={"suite": suite, "i": str(i)}, timeout=120))

        async def walk(order: str | None = None, **query: Any) -> list[str]:
            asked = SandboxQuery(metadata={"suite": suite}, **query)
            paginator = AsyncSandbox.list(query=asked, limit=1, **({"order": order} if order else {}))
            seen: list[str] = []
            while paginator.has_next:
                seen += [item.sandbox_id for item in await paginator.next_items()]
            return seen

        return {
            "made": [s.sandbox_id for s in made],
            "asc": await walk("asc"),
            "desc": await walk("desc"),
            "default": await walk(),
            "started_after": await walk("asc", started_after=(await made[1].get_info()).started_at),
            "template": await walk("asc", template="base"),
            "other_template": await walk(template="no-such-template-e2b"),
        }
    finally:
        for sbx in made:
            await sbx.kill()


@scenario("sandbox/sudo")
async def _sudo(work: str) -> dict[str, Any]:
    """The default user's ``sudo`` (a setuid program) in a sandbox of the default template: root through it."""
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        try:
            result = await sbx.commands.run("sudo -n id -un && id -un")
        except CommandExitException as exc:
            return {"stdout": exc.stdout, "stderr": exc.stderr, "exit_code": exc.exit_code}
        return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}
    finally:
        await sbx.kill()


@scenario("sandbox/fork")
async def _fork(work: str) -> dict[str, Any]:
    """fork(count=2) (clients from 2.34): each fork goes on with the source's processes, memory and files."""
    suite = uuid.uuid4().hex[:12]
    sbx = await AsyncSandbox.create(timeout=120, metadata={"suite": suite}, envs={"FORK_ENV": "inherited"})
    made: list[AsyncSandbox] = []
    try:
        await sbx.commands.run(FORK_SETUP)
        try:
            forks = await sbx.fork(count=2)
        except Exception as exc:  # noqa: BLE001 -- a refusal is the result (its message has the status)
            return {"raised": type(exc).__name__, "message": str(exc)}
        outcome: dict[str, Any] = {"raised": None, "source": sbx.sandbox_id, "forks": []}
        for fork in forks:
            if not isinstance(fork, AsyncSandbox):
                outcome["forks"].append({"error": f"{type(fork).__name__}: {fork}"})
                continue
            made.append(fork)
            stdout = (await fork.commands.run(FORK_CHECK)).stdout
            info = await fork.get_info()
            outcome["forks"].append({"id": fork.sandbox_id, "stdout": stdout, "metadata": info.metadata})
        outcome["source_runs"] = (await sbx.commands.run(FORK_ALIVE)).stdout
        outcome["listed"] = len(await AsyncSandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items())
        return outcome
    finally:
        for fork in made:
            await fork.kill()
        await sbx.kill()


# As in py_sync.py: a background loop (its pid in the tmpfs /tmp), a tmpfs file, a disk file.
FORK_SETUP = (
    "nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 & echo $! > /tmp/loop.pid; "
    "echo in-memory > /tmp/ram.txt; echo on-disk > /home/user/disk.txt"
)
FORK_ALIVE = 'kill -0 "$(cat /tmp/loop.pid)" && echo ok'
FORK_CHECK = f'{FORK_ALIVE} && cat /tmp/ram.txt /home/user/disk.txt && echo "$E2B_SANDBOX_ID $FORK_ENV"'


# The MCP scenario's stdio server, and git's own settings that make github.com's URL of its
# repository the volume's copy (the sandbox has no route out).
MCP_ECHO = (Path(__file__).resolve().parents[1] / "in_sandbox" / "mcp_echo_server.py").read_text("utf-8")
MCP_GIT_ENVS = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "url./mnt/mirror/.insteadOf",
    "GIT_CONFIG_VALUE_0": "https://github.com/",
}
MCP_MIRROR = (
    "cd /tmp/echo && git init -q && git add server.py && git -c user.name=c -c user.email=c@example.com "
    "commit -qm echo && mkdir -p /mnt/mirror/example && git clone -q --bare /tmp/echo /mnt/mirror/example/echo.git"
)
MCP_CONFIG = {"github/example/echo": {"runCmd": "python3 server.py", "envs": {"ECHO_PREFIX": "> "}}}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def mcp_answer(response: httpx.Response) -> Any:
    """The JSON-RPC message of a streamable-HTTP answer: a JSON body, or the data of its SSE event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1]) if data else None
    return response.json() if response.content else None


@scenario("sandbox/mcp")
async def _mcp(work: str) -> dict[str, Any]:
    """create(mcp=...) with a github server whose repository a first sandbox put in a volume; MCP spoken over HTTP."""
    suite = uuid.uuid4().hex[:12]
    vol = await AsyncVolume.create(f"mcp-{suite}")
    made: list[AsyncSandbox] = []
    try:
        helper = await AsyncSandbox.create(volume_mounts={"/mnt/mirror": vol}, timeout=120)
        made.append(helper)
        await helper.files.write("/tmp/echo/server.py", MCP_ECHO, user="root")  # git as root wants its own files
        await helper.commands.run(MCP_MIRROR, user="root")
        await helper.kill()
        sbx = await AsyncSandbox.create(
            mcp=MCP_CONFIG, envs=MCP_GIT_ENVS, volume_mounts={"/mnt/mirror": vol.name}, timeout=120
        )
        made.append(sbx)
        url, token = sbx.get_mcp_url(), await sbx.get_mcp_token()
        read_back = await (await AsyncSandbox.connect(sbx.sandbox_id)).get_mcp_token()
        ca = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        async with httpx.AsyncClient(verify=ca, timeout=60) as http:
            ping = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
            refused = [
                (await http.post(url, json=ping, headers={**MCP_ACCEPT, **extra})).status_code
                for extra in ({}, {"Authorization": "Bearer wrong"})
            ]
            auth = {**MCP_ACCEPT, "Authorization": f"Bearer {token}"}
            hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}
            initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
            started = await http.post(url, json=initialize, headers=auth)
            session = started.headers.get("mcp-session-id")
            auth = {**auth, "Mcp-Protocol-Version": "2025-06-18", **({"Mcp-Session-Id": session} if session else {})}
            await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=auth)
            listing = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=auth)
            call = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "hello"}},
            }
            called = await http.post(url, json=call, headers=auth)
        tools = mcp_answer(listing) or {}
        return {
            "url": url,
            "host": sbx.get_host(50005),
            "token_read_back": token is not None and read_back == token,
            "refused": refused,
            "server": (mcp_answer(started) or {}).get("result", {}).get("serverInfo", {}).get("name"),
            "session": session is not None,
            "tools": sorted(tool["name"] for tool in tools.get("result", {}).get("tools", [])),
            "echo": [c.get("text") for c in (mcp_answer(called) or {}).get("result", {}).get("content", [])],
        }
    finally:
        for sandbox in made:
            with contextlib.suppress(Exception):  # the helper is killed early
                await sandbox.kill()
        await AsyncVolume.destroy(vol.volume_id)


@scenario("sandbox/idempotent-create")
async def _idempotent_create(work: str) -> dict[str, Any]:
    """A create repeated with one Idempotency-Key (clients from 2.61) is one sandbox."""
    suite = uuid.uuid4().hex[:12]
    key = f"conformance-{suite}"
    first = await AsyncSandbox.create(timeout=120, metadata={"suite": suite}, idempotency_key=key)
    made = [first]
    try:
        # The repeats at once, side by side: a retry may arrive while the first still creates.
        again, twice = await asyncio.gather(
            AsyncSandbox.create(timeout=120, metadata={"suite": suite}, idempotency_key=key),
            AsyncSandbox.create(timeout=120, metadata={"suite": suite}, idempotency_key=key),
        )
        made += [again, twice]
        try:
            other = await AsyncSandbox.create(timeout=120, metadata={"suite": f"{suite}-other"}, idempotency_key=key)
            made.append(other)
            other_body = {"raised": None, "same": other.sandbox_id == first.sandbox_id}
        except Exception as exc:  # noqa: BLE001 -- the refusal is the result
            other_body = {"raised": type(exc).__name__, "message": str(exc)}
        listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items()
        return {
            "same": again.sandbox_id == twice.sandbox_id == first.sandbox_id,
            "runs": (await again.commands.run("echo ok")).stdout,
            "listed": [s.sandbox_id for s in listed] == [first.sandbox_id],
            "other_body": other_body,
        }
    finally:
        for sbx in {s.sandbox_id: s for s in made}.values():
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


@scenario("sandbox/connect-reboot")
async def _connect_reboot(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.files.write("/home/user/kept.txt", "kept across the reboot")
        handle = await sbx.commands.run("sleep 600", background=True)
        await sbx.commands.run("echo in-memory > /dev/shm/mark")
        paused = await sbx.pause()
        again = await AsyncSandbox.connect(sbx.sandbox_id, timeout=120, on_resume="reboot")
        return {
            "paused": paused,
            "file": await again.files.read("/home/user/kept.txt"),
            "process_gone": handle.pid not in [p.pid for p in await again.commands.list()],
            "shm": (await again.commands.run("cat /dev/shm/mark 2>/dev/null || echo gone")).stdout,
            "running": await again.is_running(),
        }
    finally:
        await sbx.kill()


async def _snapshot_pages(paginator: Any) -> list[list[str]]:
    """A snapshot list's pages, at most five: a cursor the server ignores would page forever."""
    pages: list[list[str]] = []
    while paginator.has_next and len(pages) < 5:
        pages.append([s.snapshot_id for s in await paginator.next_items()])
    return pages


@scenario("sandbox/snapshot-restore")
async def _snapshot(work: str) -> dict[str, Any]:
    source = await AsyncSandbox.create(timeout=120)
    other = await AsyncSandbox.create(timeout=120)
    restored = None
    snapshot_id = None
    taken: list[str] = []
    try:
        await source.files.write("/home/user/snap.txt", "snapshot content")
        snapshot = await source.create_snapshot()
        snapshot_id = snapshot.snapshot_id
        taken.append(snapshot_id)
        name = f"named-{uuid.uuid4().hex[:12]}"
        named = await source.create_snapshot(name=name)
        taken.append(named.snapshot_id)
        theirs = await other.create_snapshot()  # another sandbox's: the sandbox filter leaves it out
        taken.append(theirs.snapshot_id)
        listed_items = await AsyncSandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()
        listed = [s.snapshot_id for s in listed_items]
        other_items = await AsyncSandbox.list_snapshots(sandbox_id=other.sandbox_id).next_items()
        pages = await _snapshot_pages(AsyncSandbox.list_snapshots(sandbox_id=source.sandbox_id, limit=1))
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
            "name": name,
            "named_names": named.names,
            "listed_names": {s.snapshot_id: s.names for s in listed_items},
            "source_snapshots": [snapshot_id, named.snapshot_id],
            "other_snapshot": theirs.snapshot_id,
            "listed_source": listed,
            "listed_other": [s.snapshot_id for s in other_items],
            "pages": pages,
        }
    finally:
        await source.kill()
        await other.kill()
        if restored is not None:
            await restored.kill()
        for taken_id in taken[1:]:
            await AsyncSandbox.delete_snapshot(taken_id)


def _metrics_window(stamps: list[float]) -> list[int] | None:
    """Whole seconds around a sample between two others, which the window leaves out (None: no such sample yet)."""
    for before, sample, after in zip(stamps, stamps[1:], stamps[2:], strict=False):
        start, end = math.floor(sample), math.ceil(sample)
        if before < start and after > end:
            return [start, end]
    return None


@scenario("sandbox/metrics")
async def _metrics(work: str) -> dict[str, Any]:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.commands.run("head -c 20000000 /dev/urandom | sha256sum")
        metrics: list[Any] = []

        async def sampled() -> bool:
            nonlocal metrics
            metrics = await sbx.get_metrics()
            return _metrics_window([m.timestamp.timestamp() for m in metrics]) is not None

        await wait_until(sampled, 40)
        first = metrics[0] if metrics else None
        series = [m.timestamp.timestamp() for m in metrics]
        window = _metrics_window(series) or [0, 0]  # a window that leaves out the first and last samples
        start, end = (datetime.fromtimestamp(t, UTC) for t in window)
        windowed = [m.timestamp.timestamp() for m in await sbx.get_metrics(start=start, end=end)]
        started = (await sbx.get_info()).started_at.timestamp()
        before = await sbx.get_metrics(
            start=datetime.fromtimestamp(int(started) - 3600, UTC), end=datetime.fromtimestamp(int(started) - 1800, UTC)
        )
        return {
            "count": len(metrics),
            "cpu_count": first.cpu_count if first else None,
            "mem_total": first.mem_total if first else None,
            "mem_used_positive": bool(first and first.mem_used > 0),
            "has_timestamp": bool(first and first.timestamp),
            "series": series,
            "window": window,
            "windowed": windowed,
            "before_start": len(before),
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


# A server on port 8001 that answers with the headers it received, one "name: value" per line;
# scripts run where they are, so the file is read from beside this one.
HEADER_ECHO = (Path(__file__).resolve().parents[1] / "in_sandbox" / "header_echo.py").read_text("utf-8")


def _network_view(info: Any) -> dict[str, Any]:
    network = info.network or {}
    return {
        "internet": info.allow_internet_access,
        "allow_out": network.get("allow_out") or [],
        "deny_out": network.get("deny_out") or [],
        "public": network.get("allow_public_traffic"),
        "mask": network.get("mask_request_host"),
    }


@scenario("sandbox/network-settings")
async def _network_settings(work: str) -> dict[str, Any]:
    """Network options at create and update: what get_info reports, and what a server inside sees."""
    sbx = await AsyncSandbox.create(
        timeout=120,
        allow_internet_access=False,
        network={
            "allow_out": ["10.91.0.0/16"],
            "deny_out": ["10.92.0.0/16"],
            "allow_public_traffic": False,
            "mask_request_host": "${PORT}-masked.example",
        },
    )
    try:
        created = _network_view(await sbx.get_info())
        await sbx.files.write("/home/user/echo.py", HEADER_ECHO)
        await sbx.commands.run("python3 /home/user/echo.py", background=True)
        url = f"https://{sbx.get_host(8001)}/"
        seen = ""
        async with httpx.AsyncClient(timeout=5) as http:

            async def served() -> bool:
                nonlocal seen
                try:
                    response = await http.get(url, headers={"E2B-Traffic-Access-Token": sbx.traffic_access_token})
                except httpx.HTTPError:
                    return False
                seen = response.text
                return response.status_code == 200

            ok = await wait_until(served)
            without_token = (await http.get(url)).status_code
        await sbx.update_network({"allow_out": ["10.93.0.0/16"], "allow_internet_access": True})
        updated = _network_view(await sbx.get_info())
        headers = dict(line.split(": ", 1) for line in seen.splitlines() if ": " in line)
        return {
            "created": created,
            "served": ok,
            "headers": headers,
            "without_token": without_token,
            "updated": updated,
        }
    finally:
        await sbx.kill()


async def _state(sandbox_id: str) -> str:
    return str((await AsyncSandbox.get_info(sandbox_id)).state.value)


@scenario("sandbox/lifecycle-on-timeout")
async def _on_timeout(work: str) -> dict[str, Any]:
    """on_timeout "pause" (with and without memory), auto_resume, and connect's new timeout."""
    # Created with room for the set-up (a slow backend's create takes seconds), then given a short timeout:
    # the timer set_timeout re-arms still carries the lifecycle chosen at create.
    memory = await AsyncSandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": False})
    disk = await AsyncSandbox.create(timeout=60, lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}})
    woken = await AsyncSandbox.create(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        lifecycle = (await memory.get_info()).lifecycle
        await memory.files.write("/home/user/kept.txt", "kept")
        kept_pid = (await memory.commands.run("sleep 600", background=True)).pid
        disk_pid = (await disk.commands.run("sleep 600", background=True)).pid
        await memory.set_timeout(3)
        await disk.set_timeout(3)

        async def memory_paused() -> bool:
            return await _state(memory.sandbox_id) == "paused"

        async def disk_paused() -> bool:
            return await _state(disk.sandbox_id) == "paused"

        memory_was_paused = await wait_until(memory_paused, 40)
        disk_was_paused = await wait_until(disk_paused, 40)
        again = await AsyncSandbox.connect(memory.sandbox_id, timeout=60)
        info = await again.get_info()
        remaining = (info.end_at - datetime.now(UTC)).total_seconds()
        disk_again = await AsyncSandbox.connect(disk.sandbox_id, timeout=60)
        await woken.pause()
        woken_paused = await _state(woken.sandbox_id)
        woken_output = (await woken.commands.run("echo woken")).stdout  # traffic resumes it
        return {
            "lifecycle": dict(lifecycle) if lifecycle else None,
            "memory_paused": memory_was_paused,
            "file": await again.files.read("/home/user/kept.txt"),
            "memory_process_kept": kept_pid in [p.pid for p in await again.commands.list()],
            "remaining_ok": 40 < remaining <= 61,
            "disk_paused": disk_was_paused,
            "disk_process_gone": disk_pid not in [p.pid for p in await disk_again.commands.list()],
            "woken_paused": woken_paused,
            "woken_output": woken_output,
            "woken_state": await _state(woken.sandbox_id),
        }
    finally:
        for sbx in (memory, disk, woken):
            await sbx.kill()


async def _answer(call: Awaitable[Any]) -> Any:
    """What a call gave another owner: its value, or the name of the error it raised."""
    try:
        value = await call
    except SandboxException as exc:
        return type(exc).__name__
    return value if isinstance(value, bool) or value is None else "answered"


@scenario("sandbox/owners-every-operation")
async def _owners_every_operation(work: str) -> dict[str, Any]:
    """Every control-plane operation, tried with another owner's key on this owner's sandbox."""
    other = os.environ["SECOND_API_KEY"]
    sbx = await AsyncSandbox.create(timeout=120)
    snapshot = None
    try:
        snapshot = await sbx.create_snapshot()
        sid = sbx.sandbox_id
        answers = {
            "get_info": await _answer(AsyncSandbox.get_info(sid, api_key=other)),
            "set_timeout": await _answer(AsyncSandbox.set_timeout(sid, 5, api_key=other)),
            "update_network": await _answer(AsyncSandbox.update_network(sid, {"allow_out": []}, api_key=other)),
            "get_metrics": await _answer(AsyncSandbox.get_metrics(sid, api_key=other)),
            "pause": await _answer(AsyncSandbox.pause(sid, api_key=other)),
            "create_snapshot": await _answer(AsyncSandbox.create_snapshot(sid, api_key=other)),
            "connect": await _answer(AsyncSandbox.connect(sid, api_key=other)),
            "kill": await _answer(AsyncSandbox.kill(sid, api_key=other)),
            "delete_snapshot": await _answer(AsyncSandbox.delete_snapshot(snapshot.snapshot_id, api_key=other)),
        }
        listed = [s.sandbox_id for s in await AsyncSandbox.list(api_key=other).next_items()]
        snapshots = [
            s.snapshot_id for s in await AsyncSandbox.list_snapshots(sandbox_id=sid, api_key=other).next_items()
        ]
        own_snapshots = [s.snapshot_id for s in await AsyncSandbox.list_snapshots(sandbox_id=sid).next_items()]
        info = await sbx.get_info()
        return {
            "answers": answers,
            "listed_for_other": sid in listed,
            "snapshots_for_other": snapshots,
            "snapshot_kept": snapshot.snapshot_id in own_snapshots,
            "still_running": info.state.value == "running",
            "timeout_kept": (info.end_at - datetime.now(UTC)).total_seconds() > 60,
        }
    finally:
        await sbx.kill()
        if snapshot is not None:
            await AsyncSandbox.delete_snapshot(snapshot.snapshot_id)


async def _raised(call: Awaitable[Any]) -> str | None:
    try:
        await call
    except SandboxException as exc:
        return type(exc).__name__
    return None


def _envelope(message: dict[str, Any]) -> bytes:
    """One Connect streaming envelope: flags 0, the length, the JSON message."""
    payload = json.dumps(message).encode()
    return bytes([0]) + len(payload).to_bytes(4, "big") + payload


async def _rpc_without_token(target: AsyncSandbox, pid: int, sleeper: int, terminal: int) -> dict[str, int]:
    """The status of each process and watch RPC sent to the sandbox's envd without its token."""
    base = f"https://{target.get_host(49983)}"
    unary = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    stream = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    # Each is aimed at a live process or folder, so that a request let through would act.
    calls: dict[str, dict[str, Any]] = {
        "process.Process/SendInput": {"process": {"pid": pid}, "input": {"stdin": "eAo="}},
        "process.Process/CloseStdin": {"process": {"pid": pid}},
        "process.Process/SendSignal": {"process": {"pid": sleeper}, "signal": "SIGNAL_SIGKILL"},
        "process.Process/Update": {"process": {"pid": terminal}, "pty": {"size": {"cols": 90, "rows": 20}}},
        "filesystem.Filesystem/CreateWatcher": {"path": "/home/user/watched"},
        "filesystem.Filesystem/GetWatcherEvents": {"watcherId": "no-such-watcher"},
        "filesystem.Filesystem/RemoveWatcher": {"watcherId": "no-such-watcher"},
    }
    streams: dict[str, dict[str, Any]] = {
        "process.Process/Connect": {"process": {"pid": pid}},
        "filesystem.Filesystem/WatchDir": {"path": "/home/user/watched"},
    }
    statuses = {}
    async with httpx.AsyncClient(timeout=10) as http:
        for route, body in calls.items():
            answer = await http.post(f"{base}/{route}", json=body, headers=unary)
            statuses[route.rpartition("/")[2]] = answer.status_code
        for route, body in streams.items():
            async with http.stream("POST", f"{base}/{route}", content=_envelope(body), headers=stream) as response:
                statuses[route.rpartition("/")[2]] = response.status_code
    return statuses


async def _rpc_with_token(sbx: AsyncSandbox, cat: Any, sleeper: Any, terminal: Any) -> dict[str, Any]:
    """The same calls through the client, which sends the token: each does what it is for."""
    again = await sbx.commands.connect(cat.pid)
    await sbx.commands.send_stdin(cat.pid, "through the token\n")
    await sbx.commands.close_stdin(cat.pid)
    await sbx.pty.resize(terminal.pid, PtySize(cols=100, rows=30))
    killed = await sbx.commands.kill(sleeper.pid)
    names: list[str] = []
    watcher = await sbx.files.watch_dir("/home/user/watched", lambda event: names.append(event.name))
    await sbx.files.write("/home/user/watched/w.txt", "w")

    async def seen() -> bool:
        return "w.txt" in names

    watched = await wait_until(seen, 10)
    await watcher.stop()
    return {"stdin": (await again.wait()).stdout, "resized": True, "killed": killed, "watched": watched}


@scenario("sandbox/users-and-tokens")
async def _users_and_tokens(work: str) -> dict[str, Any]:
    """Who each request acts as (the user option), and the envd token a secure sandbox demands."""
    sbx = await AsyncSandbox.create(timeout=120, secure=True)
    public = await AsyncSandbox.create(timeout=120, secure=False)
    try:
        files = sbx.files
        as_root: dict[str, Any] = {
            "make_dir": await files.make_dir("/root/made", user="root"),
            "write": (await files.write("/root/made/f.txt", "secret", user="root")).path,
            "read": await files.read("/root/made/f.txt", user="root"),
            "list": [e.name for e in await files.list("/root/made", user="root")],
            "stat": (await files.get_info("/root/made/f.txt", user="root")).size,
            "rename": (await files.rename("/root/made/f.txt", "/root/made/g.txt", user="root")).path,
        }
        as_user = {
            "make_dir": await _raised(files.make_dir("/root/other")),
            "write": await _raised(files.write("/root/made/h.txt", "x")),
            "read": await _raised(files.read("/root/made/g.txt")),
            "list": await _raised(files.list("/root/made")),
            "rename": await _raised(files.rename("/root/made/h.txt", "/root/made/h2.txt")),
            "remove": await _raised(files.remove("/root/made/h2.txt")),
        }
        await files.remove("/root/made/g.txt", user="root")
        as_root["removed"] = not await files.exists("/root/made/g.txt", user="root")
        await files.write("/home/user/mine.txt", "mine")
        await files.write("/tmp/roots.txt", "root's", user="root")
        owners = (await sbx.commands.run("stat -c %U /home/user/mine.txt /tmp/roots.txt")).stdout.split()
        whoami = [(await sbx.commands.run("id -un", user="root")).stdout, (await sbx.commands.run("id -un")).stdout]
        cat = await sbx.commands.run("cat", background=True, stdin=True)
        sleeper = await sbx.commands.run("sleep 600", background=True)
        terminal = await sbx.pty.create(PtySize(cols=80, rows=24), on_data=lambda _: None)
        await files.make_dir("/home/user/watched")
        rpc_without_token = await _rpc_without_token(sbx, cat.pid, sleeper.pid, terminal.pid)
        rpc_with_token = await _rpc_with_token(sbx, cat, sleeper, terminal)

        async def raw(target: AsyncSandbox) -> dict[str, int]:
            base = f"https://{target.get_host(49983)}"
            rpc = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
            async with httpx.AsyncClient(timeout=10) as http:
                return {
                    "download": (await http.get(f"{base}/files", params={"path": "/etc/hostname"})).status_code,
                    "upload": (
                        await http.post(f"{base}/files", params={"path": "/tmp/x"}, files={"file": b"x"})
                    ).status_code,
                    "list": (await http.post(f"{base}/process.Process/List", json={}, headers=rpc)).status_code,
                    "stat": (
                        await http.post(f"{base}/filesystem.Filesystem/Stat", json={"path": "/tmp"}, headers=rpc)
                    ).status_code,
                }

        return {
            "as_root": as_root,
            "as_user": as_user,
            "owners": owners,
            "whoami": whoami,
            "secure_without_token": await raw(sbx),
            "public_without_token": await raw(public),
            "client_version": importlib.metadata.version("e2b"),  # from 2.51 it ignores secure=False
            "rpc_without_token": rpc_without_token,
            "rpc_with_token": rpc_with_token,
        }
    finally:
        await sbx.kill()
        await public.kill()


def _tampered(url: str) -> str:
    """The URL with the last character of its signature changed."""
    parts = urllib.parse.urlsplit(url)
    query = [
        (key, value[:-1] + ("B" if value.endswith("A") else "A") if key == "signature" else value)
        for key, value in urllib.parse.parse_qsl(parts.query)
    ]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def _without_expiration(url: str) -> str:
    """The URL without its signature_expiration (the signature still covers it)."""
    parts = urllib.parse.urlsplit(url)
    query = [(key, value) for key, value in urllib.parse.parse_qsl(parts.query) if key != "signature_expiration"]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


@scenario("sandbox/signed-urls")
async def _signed_urls(work: str) -> dict[str, Any]:
    """A secure sandbox's signed file URLs, fetched without its token: good, tampered and expired ones."""
    sbx = await AsyncSandbox.create(timeout=120, secure=True)
    try:
        path = "/home/user/signed.txt"
        await sbx.files.write(path, "signed content")
        async with httpx.AsyncClient(timeout=10) as http:

            async def get(url: str) -> list[Any]:
                response = await http.get(url)
                return [response.status_code, response.text if response.status_code == 200 else None]

            async def post(url: str, content: bytes) -> int:
                return (await http.post(url, files={"file": ("f.txt", content)})).status_code

            download = sbx.download_url(path)
            expiring = sbx.download_url(path, use_signature_expiration=120)
            upload = sbx.upload_url("/home/user/up.txt")
            upload_expiring = sbx.upload_url("/home/user/up-expiring.txt", use_signature_expiration=120)
            result: dict[str, Any] = {
                "has_signature": "signature=" in download and "signature_expiration=" in expiring,
                "download": await get(download),
                "download_tampered": (await get(_tampered(download)))[0],
                "download_expiring": await get(expiring),
                "download_expired": (await get(sbx.download_url(path, use_signature_expiration=-30)))[0],
                "download_expiration_dropped": (await get(_without_expiration(expiring)))[0],
            }
            result["upload"] = await post(upload, b"uploaded")
            tampered = _tampered(sbx.upload_url("/home/user/up-tampered.txt"))
            result["upload_tampered"] = await post(tampered, b"x")
            result["upload_expiring"] = await post(upload_expiring, b"uploaded before expiry")
            late = sbx.upload_url("/home/user/up-late.txt", use_signature_expiration=-30)
            result["upload_expired"] = await post(late, b"x")
            result["upload_read_signature"] = await post(sbx.download_url("/home/user/up-read.txt"), b"x")
        uploaded: dict[str, str | None] = {}
        for name in ("up.txt", "up-expiring.txt", "up-tampered.txt", "up-late.txt", "up-read.txt"):
            target = f"/home/user/{name}"
            uploaded[name] = await sbx.files.read(target) if await sbx.files.exists(target) else None
        result["uploaded"] = uploaded
        return result
    finally:
        await sbx.kill()


def _template_context(work: str) -> str:
    context = Path(work) / "template-context"
    context.mkdir(parents=True, exist_ok=True)
    (context / "copied.txt").write_text("copied file\n")
    return str(context)


TEMPLATE_PROBE = (
    "cat copied.txt built.txt; echo $TPL_VAR; pwd; whoami; curl -s -o /dev/null -w %{http_code} 127.0.0.1:8000"
)


async def _finished(info: Any) -> tuple[str, int]:
    """Poll a background build as its users do, reading the logs as they come; (status, log count)."""
    offset = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = await AsyncTemplate.get_build_status(info, logs_offset=offset)
        offset += len(status.log_entries)
        if status.status in (TemplateBuildStatus.READY, TemplateBuildStatus.ERROR):
            return status.status.value, offset
        await asyncio.sleep(0.2)
    return "timeout", offset


@scenario("sandbox/template-build")
async def _template_build(work: str) -> dict[str, Any]:
    name = f"conf-{uuid.uuid4().hex[:12]}"
    template = (
        AsyncTemplate(file_context_path=_template_context(work))
        .from_base_image()
        .set_workdir("/home/user/app")
        .copy("copied.txt", "./")
        .set_envs({"TPL_VAR": "from-template"})
        .run_cmd("echo built > built.txt")
        .set_start_cmd("python3 -m http.server 8000 --bind 127.0.0.1", wait_for_port(8000))
    )
    result: dict[str, Any] = {}
    info = await AsyncTemplate.build_in_background(template, name, tags=["t1"], cpu_count=1, memory_mb=512)
    try:
        status, logs = await _finished(info)
        result["build_tags"] = info.tags if status == "ready" else [status]
        result["logs_read"] = logs > 0
        result["exists"] = [await AsyncTemplate.exists(name), await AsyncTemplate.exists(name + "-missing")]
        sbx = await AsyncSandbox.create(f"{name}:t1", timeout=120)
        try:
            result["probe"] = (await sbx.commands.run(TEMPLATE_PROBE)).stdout.split()
            result["template_id"] = (await sbx.get_info()).template_id == info.template_id
        finally:
            await sbx.kill()
        child = AsyncTemplate().from_template(f"{name}:t1").run_cmd("echo child > child.txt")
        await AsyncTemplate.build(child, name + "-child", cpu_count=1, memory_mb=512)
        sbx = await AsyncSandbox.create(name + "-child", timeout=120)
        try:
            result["child"] = (await sbx.commands.run("cat built.txt child.txt; pwd")).stdout.split()
        finally:
            await sbx.kill()
        second = os.environ["SECOND_API_KEY"]  # another owner sees none of it
        result["other_exists"] = await AsyncTemplate.exists(name, api_key=second)
        try:
            await (await AsyncSandbox.create(f"{name}:t1", timeout=60, api_key=second)).kill()
            result["other_create"] = "created"
        except SandboxException as exc:
            result["other_create"] = str(exc)[:3]
        try:
            await AsyncTemplate.get_tags(name, api_key=second)
            result["other_tags"] = "listed"
        except Exception as exc:  # noqa: BLE001 - the client's error for a 404, whatever its class
            result["other_tags"] = str(exc)[:3]
        result["assigned"] = (await AsyncTemplate.assign_tags(f"{name}:t1", ["t2"])).tags
        result["tags"] = sorted(tag.tag for tag in await AsyncTemplate.get_tags(name))
        await AsyncTemplate.remove_tags(name, ["t1"])
        result["tags_after"] = sorted(tag.tag for tag in await AsyncTemplate.get_tags(name))
        try:
            broken = AsyncTemplate().from_base_image().run_cmd("echo step-output; exit 4")
            await AsyncTemplate.build(broken, name + "-broken")
            result["failure"] = "built"
        except BuildException as exc:
            result["failure"] = str(exc)
        result["deleted"] = await AsyncSandbox.delete_snapshot(info.template_id)
        try:
            await (await AsyncSandbox.create(f"{name}:t2", timeout=60)).kill()
            result["after_delete"] = "created"
        except SandboxException as exc:  # a create's 404 is the client's generic error
            result["after_delete"] = str(exc)[:3]
        return result
    finally:
        for leftover in (name + "-child", info.template_id, name + "-broken"):
            await AsyncSandbox.delete_snapshot(leftover)


IMAGE_PROBE = "cat /home/user/built.txt; echo $IMAGE_VAR; echo /opt/old/*; whoami; test -e /etc/motd || echo no-motd"


@scenario("sandbox/template-image")
async def _template_image(work: str) -> dict[str, Any]:
    # The harness's registry (IMAGE_*): a private image, its layers' whiteouts, its environment.
    image, username, password = os.environ["IMAGE_REF"], os.environ["IMAGE_USERNAME"], os.environ["IMAGE_PASSWORD"]
    name = f"conf-image-{uuid.uuid4().hex[:12]}"
    template = AsyncTemplate().from_image(image, username=username, password=password).run_cmd("echo built > built.txt")
    result: dict[str, Any] = {}
    info = await AsyncTemplate.build_in_background(template, name, cpu_count=1, memory_mb=512)
    try:
        status, _logs = await _finished(info)
        result["status"] = status
        sbx = await AsyncSandbox.create(name, timeout=120)
        try:
            result["probe"] = (await sbx.commands.run(IMAGE_PROBE)).stdout.split()
        finally:
            await sbx.kill()
        wrong = AsyncTemplate().from_image(image, username=username, password="not-" + password)
        try:
            await AsyncTemplate.build(wrong, name + "-denied")
            result["denied"] = "built"
        except BuildException as exc:
            result["denied"] = str(exc)
        result["password_shown"] = password in result["denied"]
        return result
    finally:
        for leftover in (info.template_id, name + "-denied"):
            await AsyncSandbox.delete_snapshot(leftover)


def main() -> None:
    name, work = sys.argv[1], sys.argv[2]
    trace(name, "start")
    result = asyncio.run(run(name, work))
    trace(name, "done")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
