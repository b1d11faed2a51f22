"""The code-interpreter scenarios' checks (``interpreter_*``, ``scenarios/interpreter``); see ``_checks``."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from contract.protocol import INTERPRETER_PORT

__all__: list[str] = []  # the checks are reached through ``_cases.CASES``

PNG_MAGIC = "89504e470d0a1a0a"  # the eight bytes every PNG file starts with, as hex


INTERPRETER_NOT_FOUND = ("NotFoundException", "NotFoundError")


TIMEOUT_ERRORS = ("TimeoutException", "TimeoutError")


# What the clients raise for a non-2xx answer from the interpreter other than 502: 404 gives the
# not-found class, everything else the base class (a 502 would be the timeout class: not this).
REFUSED = ("SandboxException", "NotFoundException", "SandboxError", "NotFoundError")


UNKNOWN_LANGUAGE = "cobol"  # no template has a kernel for it


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


# Per chart cell of scenarios/interpreter/results.json: the chart the clients hand over. Bars,
# slices and boxes are checked by label and by one field each kind must carry.
CHARTS: dict[str, dict[str, Any]] = {
    "scatter": {"class": "ScatterChart", "title": "Dots", "labels": ["dots"], "field": None},
    "bar": {"class": "BarChart", "title": "Counts", "labels": ["a", "b", "c"], "field": "value"},
    "pie": {"class": "PieChart", "title": "Shares", "labels": ["x", "y", "z"], "field": "angle"},
    "box_and_whisker": {"class": "BoxAndWhiskerChart", "title": "Spread", "labels": ["A", "B"], "field": "median"},
    "superchart": {"class": "SuperChart", "title": "Both", "labels": None, "field": None},
}


def _the_chart(execution: dict[str, Any], kind: str) -> dict[str, Any]:
    assert execution["error"] is None, f"{kind}: {execution['error']}"
    charts = [result["chart"] for result in execution["results"] if result["chart"] is not None]
    assert len(charts) == 1, f"{kind}: one chart expected: {execution['results']}"
    images = [result for result in execution["results"] if result["png_head"] == PNG_MAGIC]
    assert len(images) == 1, f"{kind}: the chart comes with its PNG: {execution['results']}"
    chart: dict[str, Any] = charts[0]
    return chart


def interpreter_charts(r: dict[str, Any], work: str) -> None:
    assert set(r) == set(CHARTS), sorted(r)
    for kind, expected in CHARTS.items():
        chart = _the_chart(r[kind], kind)
        assert chart["type"] == kind, f"{kind}: type {chart['type']!r}"
        if chart["class"] is not None:  # the Python clients parse charts into typed classes
            assert chart["class"] == expected["class"], f"{kind}: {chart['class']}"
        assert chart["title"] == expected["title"], f"{kind}: title {chart['title']!r}"
        elements = chart["elements"]
        if kind == "superchart":
            inner = [element.get("chart") or {} for element in elements]
            seen = [(chart.get("type"), chart.get("title")) for chart in inner]
            assert seen == [("line", "Left"), ("bar", "Right")], f"superchart: its charts {seen}"
            continue
        assert [element["label"] for element in elements] == expected["labels"], f"{kind}: {elements}"
        if expected["field"] is None:
            points = [[float(x), float(y)] for x, y in elements[0]["points"]]
            assert points == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]], f"{kind}: {points}"
        else:
            for element in elements:
                assert expected["field"] in element["fields"], f"{kind}: no {expected['field']}: {element}"


def interpreter_rich(r: dict[str, Any], work: str) -> None:
    assert r["error"] is None, r["error"]
    assert r["stdout"] == ["True\n"], f"savefig wrote no file: {r['stdout']}"
    results = r["results"]
    assert all(result["is_main_result"] is False for result in results), "every result is a display"
    assert len(results) == 6, f"six displays expected (SVG, LaTeX, JSON, JS, PIL, the figure): {results}"
    svg, latex, data, script, picture, figure = results
    assert (svg["svg"] or "").startswith("<svg"), svg
    assert latex["latex"] == "$e^{i\\pi} + 1 = 0$", latex
    assert data["json"] == {"answer": 42}, data
    assert script["javascript"] == "console.log('hi')", script
    assert picture["png_head"] == PNG_MAGIC, f"PIL's image is a PNG: {picture}"
    assert picture["chart"] is None, "a picture is no chart"
    assert figure["png_head"] == PNG_MAGIC, f"the figure savefig drew is shown at the end: {figure}"
    assert figure["chart"] is not None, figure
    assert figure["chart"]["type"] == "line", figure["chart"]


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


def interpreter_sandbox_global(r: dict[str, Any], work: str) -> None:
    # envd's /envs needs the envd token on a secure sandbox: the interpreter has it only from the
    # request it serves (its X-Access-Token), so a server that does not forward it shows None here.
    sandbox_only = {"RUN_VAR": None, "GLOBAL_VAR": "g"}
    for where in ("default", "created", "restarted"):
        shown = _printed_json(r[where], where)
        assert shown == sandbox_only, f"{where} context: the sandbox's envs did not reach the kernel: {shown}"
    assert r["bash"] == ["g\n"], f"bash's default context: the sandbox's envs did not reach the kernel: {r['bash']}"


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


def interpreter_unknown_language(r: dict[str, Any], work: str) -> None:
    raised, message = r["raised"], r["message"]
    language = UNKNOWN_LANGUAGE
    assert raised is not None, f"run_code in {language!r} succeeded, but no template has a {language} kernel"
    assert raised in REFUSED, f"{language}: raised {raised} ({message!r}), not the client's refusal"
    # The status text is the server's own choice (upstream: 500 from the failed kernel start); only
    # the form is checked. The JS client reports "<status> <statusText>" without the body for
    # anything but 404/502, so only the other messages can name the language.
    if raised == "SandboxError":
        assert re.match(r"[45]\d\d\b", message), f"{language}: {message!r}"
        return
    if raised == "SandboxException":  # "500: ..." (2.8, 2.10), "500 Internal Server Error: ..." (2.11.5)
        assert re.match(r"[45]\d\d( [A-Za-z][A-Za-z -]*)?: ", message), f"{language}: {message!r}"
    assert re.search(rf"\b{language}\b", message, re.IGNORECASE), f"the answer does not name {language}: {message!r}"


# What the steps of scenarios/interpreter/languages.json answer in each language: where the
# answer shows ("text" of the main result, "display" for the first result's text, or "stdout"),
# and the error's name and value, as each kernel gives them: IRkernel shows every value as display
# data (so an R run has no main result and no Execution.text) and names every error ERROR; jjava
# names every exception RuntimeException; bash_kernel names none and gives the exit status.
LANGUAGE_ANSWERS: dict[str, dict[str, Any]] = {
    "javascript": {"kept": ("text", "42"), "extra": ("text", '"a/b"'), "error": ("TypeError", "boom")},
    "typescript": {"kept": ("text", "42"), "extra": ("text", '"a/b"'), "error": ("RangeError", "boom")},
    "r": {
        "kept": ("display", "[1] 42"),
        "extra": ("display", '[1] "a/b"'),
        "error": ("ERROR", "Error in eval(expr, envir, enclos): boom\n"),
    },
    "java": {
        "kept": ("text", "42"),
        "extra": ("text", "a/b"),
        "error": ("RuntimeException", "java.lang.IllegalStateException, boom"),
    },
    "bash": {"kept": ("stdout", "42\n"), "extra": ("stdout", "a/b\n"), "error": ("", "2"), "traceback": False},
}
RUN_VALUE = """it's "q" \\ $HOME \\u0022 ü €"""  # languages.json's _run_value
HOME = "/home/user"


def _answer(execution: dict[str, Any], where: str) -> str | None:
    if where == "stdout":
        return "".join(execution["stdout"])
    shown = execution["results"] if where == "display" else _main_results(execution)
    return shown[0]["text"] if shown else None


def interpreter_language(r: dict[str, Any], work: str, *, language: str) -> None:
    answers = LANGUAGE_ANSWERS[language]
    at_start = r["at_start"]
    for default in ("python", "javascript"):  # upstream's server starts these two
        assert {"language": default, "cwd": HOME} in at_start, f"no default {default} context listed: {at_start}"
    for step in ("hello", "kept", "cwd", "extra", "after_error", "context_cwd"):
        assert r[step]["error"] is None, f"{language} {step}: {r[step]['error']}"
    assert r["hello"]["stdout"] == ["hello\n"], r["hello"]["stdout"]
    where, kept = answers["kept"]
    assert _answer(r["kept"], where) == kept, f"{language}: state across runs: {r['kept']}"
    assert _answer(r["after_error"], where) == kept, f"{language}: an error lost the state: {r['after_error']}"
    where, extra = answers["extra"]
    assert _answer(r["extra"], where) == extra, f"{language}: {r['extra']}"
    assert "".join(r["cwd"]["stdout"]) == f"{HOME}\n", f"{language}: the default context's cwd: {r['cwd']['stdout']}"
    env = {name: "".join(run["stdout"]) for name, run in r["env"].items()}
    assert env == {
        "before": "<unset>|g\n",
        "during": f"{RUN_VALUE}|override\n",
        "after": "<unset>|g\n",
    }, f"{language}: per-run env vars over the sandbox's: {env}"
    error = r["error"]["error"]
    assert error is not None, f"{language}: the error step raised nothing: {r['error']}"
    assert (error["name"], error["value"]) == answers["error"], f"{language}: {error}"
    assert isinstance(error["traceback"], str), f"{language}: {error}"
    if answers.get("traceback", True):
        assert error["traceback"], f"{language}: no traceback: {error}"
    else:
        assert error["traceback"] == "", f"{language}: {error}"
    names = LANGUAGE_NAMES.get(language, (language,))
    assert r["created"]["language"] in names, r["created"]
    assert r["created"]["cwd"] == CONTEXT_CWD, r["created"]
    assert [entry["cwd"] for entry in r["listed"]] == [CONTEXT_CWD], r["listed"]
    assert r["listed"][0]["language"] in names, r["listed"]
    assert "".join(r["context_cwd"]["stdout"]) == f"{CONTEXT_CWD}\n", r["context_cwd"]
    where, _ = answers["kept"]
    assert _answer(r["context_get"], where) != kept, f"{language}: a new context saw the default's state"


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
    try:
        refusal = json.loads(r["without_body"])
    except ValueError:
        raise AssertionError(f"the edge's refusal is not JSON: {r['without_body']!r}") from None
    assert isinstance(refusal, dict), f"the edge's refusal: {refusal!r}"
    assert refusal.get("code") == 403, f"the edge's refusal: {refusal!r}"
    assert isinstance(refusal.get("message"), str), f"the edge's refusal: {refusal!r}"
    assert refusal["message"], f"the edge's refusal has no message: {refusal!r}"
    # The same calls without the token: the edge's refusal, whatever the route, and no effect inside.
    assert set(r["contexts_without"]) == set(INTERPRETER_CONTEXT_CALLS), r["contexts_without"]
    for name, answer in r["contexts_without"].items():
        assert answer["status"] == 403, f"{name} context without the traffic token answered {answer['status']}"
        assert answer["body"] == r["without_body"], f"{name} context without the token: {answer['body']!r}"
    assert r["listed"] is True, "list_code_contexts (the client sends the token) did not list the new context"
    assert r["unchanged_without"] is True, "a create or remove without the traffic token changed the contexts"
    assert r["kept_without"] == "1", "a restart without the traffic token reset the context"
    assert r["restarted_error"] == "NameError", "restart_code_context (the client sends the token) kept the state"
    assert r["removed"] is True, "remove_code_context (the client sends the token) left the context listed"


INTERPRETER_CONTEXT_CALLS = ("create", "list", "restart", "remove")
