"""Control-plane scenarios for the official Python client (sync flavour) against the reference server.

Run by the pinned client's own interpreter (``python -I py_sync.py <scenario> <workdir>``) with
only ``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE`` and ``NODE_EXTRA_CA_CERTS`` set (plus
``SECOND_API_KEY``, another owner's key, passed explicitly where a scenario needs it). Each
scenario makes its own sandboxes, kills them in ``finally`` and prints one JSON object.
"""

from __future__ import annotations

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from e2b import (
    AuthenticationException,
    BuildException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    Template,
    Volume,
    wait_for_port,
)
from e2b.sandbox.commands.command_handle import PtySize

SCENARIOS: dict[str, Callable[[str], dict[str, Any]]] = {}


def scenario(name: str) -> Callable[[Callable[[str], dict[str, Any]]], Callable[[str], dict[str, Any]]]:
    def register(fn: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
        SCENARIOS[name] = fn
        return fn

    return register


def trace(name: str, stage: str) -> None:
    print(f"py-sync:{name}:{stage}", file=sys.stderr, flush=True)


def wait_until(check: Callable[[], bool], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


@scenario("sandbox/create-env-metadata")
def _create(work: str) -> dict[str, Any]:
    sbx = Sandbox.create(envs={"FROM_CREATE": "yes"}, metadata={"case": "create", "n": "1"}, timeout=120)
    try:
        info = sbx.get_info()
        run = sbx.commands.run("echo $FROM_CREATE; whoami; pwd")
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
        sbx.kill()


@scenario("sandbox/get-host")
def _get_host(work: str) -> dict[str, Any]:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/site/index.html", "hello from inside")
        sbx.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
        host = sbx.get_host(8000)
        body = ""

        def served() -> bool:
            nonlocal body
            try:
                response = httpx.get(f"https://{host}/index.html", timeout=5)
            except httpx.HTTPError:
                return False
            body = response.text
            return response.status_code == 200

        ok = wait_until(served)
        return {"host": host, "ok": ok, "body": body}
    finally:
        sbx.kill()


@scenario("sandbox/list-filter-paginate")
def _list(work: str) -> dict[str, Any]:
    suite = uuid.uuid4().hex[:12]
    made = [Sandbox.create(metadata={"suite": suite, "i": str(i)}, timeout=120) for i in range(3)]
    decoy = None
    try:
        # The same owner's sandbox of another suite (sharing "i": "0" with the first): the filter leaves it out.
        decoy = Sandbox.create(metadata={"suite": f"{suite}-decoy", "i": "0"}, timeout=120)
        paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": suite}), limit=2)
        pages, seen = 0, []
        while paginator.has_next:
            items = paginator.next_items()
            pages += 1
            seen += [item.sandbox_id for item in items]
        # The same query paged by one, by two and not at all: pages of one show the cursor's order.
        walks: dict[str, list[list[str]]] = {}
        for name, limit in (("1", 1), ("2", 2), ("default", None)):
            query = SandboxQuery(metadata={"suite": suite})
            walk = Sandbox.list(query=query) if limit is None else Sandbox.list(query=query, limit=limit)
            walks[name] = []
            while walk.has_next:
                walks[name].append([item.sandbox_id for item in walk.next_items()])
        made[0].pause()
        paused = Sandbox.list(query=SandboxQuery(metadata={"suite": suite}, state=[SandboxState.PAUSED])).next_items()
        running = Sandbox.list(query=SandboxQuery(metadata={"suite": suite}, state=[SandboxState.RUNNING])).next_items()
        return {
            "suite": suite,
            "made": [s.sandbox_id for s in made],
            "decoy": decoy.sandbox_id,
            "walks": walks,
            "pages": pages,
            "all_found": sorted(seen) == sorted(s.sandbox_id for s in made),
            "paused": [s.sandbox_id for s in paused] == [made[0].sandbox_id],
            "paused_state": [s.state.value for s in paused],
            "running": sorted(s.sandbox_id for s in running) == sorted(s.sandbox_id for s in made[1:]),
        }
    finally:
        for sbx in made:
            sbx.kill()
        if decoy is not None:
            decoy.kill()


@scenario("sandbox/list-order")
def _list_order(work: str) -> dict[str, Any]:
    """The list's order, startedAfter and template (clients from 2.50), each walked a page of one at a time."""
    suite = uuid.uuid4().hex[:12]
    made: list[Sandbox] = []
    try:
        for i in range(3):
            made.append(Sandbox.create(metadata={"suite": suite, "i": str(i)}, timeout=120))

        def walk(order: str | None = None, **query: Any) -> list[str]:
            asked = SandboxQuery(metadata={"suite": suite}, **query)
            paginator = Sandbox.list(query=asked, limit=1, **({"order": order} if order else {}))
            seen: list[str] = []
            while paginator.has_next:
                seen += [item.sandbox_id for item in paginator.next_items()]
            return seen

        return {
            "made": [s.sandbox_id for s in made],
            "asc": walk("asc"),
            "desc": walk("desc"),
            "default": walk(),
            "started_after": walk("asc", started_after=made[1].get_info().started_at),
            "template": walk("asc", template="base"),
            "other_template": walk(template="no-such-template-e2b"),
        }
    finally:
        for sbx in made:
            sbx.kill()


@scenario("sandbox/sudo")
def _sudo(work: str) -> dict[str, Any]:
    """The default user's ``sudo`` (a setuid program) in a sandbox of the default template: root through it."""
    sbx = Sandbox.create(timeout=120)
    try:
        try:
            result = sbx.commands.run("sudo -n id -un && id -un")
        except CommandExitException as exc:
            return {"stdout": exc.stdout, "stderr": exc.stderr, "exit_code": exc.exit_code}
        return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}
    finally:
        sbx.kill()


@scenario("sandbox/fork")
def _fork(work: str) -> dict[str, Any]:
    """fork(count=2) (clients from 2.34): each fork goes on with the source's processes, memory and files."""
    suite = uuid.uuid4().hex[:12]
    sbx = Sandbox.create(timeout=120, metadata={"suite": suite}, envs={"FORK_ENV": "inherited"})
    made: list[Sandbox] = []
    try:
        sbx.commands.run(FORK_SETUP)
        try:
            forks = sbx.fork(count=2)
        except Exception as exc:  # noqa: BLE001 -- a refusal is the result (its message has the status)
            return {"raised": type(exc).__name__, "message": str(exc)}
        outcome: dict[str, Any] = {"raised": None, "source": sbx.sandbox_id, "forks": []}
        for fork in forks:
            if not isinstance(fork, Sandbox):
                outcome["forks"].append({"error": f"{type(fork).__name__}: {fork}"})
                continue
            made.append(fork)
            stdout = fork.commands.run(FORK_CHECK).stdout
            outcome["forks"].append({"id": fork.sandbox_id, "stdout": stdout, "metadata": fork.get_info().metadata})
        outcome["source_runs"] = sbx.commands.run(FORK_ALIVE).stdout
        outcome["listed"] = len(Sandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items())
        return outcome
    finally:
        for fork in made:
            fork.kill()
        sbx.kill()


# A fork's check: a background loop started before the fork (its pid in the tmpfs /tmp, so in
# memory), a tmpfs file, a disk file, and the fork's own id beside the source's environment.
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
def _mcp(work: str) -> dict[str, Any]:
    """create(mcp=...) with a github server whose repository a first sandbox put in a volume; MCP spoken over HTTP."""
    suite = uuid.uuid4().hex[:12]
    vol = Volume.create(f"mcp-{suite}")
    made: list[Sandbox] = []
    try:
        helper = Sandbox.create(volume_mounts={"/mnt/mirror": vol}, timeout=120)
        made.append(helper)
        helper.files.write("/tmp/echo/server.py", MCP_ECHO, user="root")  # git as root wants its own files
        helper.commands.run(MCP_MIRROR, user="root")
        helper.kill()
        sbx = Sandbox.create(mcp=MCP_CONFIG, envs=MCP_GIT_ENVS, volume_mounts={"/mnt/mirror": vol.name}, timeout=120)
        made.append(sbx)
        url, token = sbx.get_mcp_url(), sbx.get_mcp_token()
        read_back = Sandbox.connect(sbx.sandbox_id).get_mcp_token()
        ca = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        with httpx.Client(verify=ca, timeout=60) as http:
            ping = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
            refused = [
                http.post(url, json=ping, headers={**MCP_ACCEPT, **extra}).status_code
                for extra in ({}, {"Authorization": "Bearer wrong"})
            ]
            auth = {**MCP_ACCEPT, "Authorization": f"Bearer {token}"}
            hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}
            started = http.post(
                url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=auth
            )
            session = started.headers.get("mcp-session-id")
            auth = {**auth, "Mcp-Protocol-Version": "2025-06-18", **({"Mcp-Session-Id": session} if session else {})}
            http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=auth)
            tools = mcp_answer(http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=auth))
            call = {"name": "echo", "arguments": {"text": "hello"}}
            called = http.post(
                url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call}, headers=auth
            )
        return {
            "url": url,
            "host": sbx.get_host(50005),
            "token_read_back": token is not None and read_back == token,
            "refused": refused,
            "server": (mcp_answer(started) or {}).get("result", {}).get("serverInfo", {}).get("name"),
            "session": session is not None,
            "tools": sorted(tool["name"] for tool in (tools or {}).get("result", {}).get("tools", [])),
            "echo": [c.get("text") for c in (mcp_answer(called) or {}).get("result", {}).get("content", [])],
        }
    finally:
        for sandbox in made:
            with contextlib.suppress(Exception):  # the helper is killed early
                sandbox.kill()
        Volume.destroy(vol.volume_id)


@scenario("sandbox/idempotent-create")
def _idempotent_create(work: str) -> dict[str, Any]:
    """A create repeated with one Idempotency-Key (clients from 2.61) is one sandbox."""
    suite = uuid.uuid4().hex[:12]
    key = f"conformance-{suite}"
    first = Sandbox.create(timeout=120, metadata={"suite": suite}, idempotency_key=key)
    made = [first]
    try:
        again = Sandbox.create(timeout=120, metadata={"suite": suite}, idempotency_key=key)
        made.append(again)
        try:
            other = Sandbox.create(timeout=120, metadata={"suite": f"{suite}-other"}, idempotency_key=key)
            made.append(other)
            other_body = {"raised": None, "same": other.sandbox_id == first.sandbox_id}
        except Exception as exc:  # noqa: BLE001 -- the refusal is the result
            other_body = {"raised": type(exc).__name__, "message": str(exc)}
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items()
        return {
            "same": again.sandbox_id == first.sandbox_id,
            "runs": again.commands.run("echo ok").stdout,
            "listed": [s.sandbox_id for s in listed] == [first.sandbox_id],
            "other_body": other_body,
        }
    finally:
        for sbx in {s.sandbox_id: s for s in made}.values():
            sbx.kill()


@scenario("sandbox/timeout")
def _timeout(work: str) -> dict[str, Any]:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.set_timeout(2)
        gone = wait_until(lambda: not sbx.is_running(), 30)
        try:
            sbx.get_info()
            info_error = None
        except NotFoundException as exc:
            info_error = type(exc).__name__
        return {"gone": gone, "info_error": info_error}
    finally:
        sbx.kill()


@scenario("sandbox/pause-memory-connect")
def _pause_memory(work: str) -> dict[str, Any]:
    sbx = Sandbox.create(timeout=120)
    try:
        handle = sbx.commands.run("while true; do date +%s%N > /tmp/tick; sleep 0.1; done", background=True)
        first = sbx.pause()
        second = sbx.pause()
        listed = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()]
        state = Sandbox.get_info(sbx.sandbox_id).state.value
        again = Sandbox.connect(sbx.sandbox_id, timeout=120)
        pids = [p.pid for p in again.commands.list()]
        before = again.files.read("/tmp/tick")
        ticking = wait_until(lambda: again.files.read("/tmp/tick") != before, 10)
        return {
            "first": first,
            "second": second,
            "listed_paused": sbx.sandbox_id in listed,
            "state": state,
            "process_survived": handle.pid in pids,
            "still_ticking": ticking,
            "running_after": again.is_running(),
        }
    finally:
        sbx.kill()


@scenario("sandbox/pause-filesystem-connect")
def _pause_filesystem(work: str) -> dict[str, Any]:
    sbx = Sandbox.create(envs={"KEEP": "env"}, timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "kept across the pause")
        handle = sbx.commands.run("sleep 600", background=True)
        paused = sbx.pause(keep_memory=False)
        again = Sandbox.connect(sbx.sandbox_id, timeout=120)
        return {
            "paused": paused,
            "file": again.files.read("/home/user/kept.txt"),
            "process_gone": handle.pid not in [p.pid for p in again.commands.list()],
            "env": again.commands.run("echo $KEEP").stdout,
        }
    finally:
        sbx.kill()


@scenario("sandbox/connect-reboot")
def _connect_reboot(work: str) -> dict[str, Any]:
    """connect(on_resume="reboot") of a sandbox paused with its memory: a fresh boot from its files."""
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "kept across the reboot")
        handle = sbx.commands.run("sleep 600", background=True)
        sbx.commands.run("echo in-memory > /dev/shm/mark")  # a tmpfs: only a memory restore keeps it
        paused = sbx.pause()
        again = Sandbox.connect(sbx.sandbox_id, timeout=120, on_resume="reboot")
        return {
            "paused": paused,
            "file": again.files.read("/home/user/kept.txt"),
            "process_gone": handle.pid not in [p.pid for p in again.commands.list()],
            "shm": again.commands.run("cat /dev/shm/mark 2>/dev/null || echo gone").stdout,
            "running": again.is_running(),
        }
    finally:
        sbx.kill()


def _snapshot_pages(paginator: Any) -> list[list[str]]:
    """A snapshot list's pages, at most five: a cursor the server ignores would page forever."""
    pages: list[list[str]] = []
    while paginator.has_next and len(pages) < 5:
        pages.append([s.snapshot_id for s in paginator.next_items()])
    return pages


@scenario("sandbox/snapshot-restore")
def _snapshot(work: str) -> dict[str, Any]:
    source = Sandbox.create(timeout=120)
    other = Sandbox.create(timeout=120)
    restored = None
    snapshot_id = None
    taken: list[str] = []
    try:
        source.files.write("/home/user/snap.txt", "snapshot content")
        snapshot = source.create_snapshot()
        snapshot_id = snapshot.snapshot_id
        taken.append(snapshot_id)
        name = f"named-{uuid.uuid4().hex[:12]}"
        named = source.create_snapshot(name=name)
        taken.append(named.snapshot_id)
        theirs = other.create_snapshot()  # another sandbox's: the sandbox filter leaves it out
        taken.append(theirs.snapshot_id)
        listed_items = Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()
        listed = [s.snapshot_id for s in listed_items]
        listed_other = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=other.sandbox_id).next_items()]
        pages = _snapshot_pages(Sandbox.list_snapshots(sandbox_id=source.sandbox_id, limit=1))
        source_running = source.is_running()
        source.kill()
        restored = Sandbox.create(snapshot_id, timeout=120)
        content = restored.files.read("/home/user/snap.txt")
        restored.files.write("/home/user/snap.txt", "changed")
        try:
            Sandbox.delete_snapshot(snapshot_id)
            in_use = "deleted while in use"
        except SandboxException as exc:
            in_use = str(exc)[:3]
        restored.kill()
        return {
            "listed": snapshot_id in listed,
            "names": snapshot.names,
            "source_running": source_running,
            "content": content,
            "in_use": in_use,
            "deleted": Sandbox.delete_snapshot(snapshot_id),
            "deleted_again": Sandbox.delete_snapshot(snapshot_id),
            "name": name,
            "named_names": named.names,
            "listed_names": {s.snapshot_id: s.names for s in listed_items},
            "source_snapshots": [snapshot_id, named.snapshot_id],
            "other_snapshot": theirs.snapshot_id,
            "listed_source": listed,
            "listed_other": listed_other,
            "pages": pages,
        }
    finally:
        source.kill()
        other.kill()
        if restored is not None:
            restored.kill()
        for taken_id in taken[1:]:
            Sandbox.delete_snapshot(taken_id)


def _metrics_window(stamps: list[float]) -> list[int] | None:
    """Whole seconds around a sample between two others, which the window leaves out (None: no such sample yet)."""
    for before, sample, after in zip(stamps, stamps[1:], stamps[2:], strict=False):
        start, end = math.floor(sample), math.ceil(sample)
        if before < start and after > end:
            return [start, end]
    return None


@scenario("sandbox/metrics")
def _metrics(work: str) -> dict[str, Any]:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("head -c 20000000 /dev/urandom | sha256sum")
        metrics: list[Any] = []

        def sampled() -> bool:
            nonlocal metrics
            metrics = sbx.get_metrics()
            return _metrics_window([m.timestamp.timestamp() for m in metrics]) is not None

        wait_until(sampled, 40)
        first = metrics[0] if metrics else None
        series = [m.timestamp.timestamp() for m in metrics]
        window = _metrics_window(series) or [0, 0]  # a window that leaves out the first and last samples
        start, end = (datetime.fromtimestamp(t, UTC) for t in window)
        windowed = [m.timestamp.timestamp() for m in sbx.get_metrics(start=start, end=end)]
        started = sbx.get_info().started_at.timestamp()
        before = sbx.get_metrics(
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
        sbx.kill()


@scenario("sandbox/kill-is-running")
def _kill(work: str) -> dict[str, Any]:
    sbx = Sandbox.create(timeout=120)
    running = sbx.is_running()
    killed = sbx.kill()
    try:
        Sandbox.connect(sbx.sandbox_id)
        connect_error = None
    except NotFoundException as exc:
        connect_error = type(exc).__name__
    return {
        "running": running,
        "killed": killed,
        "running_after": sbx.is_running(),
        "killed_again": Sandbox.kill(sbx.sandbox_id),
        "connect_error": connect_error,
    }


@scenario("sandbox/other-owner")
def _other_owner(work: str) -> dict[str, Any]:
    second = os.environ["SECOND_API_KEY"]
    sbx = Sandbox.create(metadata={"owner-test": "yes"}, timeout=120)
    try:
        theirs = [s.sandbox_id for s in Sandbox.list(api_key=second).next_items()]
        try:
            Sandbox.connect(sbx.sandbox_id, api_key=second)
            connect_error = None
        except NotFoundException as exc:
            connect_error = type(exc).__name__
        return {
            "listed_for_other": sbx.sandbox_id in theirs,
            "connect_error": connect_error,
            "other_kill": Sandbox.kill(sbx.sandbox_id, api_key=second),
            "still_running": sbx.is_running(),
        }
    finally:
        sbx.kill()


BURST = 32  # parallel creates, half for each owner

# Who answers: the runtime's hostname and id, the marker from the create's environment, the upload.
IDENTITY = (
    'printf "%s|%s|%s|%s" "$(hostname)" "$E2B_COMPAT_MARKER" "$E2B_SANDBOX_ID" "$(cat /tmp/identity 2>/dev/null)"'
)


@scenario("sandbox/parallel-creates")
def _parallel_creates(work: str) -> dict[str, Any]:
    """A burst of creates from two owners at once; each sandbox says who it is through every path."""
    keys = {"first": os.environ["E2B_API_KEY"], "second": os.environ["SECOND_API_KEY"]}
    made: list[Sandbox] = []

    def one(n: int) -> dict[str, Any]:
        owner = "first" if n % 2 == 0 else "second"
        marker = uuid.uuid4().hex
        sbx = Sandbox.create(envs={"E2B_COMPAT_MARKER": marker}, metadata={"marker": marker}, api_key=keys[owner])
        made.append(sbx)
        found: dict[str, Any] = {"owner": owner, "id": sbx.sandbox_id, "marker": marker}
        try:  # a request that reached another sandbox may fail there: that is an answer too
            sbx.files.write("/tmp/identity", marker)
            hostname, env_marker, env_id, file_marker = sbx.commands.run(IDENTITY).stdout.split("|")
            found["seen"] = {
                "hostname": hostname,
                "env_marker": env_marker,
                "env_id": env_id,
                "file_marker": file_marker,
                "read_marker": sbx.files.read("/tmp/identity"),
                "metadata_marker": sbx.get_info().metadata.get("marker"),
            }
        except (SandboxException, AuthenticationException) as exc:
            found["error"] = f"{type(exc).__name__}: {exc}"
        return found

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        try:
            return {"sandboxes": list(pool.map(one, range(BURST)))}
        finally:  # all at once, as the async and JS flavours do: one by one is the slowest part on a slow backend
            list(pool.map(lambda sbx: sbx.kill(), list(made)))


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
def _network_settings(work: str) -> dict[str, Any]:
    """Network options at create and update: what get_info reports, and what a server inside sees."""
    sbx = Sandbox.create(
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
        created = _network_view(sbx.get_info())
        sbx.files.write("/home/user/echo.py", HEADER_ECHO)
        sbx.commands.run("python3 /home/user/echo.py", background=True)
        url = f"https://{sbx.get_host(8001)}/"
        seen = ""

        def served() -> bool:
            nonlocal seen
            try:
                response = httpx.get(url, headers={"E2B-Traffic-Access-Token": sbx.traffic_access_token}, timeout=5)
            except httpx.HTTPError:
                return False
            seen = response.text
            return response.status_code == 200

        ok = wait_until(served)
        without_token = httpx.get(url, timeout=5).status_code
        sbx.update_network({"allow_out": ["10.93.0.0/16"], "allow_internet_access": True})
        updated = _network_view(sbx.get_info())
        headers = dict(line.split(": ", 1) for line in seen.splitlines() if ": " in line)
        return {
            "created": created,
            "served": ok,
            "headers": headers,
            "without_token": without_token,
            "updated": updated,
        }
    finally:
        sbx.kill()


def _state(sandbox_id: str) -> str:
    return str(Sandbox.get_info(sandbox_id).state.value)


@scenario("sandbox/lifecycle-on-timeout")
def _on_timeout(work: str) -> dict[str, Any]:
    """on_timeout "pause" (with and without memory), auto_resume, and connect's new timeout."""
    # Created with room for the set-up (a slow backend's create takes seconds), then given a short timeout:
    # the timer set_timeout re-arms still carries the lifecycle chosen at create.
    memory = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": False})
    disk = Sandbox.create(timeout=60, lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}})
    woken = Sandbox.create(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        lifecycle = memory.get_info().lifecycle
        memory.files.write("/home/user/kept.txt", "kept")
        kept_pid = memory.commands.run("sleep 600", background=True).pid
        disk_pid = disk.commands.run("sleep 600", background=True).pid
        memory.set_timeout(3)
        disk.set_timeout(3)
        memory_paused = wait_until(lambda: _state(memory.sandbox_id) == "paused", 40)
        disk_paused = wait_until(lambda: _state(disk.sandbox_id) == "paused", 40)
        again = Sandbox.connect(memory.sandbox_id, timeout=60)
        info = again.get_info()
        remaining = (info.end_at - datetime.now(UTC)).total_seconds()
        disk_again = Sandbox.connect(disk.sandbox_id, timeout=60)
        woken.pause()
        woken_paused = _state(woken.sandbox_id)
        woken_output = woken.commands.run("echo woken").stdout  # traffic resumes it
        return {
            "lifecycle": dict(lifecycle) if lifecycle else None,
            "memory_paused": memory_paused,
            "file": again.files.read("/home/user/kept.txt"),
            "memory_process_kept": kept_pid in [p.pid for p in again.commands.list()],
            "remaining_ok": 40 < remaining <= 61,
            "disk_paused": disk_paused,
            "disk_process_gone": disk_pid not in [p.pid for p in disk_again.commands.list()],
            "woken_paused": woken_paused,
            "woken_output": woken_output,
            "woken_state": _state(woken.sandbox_id),
        }
    finally:
        for sbx in (memory, disk, woken):
            sbx.kill()


def _answer(call: Callable[[], Any]) -> Any:
    """What a call gave another owner: its value, or the name of the error it raised."""
    try:
        value = call()
    except SandboxException as exc:
        return type(exc).__name__
    return value if isinstance(value, bool) or value is None else "answered"


@scenario("sandbox/owners-every-operation")
def _owners_every_operation(work: str) -> dict[str, Any]:
    """Every control-plane operation, tried with another owner's key on this owner's sandbox."""
    other = os.environ["SECOND_API_KEY"]
    sbx = Sandbox.create(timeout=120)
    snapshot = None
    try:
        snapshot = sbx.create_snapshot()
        sid = sbx.sandbox_id
        answers = {
            "get_info": _answer(lambda: Sandbox.get_info(sid, api_key=other)),
            "set_timeout": _answer(lambda: Sandbox.set_timeout(sid, 5, api_key=other)),
            "update_network": _answer(lambda: Sandbox.update_network(sid, {"allow_out": []}, api_key=other)),
            "get_metrics": _answer(lambda: Sandbox.get_metrics(sid, api_key=other)),
            "pause": _answer(lambda: Sandbox.pause(sid, api_key=other)),
            "create_snapshot": _answer(lambda: Sandbox.create_snapshot(sid, api_key=other)),
            "connect": _answer(lambda: Sandbox.connect(sid, api_key=other)),
            "kill": _answer(lambda: Sandbox.kill(sid, api_key=other)),
            "delete_snapshot": _answer(lambda: Sandbox.delete_snapshot(snapshot.snapshot_id, api_key=other)),
        }
        listed = [s.sandbox_id for s in Sandbox.list(api_key=other).next_items()]
        snapshots = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sid, api_key=other).next_items()]
        own_snapshots = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sid).next_items()]
        info = sbx.get_info()
        return {
            "answers": answers,
            "listed_for_other": sid in listed,
            "snapshots_for_other": snapshots,
            "snapshot_kept": snapshot.snapshot_id in own_snapshots,
            "still_running": info.state.value == "running",
            "timeout_kept": (info.end_at - datetime.now(UTC)).total_seconds() > 60,
        }
    finally:
        sbx.kill()
        if snapshot is not None:
            Sandbox.delete_snapshot(snapshot.snapshot_id)


def _raised(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except SandboxException as exc:
        return type(exc).__name__
    return None


def _envelope(message: dict[str, Any]) -> bytes:
    """One Connect streaming envelope: flags 0, the length, the JSON message."""
    payload = json.dumps(message).encode()
    return bytes([0]) + len(payload).to_bytes(4, "big") + payload


def _rpc_without_token(target: Sandbox, pid: int, sleeper: int, terminal: int) -> dict[str, int]:
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
    with httpx.Client(timeout=10) as http:
        for route, body in calls.items():
            statuses[route.rpartition("/")[2]] = http.post(f"{base}/{route}", json=body, headers=unary).status_code
        for route, body in streams.items():
            with http.stream("POST", f"{base}/{route}", content=_envelope(body), headers=stream) as response:
                statuses[route.rpartition("/")[2]] = response.status_code
    return statuses


def _rpc_with_token(sbx: Sandbox, cat: Any, sleeper: Any, terminal: Any) -> dict[str, Any]:
    """The same calls through the client, which sends the token: each does what it is for."""
    again = sbx.commands.connect(cat.pid)
    sbx.commands.send_stdin(cat.pid, "through the token\n")
    sbx.commands.close_stdin(cat.pid)
    sbx.pty.resize(terminal.pid, PtySize(cols=100, rows=30))
    killed = sbx.commands.kill(sleeper.pid)
    watcher = sbx.files.watch_dir("/home/user/watched")
    sbx.files.write("/home/user/watched/w.txt", "w")
    names: list[str] = []

    def seen() -> bool:
        names.extend(event.name for event in watcher.get_new_events())
        return "w.txt" in names

    watched = wait_until(seen, 10)
    watcher.stop()
    return {"stdin": again.wait().stdout, "resized": True, "killed": killed, "watched": watched}


@scenario("sandbox/users-and-tokens")
def _users_and_tokens(work: str) -> dict[str, Any]:
    """Who each request acts as (the user option), and the envd token a secure sandbox demands."""
    sbx = Sandbox.create(timeout=120, secure=True)
    public = Sandbox.create(timeout=120, secure=False)
    try:
        files = sbx.files
        as_root: dict[str, Any] = {
            "make_dir": files.make_dir("/root/made", user="root"),
            "write": files.write("/root/made/f.txt", "secret", user="root").path,
            "read": files.read("/root/made/f.txt", user="root"),
            "list": [e.name for e in files.list("/root/made", user="root")],
            "stat": files.get_info("/root/made/f.txt", user="root").size,
            "rename": files.rename("/root/made/f.txt", "/root/made/g.txt", user="root").path,
        }
        as_user = {
            "make_dir": _raised(lambda: files.make_dir("/root/other")),
            "write": _raised(lambda: files.write("/root/made/h.txt", "x")),
            "read": _raised(lambda: files.read("/root/made/g.txt")),
            "list": _raised(lambda: files.list("/root/made")),
            "rename": _raised(lambda: files.rename("/root/made/h.txt", "/root/made/h2.txt")),
            "remove": _raised(lambda: files.remove("/root/made/h2.txt")),
        }
        files.remove("/root/made/g.txt", user="root")
        as_root["removed"] = not files.exists("/root/made/g.txt", user="root")
        files.write("/home/user/mine.txt", "mine")
        files.write("/tmp/roots.txt", "root's", user="root")
        owners = sbx.commands.run("stat -c %U /home/user/mine.txt /tmp/roots.txt").stdout.split()
        whoami = [sbx.commands.run("id -un", user="root").stdout, sbx.commands.run("id -un").stdout]
        cat = sbx.commands.run("cat", background=True, stdin=True)
        sleeper = sbx.commands.run("sleep 600", background=True)
        terminal = sbx.pty.create(PtySize(cols=80, rows=24))
        files.make_dir("/home/user/watched")
        rpc_without_token = _rpc_without_token(sbx, cat.pid, sleeper.pid, terminal.pid)
        rpc_with_token = _rpc_with_token(sbx, cat, sleeper, terminal)

        def raw(target: Sandbox) -> dict[str, int]:
            base = f"https://{target.get_host(49983)}"
            rpc = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
            return {
                "download": httpx.get(f"{base}/files", params={"path": "/etc/hostname"}, timeout=10).status_code,
                "upload": httpx.post(
                    f"{base}/files", params={"path": "/tmp/x"}, files={"file": b"x"}, timeout=10
                ).status_code,
                "list": httpx.post(f"{base}/process.Process/List", json={}, headers=rpc, timeout=10).status_code,
                "stat": httpx.post(
                    f"{base}/filesystem.Filesystem/Stat", json={"path": "/tmp"}, headers=rpc, timeout=10
                ).status_code,
            }

        return {
            "as_root": as_root,
            "as_user": as_user,
            "owners": owners,
            "whoami": whoami,
            "secure_without_token": raw(sbx),
            "public_without_token": raw(public),
            "client_version": importlib.metadata.version("e2b"),  # from 2.51 it ignores secure=False
            "rpc_without_token": rpc_without_token,
            "rpc_with_token": rpc_with_token,
        }
    finally:
        sbx.kill()
        public.kill()


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
def _signed_urls(work: str) -> dict[str, Any]:
    """A secure sandbox's signed file URLs, fetched without its token: good, tampered and expired ones."""
    sbx = Sandbox.create(timeout=120, secure=True)
    try:
        path = "/home/user/signed.txt"
        sbx.files.write(path, "signed content")

        def get(url: str) -> list[Any]:
            response = httpx.get(url, timeout=10)
            return [response.status_code, response.text if response.status_code == 200 else None]

        def post(url: str, content: bytes) -> int:
            return httpx.post(url, files={"file": ("f.txt", content)}, timeout=10).status_code

        def read(target: str) -> str | None:
            return sbx.files.read(target) if sbx.files.exists(target) else None

        download = sbx.download_url(path)
        expiring = sbx.download_url(path, use_signature_expiration=120)
        upload = sbx.upload_url("/home/user/up.txt")
        upload_expiring = sbx.upload_url("/home/user/up-expiring.txt", use_signature_expiration=120)
        result: dict[str, Any] = {
            "has_signature": "signature=" in download and "signature_expiration=" in expiring,
            "download": get(download),
            "download_tampered": get(_tampered(download))[0],
            "download_expiring": get(expiring),
            "download_expired": get(sbx.download_url(path, use_signature_expiration=-30))[0],
            "download_expiration_dropped": get(_without_expiration(expiring))[0],
        }
        result["upload"] = post(upload, b"uploaded")
        result["upload_tampered"] = post(_tampered(sbx.upload_url("/home/user/up-tampered.txt")), b"x")
        result["upload_expiring"] = post(upload_expiring, b"uploaded before expiry")
        result["upload_expired"] = post(sbx.upload_url("/home/user/up-late.txt", use_signature_expiration=-30), b"x")
        result["upload_read_signature"] = post(sbx.download_url("/home/user/up-read.txt"), b"x")
        result["uploaded"] = {
            name: read(f"/home/user/{name}")
            for name in ("up.txt", "up-expiring.txt", "up-tampered.txt", "up-late.txt", "up-read.txt")
        }
        return result
    finally:
        sbx.kill()


def _template_context(work: str) -> str:
    context = Path(work) / "template-context"
    context.mkdir(parents=True, exist_ok=True)
    (context / "copied.txt").write_text("copied file\n")
    return str(context)


TEMPLATE_PROBE = (
    "cat copied.txt built.txt; echo $TPL_VAR; pwd; whoami; curl -s -o /dev/null -w %{http_code} 127.0.0.1:8000"
)


@scenario("sandbox/template-build")
def _template_build(work: str) -> dict[str, Any]:
    name = f"conf-{uuid.uuid4().hex[:12]}"
    template = (
        Template(file_context_path=_template_context(work))
        .from_base_image()
        .set_workdir("/home/user/app")
        .copy("copied.txt", "./")
        .set_envs({"TPL_VAR": "from-template"})
        .run_cmd("echo built > built.txt")
        .set_start_cmd("python3 -m http.server 8000 --bind 127.0.0.1", wait_for_port(8000))
    )
    result: dict[str, Any] = {}
    info = Template.build(template, name, tags=["t1"], cpu_count=1, memory_mb=512)
    try:
        result["build_tags"] = info.tags
        result["exists"] = [Template.exists(name), Template.exists(name + "-missing")]
        sbx = Sandbox.create(f"{name}:t1", timeout=120)
        try:
            result["probe"] = sbx.commands.run(TEMPLATE_PROBE).stdout.split()
            result["template_id"] = sbx.get_info().template_id == info.template_id
        finally:
            sbx.kill()
        child = Template().from_template(f"{name}:t1").run_cmd("echo child > child.txt")
        Template.build(child, name + "-child", cpu_count=1, memory_mb=512)
        sbx = Sandbox.create(name + "-child", timeout=120)
        try:
            result["child"] = sbx.commands.run("cat built.txt child.txt; pwd").stdout.split()
        finally:
            sbx.kill()
        second = os.environ["SECOND_API_KEY"]  # another owner sees none of it
        result["other_exists"] = Template.exists(name, api_key=second)
        try:
            Sandbox.create(f"{name}:t1", timeout=60, api_key=second).kill()
            result["other_create"] = "created"
        except SandboxException as exc:
            result["other_create"] = str(exc)[:3]
        try:
            Template.get_tags(name, api_key=second)
            result["other_tags"] = "listed"
        except Exception as exc:  # noqa: BLE001 - the client's error for a 404, whatever its class
            result["other_tags"] = str(exc)[:3]
        result["assigned"] = Template.assign_tags(f"{name}:t1", ["t2"]).tags
        result["tags"] = sorted(tag.tag for tag in Template.get_tags(name))
        Template.remove_tags(name, ["t1"])
        result["tags_after"] = sorted(tag.tag for tag in Template.get_tags(name))
        try:
            Template.build(Template().from_base_image().run_cmd("echo step-output; exit 4"), name + "-broken")
            result["failure"] = "built"
        except BuildException as exc:
            result["failure"] = str(exc)
        result["deleted"] = Sandbox.delete_snapshot(info.template_id)
        try:
            Sandbox.create(f"{name}:t2", timeout=60).kill()
            result["after_delete"] = "created"
        except SandboxException as exc:  # a create's 404 is the client's generic error
            result["after_delete"] = str(exc)[:3]
        return result
    finally:
        for leftover in (name + "-child", info.template_id, name + "-broken"):
            Sandbox.delete_snapshot(leftover)


IMAGE_PROBE = "cat /home/user/built.txt; echo $IMAGE_VAR; echo /opt/old/*; whoami; test -e /etc/motd || echo no-motd"


@scenario("sandbox/template-image")
def _template_image(work: str) -> dict[str, Any]:
    # The harness's registry (IMAGE_*): a private image, its layers' whiteouts, its environment.
    image, username, password = os.environ["IMAGE_REF"], os.environ["IMAGE_USERNAME"], os.environ["IMAGE_PASSWORD"]
    name = f"conf-image-{uuid.uuid4().hex[:12]}"
    template = Template().from_image(image, username=username, password=password).run_cmd("echo built > built.txt")
    result: dict[str, Any] = {}
    info = Template.build(template, name, cpu_count=1, memory_mb=512)
    try:
        sbx = Sandbox.create(name, timeout=120)
        try:
            result["probe"] = sbx.commands.run(IMAGE_PROBE).stdout.split()
        finally:
            sbx.kill()
        wrong = Template().from_image(image, username=username, password="not-" + password)
        try:
            Template.build(wrong, name + "-denied")
            result["denied"] = "built"
        except BuildException as exc:
            result["denied"] = str(exc)
        result["password_shown"] = password in result["denied"]
        return result
    finally:
        for leftover in (info.template_id, name + "-denied"):
            Sandbox.delete_snapshot(leftover)


def main() -> None:
    name, work = sys.argv[1], sys.argv[2]
    trace(name, "start")
    result = SCENARIOS[name](work)
    trace(name, "done")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
