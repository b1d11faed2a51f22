"""Scenario scripts import only the standard library and the official clients with their own HTTP libraries.

They run in the clients' environments (``python -I``, ``NODE_PATH``), so anything else would
either fail there or, worse, be picked up from somewhere that is not the pinned install.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance._clients import NodeClients, PythonClients, ensure_node_clients, ensure_python_clients

REPO = Path(__file__).resolve().parents[2]
# Every script that runs in an official client's environment: the scenarios and the recorder's.
SCENARIO_DIRS = ("conformance/scenarios", "conformance/recorder")
PY_SUFFIXES = (".py",)
JS_SUFFIXES = (".cjs", ".js", ".mjs")

# httpx and undici are the official clients' own HTTP libraries, installed with them.
PY_ALLOWED = frozenset({"e2b", "e2b_code_interpreter", "httpx"})
JS_ALLOWED = frozenset({"e2b", "@e2b/code-interpreter", "undici"})

_REQUIRE = re.compile(r"""\brequire\s*\(\s*(['"`])([^'"`]+)\1\s*\)""")
_DYNAMIC_IMPORT = re.compile(r"""\bimport\s*\(\s*(['"`])([^'"`]+)\1\s*\)""")
# ESM statements only at the start of a line, so Python source held in JS strings is not taken for them.
_STATIC_IMPORT = re.compile(r"""^\s*(?:import|export)\s+(?:[\w*{}\s,$]+?\s+from\s+)?(['"])([^'"]+)\1""", re.M)


# Programs the scenarios upload into a sandbox, run there by its own python3: not client scripts.
IN_SANDBOX = "in_sandbox"


def _scripts(suffixes: tuple[str, ...]) -> list[Path]:
    found = [
        path
        for folder in SCENARIO_DIRS
        for path in (REPO / folder).rglob("*")
        if path.suffix in suffixes and path.is_file() and not {"__pycache__", IN_SANDBOX} & set(path.parts)
    ]
    return sorted(found)


PY_SCRIPTS = _scripts(PY_SUFFIXES)
SANDBOX_PROGRAMS = sorted((REPO / "conformance" / "scenarios" / IN_SANDBOX).glob("*.py"))
JS_SCRIPTS = _scripts(JS_SUFFIXES)


def test_every_script_folder_exists_and_holds_scripts() -> None:
    for folder in SCENARIO_DIRS:
        assert (REPO / folder).is_dir(), folder
    assert len(PY_SCRIPTS) >= 6
    assert len(JS_SCRIPTS) >= 3


def _id(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _python_imports(path: Path) -> tuple[list[ast.stmt], list[str]]:
    """Every import statement anywhere in the script, and what cannot be checked statically."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    statements: list[ast.stmt] = []
    unchecked: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            statements.append(node)
            if isinstance(node, ast.ImportFrom) and node.level:
                unchecked.append(f"line {node.lineno}: relative import")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in {"__import__", "import_module"}:
                unchecked.append(f"line {node.lineno}: {name}() call")
    return statements, unchecked


def _top_level_modules(statements: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _js_specifiers(path: Path) -> tuple[set[str], list[str]]:
    """Every module a JS script requires or imports, and what cannot be checked statically."""
    text = path.read_text(encoding="utf-8")
    specifiers = {m[2] for pattern in (_REQUIRE, _DYNAMIC_IMPORT, _STATIC_IMPORT) for m in pattern.finditer(text)}
    unchecked = []
    # A require or import() whose argument is not a plain string literal names a module we cannot see.
    if len(re.findall(r"\brequire\s*\(", text)) != len(_REQUIRE.findall(text)):
        unchecked.append("require() of a computed name")
    if len(re.findall(r"\bimport\s*\(", text)) != len(_DYNAMIC_IMPORT.findall(text)):
        unchecked.append("import() of a computed name")
    return specifiers, unchecked


def _js_package(specifier: str) -> str:
    parts = specifier.split("/")
    return "/".join(parts[:2]) if specifier.startswith("@") else parts[0]


def test_scenario_scripts_are_found() -> None:
    assert PY_SCRIPTS, "no Python scenario script under " + ", ".join(SCENARIO_DIRS)
    assert JS_SCRIPTS, "no JS scenario script under " + ", ".join(SCENARIO_DIRS)


@pytest.mark.parametrize("script", PY_SCRIPTS, ids=_id)
def test_python_scenario_imports_only_stdlib_and_clients(script: Path) -> None:
    statements, unchecked = _python_imports(script)
    assert unchecked == []
    modules = _top_level_modules(statements)
    assert "e2b" in modules or "e2b_code_interpreter" in modules, "a scenario drives an official client"
    foreign = sorted(modules - PY_ALLOWED - set(sys.stdlib_module_names))
    assert foreign == [], f"{_id(script)} imports {foreign}"


@pytest.mark.parametrize("program", SANDBOX_PROGRAMS, ids=_id)
def test_programs_run_inside_a_sandbox_import_only_the_stdlib(program: Path) -> None:
    statements, unchecked = _python_imports(program)
    assert unchecked == []
    foreign = sorted(_top_level_modules(statements) - set(sys.stdlib_module_names) - {"__future__"})
    assert foreign == [], f"{_id(program)} imports {foreign}: a template's python3 has only its stdlib"


@pytest.mark.parametrize("script", JS_SCRIPTS, ids=_id)
def test_js_scenario_requires_only_builtins_and_clients(script: Path) -> None:
    specifiers, unchecked = _js_specifiers(script)
    assert unchecked == []
    assert specifiers & {"e2b", "@e2b/code-interpreter"}, "a scenario drives an official client"
    # Built-ins only by their node: name, which no package on NODE_PATH can shadow.
    foreign = sorted(s for s in specifiers if not s.startswith("node:") and _js_package(s) not in JS_ALLOWED)
    assert foreign == [], f"{_id(script)} requires {foreign}"


# --- the same imports, resolved in the pinned clients' environments ---

# Runs the given import statements, one at a time as a module would, then reports where every
# loaded module came from and which folders hold this interpreter's standard library.
_PY_PROBE = """
import json, sys, sysconfig
# The base interpreter's folders: in a venv, platstdlib would otherwise be the venv's own lib.
base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
base |= {"installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix}
for statement in json.loads(sys.argv[1]):
    exec(statement, {"__name__": "scenario"})
print(json.dumps({
    "files": {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())},
    "stdlib": sorted({sysconfig.get_path(kind, vars=base) for kind in ("stdlib", "platstdlib")}),
}))
"""

_JS_PROBE = """
const { createRequire } = require('node:module')
const [script, specifiers] = [process.argv[1], JSON.parse(process.argv[2])]
const req = createRequire(script)  // resolved as the script itself would resolve them
console.log(JSON.stringify(Object.fromEntries(specifiers.map((s) => [s, req.resolve(s)]))))
"""


@pytest.fixture(scope="module")
def python_clients() -> PythonClients:
    return ensure_python_clients()


@pytest.fixture(scope="module")
def node_clients() -> NodeClients:
    return ensure_node_clients()


def _from_stdlib(path: Path, stdlib: list[Path]) -> bool:
    # The base interpreter's own site-packages lies inside its stdlib folder: that is not the stdlib.
    return any(path.is_relative_to(lib) for lib in stdlib) and not {"site-packages", "dist-packages"} & set(path.parts)


@pytest.mark.artifacts
@pytest.mark.parametrize("script", PY_SCRIPTS, ids=_id)
def test_python_scenario_imports_resolve_in_the_client_venv(
    script: Path, python_clients: PythonClients, tmp_path: Path
) -> None:
    statements, _ = _python_imports(script)
    sources = [ast.unparse(node) for node in statements]
    shown = subprocess.run(
        [str(python_clients.python), "-I", "-c", _PY_PROBE, json.dumps(sources)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(shown)
    site = python_clients.site_packages.resolve()
    stdlib = [Path(p).resolve() for p in report["stdlib"]]
    assert _top_level_modules(statements) <= set(report["files"]), "every import was really made"
    files: dict[str, str | None] = report["files"]
    strays = {
        name: file
        for name, file in files.items()
        # None: built into the interpreter, frozen, or a namespace package.
        if file is not None
        and not (Path(file).resolve().is_relative_to(site) or _from_stdlib(Path(file).resolve(), stdlib))
    }
    assert strays == {}, f"{_id(script)} loads modules from outside the client venv and the stdlib"


@pytest.mark.artifacts
@pytest.mark.parametrize("script", JS_SCRIPTS, ids=_id)
def test_js_scenario_requires_resolve_in_the_client_modules(
    script: Path, node_clients: NodeClients, tmp_path: Path
) -> None:
    specifiers, _ = _js_specifiers(script)
    modules = node_clients.root / "node_modules"
    shown = subprocess.run(
        ["node", "-e", _JS_PROBE, str(script), json.dumps(sorted(specifiers))],
        cwd=tmp_path,
        env={**os.environ, "NODE_PATH": str(modules)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    resolved: dict[str, str] = json.loads(shown)
    strays = {
        spec: where
        for spec, where in resolved.items()
        if not (spec.startswith("node:") and where == spec)
        and not Path(where).resolve().is_relative_to(modules.resolve())
    }
    assert strays == {}, f"{_id(script)} resolves modules outside the clients' node_modules"
