"""Rebuild OpenAPI 3.1 documents from the pinned JS client's type declarations.

The JS client ships its REST surfaces as ``openapi-typescript`` output inside
``dist/index.d.ts``: one ``paths`` and one ``components`` interface per surface,
each under a ``//#region src/<surface>/schema.gen.d.ts`` marker (the bundler renames
the interfaces, ``paths$1`` and so on, so the region marker is what identifies them).
That output is a faithful, mechanical image of the OpenAPI document the client was
generated from; this module inverts it with a real TypeScript parser (tree-sitter).

What the inversion can and cannot recover:

- paths, methods, parameters (location, name, required), request bodies (media
  types, required), response codes and media types, component schemas: exactly;
- ``integer`` vs ``number``: only via ``Format: int32/int64/uint32/uint64``
  (openapi-typescript maps both to ``number``);
- ``@default``, ``@deprecated``, ``@enum`` and ``Format`` from the JSDoc. Descriptions
  are deliberately dropped: the derived documents carry structure, not upstream prose.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import tree_sitter
import tree_sitter_typescript

from ._errors import ExtractionError

JSON = dict[str, Any]

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_INTEGER_FORMATS = frozenset({"int32", "int64", "uint32", "uint64"})
_REGION = re.compile(r"^//#region (\S+)")


def _parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_typescript.language_typescript()))


def _text(node: tree_sitter.Node) -> str:
    assert node.text is not None
    return node.text.decode("utf-8")


@dataclass(frozen=True)
class JSDoc:
    """The tags of one ``/** ... */`` comment that matter for a schema."""

    summary: str | None = None
    description: str | None = None
    format: str | None = None
    default: Any = None
    has_default: bool = False
    deprecated: bool = False
    is_enum: bool = False


def parse_jsdoc(comment: str | None) -> JSDoc:
    if not comment or not comment.startswith("/**"):
        return JSDoc()
    body = comment[3:-2]
    lines = [re.sub(r"^\s*\* ?", "", line) for line in body.splitlines()]
    if len(lines) == 1:
        lines = [lines[0].strip()]
    summary: list[str] = []
    tags: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("Format:"):
            tags.append(("format", [line[len("Format:") :].strip()]))
        elif line.startswith("@"):
            name, _, rest = line[1:].partition(" ")
            tags.append((name, [rest]))
        elif tags:
            tags[-1][1].append(line)
        else:
            summary.append(line)
    found: dict[str, str] = {}
    for name, parts in tags:
        found.setdefault(name, "\n".join(p.strip() for p in parts).strip())
    default_text = found.get("default")
    default: Any = None
    if default_text is not None:
        try:
            default = json.loads(default_text)
        except ValueError:
            default = default_text
    text_summary = "\n".join(summary).strip() or None
    return JSDoc(
        summary=text_summary,
        description=found.get("description") or None,
        format=found.get("format") or None,
        default=default,
        has_default=default_text is not None,
        deprecated="deprecated" in found,
        is_enum="enum" in found,
    )


@dataclass(frozen=True)
class Member:
    """One property of a TS object type, with the JSDoc comment just before it."""

    name: str
    optional: bool
    type: tree_sitter.Node | None
    doc: JSDoc


def _members(obj: tree_sitter.Node) -> Iterator[Member]:
    """Property signatures of an ``object_type`` / ``interface_body`` in source order."""
    comment: str | None = None
    for child in obj.named_children:
        if child.type == "comment":
            comment = _text(child)
            continue
        if child.type == "property_signature":
            name_node = child.child_by_field_name("name")
            assert name_node is not None
            name = _text(name_node)
            if name_node.type == "string":
                name = json.loads(name) if name.startswith('"') else name[1:-1]
            optional = any(c.type == "?" for c in child.children)
            annotation = child.child_by_field_name("type")
            type_node = annotation.named_children[0] if annotation is not None else None
            yield Member(name, optional, type_node, parse_jsdoc(comment))
        comment = None


def _index_signature(obj: tree_sitter.Node) -> tree_sitter.Node | None:
    for child in obj.named_children:
        if child.type == "index_signature":
            annotation = child.child_by_field_name("type")
            return annotation.named_children[0] if annotation is not None else None
    return None


def _is_never(node: tree_sitter.Node | None) -> bool:
    return node is not None and node.type == "predefined_type" and _text(node) == "never"


def _lookup_path(node: tree_sitter.Node) -> list[str]:
    """``components["schemas"]["X"]`` → ``["components", "schemas", "X"]``."""
    parts: list[str] = []
    while node.type == "lookup_type":
        object_node, index_node = node.named_children[0], node.named_children[-1]
        parts.append(json.loads(_text(index_node)))
        node = object_node
    parts.append(_text(node))
    return list(reversed(parts))


class SurfaceConverter:
    """Converts one surface's ``paths``/``components`` interfaces to an OpenAPI document."""

    def __init__(self, paths: tree_sitter.Node | None, components: tree_sitter.Node) -> None:
        self._paths = paths
        self._components = components
        self._component_types: dict[str, dict[str, Member]] = {
            m.name: {inner.name: inner for inner in self._object_members(m.type)}
            for m in _members(components)
            if m.type is not None and not _is_never(m.type)
        }

    @staticmethod
    def _object_members(node: tree_sitter.Node | None) -> list[Member]:
        if node is None or node.type != "object_type":
            return []
        return list(_members(node))

    # -- schemas -----------------------------------------------------------

    def schema(self, node: tree_sitter.Node, doc: JSDoc = JSDoc()) -> JSON:
        schema = self._type(node, doc)
        if doc.has_default:
            schema["default"] = doc.default
        if doc.deprecated:
            schema["deprecated"] = True
        return schema

    def _type(self, node: tree_sitter.Node, doc: JSDoc) -> JSON:
        kind = node.type
        if kind == "parenthesized_type":
            return self._type(node.named_children[0], doc)
        if kind == "predefined_type":
            return self._predefined(_text(node), doc)
        if kind == "literal_type":
            return self._literal(node)
        if kind == "array_type":
            return {"type": "array", "items": self.schema(node.named_children[0])}
        if kind == "union_type":
            return self._union(self._flatten_union(node), doc)
        if kind == "object_type":
            return self._object(node)
        if kind == "lookup_type":
            return self._reference(node)
        raise ExtractionError(f"unsupported TypeScript type {kind!r}: {_text(node)[:80]}")

    def _predefined(self, name: str, doc: JSDoc) -> JSON:
        if name == "string":
            return {"type": "string", **({"format": doc.format} if doc.format else {})}
        if name == "number":
            if doc.format in _INTEGER_FORMATS:
                return {"type": "integer", "format": doc.format}
            return {"type": "number", **({"format": doc.format} if doc.format else {})}
        if name == "boolean":
            return {"type": "boolean"}
        if name in ("unknown", "any"):
            return {}
        raise ExtractionError(f"unsupported TypeScript type {name!r}")

    @staticmethod
    def _literal(node: tree_sitter.Node) -> JSON:
        inner = node.named_children[0]
        if inner.type == "null":
            return {"type": "null"}
        if inner.type == "string":
            return {"type": "string", "enum": [json.loads(_text(inner))]}
        if inner.type == "number":
            return {"const": json.loads(_text(inner))}
        if inner.type in ("true", "false"):
            return {"type": "boolean", "enum": [inner.type == "true"]}
        raise ExtractionError(f"unsupported literal {_text(node)!r}")

    def _flatten_union(self, node: tree_sitter.Node) -> list[tree_sitter.Node]:
        if node.type != "union_type":
            return [node]
        out: list[tree_sitter.Node] = []
        for child in node.named_children:
            out.extend(self._flatten_union(child))
        return out

    def _union(self, members: list[tree_sitter.Node], doc: JSDoc) -> JSON:
        schemas = [self._type(m, JSDoc(format=doc.format)) for m in members]
        nullable = any(s == {"type": "null"} for s in schemas)
        rest = [s for s in schemas if s != {"type": "null"}]
        if rest and all(s.get("type") == "string" and "enum" in s for s in rest):
            merged: JSON = {"type": "string", "enum": [s["enum"][0] for s in rest]}
        elif len(rest) == 1:
            merged = rest[0]
        else:
            merged = {"anyOf": rest}
        if not nullable:
            return merged
        if "type" in merged and "$ref" not in merged:
            merged["type"] = [merged["type"], "null"]
            if "enum" in merged:
                merged["enum"] = [*merged["enum"], None]
            return merged
        return {"anyOf": [*merged.get("anyOf", [merged]), {"type": "null"}]}

    def _object(self, node: tree_sitter.Node) -> JSON:
        properties: JSON = {}
        required: list[str] = []
        for member in _members(node):
            if member.type is None or _is_never(member.type):
                continue
            properties[member.name] = self.schema(member.type, member.doc)
            if not member.optional:
                required.append(member.name)
        schema: JSON = {"type": "object"}
        if properties:
            schema["properties"] = properties
        if required:
            schema["required"] = required
        extra = _index_signature(node)
        if extra is not None:
            schema["additionalProperties"] = False if _is_never(extra) else (self.schema(extra) or True)
        return schema

    def _reference(self, node: tree_sitter.Node) -> JSON:
        parts = _lookup_path(node)
        if len(parts) != 3 or not parts[0].startswith("components"):
            raise ExtractionError(f"unsupported reference {_text(node)!r}")
        _, section, name = parts
        if section == "schemas":
            return {"$ref": f"#/components/schemas/{name}"}
        if section == "parameters":
            # A parameter component is only a type in openapi-typescript output; inline it.
            member = self._component_types[section][name]
            assert member.type is not None
            return self.schema(member.type, member.doc)
        raise ExtractionError(f"unsupported reference section {section!r}")

    # -- operations --------------------------------------------------------

    def _content(self, node: tree_sitter.Node | None) -> JSON | None:
        if node is None or _is_never(node):
            return None
        content: JSON = {}
        for media in self._object_members(node):
            if media.type is None:
                continue
            content[media.name] = {"schema": self.schema(media.type, media.doc)}
        return content

    def _response(self, node: tree_sitter.Node, doc: JSDoc) -> JSON:
        if node.type == "lookup_type":
            parts = _lookup_path(node)
            if len(parts) == 3 and parts[1] == "responses":
                return {"$ref": f"#/components/responses/{parts[2]}"}
            raise ExtractionError(f"unsupported response reference {_text(node)!r}")
        response: JSON = {"description": ""}  # required by OpenAPI; upstream prose is not copied
        for member in self._object_members(node):
            if member.name == "content":
                content = self._content(member.type)
                if content:
                    response["content"] = content
        return response

    def _request_body(self, member: Member) -> JSON | None:
        assert member.type is not None
        if _is_never(member.type):
            return None
        if member.type.type == "lookup_type":
            # A Reference Object admits no siblings; the component states its own "required".
            return {"$ref": f"#/components/requestBodies/{_lookup_path(member.type)[2]}"}
        body: JSON = {"content": {}}
        for inner in self._object_members(member.type):
            if inner.name == "content":
                body["content"] = self._content(inner.type) or {}
        if not member.optional:
            body["required"] = True
        return body

    def _operation(self, node: tree_sitter.Node, doc: JSDoc) -> JSON:
        operation: JSON = {}
        if doc.deprecated:
            operation["deprecated"] = True
        parameters: list[JSON] = []
        for member in self._object_members(node):
            if member.name == "parameters":
                for location in self._object_members(member.type):
                    if location.type is None or _is_never(location.type):
                        continue
                    for param in self._object_members(location.type):
                        assert param.type is not None
                        entry: JSON = {
                            "name": param.name,
                            "in": location.name,
                            "required": location.name == "path" or not param.optional,
                            "schema": self.schema(
                                param.type,
                                JSDoc(
                                    format=param.doc.format,
                                    default=param.doc.default,
                                    has_default=param.doc.has_default,
                                ),
                            ),
                        }
                        parameters.append(entry)
            elif member.name == "requestBody":
                body = self._request_body(member)
                if body is not None:
                    operation["requestBody"] = body
            elif member.name == "responses":
                operation["responses"] = {
                    code.name: self._response(code.type, code.doc)
                    for code in self._object_members(member.type)
                    if code.type is not None
                }
        if parameters:
            operation["parameters"] = parameters
        return operation

    def paths(self) -> JSON:
        out: JSON = {}
        if self._paths is None:
            return out
        for path in _members(self._paths):
            item: JSON = {}
            for method in self._object_members(path.type):
                if method.name in HTTP_METHODS and method.type is not None and not _is_never(method.type):
                    item[method.name] = self._operation(method.type, method.doc)
            if item:
                out[path.name] = item
        return out

    def components(self) -> JSON:
        out: JSON = {}
        for section, members in self._component_types.items():
            if section == "parameters":
                continue  # inlined where used
            converted: JSON = {}
            for name, member in members.items():
                assert member.type is not None
                if section == "schemas":
                    converted[name] = self.schema(member.type, member.doc)
                elif section == "responses":
                    converted[name] = self._response(member.type, member.doc)
                elif section == "requestBodies":
                    body = self._request_body(Member(name, False, member.type, member.doc))
                    if body is not None:
                        converted[name] = body
            if converted:
                out[section] = dict(sorted(converted.items()))
        return out


def declaration_regions(source: bytes) -> dict[str, dict[str, tree_sitter.Node]]:
    """Top-level interfaces of a ``.d.ts`` bundle, grouped by ``//#region`` marker.

    Interface names lose the bundler's ``$N`` suffix: ``paths$1`` → ``paths``.
    """
    tree = _parser().parse(source)
    if tree.root_node.has_error:
        raise ExtractionError("the type declarations do not parse as TypeScript")
    regions: dict[str, dict[str, tree_sitter.Node]] = {}
    current = ""
    for node in tree.root_node.named_children:
        if node.type == "comment":
            match = _REGION.match(_text(node))
            if match:
                current = match.group(1)
        elif node.type == "interface_declaration":
            name_node = node.child_by_field_name("name")
            body = node.child_by_field_name("body")
            assert name_node is not None
            assert body is not None
            regions.setdefault(current, {})[_text(name_node).split("$")[0]] = body
    return regions


def openapi_from_declarations(source: bytes, region: str) -> JSON:
    """``{"paths": ..., "components": ...}`` of the surface declared in ``region``."""
    interfaces = declaration_regions(source).get(region)
    if not interfaces or "components" not in interfaces:
        raise ExtractionError(f"no openapi-typescript declarations in region {region!r}")
    converter = SurfaceConverter(interfaces.get("paths"), interfaces["components"])
    return {"paths": converter.paths(), "components": converter.components()}
