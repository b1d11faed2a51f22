"""Runs inside the pinned Python client's environment against the reference server.

``python -I interpreter_client.py <sandboxes> <runs> <budget seconds> <pace seconds>`` times, with
the official clients configured only by the server's four variables:

- per sandbox, alternating so both see the same conditions: ``e2b_code_interpreter.Sandbox.create()``
  (template ``code-interpreter-v1``) → first ``run_code("1+1")`` result, and the floor
  ``e2b.Sandbox.create()`` (template ``base``) → first ``commands.run("true")`` result, each
  ``pace`` seconds after the last (a server's warm pool refills in that time);
- unless ``runs`` is 0, on one code-interpreter sandbox, alternating: ``run_code("1+1")`` and its floor
  ``commands.run("true")`` (envd on the same sandbox) round trips, then the same warm
  ``run_code`` in each other language (``LANGUAGES``), each after one untimed first run that
  starts its kernel.

One untimed create per template comes first (a first create may build the template). Sampling
stops early, saying so, once the budget is spent. Every sandbox is killed before the next is
made. Prints one JSON object: samples in seconds, and what was done.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from e2b import Sandbox as BaseSandbox

# The official client lives in its own virtualenv, never in the project's, so mypy cannot see it.
from e2b_code_interpreter import Sandbox  # type: ignore[import-not-found]

WARM_UP_REQUEST_TIMEOUT_S = 1800  # a first create may wait for a template build
# Language → the warm run's code and the answer that shows it ran (text, or stdout for bash).
LANGUAGES = {
    "javascript": ("1+1", "2"),
    "typescript": ("const two: number = 1 + 1; two", "2"),
    "r": ("1+1", "[1] 2"),
    "java": ("1+1", "2"),
    "bash": ("echo 2", "2\n"),
}


def _answer(execution: Any, language: str) -> str | None:
    """What a run answered: bash prints, IRkernel sends its values as display data (no main result)."""
    if language == "bash":
        return "".join(execution.logs.stdout)
    texts = [str(result.text) for result in execution.results if result.text is not None]
    return texts[0] if len(texts) == 1 else None


def _interpreter_first_run() -> tuple[float, float]:
    start = time.perf_counter()
    sbx = Sandbox.create()
    try:
        created = time.perf_counter()
        execution = sbx.run_code("1+1")
        ran = time.perf_counter()
        if execution.text != "2":  # a broken answer would make the timing meaningless
            raise SystemExit(f"run_code('1+1') answered {execution!r}")
        return created - start, ran - created
    finally:
        sbx.kill()


def _base_first_run() -> tuple[float, float]:
    start = time.perf_counter()
    sbx = BaseSandbox.create()
    try:
        created = time.perf_counter()
        sbx.commands.run("true")
        return created - start, time.perf_counter() - created
    finally:
        sbx.kill()


def _warm_up() -> None:
    for make in (Sandbox, BaseSandbox):
        sbx = make.create(request_timeout=WARM_UP_REQUEST_TIMEOUT_S)
        try:
            if make is Sandbox:
                sbx.run_code("1+1")
            else:
                sbx.commands.run("true")
        finally:
            sbx.kill()


def main() -> None:
    sandboxes, runs, budget, pace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    _warm_up()
    time.sleep(pace)
    deadline = time.monotonic() + budget
    samples: dict[str, list[float]] = {
        name: []
        for name in (
            "interpreter_create",
            "interpreter_first_run",
            "interpreter_total",
            "base_create",
            "base_first_run",
            "base_total",
            "warm_run_code",
            "warm_commands_run",
        )
    }
    done: dict[str, Any] = {"sandboxes": 0, "runs": 0, "stopped_early": False}
    for _ in range(sandboxes):
        if time.monotonic() > deadline:
            done["stopped_early"] = True
            break
        created, ran = _interpreter_first_run()
        samples["interpreter_create"].append(created)
        samples["interpreter_first_run"].append(ran)
        samples["interpreter_total"].append(created + ran)
        time.sleep(pace)  # the interpreter's refill is over: the floor does not share the CPU with it
        created, ran = _base_first_run()
        samples["base_create"].append(created)
        samples["base_first_run"].append(ran)
        samples["base_total"].append(created + ran)
        done["sandboxes"] += 1
        time.sleep(pace)
    if runs:
        _warm_runs(runs, deadline, samples, done)
    print(json.dumps({"samples": samples, "done": done}))


def _warm_runs(runs: int, deadline: float, samples: dict[str, list[float]], done: dict[str, Any]) -> None:
    sbx = Sandbox.create()
    try:
        sbx.run_code("1+1")  # the first run of a sandbox is measured above, not here
        sbx.commands.run("true")
        for _ in range(runs):
            if time.monotonic() > deadline:
                done["stopped_early"] = True
                break
            start = time.perf_counter()
            sbx.run_code("1+1")
            samples["warm_run_code"].append(time.perf_counter() - start)
            start = time.perf_counter()
            sbx.commands.run("true")
            samples["warm_commands_run"].append(time.perf_counter() - start)
            done["runs"] += 1
        for language, (code, answer) in LANGUAGES.items():
            samples[f"warm_run_code_{language}"] = []
            first = sbx.run_code(code, language=language)  # starts the language's kernel: not timed
            if _answer(first, language) != answer:
                raise SystemExit(f"{language}: run_code({code!r}) answered {first!r}")
            for _ in range(runs):
                if time.monotonic() > deadline:
                    done["stopped_early"] = True
                    break
                start = time.perf_counter()
                sbx.run_code(code, language=language)
                samples[f"warm_run_code_{language}"].append(time.perf_counter() - start)
    finally:
        sbx.kill()


if __name__ == "__main__":
    main()
