"""The control plane driven by the pinned official clients, unchanged, against real sandboxes.

Cases are data: a scenario name (the same in every flavour's script under ``scenarios/``), the
flavours that run it, and one check every flavour's result must pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.runtime.agent.conftest import ScenarioRunner

pytestmark = [pytest.mark.artifacts]

ALL = ("py-sync", "py-async", "js")
Check = Callable[[dict[str, Any]], None]


def _create(r: dict[str, Any]) -> None:
    assert r["stdout"] == "yes\nuser\n/home/user\n"
    assert r["metadata"] == {"case": "create", "n": "1"}
    assert r["template"] == "base"
    assert r["state"] == "running"
    assert r["same_id"] is True
    assert r["ends_after_start"] is True


def _get_host(r: dict[str, Any]) -> None:
    assert r["ok"] is True, r
    assert r["body"] == "hello from inside"
    assert r["host"].startswith("8000-")


def _list(r: dict[str, Any]) -> None:
    assert r == {"pages": 2, "all_found": True, "paused": True, "paused_state": ["paused"], "running": True}


def _timeout(r: dict[str, Any]) -> None:
    assert r["gone"] is True
    assert r["info_error"] in ("SandboxNotFoundException", "NotFoundException", "SandboxNotFoundError", "NotFoundError")


def _pause_memory(r: dict[str, Any]) -> None:
    assert r == {
        "first": True,
        "second": False,
        "listed_paused": True,
        "state": "paused",
        "process_survived": True,
        "still_ticking": True,
        "running_after": True,
    }


def _pause_filesystem(r: dict[str, Any]) -> None:
    assert r == {"paused": True, "file": "kept across the pause", "process_gone": True, "env": "env\n"}


def _snapshot(r: dict[str, Any]) -> None:
    assert r["listed"] is True
    assert r["source_running"] is True
    assert r["content"] == "snapshot content"
    assert r["in_use"] == "409"
    assert r["deleted"] is True
    assert r["deleted_again"] is False
    assert len(r["names"]) == 1


def _metrics(r: dict[str, Any]) -> None:
    assert r["count"] >= 2
    assert r["cpu_count"] == 2
    assert r["mem_total"] == 512 << 20
    assert r["mem_used_positive"] is True
    assert r["has_timestamp"] is True


def _kill(r: dict[str, Any]) -> None:
    assert r["running"] is True
    assert r["killed"] is True
    assert r["running_after"] is False
    assert r["killed_again"] is False
    assert r["connect_error"] in (
        "SandboxNotFoundException",
        "NotFoundException",
        "SandboxNotFoundError",
        "NotFoundError",
    )


def _other_owner(r: dict[str, Any]) -> None:
    assert r["listed_for_other"] is False
    assert r["connect_error"] in (
        "SandboxNotFoundException",
        "NotFoundException",
        "SandboxNotFoundError",
        "NotFoundError",
    )
    assert r["other_kill"] is False
    assert r["still_running"] is True


def _websocket(r: dict[str, Any]) -> None:
    assert r == {
        "received": ["hello", [1, 2, 3], "bye"],
        "code": 4001,
        "reason": "asked to",
        "protocol": "echo.v1",
    }


CASES: list[tuple[str, tuple[str, ...], Check]] = [
    ("sandbox/create-env-metadata", ALL, _create),
    ("sandbox/get-host", ALL, _get_host),
    ("sandbox/list-filter-paginate", ALL, _list),
    ("sandbox/timeout", ALL, _timeout),
    ("sandbox/pause-memory-connect", ALL, _pause_memory),
    ("sandbox/pause-filesystem-connect", ALL, _pause_filesystem),
    ("sandbox/snapshot-restore", ALL, _snapshot),
    ("sandbox/metrics", ALL, _metrics),
    ("sandbox/kill-is-running", ALL, _kill),
    ("sandbox/other-owner", ALL, _other_owner),
    ("sandbox/websocket", ("js",), _websocket),
]


@pytest.mark.parametrize(
    ("flavour", "name", "check"),
    [pytest.param(f, n, c, id=f"{f}:{n}") for n, flavours, c in CASES for f in flavours],
)
def test_lifecycle_scenario(lifecycle: ScenarioRunner, flavour: str, name: str, check: Check) -> None:
    check(lifecycle(flavour, name))
