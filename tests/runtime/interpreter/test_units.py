"""The interpreter's pure parts as tables (languages, env statements, message mapping), the
envd client against nothing, and import boundaries (the agent never loads jupyter_client)."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
import types
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from runtime.interpreter import _languages, _messages
from runtime.interpreter._contexts import EnvdClient
from runtime.interpreter._kernels import STARTUP_FILE, kernel_argv
from runtime.interpreter._messages import Tracker

# --- languages -------------------------------------------------------------------------------

# request language → normalized
NORMALIZED = [
    (None, "python"),
    ("", "python"),
    ("  ", "python"),
    ("Python", "python"),
    (" BASH\n", "bash"),
    ("js", "javascript"),
    ("JS", "javascript"),
    ("ts", "typescript"),
    ("javascript", "javascript"),
    ("R", "r"),
    ("deno", "deno"),
]


@pytest.mark.parametrize(("given", "expected"), NORMALIZED)
def test_normalize_language(given: str | None, expected: str) -> None:
    assert _languages.normalize_language(given) == expected


def test_supported_languages() -> None:
    assert _languages.SUPPORTED_LANGUAGES == ("python", "javascript", "typescript", "r", "java", "bash")
    assert _languages.kind_of("typescript") == _languages.kind_of("javascript") == "deno"
    assert _languages.STARTUP_LANGUAGES == ("python", "javascript")
    for language in ("deno", "cobol", ""):
        assert not _languages.is_supported(language)
    assert _languages.unsupported_message("cobol") == (
        "Failed to create context: the 'cobol' language is not supported by this template "
        "(supported: python, javascript, typescript, r, java, bash)"
    )


# language, env → (usable names, skipped names)
SPLITS = [
    ("python", {"A": "1", "lower.dots-ok": "2", "A=B": "3", "": "4", "NUL": "a\x00b"}, ["A", "lower.dots-ok"]),
    ("bash", {"A_1": "1", "_x": "2", "1A": "3", "A-B": "4", "A.B": "5", "ok": "x\ny"}, ["A_1", "_x", "ok"]),
    ("javascript", {"A": "1", "lower.dots-ok": "2", "A=B": "3", "": "4"}, ["A", "lower.dots-ok"]),
    ("r", {"A B": "1", "A=B": "3", "NUL": "a\x00b"}, ["A B"]),
    ("java", {"a.b": "1", "": "2"}, ["a.b"]),
]


@pytest.mark.parametrize(("language", "env", "usable"), SPLITS)
def test_split_env(language: str, env: dict[str, str], usable: list[str]) -> None:
    kept, skipped = _languages.split_env(language, env)
    assert list(kept) == usable
    assert sorted(skipped) == sorted(set(env) - set(usable))


# Values that break naive quoting.
TRICKY = ["plain", "", "it's", 'say "hi"', "a\\b", "$HOME `id` $(id)", "line1\nline2\r\ttab", "ünï € 😀", "x\x7fy"]


class _FakeOs(types.SimpleNamespace):
    environ: dict[str, str]


def _run_python(code: str, environ: dict[str, str]) -> dict[str, str]:
    fake = _FakeOs(environ=environ)
    namespace: dict[str, Any] = {"__builtins__": {"__import__": lambda name, *args: fake}}
    exec(code, namespace)
    assert set(namespace) == {"__builtins__"}  # no names left in the user's namespace
    return fake.environ


def test_python_statements_round_trip() -> None:
    env = {f"V{index}": value for index, value in enumerate(TRICKY)}
    assert _run_python(_languages.set_code("python", env), {"KEEP": "1"}) == {"KEEP": "1", **env}
    restored = _run_python(
        _languages.restore_code("python", ["V0", "V1", "V2"], {"V0": "global"}, {"V1": "launch"}),
        {"V0": "run", "V1": "run", "V2": "run", "KEEP": "1"},
    )
    assert restored == {"V0": "global", "V1": "launch", "KEEP": "1"}


def _run_bash(code: str, names: list[str]) -> dict[str, str | None]:
    probe = "; ".join(f'printf "%s\\0" "${{{name}-<unset>}}"' for name in names)
    out = subprocess.run(["bash", "-c", f"{code}\n{probe}"], capture_output=True, check=True).stdout.decode()
    values = out.split("\0")[:-1]
    return {name: None if value == "<unset>" else value for name, value in zip(names, values, strict=True)}


def test_bash_statements_round_trip() -> None:
    env = {f"V{index}": value for index, value in enumerate(TRICKY)}
    code = _languages.set_code("bash", env)
    assert "\n" not in code  # one line: bash_kernel waits for a prompt after each line
    assert _run_bash(code, list(env)) == env
    restore = _languages.restore_code("bash", ["V0", "V1", "V2"], {"V0": "global"}, {"V1": "launch"})
    assert _run_bash(f"{code}; {restore}", ["V0", "V1", "V2"]) == {"V0": "global", "V1": "launch", "V2": None}


def _run_node(code: str, names: list[str], environ: dict[str, str]) -> dict[str, str | None]:
    """``code`` run by node against a stand-in for Deno.env holding ``environ``; what ``names`` hold after."""
    shim = (
        f"const store = new Map(Object.entries({json.dumps(environ)}));"
        "globalThis.Deno = { env: { set: (k, v) => store.set(k, v), delete: (k) => store.delete(k) } };"
    )
    probe = f"process.stdout.write(JSON.stringify({json.dumps(names)}.map((n) => store.get(n) ?? null)))"
    out = subprocess.run(["node", "-e", f"{shim}\n{code}\n{probe}"], capture_output=True, check=True).stdout
    return dict(zip(names, json.loads(out), strict=True))


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed (the machine's Node 20)")
def test_deno_statements_round_trip() -> None:
    env = {f"V{index}": value for index, value in enumerate(TRICKY)} | {"odd.name-1": "x"}
    assert _run_node(_languages.set_code("typescript", env), list(env), {}) == env
    restore = _languages.restore_code("javascript", ["V0", "V1", "V2"], {"V0": "global"}, {"V1": "launch"})
    after = _run_node(restore, ["V0", "V1", "V2"], {"V0": "run", "V1": "run", "V2": "run"})
    assert after == {"V0": "global", "V1": "launch", "V2": None}


JSHELL = shutil.which("jshell")


@pytest.mark.skipif(JSHELL is None, reason="no JDK here (jshell); code-interpreter-v1 has its own")
def test_java_statements_round_trip(tmp_path: Path) -> None:
    env = {f"V{index}": value for index, value in enumerate(TRICKY)} | {"V_REMOVED": "x"}
    statements = _languages.set_code("java", env) + "\n" + _languages.restore_code("java", ["V_REMOVED"], {}, {})
    probe = "".join(
        f'System.out.print(java.util.Objects.requireNonNullElse(System.getenv("{name}"), "<unset>") + "\\0");'
        for name in env
    )
    script = tmp_path / "env.jsh"
    script.write_text(f"{statements}\n{probe}\n/exit\n", encoding="utf-8")
    opens = ["-J--add-opens=java.base/java.util=ALL-UNNAMED", "-R--add-opens=java.base/java.util=ALL-UNNAMED"]
    done = subprocess.run(
        [str(JSHELL), "-q", "--execution", "local", *opens, str(script)], capture_output=True, timeout=120, check=True
    )
    values = done.stdout.decode("utf-8").split("\0")[:-1]
    assert dict(zip(env, values, strict=True)) == {**env, "V_REMOVED": "<unset>"}
    assert "e2b" not in done.stderr.decode(), done.stderr


def test_r_string_literals() -> None:
    # R is not on the host: the literal's form, which R reads back as the same characters.
    assert _languages._r_string('a"b\\c') == '"a\\"b\\\\c"'
    assert _languages._r_string("x\ny\x7f€😀") == '"x\\u{000a}y\\u{007f}\\u{20ac}\\U{0001f600}"'
    assert _languages.set_code("r", {"A B": "v"}) == 'invisible(do.call(Sys.setenv, as.list(c("A B" = "v"))))'
    assert _languages.restore_code("r", ["A"], {}, {}) == 'invisible(Sys.unsetenv("A"))'


def test_no_statements_for_nothing() -> None:
    assert _languages.set_code("python", {}) == ""
    assert _languages.restore_code("bash", [], {"A": "1"}, {}) == ""


# --- messages --------------------------------------------------------------------------------

# text/plain as the kernel sends it → the result's text (upstream strips single quotes only)
PLAIN_TEXT = [
    ("'abc'", "abc"),
    ("''", ""),
    ("'", "'"),
    ('"it\'s"', '"it\'s"'),
    ("42", "42"),
    ("'a' + 'b'", "a' + 'b"),
    ("", ""),
]


@pytest.mark.parametrize(("given", "expected"), PLAIN_TEXT)
def test_plain_text(given: str, expected: str) -> None:
    assert _messages.plain_text(given) == expected


def test_result_line_maps_every_mime_type() -> None:
    bundle: dict[str, Any] = {mime: f"<{name}>" for mime, name in _messages.MIME_FIELDS}
    bundle |= {"application/json": {"k": 1}, "e2b/data": {"c": [1]}, "e2b/chart": {"type": "bar"}}
    bundle |= {"application/vnd.custom+json": {"x": 1}, "text/csv": "a,b"}
    line = _messages.result_line(bundle, is_main_result=False)
    assert line == {
        "type": "result",
        "text": "<text>",
        "html": "<html>",
        "markdown": "<markdown>",
        "svg": "<svg>",
        "png": "<png>",
        "jpeg": "<jpeg>",
        "pdf": "<pdf>",
        "latex": "<latex>",
        "json": {"k": 1},
        "javascript": "<javascript>",
        "data": {"c": [1]},
        "chart": {"type": "bar"},
        "extra": {"application/vnd.custom+json": {"x": 1}, "text/csv": "a,b"},
        "is_main_result": False,
    }


def test_result_line_leaves_out_what_is_missing() -> None:
    line = _messages.result_line({"image/png": "iVBOR", "text/html": None}, is_main_result=True)
    assert line == {"type": "result", "png": "iVBOR", "is_main_result": True}


# header date → timestamp
TIMESTAMPS = [
    (datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), "2024-05-01T12:00:00.123456Z"),
    (datetime(2024, 5, 1, 14, 0, 0, tzinfo=timezone(timedelta(hours=2))), "2024-05-01T12:00:00Z"),
    (datetime(2024, 5, 1, 12, 0, 0), "2024-05-01T12:00:00Z"),
    ("2024-05-01T12:00:00.5Z", "2024-05-01T12:00:00.5Z"),
]


@pytest.mark.parametrize(("date", "expected"), TIMESTAMPS)
def test_timestamp(date: object, expected: str) -> None:
    assert _messages.timestamp(date) == expected


def test_timestamp_without_a_date_is_now() -> None:
    stamp = datetime.fromisoformat(_messages.timestamp(None).replace("Z", "+00:00"))
    assert abs(stamp - datetime.now(UTC)) < timedelta(minutes=1)


def test_encode() -> None:
    assert _messages.encode({"type": "stdout", "text": "a\nb", "timestamp": "t"}) == (
        b'{"type":"stdout","text":"a\\nb","timestamp":"t"}\n'
    )
    line = {"type": "result", "json": {"v": [math.nan, math.inf, 1.5]}, "is_main_result": True}
    assert json.loads(_messages.encode(line)) == {
        "type": "result",
        "json": {"v": [None, None, 1.5]},
        "is_main_result": True,
    }
    assert _messages.encode({"type": "stdout", "text": "ü"}).decode() == '{"type":"stdout","text":"ü"}\n'


def _message(kind: str, content: dict[str, Any], date: object = None) -> dict[str, Any]:
    return {"msg_type": kind, "content": content, "header": {"date": date}, "parent_header": {"msg_id": "m"}}


NOW = datetime(2024, 1, 1, tzinfo=UTC)
TRACEBACK = ["-----", "ValueError   Traceback (most recent call last)", "Cell In[3], line 1\n----> 1 boom()\n"]

# iopub message → lines
IOPUB = [
    (_message("status", {"execution_state": "busy"}), []),
    (
        _message("execute_input", {"code": "1", "execution_count": 3}),
        [{"type": "number_of_executions", "execution_count": 3}],
    ),
    (
        _message("stream", {"name": "stdout", "text": "hi\n"}, NOW),
        [{"type": "stdout", "text": "hi\n", "timestamp": "2024-01-01T00:00:00Z"}],
    ),
    (
        _message("stream", {"name": "stderr", "text": "oops\n"}, NOW),
        [{"type": "stderr", "text": "oops\n", "timestamp": "2024-01-01T00:00:00Z"}],
    ),
    (
        _message("execute_result", {"data": {"text/plain": "'s'"}, "execution_count": 3}),
        [{"type": "result", "text": "s", "is_main_result": True}],
    ),
    (
        _message("display_data", {"data": {"text/html": "<b/>"}, "metadata": {}}),
        [{"type": "result", "html": "<b/>", "is_main_result": False}],
    ),
    (
        _message("error", {"ename": "ValueError", "evalue": "bad", "traceback": TRACEBACK}),
        [{"type": "error", "name": "ValueError", "value": "bad", "traceback": "\n".join(TRACEBACK)}],
    ),
    (_message("update_display_data", {"data": {"text/plain": "x"}}), []),
    (_message("clear_output", {"wait": False}), []),
    (_message("comm_open", {}), []),
]


@pytest.mark.parametrize(("message", "lines"), IOPUB)
def test_iopub_lines(message: dict[str, Any], lines: list[dict[str, Any]]) -> None:
    assert Tracker().iopub(message) == lines


def _reply(status: str, **content: Any) -> dict[str, Any]:
    return _message("execute_reply", {"status": status, **content})


def test_tracker_finishes_on_idle_and_reply_in_either_order() -> None:
    for order in ("reply-first", "idle-first"):
        tracker = Tracker()
        events = [_reply("ok"), _message("status", {"execution_state": "idle"})]
        if order == "idle-first":
            events.reverse()
        for event in events:
            assert not tracker.finished
            feed = tracker.shell if event["msg_type"] == "execute_reply" else tracker.iopub
            assert feed(event) == []
        assert tracker.finished
        assert tracker.closing_lines() == []


def test_tracker_writes_one_error() -> None:
    tracker = Tracker()
    error = {"ename": "E", "evalue": "v", "traceback": ["t"]}
    assert len(tracker.iopub(_message("error", error))) == 1
    assert tracker.iopub(_message("error", error)) == []
    tracker.shell(_reply("error", **error))
    assert tracker.closing_lines() == []


def test_tracker_error_only_in_the_reply() -> None:
    tracker = Tracker()
    tracker.shell(_reply("error", ename="", evalue="2", traceback=[]))
    assert tracker.closing_lines() == [{"type": "error", "name": "", "value": "2", "traceback": ""}]
    assert tracker.closing_lines() == []


@pytest.mark.parametrize("status", ["abort", "aborted"])
def test_tracker_aborted(status: str) -> None:
    tracker = Tracker()
    tracker.shell(_reply(status))
    assert tracker.closing_lines() == [_messages.execution_aborted()]


def test_server_made_errors() -> None:
    assert _messages.context_restarting() == {
        "type": "error",
        "name": "ContextRestarting",
        "value": "Context was restarted",
        "traceback": "",
    }
    assert _messages.unexpected_end("gone")["name"] == "UnexpectedEndOfExecution"
    assert _messages.execution_aborted()["name"] == "ExecutionAborted"


# --- kernels, envd, imports ------------------------------------------------------------------


def test_kernel_command_lines() -> None:
    python = kernel_argv("python", "/k/bin/python")
    assert python[:5] == ["/k/bin/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert f"--IPKernelApp.exec_files={STARTUP_FILE}" in python
    assert STARTUP_FILE.is_file()
    assert kernel_argv("bash", "/k/bin/python") == ["/k/bin/python", "-m", "bash_kernel", "-f", "{connection_file}"]
    assert kernel_argv("deno", "/k/bin/python") == ["/k/bin/deno", "jupyter", "--kernel", "--conn", "{connection_file}"]
    java = kernel_argv("java", "/k/bin/python")
    assert java[-3:] == ["-jar", "/k/share/jupyter/kernels/java/jjava.jar", "{connection_file}"]
    assert "java.base/java.util=ALL-UNNAMED" in java, "the environment statements reach System.getenv's map"
    assert kernel_argv("r", "/k/bin/python")[-3:] == ["IRkernel::main()", "--args", "{connection_file}"]
    with pytest.raises(ValueError, match="javascript"):
        kernel_argv("javascript", "/k/bin/python")  # a language, not a kind


def test_unreachable_envd_is_not_an_error() -> None:
    async def fetch() -> dict[str, str] | None:
        client = EnvdClient("http://127.0.0.1:9")
        try:
            return await client.fetch("token")
        finally:
            await client.aclose()

    assert asyncio.run(fetch()) is None


def test_agent_does_not_load_jupyter() -> None:
    probe = (
        "import sys, runtime, runtime.agent._app, runtime.agent._server, runtime.interpreter\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jupyter_client', 'zmq', 'ipykernel')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # importing runtime.interpreter itself is lazy, too


def test_public_surface() -> None:
    from runtime import interpreter

    assert interpreter.__all__ == ["SUPPORTED_LANGUAGES", "Settings", "create_app", "main", "serve"]
    for name in interpreter.__all__:
        assert getattr(interpreter, name) is not None


# --- startup readiness (the warm pool's probe) ---------------------------------------------------


def test_startup_route_waits_for_the_default_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``/startup`` is 503 while a default kernel is starting and 200 once every one has (or failed to)."""
    import httpx  # only this test serves the app

    from runtime.interpreter._app import create_app
    from runtime.interpreter._contexts import Context, Settings

    started: list[str] = []

    async def main() -> tuple[int, int, int]:
        release = asyncio.Event()

        async def slow_start(self: Context) -> None:
            started.append(self.language)
            await release.wait()

        monkeypatch.setattr(Context, "ensure_started", slow_start)
        app = create_app(Settings(cwd=str(tmp_path)))
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://interpreter") as client,
        ):
            await asyncio.sleep(0)  # the background starts begin
            starting = (await client.get("/startup")).status_code
            health = (await client.get("/health")).status_code  # the port answers at once
            release.set()
            for _ in range(100):
                await asyncio.sleep(0.01)
                ready = (await client.get("/startup")).status_code
                if ready != 503:
                    break
            return starting, health, ready

    assert asyncio.run(main()) == (503, 200, 200)
    assert started == list(_languages.STARTUP_LANGUAGES)


def test_the_default_kernels_warm_up_under_the_run_lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A first run that arrives while a default kernel warms up waits for it: never two requests
    in flight on one kernel (two at once left first runs hanging on gVisor)."""
    from runtime.interpreter import _contexts

    locked: list[bool] = []

    async def ensure_started(self: _contexts.Context) -> object:
        locked.append(self.run_lock.locked())
        return object()

    async def run_silently(self: _contexts.Context, kernel: object, code: str) -> bool:
        locked.append(self.run_lock.locked())
        return True

    monkeypatch.setattr(_contexts.Context, "ensure_started", ensure_started)
    monkeypatch.setattr(_contexts.Context, "run_silently", run_silently)

    async def scenario() -> None:
        contexts = _contexts.Contexts(_contexts.Settings(envd_url="http://127.0.0.1:9"), tmp_path)
        defaults = contexts.start_default()
        while contexts.starting_defaults():
            await asyncio.sleep(0.01)
        assert len(locked) == 2 * len(defaults)
        await contexts.close_all()

    asyncio.run(scenario())
    assert all(locked)
