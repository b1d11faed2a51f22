"""Assemble the derived contract from the four verified artifacts.

Outputs, relative to the contract folder::

    derived/control-plane.openapi.json   REST control plane (OpenAPI 3.1)
    derived/envd.openapi.json            envd HTTP (OpenAPI 3.1)
    derived/volume-content.openapi.json  volume content API (OpenAPI 3.1)
    derived/interpreter.json             Code Interpreter routes and NDJSON message types
    derived/envd.descriptor-set.binpb    process + filesystem FileDescriptorSet
    derived/inventory.json               every public operation, with entry points
    generated/                           protoc + Connect output for the newest descriptor set
    manifest.json                        versions, digests of inputs and outputs
    newest/derived/, newest/manifest.json  the newest tuple's envd descriptors (``_newest``)

Control plane and envd HTTP come from the JS client's declarations (the complete
image of their OpenAPI documents); the Python client's generated modules must agree
with them on every operation both know (method, path, status codes, query
parameters), or derivation fails. The JS client declares no volume-content paths,
so that document's paths come from the Python client's modules, with the path
parameter names the JS client uses.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import _entrypoints as ep
from . import _newest
from ._archive import ArtifactFiles
from ._errors import ExtractionError
from ._fetch import ArtifactStore
from ._interpreter import interpreter_surface
from ._lock import Lock, load_lock
from ._protobuf import Procedure, descriptor_set, generate_code, procedures
from ._pyclient import ModelReader, PyOperation, operations
from ._tsopenapi import HTTP_METHODS, openapi_from_declarations

JSON = dict[str, Any]

CONTRACT_DIR = Path(__file__).parent
DERIVED = "derived"
GENERATED = "generated"
MANIFEST = "manifest.json"
HAND_KEPT = ("upstream.lock.json", "operation_ids.json", "supplement.json", "newest/upstream.lock.json")
TOOLCHAIN = (
    "grpcio-tools",
    "protobuf",
    "protoc-gen-connect-python",
    "tree-sitter",
    "tree-sitter-typescript",
    "tree-sitter-javascript",
)

_JS_DECLARATIONS = "dist/index.d.ts"
_JS_BUNDLE = "dist/index.js"
_REGIONS = {
    "control": "src/api/schema.gen.d.ts",
    "envd": "src/envd/schema.gen.d.ts",
    "volume": "src/volume/schema.gen.d.ts",
}
_TITLES = {"control": "E2B control plane", "envd": "envd HTTP", "volume": "E2B volume content"}
_FILES = {"control": "control-plane.openapi.json", "envd": "envd.openapi.json", "volume": "volume-content.openapi.json"}


@dataclass(frozen=True)
class Sources:
    lock: Lock
    py: ArtifactFiles
    py_interpreter: ArtifactFiles
    js: ArtifactFiles
    js_interpreter: ArtifactFiles


def load_sources(store: ArtifactStore, lock: Lock) -> Sources:
    """Open (and verify) the four pinned artifacts."""
    return Sources(
        lock=lock,
        py=ArtifactFiles.from_verified(store.open(lock.artifact("py-e2b"))),
        py_interpreter=ArtifactFiles.from_verified(store.open(lock.artifact("py-e2b-code-interpreter"))),
        js=ArtifactFiles.from_verified(store.open(lock.artifact("js-e2b"))),
        js_interpreter=ArtifactFiles.from_verified(store.open(lock.artifact("js-e2b-code-interpreter"))),
    )


def _dump(data: Any) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _key(method: str, path: str) -> str:
    return f"{method.upper()} {path}"


# -- REST documents ---------------------------------------------------------


def _check_python_agrees(doc: JSON, py_ops: list[PyOperation], surface: str) -> dict[str, PyOperation]:
    """Match Python operations to the document's; fail on any disagreement."""
    by_shape = {(m, ep.path_shape(p)): p for p, item in doc["paths"].items() for m in item}
    matched: dict[str, PyOperation] = {}
    for op in py_ops:
        path = by_shape.get(op.shape())
        if path is None:
            raise ExtractionError(
                f"{surface}: the Python client calls {op.method.upper()} {op.path}, which the JS declarations lack"
            )
        declared = doc["paths"][path][op.method]
        js_codes = set(declared.get("responses", {}))
        py_codes = {str(r.status) for r in op.responses}
        if js_codes != py_codes:
            raise ExtractionError(
                f"{surface} {op.method.upper()} {path}: status codes differ "
                f"(JS {sorted(js_codes)}, Python {sorted(py_codes)})"
            )
        js_query = {p["name"] for p in declared.get("parameters", []) if p["in"] == "query"}
        py_query = {p.name for p in op.params if p.location == "query"}
        if js_query != py_query:
            raise ExtractionError(
                f"{surface} {op.method.upper()} {path}: query parameters differ "
                f"(JS {sorted(js_query)}, Python {sorted(py_query)})"
            )
        matched[_key(op.method, path)] = op
    return matched


def _js_literal_paths(bundle: bytes) -> dict[tuple[str, str], str]:
    """``(method, shape) → path`` for every ``api.VERB("/literal")`` call in the JS bundle."""
    text = bundle.decode("utf-8")
    out: dict[tuple[str, str], str] = {}
    for verb, path in re.findall(r'\.(GET|POST|PUT|PATCH|DELETE)\("(/[^"]*)"', text):
        out[(verb.lower(), ep.path_shape(path))] = path
    return out


def _volume_paths(py_ops: list[PyOperation], models: ModelReader, js_paths: dict[tuple[str, str], str]) -> JSON:
    paths: JSON = {}
    for op in sorted(py_ops, key=lambda o: (o.path, HTTP_METHODS.index(o.method))):
        declared = js_paths.get(op.shape())
        if declared is None:
            raise ExtractionError(f"volume {op.method.upper()} {op.path}: the JS client never calls it")
        names = re.findall(r"\{([^}]+)\}", declared)
        path_params = iter(names)
        parameters = []
        for param in op.params:
            schema, _ = models.annotation_schema(param.annotation)
            name = next(path_params) if param.location == "path" else param.name
            parameters.append({"name": name, "in": param.location, "required": param.required, "schema": schema})
        operation: JSON = {"parameters": parameters}
        if op.body_kind == "json" and op.body_model:
            operation["requestBody"] = {
                "required": True,
                "content": {op.content_type or "application/json": {"schema": models.schema(op.body_model)}},
            }
        elif op.body_kind == "binary":
            operation["requestBody"] = {
                "required": True,
                "content": {
                    op.content_type or "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            }
        responses: JSON = {}
        for response in op.responses:
            entry: JSON = {"description": ""}
            ref = {"$ref": f"#/components/schemas/{response.model}"} if response.model else None
            if response.kind == "model" and ref:
                entry["content"] = {"application/json": {"schema": ref}}
            elif response.kind == "list" and ref:
                entry["content"] = {"application/json": {"schema": {"type": "array", "items": ref}}}
            elif response.kind == "binary":
                entry["content"] = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
            elif response.kind == "json":
                entry["content"] = {"application/json": {"schema": {}}}
            responses[str(response.status)] = entry
        operation["responses"] = responses
        paths.setdefault(declared, {})[op.method] = operation
    return paths


def _name_operations(doc: JSON, surface: str, names: dict[str, str]) -> None:
    """Give every operation its hand-kept stable id (as ``operationId``)."""
    seen = set()
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            key = _key(method, path)
            if key not in names:
                raise ExtractionError(f"{surface} operation {key} has no id in operation_ids.json")
            operation["operationId"] = names[key]
            seen.add(key)
    unused = sorted(set(names) - seen)
    if unused:
        raise ExtractionError(f"operation_ids.json names {surface} operations that do not exist: {unused}")


def _document(surface: str, body: JSON, lock: Lock, artifacts: list[str]) -> JSON:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"{_TITLES[surface]} (derived)",
            "version": " + ".join(f"{lock.artifact(a).name} {lock.artifact(a).version}" for a in artifacts),
            "description": "Derived from the pinned official clients; see contract/manifest.json.",
        },
        "paths": body["paths"],
        "components": body["components"],
    }


def rest_documents(src: Sources, names: JSON) -> tuple[dict[str, JSON], dict[str, dict[str, PyOperation]]]:
    declarations = src.js.read(_JS_DECLARATIONS)
    py_control = operations(src.py, "e2b/api/client/api/")
    py_volume = operations(src.py, "e2b/volume/client/api/")
    volume_models = ModelReader(src.py, "e2b/volume/client/models/")

    control = openapi_from_declarations(declarations, _REGIONS["control"])
    envd = openapi_from_declarations(declarations, _REGIONS["envd"])
    volume_components = openapi_from_declarations(declarations, _REGIONS["volume"])["components"]
    volume = {
        "paths": _volume_paths(py_volume, volume_models, _js_literal_paths(src.js.read(_JS_BUNDLE))),
        "components": volume_components,
    }

    python_ops = {
        "control": _check_python_agrees(control, py_control, "control"),
        "volume": {
            _key(o.method, p): o
            for o in py_volume
            for p in volume["paths"]
            if (o.method, ep.path_shape(p)) == o.shape()
        },
    }
    docs = {}
    for surface, body, artifacts in (
        ("control", control, ["js-e2b", "py-e2b"]),
        ("envd", envd, ["js-e2b"]),
        ("volume", volume, ["py-e2b", "js-e2b"]),
    ):
        _name_operations(body, surface, names[surface])
        docs[surface] = _document(surface, body, src.lock, artifacts)
    return docs, python_ops


# -- entry points -------------------------------------------------------------


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _route_constants(files: ArtifactFiles) -> dict[str, str]:
    tree = ast.parse(files.text("e2b/envd/api.py"))
    return {
        node.targets[0].id: str(node.value.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.endswith("_ROUTE")
        and isinstance(node.value, ast.Constant)
    }


def entry_points(
    src: Sources, docs: dict[str, JSON], python_ops: dict[str, dict[str, PyOperation]], procs: list[Procedure]
) -> dict[str, dict[str, dict[tuple[str, str, str], list[str]]]]:
    """``client → surface → (method, path-or-procedure, "") → public functions``."""
    generated = {
        op.module: ep.Use("http", surface, op.method.upper(), key.split(" ", 1)[1])
        for surface, ops in python_ops.items()
        for key, op in ops.items()
    }
    rpc_py = {_snake(p.method): f"{p.service}/{p.method}" for p in procs}
    rpc_js = {p.method[0].lower() + p.method[1:]: f"{p.service}/{p.method}" for p in procs}
    if len(rpc_py) != len(procs):
        raise ExtractionError("two envd procedures share a client method name")
    py_surfaces = ep.PythonSurfaces(generated, _route_constants(src.py), rpc_py)
    http_paths = {s: {ep.path_shape(p): p for p in d["paths"]} for s, d in docs.items()}
    js_surfaces = ep.JsSurfaces(http_paths, rpc_js)
    generated_dirs = ("e2b/api/client/", "e2b/volume/client/", "e2b/envd/process/", "e2b/envd/filesystem/")
    found = {
        "python": {
            **ep.python_entry_points(src.py, "e2b/", py_surfaces, generated_dirs),
            **ep.python_entry_points(src.py_interpreter, "e2b_code_interpreter/", py_surfaces),
        },
        "js": {
            **ep.js_entry_points(src.js.read(_JS_BUNDLE), src.js.read(_JS_DECLARATIONS), js_surfaces),
            **ep.js_entry_points(
                src.js_interpreter.read(_JS_BUNDLE), src.js_interpreter.read("dist/index.d.ts"), js_surfaces
            ),
        },
    }
    out: dict[str, dict[str, dict[tuple[str, str, str], list[str]]]] = {}
    for client, uses in found.items():
        for use, names in uses.items():
            surface = "rpc" if use.kind == "rpc" else use.surface
            key = (use.method, use.path, "") if use.kind == "http" else ("", use.path, "")
            out.setdefault(client, {}).setdefault(surface, {})[key] = names
    return out


# -- inventory ----------------------------------------------------------------


def _lookup(found: JSON, client: str, surface: str, method: str, path: str) -> list[str]:
    table = found.get(client, {}).get(surface, {})
    shape = ep.path_shape(path)
    names: set[str] = set()
    for (m, p, _), value in table.items():
        if m == method and ep.path_shape(p) == shape:
            names.update(value)
    return sorted(names)


def inventory(
    *,
    docs: dict[str, JSON],
    python_ops: dict[str, dict[str, PyOperation]],
    procs: list[Procedure],
    interpreter: JSON,
    supplement: JSON,
    names: JSON,
    found: JSON,
) -> JSON:
    entries: list[JSON] = []
    surfaces = {"control": "control-plane", "envd": "envd-http", "volume": "volume-content"}
    for surface, doc in docs.items():
        for path, item in doc["paths"].items():
            for method, operation in item.items():
                py_op = python_ops.get(surface, {}).get(_key(method, path))
                python = _lookup(found, "python", surface, method.upper(), path)
                js = _lookup(found, "js", surface, method.upper(), path)
                entries.append(
                    {
                        "id": operation["operationId"],
                        "surface": surfaces[surface],
                        "transport": "http",
                        "streaming": "unary",
                        "method": method.upper(),
                        "path": path,
                        "success": sorted(int(c) for c in operation.get("responses", {}) if c.startswith("2")),
                        "declared_by": {
                            "python": py_op.module if py_op else None,
                            "js": _JS_DECLARATIONS if surface != "volume" else _JS_BUNDLE,
                        },
                        "entry_points": {"python": python, "js": js},
                        "called_by_sdk": bool(python or js),
                        "source": "derived",
                    }
                )
    for proc in procs:
        entries.append(
            {
                "id": f"envd.{proc.service.split('.')[0]}.{proc.method}",
                "surface": "envd-rpc",
                "transport": "connect",
                "streaming": proc.kind,
                "procedure": f"{proc.service}/{proc.method}",
                "path": proc.path,
                "input": proc.input_type,
                "output": proc.output_type,
                "entry_points": {
                    c: sorted(found.get(c, {}).get("rpc", {}).get(("", f"{proc.service}/{proc.method}", ""), []))
                    for c in ("python", "js")
                },
                "source": "derived",
            }
        )
        entries[-1]["called_by_sdk"] = any(entries[-1]["entry_points"].values())
    routes = [dict(r, source="derived") for r in interpreter["routes"]]
    routes += [dict(r, source="supplement") for r in supplement.get("interpreter", [])]
    for route in routes:
        key = _key(route["method"], route["path"])
        if key not in names["interpreter"]:
            raise ExtractionError(f"interpreter route {key} has no id in operation_ids.json")
        python = _lookup(found, "python", "interpreter", route["method"], route["path"])
        js = _lookup(found, "js", "interpreter", route["method"], route["path"])
        entries.append(
            {
                "id": names["interpreter"][key],
                "surface": "interpreter",
                "transport": "http",
                "streaming": "ndjson-stream" if route["response"] == "ndjson" else "unary",
                "method": route["method"],
                "path": route["path"],
                "entry_points": {"python": python, "js": js},
                "called_by_sdk": bool(python or js),
                "source": route["source"],
                **({"reason": route["reason"]} if "reason" in route else {}),
            }
        )
    ids = [e["id"] for e in entries]
    if len(ids) != len(set(ids)):
        raise ExtractionError("duplicate operation ids in the inventory")
    return {"schema": 1, "operations": sorted(entries, key=lambda e: e["id"])}


# -- whole contract -------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _toolchain() -> dict[str, str]:
    out = {}
    for dist in TOOLCHAIN:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def generate(out: Path, store: ArtifactStore | None = None, contract_dir: Path = CONTRACT_DIR) -> list[Path]:
    """Write the whole derived contract below ``out`` (which mirrors the contract folder)."""
    lock = load_lock(contract_dir / "upstream.lock.json")
    names = json.loads((contract_dir / "operation_ids.json").read_text(encoding="utf-8"))
    supplement = json.loads((contract_dir / "supplement.json").read_text(encoding="utf-8"))
    store = store or ArtifactStore()
    src = load_sources(store, lock)

    fds = descriptor_set(src.py)
    newest = _newest.derive(fds, store, contract_dir)  # a superset of fds, or an ExtractionError
    procs = procedures(fds)
    docs, python_ops = rest_documents(src, names)
    interp = interpreter_surface(src.py_interpreter, src.js_interpreter)
    found = entry_points(src, docs, python_ops, procs)
    inv = inventory(
        docs=docs,
        python_ops=python_ops,
        procs=procs,
        interpreter=interp,
        supplement=supplement,
        names=names,
        found=found,
    )

    files: dict[str, bytes] = {f"{DERIVED}/{_FILES[s]}": _dump(d) for s, d in docs.items()}
    files[f"{DERIVED}/interpreter.json"] = _dump(interp)
    files[f"{DERIVED}/inventory.json"] = _dump(inv)
    files[f"{DERIVED}/envd.descriptor-set.binpb"] = fds.SerializeToString(deterministic=True)
    newest_bytes = newest.descriptors.SerializeToString(deterministic=True)
    newest_files = {
        _newest.DESCRIPTORS: newest_bytes,
        _newest.ADDITIONS: _newest.dump(_newest.additions_document(newest)),
    }
    files.update(newest_files)
    for rel, data in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    # The code the server and agent run is the newest superset's: the pinned clients skip what they predate.
    with tempfile.TemporaryDirectory() as tmp:
        descriptor_file = Path(tmp) / "envd.binpb"
        descriptor_file.write_bytes(newest_bytes)
        for path in generate_code(descriptor_file, newest.descriptors, out / GENERATED):
            files[path.relative_to(out).as_posix()] = path.read_bytes()
    lock_digest = _sha256((contract_dir / _newest.LOCK).read_bytes())
    newest_manifest = _newest.manifest(newest, lock_digest, {rel: _sha256(data) for rel, data in newest_files.items()})
    (out / _newest.MANIFEST).write_bytes(_newest.dump(newest_manifest))

    manifest = {
        "schema": 1,
        "full_compatibility": False,
        "versions": {a.key: a.version for a in lock.artifacts.values()},
        "sources": {s.key: {"repository": s.repository, "commit": s.commit} for s in lock.sources.values()},
        "artifacts": {a.key: a.manifest_entry() for a in lock.artifacts.values()},
        "inputs": {name: _sha256((contract_dir / name).read_bytes()) for name in HAND_KEPT},
        "toolchain": _toolchain(),
        "derived": {rel: _sha256(data) for rel, data in sorted(files.items())},
    }
    (out / MANIFEST).write_bytes(_dump(manifest))
    return sorted([*(out / rel for rel in files), out / MANIFEST])
