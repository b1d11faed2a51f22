"""Answer bodies of the template API, field for field as the contract's schemas name them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ._templates import BuildLog, BuildRecord, TagRecord, TemplateRecord

__all__ = [
    "alias",
    "assigned_tags",
    "build_info",
    "build_logs",
    "file_upload",
    "request_response",
    "tag",
    "template",
    "template_legacy",
    "template_with_builds",
]


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _opt_time(moment: datetime | None) -> str | None:
    return None if moment is None else _time(moment)


def _last_ready(builds: Sequence[BuildRecord]) -> BuildRecord | None:
    ready = [b for b in builds if b.status == "ready"]
    return ready[-1] if ready else None


def request_response(record: TemplateRecord, build: BuildRecord) -> dict[str, Any]:
    return {
        "templateID": record.template_id,
        "buildID": build.build_id,
        "public": record.public,
        "names": [record.name],
        "aliases": [record.name],
        "tags": list(build.requested_tags),
    }


def _entry(entry: BuildLog) -> dict[str, Any]:
    body: dict[str, Any] = {"timestamp": _time(entry.timestamp), "level": entry.level, "message": entry.message}
    if entry.step is not None:
        body["step"] = entry.step
    return body


def build_info(build: BuildRecord, entries: Sequence[BuildLog]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "templateID": build.template_id,
        "buildID": build.build_id,
        "status": build.status,
        "logs": [f"[{_time(e.timestamp)}] {e.message}" for e in entries],
        "logEntries": [_entry(e) for e in entries],
    }
    if build.reason is not None:
        reason: dict[str, Any] = {"message": str(build.reason.get("message", ""))}
        if build.reason.get("step") is not None:
            reason["step"] = str(build.reason["step"])
        reason["logEntries"] = list(build.reason.get("logEntries") or [])
        body["reason"] = reason
    return body


def build_logs(entries: Sequence[BuildLog]) -> dict[str, Any]:
    return {"logs": [_entry(e) for e in entries]}


def file_upload(present: bool, url: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"present": present}
    if url is not None:
        body["url"] = url
    return body


def template(record: TemplateRecord, builds: Sequence[BuildRecord], envd_version: str) -> dict[str, Any]:
    ready = _last_ready(builds)
    latest = builds[-1] if builds else None
    return {
        **template_legacy(record, builds, envd_version),
        "names": [record.name],
        "buildStatus": latest.status if latest is not None else "waiting",
        "buildID": ready.build_id if ready is not None else (latest.build_id if latest else ""),
    }


def template_legacy(record: TemplateRecord, builds: Sequence[BuildRecord], envd_version: str) -> dict[str, Any]:
    ready = _last_ready(builds)
    latest = builds[-1] if builds else None
    return {
        "templateID": record.template_id,
        "buildID": ready.build_id if ready is not None else (latest.build_id if latest else ""),
        "cpuCount": record.cpu_count,
        "memoryMB": record.memory_mb,
        "diskSizeMB": record.disk_mb,
        "public": record.public,
        "aliases": [record.name],
        "createdAt": _time(record.created_at),
        "updatedAt": _time(record.updated_at),
        "createdBy": None,
        "lastSpawnedAt": _opt_time(record.last_spawned_at),
        "spawnCount": record.spawn_count,
        "buildCount": len(builds),
        "envdVersion": envd_version,
    }


def template_with_builds(record: TemplateRecord, builds: Sequence[BuildRecord], envd_version: str) -> dict[str, Any]:
    def one(build: BuildRecord) -> dict[str, Any]:
        body: dict[str, Any] = {
            "buildID": build.build_id,
            "status": build.status,
            "createdAt": _time(build.created_at),
            "updatedAt": _time(build.updated_at),
            "cpuCount": build.cpu_count,
            "memoryMB": build.memory_mb,
            "diskSizeMB": record.disk_mb,
            "envdVersion": envd_version,
        }
        if build.finished_at is not None:
            body["finishedAt"] = _time(build.finished_at)
        return body

    return {
        "templateID": record.template_id,
        "public": record.public,
        "aliases": [record.name],
        "names": [record.name],
        "createdAt": _time(record.created_at),
        "updatedAt": _time(record.updated_at),
        "lastSpawnedAt": _opt_time(record.last_spawned_at),
        "spawnCount": record.spawn_count,
        "builds": [one(b) for b in builds],
    }


def tag(record: TagRecord) -> dict[str, Any]:
    return {"tag": record.tag, "buildID": record.build_id, "createdAt": _time(record.created_at)}


def assigned_tags(tags: Sequence[str], build_id: str) -> dict[str, Any]:
    return {"tags": list(tags), "buildID": build_id}


def alias(template_id: str, public: bool) -> dict[str, Any]:
    return {"templateID": template_id, "public": public}
