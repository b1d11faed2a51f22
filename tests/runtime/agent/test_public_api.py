"""``runtime.agent``'s front: the names the server and CLI use are its modules' own, importing it is cheap.

That ``__all__`` is sorted, complete and resolves is tests/contract/test_lazy.py's check of every front.
"""

from __future__ import annotations

import subprocess
import sys


def test_the_names_the_server_and_the_cli_use_are_the_private_modules_own() -> None:
    import runtime.agent
    from runtime.agent import _errors, _server, _version

    assert runtime.agent.NoDelayH11Protocol is _server.NoDelayH11Protocol
    assert runtime.agent.bind is _server.bind
    assert runtime.agent.serve is _server.serve
    assert runtime.agent.DEFAULT_HOSTS == _server.DEFAULT_HOSTS
    assert runtime.agent.ENVD_VERSION == _version.ENVD_VERSION
    assert runtime.agent.AgentError is _errors.AgentError


def test_importing_the_package_loads_nothing_else() -> None:
    heavy = ("runtime.agent.", "uvicorn", "starlette", "connectrpc")
    probe = f"import sys, runtime.agent\nprint(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
