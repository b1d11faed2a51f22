"""Scenarios for the official Python client, async flavour (see ``py_sync.py`` for the contract)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from e2b import AsyncSandbox, CommandExitException, TimeoutException
from e2b.sandbox.commands.command_handle import PtySize

Scenario = Callable[[AsyncSandbox, str], Awaitable[dict[str, Any]]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = fn
        return fn

    return register


async def _until(condition: Callable[[], bool], tries: int = 100) -> None:
    for _ in range(tries):  # events arrive asynchronously: wait for them (at most tries / 10 s)
        if condition():
            return
        await asyncio.sleep(0.1)


@scenario("commands/foreground")
async def _foreground(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    where = f"{work}/elsewhere"  # not the user's home, where a command runs without a cwd
    await sbx.commands.run(f"mkdir -p {where}")
    r = await sbx.commands.run('echo "$GREETING from $(pwd)"; echo oops >&2', envs={"GREETING": "hi"}, cwd=where)
    return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}


@scenario("commands/exit-code")
async def _exit_code(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    try:
        await sbx.commands.run("echo partial; echo failing >&2; exit 3")
    except CommandExitException as exc:
        return {"raised": True, "exit_code": exc.exit_code, "stdout": exc.stdout, "stderr": exc.stderr}
    return {"raised": False}


@scenario("commands/background-connect")
async def _background(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    handle = await sbx.commands.run("sleep 0.5; echo done", background=True)
    listed = [p.pid for p in await sbx.commands.list()]
    again = await sbx.commands.connect(handle.pid)
    result = await again.wait()
    return {
        "pid": handle.pid,
        "listed": handle.pid in listed,
        "stdout": result.stdout,
        "exit_code": result.exit_code,
        "listed_after": handle.pid in [p.pid for p in await sbx.commands.list()],
    }


@scenario("commands/timeout")
async def _timeout(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    marker = f"{work}/timeout-survived"  # written only if the command outlives its 1 s deadline
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await sbx.commands.run(f"sleep 2; touch {marker}", timeout=1)
        raised = None
    except TimeoutException as exc:
        raised = type(exc).__name__
    elapsed = loop.time() - started
    await asyncio.sleep(max(0.0, started + 3 - loop.time()))  # a surviving command has written its marker by now
    return {"raised": raised, "elapsed": elapsed, "process_survived": await sbx.files.exists(marker)}


@scenario("commands/connect-timeout")
async def _connect_timeout(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    marker = f"{work}/connect-survived"  # Connect's own deadline ends its stream, not the process
    handle = await sbx.commands.run(f"sleep 2; touch {marker}", background=True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await (await sbx.commands.connect(handle.pid, timeout=1)).wait()
        raised = None
    except TimeoutException as exc:
        raised = type(exc).__name__
    elapsed = loop.time() - started
    listed = handle.pid in [p.pid for p in await sbx.commands.list()]
    await asyncio.sleep(max(0.0, started + 3 - loop.time()))
    return {
        "raised": raised,
        "elapsed": elapsed,
        "listed_after": listed,
        "process_finished": await sbx.files.exists(marker),
    }


@scenario("commands/stdin")
async def _stdin(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    handle = await sbx.commands.run("cat", background=True, stdin=True)
    listed = handle.pid in [p.pid for p in await sbx.commands.list()]
    await sbx.commands.send_stdin(handle.pid, "first line\n")
    await sbx.commands.send_stdin(handle.pid, "second line\n")
    await sbx.commands.close_stdin(handle.pid)
    result = await handle.wait()
    return {"listed": listed, "stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}


@scenario("commands/stream-input")
async def _stream_input(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    """stdin sent as one client stream (``StreamInput``, clients from 2.58), in order, str and bytes alike."""
    handle = await sbx.commands.run("cat", background=True, stdin=True)
    async with sbx.commands.stream_input(handle.pid) as stream:
        await stream.send("first line\n")
        await stream.send(b"second line\n")
        await stream.send("third")
    await sbx.commands.close_stdin(handle.pid)
    result = await handle.wait()
    return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}


@scenario("commands/kill")
async def _kill(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    handle = await sbx.commands.run("sleep 30", background=True)
    killed = await sbx.commands.kill(handle.pid)
    try:
        await handle.wait()
        outcome: dict[str, Any] = {"raised": False}
    except CommandExitException as exc:
        outcome = {"raised": True, "exit_code": exc.exit_code, "error": exc.error}
    return {"killed": killed, "kill_unknown": await sbx.commands.kill(handle.pid), **outcome}


@scenario("pty/session")
async def _pty(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    chunks: list[bytes] = []
    handle = await sbx.pty.create(PtySize(cols=100, rows=30), on_data=chunks.append)
    await sbx.pty.send_stdin(handle.pid, b"stty size; echo FIRST-$((1+1))\n")  # the size asked for at start
    await _until(lambda: b"FIRST-2" in b"".join(chunks))  # the first size is out before the resize
    await sbx.pty.resize(handle.pid, PtySize(cols=120, rows=40))
    await sbx.pty.send_stdin(handle.pid, b"echo MARK-$((20+22)); stty size; exit\n")
    result = await handle.wait()
    return {"output": b"".join(chunks).decode("utf-8", "replace"), "exit_code": result.exit_code}


@scenario("files/text-bytes-stream")
async def _text_bytes(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    text_path, bin_path = f"{work}/t/hello.txt", f"{work}/b/data.bin"
    info = await sbx.files.write(text_path, "héllo\n")
    payload = bytes(range(256)) * 4
    await sbx.files.write(bin_path, payload)
    streamed = b"".join([chunk async for chunk in await sbx.files.read(bin_path, format="stream")])
    return {
        "write": {"name": info.name, "path": info.path, "type": info.type.value if info.type else None},
        "text": await sbx.files.read(text_path),
        "bytes_equal": bytes(await sbx.files.read(bin_path, format="bytes")) == payload,
        "stream_equal": streamed == payload,
        "gzip_equal": bytes(await sbx.files.read(bin_path, format="bytes", gzip=True)) == payload,
        "relative": (await sbx.files.write("relative-from-home.txt", "x")).path,
    }


@scenario("files/list-stat-exists")
async def _list(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    await sbx.files.write(f"{work}/tree/a/b/c.txt", "c")
    await sbx.files.write(f"{work}/tree/top.txt", "top")
    depth1 = [e.path for e in await sbx.files.list(f"{work}/tree")]
    depth3 = [e.path for e in await sbx.files.list(f"{work}/tree", depth=3)]
    info = await sbx.files.get_info(f"{work}/tree/top.txt")
    return {
        "depth1": depth1,
        "depth3": depth3,
        "info": {
            "name": info.name,
            "type": info.type.value if info.type else None,
            "size": info.size,
            "mode": info.mode,
            "permissions": info.permissions,
            "path": info.path,
        },
        "exists": await sbx.files.exists(f"{work}/tree/top.txt"),
        "exists_missing": await sbx.files.exists(f"{work}/nope"),
    }


@scenario("files/symlink")
async def _symlink(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    """A symlink as the client lists and stats it: the link marked (clients from 2.55), its target's path."""
    await sbx.files.write(f"{work}/links/file.txt", "target")
    links = f"{work}/links"
    await sbx.commands.run(f"ln -sfn {links}/file.txt {links}/to-file && ln -sfn {links}/gone {links}/dangling")
    listed = {e.name: e for e in await sbx.files.list(f"{work}/links")}
    info = await sbx.files.get_info(f"{work}/links/to-file")

    def shown(entry: Any) -> dict[str, Any]:
        return {"type": entry.type.value if entry.type else None, "target": entry.symlink_target}

    return {
        "client": "python",
        "client_version": importlib.metadata.version("e2b"),  # from 2.55 it reads is_symlink
        "listed": {name: shown(entry) for name, entry in listed.items()},
        "info": shown(info),
        "dangling_info": shown(await sbx.files.get_info(f"{links}/dangling")),
        "work": work,
    }


@scenario("files/make-dir-rename-remove")
async def _mkdir(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    first = await sbx.files.make_dir(f"{work}/made/deep")
    second = await sbx.files.make_dir(f"{work}/made/deep")
    await sbx.files.write(f"{work}/made/old.txt", "moving")
    renamed = await sbx.files.rename(f"{work}/made/old.txt", f"{work}/made/sub/new.txt")
    await sbx.files.remove(f"{work}/made/deep")
    await sbx.files.remove(f"{work}/made/never-existed")
    return {
        "first": first,
        "second": second,
        "renamed_path": renamed.path,
        "old_exists": await sbx.files.exists(f"{work}/made/old.txt"),
        "new_content": await sbx.files.read(f"{work}/made/sub/new.txt"),
        "deep_exists": await sbx.files.exists(f"{work}/made/deep"),
    }


@scenario("watch/stream")
async def _watch(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    root = f"{work}/watched"
    await sbx.files.make_dir(root)
    events: list[list[str]] = []
    handle = await sbx.files.watch_dir(root, lambda e: events.append([e.type.value, e.name]), recursive=True)
    await sbx.files.write(f"{root}/a.txt", "a")
    await sbx.commands.run(f"echo more >> {root}/a.txt; mkdir -p {root}/sub/deeper; mv {root}/a.txt {root}/sub/b.txt")
    await sbx.files.remove(f"{root}/sub/b.txt")
    for _ in range(100):  # events arrive asynchronously; wait for the last one (at most 10 s)
        if ["remove", "sub/b.txt"] in events:
            break
        await asyncio.sleep(0.1)
    await handle.stop()
    return {"events": events, "watcher": "WatchDir"}


def _entry(entry: Any) -> dict[str, Any] | None:
    if entry is None:
        return None
    kind = entry.type.value if entry.type else None
    return {"name": entry.name, "type": kind, "size": entry.size, "path": entry.path}


@scenario("watch/stream-options")
async def _watch_options(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    root = f"{work}/watched-options"
    await sbx.commands.run(f"mkdir -p {root}")
    seen: dict[str, list[list[Any]]] = {"with_entry": [], "without_entry": []}
    with_entry = await sbx.files.watch_dir(
        root, lambda e: seen["with_entry"].append([e.type.value, e.name, _entry(e.entry)]), include_entry=True
    )
    without_entry = await sbx.files.watch_dir(
        root, lambda e: seen["without_entry"].append([e.type.value, e.name, _entry(e.entry)])
    )
    await sbx.files.write(f"{root}/e.txt", "12345")
    await sbx.commands.run(f"mkdir {root}/d")
    await _until(
        lambda: all({("write", "e.txt"), ("create", "d")} <= {(e[0], e[1]) for e in got} for got in seen.values())
    )
    await with_entry.stop()
    await without_entry.stop()
    # A relative path is resolved against the acting user's home: the folder exists in root's only.
    name = "watch-as-root-py-async"
    await sbx.commands.run(f"rm -rf ~/{name}; mkdir ~/{name}", user="root")
    try:
        await (await sbx.files.watch_dir(name, lambda e: None, user="user")).stop()
        as_user = None
    except Exception as exc:  # noqa: BLE001 - the class is what is checked
        as_user = type(exc).__name__
    root_events: list[list[str]] = []
    as_root = await sbx.files.watch_dir(name, lambda e: root_events.append([e.type.value, e.name]), user="root")
    await sbx.commands.run(f"touch ~/{name}/r.txt", user="root")
    await _until(lambda: ["create", "r.txt"] in root_events, 50)
    await as_root.stop()
    await sbx.commands.run(f"rm -rf ~/{name}", user="root")
    return {**seen, "as_user_error": as_user, "as_root_events": root_events}


@scenario("watch/stream-deadline")
async def _watch_deadline(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    root = f"{work}/watched-deadline"
    await sbx.commands.run(f"mkdir -p {root}")
    ended: list[str | None] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    handle = await sbx.files.watch_dir(
        root, lambda e: None, on_exit=lambda exc: ended.append(type(exc).__name__ if exc else None), timeout=1
    )
    await _until(lambda: bool(ended), 30)  # the agent ends the stream at the 1 s deadline
    elapsed = loop.time() - started
    await handle.stop()
    return {"ended": ended, "elapsed": elapsed}


PARALLEL = 16  # commands, and as many files, in flight at once on one sandbox


@scenario("concurrency/commands-and-files")
async def _parallel_traffic(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    """Commands and file round trips in parallel on one sandbox: each must get its own answer."""

    async def command(n: int) -> list[Any]:
        try:
            r = await sbx.commands.run(
                f"echo start-{n}; sleep 0.2; echo end-{n} >&2; exit {n % 3}", cwd=work, envs={"N": str(n)}
            )
            return [n, r.stdout, r.stderr, r.exit_code]
        except CommandExitException as exc:  # a non-zero exit is part of the answer
            return [n, exc.stdout, exc.stderr, exc.exit_code]

    async def round_trip(n: int) -> list[Any]:
        content = f"file {n} ".encode() * (n * 512 + 1)  # from a few bytes to about 60 KiB
        await sbx.files.write(f"{work}/parallel/{n}.bin", content)
        back = await sbx.files.read(f"{work}/parallel/{n}.bin", format="bytes")
        return [n, hashlib.sha256(content).hexdigest(), hashlib.sha256(bytes(back)).hexdigest(), len(back)]

    commands = asyncio.gather(*(command(n) for n in range(PARALLEL)))
    files = asyncio.gather(*(round_trip(n) for n in range(PARALLEL)))
    done_commands, done_files = await asyncio.gather(commands, files)
    return {"commands": list(done_commands), "files": list(done_files)}


# Payload size classes: empty, one byte, just over 64 KiB, several MiB (files and command output).
SIZES = (0, 1, 65537, 8 * 1024 * 1024 + 3)
OUTPUT_SIZES = (0, 1, 4 * 1024 * 1024)
SEQ = 200000  # ``seq 1 SEQ``: 1.3 MB of numbered lines, in order


@scenario("files/size-classes")
async def _size_classes(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    files = []
    for size in SIZES:
        data, path = os.urandom(size), f"{work}/sizes/{size}.bin"
        await sbx.files.write(path, data, request_timeout=120)
        back = bytes(await sbx.files.read(path, format="bytes", request_timeout=120))
        stored = (await sbx.commands.run(f"sha256sum {path}")).stdout.split()[0]
        files.append(
            {
                "size": size,
                "written": hashlib.sha256(data).hexdigest(),
                "read": hashlib.sha256(back).hexdigest(),
                "read_size": len(back),
                "info_size": (await sbx.files.get_info(path)).size,
                "stored": stored,
            }
        )
    await sbx.files.write(f"{work}/sizes/empty.txt", "")
    outputs = []
    for size in OUTPUT_SIZES:
        shell = f"head -c {size} /dev/zero | tr '\\0' a; head -c {size} /dev/zero | tr '\\0' b >&2"
        r = await sbx.commands.run(shell)
        outputs.append(
            {
                "size": size,
                "stdout": [len(r.stdout), sorted(set(r.stdout))],
                "stderr": [len(r.stderr), sorted(set(r.stderr))],
            }
        )
    seq = await sbx.commands.run(f"seq 1 {SEQ}")
    return {
        "files": files,
        "empty_text": await sbx.files.read(f"{work}/sizes/empty.txt"),
        "outputs": outputs,
        "seq": [SEQ, hashlib.sha256(seq.stdout.encode()).hexdigest()],
    }


async def _error(call: Awaitable[Any]) -> list[Any]:
    """What the client raised: its class and message (what a user sees), and an exit code if any."""
    try:
        await call
    except Exception as exc:  # noqa: BLE001 - the answer is which exception, whatever it is
        return [type(exc).__name__, str(exc), getattr(exc, "exit_code", None), getattr(exc, "stderr", None)]
    return ["none", "", None, None]


@scenario("errors/messages")
async def _errors(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    folder = f"{work}/errors"
    plain = f"{folder}/plain.txt"
    await sbx.files.write(plain, "plain")
    return {
        "read_missing": await _error(sbx.files.read(f"{folder}/missing.txt")),
        "info_missing": await _error(sbx.files.get_info(f"{folder}/missing.txt")),
        "list_missing": await _error(sbx.files.list(f"{folder}/missing")),
        "list_file": await _error(sbx.files.list(plain)),
        "write_under_file": await _error(sbx.files.write(f"{plain}/child.txt", "x")),
        "make_dir_under_file": await _error(sbx.files.make_dir(f"{plain}/sub")),
        "rename_missing": await _error(sbx.files.rename(f"{folder}/missing.txt", f"{folder}/other.txt")),
        "cwd_missing": await _error(sbx.commands.run("true", cwd=f"{folder}/no-such-dir")),
        "connect_unknown": await _error(sbx.commands.connect(999999)),
        "unknown_command": await _error(sbx.commands.run("no-such-command-e2b")),
        "folder": folder,
    }


async def main() -> None:
    name, work = sys.argv[1], sys.argv[2]
    print(f"py-async:envd/{name}:start", file=sys.stderr, flush=True)
    sbx = await AsyncSandbox.create()
    try:
        print(f"py-async:envd/{name}:created {sbx.sandbox_id}", file=sys.stderr, flush=True)
        result = await SCENARIOS[name](sbx, work)
    finally:
        await sbx.kill()
    print(f"py-async:envd/{name}:done", file=sys.stderr, flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
