"""What each scenario must have observed: one check per scenario, shared by every client flavour.

A check receives the scenario's JSON result and the working folder the scenario used, and raises
``AssertionError`` with a message saying what differed. ``envd_*`` checks belong to the agent
scenarios (``scenarios/envd``), ``sandbox_*`` to the control-plane ones (``scenarios/sandbox``).
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []  # the checks are reached through ``_cases.CASES``

SANDBOX_HOME = "/home/user"
NOT_FOUND = ("SandboxNotFoundException", "NotFoundException", "SandboxNotFoundError", "NotFoundError")


def envd_foreground(r: dict[str, Any], work: str) -> None:
    assert r == {"stdout": f"hi from {work}\n", "stderr": "oops\n", "exit_code": 0}


def envd_exit_code(r: dict[str, Any], work: str) -> None:
    assert r == {"raised": True, "exit_code": 3, "stdout": "partial\n", "stderr": "failing\n"}


def envd_ordering(r: dict[str, Any], work: str) -> None:
    assert r["stdout"] == "".join(f"out{i}\n" for i in range(1, 6))
    assert r["stderr"] == "".join(f"err{i}\n" for i in range(1, 6))
    # Each stream's own order holds; between the two streams no order is promised (two pipes, read
    # independently, as upstream), so only the per-stream sequences are compared.
    for stream in ("stdout", "stderr"):
        seen = [line for name, line in r["callbacks"] if name == stream]
        assert seen == [f"{stream[3:]}{i}\n" for i in range(1, 6)]


def envd_background(r: dict[str, Any], work: str) -> None:
    assert r["stdout"] == "done\n"
    assert r["exit_code"] == 0
    if "listed" in r:
        assert r["listed"] is True
        assert r["listed_after"] is False


def envd_stdin(r: dict[str, Any], work: str) -> None:
    assert r["listed"] is True
    assert r["stdout"] == "first line\nsecond line\n"
    assert r["stderr"] == ""
    assert r["exit_code"] == 0
    if "cmd" in r:  # List reports the request's own config
        assert (r["cmd"], r["args"]) == ("/bin/bash", ["-l", "-c", "cat"])


def envd_kill(r: dict[str, Any], work: str) -> None:
    assert r["killed"] is True
    assert r["kill_unknown"] is False
    assert r["raised"] is True
    assert r["exit_code"] == -1
    assert r["error"] == "signal: killed"
    assert r.get("listed_after", False) is False


def envd_timeout(r: dict[str, Any], work: str) -> None:
    assert r["raised"] == "TimeoutException"
    assert r["elapsed"] < 2.9, "the deadline (1 s) ends the stream, well before the command's 3 s"
    assert r["process_survived"] is False, "the deadline kills the process too"


def envd_user(r: dict[str, Any], work: str) -> None:
    assert r["lines"] == ["root", "/root", "root", "true"]


def envd_pty(r: dict[str, Any], work: str) -> None:
    assert "MARK-42" in r["output"]
    assert "30 100" in r["output"], "the resize reached the terminal"
    assert r["exit_code"] == 0


def envd_text_bytes(r: dict[str, Any], work: str) -> None:
    assert r["write"] == {"name": "hello.txt", "path": f"{work}/t/hello.txt", "type": "file"}
    assert r["text"] == "héllo\n"
    assert r["bytes_equal"] is True
    assert r["stream_equal"] is True
    assert r.get("gzip_equal", True) is True
    # The bare agent acts as root; in a sandbox (whose scenarios work in /home/user) the default user is user.
    home = SANDBOX_HOME if work == SANDBOX_HOME else "/root"
    assert r["relative"] == f"{home}/relative-from-home.txt", "relative paths resolve against the user's home"


def envd_write_many(r: dict[str, Any], work: str) -> None:
    assert r["paths"] == [f"{work}/many/{i}/f{i}.txt" for i in range(5)]
    assert r["contents"] == [f"file {i}" for i in range(5)]


def envd_list(r: dict[str, Any], work: str) -> None:
    tree = f"{work}/tree"
    assert r["depth1"] == [f"{tree}/a", f"{tree}/top.txt"]
    assert r["depth3"] == [f"{tree}/a", f"{tree}/a/b", f"{tree}/a/b/c.txt", f"{tree}/top.txt"]
    assert r["info"] == {
        "name": "top.txt",
        "type": "file",
        "size": 3,
        "mode": 0o644,
        "permissions": "-rw-r--r--",
        "path": f"{tree}/top.txt",
    }
    assert r["exists"] is True
    assert r["exists_missing"] is False
    if "missing_error" in r:
        assert r["missing_error"] == "FileNotFoundException"
        assert r["dir_type"] == "dir"


def envd_mkdir(r: dict[str, Any], work: str) -> None:
    assert r == {
        "first": True,
        "second": False,
        "renamed_path": f"{work}/made/sub/new.txt",
        "old_exists": False,
        "new_content": "moving",
        "deep_exists": False,
    }


def envd_metadata(r: dict[str, Any], work: str) -> None:
    assert r["written"] == {"owner": "team-a", "stage": "dev"}, "keys are lowercased"
    assert r["stat"] == r["written"]
    assert r["cleared"] is None, "an upload without metadata clears it"


def envd_watch(r: dict[str, Any], work: str) -> None:
    events = [tuple(e) for e in r["events"]]
    expected = [
        ("create", "a.txt"),
        ("write", "a.txt"),
        ("create", "sub"),
        ("create", "sub/deeper"),
        ("rename", "a.txt"),
        ("create", "sub/b.txt"),
        ("remove", "sub/b.txt"),
    ]
    # Per path, events keep their order. Across paths they need not: a recursive watch learns of a
    # new folder's contents by scanning it once its own watch is added (inotify cannot watch a
    # folder before it exists), so those events may come after later events elsewhere. A folder's
    # creation is still reported before anything inside it.
    for path in dict.fromkeys(name for _, name in expected):
        wanted = [e for e in expected if e[1] == path]
        it = iter(e for e in events if e[1] == path)
        assert all(e in it for e in wanted), f"{wanted} is not a subsequence of {events} (events of {path})"
    for position, (kind, name) in enumerate(events):
        parent = name.rpartition("/")[0]
        if parent:
            assert ("create", parent) in events[:position], f"{(kind, name)} came before its folder's creation"
    assert not any(kind in ("open", "read") for kind, _ in events)


def sandbox_create(r: dict[str, Any], work: str) -> None:
    assert r["stdout"] == "yes\nuser\n/home/user\n"
    assert r["metadata"] == {"case": "create", "n": "1"}
    assert r["template"] == "base"
    assert r["state"] == "running"
    assert r["same_id"] is True
    assert r["ends_after_start"] is True


def sandbox_get_host(r: dict[str, Any], work: str) -> None:
    assert r["ok"] is True, r
    assert r["body"] == "hello from inside"
    assert r["host"].startswith("8000-")


def sandbox_list(r: dict[str, Any], work: str) -> None:
    assert r == {"pages": 2, "all_found": True, "paused": True, "paused_state": ["paused"], "running": True}


def sandbox_timeout(r: dict[str, Any], work: str) -> None:
    assert r["gone"] is True
    assert r["info_error"] in NOT_FOUND


def sandbox_pause_memory(r: dict[str, Any], work: str) -> None:
    assert r == {
        "first": True,
        "second": False,
        "listed_paused": True,
        "state": "paused",
        "process_survived": True,
        "still_ticking": True,
        "running_after": True,
    }


def sandbox_pause_filesystem(r: dict[str, Any], work: str) -> None:
    assert r == {"paused": True, "file": "kept across the pause", "process_gone": True, "env": "env\n"}


def sandbox_snapshot(r: dict[str, Any], work: str) -> None:
    assert r["listed"] is True
    assert r["source_running"] is True
    assert r["content"] == "snapshot content"
    assert r["in_use"] == "409"
    assert r["deleted"] is True
    assert r["deleted_again"] is False
    assert len(r["names"]) == 1


def sandbox_metrics(r: dict[str, Any], work: str) -> None:
    assert r["count"] >= 2
    assert r["cpu_count"] == 2
    assert r["mem_total"] == 512 << 20
    assert r["mem_used_positive"] is True
    assert r["has_timestamp"] is True


def sandbox_kill(r: dict[str, Any], work: str) -> None:
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


def sandbox_other_owner(r: dict[str, Any], work: str) -> None:
    assert r["listed_for_other"] is False
    assert r["connect_error"] in (
        "SandboxNotFoundException",
        "NotFoundException",
        "SandboxNotFoundError",
        "NotFoundError",
    )
    assert r["other_kill"] is False
    assert r["still_running"] is True


def sandbox_websocket(r: dict[str, Any], work: str) -> None:
    assert r == {
        "received": ["hello", [1, 2, 3], "bye"],
        "code": 4001,
        "reason": "asked to",
        "protocol": "echo.v1",
    }
