"""Reading control-plane requests: bounded JSON bodies checked against the contract, strict queries.

Bodies are validated with JSON Schema against the derived contract's component schemas (the
same document the clients were derived from), so a field of the wrong type or a missing required
field is a 400 that names the field. Messages never quote the offending value: bodies carry
environment variables, which may be secrets. Query parameters are checked by hand against a
per-route list, because the derived document keeps only their JSON types (an unknown parameter
is a 400, as upstream's generated router does).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012
from starlette.requests import Request

from ._errors import BODY_TOO_LARGE, ApiError

__all__ = ["check_query", "integer_query", "list_query", "read_json", "single", "validate"]

MAX_BODY_BYTES = 1 << 20  # control-plane bodies are small; anything bigger is a mistake or an attack
_DOCUMENT = ("derived", "control-plane.openapi.json")  # package data of ``contract``
_URI = "urn:e2b-compat:control-plane"


@cache
def _registry() -> referencing.Registry[Any]:
    document = json.loads(resources.files("contract").joinpath(*_DOCUMENT).read_text(encoding="utf-8"))
    resource: referencing.Resource[Any] = referencing.Resource.from_contents(
        document, default_specification=DRAFT202012
    )
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(_URI, resource)
    return registry


@cache
def _validator(schema_name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": f"{_URI}#/components/schemas/{schema_name}"}, registry=_registry())


def _describe(error: jsonschema.ValidationError) -> str:
    where = "/".join(str(part) for part in error.absolute_path) or "body"
    if error.validator == "type":
        expected = error.validator_value
        kinds = " or ".join(expected) if isinstance(expected, list) else str(expected)
        return f"{where}: must be of type {kinds}"
    if error.validator == "enum":
        choices = error.validator_value if isinstance(error.validator_value, list) else []
        return f"{where}: must be one of {', '.join(map(str, choices))}"
    if error.validator in ("required", "additionalProperties"):
        return f"{where}: {error.message}"  # names properties, never values
    return f"{where}: does not satisfy {error.validator}"


def validate(schema_name: str, value: object) -> None:
    """Raise a 400 naming the first problem unless ``value`` satisfies the contract's schema."""
    error = jsonschema.exceptions.best_match(_validator(schema_name).iter_errors(value))
    if error is not None:
        raise ApiError(400, f"Invalid request body: {_describe(error)}")


async def read_json(request: Request, schema_name: str | None, *, optional: bool = False) -> dict[str, Any]:
    """The body as a JSON object (``{}`` when ``optional`` and empty), at most ``MAX_BODY_BYTES``.

    Streams the body so a chunked upload (the JS client sends every body chunked) is read, and an
    oversized one is refused as soon as it passes the limit instead of after it all arrived.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, BODY_TOO_LARGE)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, BODY_TOO_LARGE)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        if optional:
            return {}
        raise ApiError(400, "Invalid JSON request: the body is empty")
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Invalid JSON request: {_json_problem(exc)}") from None
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, "Invalid JSON request: the body must be a JSON object")
    if schema_name is not None:
        validate(schema_name, value)
    return value


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return "the body is not UTF-8"


def check_query(request: Request, allowed: Collection[str]) -> None:
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        raise ApiError(400, f"Unknown query parameter: {unknown[0]}")


def integer_query(request: Request, name: str, *, default: int | None, low: int, high: int) -> int | None:
    values = request.query_params.getlist(name)
    if not values:
        return default
    if len(values) > 1:
        raise ApiError(400, f"Query parameter {name} was given more than once")
    text = values[0]
    try:
        number = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise ApiError(400, f"Query parameter {name} must be a number") from None
    if number != int(number):
        raise ApiError(400, f"Query parameter {name} must be a whole number")
    if not low <= number <= high:
        raise ApiError(400, f"Query parameter {name} must be between {low} and {high}")
    return int(number)


def list_query(request: Request, name: str) -> list[str]:
    """A list parameter, accepted both repeated (``a=1&a=2``) and comma-joined (``a=1,2``)."""
    return [part for value in request.query_params.getlist(name) for part in value.split(",") if part]


def single(values: Iterable[str], name: str) -> str | None:
    found = list(values)
    if len(found) > 1:
        raise ApiError(400, f"Query parameter {name} was given more than once")
    return found[0] if found else None
