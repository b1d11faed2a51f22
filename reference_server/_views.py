"""Records → the JSON bodies the clients parse, field for field as the contract names them.

The schemas are the derived contract's (``contract/derived/control-plane.openapi.json``):
``Sandbox`` for create/connect/resume, ``SandboxDetail`` for get, ``ListedSandbox`` for lists,
``SandboxMetric``, ``SnapshotInfo``, ``SandboxLogs`` and ``SandboxLogsV2Response``. The tests
validate every body this module makes against those schemas.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ._metrics import Sample
from ._records import LifecycleEvent, SandboxRecord
from ._sandboxes import Opened, api_state
from ._snapshots import SnapshotRecord

__all__ = ["detail", "listed", "log_entry", "log_line", "metric", "sandbox", "snapshot"]

# Deprecated upstream and ignored by the clients, but required by the schemas.
CLIENT_ID = "e2b-compat"


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def sandbox(opened: Opened, domain: str) -> dict[str, Any]:
    record = opened.record
    body: dict[str, Any] = {
        "sandboxID": record.sandbox_id,
        "templateID": record.template_id,
        "clientID": CLIENT_ID,
        "envdVersion": record.details.envd_version,
        "domain": domain,
        "trafficAccessToken": opened.traffic_token,
    }
    if opened.envd_token is not None:
        body["envdAccessToken"] = opened.envd_token
    return body


def _common(record: SandboxRecord) -> dict[str, Any]:
    started = record.details.started_at
    return {
        "sandboxID": record.sandbox_id,
        "templateID": record.template_id,
        "clientID": CLIENT_ID,
        "cpuCount": record.details.cpu_count,
        "memoryMB": record.details.memory_mb,
        "diskSizeMB": record.details.disk_mb,
        "envdVersion": record.details.envd_version,
        "startedAt": started if started is not None else _time(record.created_at),
        "endAt": _time(record.expires_at),
        "state": api_state(record.state),
        "metadata": record.metadata,
        "volumeMounts": [{"name": mount.name, "path": mount.path} for mount in record.details.volume_mounts],
    }


def listed(record: SandboxRecord) -> dict[str, Any]:
    return _common(record)


def detail(record: SandboxRecord, envd_token: str | None, domain: str) -> dict[str, Any]:
    body = _common(record)
    body.update(
        domain=domain,
        allowInternetAccess=record.details.allow_internet_access,
        network=record.details.network.to_dict(),
        lifecycle={
            "autoResume": record.details.auto_resume,
            "onTimeout": "pause" if record.auto_pause else "kill",
        },
    )
    if envd_token is not None:
        body["envdAccessToken"] = envd_token
    return body


def metric(sample: Sample) -> dict[str, Any]:
    return {
        "timestamp": _time(sample.at),
        "timestampUnix": int(sample.at.timestamp()),
        "cpuCount": sample.cpu_count,
        "cpuUsedPct": sample.cpu_used_pct,
        "memUsed": sample.mem_used,
        "memTotal": sample.mem_total,
        "memCache": 0,
        "diskUsed": sample.disk_used,
        "diskTotal": sample.disk_total,
    }


def snapshot(record: SnapshotRecord) -> dict[str, Any]:
    return {"snapshotID": record.snapshot_id, "names": list(record.names)}


def log_entry(event: LifecycleEvent) -> dict[str, Any]:
    """A ``SandboxLogEntry`` (v2, and ``logEntries`` of v1)."""
    return {
        "timestamp": event.timestamp,
        "level": event.level,
        "message": event.message,
        "fields": {key: str(value) for key, value in event.fields.items()},
    }


def log_line(event: LifecycleEvent) -> dict[str, Any]:
    """A ``SandboxLog`` (v1's ``logs``)."""
    return {"timestamp": event.timestamp, "line": event.message}
