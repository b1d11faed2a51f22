"""``e2b-compat conformance mutants``: plant each curated mutant in a copy of the tree, run its cases.

Order of a session (docs/MUTANTS.md):

1. **Snapshot.** The files git knows in the checkout (tracked and untracked-but-not-ignored, as
   they are on disk) are copied to a scratch folder once; the checkout is never written. Every
   mutant is checked against the snapshot first: a snippet that is missing or ambiguous, or a
   case selector that names no case, makes that mutant an error and the session's exit status 1.
2. **Template cache.** The servers get a cache of their own (``E2B_COMPAT_CACHE``) in which the
   user's ``os`` and ``kernels`` layers appear as links: mutant templates are built and pruned
   there, never in the user's cache that other runs share.
3. **Baseline.** A server started from the unmutated snapshot runs every case any mutant names;
   only the runs that pass there count.
4. **Mutants**, one at a time, each in a fresh copy of the snapshot with the one change, by a
   process started in that copy (``_mutant_child``), under the shared heavy-test lock (taken per
   mutant, so other heavy runs can go in between) and a time limit. A mutant outside ``runtime/``
   gets the snapshot's ``runtime`` as a link: the server then builds its templates from the
   snapshot, whose key the baseline already built, instead of rebuilding an identical agent.
   Those mutants run first, before the agent mutants' templates push the baseline's out of the
   cache (it keeps three of each).
5. ``mutants.json`` and ``mutants.md`` (``_mutant_report``); scratch folders removed.

The session stops by itself: mutants that would start after its budget are reported ``not-run``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from contract import default_cache_root

from ._cases import CASES, FAMILY_TEMPLATES
from ._endpoint import ManagedServer
from ._mutant_catalog import MUTANTS
from ._mutant_report import MutantRun, default_mutants_directory, write_outputs
from ._mutants import (
    CaseKey,
    ErrorKind,
    Mutant,
    MutantOutcome,
    MutantResult,
    MutationError,
    apply_mutation,
    apply_to_tree,
    classify,
    expand_selectors,
    score,
)
from ._wire import WIRE_CASES

__all__ = ["HEAVY_LOCK", "MutantOptions", "main_mutants"]

REPO = Path(__file__).resolve().parent.parent
HEAVY_LOCK = Path("/tmp/e2b-heavy-tests.lock")  # noqa: S108 - the machine's shared lock for runs that start sandboxes
SHARED_LAYERS = ("os-", "kernels-")  # slow to build, never mutated: linked from the user's cache
_GRACE_S = 90  # after SIGTERM at the time limit: long enough to stop the server and release sandboxes


@dataclass(frozen=True)
class MutantOptions:
    match: str  # only mutants whose id contains this
    budget_s: float  # the whole session; mutants that would start later are not run
    mutant_timeout_s: float
    case_timeout_s: float
    jobs: int  # case runs side by side against one mutant
    output: Path | None
    reports_root: Path
    lock: Path | None  # None: the caller holds the heavy-test lock itself
    keep: bool = False  # keep the scratch folders (copies, logs) for a look afterwards
    list_only: bool = False


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def known_cases() -> dict[str, tuple[str, ...]]:
    """Every case name → its flavours; wire cases have the one flavour ``wire``."""
    return {case.name: case.flavours for case in CASES} | {case.name: ("wire",) for case in WIRE_CASES}


def templates_for(keys: Sequence[CaseKey]) -> tuple[str, ...]:
    """The templates the server must offer for these runs (``base`` always: it is the default)."""
    families = {case.name: case.family for case in CASES}
    needed = {"base"}
    for key in keys:
        if families.get(key.case) == "interpreter" or key.case.startswith("wire/interpreter/"):
            needed.add(FAMILY_TEMPLATES["interpreter"])
    return tuple(sorted(needed))


def source_files(repo: Path) -> list[str]:
    """What ``git`` lists in the checkout (tracked, plus untracked files not ignored) that exists on disk."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8", "surrogateescape")
    return sorted(name for name in dict.fromkeys(listed.split("\0")) if name and (repo / name).is_file())


def describe_tree(repo: Path) -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    dirty = " with uncommitted changes" if git("status", "--porcelain") else ""
    return f"{repo} at {git('rev-parse', '--short=12', 'HEAD') or 'unknown'}{dirty}"


def snapshot(repo: Path, dest: Path) -> None:
    for name in source_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)


def mutant_copy(tree: Path, dest: Path, mutant: Mutant) -> Path:
    """A copy of the snapshot with the mutant applied (``runtime`` linked when the mutant is not in it)."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(tree, dest, symlinks=True, ignore=ignore)
    if not mutant.in_runtime:
        shutil.rmtree(dest / "runtime")
        (dest / "runtime").symlink_to(tree / "runtime", target_is_directory=True)
    apply_to_tree(dest, mutant)
    return dest


def shared_cache(dest: Path, user_cache: Path) -> Path:
    """A template cache whose ``os`` and ``kernels`` layers are links to the user's (read only: copied from)."""
    templates = dest / "templates"
    templates.mkdir(parents=True)
    mine = user_cache / "templates"
    for layer in sorted(mine.glob("*-*")) if mine.is_dir() else []:
        if layer.name.startswith(SHARED_LAYERS) and (layer / "template.json").is_file():
            (templates / layer.name).symlink_to(layer, target_is_directory=True)
    return dest


@contextmanager
def heavy_lock(path: Path | None, deadline: float) -> Iterator[bool]:
    """The shared lock for runs that start sandboxes, waited for until ``deadline``; yields whether it was had."""
    if path is None:
        yield True
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(1)
        yield True
    finally:
        os.close(fd)  # releases the lock


@dataclass(frozen=True)
class ChildReport:
    """What one child process left in its ``results.jsonl``."""

    observed: dict[CaseKey, tuple[bool, str]]
    done: bool
    start_failed: str | None
    not_in_sandbox: str | None
    verified: str
    timed_out: bool
    log_tail: str


def read_progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill
    return events


def _report_from(events: list[dict[str, Any]], timed_out: bool, log_tail: str) -> ChildReport:
    observed: dict[CaseKey, tuple[bool, str]] = {}
    verified, start_failed, not_in_sandbox, done = [], None, None, False
    for event in events:
        kind = event.get("event")
        if kind == "case":
            key = CaseKey(event["case"], event["flavour"])
            passed = bool(event["passed"]) and observed.get(key, (True, ""))[0]
            observed[key] = (passed, observed.get(key, (True, ""))[1] or str(event.get("detail", "")))
        elif kind == "verified":
            verified.append(str(event["text"]))
        elif kind == "start-failed":
            start_failed = str(event["detail"])
        elif kind == "not-in-sandbox":
            not_in_sandbox = str(event["detail"])
        elif kind == "done":
            done = True
    return ChildReport(observed, done, start_failed, not_in_sandbox, "; ".join(verified), timed_out, log_tail)


def _end_leftovers(work: Path) -> None:
    """After a child had to be killed: stop its server (its own process group) and release its sandboxes."""
    pid_file = work / "server.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)  # the group the child's ManagedServer made for it, nothing else
            except ProcessLookupError:
                break
            time.sleep(5)
    if (work / "data").exists():
        ManagedServer(work / "data", work / "server.log").release_everything()
        shutil.rmtree(work / "data", ignore_errors=True)


def run_child(copy: Path, work: Path, spec: dict[str, Any], timeout_s: float) -> ChildReport:
    """Start ``_mutant_child`` in ``copy`` and wait for it, at most ``timeout_s`` (then SIGTERM, then SIGKILL)."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({**spec, "workdir": str(work)}), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # imports come from the copy alone
    log = work / "child.log"
    timed_out = False
    with log.open("w", encoding="utf-8") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "conformance._mutant_child", str(spec_path)],
            cwd=copy,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its scenario clients share its group; its server has its own
        )
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    if child.returncode != 0:
        _end_leftovers(work)
    tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])
    return _report_from(read_progress(work / "results.jsonl"), timed_out, tail)


def judge(
    mutant: Mutant, selected: list[CaseKey], baseline: dict[CaseKey, tuple[bool, str]], report: ChildReport, took: float
) -> MutantResult:
    """The mutant's result from its child's report: a start or placement failure, else ``classify``."""
    if report.start_failed is not None:
        reason = report.start_failed[-1500:]
        return MutantResult(mutant, MutantOutcome.ERROR, ErrorKind.START, reason, duration_s=took)
    if report.not_in_sandbox is not None:
        return MutantResult(
            mutant, MutantOutcome.ERROR, ErrorKind.NOT_IN_SANDBOX, report.not_in_sandbox, duration_s=took
        )
    passed = [key for key, (ok, _) in baseline.items() if ok]
    kind = ErrorKind.TIMEOUT if report.timed_out else ErrorKind.CRASH
    why = "the mutant's time limit passed" if report.timed_out else f"its runner ended early:\n{report.log_tail}"
    return classify(
        mutant,
        passed,
        selected,
        report.observed,
        complete=report.done,
        duration_s=took,
        verified=report.verified,
        incomplete=kind,
        incomplete_reason=why,
    )


def _list(mutants: Sequence[Mutant], console: Console) -> int:
    """``--list``: the catalog, each mutant checked against the checkout as it is."""
    known, broken = known_cases(), 0
    for mutant in mutants:
        try:
            apply_mutation((REPO / mutant.file).read_text(encoding="utf-8"), mutant)
            runs = ", ".join(map(str, expand_selectors(mutant.cases, known)))
            console.print(f"{mutant.id}  [dim]{mutant.file}[/dim]\n    {mutant.description}\n    runs: {runs}")
        except (OSError, MutationError, ValueError) as exc:
            broken += 1
            console.print(f"[red]{mutant.id}: {exc}[/red]")
    return 1 if broken else 0


def _prepare(mutants: Sequence[Mutant], tree: Path) -> tuple[dict[str, list[CaseKey]], list[MutantResult]]:
    """Each mutant's runs, or its error when it does not fit the snapshot (missing snippet, unknown case)."""
    known, runs, broken = known_cases(), {}, []
    for mutant in mutants:
        try:
            apply_mutation((tree / mutant.file).read_text(encoding="utf-8"), mutant)
        except (OSError, MutationError) as exc:
            broken.append(MutantResult(mutant, MutantOutcome.ERROR, ErrorKind.APPLY, str(exc)))
            continue
        try:
            runs[mutant.id] = expand_selectors(mutant.cases, known)
        except ValueError as exc:
            broken.append(MutantResult(mutant, MutantOutcome.ERROR, ErrorKind.SELECT, str(exc)))
    return runs, broken


def _spec(mutant: Mutant | None, runs: Sequence[CaseKey], cache: Path, options: MutantOptions) -> dict[str, Any]:
    return {
        "id": None if mutant is None else mutant.id,
        "file": None if mutant is None else mutant.file,
        "in_sandbox": mutant is not None and mutant.in_sandbox,
        "runs": [[key.case, key.flavour] for key in runs],
        "templates": list(templates_for(runs)),
        "cache": str(cache),
        "case_timeout_s": options.case_timeout_s,
        "jobs": options.jobs,
    }


@dataclass
class _Session:
    """What every mutant of one session shares."""

    options: MutantOptions
    root: Path  # the scratch folder
    tree: Path  # the unmutated snapshot
    cache: Path  # the servers' template cache
    deadline: float  # time.monotonic() at which the budget is spent
    baseline: dict[CaseKey, tuple[bool, str]]
    baseline_error: str = ""

    def one(self, mutant: Mutant, keys: list[CaseKey]) -> MutantResult:
        """Copy, mutate, run and judge one mutant; its copy is removed afterwards."""
        if self.baseline_error:
            return MutantResult(mutant, MutantOutcome.ERROR, ErrorKind.NOT_RUN, "the baseline did not run")
        if not any(self.baseline.get(key, (False, ""))[0] for key in keys):
            return classify(mutant, [], keys, {}, complete=True)
        began = time.monotonic()
        if self.deadline - began < 60:
            return MutantResult(mutant, MutantOutcome.ERROR, ErrorKind.NOT_RUN, "the session's time budget was spent")
        slug = mutant.id.replace("/", "-")
        copy = mutant_copy(self.tree, self.root / "copies" / slug, mutant)
        try:
            with heavy_lock(self.options.lock, self.deadline) as locked:
                waited = time.monotonic() - began
                if not locked:
                    why = "the shared lock was not free before the budget ran out"
                    return MutantResult(mutant, MutantOutcome.ERROR, ErrorKind.NOT_RUN, why, waited_s=waited)
                limit = min(self.options.mutant_timeout_s, self.deadline - time.monotonic())
                spec = _spec(mutant, keys, self.cache, self.options)
                report = run_child(copy, self.root / "work" / slug, spec, limit)
            result = judge(mutant, keys, self.baseline, report, time.monotonic() - began - waited)
            return replace(result, waited_s=waited)
        finally:
            if not self.options.keep:
                shutil.rmtree(copy, ignore_errors=True)

    def run_baseline(self, union: list[CaseKey]) -> None:
        with heavy_lock(self.options.lock, self.deadline) as locked:
            if not locked:
                self.baseline_error = f"the shared lock {self.options.lock} was not free within the budget"
                return
            spec = _spec(None, union, self.cache, self.options)
            report = run_child(self.tree, self.root / "baseline", spec, self.deadline - time.monotonic())
        self.baseline = report.observed
        if report.start_failed is not None or not report.done:
            self.baseline_error = report.start_failed or f"the baseline did not finish:\n{report.log_tail}"


def _verdict(result: MutantResult) -> str:
    verdict = result.outcome.value if result.error is None else f"error ({result.error.value})"
    killers = f" by {', '.join(map(str, result.killed_by))}" if result.killed_by else ""
    waited = f", {result.waited_s:.0f} s waiting for the shared lock" if result.waited_s >= 1 else ""
    return f"{verdict}{killers} ({result.duration_s:.0f} s{waited})"


def main_mutants(options: MutantOptions) -> int:
    console = Console(stderr=True, soft_wrap=True)  # one line per mutant, also in a log file
    mutants = [mutant for mutant in MUTANTS if options.match in mutant.id]
    if options.list_only:
        return _list(mutants, console)
    if not mutants:
        console.print(f"[red]no mutant id contains {options.match!r}[/red]")
        return 2
    started = _now()
    # Not under a private temp root: sandbox users must traverse to the servers' data folders.
    root = Path(tempfile.mkdtemp(prefix="e2b-compat-mutants-", dir="/var/tmp"))
    root.chmod(0o755)
    session = _Session(options, root, root / "tree", root / "cache", time.monotonic() + options.budget_s, {})
    results: list[MutantResult] = []
    try:
        snapshot(REPO, session.tree)
        shared_cache(session.cache, default_cache_root())
        runs, broken = _prepare(mutants, session.tree)
        results += broken
        union = sorted({key for keys in runs.values() for key in keys})
        console.print(f"mutants: {len(runs)} to run, {len(broken)} broken; baseline: {len(union)} runs ({root})")
        session.run_baseline(union)
        passed = sum(1 for ok, _ in session.baseline.values() if ok)
        console.print(f"baseline: {passed} of {len(session.baseline)} runs passed")
        # Mutants outside runtime/ first: they reuse the baseline's templates while the cache has them.
        order = sorted((m for m in mutants if m.id in runs), key=lambda m: m.in_runtime)
        for number, mutant in enumerate(order, 1):
            results.append(session.one(mutant, runs[mutant.id]))
            console.print(f"[{number}/{len(order)}] {mutant.id}: {_verdict(results[-1])}")
    finally:
        if not options.keep:
            shutil.rmtree(root, ignore_errors=True)
    run = MutantRun(
        started, _now(), describe_tree(REPO), session.baseline, tuple(results), options.budget_s, session.baseline_error
    )
    directory = options.output or default_mutants_directory(started, options.reports_root)
    document, markdown = write_outputs(directory, run)
    console.print(f"score: {score(results).text()}")
    for result in results:
        if result.outcome is MutantOutcome.SURVIVED:
            console.print(f"[yellow]survived[/yellow] {result.mutant.id}: {result.mutant.description}")
    console.print(f"written: {document} and {markdown}" + (f"; scratch kept in {root}" if options.keep else ""))
    if session.baseline_error:
        console.print(f"[red]baseline: {session.baseline_error.splitlines()[0]}[/red]")
        return 2
    return 1 if broken else 0
