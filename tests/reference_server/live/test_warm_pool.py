"""The warm pool through the official clients on a live crun server (its default pool).

A create must claim a sandbox the pool started (the runtime held its id before the create), and
what the client sees must be a cold create's: its id as host name and ``E2B_SANDBOX_ID``, the
create's env vars and metadata, the interpreter's kernels seeing the create's env vars although
they started before it. Timing is the benchmark's (``python -m benchmarks.interpreter``).
"""

from __future__ import annotations

import asyncio
import time

import httpx

from conformance._clients import NodeClients, PythonClients
from conformance._endpoint import ManagedServer
from contract.protocol import INTERPRETER_PORT
from runtime.backend import SandboxInfo, State
from runtime.crun import CrunBackend
from runtime.templates import INTERPRETER_TEMPLATE
from tests.servers import run_client

WAIT_S = 90.0  # a refill: an interpreter sandbox and its kernels, on a loaded 2-core machine


def _offered(backend: CrunBackend, info: SandboxInfo) -> bool:
    """Running, and for the interpreter its kernels up (the probe the pool waits for)."""
    if info.state is not State.RUNNING:
        return False
    if info.template != INTERPRETER_TEMPLATE:
        return True
    host, port = asyncio.run(backend.address(info.sandbox_id, INTERPRETER_PORT))
    try:
        return httpx.get(f"http://{host}:{port}/startup", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def warm_ids(server: ManagedServer, python: str, template: str, count: int) -> set[str]:
    """The runtime's sandboxes of ``template`` no client can list: the warm ones, once ``count`` are offered."""
    backend = CrunBackend(server.data_dir / "runtime")
    deadline = time.monotonic() + WAIT_S
    while True:
        listed = set(run_client([python, "-I", "-c", LIST], server))
        infos = asyncio.run(backend.list())
        warm = {
            i.sandbox_id
            for i in infos
            if i.template == template and i.sandbox_id not in listed and _offered(backend, i)
        }
        if len(warm) >= count or time.monotonic() > deadline:
            return warm
        time.sleep(0.5)


LIST = r"""
import json
from e2b import Sandbox
print(json.dumps([info.sandbox_id for info in Sandbox.list().next_items()]))
"""

PY_BASE = r"""
import json
from e2b import Sandbox
sbx = Sandbox.create(envs={"POOL_PROBE": "from-the-create"}, metadata={"who": "pool-test"})
try:
    seen = sbx.commands.run('echo "$(hostname) $E2B_SANDBOX_ID $POOL_PROBE"').stdout.split()
    info = sbx.get_info()
    print(json.dumps({"id": sbx.sandbox_id, "seen": seen, "metadata": info.metadata}))
finally:
    sbx.kill()
"""


def test_python_creates_claim_warm_sandboxes_that_look_cold(
    live_server: ManagedServer, python_clients: PythonClients
) -> None:
    python = str(python_clients.python)
    warm = warm_ids(live_server, python, "base", 2)
    assert len(warm) >= 2, "the default pool keeps two base sandboxes started"
    out = run_client([python, "-I", "-c", PY_BASE], live_server)
    assert out["id"] in warm  # claimed, not booted
    assert out["seen"] == [out["id"], out["id"], "from-the-create"]
    assert out["metadata"] == {"who": "pool-test"}


PY_INTERPRETER = r"""
import json
from e2b_code_interpreter import Sandbox
sbx = Sandbox.create(envs={"POOL_PROBE": "for-the-kernel"})
try:
    first = sbx.run_code("import os; os.environ.get('POOL_PROBE')")
    count = sbx.run_code("1+1")
    js = sbx.run_code("process.env.POOL_PROBE", language="javascript")
    print(json.dumps({"id": sbx.sandbox_id, "env": first.text, "count": count.execution_count, "js": js.text}))
finally:
    sbx.kill()
"""


def test_a_warm_interpreter_sandbox_runs_with_the_creates_env_vars(
    live_server: ManagedServer, python_clients: PythonClients
) -> None:
    python = str(python_clients.python)
    before = warm_ids(live_server, python, INTERPRETER_TEMPLATE, 1)
    out = run_client([python, "-I", "-c", PY_INTERPRETER], live_server)
    assert out["id"] in before
    # The kernels started before the create, yet see its env vars, and no run came before the client's.
    assert out["env"] == "for-the-kernel"  # a str's quotes dropped, as upstream's text does
    assert out["count"] == 2
    assert out["js"] == '"for-the-kernel"'  # Deno's string display: double quotes, which stay


JS_BASE = r"""
const { Sandbox } = require('e2b')
;(async () => {
  const sbx = await Sandbox.create({ envs: { POOL_PROBE: 'from-js' } })
  try {
    const seen = (await sbx.commands.run('echo "$(hostname) $POOL_PROBE"')).stdout.trim().split(' ')
    console.log(JSON.stringify({ id: sbx.sandboxId, seen }))
  } finally {
    await sbx.kill()
  }
})().catch((e) => { console.error(e); process.exit(1) })
"""


def test_js_creates_claim_warm_sandboxes(
    live_server: ManagedServer, python_clients: PythonClients, node_clients: NodeClients
) -> None:
    warm = warm_ids(live_server, str(python_clients.python), "base", 2)
    out = run_client(["node", "-e", JS_BASE], live_server, cwd=str(node_clients.root))
    assert out["id"] in warm
    assert out["seen"] == [out["id"], "from-js"]
