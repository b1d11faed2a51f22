"""Where a request that reaches the edge goes, decided from its Host and routing headers alone.

One configured domain carries three kinds of host. The official clients glue host names
together as strings, so a configured ``name:port`` reaches us as ``<label>.name:port``:

- ``api.<domain>``: the control plane;
- ``<port>-<sandboxID>.<domain>``: one port of one sandbox, addressed by the host itself. The
  code interpreter, MCP and user ports send no routing headers, so the host is all there is;
- ``sandbox.<domain>``: one shared host for envd traffic, addressed by the ``e2b-sandbox-id``
  and ``e2b-sandbox-port`` headers the clients put on every envd request.

The decision is a pure function of strings (no I/O, no idea which sandboxes exist) so that every
rule can be tested exhaustively and the edge cannot route on anything else. A ``SandboxRoute``
only says the address is well formed; whether that sandbox exists is the caller's question.

Hosts are case-insensitive, so the Host is folded to lowercase before anything else; only ASCII
is folded (``str.lower`` would turn the Kelvin sign into ``k``), and any other character is
refused. Header values are not hosts and are compared exactly: an id in a header must already be
lowercase.

Failures raise ``RouteError(status, message)`` rather than returning a value, so a caller cannot
forward a request by forgetting to check; the edge answers ``{"code": status, "message": ...}``.
A Host that is not ours (another name, an IP address, another port) is 404 "Sandbox not found",
the upstream router's fallback; a malformed Host, sandbox label or routing header is 400.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from contract.protocol import SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER

__all__ = [
    "ControlPlane",
    "Domain",
    "Route",
    "RouteError",
    "SandboxRoute",
    "authority_matches_host",
    "parse_domain",
    "route",
]

# Lower-cased: the names are compared with lower-cased header names, and said so in messages.
ID_HEADER = SANDBOX_ID_HEADER.lower()
PORT_HEADER = SANDBOX_PORT_HEADER.lower()
MAX_NAME_LENGTH = 253  # a DNS name, without the trailing dot

SANDBOX_NOT_FOUND = "Sandbox not found"
INVALID_HOST = "Invalid host"
INVALID_PORT = "Invalid sandbox port"
INVALID_ID = "Invalid sandbox ID"
MISSING_HEADERS = f"The shared sandbox host needs both {ID_HEADER} and {PORT_HEADER} headers"

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# Explicit ranges, never \d: re's \d and int() both accept non-ASCII digits.
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_SANDBOX_ID = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?")
_DOMAIN_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# Labels of a Host are only checked for their alphabet and length here; the sandbox label has
# its own, stricter rules, and any other label only has to be compared with the domain.
_HOST_LABEL = re.compile(r"[a-z0-9-]{1,63}")

Via: TypeAlias = Literal["host", "headers"]


class RouteError(Exception):
    """The request cannot be routed; ``status`` and ``message`` are what the edge answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Domain:
    """A validated configured domain: lowercase ``name`` and the ``port`` clients add, if any."""

    name: str
    port: int | None = None


@dataclass(frozen=True)
class ControlPlane:
    """The request is for the control plane (``api.<domain>``)."""


@dataclass(frozen=True)
class SandboxRoute:
    """The request is for ``port`` of sandbox ``sandbox_id``, addressed ``via`` its host or headers."""

    sandbox_id: str
    port: int
    via: Via


Route: TypeAlias = ControlPlane | SandboxRoute


def _port(text: str) -> int | None:
    """1..65535 written without a sign, spaces or leading zeros; None otherwise."""
    if _PORT.fullmatch(text) is None:
        return None
    port = int(text)
    return port if port <= 65535 else None


def parse_domain(configured: str) -> Domain:
    """Validate the configured domain (``name`` or ``name:port``); ValueError says what is wrong.

    The name is lowercase DNS labels (letters, digits, inner hyphens; 1..63 characters each), at
    most 253 characters, with no trailing dot. Its last label may not be all digits, so that an
    IPv4 address can never be taken for the domain, or end with it.
    """
    if not configured.isascii():
        raise ValueError(f"domain {configured!r} has non-ASCII characters (write IDNs in their xn-- form)")
    name, colon, port_text = configured.partition(":")
    port = None
    if colon:
        port = _port(port_text)
        if port is None:
            raise ValueError(f"domain {configured!r}: the port must be 1..65535 without leading zeros")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"domain {configured!r} is longer than {MAX_NAME_LENGTH} characters")
    if name.endswith("."):
        raise ValueError(f"domain {configured!r} must not end with a dot")
    labels = name.split(".")
    for label in labels:
        if _DOMAIN_LABEL.fullmatch(label) is None:
            raise ValueError(
                f"domain {configured!r}: {label!r} is not a lowercase DNS label (1..63 of a-z, 0-9 and inner hyphens)"
            )
    if labels[-1].isdigit():
        raise ValueError(f"domain {configured!r}: the last label is all digits, which is an IP address")
    return Domain(name, port)


def route(host: str, domain: Domain, headers: Sequence[tuple[str, str]] = ()) -> Route:
    """Where a request with this Host header value and these headers goes; raises ``RouteError``.

    ``headers`` are (name, value) pairs as received (ASGI's bytes decoded as latin-1); names are
    matched case-insensitively. Routing headers count only on sandbox hosts: the control plane
    ignores them, and a host that is not ours stays 404 whatever they say.
    """
    name = _host_name(host, domain)
    if name == f"api.{domain.name}":
        return ControlPlane()
    if name == f"sandbox.{domain.name}":
        return _shared_host_route(headers)
    suffix = f".{domain.name}"
    label = name.removesuffix(suffix)
    # Exactly one label directly under the domain, and one that looks like "<port>-<id>": a
    # deeper name or a plain label (www.<domain>) is simply not a host we serve.
    if label == name or "." in label or "-" not in label:
        raise RouteError(404, SANDBOX_NOT_FOUND)
    port_text, _, sandbox_id = label.partition("-")
    port = _port(port_text)
    if port is None:
        raise RouteError(400, INVALID_PORT)
    if _SANDBOX_ID.fullmatch(sandbox_id) is None:
        raise RouteError(400, INVALID_ID)
    header_id, header_port = _routing_headers(headers)
    if header_id is not None and header_id != sandbox_id:
        raise RouteError(400, f"The {ID_HEADER} header does not match the host")
    if header_port is not None and _port(header_port) != port:
        raise RouteError(400, f"The {PORT_HEADER} header does not match the host")
    return SandboxRoute(sandbox_id, port, "host")


def authority_matches_host(authority: str, host: str) -> bool:
    """Whether HTTP/2's ``:authority`` and the Host header name the same thing.

    Compared as hosts are: ASCII case-insensitively, and otherwise exactly. A port written in one
    and not the other is a mismatch (the scheme's default port is not assumed), and so is an
    empty value, which no http(s) request may carry.
    """
    if not authority or not host:
        return False
    return authority.translate(_ASCII_LOWER) == host.translate(_ASCII_LOWER)


def _host_name(host: str, domain: Domain) -> str:
    """The lowercase name of a Host header value, once its port (if any) has been checked."""
    if not host.isascii():
        raise RouteError(400, INVALID_HOST)
    lowered = host.translate(_ASCII_LOWER)
    if lowered.startswith("["):
        raise RouteError(404, SANDBOX_NOT_FOUND)  # an IPv6 literal is never one of our names
    name, colon, port_text = lowered.partition(":")
    if len(name) > MAX_NAME_LENGTH or any(_HOST_LABEL.fullmatch(label) is None for label in name.split(".")):
        raise RouteError(400, INVALID_HOST)
    if colon:
        port = _port(port_text)
        if port is None:
            raise RouteError(400, INVALID_HOST)
        if port != domain.port:
            raise RouteError(404, SANDBOX_NOT_FOUND)
    return name


def _routing_headers(headers: Sequence[tuple[str, str]]) -> tuple[str | None, str | None]:
    """The values of the two routing headers, None where absent; either one twice is a 400."""
    found: dict[str, str] = {}
    for raw_name, value in headers:
        name = raw_name.translate(_ASCII_LOWER)
        if name in (ID_HEADER, PORT_HEADER):
            if name in found:
                raise RouteError(400, f"Duplicate {name} header")
            found[name] = value
    return found.get(ID_HEADER), found.get(PORT_HEADER)


def _shared_host_route(headers: Sequence[tuple[str, str]]) -> SandboxRoute:
    sandbox_id, port_text = _routing_headers(headers)
    if sandbox_id is None or port_text is None:
        raise RouteError(400, MISSING_HEADERS)
    port = _port(port_text)
    if port is None:
        raise RouteError(400, INVALID_PORT)
    if _SANDBOX_ID.fullmatch(sandbox_id) is None:
        raise RouteError(400, INVALID_ID)
    return SandboxRoute(sandbox_id, port, "headers")
