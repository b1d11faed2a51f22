"""``runtime.agent`` exposes a curated surface: everything in ``__all__`` resolves, importing it is cheap."""

from __future__ import annotations

import importlib
import subprocess
import sys


def test_all_is_sorted_complete_and_importable() -> None:
    package = importlib.import_module("runtime.agent")

    # Constants, then classes, then functions, each alphabetical (the order ruff's RUF022 keeps).
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert package.__all__ == sorted(package.__all__, key=kind)
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    public = {n for n in vars(package) if not n.startswith("_") and not isinstance(getattr(package, n), type(package))}
    assert public - {"annotations"} <= set(package.__all__)


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
