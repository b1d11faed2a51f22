"""What each scenario must have observed: one check per scenario, shared by every client flavour.

A check receives the scenario's JSON result and the working folder the scenario used, and raises
``AssertionError`` with a message saying what differed. ``envd_*`` checks belong to the agent
scenarios (``scenarios/envd``), ``sandbox_*`` to the control-plane ones (``scenarios/sandbox``),
``interpreter_*`` to the code-interpreter ones (``scenarios/interpreter``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from contract.protocol import INTERPRETER_PORT

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


def _watch_events(events: list[tuple[str, str]]) -> str:
    return ", ".join(f"{kind.upper()} {name}" for kind, name in events)


def envd_watch(r: dict[str, Any], work: str) -> None:
    events = [tuple(e) for e in r["events"]]
    watcher = f"watcher on {work}/watched ({r['watcher']})"
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
        seen = [e for e in events if e[1] == path]
        it = iter(seen)
        lost = next((e for e in wanted if e not in it), None)  # ``in`` consumes: a subsequence test
        if lost is not None:
            how = "event out of order" if lost in seen else "missing event"
            raise AssertionError(
                f"{watcher}: {how} {_watch_events([lost])}; events of {path} were [{_watch_events(seen)}], "
                f"expected in this order [{_watch_events(wanted)}]; all events: [{_watch_events(events)}]"
            )
    for position, (kind, name) in enumerate(events):
        parent = name.rpartition("/")[0]
        if parent:
            assert ("create", parent) in events[:position], (
                f"{watcher}: {_watch_events([(kind, name)])} came before its folder's creation"
            )
    assert not any(kind in ("open", "read") for kind, _ in events), f"{watcher}: [{_watch_events(events)}]"


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
    # The specification gives a list no order, but its cursor ("nextToken": where the list starts)
    # is a position in one: every answer to one query, whatever its limit, lists its sandboxes in
    # that order. Pages of one show it without relying on the order inside any answer.
    walks: dict[str, list[list[str]]] = r["walks"]
    call = f"Sandbox.list(query={{metadata: {{suite: {r['suite']}}}}}"
    order = [sandbox_id for page in walks["1"] for sandbox_id in page]
    assert [len(page) for page in walks["1"]] == [1] * len(order), f"{call}, limit=1) pages: {walks['1']}"
    assert sorted(order) == sorted(r["made"]), f"{call}, limit=1) listed {order}, not the sandboxes made {r['made']}"
    wrong = []  # every answer out of that order, so that the message names each list call
    for limit, pages in walks.items():
        listed = f"{call})" if limit == "default" else f"{call}, limit={limit})"
        offset = 0
        for number, page in enumerate(pages, 1):
            expected = order[offset : offset + len(page)]
            if page != expected:
                how = "in reverse order" if page == expected[::-1] else "out of order"
                wrong.append(
                    f"{listed} page {number} returned sandboxes {how}: {page}; pages of limit=1 give {expected}"
                )
            offset += len(page)
        if offset != len(order):
            wrong.append(f"{listed} listed {offset} sandboxes, its pages of limit=1 {len(order)}")
    assert not wrong, "; ".join(wrong)
    rest = {key: value for key, value in r.items() if key not in ("suite", "made", "walks")}
    assert rest == {"pages": 2, "all_found": True, "paused": True, "paused_state": ["paused"], "running": True}


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


PARALLEL_TRAFFIC = 16  # what envd/concurrency/commands-and-files runs at once, of each kind


def envd_parallel_traffic(r: dict[str, Any], work: str) -> None:
    """Each of the parallel commands and file round trips got its own answer, whole.

    Only the commands' own lines are compared: the clients run commands in a login shell, whose
    profile may print on a host of its own (in debug mode, the host's profile runs 16 times at once).
    """
    commands, files = r["commands"], r["files"]
    assert [c[0] for c in commands] == list(range(PARALLEL_TRAFFIC)), "not every command answered"
    for n, stdout, stderr, exit_code in commands:
        ours = (
            [line for line in stdout.splitlines() if line.startswith("start-")],
            [line for line in stderr.splitlines() if line.startswith("end-")],
            exit_code,
        )
        assert ours == ([f"start-{n}"], [f"end-{n}"], n % 3), f"command {n} got {(stdout, stderr, exit_code)!r}"
    assert [f[0] for f in files] == list(range(PARALLEL_TRAFFIC)), "not every file round trip answered"
    for n, sent, received, size in files:
        assert sent == received, f"file {n} came back different ({size} bytes): another request's answer?"


BURST_SIZE = 32  # what sandbox/parallel-creates makes, half for each owner


def sandbox_parallel_creates(r: dict[str, Any], work: str) -> None:
    """Every sandbox of the burst proves its identity by every path; a misrouting names both sandboxes.

    Its hostname and ``E2B_SANDBOX_ID`` come from the runtime, its marker from the create's
    environment (``/init``), its file from an upload, its metadata from the control plane: a
    request that reached another sandbox shows that sandbox's marker or id.
    """
    sandboxes = r["sandboxes"]
    assert len(sandboxes) == BURST_SIZE, f"{len(sandboxes)} sandboxes, not {BURST_SIZE}"
    ids = [s["id"] for s in sandboxes]
    assert len(set(ids)) == len(ids), "two creates answered with the same sandbox id"
    assert {s["owner"] for s in sandboxes} == {"first", "second"}
    by_marker = {s["marker"]: s for s in sandboxes}
    by_id = {s["id"]: s for s in sandboxes}
    problems = []
    for sandbox in sandboxes:
        me = f"{sandbox['id']} ({sandbox['owner']} owner)"
        if "error" in sandbox:
            problems.append(f"{me}: {sandbox['error'][:300]}")
            continue
        expected = {"hostname": sandbox["id"], "env_id": sandbox["id"]}
        expected |= dict.fromkeys(("env_marker", "file_marker", "read_marker", "metadata_marker"), sandbox["marker"])
        for what, want in expected.items():
            seen = sandbox["seen"][what]
            if seen == want:
                continue
            other = by_marker.get(seen) or by_id.get(seen)
            if other is not None:
                problems.append(f"{me}: {what} is that of {other['id']} ({other['owner']} owner)")
            else:
                problems.append(f"{me}: {what} is {seen!r}, expected {want!r}")
    assert not problems, f"{len(problems)} misrouted: " + "; ".join(problems[:8])


def sandbox_websocket(r: dict[str, Any], work: str) -> None:
    assert r == {
        "received": ["hello", [1, 2, 3], "bye"],
        "code": 4001,
        "reason": "asked to",
        "protocol": "echo.v1",
    }


# --- code interpreter (scenarios/interpreter) ---

PNG_MAGIC = "89504e470d0a1a0a"  # the eight bytes every PNG file starts with, as hex
INTERPRETER_NOT_FOUND = ("NotFoundException", "NotFoundError")
TIMEOUT_ERRORS = ("TimeoutException", "TimeoutError")
# What the clients raise for a non-2xx answer from the interpreter other than 502: 404 gives the
# not-found class, everything else the base class (a 502 would be the timeout class: not this).
REFUSED = ("SandboxException", "NotFoundException", "SandboxError", "NotFoundError")
UNSUPPORTED_LANGUAGES = ("r", "java", "javascript", "typescript")
CONTEXT_CWD = "/tmp"  # noqa: S108 - the folder the scenario gives its context, inside the sandbox
# How an answer may name a language: upstream runs TypeScript on its JavaScript kernel.
LANGUAGE_NAMES = {"typescript": ("typescript", "javascript")}


def _main_results(execution: dict[str, Any]) -> list[dict[str, Any]]:
    return [result for result in execution["results"] if result["is_main_result"] is True]


def _one_main_result(execution: dict[str, Any], text: str) -> None:
    main = _main_results(execution)
    assert [result["text"] for result in main] == [text], f"one main result {text!r} expected: {execution['results']}"
    assert execution["text"] == text, f"Execution.text is {execution['text']!r}, the main result's text is {text!r}"


def _printed_json(stdout: list[str], what: str) -> Any:
    try:
        return json.loads("".join(stdout))
    except ValueError:
        raise AssertionError(f"{what}: the code's JSON line is not in stdout {stdout!r}") from None


def interpreter_basic(r: dict[str, Any], work: str) -> None:
    first, second = r["first"], r["second"]
    assert first["error"] is None, first["error"]
    _one_main_result(first, "2")
    assert first["stdout"] == ["out\n"], first["stdout"]
    assert first["stderr"] == ["err\n"], first["stderr"]
    assert r["callbacks"] == {
        "stdout": ["out\n"],
        "stderr": ["err\n"],
        "results": [{"text": "2", "is_main_result": True}],
        "errors": [],
    }, "the callbacks see what the Execution collects, as it streams"
    assert second["error"] is None, second["error"]
    _one_main_result(second, "42")
    assert second["stdout"] == ["before\n"], second["stdout"]


def interpreter_dataframe(r: dict[str, Any], work: str) -> None:
    assert r["error"] is None, r["error"]
    main = _main_results(r)
    assert len(main) == 1, f"one main result expected: {r['results']}"
    frame = main[0]
    assert "<table" in (frame["html"] or ""), f"the frame's HTML has no table: {frame['html']!r}"
    assert "html" in frame["formats"], frame["formats"]
    # pandas' plain-text rendering starts with the column names
    assert (frame["text"] or "\n").splitlines()[0].split() == ["a", "b"], frame["text"]


def interpreter_matplotlib(r: dict[str, Any], work: str) -> None:
    assert r["error"] is None, r["error"]
    images = [result for result in r["results"] if result["png_head"] is not None]
    assert len(images) == 1, f"one PNG result expected: {r['results']}"
    image = images[0]
    assert image["png_head"] == PNG_MAGIC, f"the png field does not decode to a PNG: {image['png_head']}"
    assert image["is_main_result"] is False, "plt.show() displays the figure; the cell itself has no value"
    chart = image["chart"]
    assert chart is not None, "no chart: the template's chart extraction reads every figure it can"
    if chart["class"] is not None:  # the Python clients parse the chart into typed classes
        assert chart["class"] == "LineChart", chart["class"]
    assert chart["type"] == "line", chart["type"]
    assert chart["title"] == "Squares", chart["title"]
    assert (chart["x_label"], chart["y_label"]) == ("x", "y"), chart
    assert [element["label"] for element in chart["elements"]] == ["squares"], chart["elements"]
    points = [[float(x), float(y)] for x, y in chart["elements"][0]["points"]]
    expected = [[1.0, 1.0], [2.0, 4.0], [3.0, 9.0]]
    assert len(points) == len(expected), points
    assert all(math.isclose(a, b) for p, q in zip(points, expected, strict=True) for a, b in zip(p, q, strict=True)), (
        points
    )


def interpreter_display(r: dict[str, Any], work: str) -> None:
    assert r["error"] is None, r["error"]
    results = r["results"]
    assert len(results) == 3, f"two displays and the cell's value expected: {results}"
    html, markdown, main = results
    assert (html["html"], html["is_main_result"]) == ("<b>hi</b>", False), html
    assert (markdown["markdown"], markdown["is_main_result"]) == ("**md**", False), markdown
    assert (main["text"], main["is_main_result"]) == ("42", True), main
    assert r["text"] == "42", r["text"]


def interpreter_traceback(r: dict[str, Any], work: str) -> None:
    assert r["raised"] is None, f"run_code raised {r['raised']}: a kernel error belongs in Execution.error"
    execution = r["execution"]
    error = execution["error"]
    assert error is not None, "no Execution.error for 1/0"
    assert error["name"] == "ZeroDivisionError", error
    assert "division by zero" in error["value"], error
    assert "ZeroDivisionError" in error["traceback"], error["traceback"]
    assert r["on_error"] == ["ZeroDivisionError"], "on_error is called once with the error"
    assert _main_results(execution) == [], execution["results"]


def interpreter_execution_count(r: dict[str, Any], work: str) -> None:
    counts = r["counts"]
    assert len(counts) == 3, counts
    assert all(isinstance(count, int) and not isinstance(count, bool) for count in counts), counts
    assert counts[0] >= 1, counts
    assert counts == [counts[0], counts[0] + 1, counts[0] + 2], f"each run on a context counts one more: {counts}"


def interpreter_contexts(r: dict[str, Any], work: str) -> None:
    assert r["created"] == {"language": "python", "cwd": CONTEXT_CWD, "has_id": True}, r["created"]
    assert r["cwd_stdout"] == [f"{CONTEXT_CWD}\n"], f"the context does not run in its folder: {r['cwd_stdout']}"
    assert r["persisted"] == "42", "state persists between runs on a context"
    assert r["listed"] == [{"language": "python", "cwd": CONTEXT_CWD}], f"the context is listed once: {r['listed']}"
    error = r["after_restart_error"]
    assert error is not None, "x survived the restart"
    assert error["name"] == "NameError", error
    assert r["listed_after_remove"] is False, "a removed context is still listed"
    assert r["run_after_remove"] in INTERPRETER_NOT_FOUND, f"running on a removed context: {r['run_after_remove']}"


def interpreter_env_vars(r: dict[str, Any], work: str) -> None:
    sandbox_only = {"RUN_VAR": None, "GLOBAL_VAR": "g"}
    assert _printed_json(r["before"], "before") == sandbox_only, "the sandbox's variables reach the kernel"
    during = _printed_json(r["during"], "with envs")
    assert during == {"RUN_VAR": "r", "GLOBAL_VAR": "override"}, f"a run's envs apply to it: {during}"
    after = _printed_json(r["after"], "after")
    assert after == sandbox_only, f"a run's envs are undone after it, the sandbox's values restored: {after}"


def interpreter_timeout(r: dict[str, Any], work: str) -> None:
    assert r["raised"] in TIMEOUT_ERRORS, f"a 3 s execution timeout on a 60 s sleep raised {r['raised']!r}"
    assert r["message"].startswith("Execution timed out"), f"not the execution timeout: {r['message']!r}"
    assert r["after_error"] is None, r["after_error"]
    assert r["after"] == "2", r["after"]
    # Executions on a context are serialized: had the server not interrupted the abandoned cell, the
    # next run would have waited for it to finish, and it would have set finished_sleeping.
    assert r["sleep_completed"] == "False", "the abandoned cell ran to its end: the server did not interrupt it"


def interpreter_concurrent(r: dict[str, Any], work: str) -> None:
    runs = r["runs"]
    assert set(runs) == {"a", "b"}, runs
    spans = {}
    for who, run in runs.items():
        assert run["error"] is None, (who, run["error"])
        printed = _printed_json(run["stdout"], who)
        assert printed["who"] == who, printed
        spans[who] = (float(printed["start"]), float(printed["end"]))
    (a_start, a_end), (b_start, b_end) = spans["a"], spans["b"]
    # Kernel clock, one sandbox: whether the two contexts really ran at the same time.
    assert a_start < b_end, f"a started after b had finished: the two contexts did not run together: {spans}"
    assert b_start < a_end, f"b started after a had finished: the two contexts did not run together: {spans}"


def interpreter_languages(r: dict[str, Any], work: str) -> None:
    bash = r["bash"]
    assert bash["error"] is None, bash["error"]
    assert bash["stdout"] == ["hi\n"], bash["stdout"]
    assert set(r["unsupported"]) == set(UNSUPPORTED_LANGUAGES), r["unsupported"]
    for language, outcome in r["unsupported"].items():
        raised, message = outcome["raised"], outcome["message"]
        assert raised is not None, f"{language}: run_code succeeded, but the template has no {language} kernel"
        assert raised in REFUSED, f"{language}: raised {raised} ({message!r}), not the client's refusal"
        # The status text is the server's own choice (upstream: 500 from the failed kernel start);
        # only the form is checked. The JS client reports "<status> <statusText>" without the
        # body for anything but 404/502, so only the other messages can name the language.
        if raised == "SandboxError":
            assert re.match(r"[45]\d\d\b", message), f"{language}: {message!r}"
            continue
        if raised == "SandboxException":
            assert re.match(r"[45]\d\d: ", message), f"{language}: {message!r}"
        names = LANGUAGE_NAMES.get(language, (language,))
        assert any(re.search(rf"\b{re.escape(name)}\b", message, re.IGNORECASE) for name in names), (
            f"{language}: the answer does not name the language: {message!r}"
        )


def interpreter_private_traffic(r: dict[str, Any], work: str) -> None:
    assert r["has_token"] is True, "create answers a trafficAccessToken when public traffic is off"
    assert r["without"] == 403, f"port {INTERPRETER_PORT} without the traffic token answered {r['without']}"
    assert r["with"] == 200, f"port {INTERPRETER_PORT} with the traffic token answered {r['with']}"
    try:
        body = json.loads(r["with_body"])
    except ValueError:
        raise AssertionError(f"/health answered {r['with_body']!r}, not JSON") from None
    assert body == "OK", body
    assert r["run"] == "2", "run_code sends the traffic token itself"


NETWORK_CREATED = {
    "internet": False,
    "allow_out": ["10.91.0.0/16"],
    "deny_out": ["10.92.0.0/16"],
    "public": False,
    "mask": "${PORT}-masked.example",
}


def sandbox_network_settings(r: dict[str, Any], work: str) -> None:
    assert r["created"] == NETWORK_CREATED, f"get_info after create reported {r['created']}"
    assert r["served"] is True, "the server inside never answered through the edge with the traffic token"
    headers = r["headers"]
    assert headers.get("host") == "8001-masked.example", f"the server inside saw Host {headers.get('host')!r}"
    assert "e2b-traffic-access-token" not in headers, "the edge passed the traffic token into the sandbox"
    assert r["without_token"] == 403, f"a private sandbox's port answered {r['without_token']} without the token"
    # update_network replaces the egress lists: the deny list it left out is cleared.
    expected = {**NETWORK_CREATED, "internet": True, "allow_out": ["10.93.0.0/16"], "deny_out": []}
    assert r["updated"] == expected, f"get_info after update_network reported {r['updated']}"


def sandbox_on_timeout(r: dict[str, Any], work: str) -> None:
    assert r["lifecycle"] == {"on_timeout": "pause", "auto_resume": False}, f"lifecycle reported {r['lifecycle']}"
    assert r["memory_paused"] is True, "on_timeout pause: the sandbox was not paused at its timeout"
    assert r["file"] == "kept", "files survive the timeout's pause"
    assert r["memory_process_kept"] is True, "a memory pause keeps processes"
    assert r["remaining_ok"] is True, "connect(timeout=60) did not set the sandbox's end to about 60 s away"
    assert r["disk_paused"] is True, "keep_memory False: the sandbox was not paused at its timeout"
    assert r["disk_process_gone"] is True, "a filesystem-only pause resumes with a fresh boot: no old processes"
    assert r["woken_paused"] == "paused"
    assert r["woken_output"] == "woken\n", "auto_resume: traffic to the paused sandbox did not resume it"
    assert r["woken_state"] == "running"


def sandbox_owners_every_operation(r: dict[str, Any], work: str) -> None:
    answers = r["answers"]
    for name in ("get_info", "set_timeout", "update_network", "get_metrics", "pause", "create_snapshot", "connect"):
        assert answers[name] in NOT_FOUND, f"{name} with another owner's key answered {answers[name]!r}, not not-found"
    for name in ("kill", "delete_snapshot"):
        assert answers[name] is False, f"{name} with another owner's key answered {answers[name]!r}, not False"
    assert r["listed_for_other"] is False, "another owner's list shows the sandbox"
    assert r["snapshots_for_other"] == [], "another owner's snapshot list shows this owner's snapshot"
    assert r["snapshot_kept"] is True, "this owner's snapshot is gone"
    assert r["still_running"] is True, "this owner's sandbox is no longer running"
    assert r["timeout_kept"] is True, "another owner's set_timeout changed this owner's sandbox"


def sandbox_users_and_tokens(r: dict[str, Any], work: str) -> None:
    assert r["as_root"] == {
        "make_dir": True,
        "write": "/root/made/f.txt",
        "read": "secret",
        "list": ["f.txt"],
        "stat": 6,
        "rename": "/root/made/g.txt",
        "removed": True,
    }, f"as root: {r['as_root']}"
    refused = {name: error for name, error in r["as_user"].items() if error is None}
    assert not refused, f"the default user was allowed into /root: {sorted(refused)}"
    assert r["owners"] == ["user", "root"], f"files written as the default user and as root are owned by {r['owners']}"
    assert r["whoami"] == ["root\n", "user\n"]
    assert r["secure_without_token"] == dict.fromkeys(("download", "upload", "list", "stat"), 401), (
        f"a secure sandbox's envd answered without its token: {r['secure_without_token']}"
    )
    assert r["public_without_token"] == dict.fromkeys(("download", "upload", "list", "stat"), 200), (
        f"a sandbox created with secure=False refused requests without a token: {r['public_without_token']}"
    )
