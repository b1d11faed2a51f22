"""The sandbox record as typed data: its states, its lifecycle table, its settings and their defaults.

Everything the server keeps about one sandbox is a ``SandboxRecord``. The fields the store
searches by (owner, state, expiry, generation, creation order) are top-level; everything else is
``SandboxDetails``, a typed structure with one default per setting (``Defaults``), stored under
the record's ``"data"`` key in the JSON the store keeps. The JSON layout is the one the store has
always written, so a database written before these types existed reads back unchanged.

Server states are ``SandboxState`` (a ``StrEnum``: each member *is* its JSON string), and the
store's lifecycle table ``TRANSITIONS`` is keyed by them. The runtime has its own, smaller view
(``runtime.backend.State``); the sandbox service and reconciliation map between the two.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Final

from ._credentials import SealedToken

__all__ = [
    "EXPIRING_STATES",
    "STATES",
    "TRANSITIONS",
    "Defaults",
    "LifecycleEvent",
    "MountedVolume",
    "NetworkSettings",
    "SandboxDetails",
    "SandboxRecord",
    "SandboxState",
    "format_time",
    "parse_time",
]


class SandboxState(enum.StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    KILLING = "killing"
    KILLED = "killed"
    FAILED = "failed"


S = SandboxState

# The server's lifecycle as data: state → the states it may move to.
#
#     creating → running → pausing → paused → resuming → running
#
# A pause or resume that the runtime refused (or that a crash interrupted before the runtime
# acted) goes back where it came from: pausing → running, resuming → paused.
#
# Every state except killed may still hold runtime resources, so every one of them may go to
# killing, and killing goes to killed once the runtime has released everything. Any live state
# may go to failed when a runtime operation failed and left the sandbox in no known state; a
# failed sandbox may still hold resources, so its only way on is killing (which releases them;
# a release that fails again goes back to failed). killed is terminal. A change that keeps the
# state (new expiry, metadata) is not a transition and is always allowed. This is the server's
# view; what a backend can do is runtime.backend.TRANSITIONS, and the services map between them.
TRANSITIONS: dict[SandboxState, frozenset[SandboxState]] = {
    S.CREATING: frozenset({S.RUNNING, S.KILLING, S.FAILED}),
    S.RUNNING: frozenset({S.PAUSING, S.KILLING, S.FAILED}),
    S.PAUSING: frozenset({S.PAUSED, S.RUNNING, S.KILLING, S.FAILED}),
    S.PAUSED: frozenset({S.RESUMING, S.KILLING, S.FAILED}),
    S.RESUMING: frozenset({S.RUNNING, S.PAUSED, S.KILLING, S.FAILED}),
    S.KILLING: frozenset({S.KILLED, S.FAILED}),
    S.FAILED: frozenset({S.KILLING}),
    S.KILLED: frozenset(),
}
STATES: frozenset[SandboxState] = frozenset(TRANSITIONS)

# The states in which a sandbox's timeout runs, so the reaper acts on them (kill, or pause when
# auto_pause is set). A paused sandbox keeps no timeout (it stays until resumed or killed, as in
# E2B); a transitional state belongs to an operation in flight, which has its own deadline and
# is settled by startup reconciliation if the server died during it; killed and failed are done.
EXPIRING_STATES: frozenset[SandboxState] = frozenset({S.RUNNING})


class Defaults:
    """One default per setting: what a sandbox gets when neither the request nor the operator says.

    The request parser, the service, the record and the views all read these, so a default is
    changed in one place. ``docs/PROTOCOL-NOTES.md`` says which of them the clients rely on.
    """

    TIMEOUT_S: Final = 15  # create (v1) and resume when the body has no timeout
    V2_TIMEOUT_S: Final = 300  # the v2 routes, whose newer clients omit the field
    REFRESH_S: Final = 15  # POST /sandboxes/{id}/refreshes without a duration
    SECURE_V1: Final = False  # v1 create without "secure": no envd token
    SECURE_V2: Final = True  # v2 sandboxes always get an envd token
    ALLOW_INTERNET_ACCESS: Final = True
    ALLOW_PUBLIC_TRAFFIC: Final = True
    AUTO_PAUSE: Final = False  # on timeout: kill
    AUTO_PAUSE_MEMORY: Final = True  # an auto-pause keeps memory
    AUTO_RESUME: Final = False
    PAUSE_MEMORY: Final = True  # POST /sandboxes/{id}/pause without "memory"
    CPU_COUNT: Final = 2
    MEMORY_MB: Final = 512
    DISK_MB: Final = 2048  # a sandbox's disk (the runtime enforces it: runtime._disk)


_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def format_time(moment: datetime) -> str:
    """Fixed-width UTC text, so that text order is time order in SQL (the columns are compared as text)."""
    if moment.utcoffset() is None:
        raise ValueError(f"timestamps must be timezone-aware, got {moment!r}")
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(text: str) -> datetime:
    if not _TIME.fullmatch(text):
        raise ValueError(f"not a UTC timestamp of the form 2026-01-02T03:04:05.000006Z: {text!r}")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)


def _string_map(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{what} must map strings to strings")
    return dict(value)


def _typed(value: object, kind: type | tuple[type, ...], what: str) -> Any:
    # bool is an int in Python; a JSON true must never pass as a count.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ValueError(f"{what} has the wrong type: {type(value).__name__}")
    if not isinstance(value, kind):
        raise ValueError(f"{what} has the wrong type: {type(value).__name__}")
    return value


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _mapping(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object")
    return value


def _object(value: object, what: str, known: frozenset[str]) -> dict[str, Any]:
    data = _mapping(value, what)
    unknown = sorted(set(data) - known)
    if unknown:  # never silently dropped: a record this code cannot fully read is an error
        raise ValueError(f"{what} has unknown fields {unknown}")
    return data


# JSON spelling of NetworkSettings: the API's own names, as the views report them.
_NETWORK_KEYS = frozenset({"allowPublicTraffic", "allowOut", "denyOut", "maskRequestHost"})


@dataclass(frozen=True, kw_only=True)
class NetworkSettings:
    """The create body's ``network`` object as the sandbox got it (reported back by get)."""

    allow_public_traffic: bool = Defaults.ALLOW_PUBLIC_TRAFFIC
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    mask_request_host: str | None = None

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "allowPublicTraffic": self.allow_public_traffic,
            "allowOut": list(self.allow_out),
            "denyOut": list(self.deny_out),
        }
        if self.mask_request_host:
            body["maskRequestHost"] = self.mask_request_host
        return body

    @classmethod
    def from_dict(cls, value: object) -> NetworkSettings:
        data = _object(value, "network", _NETWORK_KEYS)
        mask = data.get("maskRequestHost")
        return cls(
            allow_public_traffic=_typed(data.get("allowPublicTraffic", Defaults.ALLOW_PUBLIC_TRAFFIC), bool, "network"),
            allow_out=_strings(data.get("allowOut", []), "network.allowOut"),
            deny_out=_strings(data.get("denyOut", []), "network.denyOut"),
            mask_request_host=None if mask is None else _typed(mask, str, "network.maskRequestHost"),
        )


@dataclass(frozen=True)
class LifecycleEvent:
    """One line of the sandbox's lifecycle log (``GET /sandboxes/{id}/logs``)."""

    timestamp: str  # RFC 3339, as the log answers carry it
    level: str
    message: str
    fields: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "level": self.level, "message": self.message, "fields": dict(self.fields)}

    @classmethod
    def from_dict(cls, value: object) -> LifecycleEvent:
        data = _object(value, "event", frozenset({"timestamp", "level", "message", "fields"}))
        return cls(
            _typed(data.get("timestamp"), str, "event.timestamp"),
            _typed(data.get("level"), str, "event.level"),
            _typed(data.get("message"), str, "event.message"),
            {key: str(item) for key, item in _mapping(data.get("fields", {}), "event.fields").items()},
        )


@dataclass(frozen=True)
class MountedVolume:
    """A volume a create asked for: the name it gave (reported back), the volume it is, where it is seen."""

    volume_id: str
    name: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"volume_id": self.volume_id, "name": self.name, "path": self.path}

    @classmethod
    def from_dict(cls, value: object) -> MountedVolume:
        data = _object(value, "volume mount", frozenset({"volume_id", "name", "path"}))
        return cls(
            _typed(data.get("volume_id"), str, "volume_mount.volume_id"),
            _typed(data.get("name"), str, "volume_mount.name"),
            _typed(data.get("path"), str, "volume_mount.path"),
        )


@dataclass(frozen=True, kw_only=True)
class SandboxDetails:
    """Everything about a sandbox that the store does not search by."""

    envd_version: str = ""
    secure: bool = Defaults.SECURE_V2
    envd_token: SealedToken | None = field(default=None, repr=False)
    traffic_token: SealedToken | None = field(default=None, repr=False)
    allow_internet_access: bool = Defaults.ALLOW_INTERNET_ACCESS
    network: NetworkSettings = field(default_factory=NetworkSettings)
    auto_pause_memory: bool = Defaults.AUTO_PAUSE_MEMORY
    auto_resume: bool = Defaults.AUTO_RESUME
    cpu_count: int = Defaults.CPU_COUNT
    memory_mb: int = Defaults.MEMORY_MB
    disk_mb: int = 0  # the sandbox's disk limit; 0 in records made before disks had one
    timeout_s: int = Defaults.V2_TIMEOUT_S  # the last timeout asked for: an auto-resume uses it again
    address: str | None = None  # where the host reaches the sandbox while it runs
    started_at: str | None = None  # RFC 3339; set once, at the first start
    paused_memory: bool | None = None  # how the last pause was made
    # A built template's last user and working directory (None: the server's default user, its home).
    default_user: str | None = None
    default_workdir: str | None = None
    # A built template's start and ready commands: run at the create, and again at a resume whose
    # processes start afresh (a pause without memory, a host restart).
    start_cmd: str | None = None
    ready_cmd: str | None = None
    volume_mounts: tuple[MountedVolume, ...] = ()  # kept while the sandbox lives: its volumes are in use
    events: tuple[LifecycleEvent, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "envd_version": self.envd_version,
            "secure": self.secure,
            "envd_token": None if self.envd_token is None else self.envd_token.to_dict(),
            "traffic_token": None if self.traffic_token is None else self.traffic_token.to_dict(),
            "allow_internet_access": self.allow_internet_access,
            "network": self.network.to_dict(),
            "auto_pause_memory": self.auto_pause_memory,
            "auto_resume": self.auto_resume,
            "cpu_count": self.cpu_count,
            "memory_mb": self.memory_mb,
            "timeout_s": self.timeout_s,
            "address": self.address,
            "started_at": self.started_at,
            "events": [event.to_dict() for event in self.events],
        }
        if self.paused_memory is not None:
            document["paused_memory"] = self.paused_memory
        for name in ("default_user", "default_workdir", "start_cmd", "ready_cmd"):
            if getattr(self, name) is not None:  # absent from sandboxes of the server's own templates
                document[name] = getattr(self, name)
        if self.disk_mb:  # absent from records made before disks had a size: they read back unchanged
            document["disk_mb"] = self.disk_mb
        if self.volume_mounts:  # absent from sandboxes without volumes (and records made before them)
            document["volume_mounts"] = [mount.to_dict() for mount in self.volume_mounts]
        return document

    @classmethod
    def from_dict(cls, value: object) -> SandboxDetails:
        data = _object(value, "data", _DETAIL_KEYS)
        values: dict[str, Any] = {}
        for name, kind in _SCALARS.items():
            if data.get(name) is not None:
                values[name] = _typed(data[name], kind, f"data.{name}")
        for name in ("envd_token", "traffic_token"):
            if data.get(name) is not None:
                values[name] = SealedToken.from_dict(_mapping(data[name], f"data.{name}"))
        if data.get("network") is not None:
            values["network"] = NetworkSettings.from_dict(data["network"])
        if data.get("events") is not None:
            if not isinstance(data["events"], list):
                raise ValueError("data.events must be a list")
            values["events"] = tuple(LifecycleEvent.from_dict(event) for event in data["events"])
        if data.get("volume_mounts") is not None:
            if not isinstance(data["volume_mounts"], list):
                raise ValueError("data.volume_mounts must be a list")
            values["volume_mounts"] = tuple(MountedVolume.from_dict(mount) for mount in data["volume_mounts"])
        return cls(**values)


_SCALARS: dict[str, type | tuple[type, ...]] = {
    "envd_version": str,
    "secure": bool,
    "allow_internet_access": bool,
    "auto_pause_memory": bool,
    "auto_resume": bool,
    "cpu_count": int,
    "memory_mb": int,
    "disk_mb": int,
    "timeout_s": int,
    "address": str,
    "started_at": str,
    "paused_memory": bool,
    "default_user": str,
    "default_workdir": str,
    "start_cmd": str,
    "ready_cmd": str,
}
_DETAIL_KEYS = frozenset(item.name for item in fields(SandboxDetails))


@dataclass(frozen=True, kw_only=True)
class SandboxRecord:
    """Everything the server keeps about one sandbox."""

    sandbox_id: str
    owner: str
    template_id: str
    state: SandboxState
    generation: int = 1
    created_at: datetime
    expires_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets: kept out of logs
    auto_pause: bool = Defaults.AUTO_PAUSE
    details: SandboxDetails = field(default_factory=SandboxDetails)

    def __post_init__(self) -> None:
        for name in ("sandbox_id", "owner", "template_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if not isinstance(self.state, str) or self.state not in STATES:
            raise ValueError(f"unknown sandbox state {self.state!r}")
        object.__setattr__(self, "state", SandboxState(self.state))
        if isinstance(self.generation, bool) or not isinstance(self.generation, int) or self.generation < 1:
            raise ValueError(f"generation must be a positive integer, got {self.generation!r}")
        for name in ("created_at", "expires_at"):
            moment = getattr(self, name)
            if not isinstance(moment, datetime):
                raise ValueError(f"{name} must be a datetime, got {moment!r}")
            format_time(moment)  # rejects naive datetimes
            object.__setattr__(self, name, moment.astimezone(UTC))
        object.__setattr__(self, "metadata", _string_map(self.metadata, "metadata"))
        object.__setattr__(self, "env_vars", _string_map(self.env_vars, "env_vars"))
        if not isinstance(self.auto_pause, bool):
            raise ValueError(f"auto_pause must be a boolean, got {self.auto_pause!r}")
        if not isinstance(self.details, SandboxDetails):
            raise ValueError(f"details must be SandboxDetails, got {type(self.details).__name__}")

    def with_details(self, **changes: Any) -> SandboxDetails:
        """The details with ``changes`` applied (for a compare-and-swap's ``details``)."""
        return replace(self.details, **changes)

    def to_json(self) -> str:
        document: dict[str, Any] = {
            "sandbox_id": self.sandbox_id,
            "owner": self.owner,
            "template_id": self.template_id,
            "state": str(self.state),
            "generation": self.generation,
            "created_at": format_time(self.created_at),
            "expires_at": format_time(self.expires_at),
            "metadata": self.metadata,
            "env_vars": self.env_vars,
            "auto_pause": self.auto_pause,
            "data": self.details.to_dict(),
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> SandboxRecord:
        """The inverse of ``to_json``; a missing or unknown field is an error, never silently dropped."""
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("a sandbox record must be a JSON object")
        if set(value) != _JSON_FIELDS:
            missing, unknown = sorted(_JSON_FIELDS - set(value)), sorted(set(value) - _JSON_FIELDS)
            raise ValueError(f"sandbox record fields differ: missing {missing}, unknown {unknown}")
        for name in ("created_at", "expires_at"):
            if not isinstance(value[name], str):
                raise ValueError(f"{name} must be a timestamp string")
        return cls(
            **{name: value[name] for name in _JSON_FIELDS - {"created_at", "expires_at", "data"}},
            created_at=parse_time(value["created_at"]),
            expires_at=parse_time(value["expires_at"]),
            details=SandboxDetails.from_dict(value["data"]),
        )


_JSON_FIELDS = frozenset(item.name for item in fields(SandboxRecord)) - {"details"} | {"data"}
