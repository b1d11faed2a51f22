"""What every control-plane resource module shares: the caller, the endpoint table, query helpers.

A resource module (``sandboxes``, ``snapshots``, ``templates``, ``volumes``) is a set of plain
module-level handlers ``async def name(request, caller) -> Response`` and one table ``ENDPOINTS``
naming the method and path of each. A handler parses the request, calls one method of the
service, and shapes the answer with ``_views``; it never decides and never touches the store or a
backend. ``caller`` is the authenticated owner with the service, so a test can call a handler
directly with a request and a ``Caller`` of its own.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from reference_server._errors import ApiError
from reference_server._requests import integer_query, single
from reference_server._sandboxes import SandboxService
from reference_server._template_service import TemplateService

__all__ = [
    "Caller",
    "Endpoint",
    "Handler",
    "bool_field",
    "metadata_filter",
    "newer_bool_field",
    "no_content",
    "ranges",
    "rfc3339_query",
    "unix_ms_query",
    "unix_query",
]


@dataclass(frozen=True)
class Caller:
    """The owner an API key belongs to, and the services that act for them."""

    owner: str
    service: SandboxService
    templates: TemplateService | None = None  # template builds; None where a plane has none

    @property
    def domain(self) -> str:
        return self.service.settings.domain


Handler = Callable[[Request, Caller], Awaitable[Response]]


@dataclass(frozen=True)
class Endpoint:
    """One row of a resource's route table: ``method path → handler`` (all need an API key)."""

    method: str
    path: str
    handler: Handler


def no_content() -> Response:
    return Response(status_code=204)


def bool_field(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    return default if value is None else bool(value)


def newer_bool_field(body: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean the pinned schema does not declare (the newer clients send it), so not yet type-checked."""
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"Invalid request body: {name}: must be of type boolean")
    return value


def strings(value: object) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else ()


MAX_RANGES = 1024  # per list: each entry becomes a packet-filter rule of the sandbox
# Dotted-quad address, optionally "/<prefix length 0-32>" (CIDR notation has only a prefix length).
# Python's ip_network would also take a netmask ("/255.0.0.0") or a host mask ("/0.255.255.255");
# a Go server (upstream is one) parsing with net.ParseCIDR refuses both.
_RANGE = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?:/(?:[0-9]|[12][0-9]|3[0-2]))?")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:/[0-9]{1,3})?")


def ranges(value: object, field: str) -> tuple[str, ...]:
    """``allowOut``/``denyOut``: IPv4 addresses or CIDR ranges (the sandboxes' networks are IPv4).

    Upstream also takes domain names in ``allowOut``; this server's egress rules are address
    based, so a name is refused with a 400 that says so rather than silently not applied. A range
    with host bits set (``10.0.0.1/8``) is taken as its network, as Go's ParseCIDR does.
    """
    found = strings(value)
    if len(found) > MAX_RANGES:
        raise ApiError(400, f"Invalid request body: {field}: at most {MAX_RANGES} entries")
    for entry in found:
        if _IPV6.fullmatch(entry):
            raise ApiError(400, f"Invalid request body: {field}: sandboxes have IPv4 networking only")
        try:
            if _RANGE.fullmatch(entry) is None:
                raise ValueError(entry)
            ipaddress.IPv4Network(entry, strict=False)
        except ValueError:
            raise ApiError(
                400,
                f"Invalid request body: {field}: entries must be IPv4 addresses or CIDR ranges "
                "(address/prefix length 0-32)",
            ) from None
    return found


def metadata_filter(raw: str | None) -> dict[str, str]:
    """The clients send ``urlencode({quote(k): quote(v)})`` as one parameter: undo both layers."""
    if raw is None:
        return {}
    try:
        pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=True, errors="strict")
    except UnicodeDecodeError:
        raise ApiError(400, "Invalid metadata filter: not UTF-8 once percent-decoded") from None
    except ValueError:
        raise ApiError(400, "Invalid metadata filter: expected key=value pairs joined by &") from None
    try:
        return {
            urllib.parse.unquote(key, errors="strict"): urllib.parse.unquote(value, errors="strict")
            for key, value in pairs
        }
    except UnicodeDecodeError:
        raise ApiError(400, "Invalid metadata filter: not UTF-8 once percent-decoded") from None


def unix_query(request: Request, name: str) -> datetime | None:
    """A time in whole seconds since the epoch."""
    seconds = integer_query(request, name, default=None, low=0, high=2**40)
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def rfc3339_query(request: Request, name: str) -> datetime | None:
    """A time as RFC 3339 text with its offset (``2026-12-04T18:00:00Z``, ``...+01:00``)."""
    text = single(request.query_params.getlist(name), name)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None or "T" not in text.upper():
        raise ApiError(
            400, f"Query parameter {name} must be an RFC 3339 time with an offset, e.g. 2026-01-02T03:04:05Z"
        )
    return moment.astimezone(UTC)


def unix_ms_query(request: Request, name: str) -> int | None:
    """A time in milliseconds since the epoch."""
    return integer_query(request, name, default=None, low=0, high=2**53)
