"""Read the REST operations out of the pinned Python client's generated API modules.

The Python client's REST code is ``openapi-python-client`` output: one module per
operation (``api/<tag>/<method>_<path>.py``) with a ``_get_kwargs`` that builds the
request and a ``_parse_response`` that branches on the exact status codes the client
parses, plus one ``attrs`` class per schema under ``models/``. Those modules are parsed
with :mod:`ast`, never imported or executed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from ._archive import ArtifactFiles
from ._errors import ExtractionError

JSON = dict[str, Any]


@dataclass(frozen=True)
class PyParam:
    name: str
    python_name: str
    location: str
    required: bool
    annotation: str


@dataclass(frozen=True)
class PyResponse:
    status: int
    kind: str  # "model", "list", "binary", "json", "none"
    model: str | None = None


@dataclass(frozen=True)
class PyOperation:
    """One generated REST operation as the Python client sends and parses it."""

    module: str
    method: str
    path: str  # path template with the Python argument names
    params: tuple[PyParam, ...]
    body_kind: str | None  # "json", "binary", "multipart" or None
    body_model: str | None
    content_type: str | None
    responses: tuple[PyResponse, ...] = field(default=())

    def shape(self) -> tuple[str, str]:
        """Method and path with parameter names erased, for matching across clients."""
        return self.method, re.sub(r"\{[^}]+\}", "{}", self.path)


def _fstring_path(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
                out.append("{" + part.value.id + "}")
            else:
                raise ExtractionError(f"unsupported url expression: {ast.unparse(node)}")
        return "".join(out)
    raise ExtractionError(f"unsupported url expression: {ast.unparse(node)}")


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ExtractionError(f"no function {name!r}")


def _subscript_key(target: ast.expr, container: str) -> str | None:
    if (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and target.value.id == container
        and isinstance(target.slice, ast.Constant)
    ):
        return str(target.slice.value)
    return None


def _parse_get_kwargs(fn: ast.FunctionDef) -> tuple[str, str, list[PyParam], str | None, str | None, str | None]:
    args = fn.args
    annotations = {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in [*args.args, *args.kwonlyargs]}
    path_args = [a.arg for a in args.args]
    kw_defaults = {a.arg: d is not None for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)}
    method = path = None
    query: list[PyParam] = []
    body_kind = content_type = None
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "method" and isinstance(value, ast.Constant):
                    method = str(value.value)
                if isinstance(key, ast.Constant) and key.value == "url":
                    path = _fstring_path(value)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            wire = _subscript_key(target, "params")
            if wire is not None:
                names = [n.id.removeprefix("json_") for n in ast.walk(node.value) if isinstance(n, ast.Name)]
                known = [n for n in names if n in annotations]
                if not known:
                    raise ExtractionError(f"query parameter {wire!r} comes from {ast.unparse(node.value)!r}")
                python_name = known[0]
                query.append(
                    PyParam(
                        wire, python_name, "query", not kw_defaults.get(python_name, False), annotations[python_name]
                    )
                )
            kwarg = _subscript_key(target, "_kwargs")
            if kwarg in ("json", "content", "files", "data"):
                body_kind = {"json": "json", "content": "binary", "files": "multipart", "data": "form"}[kwarg]
            header = _subscript_key(target, "headers")
            if header == "Content-Type" and isinstance(node.value, ast.Constant):
                content_type = str(node.value.value)
    if method is None or path is None:
        raise ExtractionError(f"{fn.name}: no method or url")
    params = [PyParam(a, a, "path", True, annotations[a]) for a in path_args]
    body_model = annotations.get("body") if body_kind == "json" else None
    return method, path, params + query, body_kind, body_model, content_type


def _parse_responses(fn: ast.FunctionDef) -> list[PyResponse]:
    out: list[PyResponse] = []
    for node in fn.body:
        if not (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and ast.unparse(node.test.left) == "response.status_code"
        ):
            continue
        comparator = node.test.comparators[0]
        if not isinstance(comparator, ast.Constant) or not isinstance(comparator.value, int):
            continue
        block = ast.Module(body=node.body, type_ignores=[])
        source = ast.unparse(block)
        models = sorted(
            {
                n.func.value.id
                for n in ast.walk(block)
                if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "from_dict"
                and isinstance(n.func.value, ast.Name)
            }
        )
        has_loop = any(isinstance(n, ast.For) for n in ast.walk(block))
        if models:
            out.append(PyResponse(comparator.value, "list" if has_loop else "model", models[0]))
        elif "File(" in source:
            out.append(PyResponse(comparator.value, "binary"))
        elif "cast(Any, None)" in source:
            out.append(PyResponse(comparator.value, "none"))
        else:
            out.append(PyResponse(comparator.value, "json"))
    return out


def operations(files: ArtifactFiles, api_dir: str) -> list[PyOperation]:
    """Every operation module under ``api_dir`` (for example ``e2b/api/client/api/``)."""
    ops: list[PyOperation] = []
    for name in files.under(api_dir, ".py"):
        if name.endswith("__init__.py"):
            continue
        tree = ast.parse(files.text(name), filename=name)
        method, path, params, body_kind, body_model, content_type = _parse_get_kwargs(_function(tree, "_get_kwargs"))
        responses = _parse_responses(_function(tree, "_parse_response"))
        module = name[:-3].replace("/", ".")
        ops.append(
            PyOperation(module, method, path, tuple(params), body_kind, body_model, content_type, tuple(responses))
        )
    if not ops:
        raise ExtractionError(f"{files.artifact.key}: no generated operations under {api_dir}")
    return ops


# -- models ---------------------------------------------------------------

_SCALARS: dict[str, JSON] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "datetime.datetime": {"type": "string", "format": "date-time"},
    "datetime.date": {"type": "string", "format": "date"},
    "UUID": {"type": "string", "format": "uuid"},
    "Any": {},
}


class ModelReader:
    """JSON schemas of the generated ``attrs`` models, read from their source."""

    def __init__(self, files: ArtifactFiles, models_dir: str) -> None:
        self._classes: dict[str, ast.ClassDef] = {}
        for name in files.under(models_dir, ".py"):
            for node in ast.parse(files.text(name), filename=name).body:
                if isinstance(node, ast.ClassDef):
                    self._classes[node.name] = node

    def has(self, name: str) -> bool:
        return name in self._classes

    def _enum_values(self, cls: ast.ClassDef) -> list[Any] | None:
        if not any(ast.unparse(b) == "Enum" for b in cls.bases):
            return None
        return [
            stmt.value.value
            for stmt in cls.body
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
        ]

    def annotation_schema(self, text: str) -> tuple[JSON, bool]:
        """Schema for a type annotation, and whether it admits ``Unset`` (optional)."""
        expr = ast.parse(text, mode="eval").body
        return self._expr_schema(expr)

    def _expr_schema(self, expr: ast.expr) -> tuple[JSON, bool]:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return self._expr_schema(ast.parse(expr.value, mode="eval").body)
        if isinstance(expr, ast.Subscript):
            head = ast.unparse(expr.value)
            items = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
            if head == "Union":
                optional = any(ast.unparse(i) == "Unset" for i in items)
                nullable = any(ast.unparse(i) == "None" for i in items)
                rest = [self._expr_schema(i)[0] for i in items if ast.unparse(i) not in ("Unset", "None")]
                schema = rest[0] if len(rest) == 1 else {"anyOf": rest}
                if nullable:
                    schema = {"anyOf": [schema, {"type": "null"}]}
                return schema, optional
            if head == "list":
                return {"type": "array", "items": self._expr_schema(items[0])[0]}, False
            if head == "dict":
                return {"type": "object", "additionalProperties": self._expr_schema(items[1])[0]}, False
        text = ast.unparse(expr)
        if text in _SCALARS:
            return dict(_SCALARS[text]), False
        if text == "File":
            return {"type": "string", "format": "binary"}, False
        if text in self._classes:
            values = self._enum_values(self._classes[text])
            if values is not None:
                return {"type": "string", "enum": values}, False
            return {"$ref": f"#/components/schemas/{text}"}, False
        raise ExtractionError(f"unsupported model annotation {text!r}")

    def schema(self, name: str) -> JSON:
        cls = self._classes.get(name)
        if cls is None:
            raise ExtractionError(f"no generated model {name!r}")
        annotations = {
            stmt.target.id: ast.unparse(stmt.annotation)
            for stmt in cls.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        }
        from_dict = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "from_dict")
        properties: JSON = {}
        required: list[str] = []
        for node in ast.walk(from_dict):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "d.pop"
                and isinstance(node.targets[0], ast.Name)
            ):
                key_node = node.value.args[0]
                assert isinstance(key_node, ast.Constant)
                local = node.targets[0].id
                local = local[1:] if local.startswith("_") else local
                schema, optional = self.annotation_schema(annotations.get(local, "Any"))
                properties[str(key_node.value)] = schema
                if not optional and len(node.value.args) == 1:
                    required.append(str(key_node.value))
        out: JSON = {"type": "object"}
        if properties:
            out["properties"] = properties
        if required:
            out["required"] = required
        extra = annotations.get("additional_properties")
        if extra is not None and not properties:
            out["additionalProperties"] = self.annotation_schema(extra)[0].get("additionalProperties", True)
        return out
