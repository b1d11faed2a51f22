"""The derived OpenAPI documents are valid OpenAPI 3.1 and say what the clients rely on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openapi_spec_validator import validate

from contract import CONTRACT_DIR

DOCS = ["control-plane.openapi.json", "envd.openapi.json", "volume-content.openapi.json"]


def _doc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONTRACT_DIR / "derived" / name).read_text())
    return data


@pytest.mark.parametrize("name", DOCS)
def test_valid_openapi_with_an_id_for_every_operation(name: str) -> None:
    doc = _doc(name)
    validate(doc)
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_status_codes_the_python_client_parses() -> None:
    paths = _doc("control-plane.openapi.json")["paths"]
    assert "201" in paths["/sandboxes"]["post"]["responses"]
    assert "200" not in paths["/sandboxes"]["post"]["responses"]
    assert {"200", "201"} <= set(paths["/sandboxes/{sandboxID}/connect"]["post"]["responses"])
    assert "409" in paths["/sandboxes/{sandboxID}/pause"]["post"]["responses"]


def test_create_body_schema() -> None:
    schema = _doc("control-plane.openapi.json")["components"]["schemas"]["NewSandbox"]
    assert schema["required"] == ["templateID"]
    props = schema["properties"]
    assert props["timeout"]["type"] == "integer"
    assert props["allow_internet_access"]["type"] == "boolean"
    sandbox = _doc("control-plane.openapi.json")["components"]["schemas"]["Sandbox"]
    assert set(sandbox["required"]) >= {"sandboxID", "templateID", "clientID", "envdVersion"}


def test_list_v2_query_parameters() -> None:
    params = _doc("control-plane.openapi.json")["paths"]["/v2/sandboxes"]["get"]["parameters"]
    assert {p["name"] for p in params} == {"metadata", "state", "nextToken", "limit"}


def test_envd_files_routes() -> None:
    paths = _doc("envd.openapi.json")["paths"]
    download = paths["/files"]["get"]
    assert {p["name"] for p in download["parameters"]} == {"path", "username", "signature", "signature_expiration"}
    assert {"400", "401", "404", "500"} <= set(download["responses"])
    assert "507" in paths["/files"]["post"]["responses"]
    assert "204" in paths["/health"]["get"]["responses"]


def test_volume_content_paths_use_the_declared_parameter_names() -> None:
    paths = _doc("volume-content.openapi.json")["paths"]
    assert set(paths) == {
        "/volumecontent/{volumeID}/path",
        "/volumecontent/{volumeID}/dir",
        "/volumecontent/{volumeID}/file",
    }
    write = paths["/volumecontent/{volumeID}/file"]["put"]
    assert "application/octet-stream" in write["requestBody"]["content"]
    assert write["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/VolumeEntryStat"
    }
    names = {(p["name"], p["in"], p["required"]) for p in write["parameters"]}
    assert ("volumeID", "path", True) in names
    assert ("path", "query", True) in names
    assert ("force", "query", False) in names


def test_interpreter_messages() -> None:
    data = json.loads((CONTRACT_DIR / "derived" / "interpreter.json").read_text())
    messages = data["ndjson_message_types"]
    assert set(messages) == {"result", "stdout", "stderr", "error", "number_of_executions"}
    assert messages["stdout"]["fields"]["timestamp"]["python"] is True
    assert set(messages["error"]["fields"]) == {"name", "value", "traceback"}
    mime = {"text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data", "chart"}
    assert mime | {"is_main_result", "extra"} <= set(messages["result"]["fields"])
    execute = next(r for r in data["routes"] if r["path"] == "/execute")
    assert execute["request_json_keys"] == ["code", "context_id", "env_vars", "language"]
