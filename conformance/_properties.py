"""Property-based cases through the official clients: Hypothesis draws the examples, one run plays them.

Hypothesis generates file paths and contents, command output, exit codes and environments
(derandomized, so a run is repeatable); the scenario ``properties/batch`` plays every example on
one sandbox through the official client and returns what it saw, and the harness compares. One
client process per batch keeps it fast; the price is no shrinking, so a failure lists the
examples that differed as generated.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ._model import CaseResult, ClientInfo, Outcome
from ._scenarios import SCENARIOS, ScenarioError, ScenarioRunner

__all__ = ["FLAVOURS", "draw_examples", "property_results"]

T = TypeVar("T")
FLAVOURS = ("py-sync", "js")
EXAMPLES = 25
WORKDIR = "/home/user"
FILES_OPERATIONS = (
    "control.sandboxes.create",
    "control.sandboxes.kill",
    "envd.http.files_upload",
    "envd.http.files_download",
)
COMMANDS_OPERATIONS = ("control.sandboxes.create", "control.sandboxes.kill", "envd.process.Start")

# Names a file system accepts, including spaces and non-ASCII, never "/" or NUL; "." and ".." are
# not names of new files.
_SEGMENT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/\x00", exclude_categories=("Cs", "Cc")),
    min_size=1,
    max_size=12,
).filter(lambda name: name not in (".", ".."))
_FILE = st.tuples(st.lists(_SEGMENT, min_size=1, max_size=3), st.binary(max_size=4096))
# The utf-8 codec already leaves out surrogates; NUL cannot be in a command line or an environment.
_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=80)
_NAME = st.from_regex(r"P_[A-Z][A-Z0-9_]{0,10}", fullmatch=True)
_COMMAND = st.tuples(
    _TEXT, _TEXT, st.integers(0, 255), st.dictionaries(_NAME, _TEXT.filter(lambda v: "\n" not in v), max_size=4)
)


def draw_examples(strategy: st.SearchStrategy[T], count: int) -> list[T]:
    """``count`` examples of ``strategy``, the same ones every run (no database, derandomized)."""
    found: list[T] = []

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: T) -> None:
        found.append(example)

    collect()
    return found[:count]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def examples(count: int = EXAMPLES) -> dict[str, Any]:
    files = [
        {"path": f"props/{index}/" + "/".join(segments), "data": base64.b64encode(data).decode("ascii")}
        for index, (segments, data) in enumerate(draw_examples(_FILE, count))
    ]
    commands = []
    for out, err, code, envs in draw_examples(_COMMAND, count):
        printing = "".join(f"printf '%s=%s\\n' {name} \"${name}\"; " for name in envs)
        cmd = f"printf %s {_b64(out)} | base64 -d; printf %s {_b64(err)} | base64 -d >&2; {printing}exit {code}"
        expected_out = out + "".join(f"{name}={value}\n" for name, value in envs.items())
        commands.append(
            {"cmd": cmd, "envs": envs, "expect": {"exit_code": code, "stdout": expected_out, "stderr": err}}
        )
    return {"files": files, "commands": commands}


def _check_files(batch: dict[str, Any], seen: list[dict[str, Any]]) -> list[str]:
    problems = []
    for example, got in zip(batch["files"], seen, strict=False):
        expected = hashlib.sha256(base64.b64decode(example["data"])).hexdigest()
        if got["sha256"] != expected:
            problems.append(f"{example['path']!r}: read back {got['sha256'][:12]}…, wrote {expected[:12]}…")
    if len(seen) != len(batch["files"]):
        problems.append(f"{len(seen)} results for {len(batch['files'])} files")
    return problems


def _check_commands(batch: dict[str, Any], seen: list[dict[str, Any]]) -> list[str]:
    problems = []
    for example, got in zip(batch["commands"], seen, strict=False):
        if got != example["expect"]:
            problems.append(f"{example['cmd'][:120]!r} with envs {sorted(example['envs'])}: got {got!r:.300}")
    if len(seen) != len(batch["commands"]):
        problems.append(f"{len(seen)} results for {len(batch['commands'])} commands")
    return problems


def property_results(
    runner_for: Callable[[str], ScenarioRunner], info: Callable[[str], ClientInfo], count: int = EXAMPLES
) -> list[CaseResult]:
    """Both property cases for every flavour that has the batch scenario."""
    batch = examples(count)
    results = []
    with tempfile.TemporaryDirectory(prefix="e2b-compat-properties-") as folder:
        path = Path(folder) / "examples.json"
        path.write_text(json.dumps(batch, ensure_ascii=False), encoding="utf-8")
        for flavour in FLAVOURS:
            runner = runner_for(flavour)
            client = info(flavour)
            try:
                ran = runner.run(flavour, "properties/batch", 600, str(path))
            except (ScenarioError, subprocess.TimeoutExpired) as exc:
                for name, operations in (("files", FILES_OPERATIONS), ("commands", COMMANDS_OPERATIONS)):
                    results.append(
                        CaseResult(f"properties/{name}", client, Outcome.FAIL, 0.0, operations, detail=str(exc))
                    )
                continue
            for name, operations, check in (
                ("files", FILES_OPERATIONS, _check_files),
                ("commands", COMMANDS_OPERATIONS, _check_commands),
            ):
                problems = check(batch, ran.result[name])
                outcome = Outcome.FAIL if problems else Outcome.PASS
                detail = (
                    f"{len(problems)} of {count} examples differed:\n" + "\n".join(problems[:5]) if problems else ""
                )
                results.append(
                    CaseResult(
                        f"properties/{name}", client, outcome, ran.duration_s / 2, operations, detail, traces=ran.traces
                    )
                )
    return results


def envd_runner(python: Any, node: Any, env: dict[str, str]) -> Callable[[str], ScenarioRunner]:
    def make(flavour: str) -> ScenarioRunner:
        return ScenarioRunner(python, node, env=env, workdir=lambda name: WORKDIR, scripts=SCENARIOS / "envd")

    return make
