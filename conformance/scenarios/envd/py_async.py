"""Scenarios for the official Python client, async flavour (see ``py_sync.py`` for the contract)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from e2b import AsyncSandbox, CommandExitException
from e2b.sandbox.commands.command_handle import PtySize

Scenario = Callable[[AsyncSandbox, str], Awaitable[dict[str, Any]]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = fn
        return fn

    return register


@scenario("commands/foreground")
async def _foreground(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    r = await sbx.commands.run('echo "$GREETING from $(pwd)"; echo oops >&2', envs={"GREETING": "hi"}, cwd=work)
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


@scenario("commands/stdin")
async def _stdin(sbx: AsyncSandbox, work: str) -> dict[str, Any]:
    handle = await sbx.commands.run("cat", background=True, stdin=True)
    listed = handle.pid in [p.pid for p in await sbx.commands.list()]
    await sbx.commands.send_stdin(handle.pid, "first line\n")
    await sbx.commands.send_stdin(handle.pid, "second line\n")
    await sbx.commands.close_stdin(handle.pid)
    result = await handle.wait()
    return {"listed": listed, "stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}


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
    handle = await sbx.pty.create(PtySize(cols=80, rows=24), on_data=chunks.append)
    await sbx.pty.resize(handle.pid, PtySize(cols=100, rows=30))
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
