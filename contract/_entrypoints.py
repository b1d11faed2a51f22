"""Find which public SDK functions reach each wire operation.

A *use* is a place in a client's source that sends a request: a call into a generated
REST module (Python), an ``openapi-fetch`` call with a literal path (JS), a call on a
Connect client (``self._rpc.start``, ``this.rpc.start``), a request to an envd route
constant, or a request to the code interpreter's URL. The function containing the use
is walked back through its private callers to the first public functions: those are
the entry points. Python privacy is the leading underscore; JS privacy comes from the
shipped type declarations (members declared ``private``/``protected``, or not declared
at all, are internal).

Callers are resolved by name, which over-approximates (two classes with a method of
the same name are not told apart); callers are kept only within the same module or in
modules that mention the callee's class, which removes the common false matches.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import tree_sitter
import tree_sitter_javascript
import tree_sitter_typescript

from ._archive import ArtifactFiles

HTTP_VERBS = ("get", "put", "post", "delete", "patch", "head", "options")
_MAX_DEPTH = 6


@dataclass(frozen=True, order=True)
class Use:
    """An operation a function sends: ``("http", surface, METHOD, path)`` or ``("rpc", "", "", name)``."""

    kind: str
    surface: str
    method: str
    path: str


def path_shape(path: str) -> str:
    """Erase parameter names: ``/sandboxes/{sandboxID}`` → ``/sandboxes/{}``."""
    return re.sub(r"\{[^}]*\}", "{}", path)


@dataclass
class _Function:
    qualname: str
    module: str
    owner: str  # class name or ""
    name: str
    public: bool
    calls: set[str]
    uses: set[Use]


class _CallGraph:
    def __init__(self) -> None:
        self.functions: dict[str, _Function] = {}
        self.module_text: dict[str, str] = {}

    def add(self, fn: _Function) -> None:
        """Register a function; same-named definitions (overloads, static + instance) merge."""
        existing = self.functions.get(fn.qualname)
        if existing is None:
            self.functions[fn.qualname] = fn
        else:
            existing.calls |= fn.calls
            existing.uses |= fn.uses
            existing.public = existing.public or fn.public

    def entry_points(self) -> dict[Use, list[str]]:
        by_name: dict[str, list[_Function]] = defaultdict(list)
        for fn in self.functions.values():
            for called in fn.calls:
                by_name[called].append(fn)
        out: dict[Use, set[str]] = defaultdict(set)
        for fn in self.functions.values():
            for use in fn.uses:
                for public in self._public_callers(fn, by_name):
                    out[use].add(public)
        return {use: sorted(names) for use, names in out.items()}

    def _related(self, caller: _Function, callee: _Function) -> bool:
        if caller.module == callee.module:
            return True
        text = self.module_text.get(caller.module, "")
        anchor = callee.owner or callee.module.rsplit(".", 1)[-1]
        return re.search(rf"\b{re.escape(anchor)}\b", text) is not None

    def _public_callers(self, start: _Function, by_name: dict[str, list[_Function]]) -> set[str]:
        found: set[str] = set()
        seen = {start.qualname}
        frontier = [start]
        for _ in range(_MAX_DEPTH):
            next_frontier: list[_Function] = []
            for fn in frontier:
                if fn.public:
                    found.add(fn.qualname)
                    continue
                for caller in by_name.get(fn.name, []):
                    if caller.qualname not in seen and self._related(caller, fn):
                        seen.add(caller.qualname)
                        next_frontier.append(caller)
            frontier = next_frontier
        return found


# -- Python ---------------------------------------------------------------


@dataclass(frozen=True)
class PythonSurfaces:
    """How to recognise each kind of request in a Python client's source."""

    generated: dict[str, Use]  # generated module (dotted) → its operation
    route_constants: dict[str, str]  # e.g. ENVD_API_FILES_ROUTE → /files
    rpc_names: dict[str, str]  # snake_case client method → procedure
    interpreter_url_attr: str = "_jupyter_url"


def _py_module_name(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def _py_public(module: str, name: str) -> bool:
    parts = module.split(".")
    if any(p.startswith("_") and not p.startswith("__") for p in parts):
        return False
    return name == "__init__" or not name.startswith("_")


def _imported_generated(tree: ast.Module, module: str, generated: dict[str, Use]) -> dict[str, Use]:
    """Local names bound to generated operation modules by ``from ... import``."""
    out: dict[str, Use] = {}
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - (node.level - 1)] if node.level > 1 else parent
                base = ".".join([*parent, base]) if base else ".".join(parent)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in generated:
                    out[alias.asname or alias.name] = generated[full]
    return out


def _py_uses(fn: ast.AST, imported: dict[str, Use], surfaces: PythonSurfaces) -> set[Use]:
    uses: set[Use] = set()
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr = node.func.attr
        receiver = ast.unparse(node.func.value)
        if receiver in imported and attr in ("sync", "sync_detailed", "asyncio", "asyncio_detailed", "_get_kwargs"):
            uses.add(imported[receiver])
            continue
        if "rpc" in receiver:
            name = attr if attr in surfaces.rpc_names else attr[1:] if attr[1:] in surfaces.rpc_names else None
            if name is not None and (attr == name or attr.startswith("a")):
                uses.add(Use("rpc", "", "", surfaces.rpc_names[name]))
                continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if attr in ("stream", "request") and "url" in keywords and isinstance(keywords.get("method"), ast.Constant):
            # A REST request built by hand (streaming reads) rather than through the generated module.
            method_node = keywords["method"]
            assert isinstance(method_node, ast.Constant)
            shape = (str(method_node.value).upper(), path_shape(_py_url_template(keywords["url"])))
            rest = {(u.method, path_shape(u.path)): u for u in surfaces.generated.values()}
            if shape in rest:
                uses.add(rest[shape])
                continue
        verb = attr if attr in HTTP_VERBS else None
        args = list(node.args)
        if attr in ("stream", "request", "build_request") and args and isinstance(args[0], ast.Constant):
            verb = str(args[0].value).lower()
            args = args[1:]
        if verb is None or not args:
            continue
        target = args[0]
        if isinstance(target, ast.Name) and target.id in surfaces.route_constants:
            uses.add(Use("http", "envd", verb.upper(), surfaces.route_constants[target.id]))
        elif isinstance(target, ast.JoinedStr) and surfaces.interpreter_url_attr in ast.unparse(target):
            suffix = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in target.values[1:])
            uses.add(Use("http", "interpreter", verb.upper(), suffix or "/"))
    # URL builders (signed download/upload URLs) reference the route without sending.
    if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id in surfaces.route_constants:
                if "download" in fn.name:
                    uses.add(Use("http", "envd", "GET", surfaces.route_constants[node.id]))
                elif "upload" in fn.name:
                    uses.add(Use("http", "envd", "POST", surfaces.route_constants[node.id]))
    return uses


def _py_url_template(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ""


def _called_names(fn: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
            elif isinstance(node.func, ast.Name):
                names.add(node.func.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)  # properties and bound-method references
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.add(node.id)  # functions passed along, e.g. DualMethod(_class_list, ...)
    return names


def python_entry_points(
    files: ArtifactFiles, package: str, surfaces: PythonSurfaces, skip: Iterable[str] = ()
) -> dict[Use, list[str]]:
    """Public functions of ``package`` (for example ``e2b/``) per operation they reach."""
    graph = _CallGraph()
    skipped = tuple(skip)
    for path in files.under(package, ".py"):
        if path.startswith(skipped):
            continue
        module = _py_module_name(path)
        text = files.text(path)
        tree = ast.parse(text, filename=path)
        graph.module_text[module] = text
        imported = _imported_generated(tree, module, surfaces.generated)
        scopes: list[tuple[str, ast.AST]] = [("", n) for n in tree.body]
        for owner, node in scopes:
            if isinstance(node, ast.ClassDef):
                scopes.extend((node.name, child) for child in node.body)
            elif owner and isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                # A class attribute bound to a wrapper of methods is a public method too.
                name = node.targets[0].id
                qual = f"{module}.{owner}.{name}"
                graph.add(
                    _Function(qual, module, owner, name, _py_public(module, name), _called_names(node.value), set())
                )
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                qual = f"{module}.{owner + '.' if owner else ''}{node.name}"
                graph.add(
                    _Function(
                        qual,
                        module,
                        owner,
                        node.name,
                        _py_public(module, node.name) and not owner.startswith("_"),
                        _called_names(node),
                        _py_uses(node, imported, surfaces),
                    )
                )
    return graph.entry_points()


# -- JavaScript -----------------------------------------------------------


def _js_text(node: tree_sitter.Node) -> str:
    assert node.text is not None
    return node.text.decode("utf-8")


def public_js_members(declarations: bytes) -> set[str]:
    """``Class.member`` for every member a ``.d.ts`` declares without private/protected."""
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_typescript.language_typescript()))
    root = parser.parse(declarations).root_node
    out: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        if node.type not in ("class_declaration", "abstract_class_declaration"):
            continue
        name_node = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if name_node is None or body is None:
            continue
        for member in body.named_children:
            member_name = member.child_by_field_name("name")
            if member_name is None:
                continue
            modifiers = {_js_text(c) for c in member.named_children if c.type == "accessibility_modifier"}
            if not modifiers & {"private", "protected"}:
                out.add(f"{_js_text(name_node)}.{_js_text(member_name).strip('#')}")
    return out


@dataclass(frozen=True)
class JsSurfaces:
    """How to recognise each kind of request in a JS client's bundle."""

    http_paths: dict[str, dict[str, str]]  # surface → {path shape → declared path}
    rpc_names: dict[str, str]  # lowerCamel client method → procedure
    interpreter_url_member: str = "jupyterUrl"


def _js_string(node: tree_sitter.Node) -> str | None:
    if node.type == "string":
        return _js_text(node)[1:-1]
    if node.type == "template_string":
        parts = []
        for child in node.named_children:
            if child.type == "string_fragment":
                parts.append(_js_text(child))
            elif child.type == "template_substitution":
                parts.append("${" + _js_text(child)[2:-1] + "}")
        return "".join(parts)
    return None


def _js_fetch_method(args: list[tree_sitter.Node]) -> str:
    if len(args) > 1 and args[1].type == "object":
        for pair in args[1].named_children:
            key = pair.child_by_field_name("key")
            value = pair.child_by_field_name("value")
            if key is not None and value is not None and _js_text(key) == "method":
                literal = _js_string(value)
                if literal:
                    return literal.upper()
    return "GET"


def _js_uses(fn: tree_sitter.Node, surfaces: JsSurfaces) -> tuple[set[Use], set[str]]:
    uses: set[Use] = set()
    calls: set[str] = set()
    stack = [fn]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        if node.type != "call_expression":
            continue
        callee = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        if callee is None or arguments is None:
            continue
        if callee.type == "identifier":
            calls.add(_js_text(callee))
        elif callee.type == "member_expression":
            prop = callee.child_by_field_name("property")
            if prop is not None:
                calls.add(_js_text(prop))
        args = [a for a in arguments.named_children if a.type != "comment"]
        if callee.type == "identifier" and _js_text(callee) == "fetch" and args:
            url = _js_string(args[0])
            marker = "${this." + surfaces.interpreter_url_member + "}"
            if url is not None and url.startswith(marker):
                suffix = re.sub(r"\$\{[^}]*\}", "{}", url[len(marker) :])
                uses.add(Use("http", "interpreter", _js_fetch_method(args), suffix or "/"))
            continue
        if callee.type != "member_expression":
            continue
        prop = callee.child_by_field_name("property")
        receiver = callee.child_by_field_name("object")
        if prop is None or receiver is None:
            continue
        name, receiver_text = _js_text(prop), _js_text(receiver)
        if name.lower() in HTTP_VERBS and name.isupper() and args:
            literal = _js_string(args[0])
            if literal is None:
                continue
            shape = path_shape(literal)
            order = ["envd"] if "envd" in receiver_text.lower() else [s for s in surfaces.http_paths if s != "envd"]
            for surface in order:
                if shape in surfaces.http_paths.get(surface, {}):
                    uses.add(Use("http", surface, name, surfaces.http_paths[surface][shape]))
                    break
        elif "rpc" in receiver_text and name in surfaces.rpc_names:
            uses.add(Use("rpc", "", "", surfaces.rpc_names[name]))
    return uses, calls


def js_entry_points(bundle: bytes, declarations: bytes, surfaces: JsSurfaces) -> dict[Use, list[str]]:
    """Public ``Class.method`` names of a JS bundle per operation they reach."""
    public = public_js_members(declarations)
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_javascript.language()))
    root = parser.parse(bundle).root_node
    graph = _CallGraph()
    graph.module_text["index"] = bundle.decode("utf-8")
    stack: list[tuple[str, tree_sitter.Node]] = [("", root)]
    while stack:
        owner, node = stack.pop()
        if node.type == "class_declaration":
            name_node = node.child_by_field_name("name")
            owner = _js_text(name_node) if name_node is not None else owner
        elif node.type == "variable_declarator":
            # The bundler emits ``var Commands = class { ... }``: the variable names the class.
            value = node.child_by_field_name("value")
            name_node = node.child_by_field_name("name")
            if value is not None and value.type == "class" and name_node is not None:
                owner = _js_text(name_node)
        if node.type in ("method_definition", "function_declaration"):
            name_node = node.child_by_field_name("name")
            if name_node is not None:
                name = _js_text(name_node).strip("#")
                qual = f"{owner}.{name}" if owner and node.type == "method_definition" else name
                uses, calls = _js_uses(node, surfaces)
                graph.add(_Function(qual, "index", owner, name, qual in public, calls, uses))
                continue
        stack.extend((owner, child) for child in node.named_children)
    return graph.entry_points()
