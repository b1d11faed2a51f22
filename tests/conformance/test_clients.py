"""The pinned official clients install unchanged into cached environments; tampering is reported."""

from __future__ import annotations

import json
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
    with pytest.raises(ClientEnvironmentError, match=r"(?s)installing the pinned Python clients.*hash"):
        ensure_python_clients(cache)
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


@pytest.mark.artifacts
def test_node_clients_are_the_pinned_versions(node_clients: NodeClients) -> None:
    script = "console.log(require('e2b/package.json').version, require('@e2b/code-interpreter/package.json').version)"
    assert _output(["node", "-e", script], cwd=node_clients.root) == "2.33.0 2.6.1"


@pytest.mark.artifacts
def test_second_python_call_reuses_the_environment(python_clients: PythonClients) -> None:
    root = python_clients.python.parent.parent
    before = root.stat()
    assert ensure_python_clients() == python_clients
    after = root.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.artifacts
def test_second_node_call_reuses_the_environment(node_clients: NodeClients) -> None:
    before = node_clients.root.stat()
    assert ensure_node_clients() == node_clients
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
    copy = PythonClients(python=python_clients.python, site_packages=site)
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
    assert sorted(verify_node_clients(NodeClients(root=tmp_path))) == [
        "node_modules/@e2b/code-interpreter/package.json",
        "node_modules/e2b/dist/index.js",
    ]
