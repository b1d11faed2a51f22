"""Volume scenarios for the official Python client (sync flavour): control, content API and mounts.

Run by the pinned client's own interpreter (``python -I py_sync.py <scenario> <workdir>``) with
only the endpoint's variables (``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE``, and
``SECOND_API_KEY``, another owner's key). Each scenario makes its own volumes and sandboxes,
removes them in ``finally`` and prints one JSON object; a refusal is recorded as the exception's
class and message, which the checks compare with what the other flavours saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from e2b import Sandbox, Volume, VolumeEntryStat

# Each path's "uid:gid mode" as the sandbox sees it. Not coreutils' stat: in gVisor its statx call
# answers EINVAL, on any file.
OWNERS = (
    "python3 -c 'import os, sys; "
    '[print(f"{s.st_uid}:{s.st_gid} {s.st_mode & 0o7777:o}") for s in map(os.stat, sys.argv[1:])]\''
)
SCENARIOS: dict[str, Callable[[str], dict[str, Any]]] = {}
MISSING_ID = "vol" + "0" * 17  # well formed, never issued
BIG = 100 * 1024 * 1024  # the large file's size: 100 MiB
CHUNK = 1 << 20
# What is at /mnt/v in a sandbox: the names in it, or "absent".
LISTING = 'python3 -c \'import os; p = "/mnt/v"; print(sorted(os.listdir(p)) if os.path.isdir(p) else "absent")\''


def scenario(name: str) -> Callable[[Callable[[str], dict[str, Any]]], Callable[[str], dict[str, Any]]]:
    def register(fn: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
        SCENARIOS[name] = fn
        return fn

    return register


def trace(name: str, stage: str) -> None:
    print(f"py-sync:{name}:{stage}", file=sys.stderr, flush=True)


def refusal(call: Callable[[], object]) -> dict[str, Any]:
    """What a call that should be refused did: the exception's class and message, or what it answered."""
    try:
        answer = call()
    except Exception as exc:  # noqa: BLE001 -- the refusal is the result
        # Its classes too: newer clients raise subclasses (VolumeNotFoundException is a NotFoundException).
        kinds = [kind.__name__ for kind in type(exc).__mro__]
        return {"error": type(exc).__name__, "kinds": kinds, "message": str(exc)}
    return {"error": None, "answer": repr(answer)}


def entry(stat: VolumeEntryStat) -> dict[str, Any]:
    return {
        "name": stat.name,
        "type": stat.type.value,
        "path": stat.path,
        "size": stat.size,
        "mode": stat.mode,
        "uid": stat.uid,
        "gid": stat.gid,
        "target": stat.target,
        "times": all(t.tzinfo is not None for t in (stat.atime, stat.mtime, stat.ctime)),
    }


def pattern(seed: int, size: int) -> Iterator[bytes]:
    """``size`` bytes that differ per seed and per chunk, made as they are sent."""
    sent = 0
    while sent < size:
        block = hashlib.sha256(f"{seed}:{sent}".encode()).digest() * (CHUNK // 32)
        block = block[: size - sent]
        sent += len(block)
        yield block


def digest(chunks: Iterator[bytes]) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


class Stream:
    """A file-like body the client streams in chunks (it never holds the whole file); httpx iterates it."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def read(self, n: int = -1) -> bytes:
        return next(self._chunks, b"")

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks


def suite_name(kind: str) -> str:
    return f"conformance-{kind}-{uuid.uuid4().hex[:10]}"


def destroy_quietly(volume_id: str, **opts: Any) -> None:
    try:
        Volume.destroy(volume_id, **opts)
    except Exception as exc:  # noqa: BLE001 -- cleanup reports and goes on
        print(f"cleanup of {volume_id}: {exc}", file=sys.stderr)


@scenario("volume/control")
def _control(work: str) -> dict[str, Any]:
    second = os.environ["SECOND_API_KEY"]
    name = suite_name("control")
    vol = Volume.create(name)
    others = None
    try:
        listed = Volume.list()
        info = Volume.get_info(vol.volume_id)
        connected = Volume.connect(vol.volume_id)
        result: dict[str, Any] = {
            "name": vol.name,
            "id": vol.volume_id,
            "token": bool(vol.token),
            "listed": [v.name for v in listed if v.volume_id == vol.volume_id],
            "listed_has_token": any(hasattr(v, "token") for v in listed),
            "info": [info.volume_id == vol.volume_id, info.name, info.token == vol.token],
            "connected": [connected.volume_id == vol.volume_id, connected.name, connected.token == vol.token],
            "duplicate": refusal(lambda: Volume.create(name)),
            "missing": refusal(lambda: Volume.get_info(MISSING_ID)),
            "empty_name": refusal(lambda: Volume.create("")),
            "slash_name": refusal(lambda: Volume.create("a/b")),
            # Another owner sees none of it, cannot remove it, and may use the same name.
            "second_get": refusal(lambda: Volume.get_info(vol.volume_id, api_key=second)),
            "second_lists": any(v.volume_id == vol.volume_id for v in Volume.list(api_key=second)),
            "second_destroy": Volume.destroy(vol.volume_id, api_key=second),
        }
        others = Volume.create(name, api_key=second)
        result["second_same_name"] = [others.name, others.volume_id != vol.volume_id, others.token != vol.token]
        result["first_still"] = Volume.get_info(vol.volume_id).name
        result["destroyed"] = Volume.destroy(vol.volume_id)
        result["destroyed_again"] = Volume.destroy(vol.volume_id)
        result["after"] = refusal(lambda: Volume.get_info(vol.volume_id))
        result["listed_after"] = any(v.volume_id == vol.volume_id for v in Volume.list())
        result["second_kept"] = Volume.get_info(others.volume_id, api_key=second).name
        return result
    finally:
        destroy_quietly(vol.volume_id)
        if others is not None:
            destroy_quietly(others.volume_id, api_key=second)


@scenario("volume/content")
def _content(work: str) -> dict[str, Any]:
    vol = Volume.create(suite_name("content"))
    try:
        written = vol.write_file("/notes/a.txt", "hello volume")
        result: dict[str, Any] = {
            "written": entry(written),
            "text": vol.read_file("notes/a.txt"),
            "bytes": list(vol.read_file("/notes/a.txt", format="bytes")),
            "streamed": b"".join(vol.read_file("/notes/a.txt", format="stream")).decode(),
            "stat": entry(vol.get_info("/notes/a.txt")),
            "folder": entry(vol.get_info("/notes")),
            "exists": [vol.exists("/notes/a.txt"), vol.exists("/notes/none.txt")],
            "owned": entry(vol.write_file("/owned.bin", b"\x00\xff", uid=0, gid=0, mode=0o600)),
            "replaced": entry(vol.write_file("/notes/a.txt", "replaced", force=True)),
            "replaced_text": vol.read_file("/notes/a.txt"),
            "made": entry(vol.make_dir("/deep/er/est", force=True, uid=1234, gid=2345, mode=0o700)),
            "made_parent": entry(vol.get_info("/deep")),
            "made_again": refusal(lambda: vol.make_dir("/deep")),
            "made_again_forced": entry(vol.make_dir("/deep", force=True)),
            "made_without_parent": refusal(lambda: vol.make_dir("/no/parent")),
        }
        vol.write_file("/deep/er/f.txt", "x")
        result["list"] = sorted((e.path, e.type.value) for e in vol.list("/"))
        result["list_deep"] = sorted(e.path for e in vol.list("/deep", depth=3))
        result["list_shallow"] = sorted(e.path for e in vol.list("/deep", depth=1))
        result["updated"] = entry(vol.update_metadata("/notes/a.txt", uid=0, gid=1234, mode=0o640))
        result["updated_mode_only"] = entry(vol.update_metadata("/notes/a.txt", mode=0o444))
        result["read_missing"] = refusal(lambda: vol.read_file("/notes/none.txt"))
        result["stat_missing"] = refusal(lambda: vol.get_info("/none"))
        result["list_file"] = refusal(lambda: vol.list("/notes/a.txt"))
        result["escape"] = entry(vol.write_file("/../../../escape.txt", "inside"))
        result["escape_listed"] = "/escape.txt" in {e.path for e in vol.list("/")}
        vol.remove("/notes/a.txt")
        vol.remove("/deep")
        result["removed"] = [vol.exists("/notes/a.txt"), vol.exists("/deep"), vol.exists("/notes")]
        result["remove_missing"] = refusal(lambda: vol.remove("/deep"))
        wrong = Volume(vol.volume_id, vol.name, token="not-" + (vol.token or ""))
        result["wrong_token"] = refusal(lambda: wrong.read_file("/owned.bin"))
        return result
    finally:
        destroy_quietly(vol.volume_id)


@scenario("volume/large-and-concurrent")
def _large(work: str) -> dict[str, Any]:
    vol = Volume.create(suite_name("large"))
    try:
        expected, size = digest(pattern(1, BIG))
        started = time.monotonic()
        written = vol.write_file("/big.bin", Stream(pattern(1, BIG)))
        got, got_size = digest(vol.read_file("/big.bin", format="stream"))
        result: dict[str, Any] = {
            "size": [size, written.size, got_size],
            "same": got == expected,
            "seconds": round(time.monotonic() - started, 1),
        }
        # Two clients write at once: one file each, and the same file from both.
        seeds = (2, 3)
        want = {seed: digest(pattern(seed, 8 * CHUNK))[0] for seed in seeds}
        with ThreadPoolExecutor(4) as pool:
            writes = [pool.submit(vol.write_file, f"/own-{s}.bin", Stream(pattern(s, 8 * CHUNK))) for s in seeds]
            writes += [pool.submit(vol.write_file, "/shared.bin", Stream(pattern(s, 8 * CHUNK))) for s in seeds]
            [w.result() for w in writes]
        result["own"] = [digest(vol.read_file(f"/own-{s}.bin", format="stream"))[0] == want[s] for s in seeds]
        shared = digest(vol.read_file("/shared.bin", format="stream"))[0]
        result["shared_whole"] = shared in want.values()
        result["leftovers"] = sorted(e.name for e in vol.list("/"))
        return result
    finally:
        destroy_quietly(vol.volume_id)


def sh(sbx: Sandbox, command: str, user: str = "user") -> str:
    return str(sbx.commands.run(command, user=user).stdout).strip()


@scenario("volume/mounts")
def _mounts(work: str) -> dict[str, Any]:
    vol = Volume.create(suite_name("mounts"))
    sandboxes: list[Sandbox] = []
    try:
        vol.write_file("/from-api.txt", "written through the API")
        first = Sandbox.create(volume_mounts={"/mnt/shared": vol}, timeout=120)
        sandboxes.append(first)
        second = Sandbox.create(volume_mounts={"/data": vol.name}, timeout=120)
        sandboxes.append(second)
        result: dict[str, Any] = {
            "mounts": first.get_info().volume_mounts,
            "listed_mounts": [
                item.volume_mounts for item in Sandbox.list().next_items() if item.sandbox_id == second.sandbox_id
            ],
            "api_file": sh(first, "cat /mnt/shared/from-api.txt"),
            "api_owner": sh(first, f"{OWNERS} /mnt/shared/from-api.txt"),
            "root_owner": sh(first, f"{OWNERS} /mnt/shared"),
            "whoami": sh(first, "id -u; id -g"),
        }
        sh(first, "echo from-first > /mnt/shared/first.txt && mkdir -p /mnt/shared/dir")
        sh(second, "echo from-root > /data/root.txt", user="root")
        result["second_sees"] = sh(second, "cat /data/first.txt")
        result["first_sees"] = sh(first, "cat /mnt/shared/root.txt")
        result["sandbox_owner"] = [
            line.split()[0] for line in sh(second, f"{OWNERS} /data/first.txt /data/dir /data/root.txt").splitlines()
        ]
        result["api_sees"] = [vol.read_file("/first.txt"), entry(vol.get_info("/first.txt"))["uid"]]
        result["root_file_uid"] = entry(vol.get_info("/root.txt"))["uid"]
        result["in_use"] = refusal(lambda: Volume.destroy(vol.volume_id))
        second.kill()
        first.pause()
        result["in_use_paused"] = refusal(lambda: Volume.destroy(vol.volume_id))
        vol.write_file("/while-paused.txt", "kept")
        resumed = Sandbox.connect(first.sandbox_id, timeout=120)
        sandboxes.append(resumed)
        result["resumed_sees"] = sh(resumed, "cat /mnt/shared/while-paused.txt /mnt/shared/first.txt").split()
        result["unknown_volume"] = refusal(
            lambda: sandboxes.append(Sandbox.create(volume_mounts={"/x": suite_name("none")}, timeout=60))
        )
        resumed.kill()
        result["destroyed"] = Volume.destroy(vol.volume_id)
        return result
    finally:
        for sbx in sandboxes:
            try:
                sbx.kill()
            except Exception as exc:  # noqa: BLE001 -- cleanup reports and goes on
                print(f"cleanup of {sbx.sandbox_id}: {exc}", file=sys.stderr)
        destroy_quietly(vol.volume_id)


@scenario("volume/snapshots")
def _snapshots(work: str) -> dict[str, Any]:
    """A filesystem-only pause keeps the mount; a snapshot holds the sandbox's own files, not the volume's."""
    vol = Volume.create(suite_name("snapshots"))
    sandboxes: list[Sandbox] = []
    snapshot_id = None
    try:
        source = Sandbox.create(volume_mounts={"/mnt/v": vol}, timeout=120)
        sandboxes.append(source)
        sh(source, "echo in-volume > /mnt/v/shared.txt && echo own > /home/user/own.txt")
        source.pause(keep_memory=False)
        result: dict[str, Any] = {"in_use_cold_paused": refusal(lambda: Volume.destroy(vol.volume_id))}
        vol.write_file("/while-paused.txt", "kept")
        resumed = Sandbox.connect(source.sandbox_id, timeout=120)
        sandboxes.append(resumed)
        seen = sh(resumed, "cat /mnt/v/while-paused.txt /mnt/v/shared.txt /home/user/own.txt")
        result["cold_resumed_sees"] = seen.split()
        result["cold_resumed_mounts"] = [m["path"] for m in resumed.get_info().volume_mounts]
        snapshot_id = resumed.create_snapshot().snapshot_id
        vol.write_file("/after-snapshot.txt", "later")
        plain = Sandbox.create(snapshot_id, timeout=120)
        sandboxes.append(plain)
        result["plain_sees"] = [sh(plain, "cat /home/user/own.txt"), sh(plain, LISTING)]
        result["plain_mounts"] = plain.get_info().volume_mounts
        again = Sandbox.create(snapshot_id, volume_mounts={"/mnt/v": vol.name}, timeout=120)
        sandboxes.append(again)
        result["again_sees"] = sh(again, "cat /home/user/own.txt /mnt/v/after-snapshot.txt").split()
        for sbx in (resumed, plain, again):
            sbx.kill()
        # The snapshot is kept, and does not hold the volume.
        result["destroyed"] = Volume.destroy(vol.volume_id)
        return result
    finally:
        for sbx in sandboxes:
            try:
                sbx.kill()
            except Exception as exc:  # noqa: BLE001 -- cleanup reports and goes on
                print(f"cleanup of {sbx.sandbox_id}: {exc}", file=sys.stderr)
        if snapshot_id is not None:
            Sandbox.delete_snapshot(snapshot_id)
        destroy_quietly(vol.volume_id)


def main() -> None:
    name, work = sys.argv[1], sys.argv[2]
    trace(name, "start")
    result = SCENARIOS[name](work)
    trace(name, "done")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
