"""Volumes through the pinned official clients, unchanged, on every serving backend.

The cases are the harness's (``conformance._cases``, family ``volume``): control operations and
owners, the content API (a 100 MiB file, concurrent writers), and volumes mounted into two
sandboxes at once, their owners as a sandbox sees them, in-use refusals, pause/resume with and
without memory, and snapshots of a sandbox that mounts one (they hold none of its files). Beside
them, a restart of the server (SIGKILL, then start) loses no volume, file or mount.
"""

from __future__ import annotations

import json
import signal

import pytest

from conformance._cases import Case, cases
from conformance._clients import NodeClients, PythonClients
from conformance._endpoint import ManagedServer as LiveServer
from conformance._scenarios import SCENARIOS, ScenarioRunner
from tests.servers import managed_server, run_client

from .conftest import check_case

pytestmark = [pytest.mark.artifacts]


@pytest.fixture(scope="module")
def volume_runner(
    backend_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients
) -> ScenarioRunner:
    """Volume scenarios (``scenarios/volume``) per client flavour, as one owner with another's key at hand."""
    return ScenarioRunner(
        python_clients,
        node_clients,
        env=backend_server.clients_env(SECOND_API_KEY=backend_server.issue_key("volume-second")),
        workdir=lambda name: "/home/user",
        scripts=SCENARIOS / "volume",
    )


@pytest.mark.parametrize(
    ("flavour", "case"),
    [pytest.param(f, case, id=f"{f}:{case.name}") for case in cases("volume") for f in case.flavours],
)
def test_volume_scenario(
    request: pytest.FixtureRequest, volume_runner: ScenarioRunner, flavour: str, case: Case
) -> None:
    check_case(request, volume_runner, flavour, case)


BEFORE = r"""
import json
from e2b import Sandbox, Volume
vol = Volume.create("kept-across-restarts")
vol.write_file("/a/b.txt", "before the restart\n")
vol.make_dir("/empty", mode=0o700)
sbx = Sandbox.create(volume_mounts={"/mnt/v": vol}, timeout=600)
sbx.commands.run("echo from-the-sandbox > /mnt/v/s.txt")
print(json.dumps({"volume": vol.volume_id, "token": vol.token, "sandbox": sbx.sandbox_id}))
"""

AFTER = r"""
import json, sys
from e2b import Sandbox, Volume, VolumeException
before = json.loads(sys.argv[1])
vol = Volume.connect(before["volume"])
sbx = Sandbox.connect(before["sandbox"])
sees = sbx.commands.run("cat /mnt/v/a/b.txt /mnt/v/s.txt").stdout.split()
sbx.commands.run("echo after > /mnt/v/after.txt")
try:
    Volume.destroy(vol.volume_id)
    in_use = None
except VolumeException as exc:
    in_use = str(exc)
later = Sandbox.create(volume_mounts={"/data": vol.name}, timeout=120)
later_sees = later.commands.run("cat /data/after.txt").stdout.strip()
later.kill()
sbx.kill()
print(json.dumps({
    "listed": [v.name for v in Volume.list() if v.volume_id == vol.volume_id],
    "same_token": vol.token == before["token"],
    "file": vol.read_file("/a/b.txt"),
    "empty_mode": oct(vol.get_info("/empty").mode),
    "sandbox_sees": sees,
    "api_sees": vol.read_file("/after.txt"),
    "later_sees": later_sees,
    "in_use": in_use,
    "destroyed": Volume.destroy(vol.volume_id),
}))
"""


def test_a_server_restart_loses_no_volume(python_clients: PythonClients) -> None:
    """SIGKILL mid-life and start again: the volume, its token, its files and a running sandbox's mount remain."""
    python = str(python_clients.python)
    with managed_server("volume-restart") as server:
        before = run_client([python, "-I", "-c", BEFORE], server)
        server.stop(signal.SIGKILL)
        server.start()
        after = run_client([python, "-I", "-c", AFTER, json.dumps(before)], server)
    assert after["listed"] == ["kept-across-restarts"]
    assert after["same_token"] is True, "the volume's token changed across the restart"
    assert after["file"] == "before the restart\n"
    assert after["empty_mode"] == "0o700"
    assert after["sandbox_sees"] == ["before", "the", "restart", "from-the-sandbox"]
    assert after["api_sees"] == "after\n", "the adopted sandbox's mount no longer reaches the volume"
    assert after["later_sees"] == "after", "a sandbox created after the restart does not see the volume"
    assert after["in_use"] is not None, "destroy of a volume a running sandbox mounts was not refused"
    assert "in use" in after["in_use"].lower()
    assert after["destroyed"] is True
