"""The wire recorder's fixed script for the official Python client, sync flavour.

Run by the pinned client's own interpreter (``python -I py_sync.py``) against the fixture server,
configured only by ``E2B_API_KEY``, ``E2B_API_URL`` and ``E2B_SANDBOX_URL``. The calls and their
order are the recording: changing them changes the committed fixture. Prints one JSON object with
what the client returned; the keys are the same in every flavour.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

from e2b import Sandbox, SandboxQuery

HOME = "/home/user"


def main() -> dict[str, Any]:
    sbx = Sandbox.create(metadata={"recorder": "wire"}, envs={"FIXTURE": "1"}, timeout=120)
    info = sbx.get_info()
    run = sbx.commands.run("echo fixture")
    processes = sbx.commands.list()
    written = sbx.files.write(f"{HOME}/fixture.txt", "fixture file\n")
    content = sbx.files.read(f"{HOME}/fixture.txt")
    made = sbx.files.make_dir(f"{HOME}/fixture-dir")
    entries = sbx.files.list(HOME)
    exists = sbx.files.exists(f"{HOME}/fixture.txt")
    paginator = Sandbox.list(query=SandboxQuery(metadata={"recorder": "wire"}), limit=1)
    pages: list[list[str]] = []
    while paginator.has_next:
        pages.append([item.sandbox_id for item in paginator.next_items()])
    sbx.set_timeout(60)
    paused = sbx.pause()
    paused_again = sbx.pause()
    connected = sbx.connect(timeout=120)
    snapshot = sbx.create_snapshot()
    snapshots = [s.snapshot_id for s in sbx.list_snapshots().next_items()]
    deleted = Sandbox.delete_snapshot(snapshot.snapshot_id)
    metrics = sbx.get_metrics()
    killed = sbx.kill()
    killed_again = sbx.kill()
    return {
        "client_version": importlib.metadata.version("e2b"),
        "sandbox_id": sbx.sandbox_id,
        "info": {"state": info.state.value, "metadata": info.metadata, "template_id": info.template_id},
        "run": {"stdout": run.stdout, "stderr": run.stderr, "exit_code": run.exit_code},
        "processes": [p.pid for p in processes],
        "written": {"name": written.name, "path": written.path, "type": written.type and written.type.value},
        "read": content,
        "made_dir": made,
        "listed": [e.name for e in entries],
        "exists": exists,
        "pages": pages,
        "paused": paused,
        "paused_again": paused_again,
        "connected": connected.sandbox_id,
        "snapshot": {"id": snapshot.snapshot_id, "names": snapshot.names},
        "snapshots": snapshots,
        "deleted_snapshot": deleted,
        "metrics": len(metrics),
        "killed": killed,
        "killed_again": killed_again,
    }


if __name__ == "__main__":
    print(json.dumps(main()))
