"""Every request field the pinned clients can send, enumerated from the derived contract.

A *field* is one thing a request carries besides its route, on an operation the SDKs call:

- ``query.<name>``: a query parameter (OpenAPI ``parameters``);
- ``body.<path>``: a JSON body property, nested objects as dotted paths, array items as ``[]``
  (OpenAPI request bodies; the interpreter's JSON keys);
- ``message.<path>``: a Connect request message field, dotted through nested messages (the
  envd descriptor set; map entries and well-known types are leaves);
- ``header.<Name>``: a header the clients set on that kind of request (``HEADERS`` below).

A field the contract has but no pinned client sends (``NOT_SENT``) is not listed.

Only leaves are listed: a container (``body.network``) has no effect of its own beyond its
fields'. Path parameters are the operation's identity and are not fields. A field's id is
``<operation id>:<key>``, e.g. ``control.sandboxes.create:body.network.maskRequestHost`` or
``envd.process.Start:message.process.cwd``. The enumeration is computed from the committed
derived documents every time, so it follows the contract when the pin moves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

from ._inventory import Operation, load_inventory

DERIVED_DIR = Path(__file__).parent / "derived"

# The OpenAPI document of each HTTP surface.
_OPENAPI = {
    "control-plane": "control-plane.openapi.json",
    "envd-http": "envd.openapi.json",
    "volume-content": "volume-content.openapi.json",
}

# Headers the clients set: (surface, streaming kind or None, name, operations or None for all of
# the surface's). See docs/PROTOCOL-NOTES.md, "Headers". Routing headers (E2b-Sandbox-Id,
# E2b-Sandbox-Port) and Connect's own protocol headers are transport, shown by every request
# reaching its sandbox; they are not listed.
_AS_USER = (  # the calls that take a user option and send it as Authorization: Basic <user>
    "envd.process.Start",
    *(
        f"envd.filesystem.{name}"
        for name in ("ListDir", "Stat", "MakeDir", "Move", "Remove", "WatchDir", "CreateWatcher")
    ),
)
HEADERS: tuple[tuple[str, str | None, str, tuple[str, ...] | None], ...] = (
    ("control-plane", None, "X-API-Key", None),  # whose sandboxes the call sees
    ("envd-http", None, "X-Access-Token", None),  # the sandbox's envd token (secure sandboxes)
    ("envd-rpc", None, "X-Access-Token", None),
    ("envd-rpc", None, "Authorization", _AS_USER),  # the user the call acts as
    ("envd-rpc", "server-stream", "Keepalive-Ping-Interval", None),  # keepalives on long streams
    ("envd-rpc", "server-stream", "Connect-Timeout-Ms", None),  # the stream's deadline
    ("interpreter", None, "X-Access-Token", None),
    ("interpreter", None, "E2B-Traffic-Access-Token", None),  # private sandboxes' ports
)

# Fields the contract has but a pinned client never sends, so that none of its users can depend
# on them: (``key``, ``operations``, the flavours that never send it or None for every one, why).
# A field no flavour sends is not enumerated at all; one some flavours send has no cell for the
# others. Process tags are the other arm of the selector oneof (``pid`` | ``tag``): the clients
# select processes by pid and start them without a tag (tags are only read, from List answers).
# tests/contract/test_fields.py checks each row against the pinned clients' sources.
_PROCESS_SELECTED = ("Connect", "SendInput", "SendSignal", "CloseStdin", "Update")
_CONTEXT_CALLS = tuple(f"interpreter.contexts.{name}" for name in ("create", "list", "remove", "restart"))
NOT_SENT: tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None, str], ...] = (
    ("message.tag", ("envd.process.Start",), None, "no client starts a process with a tag"),
    (
        "message.process.tag",
        tuple(f"envd.process.{name}" for name in _PROCESS_SELECTED),
        None,
        "the clients select a process by pid only",
    ),
    ("header.X-Access-Token", _CONTEXT_CALLS, ("js",), "the JS interpreter client sends it on /execute only"),
)


def not_sent(flavour: str | None = None) -> dict[str, str]:
    """Field id → why it is not sent: by any pinned client (``flavour`` None; these are left out of
    ``load_fields``), or by that flavour's client."""
    return {
        f"{operation}:{key}": why
        for key, operations, flavours, why in NOT_SENT
        if flavours is None or (flavour is not None and flavour in flavours)
        for operation in operations
    }


# Descriptor field types that nest (TYPE_MESSAGE); map entries and well-known types do not.
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_MAX_DEPTH = 4


@dataclass(frozen=True, order=True)
class Field:
    """One request field of one operation."""

    operation: str  # inventory id
    key: str  # "body.network.allowOut", "message.process.cwd", "query.limit", "header.X-API-Key"

    @property
    def id(self) -> str:
        return f"{self.operation}:{self.key}"

    @property
    def location(self) -> str:
        return self.key.partition(".")[0]


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    resolved: dict[str, Any] = node
    return resolved


def _schema_paths(doc: dict[str, Any], schema: dict[str, Any], prefix: str, seen: frozenset[str]) -> Iterator[str]:
    """Dotted property paths of a JSON schema; a ``$ref`` cycle ends at the property."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        if ref in seen:
            return
        seen = seen | {ref}
    schema = _resolve(doc, schema)
    for combinator in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(combinator, ()):
            yield from _schema_paths(doc, sub, prefix, seen)
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        yield from _schema_paths(doc, schema["items"], prefix + "[]", seen)
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path
        yield from _schema_paths(doc, sub, path, seen)


def _openapi_fields(doc: dict[str, Any], operation: Operation) -> Iterator[str]:
    item = doc["paths"].get(operation.path, {})
    spec = item.get((operation.method or "").lower())
    if spec is None:
        return
    for raw in (*item.get("parameters", ()), *spec.get("parameters", ())):
        parameter = _resolve(doc, raw)
        if parameter["in"] in ("query", "header"):
            yield f"{parameter['in']}.{parameter['name']}"
    # Only JSON bodies have fields; an upload's multipart or octet-stream body is the payload.
    for content_type, media in spec.get("requestBody", {}).get("content", {}).items():
        if content_type.endswith("json"):
            for path in _schema_paths(doc, media.get("schema", {}), "", frozenset()):
                yield f"body.{path}"


def _messages(descriptors: descriptor_pb2.FileDescriptorSet) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def register(message: descriptor_pb2.DescriptorProto, scope: str) -> None:
        name = f"{scope}.{message.name}"
        found[name] = message
        for nested in message.nested_type:
            register(nested, name)

    for file in descriptors.file:
        for message in file.message_type:
            register(message, f".{file.package}" if file.package else "")
    return found


def _message_paths(
    messages: dict[str, descriptor_pb2.DescriptorProto], type_name: str, prefix: str, depth: int
) -> Iterator[str]:
    message = messages.get(type_name)
    if message is None or message.options.map_entry:
        return
    for field in message.field:
        path = f"{prefix}.{field.name}" if prefix else field.name
        yield path
        nested = messages.get(field.type_name)
        nests = field.type == _MESSAGE and nested is not None and not nested.options.map_entry
        if nests and depth < _MAX_DEPTH and not field.type_name.startswith(".google.protobuf."):
            yield from _message_paths(messages, field.type_name, path, depth + 1)


def _procedure_inputs(descriptors: descriptor_pb2.FileDescriptorSet) -> dict[str, str]:
    inputs: dict[str, str] = {}
    for file in descriptors.file:
        for service in file.service:
            qualified = f"{file.package}.{service.name}" if file.package else service.name
            for method in service.method:
                inputs[f"{qualified}/{method.name}"] = method.input_type
    return inputs


def _interpreter_keys(routes: list[dict[str, Any]], operation: Operation) -> Iterator[str]:
    for route in routes:
        if route["path"] == operation.path and route["method"] == operation.method:
            for key in route.get("request_json_keys", ()):
                yield f"body.{key}"


def _header_fields(operation: Operation) -> Iterator[str]:
    for surface, streaming, name, operations in HEADERS:
        if surface != operation.surface or streaming not in (None, operation.streaming):
            continue
        if operations is None or operation.id in operations:
            yield f"header.{name}"


def load_fields(
    derived: Path = DERIVED_DIR, operations: list[Operation] | None = None, *, include_not_sent: bool = False
) -> tuple[Field, ...]:
    """Every field of every operation the SDKs call, sorted by id, except those in ``NOT_SENT``."""
    operations = load_inventory(derived / "inventory.json") if operations is None else operations
    docs = {surface: json.loads((derived / name).read_text(encoding="utf-8")) for surface, name in _OPENAPI.items()}
    descriptors = descriptor_pb2.FileDescriptorSet.FromString((derived / "envd.descriptor-set.binpb").read_bytes())
    messages, inputs = _messages(descriptors), _procedure_inputs(descriptors)
    routes = json.loads((derived / "interpreter.json").read_text(encoding="utf-8"))["routes"]
    keys: set[Field] = set()
    for operation in operations:
        if not operation.called_by_sdk:
            continue
        if operation.surface in docs:
            found = list(_openapi_fields(docs[operation.surface], operation))
        elif operation.surface == "envd-rpc" and operation.procedure in inputs:
            found = [f"message.{path}" for path in _message_paths(messages, inputs[operation.procedure], "", 0)]
        elif operation.surface == "interpreter":
            found = list(_interpreter_keys(routes, operation))
        else:
            found = []
        keys.update(Field(operation.id, key) for key in _leaves((*found, *_header_fields(operation))))
    unsent = {} if include_not_sent else not_sent()
    return tuple(sorted((f for f in keys if f.id not in unsent), key=lambda field: field.id))


def _leaves(keys: tuple[str, ...]) -> Iterator[str]:
    """Keys without children: a container (``body.network``, ``message.process``) is covered
    through its fields, and its effect is theirs."""
    for key in keys:
        if not any(other.startswith((f"{key}.", f"{key}[]")) for other in keys):
            yield key


def flavour_reaches(operation: Operation, flavour: str) -> bool:
    """Whether a client flavour has an entry point that sends this operation.

    Flavours are the harness's: ``py-sync`` and ``py-async`` (the Python clients' synchronous
    and asynchronous classes) and ``js``.
    """
    if flavour == "js":
        return bool(operation.js_entry_points)
    asynchronous = [entry for entry in operation.python_entry_points if _is_async(entry)]
    if flavour == "py-async":
        return bool(asynchronous)
    if flavour == "py-sync":
        return len(asynchronous) < len(operation.python_entry_points)
    return False


def _is_async(entry_point: str) -> bool:
    module, _, function = entry_point.rpartition(".")
    return "async" in module or function.startswith("acheck_")
