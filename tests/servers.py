"""A real ``e2b-compat serve`` of a data folder of its own, for the live and reliability tests."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance._endpoint import EndpointError, ManagedServer


@contextlib.contextmanager
def managed_server(
    prefix: str,
    extra_env: dict[str, str] | None = None,
    *,
    keep_log: Callable[[], bool] = lambda: False,
    backend: str = "crun",
) -> Iterator[ManagedServer]:
    """A started server; afterwards its sandboxes, mounts and data folder are gone.

    Its log is removed too, unless the block raised or ``keep_log()`` says so (a failed test).
    """
    # Not under pytest's private temp root: idmapped sandbox users must traverse to their layers.
    data_dir = Path(tempfile.mkdtemp(prefix=f"e2b-{prefix}-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    server = ManagedServer(data_dir, data_dir.with_suffix(".log"), extra_env=extra_env or {}, backend=backend)
    passed = False
    try:
        try:
            server.start()
        except EndpointError as exc:
            pytest.fail(str(exc))
        yield server
        passed = True
    finally:
        server.stop()
        server.release_everything()
        leftovers = [line for line in Path("/proc/mounts").read_text().splitlines() if str(data_dir) in line]
        with contextlib.suppress(OSError):
            shutil.rmtree(data_dir)
        if passed and not keep_log():
            server.log.unlink(missing_ok=True)
        assert not leftovers, f"mounts left behind: {leftovers}"


def run_client(command: list[str], server: ManagedServer, cwd: str | None = None) -> Any:
    """Run an official client's script in the server's client environment; its last output line, as JSON."""
    result = subprocess.run(
        command, env=server.clients_env(), cwd=cwd, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
