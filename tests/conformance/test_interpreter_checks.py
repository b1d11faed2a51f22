"""The code-interpreter checks: each passes a result a conforming endpoint gives and fails broken ones.

The results are written by hand in the scenarios' shape (``scenarios/interpreter``), so the checks
are tested without sandboxes; every broken variant changes one thing a faulty server could get
wrong, and must be refused.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance import _checks_interpreter as checks
from conformance._cases import Case, cases

Result = dict[str, Any]
PNG = checks.PNG_MAGIC


def result(text: str | None = None, main: bool = False, **fields: Any) -> Result:
    shown = {
        "text": text,
        "html": None,
        "markdown": None,
        "png_head": None,
        "chart": None,
        "is_main_result": main,
        **fields,
    }
    shown["formats"] = [name for name in ("text", "html", "markdown", "png_head", "chart") if shown[name]]
    return shown


def execution(
    *results: Result,
    stdout: list[str] | None = None,
    stderr: list[str] | None = None,
    error: dict[str, str] | None = None,
    count: int = 1,
) -> Result:
    main = [r["text"] for r in results if r["is_main_result"]]
    return {
        "text": main[0] if main else None,
        "results": list(results),
        "stdout": stdout or [],
        "stderr": stderr or [],
        "error": error,
        "execution_count": count,
    }


LINE_CHART = {
    "class": "LineChart",
    "type": "line",
    "title": "Squares",
    "x_label": "x",
    "y_label": "y",
    "elements": [{"label": "squares", "points": [[1.0, 1.0], [2.0, 4.0], [3.0, 9.0]]}],
}


def env(run_var: str | None, global_var: str | None) -> list[str]:
    """What the scenario's code prints: the two variables as the kernel sees them."""
    return [json.dumps({"RUN_VAR": run_var, "GLOBAL_VAR": global_var}) + "\n"]


def printed(who: str, start: float, end: float) -> list[str]:
    """What a concurrent run prints: who it is and its start and end on the kernel's clock."""
    return [json.dumps({"who": who, "start": start, "end": end}) + "\n"]


GOOD: dict[str, Result] = {
    "interpreter/run/basic": {
        "first": execution(result("2", True), stdout=["out\n"], stderr=["err\n"]),
        "callbacks": {
            "stdout": ["out\n"],
            "stderr": ["err\n"],
            "results": [{"text": "2", "is_main_result": True}],
            "errors": [],
        },
        "second": execution(result("42", True), stdout=["before\n"], count=2),
    },
    "interpreter/results/dataframe": execution(
        result("   a  b\n0  1  3\n1  2  4", True, html='<table border="1" class="dataframe">…</table>')
    ),
    "interpreter/results/matplotlib": execution(
        result("<Figure size 640x480 with 1 Axes>", False, png_head=PNG, chart=LINE_CHART)
    ),
    "interpreter/results/display": execution(
        result("<IPython.core.display.HTML object>", False, html="<b>hi</b>"),
        result("<IPython.core.display.Markdown object>", False, markdown="**md**"),
        result("42", True),
    ),
    "interpreter/errors/traceback": {
        "raised": None,
        "execution": execution(
            error={
                "name": "ZeroDivisionError",
                "value": "division by zero",
                "traceback": "Traceback (most recent call last)\n----> 1 1/0\nZeroDivisionError: division by zero",
            }
        ),
        "on_error": ["ZeroDivisionError"],
    },
    "interpreter/execution-count": {"counts": [4, 5, 6]},
    "interpreter/contexts/lifecycle": {
        "created": {"language": "python", "cwd": "/tmp", "has_id": True},
        "cwd_stdout": ["/tmp\n"],
        "persisted": "42",
        "listed": [{"language": "python", "cwd": "/tmp"}],
        "after_restart_error": {"name": "NameError", "value": "name 'x' is not defined", "traceback": "…"},
        "listed_after_remove": False,
        "run_after_remove": "NotFoundException",
    },
    "interpreter/env-vars/per-run": {
        "before": env(None, "g"),
        "during": env("r", "override"),
        "after": env(None, "g"),
    },
    "interpreter/env-vars/sandbox-global": {
        "default": env(None, "g"),
        "created": env(None, "g"),
        "restarted": env(None, "g"),
        "bash": ["g\n"],
    },
    "interpreter/interrupt/timeout-then-run": {
        "raised": "TimeoutException",
        "message": "Execution timed out — the 'timeout' option can be used to increase this timeout",
        "raised_after_s": 3.01,
        "after": "2",
        "after_error": None,
        "after_elapsed_s": 0.05,
        "sleep_completed": "False",
    },
    "interpreter/contexts/concurrent": {
        "runs": {
            "a": {"stdout": printed("a", 100.0, 102.0), "error": None, "client": [1.0, 3.1]},
            "b": {"stdout": printed("b", 100.1, 102.1), "error": None, "client": [1.0, 3.2]},
        }
    },
    "interpreter/network/private-traffic": {
        "has_token": True,
        "without": 403,
        "without_body": '{"code": 403, "message": "Missing or invalid traffic access token"}',
        "with": 200,
        "with_body": '"OK"',
        "run": "2",
        "contexts_without": {
            name: {"status": 403, "body": '{"code": 403, "message": "Missing or invalid traffic access token"}'}
            for name in ("create", "list", "restart", "remove")
        },
        "listed": True,
        "unchanged_without": True,
        "kept_without": "1",
        "restarted_error": "NameError",
        "removed": True,
    },
}

CASES = {case.scenario: case for case in cases("interpreter")}


# The languages, unknown-language, charts and rich-results scenarios: as the py-sync client recorded
# them against the reference server (their results are long; the checks read every part).
RECORDED = Path(__file__).with_name("interpreter-results.json")
GOOD.update({name: shown for name, shown in json.loads(RECORDED.read_text("utf-8")).items() if "/" in name})
LANGUAGES = [f"interpreter/languages/{language}" for language in checks.LANGUAGE_ANSWERS]


def test_every_interpreter_case_has_a_good_result_here() -> None:
    assert set(GOOD) == set(CASES)


@pytest.mark.parametrize("scenario", sorted(GOOD))
def test_a_conforming_result_passes(scenario: str) -> None:
    CASES[scenario].check(copy.deepcopy(GOOD[scenario]), "/home/user")


def _js_shapes() -> list[Any]:
    """The same results as the JS client reports them: untyped charts, its own class names and messages."""
    matplotlib = copy.deepcopy(GOOD["interpreter/results/matplotlib"])
    matplotlib["results"][0]["chart"]["class"] = None
    contexts = copy.deepcopy(GOOD["interpreter/contexts/lifecycle"])
    contexts["run_after_remove"] = "NotFoundError"
    timeout = copy.deepcopy(GOOD["interpreter/interrupt/timeout-then-run"])
    timeout.update(raised="TimeoutError", message="Execution timed out — the 'timeoutMs' option can be used")
    refused = copy.deepcopy(GOOD["interpreter/languages/unknown"])
    refused.update(raised="SandboxError", message="500 Internal Server Error")  # JS drops the body
    not_found = copy.deepcopy(GOOD["interpreter/languages/unknown"])
    not_found.update(raised="NotFoundError", message="no kernel for cobol")
    charts = copy.deepcopy(GOOD["interpreter/results/charts"])
    for run in charts.values():
        for shown in run["results"]:
            if shown["chart"] is not None:
                shown["chart"]["class"] = None
                for element in shown["chart"]["elements"]:
                    if "chart" in element:
                        element["chart"]["class"] = None
    return [
        pytest.param("interpreter/results/matplotlib", matplotlib, id="untyped-chart"),
        pytest.param("interpreter/contexts/lifecycle", contexts, id="NotFoundError"),
        pytest.param("interpreter/interrupt/timeout-then-run", timeout, id="TimeoutError"),
        pytest.param("interpreter/languages/unknown", refused, id="SandboxError-without-body"),
        pytest.param("interpreter/languages/unknown", not_found, id="NotFoundError-with-body"),
        pytest.param("interpreter/results/charts", charts, id="untyped-charts"),
    ]


@pytest.mark.parametrize(("scenario", "shown"), _js_shapes())
def test_the_js_clients_shapes_pass_too(scenario: str, shown: Result) -> None:
    CASES[scenario].check(shown, "/home/user")


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Result], None]:
    def change(r: Result) -> None:
        target: Any = r
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _call(fn: Callable[[Result], Any]) -> Callable[[Result], None]:
    def change(r: Result) -> None:
        fn(r)

    return change


def _lose_answer(r: Result, step: str) -> None:
    run = r[step]
    if run["results"]:
        run["results"][0]["text"] = "41"
    run["stdout"] = ["41\n"] if run["stdout"] else []


def _share_state(r: Result) -> None:
    r["context_get"] = copy.deepcopy(r["kept"])


def _chart_changes(kind: str) -> list[tuple[str, Callable[[Result], None]]]:
    """What a faulty chart extraction could do to the chart of the ``kind`` cell."""

    def on_chart(change: Callable[[dict[str, Any]], Any]) -> Callable[[Result], None]:
        return lambda r: change(_chart(r[kind])) and None

    return [
        ("no chart", lambda r: _drop_charts(r[kind])),
        ("another type", on_chart(lambda chart: chart.update(type="bar" if kind != "bar" else "line"))),
        ("another title", on_chart(lambda chart: chart.update(title="Other"))),
        ("no elements", on_chart(lambda chart: chart.update(elements=[]))),
    ]


def _chart(run: Result) -> dict[str, Any]:
    chart: dict[str, Any] = next(result["chart"] for result in run["results"] if result["chart"] is not None)
    return chart


def _drop_charts(run: Result) -> None:
    for result in run["results"]:
        result["chart"] = None


BROKEN: list[tuple[str, str, Callable[[Result], None]]] = [
    ("interpreter/run/basic", "wrong main result", _set(("first", "results", 0, "text"), "3")),
    ("interpreter/run/basic", "main result not marked main", _set(("first", "results", 0, "is_main_result"), False)),
    ("interpreter/run/basic", "stderr merged into stdout", _set(("first", "stdout"), ["out\n", "err\n"])),
    ("interpreter/run/basic", "stderr missing", _set(("first", "stderr"), [])),
    ("interpreter/run/basic", "callbacks not called", _set(("callbacks", "stdout"), [])),
    ("interpreter/run/basic", "second run wrong", _set(("second", "results", 0, "text"), "6*7")),
    ("interpreter/run/basic", "Execution.text disagrees", _set(("second", "text"), None)),
    ("interpreter/run/basic", "a kernel error", _set(("first", "error"), {"name": "X", "value": "", "traceback": ""})),
    ("interpreter/results/dataframe", "no html", _set(("results", 0, "html"), None)),
    ("interpreter/results/dataframe", "html without a table", _set(("results", 0, "html"), "<pre>a b</pre>")),
    ("interpreter/results/dataframe", "not the main result", _set(("results", 0, "is_main_result"), False)),
    ("interpreter/results/dataframe", "text of something else", _set(("results", 0, "text"), "DataFrame")),
    ("interpreter/results/matplotlib", "no png", _set(("results", 0, "png_head"), None)),
    ("interpreter/results/matplotlib", "png not a PNG", _set(("results", 0, "png_head"), "ffd8ffe000104a46")),
    ("interpreter/results/matplotlib", "figure as main result", _set(("results", 0, "is_main_result"), True)),
    ("interpreter/results/matplotlib", "no chart", _set(("results", 0, "chart"), None)),
    ("interpreter/results/matplotlib", "chart of another type", _set(("results", 0, "chart", "type"), "scatter")),
    ("interpreter/results/matplotlib", "chart untyped in Python", _set(("results", 0, "chart", "class"), "Chart")),
    ("interpreter/results/matplotlib", "title lost", _set(("results", 0, "chart", "title"), "")),
    ("interpreter/results/matplotlib", "axis labels lost", _set(("results", 0, "chart", "y_label"), "")),
    (
        "interpreter/results/matplotlib",
        "a point wrong",
        _set(("results", 0, "chart", "elements", 0, "points", 2), [3.0, 8.0]),
    ),
    (
        "interpreter/results/matplotlib",
        "a point missing",
        _call(lambda r: r["results"][0]["chart"]["elements"][0]["points"].pop()),
    ),
    ("interpreter/results/matplotlib", "label lost", _set(("results", 0, "chart", "elements", 0, "label"), "Line 0")),
    ("interpreter/results/display", "html display is main", _set(("results", 0, "is_main_result"), True)),
    ("interpreter/results/display", "html lost", _set(("results", 0, "html"), None)),
    ("interpreter/results/display", "markdown lost", _set(("results", 1, "markdown"), None)),
    ("interpreter/results/display", "displays out of order", _call(lambda r: r["results"].reverse())),
    ("interpreter/results/display", "a display dropped", _call(lambda r: r["results"].pop(1))),
    ("interpreter/errors/traceback", "run_code raised", lambda r: r.update(raised="SandboxException")),
    ("interpreter/errors/traceback", "no error", _set(("execution", "error"), None)),
    ("interpreter/errors/traceback", "wrong name", _set(("execution", "error", "name"), "Exception")),
    ("interpreter/errors/traceback", "empty traceback", _set(("execution", "error", "traceback"), "")),
    ("interpreter/errors/traceback", "value lost", _set(("execution", "error", "value"), "")),
    ("interpreter/errors/traceback", "on_error not called", _set(("on_error",), [])),
    ("interpreter/errors/traceback", "on_error called twice", _set(("on_error",), ["ZeroDivisionError"] * 2)),
    ("interpreter/execution-count", "not counting", _set(("counts",), [1, 1, 1])),
    ("interpreter/execution-count", "skipping", _set(("counts",), [1, 3, 5])),
    ("interpreter/execution-count", "no count", _set(("counts",), [None, None, None])),
    ("interpreter/execution-count", "counting down", _set(("counts",), [3, 2, 1])),
    ("interpreter/contexts/lifecycle", "cwd ignored", _set(("cwd_stdout",), ["/home/user\n"])),
    ("interpreter/contexts/lifecycle", "created cwd wrong", _set(("created", "cwd"), "/home/user")),
    ("interpreter/contexts/lifecycle", "state lost", _set(("persisted",), None)),
    ("interpreter/contexts/lifecycle", "not listed", _set(("listed",), [])),
    ("interpreter/contexts/lifecycle", "listed twice", _set(("listed",), [{"language": "python", "cwd": "/tmp"}] * 2)),
    ("interpreter/contexts/lifecycle", "restart kept state", _set(("after_restart_error",), None)),
    ("interpreter/contexts/lifecycle", "still listed", _set(("listed_after_remove",), True)),
    ("interpreter/contexts/lifecycle", "removed context still runs", _set(("run_after_remove",), None)),
    ("interpreter/env-vars/per-run", "sandbox env missing", _set(("before",), env(None, None))),
    ("interpreter/env-vars/per-run", "run env ignored", _set(("during",), env(None, "g"))),
    ("interpreter/env-vars/per-run", "override ignored", _set(("during",), env("r", "g"))),
    ("interpreter/env-vars/per-run", "run env leaked", _set(("after",), env("r", "g"))),
    ("interpreter/env-vars/per-run", "global not restored", _set(("after",), env(None, "override"))),
    ("interpreter/env-vars/per-run", "global removed", _set(("after",), env(None, None))),
    ("interpreter/env-vars/per-run", "nothing printed", _set(("after",), [])),
    ("interpreter/env-vars/sandbox-global", "default context without", _set(("default",), env(None, None))),
    ("interpreter/env-vars/sandbox-global", "new context without", _set(("created",), env(None, None))),
    ("interpreter/env-vars/sandbox-global", "lost at restart", _set(("restarted",), env(None, None))),
    ("interpreter/env-vars/sandbox-global", "bash without", _set(("bash",), ["\n"])),
    ("interpreter/env-vars/sandbox-global", "nothing printed", _set(("created",), [])),
    ("interpreter/interrupt/timeout-then-run", "no timeout", lambda r: r.update(raised=None, message="")),
    (
        "interpreter/interrupt/timeout-then-run",
        "a request timeout",
        _set(("message",), "Request timed out — the 'request_timeout' option can be used"),
    ),
    ("interpreter/interrupt/timeout-then-run", "next run broken", _set(("after",), None)),
    (
        "interpreter/interrupt/timeout-then-run",
        "next run errored",
        _set(("after_error",), {"name": "ExecutionAborted", "value": "", "traceback": ""}),
    ),
    ("interpreter/interrupt/timeout-then-run", "not interrupted", _set(("sleep_completed",), "True")),
    ("interpreter/contexts/concurrent", "serialized", _set(("runs", "b", "stdout"), printed("b", 102.0, 104.0))),
    (
        "interpreter/contexts/concurrent",
        "serialized other way",
        _set(("runs", "a", "stdout"), printed("a", 102.2, 104)),
    ),
    ("interpreter/contexts/concurrent", "output crossed", _set(("runs", "a", "stdout"), printed("b", 100.0, 102.0))),
    ("interpreter/contexts/concurrent", "a run failed", _set(("runs", "b", "error"), {"name": "E"})),
    ("interpreter/contexts/concurrent", "nothing printed", _set(("runs", "a", "stdout"), [])),
    *(
        (name, what, change)
        for name in LANGUAGES
        for what, change in (
            ("no default javascript context at start", _call(lambda r: r["at_start"].pop())),
            ("printed nothing", _set(("hello", "stdout"), [])),
            ("state lost between runs", _call(lambda r: _lose_answer(r, "kept"))),
            ("state lost after an error", _call(lambda r: _lose_answer(r, "after_error"))),
            ("default context in another folder", _set(("cwd", "stdout"), ["/\n"])),
            ("run's env var kept after the run", _call(lambda r: r["env"]["after"].update(stdout=["x|g\n"]))),
            ("run's env var mangled", _call(lambda r: r["env"]["during"].update(stdout=["it's q|override\n"]))),
            ("sandbox env var missing", _call(lambda r: r["env"]["before"].update(stdout=["<unset>|<unset>\n"]))),
            ("no error", _call(lambda r: r["error"].update(error=None))),
            ("error of another name", _call(lambda r: r["error"]["error"].update(name="Exception"))),
            ("context in another folder", _set(("created", "cwd"), "/home/user")),
            ("context not listed", _set(("listed",), [])),
            ("context ran in another folder", _set(("context_cwd", "stdout"), ["/home/user\n"])),
            ("context shares the default's kernel", _share_state),
            ("context of another language", _set(("created", "language"), "python")),
        )
    ),
    ("interpreter/languages/unknown", "ran", _set(("raised",), None)),
    ("interpreter/languages/unknown", "timeout instead of a refusal", _set(("raised",), "TimeoutException")),
    ("interpreter/languages/unknown", "message without a status", _set(("message",), "no kernel named cobol")),
    ("interpreter/languages/unknown", "message names another language", _set(("message",), "500: no kernel named r")),
    (
        "interpreter/languages/unknown",
        "JS message without a status",
        _call(lambda r: r.update(raised="SandboxError", message="Internal Server Error")),
    ),
    *(
        ("interpreter/results/charts", f"{kind}: {what}", change)
        for kind in checks.CHARTS
        for what, change in _chart_changes(kind)
    ),
    ("interpreter/results/charts", "a kind not tried", _call(lambda r: r.pop("pie"))),
    (
        "interpreter/results/charts",
        "typed as another class",
        _call(lambda r: _chart(r["bar"]).update({"class": "LineChart"})),
    ),
    ("interpreter/results/rich", "no svg", _set(("results", 0, "svg"), None)),
    ("interpreter/results/rich", "latex changed", _set(("results", 1, "latex"), "x^2")),
    ("interpreter/results/rich", "json as text", _set(("results", 2, "json"), '{"answer": 42}')),
    ("interpreter/results/rich", "no javascript", _set(("results", 3, "javascript"), None)),
    ("interpreter/results/rich", "PIL image missing", _call(lambda r: r["results"].pop(4))),
    ("interpreter/results/rich", "figure not shown", _call(lambda r: r["results"].pop())),
    ("interpreter/results/rich", "a display as the main result", _set(("results", 0, "is_main_result"), True)),
    ("interpreter/results/rich", "savefig wrote nothing", _set(("stdout",), ["False\n"])),
    ("interpreter/network/private-traffic", "no token", _set(("has_token",), False)),
    ("interpreter/network/private-traffic", "open without the token", _set(("without",), 200)),
    ("interpreter/network/private-traffic", "refused with the token", _set(("with",), 403)),
    ("interpreter/network/private-traffic", "health not OK", _set(("with_body",), '"Request was successful"')),
    ("interpreter/network/private-traffic", "health not JSON", _set(("with_body",), "OK")),
    ("interpreter/network/private-traffic", "client does not send the token", _set(("run",), None)),
    ("interpreter/network/private-traffic", "refusal not JSON", _set(("without_body",), "Forbidden")),
    ("interpreter/network/private-traffic", "refusal of another code", _set(("without_body",), '{"code": 401}')),
    (
        "interpreter/network/private-traffic",
        "a contexts call open without the token",
        _set(("contexts_without", "remove"), {"status": 200, "body": "null"}),
    ),
    (
        "interpreter/network/private-traffic",
        "a contexts call refused otherwise",
        _set(("contexts_without", "list", "body"), "Unauthorized"),
    ),
    (
        "interpreter/network/private-traffic",
        "a contexts call not tried",
        _call(lambda r: r["contexts_without"].pop("restart")),
    ),
    ("interpreter/network/private-traffic", "client list without the context", _set(("listed",), False)),
    ("interpreter/network/private-traffic", "changed without the token", _set(("unchanged_without",), False)),
    ("interpreter/network/private-traffic", "restarted without the token", _set(("kept_without",), None)),
    ("interpreter/network/private-traffic", "client restart ignored", _set(("restarted_error",), None)),
    ("interpreter/network/private-traffic", "client remove ignored", _set(("removed",), False)),
]


@pytest.mark.parametrize(("scenario", "what", "change"), BROKEN, ids=[f"{s}:{w}" for s, w, _ in BROKEN])
def test_a_broken_result_fails(scenario: str, what: str, change: Callable[[Result], None]) -> None:
    broken = copy.deepcopy(GOOD[scenario])
    change(broken)
    assert broken != GOOD[scenario], "the change must change something"
    case: Case = CASES[scenario]
    with pytest.raises(AssertionError):
        case.check(broken, "/home/user")


def test_every_interpreter_case_has_broken_variants() -> None:
    assert {scenario for scenario, _, _ in BROKEN} == set(CASES)
