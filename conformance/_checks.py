"""What each scenario must have observed: one check per scenario, shared by every client flavour.

A check receives the scenario's JSON result and the working folder the scenario used, and raises
``AssertionError`` with a message saying what differed. This module holds the agent scenarios'
checks (``envd_*``, ``scenarios/envd``) and what the families share; ``_checks_sandbox`` has the
control-plane ones (``sandbox_*``, ``scenarios/sandbox``) and ``_checks_interpreter`` the
code-interpreter ones (``interpreter_*``, ``scenarios/interpreter``).
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__: list[str] = []  # the checks are reached through ``_cases.CASES``

SANDBOX_HOME = "/home/user"
NOT_FOUND = ("SandboxNotFoundException", "NotFoundException", "SandboxNotFoundError", "NotFoundError")
NOT_FOUND_FILE = ("FileNotFoundException", "FileNotFoundError")


def envd_foreground(r: dict[str, Any], work: str) -> None:
    # The command ran in the cwd it asked for, a folder that is not the user's home.
    assert r == {"stdout": f"hi from {work}/elsewhere\n", "stderr": "oops\n", "exit_code": 0}


def envd_exit_code(r: dict[str, Any], work: str) -> None:
    assert r == {"raised": True, "exit_code": 3, "stdout": "partial\n", "stderr": "failing\n"}


# The first release of each client that shows a symlink as one (it reads EntryInfo.is_symlink, the
# newest contract's field); an older client shows the target's type, as every envd has sent it.
READS_IS_SYMLINK = {"python": (2, 55)}  # npm e2b, up to 2.51 at least, reads no isSymlink


def envd_symlink(r: dict[str, Any], work: str) -> None:
    since = READS_IS_SYMLINK.get(r["client"])
    marked = since is not None and tuple(int(p) for p in r["client_version"].split(".")[:2]) >= since
    target = f"{work}/links/file.txt"
    link = {"type": "symlink" if marked else "file", "target": target}
    assert r["info"] == link, f"get_info of a symlink to a file gave {r['info']!r}, not {link!r}"
    assert r["listed"]["to-file"] == link, f"list showed the symlink as {r['listed']['to-file']!r}, not {link!r}"
    plain = r["listed"]["file.txt"]
    assert plain == {"type": "file", "target": None}, f"a plain file listed as {plain!r}"
    # A dangling link has no target type (every client leaves an entry of no type out of a listing);
    # its own path stands for the target.
    assert "dangling" not in r["listed"], f"a dangling symlink listed as {r['listed']['dangling']!r}"
    dangling = {"type": "symlink" if marked else None, "target": f"{work}/links/dangling"}
    got = r["dangling_info"]
    assert got == dangling, f"get_info of a dangling symlink gave {got!r}, not {dangling!r}"


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


TIMEOUTS = ("TimeoutException", "TimeoutError")


def envd_timeout(r: dict[str, Any], work: str) -> None:
    assert r["raised"] in TIMEOUTS, r
    assert r["elapsed"] < 1.9, f"the deadline (1 s) ends the stream, well before the command's 2 s: {r}"
    assert r["process_survived"] is False, "the deadline kills the process too: it wrote its marker at 2 s"


def envd_connect_timeout(r: dict[str, Any], work: str) -> None:
    assert r["raised"] in TIMEOUTS, r
    assert r["elapsed"] < 1.9, f"Connect's deadline (1 s) ends its stream before the command's 2 s: {r}"
    assert r["listed_after"] is True, "Connect's deadline leaves the process running"
    assert r["process_finished"] is True, "the process outlived Connect's deadline and wrote its marker"


def envd_user(r: dict[str, Any], work: str) -> None:
    assert r["lines"] == ["root", "/root", "root", "true"]


def envd_pty(r: dict[str, Any], work: str) -> None:
    before, marker, after = r["output"].partition("FIRST-2")
    assert marker, f"no answer to the first input: {r['output']!r}"
    assert "30 100" in before, f"the terminal did not start with the size asked for (30 rows, 100 cols): {before!r}"
    assert "MARK-42" in after
    assert "40 120" in after, f"the resize did not reach the terminal: {after!r}"
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


def envd_size_classes(r: dict[str, Any], work: str) -> None:
    for f in r["files"]:
        what = f"a file of {f['size']} bytes ({work}/sizes/{f['size']}.bin)"
        assert f["stored"] == f["written"], f"{what}: the sandbox holds other bytes than were uploaded"
        assert f["read"] == f["written"], f"{what}: the download differs from the upload ({f['read_size']} bytes)"
        assert f["read_size"] == f["info_size"] == f["size"], f"{what}: read {f['read_size']}, stat {f['info_size']}"
    assert r["empty_text"] == "", f"an empty text file read back as {r['empty_text']!r}"
    for output in r["outputs"]:
        size = output["size"]
        assert output["stdout"] == [size, ["a"] if size else []], f"stdout of {size} bytes came as {output['stdout']}"
        assert output["stderr"] == [size, ["b"] if size else []], f"stderr of {size} bytes came as {output['stderr']}"
    count, digest = r["seq"]
    expected = "".join(f"{n}\n" for n in range(1, count + 1)).encode()
    assert digest == hashlib.sha256(expected).hexdigest(), f"seq 1 {count}: stdout lost, duplicated or reordered data"


# The client's error class per kind of refusal, Python name and JS name.
_ERROR_CLASSES = {
    "file-not-found": ("FileNotFoundException", "FileNotFoundError"),
    "not-found": ("NotFoundException", "NotFoundError"),
    "invalid-argument": ("InvalidArgumentException", "InvalidArgumentError"),
    "sandbox": ("SandboxException", "SandboxError"),
    "exit": ("CommandExitException", "CommandExitError"),
}


def envd_error_messages(r: dict[str, Any], work: str) -> None:
    # Each probe: the client's error class and a text of the agent's (docs/PROTOCOL-NOTES.md,
    # "Errors") that the message the client shows must contain; None where the text is not fixed.
    folder, plain = r["folder"], f"{r['folder']}/plain.txt"
    expected: dict[str, tuple[str, str | None]] = {
        "read_missing": ("file-not-found", f"path '{folder}/missing.txt' does not exist"),
        "info_missing": ("file-not-found", f"file not found: lstat {folder}/missing.txt"),
        "list_missing": ("file-not-found", None),
        "list_file": ("invalid-argument", None),
        "write_under_file": ("sandbox", f"error ensuring directories: path is a file: {plain}"),
        "make_dir_under_file": ("sandbox", f"path is a file: {plain}"),
        "rename_missing": ("file-not-found", None),
        "cwd_missing": ("invalid-argument", f"cwd '{folder}/no-such-dir' does not exist"),
        "connect_unknown": ("not-found", "process with pid 999999 not found"),
        "unknown_command": ("exit", None),  # Python's message quotes stderr, JS's is "exit status 127"
    }
    wrong = []
    for probe, (kind, text) in expected.items():
        name, message, *_ = r[probe]
        if name not in _ERROR_CLASSES[kind]:
            wrong.append(f"{probe}: raised {name} ({message!r}), not {' / '.join(_ERROR_CLASSES[kind])}")
        elif text is not None and text not in message:
            wrong.append(f"{probe}: the message {message!r} does not contain {text!r}")
    exit_code, stderr = r["unknown_command"][2:]
    if exit_code != 127 or "no-such-command-e2b: command not found" not in (stderr or ""):
        wrong.append(f"unknown_command: exit code {exit_code}, stderr {stderr!r} (127 and the shell's message)")
    assert not wrong, "; ".join(wrong)


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
    if "stopped_error" in r:  # the polling watcher: stopping it removed it, and only it
        assert r["stopped_error"] == "NotFoundException", f"{watcher}: after stop(), its events: {r['stopped_error']}"
        assert ["create", "after.txt"] in r["other_events"], f"another watcher stopped too: {r['other_events']}"


def envd_watch_options(r: dict[str, Any], work: str) -> None:
    """``include_entry`` attaches entries only when asked; a watch's user resolves its relative path."""
    root = f"{work}/watched-options"
    types = {"e.txt": "file", "d": "dir"}
    for key in ("with_entry", "without_entry"):
        kinds = {(kind, name) for kind, name, _ in r[key]}
        assert {("create", "e.txt"), ("write", "e.txt"), ("create", "d")} <= kinds, f"{key}: {r[key]}"
    assert all(entry is None for *_, entry in r["without_entry"]), f"entries not asked for: {r['without_entry']}"
    for kind, name, entry in r["with_entry"]:
        if kind in ("remove", "rename"):
            assert entry is None, f"{kind} {name} carries an entry: {entry}"
        elif name in types:  # the entry still exists: create, write and chmod events carry it
            wanted = {"name": name, "type": types[name], "path": f"{root}/{name}"}
            assert entry is not None, f"{kind} {name} carries no entry"
            assert {k: entry[k] for k in wanted} == wanted, f"{kind} {name}: {entry}"
    sizes = [entry["size"] for _, name, entry in r["with_entry"] if name == "e.txt"]
    assert sizes[-1] == 5, f"the last entry of e.txt has its final size: {sizes}"
    # The folder is in root's home only: as user the relative path names a missing folder (a bare
    # agent on a host without a user named user refuses the user instead).
    refused = NOT_FOUND_FILE if work == SANDBOX_HOME else ("AuthenticationException", "AuthenticationError")
    assert r["as_user_error"] in refused, f"watching ~user/<root's folder> as user: {r['as_user_error']}"
    assert ["create", "r.txt"] in r["as_root_events"], f"as root: {r['as_root_events']}"


def envd_watch_deadline(r: dict[str, Any], work: str) -> None:
    assert r["ended"][:1] == ["TimeoutException"], f"the watch did not end with its deadline: {r}"
    assert r["elapsed"] < 2.5, f"the deadline was 1 s: {r}"


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


def envd_stream_input(r: dict[str, Any], work: str) -> None:
    assert r["stdout"] == "first line\nsecond line\nthird", f"cat echoed {r['stdout']!r} of the streamed stdin"
    assert r["exit_code"] == 0, f"cat ended with {r['exit_code']} ({r['stderr']!r}) after close_stdin"
