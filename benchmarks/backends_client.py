"""Runs inside the pinned Python client's environment against a reference server on one backend.

``python -I backends_client.py <sandboxes> <iterations> <idle> <pauses> <transfers> <MiB>`` prints
JSON lines:

- first, ``{"phase": "idle-before"}`` and ``{"phase": "idle-up"}`` around starting ``<idle>``
  sandboxes, each time waiting for a line on stdin (the parent measures the host's memory
  meanwhile; nothing the later phases allocate and free can move that figure);
- last, ``{"result": {...}}``: samples in seconds of create → first ``commands.run("true")``
  (``<sandboxes>`` sandboxes one after another), warm ``commands.run("true")``, memory pause →
  resume (``pause()`` then ``connect()`` and a command), a snapshot (``create_snapshot()``: with the
  memory where the backend keeps it) and a sandbox made from it up to its first command, each
  ``<pauses>`` times, ``<transfers>`` uploads and downloads of
  ``<MiB>`` random bytes (``files.write``, ``files.read(format="bytes")``, checked), and the
  floors: a bare process spawn, a loopback HTTP round trip, and the same bytes posted to and
  fetched from a loopback server at memory speed, each with the client's own httpx. A pause the
  backend refuses is recorded as its error text, not retried. Every sandbox is killed before the
  script ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
from e2b import Sandbox

# -I leaves the checkout out of sys.path; the floor server is the one client_roundtrip.py uses.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.client_roundtrip import _floor_server, _transfer_floor_server

IDLE_TIMEOUT_S = 1800  # idle sandboxes live through hundreds of creates and the host's settling


def _emit(document: dict[str, Any]) -> None:
    print(json.dumps(document), flush=True)


def _timed(fn: Callable[[], object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def _create_to_first_run(count: int) -> dict[str, list[float]]:
    create, first_run, total = [], [], []
    for _ in range(count):
        start = time.perf_counter()
        sbx = Sandbox.create()
        try:
            created = time.perf_counter()
            sbx.commands.run("true")
            ran = time.perf_counter()
        finally:
            sbx.kill()
        create.append(created - start)
        first_run.append(ran - created)
        total.append(ran - start)
    return {"create": create, "first_run": first_run, "create_to_first_run": total}


def _pause_resume(sbx: Sandbox, count: int) -> dict[str, Any]:
    pause, resume, total = [], [], []
    for _ in range(count):
        start = time.perf_counter()
        try:
            sbx.pause()
        except Exception as exc:  # noqa: BLE001 - a backend without memory pause refuses it: recorded
            return {"pause_error": f"{type(exc).__name__}: {exc}"[:300]}
        paused = time.perf_counter()
        again = Sandbox.connect(sbx.sandbox_id)
        again.commands.run("true")
        resumed = time.perf_counter()
        pause.append(paused - start)
        resume.append(resumed - paused)
        total.append(resumed - start)
    return {"pause": pause, "resume_to_first_run": resume, "pause_resume": total}


def _snapshot_to_first_run(sbx: Sandbox, count: int) -> dict[str, Any]:
    """``create_snapshot()``, then ``Sandbox.create`` of it up to its first command (its processes go on where kept)."""
    snapshot, first_run = [], []
    for _ in range(count):
        start = time.perf_counter()
        try:
            taken = sbx.create_snapshot()
        except Exception as exc:  # noqa: BLE001 - a backend without snapshots refuses it: recorded
            return {"snapshot_error": f"{type(exc).__name__}: {exc}"[:300]}
        snapped = time.perf_counter()
        child = Sandbox.create(taken.snapshot_id)
        try:
            child.commands.run("true")
            ran = time.perf_counter()
        finally:
            child.kill()
            Sandbox.delete_snapshot(taken.snapshot_id)
        snapshot.append(snapped - start)
        first_run.append(ran - snapped)
    return {"snapshot": snapshot, "snapshot_create_to_first_run": first_run}


def _paused_memory(sbx: Sandbox) -> None:
    """The parent reads the sandbox's memory while it runs and while it is paused (memory freed or kept)."""
    _emit({"phase": "running", "sandbox": sbx.sandbox_id})
    sys.stdin.readline()
    sbx.pause()
    _emit({"phase": "paused", "sandbox": sbx.sandbox_id})
    sys.stdin.readline()
    Sandbox.connect(sbx.sandbox_id).commands.run("true")


def _transfers(sbx: Sandbox, count: int, payload: bytes) -> dict[str, list[float]]:
    """Upload and download ``payload`` through the sandbox's files API, and the same over bare loopback."""
    floor = httpx.Client(timeout=600)
    port = _transfer_floor_server(payload)
    url = f"http://127.0.0.1:{port}/"
    upload, download, floor_upload, floor_download = [], [], [], []
    path = "bench-transfer.bin"  # relative: in the sandbox user's home, on the sandbox's disk
    for _ in range(count):
        start = time.perf_counter()
        sbx.files.write(path, payload)
        upload.append(time.perf_counter() - start)
        start = time.perf_counter()
        got = sbx.files.read(path, format="bytes")
        download.append(time.perf_counter() - start)
        if bytes(got) != payload:
            raise RuntimeError("the downloaded bytes differ from the uploaded ones")
        del got
        start = time.perf_counter()
        floor.post(url, content=payload).raise_for_status()
        floor_upload.append(time.perf_counter() - start)
        start = time.perf_counter()
        if len(floor.get(url).content) != len(payload):
            raise RuntimeError("the floor server sent a short body")
        floor_download.append(time.perf_counter() - start)
    sbx.files.remove(path)
    return {
        "upload": upload,
        "download": download,
        "floor_http_upload": floor_upload,
        "floor_http_download": floor_download,
    }


def _idle(count: int) -> None:
    _emit({"phase": "idle-before"})
    sys.stdin.readline()
    made = []
    try:
        for _ in range(count):
            made.append(Sandbox.create(timeout=IDLE_TIMEOUT_S))  # outlives the creates and ksmd's settling
        for sbx in made:
            sbx.commands.run("true")  # each agent has answered once: what an idle, used sandbox holds
        time.sleep(3)
        _emit({"phase": "idle-up", "count": len(made)})
        sys.stdin.readline()
    finally:
        for sbx in made:
            sbx.kill()


def main() -> None:
    sandboxes, iterations, idle, pauses, transfers, mib = (int(arg) for arg in sys.argv[1:7])
    port = _floor_server()
    raw = httpx.Client()
    raw.get(f"http://127.0.0.1:{port}/")
    result: dict[str, Any] = {
        "floor_process_spawn": _timed(lambda: subprocess.run(["/bin/true"], check=True), iterations),
        "floor_http_round_trip": _timed(lambda: raw.get(f"http://127.0.0.1:{port}/"), iterations),
    }
    # Idle memory first: the transfers' buffers, freed later, would show as memory the sandboxes gave back.
    _idle(idle)
    result |= _create_to_first_run(sandboxes)
    sbx = Sandbox.create()
    try:
        sbx.commands.run("true")  # warm the connection
        result["warm_commands_run_true"] = _timed(lambda: sbx.commands.run("true"), iterations)
        result |= _transfers(sbx, transfers, os.urandom(mib << 20))
        result |= _snapshot_to_first_run(sbx, pauses)
        result |= _pause_resume(sbx, pauses)
        if "pause_error" not in result:
            _paused_memory(sbx)
    finally:
        sbx.kill()
    _emit({"result": result})


if __name__ == "__main__":
    main()
