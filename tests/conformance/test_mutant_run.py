"""The session's pure parts: the snapshot, mutant copies, the template cache, the lock, the child's report."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conformance._mutant_run import (
    _report_from,
    heavy_lock,
    judge,
    mutant_copy,
    read_progress,
    shared_cache,
    snapshot,
    source_files,
    templates_for,
)
from conformance._mutants import CaseKey, ErrorKind, Mutant, MutantOutcome, MutationError

A = CaseKey("envd/commands/foreground", "py-sync")
B = CaseKey("envd/commands/exit-code", "py-sync")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name, text in {
        "reference_server/_views.py": "CODE = 201\n",
        "runtime/agent/_http.py": "STATUS = 204\n",
        "ignored.log": "noise\n",
        ".gitignore": "*.log\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    _git(root, "init", "-q")
    _git(root, "add", "reference_server", ".gitignore")
    (root / "runtime" / "agent" / "new_untracked.py").write_text("X = 1\n")
    return root


def test_the_snapshot_has_what_git_lists_tracked_or_not_but_not_what_it_ignores(repo: Path, tmp_path: Path) -> None:
    listed = [".gitignore", "reference_server/_views.py", "runtime/agent/_http.py", "runtime/agent/new_untracked.py"]
    assert source_files(repo) == listed
    (repo / "reference_server" / "_views.py").write_text("CODE = 202\n")  # as on disk, not as committed
    snapshot(repo, tmp_path / "tree")
    assert (tmp_path / "tree" / "reference_server" / "_views.py").read_text() == "CODE = 202\n"
    assert not (tmp_path / "tree" / "ignored.log").exists()


def _mutant(file: str, old: str, new: str) -> Mutant:
    return Mutant("server/x/y", file, old, new, "changes it", ("envd/commands/foreground",))


def test_a_server_mutant_copy_links_the_snapshots_runtime(repo: Path, tmp_path: Path) -> None:
    copy = mutant_copy(repo, tmp_path / "copy", _mutant("reference_server/_views.py", "201", "200"))
    assert (copy / "reference_server" / "_views.py").read_text() == "CODE = 200\n"
    assert (repo / "reference_server" / "_views.py").read_text() == "CODE = 201\n"
    assert (copy / "runtime").is_symlink()
    assert (copy / "runtime").resolve() == (repo / "runtime").resolve()


def test_a_runtime_mutant_copy_has_its_own_runtime(repo: Path, tmp_path: Path) -> None:
    copy = mutant_copy(repo, tmp_path / "copy", _mutant("runtime/agent/_http.py", "204", "200"))
    assert not (copy / "runtime").is_symlink()
    assert (copy / "runtime" / "agent" / "_http.py").read_text() == "STATUS = 200\n"
    assert (repo / "runtime" / "agent" / "_http.py").read_text() == "STATUS = 204\n"


def test_a_copy_whose_snippet_is_gone_fails_loudly(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(MutationError, match="not found"):
        mutant_copy(repo, tmp_path / "copy", _mutant("reference_server/_views.py", "418", "200"))


def test_the_template_cache_links_only_finished_os_and_kernels_layers(tmp_path: Path) -> None:
    user = tmp_path / "user"
    for name in ("os-aaaa", "kernels-bbbb", "base-cccc", "os-unfinished"):
        (user / "templates" / name).mkdir(parents=True)
    for name in ("os-aaaa", "kernels-bbbb", "base-cccc"):
        (user / "templates" / name / "template.json").write_text("{}")
    cache = shared_cache(tmp_path / "mine", user)
    linked = sorted(path.name for path in (cache / "templates").iterdir())
    assert linked == ["kernels-bbbb", "os-aaaa"]
    assert all((cache / "templates" / name).is_symlink() for name in linked)


def test_templates_follow_the_families_of_the_runs() -> None:
    assert templates_for([A]) == ("base",)
    assert templates_for([A, CaseKey("interpreter/run/basic", "js")]) == ("base", "code-interpreter-v1")
    assert templates_for([CaseKey("wire/interpreter/health", "wire")]) == ("base", "code-interpreter-v1")


def test_the_lock_is_waited_for_until_the_deadline_only(tmp_path: Path) -> None:
    lock = tmp_path / "heavy.lock"
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with heavy_lock(lock, time.monotonic() + 1.5) as had:
            assert had is False
        assert 1.0 < time.monotonic() - started < 5
    finally:
        os.close(holder)
    with heavy_lock(lock, time.monotonic() + 1) as had:
        assert had is True
    with heavy_lock(None, 0) as had:
        assert had is True


def _events(path: Path, *events: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(event) + "\n" for event in events) + '{"event": "ca')  # a cut line
    return path


def test_the_childs_progress_is_read_even_when_it_was_cut_short(tmp_path: Path) -> None:
    path = _events(
        tmp_path / "results.jsonl",
        {"event": "verified", "text": "from the copy"},
        {"event": "case", "case": A.case, "flavour": A.flavour, "passed": True, "detail": ""},
        {"event": "case", "case": B.case, "flavour": B.flavour, "passed": False, "detail": "exit 4"},
    )
    report = _report_from(read_progress(path), timed_out=True, log_tail="")
    assert report.observed == {A: (True, ""), B: (False, "exit 4")}
    assert (report.done, report.verified, report.timed_out) == (False, "from the copy", True)
    result = judge(_mutant("reference_server/_views.py", "1", "2"), [A, B], {A: (True, ""), B: (True, "")}, report, 3)
    assert result.outcome is MutantOutcome.KILLED, "a failure seen before the time limit still kills"
    assert read_progress(tmp_path / "absent.jsonl") == []


def test_a_server_that_did_not_start_is_an_error_of_its_own(tmp_path: Path) -> None:
    path = _events(tmp_path / "results.jsonl", {"event": "start-failed", "detail": "the server did not start: boom"})
    report = _report_from(read_progress(path), timed_out=False, log_tail="")
    result = judge(_mutant("reference_server/_views.py", "1", "2"), [A], {A: (True, "")}, report, 3)
    assert (result.outcome, result.error) == (MutantOutcome.ERROR, ErrorKind.START)
    assert "boom" in result.reason


def test_a_mutation_missing_from_the_sandbox_is_an_error_of_its_own(tmp_path: Path) -> None:
    path = _events(tmp_path / "results.jsonl", {"event": "not-in-sandbox", "detail": "another _http.py"})
    report = _report_from(read_progress(path), timed_out=False, log_tail="")
    result = judge(_mutant("runtime/agent/_http.py", "1", "2"), [A], {A: (True, "")}, report, 3)
    assert result.error is ErrorKind.NOT_IN_SANDBOX


def test_a_child_that_ended_without_finishing_is_a_crash(tmp_path: Path) -> None:
    path = _events(tmp_path / "results.jsonl", {"event": "case", "case": A.case, "flavour": A.flavour, "passed": True})
    report = _report_from(read_progress(path), timed_out=False, log_tail="Traceback: KeyError")
    result = judge(_mutant("reference_server/_views.py", "1", "2"), [A, B], {A: (True, ""), B: (True, "")}, report, 3)
    assert result.error is ErrorKind.CRASH
    assert "KeyError" in result.reason
