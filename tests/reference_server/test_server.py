"""Assembling the server over the in-memory backend: the data folder, its modes, and a working edge."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from reference_server._config import EVENT_LOOPS, ServerConfig
from reference_server._server import loop_factory, open_server
from runtime.fake import FakeBackend

from .conftest import RecordingInitializer

pytestmark = pytest.mark.anyio


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_data_folder_and_a_restart(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path / "data", port=18443)
    backend = FakeBackend()
    async with open_server(config, backend=backend, initialize=RecordingInitializer()) as server:
        data = config.data_dir
        assert mode(data) == 0o711, "traversable by sandbox users, not listable"
        assert mode(data / "ca.pem") == 0o644, "every local user's clients must read the CA"
        assert mode(data / "tls") == 0o700
        for secret in ("server.db", "api-key", "master.key"):
            assert mode(data / secret) == 0o600, secret
        env = server.client_environment.as_dict()
        assert env == {
            "E2B_API_KEY": server.api_key,
            "E2B_DOMAIN": "e2b.localhost:18443",
            "SSL_CERT_FILE": str(data / "ca.pem"),
            "NODE_EXTRA_CA_CERTS": str(data / "ca.pem"),
        }
        assert await server.keys.authenticate(server.api_key) == "default"
        transport = httpx.ASGITransport(app=server.edge)
        async with httpx.AsyncClient(transport=transport) as client:
            created = await client.post(
                "https://api.e2b.localhost:18443/sandboxes",
                json={"templateID": "base", "timeout": 60},
                headers={"X-API-Key": server.api_key},
            )
            assert created.status_code == 201
            assert created.json()["domain"] == "e2b.localhost:18443"
        first_key, sandbox_id = server.api_key, created.json()["sandboxID"]
        ca = (data / "ca.pem").read_bytes()
    async with open_server(config, backend=backend, initialize=RecordingInitializer()) as again:
        assert again.api_key == first_key, "the first-start key is kept"
        assert (data / "ca.pem").read_bytes() == ca, "clients were told to trust this CA: it is kept"
        assert again.reconciliation.kept == (sandbox_id,)


# uvicorn raises the stop signal again after its shutdown: with the default SIGTERM handler that
# ended the process before open_server's cleanup (the warm pool's sandboxes outlived the server).
STOP_SIGNAL = """
import signal
from reference_server._server import _stop_signals_handled
with _stop_signals_handled():
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGINT)
print("cleanup runs")
"""


def test_a_stop_signal_raised_again_after_shutdown_lets_the_cleanup_run() -> None:
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", STOP_SIGNAL], capture_output=True, text=True, timeout=60, check=False, cwd=repo
    )
    assert (done.returncode, done.stdout) == (0, "cleanup runs\n"), done.stderr


def test_each_event_loop_setting_makes_its_loop() -> None:
    kinds = {}
    for name in EVENT_LOOPS:
        loop = loop_factory(name)()
        try:
            kinds[name] = type(loop).__module__.split(".")[0]
            assert isinstance(loop, asyncio.AbstractEventLoop)
        finally:
            loop.close()
    assert kinds == {"uvloop": "uvloop", "asyncio": "asyncio"}
    with pytest.raises(ValueError, match="unknown event loop 'trio'"):
        loop_factory("trio")
