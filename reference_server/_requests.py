"""Reading control-plane requests: bounded JSON bodies checked against the contract, strict queries.

Bodies are validated with JSON Schema against the derived contract's component schemas (the
same document the clients were derived from), so a field of the wrong type or a missing required
field is a 400 that names the field. Messages never quote the offending value: bodies carry
environment variables, which may be secrets. Query parameters are checked by hand against a
per-route list, because the derived document keeps only their JSON types (an unknown parameter
is a 400, as upstream's generated router does).

Hostile input is refused before anything looks at it (a Go server, as upstream is, refuses the
same): a body must be UTF-8 JSON without ``NaN``/``Infinity``, with every number in range (no
``1e999``, no integer longer than ``MAX_INTEGER_DIGITS``), nested at most ``MAX_DEPTH`` deep (a
deeper one would exhaust the parser's recursion), and with no string, key or value, holding a
lone surrogate (it could not be stored or answered as UTF-8) or a NUL (no C string, environment
variable or file name can carry one). Query strings must be UTF-8 too. Duplicate keys keep the
last value, as Go's decoder does. A body is at most ``MAX_BODY_BYTES`` (413) and must arrive
within ``BODY_TIMEOUT_S`` (408): the edge times request heads, not bodies.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import urllib.parse
from collections.abc import Collection, Iterable
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012
from starlette.requests import Request

from ._errors import BODY_TOO_LARGE, ApiError

__all__ = [
    "check_query",
    "check_strings",
    "integer_query",
    "list_query",
    "parse_json",
    "read_json",
    "single",
    "validate",
]

BODY_TIMEOUT_S = 30.0  # for a control-plane body of at most MAX_BODY_BYTES, on any link a client has
MAX_BODY_BYTES = 1 << 20  # control-plane bodies are small; anything bigger is a mistake or an attack
MAX_DEPTH = 32  # the deepest real body (network rules) is 5 levels
MAX_INTEGER_DIGITS = 20  # int64 has 19 digits; anything longer is out of range for every field
_INTEGER_TEXT = re.compile(rf"[+-]?[0-9]{{1,{MAX_INTEGER_DIGITS}}}")  # int() also takes "1_0" and non-ASCII digits
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
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
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, BODY_TOO_LARGE)
    chunks: list[bytes] = []
    size = 0
    try:
        # A head timely and a body never finished would hold the connection and its task forever;
        # the edge times heads only, and streams through the edge (not these) may be slow by nature.
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ApiError(413, BODY_TOO_LARGE)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"The request body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    raw = b"".join(chunks)
    if not raw.strip():
        if optional:
            return {}
        raise ApiError(400, "Invalid JSON request: the body is empty")
    value = parse_json(raw)
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, "Invalid JSON request: the body must be a JSON object")
    if schema_name is not None:
        validate(schema_name, value)
    return value


class _Unusable:
    """Stands in for a number no field can take, so that the check after parsing names its field."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _no_constant(name: str) -> object:
    return _Unusable(f"{name} is not a JSON number")


def _finite(text: str) -> object:
    number = float(text)
    return number if math.isfinite(number) else _Unusable("number out of range")


def _bounded_int(text: str) -> object:
    # Longer than any field's range; parsing it would cost quadratic time (and Python refuses 4300+ digits).
    return int(text) if len(text) <= 2 * MAX_INTEGER_DIGITS else _Unusable("number out of range")


def parse_json(raw: bytes) -> object:
    """``raw`` as JSON, or a 400 saying what is wrong with it (see the module docstring)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "Invalid JSON request: the body is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"Invalid JSON request: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ApiError(400, f"Invalid JSON request: nested deeper than {MAX_DEPTH} levels") from None
    check_strings(value)
    return value


def _where(path: list[str]) -> str:
    return "/".join(path) or "body"


def _step(key: str) -> str:
    """A path step safe to show: a key chosen by the caller (an env var name, say) only when plain."""
    return key if _SAFE_NAME.fullmatch(key) else "<key>"


def check_strings(value: object) -> None:
    """400 unless ``value`` is at most ``MAX_DEPTH`` deep, has only usable numbers, and no string in it has
    a NUL or a lone surrogate.

    Iterative, so that the check itself cannot run out of stack on what it is checking.
    """
    pending: list[tuple[object, list[str]]] = [(value, [])]
    while pending:
        item, path = pending.pop()
        if len(path) > MAX_DEPTH:
            raise ApiError(400, f"Invalid JSON request: nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, _Unusable):
            raise ApiError(400, f"Invalid request body: {_where(path)}: {item.problem}")
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, [*path, "<key>"])
                pending.append((child, [*path, _step(key)]))
        elif isinstance(item, list):
            pending.extend((child, [*path, str(index)]) for index, child in enumerate(item))


def _check_text(text: str, path: list[str]) -> None:
    if text.isascii():
        if "\0" in text:
            raise ApiError(400, f"Invalid request body: {_where(path)}: must not contain NUL characters")
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"Invalid request body: {_where(path)}: must be valid Unicode (a lone surrogate)") from None
    if "\0" in text:
        raise ApiError(400, f"Invalid request body: {_where(path)}: must not contain NUL characters")


def check_query(request: Request, allowed: Collection[str]) -> None:
    """400 for an unknown parameter, or for a query string that is not UTF-8 once percent-decoded.

    Starlette decodes a bad sequence to U+FFFD silently; a filter or cursor changed that way would
    match something other than what the caller sent.
    """
    raw = request.scope.get("query_string", b"")
    if raw:
        try:
            urllib.parse.parse_qsl(raw.decode("latin-1"), keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise ApiError(400, "Invalid query string: not UTF-8 once percent-decoded") from None
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
    if _INTEGER_TEXT.fullmatch(text) is None:  # as a Go int parser: no "1.0", "1e2", "inf", spaces
        raise ApiError(400, f"Query parameter {name} must be a whole number between {low} and {high}")
    number = int(text)
    if not low <= number <= high:
        raise ApiError(400, f"Query parameter {name} must be between {low} and {high}")
    return number


def list_query(request: Request, name: str) -> list[str]:
    """A list parameter, accepted both repeated (``a=1&a=2``) and comma-joined (``a=1,2``)."""
    return [part for value in request.query_params.getlist(name) for part in value.split(",") if part]


def single(values: Iterable[str], name: str) -> str | None:
    found = list(values)
    if len(found) > 1:
        raise ApiError(400, f"Query parameter {name} was given more than once")
    return found[0] if found else None
