"""A simulated host reboot: the server and every sandbox process die, every mount and namespace is gone.

Three sandboxes (one running, one paused with its memory, one paused to its files) each hold a
file. The server is SIGKILLed; then ``_harness.reboot`` takes away what a reboot would, per
backend: crun's and runsc's containers are killed and deleted (and runsc's sandbox and gofer
processes killed), our Docker Engine's containers of this server are SIGKILLed (kept, as a reboot
keeps them); everything mounted under the data folder is unmounted (newest first: loop disks,
overlays, idmapped binds) and the sandboxes' network namespaces are deleted. After a
restart on the same data folder all three are listed, a connect resumes each, and each still
holds its file. Nothing is left over once they are killed.
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid

import pytest

from ._harness import Api, host_is_fine, host_state, leftovers, reboot, requests_made
from .conftest import report, running_server

pytestmark = [pytest.mark.artifacts]


def test_a_reboot_keeps_running_and_paused_sandboxes(backend: str) -> None:
    began, requests_before = time.monotonic(), requests_made()
    with running_server("reboot", backend) as server, Api(server) as api:
        before = host_state(server)
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
            taken = reboot(server, list(ids.values()))
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
        left = leftovers(before, server, api.states())
        assert not left, f"left after the kills: {left}"
    report(
        "reboot",
        backend,
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
