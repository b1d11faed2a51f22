"""The openapi-typescript inversion, on declarations written for these tests."""

from __future__ import annotations

import pytest

from contract import ExtractionError
from contract._tsopenapi import openapi_from_declarations, parse_jsdoc

DECLARATIONS = b"""
//#region src/demo/schema.gen.d.ts
interface paths {
  "/pets/{petID}": {
    parameters: { query?: never; header?: never; path?: never; cookie?: never; };
    /** @description Get a pet */
    get: {
      parameters: {
        query?: {
          /** @description Page size */
          limit?: number;
          tag: string;
        };
        header?: never;
        path: { petID: components["parameters"]["petID"]; };
        cookie?: never;
      };
      requestBody?: never;
      responses: {
        /** @description The pet */
        200: {
          headers: { [name: string]: unknown; };
          content: { "application/json": components["schemas"]["Pet"]; };
        };
        /** @description Gone */
        204: { headers: { [name: string]: unknown; }; content?: never; };
        404: components["responses"]["404"];
      };
    };
    put?: never;
    post: {
      parameters: { query?: never; header?: never; path: { petID: string; }; cookie?: never; };
      requestBody?: { content: { "application/octet-stream": string; }; };
      responses: { 201: { headers: { [name: string]: unknown; }; content?: never; }; };
    };
  };
}
interface components {
  schemas: {
    Pet: {
      /** Format: int32 */
      age: number;
      weight?: number;
      /** @enum {string} */
      kind: "cat" | "dog";
      nickname?: string | null;
      tags: components["schemas"]["Tag"][];
      labels?: { [key: string]: string; };
      /**
       * Format: date-time
       * @description Born at
       */
      born: string;
      /** @default true */
      friendly?: boolean;
    };
    Tag: string;
  };
  responses: {
    /** @description Not found */
    404: { headers: { [name: string]: unknown; }; content: { "application/json": components["schemas"]["Tag"]; }; };
  };
  parameters: {
    /** @description The pet */
    petID: string;
  };
  requestBodies: never;
  headers: never;
  pathItems: never;
}
//#endregion
"""


def test_paths_parameters_bodies_and_responses() -> None:
    doc = openapi_from_declarations(DECLARATIONS, "src/demo/schema.gen.d.ts")
    item = doc["paths"]["/pets/{petID}"]
    assert set(item) == {"get", "post"}, "methods declared `?: never` are absent"
    get = item["get"]
    params = {(p["name"], p["in"]): p for p in get["parameters"]}
    assert params[("limit", "query")]["required"] is False
    assert params[("tag", "query")]["required"] is True
    assert params[("petID", "path")]["required"] is True
    assert params[("petID", "path")]["schema"]["type"] == "string"
    assert "requestBody" not in get
    assert get["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Pet"}
    assert "content" not in get["responses"]["204"]
    assert get["responses"]["404"] == {"$ref": "#/components/responses/404"}
    post = item["post"]
    assert post["requestBody"] == {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}


def test_schemas() -> None:
    pet = openapi_from_declarations(DECLARATIONS, "src/demo/schema.gen.d.ts")["components"]["schemas"]["Pet"]
    props = pet["properties"]
    assert pet["required"] == ["age", "kind", "tags", "born"]
    assert props["age"] == {"type": "integer", "format": "int32"}
    assert props["weight"] == {"type": "number"}
    assert props["kind"] == {"type": "string", "enum": ["cat", "dog"]}
    assert props["nickname"] == {"type": ["string", "null"]}
    assert props["tags"] == {"type": "array", "items": {"$ref": "#/components/schemas/Tag"}}
    assert props["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert props["born"] == {"type": "string", "format": "date-time"}, "descriptions are not copied"
    assert props["friendly"] == {"type": "boolean", "default": True}


def test_missing_region_is_an_error() -> None:
    with pytest.raises(ExtractionError, match="no openapi-typescript declarations"):
        openapi_from_declarations(DECLARATIONS, "src/other/schema.gen.d.ts")


def test_unsupported_type_is_an_error_not_a_guess() -> None:
    source = DECLARATIONS.replace(b"weight?: number;", b"weight?: Map<string, number>;")
    with pytest.raises(ExtractionError, match="unsupported TypeScript type"):
        openapi_from_declarations(source, "src/demo/schema.gen.d.ts")


@pytest.mark.parametrize(
    ("comment", "field", "value"),
    [
        ("/** @description One line */", "description", "One line"),
        ("/**\n * Summary here\n * @description Longer\n *     text\n */", "description", "Longer\ntext"),
        ("/**\n * Summary here\n * @description Longer\n */", "summary", "Summary here"),
        ("/** Format: uuid */", "format", "uuid"),
        ("/** @default 15 */", "default", 15),
        ("/** @default some text */", "default", "some text"),
        ("/**\n * @deprecated\n * @description Old\n */", "deprecated", True),
    ],
)
def test_jsdoc(comment: str, field: str, value: object) -> None:
    assert getattr(parse_jsdoc(comment), field) == value
