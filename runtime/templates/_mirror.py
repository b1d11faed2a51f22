"""The Debian mirror for debootstrap: the one this machine's apt already uses.

No mirror is named in the code. The machine's apt configuration already says where
packages come from (a local mirror, a proxy, a snapshot), so debootstrap is pointed at
the first http(s) source apt has for the suite and component, read at run time in the
order apt reads them: ``sources.list``, then the files of ``sources.list.d`` in name
order, in both the one-line (``*.list``) and the deb822 (``*.sources``) formats.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._commands import TemplateError

__all__ = ["AptSource", "Mirror", "find_debian_mirror", "parse_deb822", "parse_one_line", "read_sources"]

APT_DIR = Path("/etc/apt")
_OPTIONS = re.compile(r"^\[([^\]]*)\]\s*")


@dataclass(frozen=True)
class AptSource:
    """One source entry, in either format, reduced to what choosing a mirror needs."""

    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    enabled: bool
    signed_by: str
    origin: Path


@dataclass(frozen=True)
class Mirror:
    """Where debootstrap downloads from, and the keyring apt verifies that source with (if a file)."""

    uri: str
    keyring: Path | None
    origin: Path


def parse_one_line(text: str, origin: Path) -> list[AptSource]:
    """``deb [opt=value …] uri suite [component …]`` lines; ``#`` starts a comment."""
    sources: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        options: dict[str, str] = {}
        match = _OPTIONS.match(rest.strip())
        if match:
            for option in match[1].split():
                name, _, value = option.partition("=")
                options[name.lower()] = value
            rest = rest.strip()[match.end() :]
        words = rest.split()
        if len(words) < 2:
            continue  # not a source line apt would accept either
        sources.append(
            AptSource(
                types=(kind,),
                uris=(words[0],),
                suites=(words[1],),
                components=tuple(words[2:]),
                enabled=True,
                signed_by=options.get("signed-by", ""),
                origin=origin,
            )
        )
    return sources


def _stanzas(text: str) -> Iterator[dict[str, str]]:
    fields: dict[str, str] = {}
    name = ""
    for raw in [*text.splitlines(), ""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                yield fields
            fields, name = {}, ""
        elif raw[0].isspace() and name:
            fields[name] += "\n" + raw.strip()  # continuation of a multi-line field
        elif ":" in raw:
            key, _, value = raw.partition(":")
            name = key.strip().lower()
            fields[name] = value.strip()


def parse_deb822(text: str, origin: Path) -> list[AptSource]:
    """Stanzas of ``Types:``, ``URIs:``, ``Suites:``, ``Components:`` (and ``Enabled:``, ``Signed-By:``)."""
    return [
        AptSource(
            types=tuple(fields.get("types", "").split()),
            uris=tuple(fields.get("uris", "").split()),
            suites=tuple(fields.get("suites", "").split()),
            components=tuple(fields.get("components", "").split()),
            enabled=fields.get("enabled", "yes").strip().lower() not in ("no", "false", "0"),
            signed_by=fields.get("signed-by", ""),
            origin=origin,
        )
        for fields in _stanzas(text)
    ]


def read_sources(apt_dir: Path = APT_DIR) -> list[AptSource]:
    """Every source entry of ``apt_dir``, in the order apt reads them."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    sources: list[AptSource] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        sources += parse_deb822(text, path) if path.suffix == ".sources" else parse_one_line(text, path)
    return sources


def _keyring(signed_by: str) -> Path | None:
    # Signed-By may also be fingerprints or an inline key; only a key file can be handed on.
    value = signed_by.strip()
    if value.startswith("/") and "\n" not in value and " " not in value and Path(value).is_file():
        return Path(value)
    return None


def find_debian_mirror(suite: str, component: str = "main", apt_dir: Path = APT_DIR) -> Mirror:
    """The first enabled http(s) ``deb`` source of apt that serves ``suite`` with ``component``."""
    sources = read_sources(apt_dir)
    for source in sources:
        if not source.enabled or "deb" not in source.types:
            continue
        if suite not in source.suites or component not in source.components:
            continue
        for uri in source.uris:
            if uri.startswith(("http://", "https://")):
                return Mirror(uri=uri.rstrip("/"), keyring=_keyring(source.signed_by), origin=source.origin)
    read = sorted({str(s.origin) for s in sources}) or [f"nothing under {apt_dir}"]
    raise TemplateError(
        f"apt has no enabled http(s) 'deb' source for {suite} {component} (read: {', '.join(read)}); "
        f"debootstrap uses the mirror apt is configured with, so add one there"
    )
