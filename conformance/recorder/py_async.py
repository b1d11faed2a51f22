"""The wire recorder's fixed script for the official Python client, async flavour.

Run by the pinned client's own interpreter (``python -I py_async.py``) against the fixture server,
configured only by ``E2B_API_KEY``, ``E2B_API_URL`` and ``E2B_SANDBOX_URL``. The calls and their
order are the recording (the same as ``py_sync.py``); prints one JSON object with the same keys.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from typing import Any

from e2b import AsyncSandbox, SandboxQuery

HOME = "/home/user"


async def main() -> dict[str, Any]:
    sbx = await AsyncSandbox.create(metadata={"recorder": "wire"}, envs={"FIXTURE": "1"}, timeout=120)
    info = await sbx.get_info()
    run = await sbx.commands.run("echo fixture")
    processes = await sbx.commands.list()
    written = await sbx.files.write(f"{HOME}/fixture.txt", "fixture file\n")
    content = await sbx.files.read(f"{HOME}/fixture.txt")
    made = await sbx.files.make_dir(f"{HOME}/fixture-dir")
    entries = await sbx.files.list(HOME)
    exists = await sbx.files.exists(f"{HOME}/fixture.txt")
    paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"recorder": "wire"}), limit=1)
    pages: list[list[str]] = []
    while paginator.has_next:
        pages.append([item.sandbox_id for item in await paginator.next_items()])
    await sbx.set_timeout(60)
    paused = await sbx.pause()
    paused_again = await sbx.pause()
    connected = await sbx.connect(timeout=120)
    snapshot = await sbx.create_snapshot()
    snapshots = [s.snapshot_id for s in await sbx.list_snapshots().next_items()]
    deleted = await AsyncSandbox.delete_snapshot(snapshot.snapshot_id)
    metrics = await sbx.get_metrics()
    killed = await sbx.kill()
    killed_again = await sbx.kill()
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
    print(json.dumps(asyncio.run(main())))
