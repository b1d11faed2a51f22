"""One mutant's run, in a process of its own started in the mutated copy of the tree.

``python -m conformance._mutant_child SPEC.json`` is started by ``_mutant_run`` with the copy as
its working folder, so this process, and the ``e2b-compat serve`` that ``ManagedServer`` starts
from it (``cwd`` = the copy, ``python -m``), import the copy's packages first: the editable
install's finder comes after the working folder on the import path. The server builds its
templates from the copy too (``runtime.templates`` takes the checkout it is imported from), so
the agent in every sandbox is the copy's; this process checks it by comparing the mutated file
with the one installed in each template the server made.

Progress goes to ``results.jsonl`` in the spec's work folder, one JSON object per line, so the
session still knows what was seen if this process is stopped at the mutant's time limit:
``{"event": "verified"|"start-failed"|"not-in-sandbox"|"case"|"done", ...}``. SIGTERM unwinds
(the server is stopped and its sandboxes released) before the process ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

from . import _harness
from ._cases import CASES
from ._endpoint import EndpointError, ManagedServer
from ._harness import ClientSet, RunPlan
from ._model import Outcome
from ._registry import offered_image
from ._wire import run_wire_cases

__all__: list[str] = []  # started as a program by ``_mutant_run``

SITE_PACKAGES = "opt/e2b-compat/venv/lib"  # where the agent's venv lives in a template's rootfs
_TEMPLATE_LINE = re.compile(r"template (\S+): ([0-9a-f]{16})$")  # what ``serve`` says per template


class _Progress:
    """Appends events to ``results.jsonl``, one line each, flushed at once (threads share it)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        with self._lock, self._path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, **fields}) + "\n")


def _stop_on_sigterm() -> None:
    def unwind(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # runs the finally blocks: server stopped, sandboxes released

    signal.signal(signal.SIGTERM, unwind)


def _module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def check_import(copy: Path, file: str) -> str:
    """How the mutated module is imported here (the server resolves imports the same way): from the copy."""
    spec = importlib.util.find_spec(_module_of(file))
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    expected = (copy / file).resolve()
    if origin != expected:
        raise RuntimeError(f"{_module_of(file)} is imported from {origin}, not from the mutated copy {expected}")
    return f"{file} imported from the mutated copy"


def templates_made(log: str) -> dict[str, str]:
    """name → key prefix of every template the server said it built or found."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        match = _TEMPLATE_LINE.search(line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def check_templates(cache: Path, made: dict[str, str], copy: Path, file: str) -> str:
    """Every template the server made holds exactly the copy's version of ``file`` in its agent venv."""
    wanted = (copy / file).read_bytes()
    seen = []
    for name, key in sorted(made.items()):
        root = cache / "templates" / f"{name}-{key}" / "rootfs" / SITE_PACKAGES
        installed = sorted(root.glob(f"python3*/site-packages/{file}"))
        if len(installed) != 1:
            raise RuntimeError(f"template {name}-{key} has {len(installed)} copies of {file} under {root}")
        if installed[0].read_bytes() != wanted:
            raise RuntimeError(f"template {name}-{key} holds another {file} than the mutated copy")
        seen.append(f"{name}-{key}")
    if not seen:
        raise RuntimeError("the server named no template it built")
    return f"{file} in templates {', '.join(seen)} is the mutated copy's"


def _record_pid(server: ManagedServer, where: Path, stop: threading.Event) -> None:
    # ``start`` blocks until the server is ready (a template build may come first); the session
    # needs the pid before that, to end the server itself should this process be killed.
    while not stop.wait(0.2):
        if server.process is not None:
            where.write_text(str(server.process.pid))
            return


def _run(spec: dict[str, Any], progress: _Progress) -> None:
    copy = Path.cwd()
    work = Path(spec["workdir"])
    cache = Path(spec["cache"])
    file = spec.get("file")
    if file is not None and not spec["in_sandbox"]:
        progress("verified", text=check_import(copy, file))
    runs = [(str(case), str(flavour)) for case, flavour in spec["runs"]]
    cases = {case.name: case for case in CASES}
    clients = ClientSet.ensure(None, None)
    data_dir = work / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)  # idmapped sandbox users traverse to their layers
    templates = ",".join(spec["templates"])
    server = ManagedServer(
        data_dir,
        work / "server.log",
        extra_env={"E2B_COMPAT_CACHE": str(cache), "E2B_COMPAT_SERVER_TEMPLATES": templates},
        template=templates,
    )
    started = time.monotonic()
    stack = contextlib.ExitStack()  # the registry of the image cases, when one runs
    stop_pid = threading.Event()
    threading.Thread(target=_record_pid, args=(server, work / "server.pid", stop_pid), daemon=True).start()
    try:
        try:
            server.start()
        except EndpointError as exc:
            progress("start-failed", detail=str(exc)[-4000:])
            return
        finally:
            stop_pid.set()
        if file is not None and spec["in_sandbox"]:
            try:
                text = check_templates(cache, templates_made(server.log.read_text()), copy, file)
            except (OSError, RuntimeError) as exc:
                progress("not-in-sandbox", detail=str(exc))
                return
            progress("verified", text=text)
        progress("server", started_s=round(time.monotonic() - started, 1))
        if any(cases[case].second_owner for case, _ in runs if case in cases):
            server.second_api_key = server.issue_key("mutants-second-owner")
        # The harness's per-case limit is a module constant; this process exists for one
        # bounded run, so it takes the session's (shorter) limit instead.
        _harness.CASE_TIMEOUT_S = int(spec["case_timeout_s"])
        offer = None
        if any(cases[case].registry for case, _ in runs if case in cases):
            offer = stack.enter_context(offered_image())
        plan = RunPlan(server, (clients,), jobs=int(spec["jobs"]), registry=offer)

        def one(case: str, flavour: str) -> None:
            if flavour == "wire":
                found = [r for r in run_wire_cases(server.clients_env(), case) if r.case == case]
            elif case in cases:
                found = [_harness._run_one(plan, clients, cases[case], flavour)]
            else:
                found = []
            if not found:
                progress("case", case=case, flavour=flavour, passed=False, outcome="missing", detail="no such case")
            for result in found:
                detail = result.detail or result.reason
                passed = result.outcome is Outcome.PASS
                progress("case", case=case, flavour=flavour, passed=passed, outcome=result.outcome.value, detail=detail)

        pool = ThreadPoolExecutor(max_workers=max(1, plan.jobs), thread_name_prefix="mutant-case")
        try:
            for future in [pool.submit(one, case, flavour) for case, flavour in runs]:
                future.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # at SIGTERM: do not wait for running cases
        progress("done")
    finally:
        stack.close()
        server.stop()
        server.release_everything()
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    _stop_on_sigterm()
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    progress = _Progress(Path(spec["workdir"]) / "results.jsonl")
    _run(spec, progress)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
