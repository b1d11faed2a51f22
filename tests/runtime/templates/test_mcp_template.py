"""``mcp-gateway``: base plus the MCP SDK's locked environment, the gateway package and its command.

The lock is checked as committed; the real template is built into the default cache once per
source tree and lock (tests marked ``artifacts``) and inspected from the outside.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runtime.templates import PlainProgress, Template, _commands, _kernels, _keys, ensure_template, prune_templates

_PINNED = re.compile(r"^([a-z0-9][a-z0-9._-]*)==([^ ]+) --hash=sha256:[0-9a-f]{64}$")
LOCK = _kernels.lock_path(name=_kernels.MCP_LOCK)


def test_the_lock_pins_and_hashes_the_mcp_sdk_and_everything_it_needs() -> None:
    locked = {}
    for line in _kernels.read_lock(LOCK).decode().splitlines():
        if line.startswith("#"):
            continue
        match = _PINNED.fullmatch(line)
        assert match is not None, f"not an exact, hashed pin: {line!r}"
        locked[match[1].replace("_", "-")] = match[2]
    asked = [line for line in (LOCK.parent / "mcp-gateway.in").read_text().splitlines() if line and line[0] != "#"]
    assert asked == ["mcp==2.3.0"]
    assert locked["mcp"] == "2.3.0"
    assert {"uvicorn", "starlette", "pydantic", "anyio", "mcp-types"} <= set(locked)


def test_the_keys_follow_base_and_the_lock() -> None:
    layer = _keys.recipe_key(_keys.mcp_layer_recipe("o" * 64, b"lock"))
    assert layer == _keys.recipe_key(_keys.mcp_layer_recipe("o" * 64, b"lock"))
    assert layer != _keys.recipe_key(_keys.mcp_layer_recipe("p" * 64, b"lock"))
    assert layer != _keys.recipe_key(_keys.mcp_layer_recipe("o" * 64, b"lock2"))
    key = _keys.recipe_key(_keys.mcp_template_recipe("a" * 64, layer))
    assert key != _keys.recipe_key(_keys.mcp_template_recipe("b" * 64, layer)), "a code change is a new template"
    assert key != _keys.recipe_key(_keys.mcp_template_recipe("a" * 64, "m" * 64))


def test_prune_keeps_the_newest_gateway_templates(tmp_path: Path) -> None:
    root = tmp_path / "templates"
    for index in range(3):
        folder = root / f"{_keys.MCP_TEMPLATE}-{index:016x}"
        (folder / "rootfs").mkdir(parents=True)
        meta = folder / "template.json"
        meta.write_text(json.dumps({"name": _keys.MCP_TEMPLATE, "key": f"{index:064x}", "agent_command": ["x"]}))
        os.utime(meta, (1_000_000 + index, 1_000_000 + index))
    removed = prune_templates(tmp_path, keep=2)
    assert [p.name for p in removed] == [f"{_keys.MCP_TEMPLATE}-0000000000000000"]


# --- the real template ---


@pytest.fixture(scope="session")
def mcp_template() -> Template:
    if os.geteuid() != 0:
        pytest.skip("building a template needs root")
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is not installed")
    return ensure_template(_keys.MCP_TEMPLATE, progress=PlainProgress())


def _in_root(rootfs: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(rootfs), *cmd], env=_commands.CHROOT_ENV, capture_output=True, text=True, check=False
    )


@pytest.mark.artifacts
def test_it_is_base_plus_the_mcp_layer_with_base_agent(mcp_template: Template) -> None:
    meta = json.loads((mcp_template.path / "template.json").read_text())
    base = ensure_template("base", progress=PlainProgress())
    os_key = json.loads((base.path / "template.json").read_text())["recipe"]["os_key"]
    layer_key = _keys.recipe_key(_keys.mcp_layer_recipe(os_key, _kernels.read_lock(LOCK)))
    assert meta["recipe"] == _keys.mcp_template_recipe(base.key, layer_key)
    assert meta["from"] == [base.path.name, f"mcp-{layer_key[:16]}"]
    assert mcp_template.agent_command == _keys.AGENT_COMMAND
    layer = base.path.parent / f"mcp-{layer_key[:16]}"
    assert not (layer / "rootfs/opt/e2b-compat/venv").exists(), "the agent is base's, not the mcp layer's"
    assert any(
        name.startswith("mcp-2.3.0-") for name in json.loads((layer / "template.json").read_text())["mcp_wheels"]
    )


@pytest.mark.artifacts
def test_the_command_runs_the_gateway_copied_from_the_sources_with_the_sdk(mcp_template: Template) -> None:
    rootfs = mcp_template.rootfs
    helped = _in_root(rootfs, _keys.MCP_COMMAND, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--config" in helped.stdout
    refused = _in_root(rootfs, _keys.MCP_COMMAND, "--config", '{"duckduckgo": {}}')
    assert refused.returncode == 2
    assert "'duckduckgo' is from the catalogue" in refused.stderr
    copied = sorted((rootfs / "opt/e2b-compat/mcp").glob(f"lib/python3.*/site-packages/{_keys.MCP_PACKAGE}/*.py"))
    sources = Path(__file__).resolve().parents[3] / "runtime" / "mcp_gateway"
    assert [path.name for path in copied] == sorted(path.name for path in sources.glob("*.py"))
    for path in copied:
        assert path.read_bytes() == (sources / path.name).read_bytes(), f"{path.name} is not the sources' copy"
