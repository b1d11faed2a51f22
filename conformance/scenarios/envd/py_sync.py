"""Scenarios for the official Python client, sync flavour, in debug mode against the agent.

Run by the pinned client's own interpreter (``python -I py_sync.py <scenario> <workdir>``):
only the official packages are importable. Each scenario prints one JSON object with what
it observed; the pytest side asserts on it.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.metadata
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from e2b import CommandExitException, Sandbox, TimeoutException
from e2b.sandbox.commands.command_handle import PtySize

SCENARIOS: dict[str, Callable[[Sandbox, str], dict[str, Any]]] = {}


def scenario(
    name: str,
) -> Callable[[Callable[[Sandbox, str], dict[str, Any]]], Callable[[Sandbox, str], dict[str, Any]]]:
    def register(fn: Callable[[Sandbox, str], dict[str, Any]]) -> Callable[[Sandbox, str], dict[str, Any]]:
        SCENARIOS[name] = fn
        return fn

    return register


@scenario("commands/foreground")
def _foreground(sbx: Sandbox, work: str) -> dict[str, Any]:
    where = f"{work}/elsewhere"  # not the user's home, where a command runs without a cwd
    sbx.commands.run(f"mkdir -p {where}")
    r = sbx.commands.run('echo "$GREETING from $(pwd)"; echo oops >&2', envs={"GREETING": "hi"}, cwd=where)
    return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}


@scenario("commands/exit-code")
def _exit_code(sbx: Sandbox, work: str) -> dict[str, Any]:
    try:
        sbx.commands.run("echo partial; echo failing >&2; exit 3")
    except CommandExitException as exc:
        return {"raised": True, "exit_code": exc.exit_code, "stdout": exc.stdout, "stderr": exc.stderr}
    return {"raised": False}


@scenario("commands/ordering")
def _ordering(sbx: Sandbox, work: str) -> dict[str, Any]:
    seen: list[list[str]] = []
    r = sbx.commands.run(
        "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.05; done",
        on_stdout=lambda line: seen.append(["stdout", line]),
        on_stderr=lambda line: seen.append(["stderr", line]),
    )
    return {"stdout": r.stdout, "stderr": r.stderr, "callbacks": seen}


@scenario("commands/background-connect")
def _background(sbx: Sandbox, work: str) -> dict[str, Any]:
    handle = sbx.commands.run("sleep 0.5; echo done", background=True)
    listed = [p.pid for p in sbx.commands.list()]
    again = sbx.commands.connect(handle.pid)
    result = again.wait()
    return {
        "pid": handle.pid,
        "listed": handle.pid in listed,
        "stdout": result.stdout,
        "exit_code": result.exit_code,
        "listed_after": handle.pid in [p.pid for p in sbx.commands.list()],
    }


@scenario("commands/stdin")
def _stdin(sbx: Sandbox, work: str) -> dict[str, Any]:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    info = next((p for p in sbx.commands.list() if p.pid == handle.pid), None)
    sbx.commands.send_stdin(handle.pid, "first line\n")
    sbx.commands.send_stdin(handle.pid, "second line\n")
    sbx.commands.close_stdin(handle.pid)
    result = handle.wait()
    return {
        "listed": info is not None,
        "cmd": info.cmd if info else None,
        "args": info.args if info else None,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
    }


@scenario("commands/stream-input")
def _stream_input(sbx: Sandbox, work: str) -> dict[str, Any]:
    """stdin sent as one client stream (``StreamInput``, clients from 2.58), in order, str and bytes alike."""
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(handle.pid, ["first line\n", b"second line\n", "third"])
    sbx.commands.close_stdin(handle.pid)
    result = handle.wait()
    return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}


@scenario("commands/kill")
def _kill(sbx: Sandbox, work: str) -> dict[str, Any]:
    handle = sbx.commands.run("sleep 30", background=True)
    killed = sbx.commands.kill(handle.pid)
    try:
        handle.wait()
        outcome: dict[str, Any] = {"raised": False}
    except CommandExitException as exc:
        outcome = {"raised": True, "exit_code": exc.exit_code, "error": exc.error}
    return {
        "killed": killed,
        "kill_unknown": sbx.commands.kill(handle.pid),
        **outcome,
        "listed_after": handle.pid in [p.pid for p in sbx.commands.list()],
    }


@scenario("commands/timeout")
def _timeout(sbx: Sandbox, work: str) -> dict[str, Any]:
    marker = f"{work}/timeout-survived"  # written only if the command outlives its 1 s deadline
    started = time.monotonic()
    try:
        sbx.commands.run(f"sleep 2; touch {marker}", timeout=1)
        raised = None
    except TimeoutException as exc:
        raised = type(exc).__name__
    elapsed = time.monotonic() - started
    time.sleep(max(0.0, started + 3 - time.monotonic()))  # a surviving command has written its marker by now
    return {"raised": raised, "elapsed": elapsed, "process_survived": sbx.files.exists(marker)}


@scenario("commands/connect-timeout")
def _connect_timeout(sbx: Sandbox, work: str) -> dict[str, Any]:
    marker = f"{work}/connect-survived"  # Connect's own deadline ends its stream, not the process
    handle = sbx.commands.run(f"sleep 2; touch {marker}", background=True)
    started = time.monotonic()
    try:
        sbx.commands.connect(handle.pid, timeout=1).wait()
        raised = None
    except TimeoutException as exc:
        raised = type(exc).__name__
    elapsed = time.monotonic() - started
    listed = handle.pid in [p.pid for p in sbx.commands.list()]
    time.sleep(max(0.0, started + 3 - time.monotonic()))
    return {"raised": raised, "elapsed": elapsed, "listed_after": listed, "process_finished": sbx.files.exists(marker)}


@scenario("commands/user-and-env")
def _user(sbx: Sandbox, work: str) -> dict[str, Any]:
    r = sbx.commands.run("id -un; echo $HOME; echo $USER; printenv E2B_SANDBOX", user="root")
    return {"lines": r.stdout.splitlines()}


@scenario("pty/session")
def _pty(sbx: Sandbox, work: str) -> dict[str, Any]:
    handle = sbx.pty.create(PtySize(cols=100, rows=30))
    sbx.pty.send_stdin(handle.pid, b"stty size; echo FIRST-$((1+1))\n")  # the size asked for at start
    chunks: list[bytes] = []
    resized: list[bool] = []

    def on_pty(chunk: bytes) -> None:
        chunks.append(chunk)
        if b"FIRST-2" in b"".join(chunks) and not resized:  # the first size is out: now resize
            resized.append(True)
            sbx.pty.resize(handle.pid, PtySize(cols=120, rows=40))
            sbx.pty.send_stdin(handle.pid, b"echo MARK-$((20+22)); stty size; exit\n")

    result = handle.wait(on_pty=on_pty)
    return {"output": b"".join(chunks).decode("utf-8", "replace"), "exit_code": result.exit_code}


@scenario("files/text-bytes-stream")
def _text_bytes(sbx: Sandbox, work: str) -> dict[str, Any]:
    text_path, bin_path = f"{work}/t/hello.txt", f"{work}/b/data.bin"
    info = sbx.files.write(text_path, "héllo\n")
    payload = bytes(range(256)) * 4
    sbx.files.write(bin_path, payload)
    streamed = b"".join(sbx.files.read(bin_path, format="stream"))
    return {
        "write": {"name": info.name, "path": info.path, "type": info.type.value if info.type else None},
        "text": sbx.files.read(text_path),
        "bytes_equal": bytes(sbx.files.read(bin_path, format="bytes")) == payload,
        "stream_equal": streamed == payload,
        "gzip_equal": bytes(sbx.files.read(bin_path, format="bytes", gzip=True)) == payload,
        "relative": sbx.files.write("relative-from-home.txt", "x").path,
    }


@scenario("files/write-many")
def _write_many(sbx: Sandbox, work: str) -> dict[str, Any]:
    entries = [{"path": f"{work}/many/{i}/f{i}.txt", "data": f"file {i}"} for i in range(5)]
    infos = sbx.files.write_files(entries)
    return {"paths": [i.path for i in infos], "contents": [sbx.files.read(e["path"]) for e in entries]}


def _chunks(total: int, size: int = 1 << 20) -> Iterator[bytes]:
    block = hashlib.sha256(b"seed").digest() * (size // 32)
    for _ in range(total // size):
        yield block


class _Reader(io.RawIOBase):
    """A binary stream producing the data without holding it all: the client streams it."""

    def __init__(self, total: int) -> None:
        self._it = _chunks(total)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._it)
            except StopIteration:
                return 0
        count = min(len(target), len(self._buffer))
        target[:count] = self._buffer[:count]
        self._buffer = self._buffer[count:]
        return count


@scenario("files/large")
def _large(sbx: Sandbox, work: str) -> dict[str, Any]:
    total = 100 * 1024 * 1024
    expected = hashlib.sha256()
    for chunk in _chunks(total):
        expected.update(chunk)
    path = f"{work}/large.bin"
    sbx.files.write(path, _Reader(total), request_timeout=300)
    got = hashlib.sha256()
    size = 0
    for chunk in sbx.files.read(path, format="stream", request_timeout=300):
        got.update(chunk)
        size += len(chunk)
    return {"size": size, "sha_equal": got.hexdigest() == expected.hexdigest(), "path": path}


@scenario("files/list-stat-exists")
def _list(sbx: Sandbox, work: str) -> dict[str, Any]:
    sbx.files.write(f"{work}/tree/a/b/c.txt", "c")
    sbx.files.write(f"{work}/tree/top.txt", "top")
    depth1 = [e.path for e in sbx.files.list(f"{work}/tree")]
    depth3 = [e.path for e in sbx.files.list(f"{work}/tree", depth=3)]
    info = sbx.files.get_info(f"{work}/tree/top.txt")
    directory = sbx.files.get_info(f"{work}/tree/a")
    try:
        sbx.files.get_info(f"{work}/tree/missing")
        missing = None
    except Exception as exc:  # noqa: BLE001 - the class is what is checked
        missing = type(exc).__name__
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
        "dir_type": directory.type.value if directory.type else None,
        "exists": sbx.files.exists(f"{work}/tree/top.txt"),
        "exists_missing": sbx.files.exists(f"{work}/nope"),
        "missing_error": missing,
    }


@scenario("files/symlink")
def _symlink(sbx: Sandbox, work: str) -> dict[str, Any]:
    """A symlink as the client lists and stats it: the link marked (clients from 2.55), its target's path."""
    sbx.files.write(f"{work}/links/file.txt", "target")
    links = f"{work}/links"
    sbx.commands.run(f"ln -sfn {links}/file.txt {links}/to-file && ln -sfn {links}/gone {links}/dangling")
    listed = {e.name: e for e in sbx.files.list(f"{work}/links")}
    info = sbx.files.get_info(f"{work}/links/to-file")

    def shown(entry: Any) -> dict[str, Any]:
        return {"type": entry.type.value if entry.type else None, "target": entry.symlink_target}

    return {
        "client": "python",
        "client_version": importlib.metadata.version("e2b"),  # from 2.55 it reads is_symlink
        "listed": {name: shown(entry) for name, entry in listed.items()},
        "info": shown(info),
        "dangling_info": shown(sbx.files.get_info(f"{links}/dangling")),
        "work": work,
    }


@scenario("files/make-dir-rename-remove")
def _mkdir(sbx: Sandbox, work: str) -> dict[str, Any]:
    first = sbx.files.make_dir(f"{work}/made/deep")
    second = sbx.files.make_dir(f"{work}/made/deep")
    sbx.files.write(f"{work}/made/old.txt", "moving")
    renamed = sbx.files.rename(f"{work}/made/old.txt", f"{work}/made/sub/new.txt")
    sbx.files.remove(f"{work}/made/deep")
    sbx.files.remove(f"{work}/made/never-existed")
    return {
        "first": first,
        "second": second,
        "renamed_path": renamed.path,
        "old_exists": sbx.files.exists(f"{work}/made/old.txt"),
        "new_content": sbx.files.read(f"{work}/made/sub/new.txt"),
        "deep_exists": sbx.files.exists(f"{work}/made/deep"),
    }


@scenario("files/metadata")
def _metadata(sbx: Sandbox, work: str) -> dict[str, Any]:
    info = sbx.files.write(f"{work}/meta.txt", "m", metadata={"Owner": "team-a", "stage": "dev"})
    stat = sbx.files.get_info(f"{work}/meta.txt")
    cleared = sbx.files.write(f"{work}/meta.txt", "m2")
    return {"written": info.metadata, "stat": stat.metadata, "cleared": cleared.metadata}


@scenario("watch/polling")
def _watch(sbx: Sandbox, work: str) -> dict[str, Any]:
    root = f"{work}/watched"
    sbx.files.make_dir(root)
    handle = sbx.files.watch_dir(root, recursive=True)
    sbx.files.write(f"{root}/a.txt", "a")
    sbx.commands.run(f"echo more >> {root}/a.txt; mkdir -p {root}/sub/deeper; mv {root}/a.txt {root}/sub/b.txt")
    sbx.files.remove(f"{root}/sub/b.txt")
    events: list[list[str]] = []
    for _ in range(100):  # poll until the last event has arrived (at most 10 s)
        events += [[e.type.value, e.name] for e in handle.get_new_events()]
        if ["remove", "sub/b.txt"] in events:
            break
        time.sleep(0.1)
    other = sbx.files.watch_dir(root)  # another watcher, which must outlive the first one's removal
    twin = copy.copy(handle)  # the client refuses a stopped handle itself; its copy still asks the agent
    handle.stop()
    try:
        twin.get_new_events()
        stopped_error = None
    except Exception as exc:  # noqa: BLE001 - the class is what is checked
        stopped_error = type(exc).__name__
    sbx.files.write(f"{root}/after.txt", "x")
    after: list[list[str]] = []
    for _ in range(50):
        after += [[e.type.value, e.name] for e in other.get_new_events()]
        if ["create", "after.txt"] in after:
            break
        time.sleep(0.1)
    other.stop()
    return {
        "events": events,
        "watcher": "CreateWatcher/GetWatcherEvents",
        "stopped_error": stopped_error,
        "other_events": after,
    }


def _entry(entry: Any) -> dict[str, Any] | None:
    if entry is None:
        return None
    kind = entry.type.value if entry.type else None
    return {"name": entry.name, "type": kind, "size": entry.size, "path": entry.path}


@scenario("watch/polling-options")
def _watch_options(sbx: Sandbox, work: str) -> dict[str, Any]:
    root = f"{work}/watched-options"
    sbx.commands.run(f"mkdir -p {root}")
    with_entry = sbx.files.watch_dir(root, include_entry=True)
    without_entry = sbx.files.watch_dir(root)
    sbx.files.write(f"{root}/e.txt", "12345")
    sbx.commands.run(f"mkdir {root}/d")
    seen: dict[str, list[list[Any]]] = {"with_entry": [], "without_entry": []}
    for _ in range(100):
        for key, handle in (("with_entry", with_entry), ("without_entry", without_entry)):
            seen[key] += [[e.type.value, e.name, _entry(e.entry)] for e in handle.get_new_events()]
        if all({("write", "e.txt"), ("create", "d")} <= {(e[0], e[1]) for e in got} for got in seen.values()):
            break
        time.sleep(0.1)
    with_entry.stop()
    without_entry.stop()
    # A relative path is resolved against the acting user's home: the folder exists in root's only.
    name = "watch-as-root-py-sync"
    sbx.commands.run(f"rm -rf ~/{name}; mkdir ~/{name}", user="root")
    try:
        sbx.files.watch_dir(name, user="user").stop()
        as_user = None
    except Exception as exc:  # noqa: BLE001 - the class is what is checked
        as_user = type(exc).__name__
    as_root = sbx.files.watch_dir(name, user="root")
    sbx.commands.run(f"touch ~/{name}/r.txt", user="root")
    root_events: list[list[str]] = []
    for _ in range(50):
        root_events += [[e.type.value, e.name] for e in as_root.get_new_events()]
        if ["create", "r.txt"] in root_events:
            break
        time.sleep(0.1)
    as_root.stop()
    sbx.commands.run(f"rm -rf ~/{name}", user="root")
    return {**seen, "as_user_error": as_user, "as_root_events": root_events}


@scenario("properties/batch")
def _properties(sbx: Sandbox, work: str) -> dict[str, Any]:
    """Every example of the file ``sys.argv[3]`` (generated by the harness with Hypothesis) on one sandbox."""
    with open(sys.argv[3], encoding="utf-8") as source:
        examples = json.load(source)
    files = []
    for example in examples["files"]:
        data = base64.b64decode(example["data"])
        path = f"{work}/{example['path']}"
        sbx.files.write(path, data)
        back = sbx.files.read(path, format="bytes")
        files.append({"path": path, "sha256": hashlib.sha256(bytes(back)).hexdigest()})
    commands = []
    for example in examples["commands"]:
        try:
            result = sbx.commands.run(example["cmd"], envs=example["envs"])
            exit_code, stdout, stderr = result.exit_code, result.stdout, result.stderr
        except CommandExitException as exc:
            exit_code, stdout, stderr = exc.exit_code, exc.stdout, exc.stderr
        commands.append({"exit_code": exit_code, "stdout": stdout, "stderr": stderr})
    return {"files": files, "commands": commands}


PARALLEL = 16  # commands, and as many files, in flight at once on one sandbox


@scenario("concurrency/commands-and-files")
def _parallel_traffic(sbx: Sandbox, work: str) -> dict[str, Any]:
    """Commands and file round trips in parallel on one sandbox: each must get its own answer."""

    def command(n: int) -> list[Any]:
        r = sbx.commands.run(f"echo start-{n}; sleep 0.2; echo end-{n} >&2; exit {n % 3}", cwd=work, envs={"N": str(n)})
        return [n, r.stdout, r.stderr, r.exit_code]

    def round_trip(n: int) -> list[Any]:
        content = f"file {n} ".encode() * (n * 512 + 1)  # from a few bytes to about 60 KiB
        sbx.files.write(f"{work}/parallel/{n}.bin", content)
        back = sbx.files.read(f"{work}/parallel/{n}.bin", format="bytes")
        return [n, hashlib.sha256(content).hexdigest(), hashlib.sha256(bytes(back)).hexdigest(), len(back)]

    def safe_command(n: int) -> list[Any]:
        try:
            return command(n)
        except CommandExitException as exc:  # a non-zero exit is part of the answer
            return [n, exc.stdout, exc.stderr, exc.exit_code]

    with ThreadPoolExecutor(max_workers=2 * PARALLEL) as pool:
        commands = pool.map(safe_command, range(PARALLEL))
        files = pool.map(round_trip, range(PARALLEL))
        return {"commands": list(commands), "files": list(files)}


# Payload size classes: empty, one byte, just over 64 KiB, several MiB (files and command output).
SIZES = (0, 1, 65537, 8 * 1024 * 1024 + 3)
OUTPUT_SIZES = (0, 1, 4 * 1024 * 1024)
SEQ = 200000  # ``seq 1 SEQ``: 1.3 MB of numbered lines, in order


@scenario("files/size-classes")
def _size_classes(sbx: Sandbox, work: str) -> dict[str, Any]:
    files = []
    for size in SIZES:
        data, path = os.urandom(size), f"{work}/sizes/{size}.bin"
        sbx.files.write(path, data, request_timeout=120)
        back = bytes(sbx.files.read(path, format="bytes", request_timeout=120))
        stored = sbx.commands.run(f"sha256sum {path}").stdout.split()[0]
        files.append(
            {
                "size": size,
                "written": hashlib.sha256(data).hexdigest(),
                "read": hashlib.sha256(back).hexdigest(),
                "read_size": len(back),
                "info_size": sbx.files.get_info(path).size,
                "stored": stored,
            }
        )
    sbx.files.write(f"{work}/sizes/empty.txt", "")
    outputs = []
    for size in OUTPUT_SIZES:
        r = sbx.commands.run(f"head -c {size} /dev/zero | tr '\\0' a; head -c {size} /dev/zero | tr '\\0' b >&2")
        outputs.append(
            {
                "size": size,
                "stdout": [len(r.stdout), sorted(set(r.stdout))],
                "stderr": [len(r.stderr), sorted(set(r.stderr))],
            }
        )
    seq = sbx.commands.run(f"seq 1 {SEQ}")
    return {
        "files": files,
        "empty_text": sbx.files.read(f"{work}/sizes/empty.txt"),
        "outputs": outputs,
        "seq": [SEQ, hashlib.sha256(seq.stdout.encode()).hexdigest()],
    }


def _error(call: Callable[[], Any]) -> list[Any]:
    """What the client raised: its class and message (what a user sees), and an exit code if any."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the answer is which exception, whatever it is
        return [type(exc).__name__, str(exc), getattr(exc, "exit_code", None), getattr(exc, "stderr", None)]
    return ["none", "", None, None]


@scenario("errors/messages")
def _errors(sbx: Sandbox, work: str) -> dict[str, Any]:
    folder = f"{work}/errors"
    plain = f"{folder}/plain.txt"
    sbx.files.write(plain, "plain")
    return {
        "read_missing": _error(lambda: sbx.files.read(f"{folder}/missing.txt")),
        "info_missing": _error(lambda: sbx.files.get_info(f"{folder}/missing.txt")),
        "list_missing": _error(lambda: sbx.files.list(f"{folder}/missing")),
        "list_file": _error(lambda: sbx.files.list(plain)),
        "write_under_file": _error(lambda: sbx.files.write(f"{plain}/child.txt", "x")),
        "make_dir_under_file": _error(lambda: sbx.files.make_dir(f"{plain}/sub")),
        "rename_missing": _error(lambda: sbx.files.rename(f"{folder}/missing.txt", f"{folder}/other.txt")),
        "cwd_missing": _error(lambda: sbx.commands.run("true", cwd=f"{folder}/no-such-dir")),
        "connect_unknown": _error(lambda: sbx.commands.connect(999999)),
        "unknown_command": _error(lambda: sbx.commands.run("no-such-command-e2b")),
        "folder": folder,
    }


def main() -> None:
    name, work = sys.argv[1], sys.argv[2]
    print(f"py-sync:envd/{name}:start", file=sys.stderr, flush=True)
    sbx = Sandbox.create()
    try:
        print(f"py-sync:envd/{name}:created {sbx.sandbox_id}", file=sys.stderr, flush=True)
        result = SCENARIOS[name](sbx, work)
    finally:
        sbx.kill()
    print(f"py-sync:envd/{name}:done", file=sys.stderr, flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
