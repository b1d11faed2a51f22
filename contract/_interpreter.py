"""The Code Interpreter surface as the pinned interpreter clients send and parse it.

Routes come from the requests the clients build against their interpreter URL
(``self._jupyter_url`` in Python, ``this.jupyterUrl`` in JS); NDJSON message types
from the branches of each client's output parser (``_parse_output`` / ``parseOutput``)
and the keys each branch reads. Result MIME fields come from the ``Result``
constructors. Sources are parsed, never executed.
"""

from __future__ import annotations

import ast
from typing import Any

import tree_sitter
import tree_sitter_javascript

from ._archive import ArtifactFiles
from ._errors import ExtractionError

JSON = dict[str, Any]

PY_PACKAGE = "e2b_code_interpreter/"
PY_PARSER_MODULE = "e2b_code_interpreter/models.py"
JS_BUNDLE = "dist/index.js"


def _url_suffix(values: list[ast.expr]) -> str:
    """The part of an f-string URL after the base: ``/contexts/{context_id}``."""
    parts = []
    for value in values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            parts.append("{" + ast.unparse(value.value) + "}")
    return "".join(parts)


def _json_keys(fn: ast.AST, value: ast.expr) -> list[str]:
    """Keys of a JSON body given as a dict literal or as a local dict filled key by key."""
    if isinstance(value, ast.Dict):
        return [str(k.value) for k in value.keys if isinstance(k, ast.Constant)]
    if not isinstance(value, ast.Name):
        return []
    keys: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == value.id and isinstance(node.value, ast.Dict):
                keys |= {str(k.value) for k in node.value.keys if isinstance(k, ast.Constant)}
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id == value.id
                and isinstance(target.slice, ast.Constant)
            ):
                keys.add(str(target.slice.value))
    return sorted(keys)


def _py_route_calls(files: ArtifactFiles) -> list[JSON]:
    """Requests to the interpreter URL in the Python client, with the JSON body keys sent."""
    routes: dict[tuple[str, str], JSON] = {}
    for name in files.under(PY_PACKAGE, ".py"):
        tree = ast.parse(files.text(name), filename=name)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            reads_json = any(isinstance(n, ast.Attribute) and n.attr == "json" for n in ast.walk(fn))
            reads_lines = any(
                isinstance(n, ast.Attribute) and n.attr in ("iter_lines", "aiter_lines") for n in ast.walk(fn)
            )
            for call in ast.walk(fn):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                    continue
                args = list(call.args)
                verb = call.func.attr
                if verb == "stream" and args and isinstance(args[0], ast.Constant):
                    verb, args = str(args[0].value).lower(), args[1:]
                if verb not in ("get", "post", "put", "patch", "delete") or not args:
                    continue
                url = args[0]
                if not (isinstance(url, ast.JoinedStr) and "_jupyter_url" in ast.unparse(url.values[0])):
                    continue
                path = _url_suffix(url.values[1:])
                body: list[str] = []
                for keyword in call.keywords:
                    if keyword.arg == "json":
                        body = _json_keys(fn, keyword.value)
                response = (
                    "ndjson" if call.func.attr == "stream" and reads_lines else "json" if reads_json else "ignored"
                )
                entry = routes.setdefault(
                    (verb.upper(), path),
                    {
                        "method": verb.upper(),
                        "path": path,
                        "request_json_keys": [],
                        "response": response,
                        "python": [],
                    },
                )
                entry["request_json_keys"] = sorted(set(entry["request_json_keys"]) | set(body))
                entry["python"] = sorted({*entry["python"], name[:-3].replace("/", ".") + "." + fn.name})
    if not routes:
        raise ExtractionError("no interpreter requests found in the Python interpreter client")
    return [routes[k] for k in sorted(routes, key=lambda k: (k[1], k[0]))]


def _py_message_types(files: ArtifactFiles) -> dict[str, list[str]]:
    tree = ast.parse(files.text(PY_PARSER_MODULE), filename=PY_PARSER_MODULE)
    parser = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_parse_output"), None)
    result_cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Result"), None)
    if parser is None or result_cls is None:
        raise ExtractionError(f"{PY_PARSER_MODULE}: no _parse_output or Result")
    init = next(n for n in result_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    result_fields = [a.arg for a in init.args.args[1:]]
    types: dict[str, list[str]] = {}
    branch: ast.stmt | None = next((n for n in parser.body if isinstance(n, ast.If)), None)
    while isinstance(branch, ast.If):
        test = branch.test
        if isinstance(test, ast.Compare) and isinstance(test.comparators[0], ast.Constant):
            kind = str(test.comparators[0].value)
            block = ast.Module(body=branch.body, type_ignores=[])
            keys = {
                str(n.slice.value)
                for n in ast.walk(block)
                if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and ast.unparse(n.value) == "data"
            }
            if any(
                isinstance(n, ast.Starred) or (isinstance(n, ast.keyword) and n.arg is None) for n in ast.walk(block)
            ):
                keys |= set(result_fields)  # Result(**data)
            types[kind] = sorted(keys)
        branch = branch.orelse[0] if branch.orelse else None
    return types


def _js_text(node: tree_sitter.Node) -> str:
    assert node.text is not None
    return node.text.decode("utf-8")


def _js_walk(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(current.named_children)
    return out


def _js_message_types(bundle: bytes) -> dict[str, list[str]]:
    root = tree_sitter.Parser(tree_sitter.Language(tree_sitter_javascript.language())).parse(bundle).root_node
    nodes = _js_walk(root)
    parser = next(
        (
            n
            for n in nodes
            if n.type == "function_declaration" and _js_text(n.child_by_field_name("name") or n) == "parseOutput"
        ),
        None,
    )
    result_cls = next(
        (
            n
            for n in nodes
            if n.type == "variable_declarator" and _js_text(n.child_by_field_name("name") or n) == "Result"
        ),
        None,
    )
    if parser is None or result_cls is None:
        raise ExtractionError("JS interpreter client: no parseOutput or Result")
    result_fields = sorted(
        {
            _js_string_index(n)
            for n in _js_walk(result_cls)
            if n.type == "subscript_expression" and _js_text(n.child_by_field_name("object") or n) == "data"
        }
        - {""}
    )
    types: dict[str, list[str]] = {}
    for case in (n for n in _js_walk(parser) if n.type == "switch_case"):
        value = case.child_by_field_name("value")
        if value is None or value.type != "string":
            continue
        kind = _js_text(value)[1:-1]
        keys = {
            _js_text(n.child_by_field_name("property") or n)
            for n in _js_walk(case)
            if n.type == "member_expression" and _js_text(n.child_by_field_name("object") or n) == "msg"
        }
        if any(
            n.type == "new_expression" and _js_text(n.child_by_field_name("constructor") or n) == "Result"
            for n in _js_walk(case)
        ):
            keys |= set(result_fields)
        types[kind] = sorted(keys - {"type"})  # "type" is the discriminator itself
    return types


def _js_string_index(node: tree_sitter.Node) -> str:
    index = node.child_by_field_name("index")
    return _js_text(index)[1:-1] if index is not None and index.type == "string" else ""


def interpreter_surface(py: ArtifactFiles, js: ArtifactFiles) -> JSON:
    """Routes and NDJSON message types, with which client reads which field."""
    py_types = _py_message_types(py)
    js_types = _js_message_types(js.read(JS_BUNDLE))
    messages: JSON = {}
    for kind in sorted(set(py_types) | set(js_types)):
        fields = sorted(set(py_types.get(kind, [])) | set(js_types.get(kind, [])))
        messages[kind] = {
            "fields": {f: {"python": f in py_types.get(kind, []), "js": f in js_types.get(kind, [])} for f in fields},
            "parsed_by": sorted(c for c, t in (("python", py_types), ("js", js_types)) if kind in t),
        }
    return {"routes": _py_route_calls(py), "ndjson_message_types": messages}
