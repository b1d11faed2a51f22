"""``Sandbox.create(mcp=...)`` through the unchanged official clients, then MCP spoken to the gateway.

The sandbox has no route out, so the server's repository cannot come from github.com: a first
sandbox makes a bare git repository of ``conformance/scenarios/in_sandbox/mcp_echo_server.py`` in a
volume, and the MCP sandbox mounts that volume and points git at it with ``url.<base>.insteadOf`` in its envs
(``GIT_CONFIG_COUNT``/``KEY``/``VALUE``, git's own settings), the documented create options a
user offline would use. Everything else is what the clients do for a user: the template
``mcp-gateway``, ``mcp-gateway --config`` run as root with the token they chose, the URL
``https://50005-<id>.<domain>/mcp``; the test then talks MCP to that URL with the MCP SDK's
client (tools, prompts, resources), checks the token is required, and that the clients read the
same token back from the sandbox. It runs on every serving backend, with the pinned and the
newest Python client and the pinned JS client.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from conformance._clients import (
    NodeClients,
    PythonClients,
    available_python_versions,
    ensure_python_clients,
)
from conformance._endpoint import ManagedServer as LiveServer
from tests.servers import run_client

pytestmark = [pytest.mark.artifacts]

ECHO = Path(__file__).resolve().parents[3] / "conformance" / "scenarios" / "in_sandbox" / "mcp_echo_server.py"
MIRROR = "/mnt/mirror"
SERVER = "github/example/echo"
# git's own configuration through the environment: github.com's URL of the repository becomes the volume's copy.
GIT_ENVS = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": f"url.{MIRROR}/.insteadOf",
    "GIT_CONFIG_VALUE_0": "https://github.com/",
}
CONFIG = {SERVER: {"runCmd": "python3 server.py", "installCmd": "touch installed", "envs": {"ECHO_PREFIX": "> "}}}

PREPARE = r"""
import json, sys
from e2b import Sandbox, Volume
source = open(sys.argv[1]).read()
vol = Volume.create(sys.argv[2])
helper = Sandbox.create(volume_mounts={"/mnt/mirror": vol}, timeout=120)
try:
    # git, as root, refuses a repository of another owner.
    helper.files.write("/tmp/echo/server.py", source, user="root")
    helper.commands.run(
        "cd /tmp/echo && git init -q && git add server.py && git -c user.name=t -c user.email=t@example.com "
        "commit -qm echo && mkdir -p /mnt/mirror/example && git clone -q --bare /tmp/echo /mnt/mirror/example/echo.git",
        user="root",
    )
finally:
    helper.kill()
print(json.dumps({"volume": vol.volume_id, "name": vol.name}))
"""

# The working copy's names, by python: gVisor's runsc refuses coreutils' statx (see runtime/gvisor.py).
LIST = "python3 -c 'import os; print(*sorted(os.listdir(\"/var/lib/mcp-gateway/example/echo\")))'"

CREATE_PY = r"""
import json, sys
from e2b import Sandbox, SandboxException
args = json.loads(sys.argv[1])
LIST = args["list"]
mounts = {"/mnt/mirror": args["volume"]}
sbx = Sandbox.create(mcp=args["config"], envs=args["envs"], volume_mounts=mounts, metadata=args["mark"], timeout=300)
seen = sbx.commands.run(LIST, user="root").stdout.split()
again = Sandbox.connect(sbx.sandbox_id)
refusals = {}
for name, config in args["refused"].items():
    try:
        Sandbox.create(mcp=config, envs=args["envs"], volume_mounts=mounts, metadata=args["mark"], timeout=60)
        refusals[name] = None
    except SandboxException as exc:
        refusals[name] = [type(exc).__name__, str(exc)]
print(json.dumps({
    "id": sbx.sandbox_id, "url": sbx.get_mcp_url(), "token": sbx.get_mcp_token(),
    "read_back": again.get_mcp_token(), "working_copy": seen, "refusals": refusals,
}))
"""

CREATE_JS = r"""
const { Sandbox } = require('e2b')
;(async () => {
  const args = JSON.parse(process.argv[1])  // node -e: argv is [node, ...args]
  const volumeMounts = { '/mnt/mirror': args.volume }
  const options = { envs: args.envs, volumeMounts, metadata: args.mark }
  const sbx = await Sandbox.create({ ...options, mcp: args.config, timeoutMs: 300000 })
  const listing = await sbx.commands.run(args.list, { user: 'root' })
  const seen = listing.stdout.split(/\s+/).filter(Boolean)
  const again = await Sandbox.connect(sbx.sandboxId)
  const refusals = {}
  for (const [name, config] of Object.entries(args.refused)) {
    try {
      await Sandbox.create({ ...options, mcp: config, timeoutMs: 60000 })
      refusals[name] = null
    } catch (err) {
      refusals[name] = [err.name, `${err.message}\n${err.stderr ?? ''}`]  // 2.33 keeps the gateway's words in stderr
    }
  }
  console.log(JSON.stringify({
    id: sbx.sandboxId, url: sbx.getMcpUrl(), token: await sbx.getMcpToken(),
    read_back: await again.getMcpToken(), working_copy: seen, refusals,
  }))
})().catch((err) => { console.error(err); process.exit(1) })
"""

# Every sandbox a client script makes carries a mark, which the volume's teardown kills by: the
# clients before 2.34 leave a sandbox whose gateway failed running, and a failed script its own.
MARK = {"e2b-compat-test": "mcp-test"}
DESTROY = r"""
import sys
from e2b import Sandbox, Volume
listed = Sandbox.list()
while listed.has_next:
    for info in listed.next_items():
        if info.metadata.get("e2b-compat-test") == "mcp-test":
            Sandbox.kill(info.sandbox_id)
Volume.destroy(sys.argv[1])
print("{}")
"""

# What the gateway refuses, and the words of the refusal every client shows (the newer ones put
# "Failed to start MCP gateway: " before the gateway's stderr, 2.32 "Command exited with code 1").
REFUSED = {
    # A catalogue server: refused at create (400), no sandbox made.
    "catalogue": {"duckduckgo": {}},
    # A repository git cannot find: the gateway's start fails, the client kills the sandbox.
    "missing": {"github/example/missing": {"runCmd": "python3 server.py"}},
    # A server that exits at once.
    "exits": {SERVER: {"runCmd": "exit 3"}},
}
REFUSAL_WORDS = {
    "catalogue": "'duckduckgo' is from the catalogue",
    "missing": "mcp-gateway: MCP server 'github/example/missing': git clone of https://github.com/example/missing.git",
    "exits": "mcp-gateway: MCP server 'github/example/echo' (runCmd 'exit 3') did not start",
}


@pytest.fixture(scope="module")
def mirror(backend_server: LiveServer, python_clients: PythonClients) -> Iterator[str]:
    """The name of a volume holding the echo server's repository as ``example/echo.git``; destroyed at the end."""
    script = [str(python_clients.python), "-c", PREPARE, str(ECHO), f"mcp-mirror-{backend_server.backend}"]
    made = run_client(script, backend_server)
    yield str(made["name"])  # what volume mounts name
    run_client([str(python_clients.python), "-c", DESTROY, str(made["volume"])], backend_server)


def _ca(server: LiveServer) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=server.clients_env()["SSL_CERT_FILE"])


async def _talk(url: str, token: str, ca: ssl.SSLContext) -> dict[str, Any]:
    """What the gateway offers and answers, through the MCP SDK's streamable-HTTP client."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, verify=ca, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        started = await session.initialize()
        tools = sorted(tool.name for tool in (await session.list_tools()).tools)
        echoed = await session.call_tool("echo", {"text": "hello"})
        whoami = await session.call_tool("echo-whoami", {})
        prompt = await session.get_prompt("echo-prompt")
        resources = [str(r.uri) for r in (await session.list_resources()).resources]
        readme = await session.read_resource("fixture://echo/readme")
        return {
            "server": started.server_info.name,
            "tools": tools,
            "echo": [c.text for c in echoed.content if c.type == "text"],
            "whoami": [c.text for c in whoami.content if c.type == "text"],
            "prompt": [m.content.text for m in prompt.messages if m.content.type == "text"],
            "resources": resources,
            "readme": [c.text for c in readme.contents if hasattr(c, "text")],
        }


def _clients(python_clients: PythonClients) -> dict[str, PythonClients]:
    return {"pinned": python_clients, "newest": ensure_python_clients(available_python_versions()[-1])}


@pytest.mark.parametrize("client", ["py-pinned", "py-newest", "js-pinned"])
def test_a_sandbox_made_with_mcp_serves_its_servers_at_the_clients_url(
    backend_server: LiveServer, python_clients: PythonClients, node_clients: NodeClients, mirror: str, client: str
) -> None:
    args = json.dumps(
        {"config": CONFIG, "envs": GIT_ENVS, "volume": mirror, "refused": REFUSED, "mark": MARK, "list": LIST}
    )
    if client == "js-pinned":
        made = run_client(["node", "-e", CREATE_JS, args], backend_server, cwd=str(node_clients.root))
    else:
        py = _clients(python_clients)[client.removeprefix("py-")]
        made = run_client([str(py.python), "-c", CREATE_PY, args], backend_server)
    try:
        host = f"50005-{made['id']}.{backend_server.domain}"
        assert made["url"] == f"https://{host}/mcp"
        assert made["read_back"] == made["token"], "the token file holds the token the client chose"
        assert made["working_copy"] == [".git", "installed", "server.py"], "cloned, and installCmd ran in the copy"
        for name, words in REFUSAL_WORDS.items():
            assert made["refusals"][name] is not None, f"{name}: the create succeeded"
            assert words in made["refusals"][name][1], (name, made["refusals"][name])
        talked = asyncio.run(_talk(made["url"], made["token"], _ca(backend_server)))
        assert talked == {
            "server": "e2b-compat-mcp-gateway",
            "tools": ["echo", "echo-whoami"],
            "echo": ["> hello"],  # the server's envs reached it
            "whoami": ["0 /var/lib/mcp-gateway/example/echo"],  # root, in its working copy
            "prompt": ["hello from echo"],
            "resources": ["fixture://echo/readme"],
            "readme": ["echo readme"],
        }
        # Without the token, or with another, the gateway answers 401 and nothing else.
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        accept = {"Accept": "application/json, text/event-stream"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": made["token"]}):
            answer = httpx.post(made["url"], json=initialize, headers={**accept, **headers}, verify=_ca(backend_server))
            assert answer.status_code == 401, (headers, answer.status_code, answer.text)
            assert made["token"] not in answer.text
    finally:
        kill = [
            str(python_clients.python),
            "-c",
            "import sys; from e2b import Sandbox; Sandbox.kill(sys.argv[1]); print('{}')",
        ]
        subprocess.run(
            [*kill, made["id"]], env=backend_server.clients_env(), check=True, capture_output=True, timeout=120
        )
