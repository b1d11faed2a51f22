"""A simulated host reboot: the server and every sandbox process die, every mount and namespace is gone.

Three sandboxes (one running, one paused with its memory, one paused to its files) each hold a
file. The server is SIGKILLed; then every crun container of its backend is deleted, everything
mounted under its data folder is unmounted (newest first: loop disks, overlays, idmapped binds)
and the sandboxes' network namespaces are deleted, as a reboot would leave the host. After a
restart on the same data folder all three are listed, a connect resumes each, and each still
holds its file. Nothing is left over once they are killed.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ._harness import Api, host_is_fine, host_state, leftovers, requests_made
from .conftest import report, running_server

pytestmark = [pytest.mark.artifacts]


def _reboot(data_dir: Path, sandbox_ids: list[str]) -> dict[str, int]:
    """What a reboot takes away from the host, done by hand: containers, mounts, namespaces."""
    crun_root = data_dir / "runtime" / "crun"
    containers = sorted(p.name for p in crun_root.iterdir()) if crun_root.is_dir() else []
    for container in containers:
        subprocess.run(["crun", "--root", str(crun_root), "kill", container, "KILL"], capture_output=True, check=False)
        subprocess.run(
            ["crun", "--root", str(crun_root), "delete", "--force", container], capture_output=True, check=False
        )
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    ours = [m for m in mounts if m.startswith(f"{data_dir}/")]
    for mount_point in reversed(ours):  # /proc/mounts lists in mount order: undo newest first
        done = subprocess.run(["umount", mount_point], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"umount {mount_point}: {done.stderr}"
    namespaces = 0
    for sandbox_id in sandbox_ids:
        if Path(f"/run/netns/e2b-{sandbox_id}").exists():
            subprocess.run(["ip", "netns", "delete", f"e2b-{sandbox_id}"], check=True)
            namespaces += 1
    return {"containers_deleted": len(containers), "mounts_removed": len(ours), "netns_deleted": namespaces}


def test_a_reboot_keeps_running_and_paused_sandboxes() -> None:
    began, requests_before = time.monotonic(), requests_made()
    with running_server("reboot") as server, Api(server) as api:
        before = host_state(server.data_dir)
        kinds = ("running", "paused-memory", "paused-files")
        sandboxes = {kind: api.created(timeout=900) for kind in kinds}
        markers = {kind: uuid.uuid4().hex for kind in kinds}
        ids = {kind: sandbox["sandboxID"] for kind, sandbox in sandboxes.items()}
        try:
            for kind, sandbox in sandboxes.items():
                written = api.envd(sandbox).write("/home/user/kept", markers[kind].encode())
                assert written.status_code == 200, written.text
            for kind, memory in (("paused-memory", True), ("paused-files", False)):
                paused = api.request("POST", f"/sandboxes/{ids[kind]}/pause", json={"memory": memory})
                assert paused.status_code == 204, paused.text
            server.stop(signal.SIGKILL)
            taken = _reboot(server.data_dir, list(ids.values()))
            server.start()
            states = api.states()
            missing = {kind: i for kind, i in ids.items() if i not in states}
            assert not missing, f"after the reboot these sandboxes are gone: {missing} (listed: {states})"
            problems = []
            for kind, sandbox_id in ids.items():
                resumed = api.request("POST", f"/sandboxes/{sandbox_id}/connect", json={"timeout": 300})
                if resumed.status_code not in (200, 201):
                    problems.append(
                        f"{kind} ({states[sandbox_id]}): connect answered {resumed.status_code} {resumed.text}"
                    )
                    continue
                token = resumed.json().get("envdAccessToken") or sandboxes[kind].get("envdAccessToken")
                kept = api.envd({"sandboxID": sandbox_id, "envdAccessToken": token}).read("/home/user/kept")
                if kept.status_code != 200 or kept.text != markers[kind]:
                    problems.append(f"{kind}: its file reads {kept.status_code} {kept.text[:100]!r}")
            assert not problems, "; ".join(problems)
            host_is_fine(server.data_dir)
        finally:
            for sandbox_id in ids.values():
                with contextlib.suppress(Exception):
                    api.kill(sandbox_id)
        left = leftovers(before, server.data_dir, api.states())
        assert not left, f"left after the kills: {left}"
    report(
        "reboot",
        sandboxes=len(ids),
        states_before={kind: kind.split("-")[0] for kind in kinds},
        states_after={kind: states[i] for kind, i in ids.items()},
        faults_injected=1,
        **taken,
        resumed=len(ids),
        requests=requests_made() - requests_before,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )
