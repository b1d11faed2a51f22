"""One Hypothesis state machine that every sandbox backend must pass.

It drives create/start/pause/resume/kill/snapshot in random orders and checks each result
against the lifecycle table (``runtime.backend.TRANSITIONS``): allowed actions land in the
table's next state, refused ones raise ``TransitionError`` and change nothing, ``list`` and
``inspect`` agree with the model, kill is idempotent, snapshots need a live sandbox and work
as templates.

It runs for every entry of ``runtime.backends.BACKENDS``, opened through the table
(``open_backend``) as the server opens it: a backend added to the table is held to it from
then on. How a backend is tried (its state folder, template, number of runs, what it needs)
is a ``Trial``; a backend without one of its own gets the in-memory default.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from runtime.backend import (
    Action,
    Backend,
    Limits,
    SandboxNotFoundError,
    SandboxSpec,
    State,
    TemplateNotFoundError,
    TransitionError,
    next_state,
)
from runtime.backends import BACKENDS, BackendEntry, BackendOptions, backend_entry, open_backend
from runtime.fake import FakeBackend
from runtime.templates import ensure_template

T = TypeVar("T")


def backend_machine(make_backend: Callable[[], Backend], template: str, max_steps: int) -> type[RuleBasedStateMachine]:
    counter = itertools.count()

    class BackendMachine(RuleBasedStateMachine):
        sandboxes = Bundle("sandboxes")

        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.backend = make_backend()
            self.model: dict[str, State] = {}
            self.snapshots: list[str] = []
            self.started_from: dict[str, str] = {}  # sandbox → the snapshot it was created from
            self.taken_from: dict[str, str | None] = {}  # snapshot → the snapshot its source started from

        def run(self, coro: Coroutine[Any, Any, T]) -> T:
            return self.loop.run_until_complete(coro)

        def _new_id(self) -> str:
            return f"sm{next(counter)}x{id(self) % 10000}"

        @rule(target=sandboxes)
        def create(self) -> str:
            sandbox_id = self._new_id()
            info = self.run(self.backend.create(SandboxSpec(sandbox_id, template, limits=Limits(1, 256, 256))))
            assert info.state is State.CREATED
            self.model[sandbox_id] = State.CREATED
            return sandbox_id

        def _act(self, sandbox_id: str, action: Action, call: Callable[[], Coroutine[Any, Any, Any]]) -> None:
            state = self.model.get(sandbox_id)
            if state is None:
                with pytest.raises(SandboxNotFoundError):
                    self.run(call())
                return
            try:
                expected = next_state(state, action)
            except TransitionError:
                with pytest.raises(TransitionError):
                    self.run(call())
                assert self.run(self.backend.inspect(sandbox_id)).state is state, "a refused action changes nothing"
                return
            result = self.run(call())
            if action is not Action.SNAPSHOT:
                assert result.state is expected
                assert (result.host is not None) == (expected is State.RUNNING)
            self.model[sandbox_id] = expected

        @rule(sandbox_id=sandboxes)
        def start(self, sandbox_id: str) -> None:
            self._act(sandbox_id, Action.START, lambda: self.backend.start(sandbox_id))

        @rule(sandbox_id=sandboxes, memory=st.booleans())
        def pause(self, sandbox_id: str, memory: bool) -> None:
            action = Action.PAUSE_MEMORY if memory else Action.PAUSE_FILESYSTEM
            self._act(sandbox_id, action, lambda: self.backend.pause(sandbox_id, memory=memory))

        @rule(sandbox_id=sandboxes)
        def resume(self, sandbox_id: str) -> None:
            self._act(sandbox_id, Action.RESUME, lambda: self.backend.resume(sandbox_id))

        @rule(sandbox_id=sandboxes)
        def discard_memory(self, sandbox_id: str) -> None:
            self._act(sandbox_id, Action.DISCARD_MEMORY, lambda: self.backend.discard_memory(sandbox_id))

        @rule(sandbox_id=sandboxes)
        def snapshot(self, sandbox_id: str) -> None:
            state = self.model.get(sandbox_id)
            if state is None:
                with pytest.raises(SandboxNotFoundError):
                    self.run(self.backend.snapshot(sandbox_id))
                return
            try:
                next_state(state, Action.SNAPSHOT)
            except TransitionError:
                with pytest.raises(TransitionError):
                    self.run(self.backend.snapshot(sandbox_id))
                return
            snapshot_id = self.run(self.backend.snapshot(sandbox_id))
            self.snapshots.append(snapshot_id)
            self.taken_from[snapshot_id] = self.started_from.get(sandbox_id)
            assert self.run(self.backend.inspect(sandbox_id)).state is state, "a snapshot keeps the source as it was"

        @rule(target=sandboxes, data=st.data())
        def create_from_snapshot(self, data: st.DataObject) -> str:
            if not self.snapshots:
                sandbox_id = self._new_id()
                with pytest.raises(TemplateNotFoundError):
                    self.run(self.backend.create(SandboxSpec(sandbox_id, "snap-does-not-exist")))
                return sandbox_id
            snapshot_id = data.draw(st.sampled_from(self.snapshots))
            sandbox_id = self._new_id()
            self.run(self.backend.create(SandboxSpec(sandbox_id, snapshot_id, limits=Limits(1, 256, 256))))
            self.model[sandbox_id] = State.CREATED
            self.started_from[sandbox_id] = snapshot_id
            return sandbox_id

        @rule(data=st.data())
        def delete_snapshot(self, data: st.DataObject) -> None:
            if not self.snapshots:
                assert self.run(self.backend.delete_snapshot("snap-does-not-exist")) is False
                return
            snapshot_id = data.draw(st.sampled_from(self.snapshots))
            # In use while a live sandbox runs on it or another snapshot was taken on top of it.
            in_use = any(self.started_from.get(sandbox) == snapshot_id for sandbox in self.model) or any(
                parent == snapshot_id for parent in self.taken_from.values()
            )
            if in_use:
                with pytest.raises(TransitionError):
                    self.run(self.backend.delete_snapshot(snapshot_id))
                return
            assert self.run(self.backend.delete_snapshot(snapshot_id)) is True
            assert self.run(self.backend.delete_snapshot(snapshot_id)) is False, "a second delete finds nothing"
            self.snapshots.remove(snapshot_id)
            del self.taken_from[snapshot_id]
            with pytest.raises(TemplateNotFoundError):
                self.run(self.backend.create(SandboxSpec(self._new_id(), snapshot_id)))

        @rule(sandbox_id=consumes(sandboxes))
        def kill(self, sandbox_id: str) -> None:
            existed = sandbox_id in self.model
            assert self.run(self.backend.kill(sandbox_id)) is existed
            assert self.run(self.backend.kill(sandbox_id)) is False, "kill is idempotent"
            self.model.pop(sandbox_id, None)
            self.started_from.pop(sandbox_id, None)
            with pytest.raises(SandboxNotFoundError):
                self.run(self.backend.inspect(sandbox_id))

        @invariant()
        def listing_matches_the_model(self) -> None:
            listed = {info.sandbox_id: info.state for info in self.run(self.backend.list())}
            assert listed == self.model

        def teardown(self) -> None:
            for sandbox_id in list(self.model):
                self.run(self.backend.kill(sandbox_id))
            self.loop.close()

    BackendMachine.TestCase.settings = settings(max_examples=max_steps, stateful_step_count=12, deadline=None)
    return BackendMachine


@dataclass(frozen=True)
class Trial:
    options: BackendOptions
    template: str
    max_steps: int


@contextlib.contextmanager
def in_memory_trial(tmp_path: Path) -> Iterator[Trial]:
    yield Trial(BackendOptions(state_dir=tmp_path), "base", max_steps=60)


@contextlib.contextmanager
def crun_trial(tmp_path: Path) -> Iterator[Trial]:
    ensure_template("base")  # built (or found) once, before anything is timed or generated
    # Not under pytest's private temp root: sandbox root is an unprivileged uid and must reach its bundle.
    folder = Path(tempfile.mkdtemp(prefix="e2b-compat-crun-", dir="/var/tmp"))
    folder.chmod(0o755)
    try:
        yield Trial(BackendOptions(state_dir=folder), "base", max_steps=4)
    finally:
        leftovers = [line for line in Path("/proc/mounts").read_text().splitlines() if str(folder) in line]
        assert not leftovers, f"mounts left behind: {leftovers}"
        shutil.rmtree(folder)


@contextlib.contextmanager
def docker_trial(tmp_path: Path) -> Iterator[Trial]:
    from .test_docker import docker_leftovers, stop_engine_if_started_here

    ensure_template("base")
    folder = Path(tempfile.mkdtemp(prefix="e2b-compat-docker-", dir="/var/tmp"))
    try:
        yield Trial(BackendOptions(state_dir=folder), "base", max_steps=4)
        assert docker_leftovers(folder) == [], "containers or snapshot images left behind"
    finally:
        shutil.rmtree(folder)
        stop_engine_if_started_here()


TRIALS: dict[str, Callable[[Path], contextlib.AbstractContextManager[Trial]]] = {
    "crun": crun_trial,
    "docker": docker_trial,
    "gvisor": crun_trial,  # the same OCI bundle folder; runsc's state goes under it
}
MARKS: dict[str, list[pytest.MarkDecorator]] = {
    "crun": [
        pytest.mark.artifacts,
        pytest.mark.skipif(os.geteuid() != 0, reason="crun sandboxes need root (namespaces, mounts, cgroups)"),
    ],
    "docker": [
        pytest.mark.artifacts,
        pytest.mark.skipif(os.geteuid() != 0, reason="our own Docker Engine and its containers need root"),
    ],
    "gvisor": [
        pytest.mark.artifacts,
        pytest.mark.skipif(os.geteuid() != 0, reason="gVisor sandboxes need root (namespaces, mounts, cgroups)"),
    ],
}


def check_backend(name: str, tmp_path: Path) -> None:
    """The shared state machine on the table's backend ``name``, opened as the server opens it."""
    entry = backend_entry(name)
    entry.prepare_host(lambda message: print(f"host set-up ({name}): {message}"))
    with TRIALS.get(name, in_memory_trial)(tmp_path) as trial:
        machine = backend_machine(lambda: open_backend(name, trial.options), trial.template, trial.max_steps)
        machine.TestCase().runTest()


@pytest.mark.parametrize("name", [pytest.param(name, marks=MARKS.get(name, [])) for name in BACKENDS])
def test_backend_conformance(name: str, tmp_path: Path) -> None:
    check_backend(name, tmp_path)


def test_a_backend_added_to_the_table_is_held_to_the_same_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[FakeBackend] = []

    def open_copy(options: BackendOptions) -> FakeBackend:
        opened.append(FakeBackend())
        return opened[-1]

    monkeypatch.setitem(BACKENDS, "fake-copy", BackendEntry("fake-copy", open_copy, lambda say: None, "a copy"))
    check_backend("fake-copy", tmp_path)
    assert opened, "the machine ran on backends the table opened"


def test_a_broken_backend_in_the_table_fails_the_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine has teeth: a backend that lets a killed sandbox linger is caught."""

    class Lingering(FakeBackend):
        async def kill(self, sandbox_id: str) -> bool:
            return sandbox_id in self._sandboxes  # reports success, releases nothing

    entry = BackendEntry("lingering", lambda options: Lingering(), lambda say: None, "broken on purpose")
    monkeypatch.setitem(BACKENDS, "lingering", entry)
    with pytest.raises(AssertionError):
        check_backend("lingering", tmp_path)
