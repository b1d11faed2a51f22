"""Code-interpreter scenarios for the official Python interpreter client (sync flavour).

Run by the pinned client's own interpreter (``python -I py_sync.py <scenario> <workdir>``) with
only ``E2B_API_KEY``, ``E2B_DOMAIN``, ``SSL_CERT_FILE`` and ``NODE_EXTRA_CA_CERTS`` set. ``main``
creates the scenario's sandbox with ``e2b_code_interpreter.Sandbox.create()`` (whose default
template is ``code-interpreter-v1``; a scenario may add create options such as ``envs``), kills
it in ``finally`` and prints the scenario's JSON object. The working folder argument is not used:
the kernels choose their own folders.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

# The official client lives in its own virtualenv, never in the project's, so mypy cannot see it.
from e2b_code_interpreter import (  # type: ignore[import-not-found]
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

Scenario = Callable[[Sandbox], dict[str, Any]]
SCENARIOS: dict[str, tuple[Scenario, dict[str, Any]]] = {}
CURRENT = [""]  # the running scenario's name, for stage traces


def scenario(name: str, **create: Any) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = (fn, create)
        return fn

    return register


def trace(stage: str) -> None:
    print(f"py-sync:{CURRENT[0]}:{stage}", file=sys.stderr, flush=True)


def chart_of(chart: Any) -> dict[str, Any] | None:
    """The chart as the client parsed it (its typed classes): what a user of the client sees."""
    if chart is None:
        return None
    elements: list[dict[str, Any]] = []
    for element in chart.elements:
        if hasattr(element, "points"):
            elements.append({"label": element.label, "points": [list(point) for point in element.points]})
        elif hasattr(element, "elements"):  # a superchart's: a chart of its own
            elements.append({"chart": chart_of(element)})
        else:  # bars, pie slices, boxes: their label and which fields the client gives them
            fields = sorted(name for name in vars(element) if not name.startswith("_") and name != "label")
            elements.append({"label": getattr(element, "label", None), "fields": fields})
    return {
        "class": type(chart).__name__,
        "type": getattr(chart.type, "value", chart.type),
        "title": chart.title,
        "x_label": getattr(chart, "x_label", None),
        "y_label": getattr(chart, "y_label", None),
        "elements": elements,
    }


def result_of(result: Any) -> dict[str, Any]:
    png_head = base64.b64decode(result.png)[:8].hex() if result.png else None
    return {
        "text": result.text,
        "html": result.html,
        "markdown": result.markdown,
        "png_head": png_head,
        "svg": result.svg,
        "latex": result.latex,
        "json": result.json,
        "javascript": result.javascript,
        "chart": chart_of(result.chart),
        "is_main_result": result.is_main_result,
        "formats": list(result.formats()),
    }


def error_of(error: Any) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"name": error.name, "value": error.value, "traceback": error.traceback}


def execution_of(execution: Any) -> dict[str, Any]:
    return {
        "text": execution.text,
        "results": [result_of(r) for r in execution.results],
        "stdout": list(execution.logs.stdout),
        "stderr": list(execution.logs.stderr),
        "error": error_of(execution.error),
        "execution_count": execution.execution_count,
    }


@scenario("interpreter/run/basic")
def _basic(sbx: Sandbox) -> dict[str, Any]:
    seen: dict[str, list[Any]] = {"stdout": [], "stderr": [], "results": [], "errors": []}
    first = sbx.run_code(
        'print("out")\nimport sys\nprint("err", file=sys.stderr)\n1+1',
        on_stdout=lambda message: seen["stdout"].append(message.line),
        on_stderr=lambda message: seen["stderr"].append(message.line),
        on_result=lambda result: seen["results"].append({"text": result.text, "is_main_result": result.is_main_result}),
        on_error=lambda error: seen["errors"].append(error.name),
    )
    trace("first run")
    second = sbx.run_code('print("before")\n6*7')
    return {"first": execution_of(first), "callbacks": seen, "second": execution_of(second)}


@scenario("interpreter/results/dataframe")
def _dataframe(sbx: Sandbox) -> dict[str, Any]:
    return execution_of(sbx.run_code('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})'))


PLOT = """import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9], label="squares")
plt.title("Squares")
plt.xlabel("x")
plt.ylabel("y")
plt.show()
"""


@scenario("interpreter/results/matplotlib")
def _matplotlib(sbx: Sandbox) -> dict[str, Any]:
    return execution_of(sbx.run_code(PLOT))


DISPLAY = """from IPython.display import HTML, Markdown, display
display(HTML("<b>hi</b>"))
display(Markdown("**md**"))
40 + 2
"""


RESULT_CELLS = json.loads((Path(__file__).resolve().parent / "results.json").read_text("utf-8"))


@scenario("interpreter/results/charts")
def _charts(sbx: Sandbox) -> dict[str, Any]:
    return {kind: execution_of(sbx.run_code(code)) for kind, code in RESULT_CELLS["charts"].items()}


@scenario("interpreter/results/rich")
def _rich(sbx: Sandbox) -> dict[str, Any]:
    return execution_of(sbx.run_code(RESULT_CELLS["rich"]))


@scenario("interpreter/results/display")
def _display(sbx: Sandbox) -> dict[str, Any]:
    return execution_of(sbx.run_code(DISPLAY))


@scenario("interpreter/errors/traceback")
def _traceback(sbx: Sandbox) -> dict[str, Any]:
    errors: list[str] = []
    try:
        run = sbx.run_code("1/0", on_error=lambda error: errors.append(error.name))
    except SandboxException as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "execution": execution_of(run), "on_error": errors}


@scenario("interpreter/execution-count")
def _execution_count(sbx: Sandbox) -> dict[str, Any]:
    return {"counts": [sbx.run_code(code).execution_count for code in ("1", "2", "3")]}


@scenario("interpreter/contexts/lifecycle")
def _contexts(sbx: Sandbox) -> dict[str, Any]:
    context = sbx.create_code_context(cwd="/tmp", language="python")
    trace(f"context {context.id}")
    cwd = sbx.run_code("import os\nprint(os.getcwd())", context=context)
    sbx.run_code("x = 41", context=context)
    persisted = sbx.run_code("x + 1", context=context)
    listed = [{"language": c.language, "cwd": c.cwd} for c in sbx.list_code_contexts() if c.id == context.id]
    sbx.restart_code_context(context)
    trace("restarted")
    after_restart = sbx.run_code("x", context=context)
    sbx.remove_code_context(context)
    trace("removed")
    listed_after = any(c.id == context.id for c in sbx.list_code_contexts())
    try:
        sbx.run_code("1", context=context)
        run_after_remove = None
    except NotFoundException as exc:
        run_after_remove = type(exc).__name__
    return {
        "created": {"language": context.language, "cwd": context.cwd, "has_id": bool(context.id)},
        "cwd_stdout": list(cwd.logs.stdout),
        "persisted": persisted.text,
        "listed": listed,
        "after_restart_error": error_of(after_restart.error),
        "listed_after_remove": listed_after,
        "run_after_remove": run_after_remove,
    }


SHOW_ENV = 'import json, os\nprint(json.dumps({k: os.environ.get(k) for k in ("RUN_VAR", "GLOBAL_VAR")}))'


@scenario("interpreter/env-vars/per-run", envs={"GLOBAL_VAR": "g"})
def _env_vars(sbx: Sandbox) -> dict[str, Any]:
    before = sbx.run_code(SHOW_ENV)
    during = sbx.run_code(SHOW_ENV, envs={"RUN_VAR": "r", "GLOBAL_VAR": "override"})
    after = sbx.run_code(SHOW_ENV)
    return {"before": before.logs.stdout, "during": during.logs.stdout, "after": after.logs.stdout}


@scenario("interpreter/env-vars/sandbox-global", envs={"GLOBAL_VAR": "g"}, secure=True)
def _sandbox_global(sbx: Sandbox) -> dict[str, Any]:
    # Secure: envd's /envs needs the token, which only the run's own X-Access-Token can supply.
    default = sbx.run_code(SHOW_ENV)
    context = sbx.create_code_context()
    created = sbx.run_code(SHOW_ENV, context=context)
    sbx.restart_code_context(context)
    restarted = sbx.run_code(SHOW_ENV, context=context)
    bash = sbx.run_code('echo "$GLOBAL_VAR"', language="bash")
    return {
        "default": default.logs.stdout,
        "created": created.logs.stdout,
        "restarted": restarted.logs.stdout,
        "bash": bash.logs.stdout,
    }


# Whether the cell ran to its end shows in the kernel's globals afterwards: no clock involved.
SLEEP = "import time\ntime.sleep(60)\nfinished_sleeping = True"


@scenario("interpreter/interrupt/timeout-then-run")
def _timeout(sbx: Sandbox) -> dict[str, Any]:
    start = time.monotonic()
    try:
        sbx.run_code(SLEEP, timeout=3)
        raised, message = None, ""
    except TimeoutException as exc:
        raised, message = type(exc).__name__, str(exc)
    raised_after = time.monotonic() - start
    trace(f"first run ended: {raised}")
    start = time.monotonic()
    after = sbx.run_code("1+1")
    after_elapsed = time.monotonic() - start
    sleep_completed = sbx.run_code("'finished_sleeping' in globals()")
    return {
        "raised": raised,
        "message": message,
        "raised_after_s": raised_after,
        "after": after.text,
        "after_error": error_of(after.error),
        "after_elapsed_s": after_elapsed,
        "sleep_completed": sleep_completed.text,
    }


def concurrent_code(who: str) -> str:
    # The kernel's own clock: whether the two runs overlapped inside the sandbox, not on the client.
    return (
        "import json, time\nstart = time.time()\ntime.sleep(2)\n"
        f'print(json.dumps({{"who": "{who}", "start": start, "end": time.time()}}))'
    )


@scenario("interpreter/contexts/concurrent")
def _concurrent(sbx: Sandbox) -> dict[str, Any]:
    contexts = {who: sbx.create_code_context() for who in ("a", "b")}

    def run(who: str) -> dict[str, Any]:
        start = time.monotonic()
        execution = sbx.run_code(concurrent_code(who), context=contexts[who])
        return {
            "stdout": list(execution.logs.stdout),
            "error": error_of(execution.error),
            "client": [start, time.monotonic()],
        }

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(contexts, pool.map(run, contexts), strict=True))
    return {"runs": runs}


# The same steps in every language but python (which the other scenarios cover), read from beside
# this file: scripts run where they are.
LANGUAGES = json.loads((Path(__file__).resolve().parent / "languages.json").read_text("utf-8"))
# A language no template has a kernel for.
UNKNOWN_LANGUAGE = "cobol"


def _language(sbx: Sandbox, language: str) -> dict[str, Any]:
    steps = LANGUAGES[language]
    at_start = [{"language": c.language, "cwd": c.cwd} for c in sbx.list_code_contexts()]

    def run(step: str, **options: Any) -> dict[str, Any]:
        where = {"context": options.pop("context")} if "context" in options else {"language": language}
        return execution_of(sbx.run_code(steps[step], **where, **options))

    hello = run("hello")
    trace("first run")
    run("set")
    found: dict[str, Any] = {"at_start": at_start, "hello": hello, "kept": run("get"), "cwd": run("cwd")}
    found["env"] = {
        "before": run("env"),
        "during": run("env", envs={"RUN_VAR": LANGUAGES["_run_value"], "GLOBAL_VAR": "override"}),
        "after": run("env"),
    }
    found["error"] = run("error")
    found["after_error"] = run("get")
    found["extra"] = run("extra")
    context = sbx.create_code_context(cwd="/tmp", language=language)
    trace(f"context {context.id}")
    found["created"] = {"language": context.language, "cwd": context.cwd}
    found["context_cwd"] = run("cwd", context=context)
    found["context_get"] = run("get", context=context)  # its own kernel: nothing of the default's state
    found["listed"] = [{"language": c.language, "cwd": c.cwd} for c in sbx.list_code_contexts() if c.id == context.id]
    sbx.remove_code_context(context)
    return found


LANGUAGE_CREATE = {"envs": {"GLOBAL_VAR": "g"}}


@scenario("interpreter/languages/javascript", **LANGUAGE_CREATE)
def _javascript(sbx: Sandbox) -> dict[str, Any]:
    return _language(sbx, "javascript")


@scenario("interpreter/languages/typescript", **LANGUAGE_CREATE)
def _typescript(sbx: Sandbox) -> dict[str, Any]:
    return _language(sbx, "typescript")


@scenario("interpreter/languages/r", **LANGUAGE_CREATE)
def _r(sbx: Sandbox) -> dict[str, Any]:
    return _language(sbx, "r")


@scenario("interpreter/languages/java", **LANGUAGE_CREATE)
def _java(sbx: Sandbox) -> dict[str, Any]:
    return _language(sbx, "java")


@scenario("interpreter/languages/bash", **LANGUAGE_CREATE)
def _bash(sbx: Sandbox) -> dict[str, Any]:
    return _language(sbx, "bash")


@scenario("interpreter/languages/unknown")
def _unknown(sbx: Sandbox) -> dict[str, Any]:
    try:
        sbx.run_code("1", language=UNKNOWN_LANGUAGE)
        return {"raised": None, "message": ""}
    except SandboxException as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}


# The contexts routes as the clients call them, sent here without the traffic token ({id}: a context's).
BARE_CONTEXTS = {
    "create": ("POST", "/contexts"),
    "list": ("GET", "/contexts"),
    "restart": ("POST", "/contexts/{id}/restart"),
    "remove": ("DELETE", "/contexts/{id}"),
}


@scenario("interpreter/network/private-traffic", network={"allow_public_traffic": False})
def _private_traffic(sbx: Sandbox) -> dict[str, Any]:
    token = sbx.traffic_access_token
    base = f"https://{sbx.get_host(49999)}"
    without = httpx.get(f"{base}/health", timeout=30)
    with_token = httpx.get(f"{base}/health", headers={"E2B-Traffic-Access-Token": token or ""}, timeout=30)
    run = sbx.run_code("1+1")  # the client sends the token itself, on the contexts calls too
    context = sbx.create_code_context()
    sbx.run_code("marker = 1", context=context)
    ids_before = sorted(c.id for c in sbx.list_code_contexts())
    refused = {}
    for name, (method, path) in BARE_CONTEXTS.items():
        answer = httpx.request(
            method, base + path.format(id=context.id), json={} if name == "create" else None, timeout=30
        )
        refused[name] = {"status": answer.status_code, "body": answer.text}
    trace("contexts calls without the token sent")
    ids_after = sorted(c.id for c in sbx.list_code_contexts())
    kept = sbx.run_code("marker", context=context)
    sbx.restart_code_context(context)
    restarted = sbx.run_code("marker", context=context)
    sbx.remove_code_context(context)
    return {
        "has_token": bool(token),
        "without": without.status_code,
        "without_body": without.text,
        "with": with_token.status_code,
        "with_body": with_token.text,
        "run": run.text,
        "contexts_without": refused,
        "listed": context.id in ids_before,
        "unchanged_without": ids_after == ids_before,
        "kept_without": kept.text,
        "restarted_error": restarted.error.name if restarted.error else None,
        "removed": all(c.id != context.id for c in sbx.list_code_contexts()),
    }


def main() -> None:
    name = CURRENT[0] = sys.argv[1]
    fn, create = SCENARIOS[name]
    trace("start")
    sbx = Sandbox.create(**create)
    try:
        trace(f"created {sbx.sandbox_id}")
        result = fn(sbx)
    finally:
        sbx.kill()
    trace("done")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
