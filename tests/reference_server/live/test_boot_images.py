"""Boot images through the official Python client on a live crun server without a warm pool.

The first create of ``base`` boots and sets off the template's boot image; the creates after it
restore that image (docs/ARCHITECTURE.md, *Boot images*). What the client sees must be a cold
create's: its id as host name and ``E2B_SANDBOX_ID``, the create's env vars and metadata, files
and commands as any user. The one trace of the restore, visible to the sandbox's root only, is
the id of the private sandbox in the init's environment: it tells the two kinds apart here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from conformance._clients import PythonClients
from conformance._endpoint import ManagedServer
from runtime import _checkpoint_tools
from tests.servers import managed_server, run_client

WAIT_S = 60.0  # the image is made in the background in about half a second; a loaded host is slower

CREATE = r"""
import json, sys
from e2b import Sandbox
sbx = Sandbox.create(envs={"PROBE": sys.argv[1]}, metadata={"probe": sys.argv[1]})
try:
    seen = sbx.commands.run('echo "$(hostname) $E2B_SANDBOX_ID $PROBE $(whoami)"').stdout.split()
    init = sbx.commands.run("tr '\\0' '\\n' < /proc/1/environ | grep ^E2B_SANDBOX_ID=", user="root").stdout.strip()
    sbx.files.write("/home/user/probe.txt", sys.argv[1])
    print(json.dumps({
        "id": sbx.sandbox_id,
        "seen": seen,
        "init": init.partition("=")[2],
        "metadata": sbx.get_info().metadata,
        "file": sbx.files.read("/home/user/probe.txt"),
    }))
finally:
    sbx.kill()
"""


@pytest.fixture(scope="module")
def server() -> Iterator[ManagedServer]:
    if _checkpoint_tools.find() is None:
        pytest.skip("the checkpoint tools are not built on this host (e2b-compat host prepare builds them)")
    with managed_server("boot-images", {"E2B_COMPAT_SERVER_WARM_POOL_MEMORY_MB": "0"}) as started:
        yield started


def _images(server: ManagedServer) -> list[str]:
    folder = server.data_dir / "runtime" / "boot-images"
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def test_creates_after_the_first_restore_the_boot_image_and_look_cold(
    server: ManagedServer, python_clients: PythonClients
) -> None:
    python = str(python_clients.python)
    assert _images(server) == [], "nothing booted yet"
    first = run_client([python, "-I", "-c", CREATE, "first"], server)
    assert first["init"] == first["id"], "booted: its init was started for it"
    deadline = time.monotonic() + WAIT_S
    while not _images(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_images(server)) == 1, "made after the first cold start"
    for probe in ("second", "third"):
        seen = run_client([python, "-I", "-c", CREATE, probe], server)
        sandbox_id = seen["id"]
        assert seen["init"].startswith("boot-"), "restored from the boot image"
        assert seen["seen"] == [sandbox_id, sandbox_id, probe, "user"]
        assert seen["metadata"] == {"probe": probe}
        assert seen["file"] == probe
    assert len(_images(server)) == 1, "one image, kept"
    assert "made the boot image of base" in server.log.read_text()
