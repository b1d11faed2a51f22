"""The ``mcp-gateway`` command on the host: clone, install, start, serve MCP, and every way it fails.

The servers are the dependency-free ``conformance/scenarios/in_sandbox/mcp_echo_server.py`` in
local bare repositories, which git reaches for ``https://github.com/example/...`` through
``url.<base>.insteadOf`` set in the environment (nothing leaves the host). The gateway runs
detached, as the clients start it, and is stopped by the pid it writes; the test talks to it
with the MCP SDK's client.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from runtime.mcp_gateway import StdioServer
from runtime.mcp_gateway._cli import reason
from runtime.mcp_gateway._repos import GatewayError
from runtime.mcp_gateway._upstreams import Upstreams

ECHO = Path(__file__).resolve().parents[3] / "conformance" / "scenarios" / "in_sandbox" / "mcp_echo_server.py"
TOKEN = "test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _git(*args: str, cwd: Path) -> None:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True)


@dataclass
class Gateway:
    """One gateway's folders and port, and the environment its command runs in."""

    tmp: Path
    port: int
    env: dict[str, str]

    def run(self, config: object, *extra: str) -> subprocess.CompletedProcess[str]:
        text = config if isinstance(config, str) else json.dumps(config)
        command = [sys.executable, "-m", "runtime.mcp_gateway", "--config", text, *self.flags, *extra]
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=120, check=False)

    @property
    def flags(self) -> list[str]:
        return [
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--state-dir={self.tmp / 'state'}",
            f"--token-file={self.tmp / 'etc' / '.token'}",
            f"--log={self.tmp / 'gateway.log'}",
            f"--pid-file={self.tmp / 'gateway.pid'}",
        ]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        pid_file = self.tmp / "gateway.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text())
        pid_file.unlink()
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    mirror = tmp_path / "mirror" / "example"
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "server.py").write_bytes(ECHO.read_bytes())
    _git("init", "-q", cwd=work)
    _git("add", "server.py", cwd=work)
    _git("commit", "-qm", "echo", cwd=work)
    mirror.mkdir(parents=True)
    for name in ("echo", "echo2"):
        _git("clone", "-q", "--bare", str(work), str(mirror / f"{name}.git"), cwd=tmp_path)
    env = {
        **os.environ,
        "GATEWAY_ACCESS_TOKEN": TOKEN,
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"url.{tmp_path / 'mirror'}/.insteadOf",
        "GIT_CONFIG_VALUE_0": "https://github.com/",
    }
    made = Gateway(tmp_path, _free_port(), env)
    yield made
    made.stop()


async def _offers(url: str, token: str) -> dict[str, Any]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = sorted(tool.name for tool in (await session.list_tools()).tools)
        calls = {}
        for name in tools:
            result = await session.call_tool(name, {"text": "hi"})
            calls[name] = [c.text for c in result.content if c.type == "text"]
        prompts = sorted(prompt.name for prompt in (await session.list_prompts()).prompts)
        resources = sorted(str(r.uri) for r in (await session.list_resources()).resources)
        readme = await session.read_resource(resources[0]) if resources else None
        return {
            "tools": tools,
            "calls": calls,
            "prompts": prompts,
            "resources": resources,
            "readme": [c.text for c in readme.contents if hasattr(c, "text")] if readme else [],
        }


SERVER = {"runCmd": "python3 server.py", "installCmd": "echo done > installed"}


def test_it_clones_installs_and_serves_two_servers_behind_the_token(gateway: Gateway) -> None:
    config = {
        "github/example/echo": {**SERVER, "envs": {"ECHO_PREFIX": "1: "}},
        "github/example/echo2": {**SERVER, "envs": {"ECHO_NAME": "second"}},
    }
    started = gateway.run(config)
    assert started.returncode == 0, started.stderr
    assert "serving 2 server(s)" in started.stdout
    copy = gateway.tmp / "state" / "example" / "echo"
    assert (copy / "installed").read_text() == "done\n", "installCmd ran in the working copy"
    token = gateway.tmp / "etc" / ".token"
    assert token.read_text() == TOKEN
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    offers = asyncio.run(_offers(gateway.url, TOKEN))
    assert offers == {
        "tools": ["echo", "echo-whoami", "second", "second-whoami"],
        "calls": {
            "echo": ["1: hi"],
            "echo-whoami": [f"{os.getuid()} {copy}"],
            "second": ["hi"],
            "second-whoami": [f"{os.getuid()} {gateway.tmp / 'state' / 'example' / 'echo2'}"],
        },
        "prompts": ["echo-prompt", "second-prompt"],
        "resources": ["fixture://echo/readme", "fixture://second/readme"],
        "readme": ["echo readme"],
    }
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    for headers in (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": TOKEN},
        {"Authorization": f"bearer {TOKEN}"},
    ):
        answer = httpx.post(gateway.url, json=ping, headers={**accept, **headers})
        assert answer.status_code == 401, headers
        assert answer.headers["www-authenticate"].startswith("Bearer")
    # A second start finds the port taken; the first keeps serving.
    again = gateway.run(config)
    assert again.returncode == 1
    assert "cannot listen on 127.0.0.1" in again.stderr
    assert asyncio.run(_offers(gateway.url, TOKEN))["tools"][0] == "echo"


def test_the_servers_commands_never_see_the_access_token(gateway: Gateway) -> None:
    install = "env > install.env"
    run = "env > run.env; exec python3 server.py"
    started = gateway.run({"github/example/echo": {"runCmd": run, "installCmd": install, "envs": {"MINE": "1"}}})
    assert started.returncode == 0, started.stderr
    copy = gateway.tmp / "state" / "example" / "echo"
    for name in ("install.env", "run.env"):
        seen = (copy / name).read_text()
        assert "MINE=1" in seen, f"{name}: the server's envs are missing"
        assert "GATEWAY_ACCESS_TOKEN" not in seen, f"{name}: the token reached the server's command"
        assert TOKEN not in seen


def test_sigterm_stops_the_gateway_and_its_servers(gateway: Gateway) -> None:
    started = gateway.run({"github/example/echo": SERVER})
    assert started.returncode == 0, started.stderr
    pid = int((gateway.tmp / "gateway.pid").read_text())
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert children, "the server runs as the gateway's child"
    gateway.stop()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{child}").exists() for child in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{child}").exists() for child in children), "a server outlived the gateway"


@pytest.mark.parametrize(
    ("config", "status", "words"),
    [
        ("{not json", 2, "--config is not JSON"),
        ({"duckduckgo": {}}, 2, "'duckduckgo' is from the catalogue"),
        ({"github/example/missing": SERVER}, 1, "git clone of https://github.com/example/missing.git failed"),
        ({"github/example/echo": {**SERVER, "installCmd": "echo broken >&2; exit 4"}}, 1, "status 4: broken"),
        ({"github/example/echo": {"runCmd": "exit 3"}}, 1, "(runCmd 'exit 3') did not start"),
        ({"github/example/echo": {"runCmd": "echo not-json"}}, 1, "(runCmd 'echo not-json') did not start"),
        # The same tool offered twice: a start-up error naming both, not one hiding the other.
        ({"github/example/echo": SERVER, "github/example/echo2": SERVER}, 1, "both offer the tool 'echo'"),
    ],
)
def test_a_start_that_fails_says_why_and_leaves_no_token_and_no_gateway(
    gateway: Gateway, config: object, status: int, words: str
) -> None:
    failed = gateway.run(config)
    assert failed.returncode == status, failed.stderr
    assert words in failed.stderr
    assert failed.stderr.startswith("mcp-gateway: ")
    assert not (gateway.tmp / "etc" / ".token").exists()
    with pytest.raises(httpx.ConnectError):
        httpx.post(gateway.url, json={})
    assert TOKEN not in failed.stderr + failed.stdout


def test_a_server_that_never_answers_fails_the_start_after_the_bound(tmp_path: Path) -> None:
    server = StdioServer("github/example/silent", "example", "silent", "sleep 60")
    tmp_path.mkdir(exist_ok=True)

    async def start() -> None:
        async with AsyncExitStack() as stack:
            await Upstreams().connect(
                stack, server, tmp_path, errlog=sys.stderr, env=dict(os.environ), start_seconds=0.5
            )

    began = time.monotonic()
    with pytest.raises(GatewayError, match=r"did not answer the handshake and listings within 0.5 s"):
        asyncio.run(start())
    assert time.monotonic() - began < 20, "the silent server held the start"


def test_pull_is_refused_for_want_of_a_catalogue(gateway: Gateway) -> None:
    command = [sys.executable, "-m", "runtime.mcp_gateway", "pull", "duckduckgo", "notion"]
    done = subprocess.run(command, env=gateway.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "cannot pull duckduckgo, notion: catalogue servers are container images" in done.stderr


def test_the_reason_is_the_gateway_error_behind_a_group_or_a_later_error() -> None:
    cause = GatewayError("MCP server 'x' did not start")
    later = RuntimeError("closing the transport failed")
    later.__context__ = cause  # as when a stack's exit raises while the first error passes through it
    assert reason(ExceptionGroup("group", [ValueError("v"), later])) == str(cause)
    assert reason(ExceptionGroup("g", [ExceptionGroup("h", [KeyError("k")])])) == "KeyError: 'k'"
