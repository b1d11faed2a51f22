"""docs/ARCHITECTURE.md's dependency rules, checked against the imports read from the code.

Every ``import`` and ``from ... import`` in the project's packages (at any depth: imports inside
functions count) is resolved to the project module it names, then held to three rules, each a
table below that the architecture document states in words:

1. ``MAY_IMPORT``: which other parts a part may import at all (``NARROWER`` tightens it for
   sub-packages; ``EXCEPTIONS`` lists the few allowed crossings, each with its reason).
2. Public names only across parts: outside part P, nothing imports a module of P whose dotted path
   has a component starting with ``_`` (``runtime._crun``, ``reference_server._store``). Tests
   are exempt: they mirror modules.
3. No part imports ``e2b_compat`` (the command line), which may import any part.

The checker is run on the real tree, and on a copy with a rule broken on purpose, which it must
report.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("contract", "runtime", "reference_server", "conformance", "e2b_compat", "benchmarks")

# part → the other parts it may import.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "contract": frozenset(),
    "runtime": frozenset({"contract"}),
    "reference_server": frozenset({"contract", "runtime"}),
    "conformance": frozenset({"contract"}),
    "e2b_compat": frozenset({"contract", "runtime", "reference_server", "conformance"}),
    "benchmarks": frozenset({"contract", "runtime", "reference_server", "conformance"}),
}
# sub-package → the project packages (outside itself) it may import: tighter than its part's rule.
NARROWER: dict[str, frozenset[str]] = {
    # Both run inside sandboxes and talk to each other over HTTP only.
    "runtime.agent": frozenset({"contract"}),
    "runtime.interpreter": frozenset({"contract"}),
    # Copied into the mcp-gateway template's own environment, where nothing else of ours is.
    "runtime.mcp_gateway": frozenset(),
}
# (importing module, imported part) → why it may.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("conformance._endpoint", "runtime"): "ManagedServer releases the sandboxes of the server it started itself, "
    "and prepares the host for its backend and reads that backend's feature list",
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted project module or name) for every import in the file, relative ones resolved."""
    module = _module_name(path, root)
    package = module if _is_package(path) else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            named = [alias.name for alias in node.names if _is_module(root, f"{target}.{alias.name}")]
            # ``from runtime import _host`` imports the module runtime._host, not a name of runtime.
            yield from ((node.lineno, f"{target}.{name}") for name in named)
            if len(named) < len(node.names):
                yield node.lineno, target


def _is_module(root: Path, dotted: str) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _part(name: str) -> str | None:
    first = name.split(".", maxsplit=1)[0]
    return first if first in PARTS else None


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _owner(module: str) -> str:
    """The most specific package a rule is written for: a ``NARROWER`` sub-package, else the part."""
    return next((prefix for prefix in NARROWER if _within(module, prefix)), module.split(".", maxsplit=1)[0])


def _problem(module: str, part: str, target: str) -> str | None:
    owner, imported = _owner(module), _part(target)
    if imported is None or _within(target, owner):
        return None
    if imported == "e2b_compat":
        return "no part imports the command line"
    allowed = NARROWER.get(owner, MAY_IMPORT[part])
    crossing = imported != part or owner in NARROWER
    if crossing and imported not in allowed and (module, imported) not in EXCEPTIONS:
        return f"{owner} may import only {sorted(allowed) or 'nothing of the project'}"
    if imported != part and any(piece.startswith("_") for piece in target.split(".")[1:]):
        return f"a private module of {imported} (use its public names)"
    return None


def violations(root: Path) -> list[str]:
    found = []
    for part in PARTS:
        for path in sorted((root / part).rglob("*.py")):
            module = _module_name(path, root)
            for line, target in imports_of(path, root):
                problem = _problem(module, part, target)
                if problem is not None:
                    found.append(f"{path.relative_to(root)}:{line}: {module} imports {target}: {problem}")
    return found


def test_the_code_keeps_the_dependency_rules() -> None:
    assert violations(ROOT) == []


def _copy(tmp_path: Path) -> Path:
    for part in PARTS:
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "generated"))
    return tmp_path


@pytest.mark.parametrize(
    ("where", "line", "rule"),
    [
        ("reference_server/_broken.py", "from runtime._crun import CrunBackend", "a private module of runtime"),
        ("reference_server/_broken.py", "from runtime import _network", "a private module of runtime"),
        ("runtime/_broken.py", "from reference_server import serve", "runtime may import only"),
        ("contract/_broken.py", "import runtime.backend", "contract may import only"),
        ("conformance/_broken.py", "from reference_server._store import Store", "conformance may import only"),
        ("runtime/agent/_broken.py", "from ..interpreter import _app", "runtime.agent may import only"),
        ("runtime/interpreter/_broken.py", "from runtime.agent import serve", "runtime.interpreter may import only"),
        ("benchmarks/_broken.py", "from e2b_compat import _cli", "no part imports the command line"),
        ("e2b_compat/_broken.py", "from reference_server._server import serve", "a private module"),
    ],
)
def test_a_rule_broken_on_purpose_is_reported(tmp_path: Path, where: str, line: str, rule: str) -> None:
    root = _copy(tmp_path)
    (root / where).write_text(f"def later() -> None:\n    {line}\n")  # inside a function: still an import
    found = violations(root)
    assert len(found) == 1, found
    assert where in found[0]
    assert rule in found[0]
