"""The newest tuple: envd's protobuf contract as the newest Python client has it, beside the pinned one.

``newest/upstream.lock.json`` pins the newest release of each official client by exact version
and digest, as ``upstream.lock.json`` pins the mid-2026 ones. What is derived from it, relative
to the contract folder::

    newest/derived/envd.descriptor-set.binpb   process + filesystem, from the newest Python wheel
    newest/derived/envd-additions.json         what it adds to the pinned set, item by item
    newest/manifest.json                       its versions and the digests of inputs and outputs

Protobuf evolves by addition, so the newest set must be a **superset** of the pinned one: every
message, field (number, type, label, type name), enum value and method of the pinned set is in
it unchanged; anything else fails the derivation (``ExtractionError``) instead of reaching the
agent. The code in ``generated/`` is protoc's output for this superset: the agent speaks the
newest fields (``EntryInfo.is_symlink``, ``FILE_TYPE_SYMLINK``), and clients that predate a field
skip it, as protobuf decoders skip unknown fields (binary by rule, the npm client's JSON reader
by its default). The drift check (``_drift``) regenerates this tuple with the pinned one.

Only envd's descriptors are derived from the newest tuple: the newest Python and npm clients
were released from different upstream commits and disagree on some control-plane status codes,
so their REST documents do not meet the pinned tuple's rule that both clients agree. The
control-plane changes are read by hand and listed with their first release in
``conformance/client-changes.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

from ._archive import ArtifactFiles
from ._errors import ExtractionError
from ._fetch import ArtifactStore
from ._lock import Lock, load_lock
from ._protobuf import descriptor_set

NEWEST = "newest"
LOCK = f"{NEWEST}/upstream.lock.json"
DESCRIPTORS = f"{NEWEST}/derived/envd.descriptor-set.binpb"
ADDITIONS = f"{NEWEST}/derived/envd-additions.json"
MANIFEST = f"{NEWEST}/manifest.json"

# What identifies a field: two sets agree on a field when all of these are equal.
_FIELD_KEYS = ("number", "type", "label", "type_name", "oneof_index", "proto3_optional")


@dataclass(frozen=True)
class NewestTuple:
    descriptors: descriptor_pb2.FileDescriptorSet
    additions: list[str]
    lock: Lock


def _messages(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}
    stack = [(f"{proto.package}.{m.name}", m) for m in proto.message_type]
    while stack:
        name, message = stack.pop()
        found[name] = message
        stack += [(f"{name}.{nested.name}", nested) for nested in message.nested_type]
    return found


def _enums(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.EnumDescriptorProto]:
    found = {f"{proto.package}.{e.name}": e for e in proto.enum_type}
    for name, message in _messages(proto).items():
        found.update({f"{name}.{e.name}": e for e in message.enum_type})
    return found


def _field_shape(field: descriptor_pb2.FieldDescriptorProto) -> dict[str, Any]:
    set_fields = {described.name for described, _ in field.ListFields()}
    return {key: getattr(field, key) for key in _FIELD_KEYS if key in set_fields}


def _method_shape(method: descriptor_pb2.MethodDescriptorProto) -> tuple[str, str, bool, bool]:
    return (method.input_type, method.output_type, method.client_streaming, method.server_streaming)


def additions(pinned: descriptor_pb2.FileDescriptorSet, newest: descriptor_pb2.FileDescriptorSet) -> list[str]:
    """What ``newest`` adds to ``pinned``, one line each; ``ExtractionError`` if it changes or drops anything."""
    problems: list[str] = []
    added: list[str] = []
    newer = {proto.name: proto for proto in newest.file}
    for old in pinned.file:
        new = newer.pop(old.name, None)
        if new is None:
            problems.append(f"{old.name}: dropped")
            continue
        new_messages = _messages(new)
        for name, message in _messages(old).items():
            if name not in new_messages:
                problems.append(f"message {name}: dropped")
                continue
            fields = {f.name: f for f in new_messages[name].field}
            for field in message.field:
                if field.name not in fields:
                    problems.append(f"field {name}.{field.name}: dropped")
                elif _field_shape(field) != _field_shape(fields[field.name]):
                    problems.append(f"field {name}.{field.name}: changed")
            known = {f.name for f in message.field}
            added += [f"field {name}.{f.name} = {f.number}" for f in new_messages[name].field if f.name not in known]
        added += [f"message {name}" for name in sorted(set(new_messages) - set(_messages(old)))]
        new_enums = _enums(new)
        for name, enum in _enums(old).items():
            values = {v.name: v.number for v in new_enums.get(name, descriptor_pb2.EnumDescriptorProto()).value}
            for value in enum.value:
                if values.get(value.name) != value.number:
                    problems.append(f"enum value {name}.{value.name}: dropped or renumbered")
            known = {v.name for v in enum.value}
            added += [f"enum value {name}.{v} = {n}" for v, n in values.items() if v not in known]
        new_methods = {(s.name, m.name): m for s in new.service for m in s.method}
        for service in old.service:
            for method in service.method:
                now = new_methods.get((service.name, method.name))
                if now is None or _method_shape(now) != _method_shape(method):
                    problems.append(f"method {old.package}.{service.name}/{method.name}: dropped or changed")
        old_methods = {(s.name, m.name) for s in old.service for m in s.method}
        added += [f"method {new.package}.{s}/{m}" for s, m in sorted(set(new_methods) - old_methods)]
    added += [f"file {name}" for name in sorted(newer)]
    if problems:
        listed = "; ".join(problems)
        raise ExtractionError(f"the newest envd descriptors are not a superset of the pinned ones: {listed}")
    return sorted(added)


def derive(pinned: descriptor_pb2.FileDescriptorSet, store: ArtifactStore, contract_dir: Path) -> NewestTuple:
    """The newest envd descriptor set (checked against ``pinned``) from the newest Python wheel."""
    lock = load_lock(contract_dir / LOCK)
    wheel = ArtifactFiles.from_verified(store.open(lock.artifact("py-e2b")))
    newest = descriptor_set(wheel)
    return NewestTuple(descriptors=newest, additions=additions(pinned, newest), lock=lock)


def additions_document(newest: NewestTuple) -> dict[str, Any]:
    return {
        "comment": "What the newest envd descriptors add to the pinned ones (derived; see contract/_newest.py).",
        "schema": 1,
        "from": newest.lock.artifact("py-e2b").version,
        "additions": newest.additions,
    }


def manifest(newest: NewestTuple, lock_sha256: str, derived: dict[str, str]) -> dict[str, Any]:
    return {
        "schema": 1,
        "versions": {a.key: a.version for a in newest.lock.artifacts.values()},
        "artifacts": {a.key: a.manifest_entry() for a in newest.lock.artifacts.values()},
        "inputs": {LOCK: lock_sha256},
        "derived": derived,
    }


def dump(data: Any) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
