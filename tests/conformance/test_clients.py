"""The official clients of every lock file install unchanged into cached environments; tampering is reported."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conformance import _clients
from conformance._clients import (
    ClientEnvironmentError,
    NodeClients,
    PythonClients,
    available_node_versions,
    available_python_versions,
    ensure_node_clients,
    ensure_python_clients,
    verify_node_clients,
    verify_python_clients,
)
from contract import load_lock


def _output(cmd: list[str], cwd: Path) -> str:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="session")
def python_clients() -> PythonClients:
    return ensure_python_clients()


@pytest.fixture(scope="session")
def node_clients() -> NodeClients:
    return ensure_node_clients()


PYTHON_VERSIONS = available_python_versions()
NODE_VERSIONS = available_node_versions()
# The sweep points: every lock besides the pin, which the tests above and below cover by name.
PYTHON_SWEEP = [v for v in PYTHON_VERSIONS if _clients.PYTHON_REQUIREMENTS.name != f"python-{v}.requirements.txt"]
NODE_SWEEP = [v for v in NODE_VERSIONS if _clients.NODE_PROJECT.name != f"node-{v}"]


def _python_lock_text(version: str) -> str:
    return (_clients.CLIENTS_DIR / f"python-{version}.requirements.txt").read_text(encoding="utf-8")


def _flip_a_byte(path: Path) -> None:
    # Same size, one byte different: only a content comparison can tell.
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


# --- the committed pins agree with upstream.lock.json (no network) ---


def test_requirements_pin_the_locked_wheels() -> None:
    text = _clients.PYTHON_REQUIREMENTS.read_text(encoding="utf-8")
    for key in ("py-e2b", "py-e2b-code-interpreter"):
        artifact = load_lock().artifact(key)
        block = re.search(rf"^{re.escape(artifact.name)}==(\S+) \\\n((?:\s+--hash=sha256:\w+ \\?\n)+)", text, re.M)
        assert block is not None, artifact.name
        assert block[1] == artifact.version
        assert f"--hash=sha256:{artifact.sha256}" in block[2]
    requirement_lines = [line for line in text.splitlines() if line and not line[0].isspace() and line[0] != "#"]
    assert requirement_lines, "the file lists requirements"
    assert all(re.fullmatch(r"[a-z0-9._-]+==\S+ \\", line) for line in requirement_lines), "every line is pinned"
    assert text.count("--hash=sha256:") >= len(requirement_lines)


def test_package_lock_pins_the_locked_tarballs() -> None:
    manifest = json.loads((_clients.NODE_PROJECT / "package.json").read_text(encoding="utf-8"))
    lock = json.loads((_clients.NODE_PROJECT / "package-lock.json").read_text(encoding="utf-8"))
    assert lock["lockfileVersion"] == 3
    expected = {}
    for key in ("js-e2b", "js-e2b-code-interpreter"):
        artifact = load_lock().artifact(key)
        expected[artifact.name] = artifact.version
        entry = lock["packages"][f"node_modules/{artifact.name}"]
        assert (entry["version"], entry["integrity"]) == (artifact.version, artifact.integrity)
    assert manifest["dependencies"] == expected
    packages = {path: entry for path, entry in lock["packages"].items() if path}
    assert all(entry.get("integrity", "").startswith("sha512-") for entry in packages.values())
    assert not [path for path, entry in packages.items() if "resolved" in entry], "no registry URL is committed"


# --- every committed lock file (no network) ---


def test_lock_files_are_listed_by_version() -> None:
    assert {"2.32.0", "2.63.0"} <= set(PYTHON_VERSIONS), "the pin and the sweep's newest"
    assert {"2.33.0", "2.51.0"} <= set(NODE_VERSIONS)
    assert sorted(["2.10.0", "2.9.1", "2.50.0"], key=_clients.version_order) == ["2.9.1", "2.10.0", "2.50.0"]
    # Nothing in clients/ is a lock that the listing would silently skip.
    listed = {f"python-{v}.requirements.txt" for v in PYTHON_VERSIONS} | {f"node-{v}" for v in NODE_VERSIONS}
    assert {p.name for p in _clients.CLIENTS_DIR.iterdir()} == listed


@pytest.mark.parametrize("version", PYTHON_VERSIONS)
def test_every_python_lock_pins_and_hashes_everything(version: str) -> None:
    text = _python_lock_text(version)
    requirement_lines = [line for line in text.splitlines() if line and not line[0].isspace() and line[0] != "#"]
    assert requirement_lines, "the file lists requirements"
    assert all(re.fullmatch(r"[a-z0-9._-]+==\S+ \\", line) for line in requirement_lines), "every line is pinned"
    blocks = re.findall(r"^([a-z0-9._-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, re.M)
    assert len(blocks) == len(requirement_lines), "every pin carries at least one hash"
    pins = {name: pinned for name, pinned, _ in blocks}
    assert pins["e2b"] == version, "the file is named after its e2b pin"
    assert "e2b-code-interpreter" in pins


@pytest.mark.parametrize("version", NODE_VERSIONS)
def test_every_node_lock_pins_exact_integrity_checked_tarballs(version: str) -> None:
    project = _clients.CLIENTS_DIR / f"node-{version}"
    manifest = json.loads((project / "package.json").read_text(encoding="utf-8"))
    lock = json.loads((project / "package-lock.json").read_text(encoding="utf-8"))
    assert lock["lockfileVersion"] == 3
    dependencies = manifest["dependencies"]
    assert dependencies["e2b"] == version, "the folder is named after its e2b pin"
    assert set(dependencies) == set(_clients.NODE_CLIENTS)
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", spec) for spec in dependencies.values()), "exact versions"
    assert lock["packages"][""]["dependencies"] == dependencies
    for name, pinned in dependencies.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == pinned
    # One e2b only: the interpreter runs on the swept e2b, not on a copy nested under it.
    assert [path for path in lock["packages"] if path.endswith("node_modules/e2b")] == ["node_modules/e2b"]
    packages = {path: entry for path, entry in lock["packages"].items() if path}
    assert all(entry.get("integrity", "").startswith("sha512-") for entry in packages.values())
    assert not [path for path, entry in packages.items() if "resolved" in entry], "no registry URL is committed"


@pytest.mark.parametrize("version", ["9.9.9", "../2.32.0", "2.32.0/../../x"])
def test_unknown_version_is_refused_before_building(version: str, tmp_path: Path) -> None:
    with pytest.raises(ClientEnvironmentError, match="no Python lock file"):
        ensure_python_clients(version, cache_root=tmp_path)
    with pytest.raises(ClientEnvironmentError, match="no JS lock folder"):
        ensure_node_clients(version, cache_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_lock_pinning_another_e2b_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "python-2.50.0.requirements.txt").write_text("e2b==2.51.0 \\\n    --hash=sha256:00\n")
    (tmp_path / "node-2.50.0").mkdir()
    (tmp_path / "node-2.50.0" / "package.json").write_text('{"dependencies": {"e2b": "2.51.0"}}')
    (tmp_path / "node-2.50.0" / "package-lock.json").write_text("{}")
    monkeypatch.setattr(_clients, "CLIENTS_DIR", tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(ClientEnvironmentError, match=r"pins e2b 2\.51\.0, not 2\.50\.0"):
        ensure_python_clients("2.50.0", cache_root=cache)
    with pytest.raises(ClientEnvironmentError, match=r"pins e2b 2\.51\.0, not 2\.50\.0"):
        ensure_node_clients("2.50.0", cache_root=cache)
    assert not cache.exists()


# --- the build-then-rename scheme (no network) ---


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "env"

    def build(tmp: Path) -> None:
        (tmp / "half").write_text("written")
        raise ClientEnvironmentError("tool failed")

    with pytest.raises(ClientEnvironmentError, match="tool failed"):
        _clients._materialize(final, build)
    assert list(tmp_path.iterdir()) == []


def test_existing_environment_is_reused_without_building(tmp_path: Path) -> None:
    final = tmp_path / "env"
    built: list[Path] = []
    assert _clients._materialize(final, built.append) == final
    assert _clients._materialize(final, built.append) == final
    assert len(built) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["env"]


def test_losing_a_build_race_keeps_the_winner(tmp_path: Path) -> None:
    final = tmp_path / "env"

    def build(tmp: Path) -> None:
        (tmp / "mine").write_text("")
        final.mkdir()  # another process renamed its build into place meanwhile
        (final / "theirs").write_text("")

    assert _clients._materialize(final, build) == final
    assert [p.name for p in final.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["env"]


def test_failed_pip_install_raises_with_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requirements = tmp_path / "unhashed.txt"
    requirements.write_text("e2b==2.32.0\n")  # no hash: pip refuses before downloading anything
    monkeypatch.setattr(_clients, "PYTHON_REQUIREMENTS", requirements)
    cache = tmp_path / "cache"
    with pytest.raises(ClientEnvironmentError, match=r"(?s)installing the Python clients of e2b 2\.32\.0.*hash"):
        ensure_python_clients(cache_root=cache)
    assert list((cache / "clients" / "python").iterdir()) == []


# --- the real environments ---


@pytest.mark.artifacts
def test_python_clients_are_the_pinned_versions(python_clients: PythonClients, tmp_path: Path) -> None:
    script = (
        "import e2b, e2b_code_interpreter, importlib.metadata as m, importlib.util as u, sysconfig;"
        "print(m.version('e2b'), m.version('e2b_code_interpreter'), u.find_spec('contract') is None);"
        "print(sysconfig.get_path('purelib'))"
    )
    versions, purelib = _output([str(python_clients.python), "-c", script], cwd=tmp_path).splitlines()
    assert versions == "2.32.0 2.8.1 True", "pinned versions, and the project itself is not importable"
    assert Path(purelib) == python_clients.site_packages
    assert python_clients.version == "2.32.0"


@pytest.mark.artifacts
def test_node_clients_are_the_pinned_versions(node_clients: NodeClients) -> None:
    script = "console.log(require('e2b/package.json').version, require('@e2b/code-interpreter/package.json').version)"
    assert _output(["node", "-e", script], cwd=node_clients.root) == "2.33.0 2.6.1"
    assert node_clients.version == "2.33.0"


@pytest.mark.artifacts
def test_second_python_call_reuses_the_environment(python_clients: PythonClients) -> None:
    root = python_clients.python.parent.parent
    before = root.stat()
    assert ensure_python_clients() == python_clients
    assert ensure_python_clients("2.32.0") == python_clients, "the pin by its version is the same environment"
    after = root.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.artifacts
def test_second_node_call_reuses_the_environment(node_clients: NodeClients) -> None:
    before = node_clients.root.stat()
    assert ensure_node_clients() == node_clients
    assert ensure_node_clients("2.33.0") == node_clients, "the pin by its version is the same environment"
    after = node_clients.root.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.artifacts
def test_fresh_environments_verify_clean(python_clients: PythonClients, node_clients: NodeClients) -> None:
    assert verify_python_clients(python_clients) == []
    assert verify_node_clients(node_clients) == []


@pytest.mark.artifacts
def test_modified_python_client_is_reported(python_clients: PythonClients, tmp_path: Path) -> None:
    # Tamper with a copy: the cached environment is shared and must stay intact.
    site = tmp_path / "site-packages"
    shutil.copytree(python_clients.site_packages, site, symlinks=True)
    copy = dataclasses.replace(python_clients, site_packages=site)
    with (site / "e2b" / "__init__.py").open("a", encoding="utf-8") as f:
        f.write("\n# tampered\n")
    (site / "e2b_code_interpreter" / "__init__.py").unlink()
    with (site / "httpx" / "__init__.py").open("a", encoding="utf-8") as f:
        f.write("\n# a dependency is not one of the clients\n")
    assert verify_python_clients(copy) == ["e2b/__init__.py", "e2b_code_interpreter/__init__.py"]
    assert verify_python_clients(python_clients) == []


@pytest.mark.artifacts
def test_modified_node_client_is_reported(node_clients: NodeClients, tmp_path: Path) -> None:
    for name in _clients.NODE_CLIENTS:
        shutil.copytree(node_clients.root / "node_modules" / name, tmp_path / "node_modules" / name, symlinks=True)
    with (tmp_path / "node_modules" / "e2b" / "dist" / "index.js").open("a", encoding="utf-8") as f:
        f.write("\n// tampered\n")
    (tmp_path / "node_modules" / "@e2b" / "code-interpreter" / "package.json").unlink()
    assert sorted(verify_node_clients(dataclasses.replace(node_clients, root=tmp_path))) == [
        "node_modules/@e2b/code-interpreter/package.json",
        "node_modules/e2b/dist/index.js",
    ]


# --- every committed lock file, installed and checked ---


@pytest.mark.artifacts
@pytest.mark.parametrize("version", PYTHON_VERSIONS)
def test_every_python_lock_installs_unchanged(version: str, tmp_path: Path) -> None:
    env = ensure_python_clients(version)
    assert env.version == version
    pins = _clients._pins(_python_lock_text(version))
    script = (
        "import e2b, e2b_code_interpreter, importlib.metadata as m, sysconfig;"
        "print(m.version('e2b'), m.version('e2b_code_interpreter'));"
        "print(sysconfig.get_path('purelib'))"
    )
    # -I as the scenarios run: only the environment's own packages and the stdlib are importable.
    versions, purelib = _output([str(env.python), "-I", "-c", script], cwd=tmp_path).splitlines()
    assert versions == f"{version} {pins['e2b-code-interpreter']}"
    assert Path(purelib) == env.site_packages
    assert verify_python_clients(env) == []


@pytest.mark.artifacts
@pytest.mark.parametrize("version", NODE_VERSIONS)
def test_every_node_lock_installs_unchanged(version: str, tmp_path: Path) -> None:
    env = ensure_node_clients(version)
    assert env.version == version
    pinned = json.loads((_clients.CLIENTS_DIR / f"node-{version}" / "package.json").read_text(encoding="utf-8"))
    script = (
        "require('e2b'); require('@e2b/code-interpreter');"
        "console.log(require('e2b/package.json').version, require('@e2b/code-interpreter/package.json').version)"
    )
    # NODE_PATH from an unrelated folder, as the scenarios are run.
    shown = subprocess.run(
        ["node", "-e", script],
        cwd=tmp_path,
        env={**os.environ, "NODE_PATH": str(env.root / "node_modules")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert shown == f"{version} {pinned['dependencies']['@e2b/code-interpreter']}"
    assert verify_node_clients(env) == []


@pytest.mark.artifacts
@pytest.mark.parametrize("version", PYTHON_SWEEP)
def test_modified_sweep_python_client_is_reported(version: str, tmp_path: Path) -> None:
    env = ensure_python_clients(version)
    site = tmp_path / "site-packages"
    shutil.copytree(env.site_packages, site, symlinks=True)
    _flip_a_byte(site / "e2b" / "__init__.py")
    _flip_a_byte(site / "e2b_code_interpreter" / "__init__.py")
    assert verify_python_clients(dataclasses.replace(env, site_packages=site)) == [
        "e2b/__init__.py",
        "e2b_code_interpreter/__init__.py",
    ]
    assert verify_python_clients(env) == []


@pytest.mark.artifacts
@pytest.mark.parametrize("version", NODE_SWEEP)
def test_modified_sweep_node_client_is_reported(version: str, tmp_path: Path) -> None:
    env = ensure_node_clients(version)
    for name in _clients.NODE_CLIENTS:
        shutil.copytree(env.root / "node_modules" / name, tmp_path / "node_modules" / name, symlinks=True)
    _flip_a_byte(tmp_path / "node_modules" / "e2b" / "dist" / "index.js")
    assert verify_node_clients(dataclasses.replace(env, root=tmp_path)) == ["node_modules/e2b/dist/index.js"]
