"""Image references and registry settings, as data: what ``from_image(ref)`` names and where it is pulled.

Sans-IO: nothing here touches the network or the disk, so every rule is tested on its own.

A reference is ``[registry/]repository[:tag][@sha256:digest]``, read the way the Docker
engine reads it: the first component is a registry when it holds a ``.`` or a ``:`` or is
``localhost``; otherwise the registry is ``docker.io`` and a one-component repository gets
``library/`` in front (``python:3`` is ``docker.io/library/python:3``). No tag and no digest
means ``latest``.

``RegistrySettings`` is what the operator configures: mirrors per registry (tried before the
registry itself) and the registries reached over plain HTTP. Registries on a loopback address
are always reached over plain HTTP, as the Docker engine does; every other registry needs TLS
unless the operator lists it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._commands import TemplateError

__all__ = ["DEFAULT_REGISTRY", "ImageError", "ImageReference", "RegistrySettings", "parse_mirror", "parse_reference"]

DEFAULT_REGISTRY = "docker.io"
# The grammar of docker/distribution's reference package, in the parts a reference is split into.
_HOST = re.compile(
    r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])(?:\.(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]))*"
    r"(?::[0-9]{1,5})?"
)
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_NAME = 255  # registry plus repository, as the distribution spec limits it


class ImageError(TemplateError):
    """An image could not be read, pulled or unpacked; the message is safe to show to the builder."""


@dataclass(frozen=True)
class ImageReference:
    registry: str  # host[:port]
    repository: str  # path components, library/ added for docker.io
    tag: str | None
    digest: str | None  # sha256:<hex>

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def pinned(self, digest: str) -> str:
        """The reference that pulls exactly ``digest`` from the same repository."""
        return f"{self.name}@{digest}"

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def _is_host(component: str) -> bool:
    return "." in component or ":" in component or component == "localhost" or component != component.lower()


def parse_reference(text: str) -> ImageReference:
    """``text`` read as an image reference; ``ImageError`` saying what is wrong otherwise."""
    shown = repr(text[:200])
    if not text or text != text.strip() or any(ch.isspace() for ch in text):
        raise ImageError(f"{shown} is not an image reference (no spaces; registry/repository[:tag][@digest])")
    rest, _, digest = text.partition("@")
    if digest and _DIGEST.fullmatch(digest) is None:
        raise ImageError(f"{shown}: the digest must be sha256: and 64 lower-case hex digits")
    head, slash, tail = rest.partition("/")
    if slash and _is_host(head):
        registry, path = head, tail
        if _HOST.fullmatch(registry) is None:
            raise ImageError(f"{shown}: {registry[:80]!r} is not a registry host[:port]")
    else:
        registry, path = DEFAULT_REGISTRY, rest
    tag: str | None = None
    last_slash = path.rfind("/")
    colon = path.rfind(":")
    if colon > last_slash:
        path, tag = path[:colon], path[colon + 1 :]
        if _TAG.fullmatch(tag) is None:
            raise ImageError(f"{shown}: {tag[:80]!r} is not a tag (letters, digits, '_', '.', '-'; at most 128)")
    components = path.split("/")
    if not path or any(_COMPONENT.fullmatch(part) is None for part in components):
        raise ImageError(f"{shown}: the repository must be lower-case components (a-z, 0-9, '.', '_', '-') and '/'")
    if registry == DEFAULT_REGISTRY and len(components) == 1:
        path = f"library/{path}"
    if len(registry) + 1 + len(path) > _MAX_NAME:
        raise ImageError(f"{shown}: the name is longer than {_MAX_NAME} characters")
    if tag is None and not digest:
        tag = "latest"
    return ImageReference(registry=registry, repository=path, tag=tag, digest=digest or None)


def _loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RegistrySettings:
    """Mirrors (registry → mirrors tried in order before it) and the registries reached over plain HTTP."""

    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    insecure: tuple[str, ...] = ()

    def plain_http(self, registry: str) -> bool:
        return _loopback(registry) or registry in self.insecure

    def registries_conf(self, reference: ImageReference) -> str:
        """A containers-registries.conf(5) v2 file for pulling ``reference``: its registry and mirrors.

        Written per pull, so no host-wide file is read or needed; short names never reach it
        (``parse_reference`` has already made every reference fully qualified).
        """
        lines = ["unqualified-search-registries = []", ""]
        lines += ["[[registry]]", f'location = "{reference.registry}"']
        lines.append(f"insecure = {'true' if self.plain_http(reference.registry) else 'false'}")
        for mirror in self.mirrors.get(reference.registry, ()):
            lines += ["", "[[registry.mirror]]", f'location = "{mirror}"']
            lines.append(f"insecure = {'true' if self.plain_http(mirror.split('/', 1)[0]) else 'false'}")
        return "\n".join(lines) + "\n"

    def hosts(self, reference: ImageReference) -> tuple[str, ...]:
        """Every host a pull of ``reference`` may ask: credentials are offered to each."""
        mirrors = tuple(mirror.split("/", 1)[0] for mirror in self.mirrors.get(reference.registry, ()))
        return (reference.registry, *mirrors)


def parse_mirror(text: str) -> tuple[str, str]:
    """``registry=mirror`` as the operator writes it; ``ValueError`` naming the problem otherwise."""
    registry, equals, mirror = text.partition("=")
    registry, mirror = registry.strip(), mirror.strip()
    if not equals or _HOST.fullmatch(registry) is None:
        raise ValueError(f"{text[:120]!r}: expected registry=mirror (for example docker.io=mirror.internal:5000)")
    host, _, path = mirror.partition("/")
    if _HOST.fullmatch(host) is None or (path and any(_COMPONENT.fullmatch(p) is None for p in path.split("/"))):
        raise ValueError(f"{text[:120]!r}: the mirror must be host[:port][/path]")
    return registry, mirror
