"""The agent, driven by the pinned official clients (Python sync, Python async, JS), unchanged.

Each case runs a scenario script in the client's own environment (``scenarios/``) and
checks what it observed. Cases are data: a scenario name, the flavours that run it, and
one check shared by every flavour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .conftest import Agent, ScenarioRunner

pytestmark = pytest.mark.artifacts

ALL = ("py-sync", "py-async", "js")
SANDBOX_HOME = "/home/user"
Check = Callable[[dict[str, Any], str], None]


def _foreground(r: dict[str, Any], work: str) -> None:
    assert r == {"stdout": f"hi from {work}\n", "stderr": "oops\n", "exit_code": 0}


def _exit_code(r: dict[str, Any], work: str) -> None:
    assert r == {"raised": True, "exit_code": 3, "stdout": "partial\n", "stderr": "failing\n"}


def _ordering(r: dict[str, Any], work: str) -> None:
    assert r["stdout"] == "".join(f"out{i}\n" for i in range(1, 6))
    assert r["stderr"] == "".join(f"err{i}\n" for i in range(1, 6))
    # Each stream's own order holds; between the two streams no order is promised (two pipes, read
    # independently, as upstream), so only the per-stream sequences are compared.
    for stream in ("stdout", "stderr"):
        seen = [line for name, line in r["callbacks"] if name == stream]
        assert seen == [f"{stream[3:]}{i}\n" for i in range(1, 6)]


def _background(r: dict[str, Any], work: str) -> None:
    assert r["stdout"] == "done\n"
    assert r["exit_code"] == 0
    if "listed" in r:
        assert r["listed"] is True
        assert r["listed_after"] is False


def _stdin(r: dict[str, Any], work: str) -> None:
    assert r["listed"] is True
    assert r["stdout"] == "first line\nsecond line\n"
    assert r["stderr"] == ""
    assert r["exit_code"] == 0
    if "cmd" in r:  # List reports the request's own config
        assert (r["cmd"], r["args"]) == ("/bin/bash", ["-l", "-c", "cat"])


def _kill(r: dict[str, Any], work: str) -> None:
    assert r["killed"] is True
    assert r["kill_unknown"] is False
    assert r["raised"] is True
    assert r["exit_code"] == -1
    assert r["error"] == "signal: killed"
    assert r.get("listed_after", False) is False


def _timeout(r: dict[str, Any], work: str) -> None:
    assert r["raised"] == "TimeoutException"
    assert r["elapsed"] < 2.9, "the deadline (1 s) ends the stream, well before the command's 3 s"
    assert r["process_survived"] is False, "the deadline kills the process too"


def _user(r: dict[str, Any], work: str) -> None:
    assert r["lines"] == ["root", "/root", "root", "true"]


def _pty(r: dict[str, Any], work: str) -> None:
    assert "MARK-42" in r["output"]
    assert "30 100" in r["output"], "the resize reached the terminal"
    assert r["exit_code"] == 0


def _text_bytes(r: dict[str, Any], work: str) -> None:
    assert r["write"] == {"name": "hello.txt", "path": f"{work}/t/hello.txt", "type": "file"}
    assert r["text"] == "héllo\n"
    assert r["bytes_equal"] is True
    assert r["stream_equal"] is True
    assert r.get("gzip_equal", True) is True
    # The bare agent acts as root; in a sandbox (whose scenarios work in /home/user) the default user is user.
    home = SANDBOX_HOME if work == SANDBOX_HOME else "/root"
    assert r["relative"] == f"{home}/relative-from-home.txt", "relative paths resolve against the user's home"


def _write_many(r: dict[str, Any], work: str) -> None:
    assert r["paths"] == [f"{work}/many/{i}/f{i}.txt" for i in range(5)]
    assert r["contents"] == [f"file {i}" for i in range(5)]


def _list(r: dict[str, Any], work: str) -> None:
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


def _mkdir(r: dict[str, Any], work: str) -> None:
    assert r == {
        "first": True,
        "second": False,
        "renamed_path": f"{work}/made/sub/new.txt",
        "old_exists": False,
        "new_content": "moving",
        "deep_exists": False,
    }


def _metadata(r: dict[str, Any], work: str) -> None:
    assert r["written"] == {"owner": "team-a", "stage": "dev"}, "keys are lowercased"
    assert r["stat"] == r["written"]
    assert r["cleared"] is None, "an upload without metadata clears it"


def _watch(r: dict[str, Any], work: str) -> None:
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
    it = iter(events)
    assert all(e in it for e in expected), f"{expected} is not a subsequence of {events}"
    assert not any(kind in ("open", "read") for kind, _ in events)


CASES: list[tuple[str, tuple[str, ...], Check]] = [
    ("commands/foreground", ALL, _foreground),
    ("commands/exit-code", ALL, _exit_code),
    ("commands/ordering", ("py-sync",), _ordering),
    ("commands/background-connect", ("py-sync", "js"), _background),
    ("commands/stdin", ALL, _stdin),
    ("commands/kill", ALL, _kill),
    ("commands/timeout", ("py-sync",), _timeout),
    ("commands/user-and-env", ("py-sync",), _user),
    ("pty/session", ALL, _pty),
    ("files/text-bytes-stream", ALL, _text_bytes),
    ("files/write-many", ("py-sync", "js"), _write_many),
    ("files/list-stat-exists", ALL, _list),
    ("files/make-dir-rename-remove", ALL, _mkdir),
    ("files/metadata", ("py-sync",), _metadata),
    ("watch/polling", ("py-sync",), _watch),
    ("watch/stream", ("py-async", "js"), _watch),
]


@pytest.mark.parametrize(
    ("flavour", "name", "check"),
    [pytest.param(f, n, c, id=f"{f}:{n}") for n, flavours, c in CASES for f in flavours],
)
def test_scenario(scenario: ScenarioRunner, flavour: str, name: str, check: Check) -> None:
    result = scenario(flavour, name)
    check(result, scenario.work(flavour, name))


def test_large_file_is_streamed_both_ways(scenario: ScenarioRunner, agent: Agent) -> None:
    """100 MiB up and down through the Python client; the agent's peak memory barely moves."""
    before = _peak_rss_kib(agent.pid)
    result = scenario("py-sync", "files/large", timeout=600)
    after = _peak_rss_kib(agent.pid)
    assert result["size"] == 100 * 1024 * 1024
    assert result["sha_equal"] is True
    assert after - before < 32 * 1024, f"agent peak RSS grew by {after - before} KiB for a 100 MiB round trip"


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")
