"""How a scenario script's exit is read: only a finished run's result counts (``conformance._scenarios``)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from conformance._scenarios import ScenarioError, parse

DONE = "py-async:envd/commands/timeout:start\npy-async:envd/commands/timeout:done\n"
RESULT = '{"raised": "TimeoutException"}\n'


def proc(returncode: int, stdout: str, stderr: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["script"], returncode, stdout, stderr)


def test_a_clean_exit_gives_the_last_result_line() -> None:
    assert parse(proc(0, "noise\n" + RESULT, DONE), "x") == {"raised": "TimeoutException"}


@pytest.mark.parametrize("crash", [-signal.SIGABRT, -signal.SIGSEGV])
def test_an_abort_after_the_done_trace_and_the_result_is_a_finished_run(crash: int) -> None:
    aborted = proc(crash, RESULT, DONE + "Fatal Python error: Aborted\n\n  <no Python frame>\n")
    assert parse(aborted, "x") == {"raised": "TimeoutException"}


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "why"),
    [
        (-signal.SIGABRT, RESULT, "py-async:envd/commands/timeout:start\n", "aborted before its done trace"),
        (-signal.SIGABRT, RESULT + "half a line", DONE, "the result is not the last output"),
        (-signal.SIGABRT, "", DONE, "no result at all"),
        (-signal.SIGSEGV, RESULT, "py-async:envd/commands/timeout:start\n", "a segfault before its done trace"),
        (-signal.SIGBUS, RESULT, DONE, "any other signal is a crash"),
        (-signal.SIGKILL, RESULT, DONE, "killed"),
        (1, RESULT, DONE, "a failing exit status"),
        (0, "no json here\n", DONE, "a clean exit without a result"),
    ],
)
def test_anything_else_is_a_failed_run(returncode: int, stdout: str, stderr: str, why: str) -> None:
    with pytest.raises(ScenarioError, match=f"exit {returncode}"):
        parse(proc(returncode, stdout, stderr), why)
