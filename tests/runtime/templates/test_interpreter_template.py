"""``code-interpreter-v1``: base plus the kernels' locked environment, and an agent that starts the server.

The lock is checked as committed (every package pinned and hashed, everything asked for
present); the real template is built into the default cache once per source tree and lock
(tests marked ``artifacts``) and inspected from the outside, as the sandbox user would see it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runtime.agent.__main__ import build_parser
from runtime.agent._services import parse_service
from runtime.templates import (
    INTERPRETER_TEMPLATE,
    PlainProgress,
    Template,
    TemplateError,
    _commands,
    _kernels,
    _keys,
    _packages,
    ensure_template,
    prune_templates,
)

_PINNED = re.compile(r"^([a-z0-9][a-z0-9._-]*)==([^ ]+) --hash=sha256:[0-9a-f]{64}$")


def _lock_names() -> dict[str, str]:
    names = {}
    for line in _kernels.read_lock().decode().splitlines():
        if line.startswith("#"):
            continue
        match = _PINNED.fullmatch(line)
        assert match is not None, f"not an exact, hashed pin: {line!r}"
        names[match[1].replace("_", "-")] = match[2]
    return names


def test_the_lock_pins_and_hashes_every_package_asked_for() -> None:
    locked = _lock_names()
    asked = [
        line.split("==")
        for line in _kernels.REQUIREMENTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {"ipykernel", "numpy", "pandas", "matplotlib", "pillow", "bash-kernel", "e2b-charts"} <= {
        name.lower().replace("_", "-") for name, _ in asked
    }
    for name, version in asked:
        assert locked[name.lower().replace("_", "-")] == version


def test_lock_lines_come_from_pips_report() -> None:
    def item(name: str, version: str, digest: str) -> dict[str, object]:
        archive = {"archive_info": {"hashes": {"sha256": digest}}}
        return {"metadata": {"name": name, "version": version}, "download_info": archive}

    report = {"install": [item("Zed", "1", "b"), item("alpha", "2", "a")]}
    assert _kernels._lock_lines(report) == ["alpha==2 --hash=sha256:a", "zed==1 --hash=sha256:b"]
    unhashed = {"install": [{"metadata": {"name": "x", "version": "1"}, "download_info": {"url": "file:///x"}}]}
    with pytest.raises(TemplateError, match="no sha256 for x 1"):
        _kernels._lock_lines(unhashed)


def test_a_machine_without_a_lock_is_told_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="lock-kernels"):
        _kernels.read_lock(tmp_path / "kernels.cp399-sparc.lock")


def test_the_keys_follow_the_layers_below_and_the_locks() -> None:
    kernels = _keys.recipe_key(_keys.kernels_recipe("o" * 64, b"lock", b"debs"))
    assert kernels == _keys.recipe_key(_keys.kernels_recipe("o" * 64, b"lock", b"debs"))
    assert kernels != _keys.recipe_key(_keys.kernels_recipe("p" * 64, b"lock", b"debs"))
    assert kernels != _keys.recipe_key(_keys.kernels_recipe("o" * 64, b"lock2", b"debs"))
    assert kernels != _keys.recipe_key(_keys.kernels_recipe("o" * 64, b"lock", b"debs2"))
    key = _keys.recipe_key(_keys.interpreter_recipe("a" * 64, kernels))
    assert key == _keys.recipe_key(_keys.interpreter_recipe("a" * 64, kernels))
    assert key != _keys.recipe_key(_keys.interpreter_recipe("b" * 64, kernels))
    assert key != _keys.recipe_key(_keys.interpreter_recipe("a" * 64, "k" * 64))


def test_the_agent_command_starts_the_interpreter_as_the_sandbox_user() -> None:
    command = _keys.INTERPRETER_AGENT_COMMAND
    assert command[:3] == ("/opt/e2b-compat/venv/bin/python", "-m", "runtime.agent")
    args = build_parser().parse_args(list(command[3:]))
    assert args.service_user == "user"
    (service,) = [parse_service(text) for text in args.services]
    assert service.port == 49999
    assert service.argv[1:3] == ("-m", "runtime.interpreter")
    assert service.argv[service.argv.index("--kernel-python") + 1] == "/opt/e2b-compat/kernel/bin/python"


def test_prune_keeps_the_newest_of_each_name(tmp_path: Path) -> None:
    root = tmp_path / "templates"
    for name in ("base", INTERPRETER_TEMPLATE):
        for index in range(3):
            folder = root / f"{name}-{index:016x}"
            (folder / "rootfs").mkdir(parents=True)
            meta = folder / "template.json"
            meta.write_text(json.dumps({"name": name, "key": f"{index:064x}", "agent_command": ["x"]}))
            os.utime(meta, (1_000_000 + index, 1_000_000 + index))
    removed = prune_templates(tmp_path, keep=1)
    assert sorted(p.name for p in removed) == [
        "base-0000000000000000",
        "base-0000000000000001",
        f"{INTERPRETER_TEMPLATE}-0000000000000000",
        f"{INTERPRETER_TEMPLATE}-0000000000000001",
    ]


# --- the real template ---


@pytest.fixture(scope="session")
def interpreter_template() -> Template:
    if os.geteuid() != 0:
        pytest.skip("building a template needs root")
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is not installed")
    return ensure_template(INTERPRETER_TEMPLATE, progress=PlainProgress())


def _as_user(rootfs: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**_commands.CHROOT_ENV, "HOME": "/home/user"}
    return subprocess.run(
        ["chroot", "--userspec=1000:1000", str(rootfs), *cmd], env=env, capture_output=True, text=True, check=False
    )


@pytest.mark.artifacts
def test_metadata_names_its_base_and_the_interpreter_command(interpreter_template: Template) -> None:
    meta = json.loads((interpreter_template.path / "template.json").read_text())
    assert (meta["name"], meta["key"]) == (INTERPRETER_TEMPLATE, interpreter_template.key)
    assert interpreter_template.agent_command == _keys.INTERPRETER_AGENT_COMMAND
    base = ensure_template("base", progress=PlainProgress())
    assert meta["recipe"]["base_key"] == base.key
    packages = _packages.read_lock(_packages.lock_path(_keys.SUITE, _keys.debian_arch()))
    os_key = meta_of(base)["recipe"]["os_key"]
    kernels_key = _keys.recipe_key(_keys.kernels_recipe(os_key, _kernels.read_lock(), packages))
    assert meta["recipe"]["kernels_key"] == kernels_key
    assert meta["from"] == [base.path.name, f"kernels-{kernels_key[:16]}"]
    # The kernels layer holds only what it adds to the os layer, and says which wheels and packages.
    kernels = base.path.parent / f"kernels-{kernels_key[:16]}"
    assert not (kernels / "rootfs/opt/e2b-compat/venv").exists(), "the agent is base's, not the kernels layer's"
    assert list((kernels / "rootfs/tmp").iterdir()) == [], "nothing of the build is left in /tmp"
    kernels_meta = meta_of_path(kernels)
    assert any(name.startswith("ipykernel-") for name in kernels_meta["kernel_wheels"])
    assert kernels_meta["debian_packages"] == sorted(_packages.parse_lock(packages))
    assert {"r-base-core", "r-cran-irkernel", "openjdk-17-jdk-headless"} <= set(kernels_meta["debian_packages"])


def meta_of(template: Template) -> dict[str, Any]:
    return meta_of_path(template.path)


def meta_of_path(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((path / "template.json").read_text())
    return meta


@pytest.mark.artifacts
def test_the_kernels_import_as_the_sandbox_user(interpreter_template: Template) -> None:
    rootfs = interpreter_template.rootfs
    venv = rootfs / "opt/e2b-compat/kernel"
    assert (venv.stat().st_uid, venv.stat().st_gid) == (1000, 1000)
    probe = (
        "import json, numpy, pandas, matplotlib, PIL, ipykernel, bash_kernel, e2b_charts; "
        "print(json.dumps([numpy.__version__, pandas.__version__, matplotlib.__version__, PIL.__version__]))"
    )
    done = _as_user(rootfs, "/opt/e2b-compat/kernel/bin/python", "-c", probe)
    assert done.returncode == 0, done.stderr
    locked = _lock_names()
    assert json.loads(done.stdout) == [locked["numpy"], locked["pandas"], locked["matplotlib"], locked["pillow"]]
    # The font cache was made at build time, so a sandbox's first plot does not make it.
    assert list((rootfs / "home/user/.cache/matplotlib").glob("fontlist-*.json"))
    assert not (rootfs / "tmp/e2b-compat-wheelhouse").exists()


@pytest.mark.artifacts
def test_every_language_runs_as_the_sandbox_user(interpreter_template: Template) -> None:
    rootfs = interpreter_template.rootfs
    with _packages.proc_mounted(rootfs):  # java finds its libraries through /proc/self/exe
        deno = _as_user(rootfs, "/opt/e2b-compat/kernel/bin/deno", "eval", "console.log(6 * 7)")
        r = _as_user(rootfs, "Rscript", "-e", "library(IRkernel); cat(6 * 7)")
        jshell = _as_user(rootfs, "jshell", "--version")
    assert (deno.returncode, deno.stdout) == (0, "42\n"), deno.stderr
    assert (r.returncode, r.stdout) == (0, "42"), r.stderr
    assert jshell.returncode == 0, jshell.stderr
    assert (rootfs / "opt/e2b-compat/kernel/share/jupyter/kernels/java/jjava.jar").is_file()
    assert (rootfs / "etc/resolv.conf").read_bytes() == b"", "the build's resolver is not left behind"
    assert not list((rootfs / "var/lib/apt/lists").glob("*_Packages")), "nor its package lists"


@pytest.mark.artifacts
def test_the_server_imports_in_the_agents_venv(interpreter_template: Template) -> None:
    done = _as_user(interpreter_template.rootfs, "/opt/e2b-compat/venv/bin/python", "-c", "import runtime.interpreter")
    assert done.returncode == 0, done.stderr
