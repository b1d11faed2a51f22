"""The reference server's configuration: one frozen ``ServerConfig`` with defaults that work as they are.

Values come, lowest precedence first, from the defaults here, a TOML file, and environment
variables ``E2B_COMPAT_SERVER_<KEY>`` (docs/SERVER.md has the table). The file is ``--config PATH``,
else ``$E2B_COMPAT_SERVER_CONFIG``, else ``<data_dir>/server.toml`` when it exists (``data_dir`` as
known before the file is read: its variable or its default).

Mistakes are refused, never guessed at: an unknown key in the file, an unknown
``E2B_COMPAT_SERVER_*`` variable, a wrong type or an out-of-range value is a ``ConfigError`` whose
message names the key and where the value came from. A typo silently ignored would run a server
configured differently from what its operator believes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.backends import serving_backends
from runtime.templates import RegistrySettings, parse_mirror

from ._keys import validate_owner
from ._routing import parse_domain

__all__ = [
    "BACKENDS",
    "CONFIG_FILE_NAME",
    "CONFIG_VARIABLE",
    "ENV_PREFIX",
    "EVENT_LOOPS",
    "LOG_LEVELS",
    "ConfigError",
    "ServerConfig",
    "default_data_dir",
    "load_config",
    "render_toml",
]

ENV_PREFIX = "E2B_COMPAT_SERVER_"
CONFIG_VARIABLE = ENV_PREFIX + "CONFIG"
CONFIG_FILE_NAME = "server.toml"
# Sandbox backends the serve command can build: the runtime's table (``runtime.backends``). A new
# backend is a line there; nothing in the configuration changes.
BACKENDS: tuple[str, ...] = serving_backends()
LOG_LEVELS: tuple[str, ...] = ("critical", "error", "warning", "info", "debug")
# The server's own event loop (``_server.loop_factory``); the agents always run asyncio's.
EVENT_LOOPS: tuple[str, ...] = ("uvloop", "asyncio")
# The default leaves out the templates a server does not serve; a pool given explicitly must not name one.
DEFAULT_WARM_POOL = ("base=2", "code-interpreter-v1=1")
UPSTREAM_MAX_TIMEOUT_SECONDS = 86_400  # E2B caps a sandbox's timeout at 24 h
_LONGEST_TIMEOUT_SECONDS = 30 * 86_400
_TEMPLATE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key and its source."""


def default_data_dir(environ: Mapping[str, str], *, euid: int | None = None) -> Path:
    """``/var/lib/e2b-compat`` for root, else ``$XDG_DATA_HOME/e2b-compat`` or ``~/.local/share/e2b-compat``."""
    if (os.geteuid() if euid is None else euid) == 0:
        return Path("/var/lib/e2b-compat")
    xdg = environ.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():  # the XDG spec says a relative value is to be ignored
        return Path(xdg) / "e2b-compat"
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "share" / "e2b-compat"


def _setting(default: Any, doc: str) -> Any:
    """A field with its one-line description: the single source for ``render_toml`` and the docs test."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Everything the serve command is told. Every field is checked on construction (``ConfigError``)."""

    data_dir: Path = field(
        default_factory=lambda: default_data_dir(os.environ),
        metadata={"doc": "State: the store (server.db), certificates, the first-start key, sandboxes."},
    )
    domain: str = _setting(
        "e2b.localhost", "Clients reach api.<domain> and <port>-<sandboxID>.<domain>; two labels or more."
    )
    port: int = _setting(8443, "The TLS edge's port; clients use E2B_DOMAIN=<domain>:<port>.")
    hosts: tuple[str, ...] = _setting(("127.0.0.1", "::1"), "IP addresses the edge listens on.")
    backend: str = _setting("crun", f"Sandbox backend: {', '.join(BACKENDS)}.")
    default_template: str = _setting("base", "Template of a create request that names none.")
    templates: tuple[str, ...] = _setting(
        ("base", "code-interpreter-v1", "mcp-gateway"), "Templates built (or found in the cache) at start and served."
    )
    owner: str = _setting("default", "Owner of the API key made on first start.")
    cpu_count: int = _setting(2, "vCPUs of a sandbox.")
    memory_mb: int = _setting(512, "Memory of a sandbox, MiB (at least its template's own size, if it has one).")
    disk_mb: int = _setting(2048, "Disk of a sandbox, MiB: a full disk is ENOSPC inside it (507 on upload).")
    volume_mb: int = _setting(1024, "Size of a new volume, MiB: a full volume is ENOSPC in sandboxes, 507 on upload.")
    max_timeout_seconds: int = _setting(
        UPSTREAM_MAX_TIMEOUT_SECONDS, "Longest sandbox timeout a request may ask for (E2B caps it at 24 h)."
    )
    reaper_interval_seconds: float = _setting(1.0, "How often expired sandboxes are looked for, seconds.")
    metrics_interval_seconds: float = _setting(5.0, "How often sandbox metrics are sampled, seconds.")
    egress_enabled: bool = _setting(
        False,
        "false: no sandbox reaches the internet; requests asking for it are accepted and get none. "
        "true: each sandbox's own setting decides.",
    )
    registry_mirrors: tuple[str, ...] = _setting(
        (), "Image registry mirrors, registry=mirror each (tried in order before the registry itself)."
    )
    insecure_registries: tuple[str, ...] = _setting(
        (), "Registries (host[:port]) pulled from over plain HTTP; loopback registries always are."
    )
    max_parallel_builds: int = _setting(2, "Template builds running at once; more wait in a queue.")
    warm_pool: tuple[str, ...] = _setting(
        DEFAULT_WARM_POOL,
        "Started sandboxes kept ready for creates, template=count each (served templates only).",
    )
    warm_pool_memory_mb: int = _setting(
        4096, "The most the warm sandboxes' memory limits may add up to, MiB; 0 keeps none."
    )
    share_agent_memory: bool = _setting(
        True,
        "true: the agents' identical start-up memory is kept once by the host's same-page merging "
        "(ksmd, switched on; crun only). false: each sandbox's agent keeps its own.",
    )
    boot_images: bool = _setting(
        True,
        "true: a sandbox's first start restores a checkpoint of its template's agent, booted once, "
        "where the backend can (crun with the checkpoint tools; plain agents without volumes). "
        "false: every sandbox boots its agent.",
    )
    log_level: str = _setting("info", f"One of {', '.join(LOG_LEVELS)}.")
    event_loop: str = _setting(
        "uvloop",
        "The server's event loop: uvloop (libuv; the edge's TLS and the relay cost less per request) or asyncio.",
    )
    request_head_timeout_seconds: float = _setting(
        10.0, "A client connection is dropped if its TLS handshake and request head take longer, seconds."
    )
    max_connections: int = _setting(
        0, "Open client connections at most; more are closed at once. 0: derived from the open-file limit."
    )
    max_websockets: int = _setting(2048, "Open WebSockets to sandboxes at most; more are refused with 503.")
    sandbox_max_requests: int = _setting(
        256, "Concurrent proxied HTTP requests to one sandbox at most; more are refused with 429."
    )
    sandbox_max_websockets: int = _setting(128, "Open WebSockets to one sandbox at most; more are refused with 429.")
    owner_max_running: int = _setting(
        100, "Sandboxes one owner may have running (paused ones do not count); more are refused with 429."
    )
    owner_create_rate: float = _setting(5.0, "Creates per second one owner may make on average; more get 429.")
    owner_create_burst: int = _setting(100, "Creates one owner may make at once before the rate applies.")
    max_sandboxes: int = _setting(1000, "Sandboxes of all owners, running and paused, at most; more get 429.")
    memory_overcommit: float = _setting(
        4.0, "Running sandboxes' memory together stays within the host's MemTotal times this; more get 429."
    )

    def registry_settings(self) -> RegistrySettings:
        mirrors: dict[str, tuple[str, ...]] = {}
        for entry in self.registry_mirrors:
            registry, mirror = parse_mirror(entry)
            mirrors[registry] = (*mirrors.get(registry, ()), mirror)
        return RegistrySettings(mirrors=mirrors, insecure=self.insecure_registries)

    def warm_pool_sizes(self) -> dict[str, int]:
        """``warm_pool`` as template → count."""
        return dict(_warm_entry(entry) for entry in self.warm_pool)

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            try:
                value = _CHECKS[item.name](getattr(self, item.name))
            except ValueError as exc:
                raise ConfigError(f"{item.name}: {exc}") from None
            object.__setattr__(self, item.name, value)
        served = {self.default_template, *self.templates}
        if self.warm_pool == DEFAULT_WARM_POOL:
            kept = tuple(entry for entry in DEFAULT_WARM_POOL if _warm_entry(entry)[0] in served)
            object.__setattr__(self, "warm_pool", kept)
        for name in self.warm_pool_sizes():
            if name not in served:  # a build's or snapshot's layer is an owner's, never pooled
                raise ConfigError(
                    f"warm_pool: {name!r} is not one of the served templates ({', '.join(sorted(served))})"
                )


# -- checks: a value of the field's type → the normalised value, or ValueError ----------------


def _check_type(value: object, kind: type | tuple[type, ...]) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python but never a number in a configuration file.
    if isinstance(value, bool) and bool not in kinds:
        raise ValueError(f"expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kinds):
        raise ValueError(f"expected {_kind_name(kind)}, got {type(value).__name__} {value!r}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", Path: "a path"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _int_in(low: int, high: int) -> Callable[[object], int]:
    def check(value: object) -> int:
        _check_type(value, int)
        assert isinstance(value, int)
        if not low <= value <= high:
            raise ValueError(f"must be {low}..{high}, got {value}")
        return value

    return check


def _seconds_in(low: float, high: float) -> Callable[[object], float]:
    def check(value: object) -> float:
        _check_type(value, (int, float))
        assert isinstance(value, int | float)
        number = float(value)
        if not math.isfinite(number) or not low <= number <= high:
            raise ValueError(f"must be {low:g}..{high:g} seconds, got {value}")
        return number

    return check


def _number_in(low: float, high: float) -> Callable[[object], float]:
    def check(value: object) -> float:
        _check_type(value, (int, float))
        assert isinstance(value, int | float)
        number = float(value)
        if not math.isfinite(number) or not low <= number <= high:
            raise ValueError(f"must be {low:g}..{high:g}, got {value}")
        return number

    return check


def _check_data_dir(value: object) -> Path:
    _check_type(value, (Path, str))
    assert isinstance(value, Path | str)
    if not str(value):
        raise ValueError("must not be empty")
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ValueError(f"must be an absolute path (state must not depend on the working folder), got {str(value)!r}")
    return path


def _check_domain(value: object) -> str:
    _check_type(value, str)
    assert isinstance(value, str)
    domain = parse_domain(value)  # ValueError says what is wrong
    if domain.port is not None:
        raise ValueError(f"{value!r} includes a port: give the name only and set the port with `port`")
    if "." not in domain.name:
        raise ValueError(
            f"{value!r} is a single label: both official clients reject a wildcard certificate directly under "
            f"a single label (*.{domain.name}), and sandboxes need one; use two labels such as e2b.{domain.name}"
        )
    return domain.name


def _check_hosts(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise ValueError(f"expected a list of IP addresses, got {type(value).__name__} {value!r}")
    if not value:
        raise ValueError("needs at least one address to listen on")
    addresses: list[str] = []
    for host in value:
        _check_type(host, str)
        try:
            address = str(ipaddress.ip_address(host))
        except ValueError:
            raise ValueError(f"{host!r} is not an IP address (the edge listens on addresses, not names)") from None
        if address in addresses:
            raise ValueError(f"{host!r} is listed twice")
        addresses.append(address)
    return tuple(addresses)


def _one_of(choices: tuple[str, ...], *, fold: bool = False) -> Callable[[object], str]:
    def check(value: object) -> str:
        _check_type(value, str)
        assert isinstance(value, str)
        text = value.lower() if fold else value
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
        return text

    return check


def _check_template(value: object) -> str:
    _check_type(value, str)
    assert isinstance(value, str)
    if _TEMPLATE.fullmatch(value) is None:
        raise ValueError(f"{value!r} is not a template name (1-128 of letters, digits, '.', '_', '-')")
    return value


def _check_templates(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise ValueError(f"expected a list of template names, got {type(value).__name__} {value!r}")
    names: list[str] = []
    for name in value:
        checked = _check_template(name)
        if checked in names:
            raise ValueError(f"{name!r} is listed twice")
        names.append(checked)
    return tuple(names)


def _check_mirrors(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise ValueError(f"expected a list of registry=mirror entries, got {type(value).__name__} {value!r}")
    for entry in value:
        _check_type(entry, str)
        parse_mirror(entry)  # ValueError says what is wrong
    return tuple(value)


def _check_registries(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise ValueError(f"expected a list of registry hosts, got {type(value).__name__} {value!r}")
    for entry in value:
        _check_type(entry, str)
        parse_mirror(f"{entry}={entry}")  # the same host[:port] rule
    return tuple(value)


def _warm_entry(entry: str) -> tuple[str, int]:
    name, equals, count = entry.partition("=")
    if not equals or _INTEGER.fullmatch(count.strip()) is None:
        raise ValueError(f"expected template=count, got {entry!r}")
    return _check_template(name.strip()), int(count)


def _check_warm_pool(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise ValueError(f"expected a list of template=count entries, got {type(value).__name__} {value!r}")
    entries: dict[str, str] = {}
    for entry in value:
        _check_type(entry, str)
        name, count = _warm_entry(entry)
        if not 0 <= count <= 64:
            raise ValueError(f"{entry!r}: the count must be 0..64")
        if name in entries:
            raise ValueError(f"{name!r} is listed twice")
        entries[name] = f"{name}={count}"
    return tuple(entries.values())


def _check_owner(value: object) -> str:
    _check_type(value, str)
    assert isinstance(value, str)
    return validate_owner(value)


def _check_bool(value: object) -> bool:
    _check_type(value, bool)
    assert isinstance(value, bool)
    return value


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "data_dir": _check_data_dir,
    "domain": _check_domain,
    "port": _int_in(1, 65535),
    "hosts": _check_hosts,
    "backend": _one_of(BACKENDS),
    "default_template": _check_template,
    "templates": _check_templates,
    "owner": _check_owner,
    "cpu_count": _int_in(1, 1024),
    "memory_mb": _int_in(64, 4 * 1024 * 1024),
    "disk_mb": _int_in(16, 16 * 1024 * 1024),  # runtime._disk.MIN_MB: ext4's own structures need a few MiB
    "volume_mb": _int_in(16, 16 * 1024 * 1024),
    "max_timeout_seconds": _int_in(1, _LONGEST_TIMEOUT_SECONDS),
    "reaper_interval_seconds": _seconds_in(0.01, 3600),
    "metrics_interval_seconds": _seconds_in(0.1, 3600),
    "egress_enabled": _check_bool,
    "registry_mirrors": _check_mirrors,
    "insecure_registries": _check_registries,
    "max_parallel_builds": _int_in(1, 64),
    "warm_pool": _check_warm_pool,
    "warm_pool_memory_mb": _int_in(0, 4 * 1024 * 1024),
    "share_agent_memory": _check_bool,
    "boot_images": _check_bool,
    "log_level": _one_of(LOG_LEVELS, fold=True),
    "event_loop": _one_of(EVENT_LOOPS),
    "request_head_timeout_seconds": _seconds_in(0.1, 600),
    "max_connections": _int_in(0, 1_000_000),
    "max_websockets": _int_in(1, 1_000_000),
    "sandbox_max_requests": _int_in(1, 1_000_000),
    "sandbox_max_websockets": _int_in(1, 1_000_000),
    "owner_max_running": _int_in(1, 1_000_000),
    "owner_create_rate": _number_in(0.001, 1_000_000),
    "owner_create_burst": _int_in(1, 1_000_000),
    "max_sandboxes": _int_in(1, 1_000_000),
    "memory_overcommit": _number_in(0.01, 1000),
}
_FIELD_TYPES: dict[str, str] = {
    "data_dir": "path",
    "domain": "str",
    "port": "int",
    "hosts": "list",
    "backend": "str",
    "default_template": "str",
    "templates": "list",
    "owner": "str",
    "cpu_count": "int",
    "memory_mb": "int",
    "disk_mb": "int",
    "volume_mb": "int",
    "max_timeout_seconds": "int",
    "reaper_interval_seconds": "float",
    "metrics_interval_seconds": "float",
    "egress_enabled": "bool",
    "registry_mirrors": "list",
    "insecure_registries": "list",
    "max_parallel_builds": "int",
    "warm_pool": "list",
    "warm_pool_memory_mb": "int",
    "share_agent_memory": "bool",
    "boot_images": "bool",
    "log_level": "str",
    "event_loop": "str",
    "request_head_timeout_seconds": "float",
    "max_connections": "int",
    "max_websockets": "int",
    "sandbox_max_requests": "int",
    "sandbox_max_websockets": "int",
    "owner_max_running": "int",
    "owner_create_rate": "float",
    "owner_create_burst": "int",
    "max_sandboxes": "int",
    "memory_overcommit": "float",
}
FIELDS: tuple[str, ...] = tuple(item.name for item in dataclasses.fields(ServerConfig))


def env_variable(key: str) -> str:
    return ENV_PREFIX + key.upper()


# -- loading ------------------------------------------------------------------------------------


def load_config(path: Path | None, environ: Mapping[str, str]) -> ServerConfig:
    """Defaults, then the TOML file (see the module docstring for which), then ``E2B_COMPAT_SERVER_*``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    from_env = _from_environment(environ)
    file = _config_file(path, environ, from_env)
    if file is not None:
        from_file = _from_file(file)
        values.update(from_file)
        sources.update(dict.fromkeys(from_file, str(file)))
    values.update(from_env)
    sources.update({key: f"environment variable {env_variable(key)}" for key in from_env})
    for key, value in values.items():
        try:
            values[key] = _CHECKS[key](value)
        except ValueError as exc:
            raise ConfigError(f"{sources[key]}: {key}: {exc}") from None
    values.setdefault("data_dir", default_data_dir(environ))
    return ServerConfig(**values)


def _config_file(path: Path | None, environ: Mapping[str, str], from_env: Mapping[str, Any]) -> Path | None:
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file")
        return path
    named = environ.get(CONFIG_VARIABLE)
    if named is not None:
        if not named or not Path(named).is_file():
            raise ConfigError(f"environment variable {CONFIG_VARIABLE}: {named!r} is not a file")
        return Path(named)
    if "data_dir" in from_env:
        try:
            data_dir = _check_data_dir(from_env["data_dir"])
        except ValueError as exc:
            raise ConfigError(f"environment variable {env_variable('data_dir')}: data_dir: {exc}") from None
    else:
        data_dir = default_data_dir(environ)
    default = data_dir / CONFIG_FILE_NAME
    return default if default.is_file() else None


def _from_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = [key for key in document if key not in _CHECKS]
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown key (known: {', '.join(FIELDS)})")
    if "data_dir" in document and not isinstance(document["data_dir"], str):
        raise ConfigError(f"{path}: data_dir: expected a string, got {type(document['data_dir']).__name__}")
    return dict(document)


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for variable, text in environ.items():
        if not variable.startswith(ENV_PREFIX) or variable == CONFIG_VARIABLE:
            continue
        key = variable[len(ENV_PREFIX) :].lower()
        if key not in _CHECKS or variable != env_variable(key):
            raise ConfigError(f"environment variable {variable}: not a server setting (known: {_known_variables()})")
        try:
            values[key] = _parse_text(_FIELD_TYPES[key], text)
        except ValueError as exc:
            raise ConfigError(f"environment variable {variable}: {key}: {exc}") from None
    return values


def _known_variables() -> str:
    return ", ".join([CONFIG_VARIABLE, *(env_variable(key) for key in FIELDS)])


def _parse_text(kind: str, text: str) -> object:
    """A variable's text as the field's type; the field's own check then validates the value."""
    stripped = text.strip()
    if not stripped and kind != "str":
        raise ValueError("is empty")
    if kind == "int":
        if _INTEGER.fullmatch(stripped) is None:  # int() would also take '1_000' and non-ASCII digits
            raise ValueError(f"expected an integer, got {text!r}")
        return int(stripped)
    if kind == "float":
        if _FLOAT.fullmatch(stripped) is None:  # float() would also take 'nan' and 'inf'
            raise ValueError(f"expected a number, got {text!r}")
        return float(stripped)
    if kind == "bool":
        folded = stripped.lower()
        if folded in _TRUE:
            return True
        if folded in _FALSE:
            return False
        raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}, got {text!r}")
    if kind == "list":
        return [part.strip() for part in stripped.split(",")]
    return text  # str and path: exactly as given


# -- rendering ----------------------------------------------------------------------------------


def render_toml(config: ServerConfig) -> str:
    """The full effective configuration as a TOML document that ``load_config`` reads back unchanged."""
    lines = [
        "# e2b-compat reference server: effective configuration (docs/SERVER.md explains every key).",
        "# Precedence, lowest first: defaults, this file, E2B_COMPAT_SERVER_<KEY> variables.",
    ]
    for item in dataclasses.fields(config):
        lines += ["", f"# {item.metadata['doc']}", f"{item.name} = {_toml_value(getattr(config, item.name))}"]
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04x}")  # TOML forbids raw control characters in strings
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'
