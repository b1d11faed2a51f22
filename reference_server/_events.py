"""A sandbox's lifecycle log: appending entries and answering the two log queries.

Each lifecycle step (creating, started, paused, resumed, snapshot taken, network updated) adds a
``LifecycleEvent`` to the record; ``GET /sandboxes/{id}/logs`` (v1: a start time and a limit) and
``GET /v2/sandboxes/{id}/logs`` (v2: a cursor, a direction, a minimum level and a search text) read
them back. The log is bounded: the newest ``MAX_EVENTS`` entries are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from ._records import LifecycleEvent, SandboxDetails

__all__ = ["LEVELS", "MAX_EVENTS", "LogQuery", "append_event", "query_logs", "rfc3339", "since"]

MAX_EVENTS = 200  # lifecycle log lines kept per sandbox
LEVELS = ("debug", "info", "warn", "error")  # in rising order: a query's level is a minimum


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def append_event(details: SandboxDetails, at: datetime, level: str, message: str, **fields: str) -> SandboxDetails:
    """``details`` with one more lifecycle log entry (the newest ``MAX_EVENTS`` are kept)."""
    events = (*details.events, LifecycleEvent(rfc3339(at), level, message, fields))
    return replace(details, events=events[-MAX_EVENTS:])


def since(events: tuple[LifecycleEvent, ...], start_ms: int | None, limit: int) -> list[LifecycleEvent]:
    """The v1 query: entries at or after ``start_ms`` (milliseconds since the epoch), oldest first."""
    return [event for event in events if start_ms is None or _ms(event.timestamp) >= start_ms][:limit]


@dataclass(frozen=True)
class LogQuery:
    """The v2 query. ``cursor`` is in milliseconds; entries past it in ``direction`` are answered."""

    cursor_ms: int | None = None
    limit: int = 1000
    direction: str = "forward"  # or "backward": newest first
    level: str | None = None
    search: str | None = None


def query_logs(events: tuple[LifecycleEvent, ...], query: LogQuery) -> list[LifecycleEvent]:
    ordered = list(events) if query.direction == "forward" else list(reversed(events))
    keep = []
    for event in ordered:
        at = _ms(event.timestamp)
        if query.cursor_ms is not None and (
            at < query.cursor_ms if query.direction == "forward" else at > query.cursor_ms
        ):
            continue
        if query.level is not None and LEVELS.index(event.level) < LEVELS.index(query.level):
            continue
        if query.search and query.search not in event.message:
            continue
        keep.append(event)
    return keep[: query.limit]
