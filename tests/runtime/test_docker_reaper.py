"""The docker backend's reaper: containers of killed sandboxes removed after the kill, folder last."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from runtime import _docker_reaper
from runtime._docker_reaper import Reaper


def killed(folder: Path, name: str, container: str | None = "e2b-c") -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "record.json").write_text(json.dumps({"sandbox_id": name, "container": container}))


def test_a_handed_in_folder_loses_its_container_then_goes(tmp_path: Path) -> None:
    removed: list[str] = []
    reaper = Reaper(tmp_path, removed.append, idle_s=0.1)
    killed(tmp_path, "a.1", "e2b-one")
    killed(tmp_path, "b.2", "e2b-two")
    reaper.submit("a.1")
    reaper.submit("b.2")
    assert reaper.wait(10)
    assert removed == ["e2b-one", "e2b-two"], "one at a time, in the order handed in"
    assert list(tmp_path.iterdir()) == []


def test_wait_is_bounded_while_a_removal_hangs(tmp_path: Path) -> None:
    release = threading.Event()

    def hang(name: str) -> None:
        release.wait(10)

    reaper = Reaper(tmp_path, hang, idle_s=0.1)
    killed(tmp_path, "a.1")
    reaper.submit("a.1")
    assert reaper.wait(0.3) is False
    assert (tmp_path / "a.1").is_dir(), "nothing is gone before the container is"
    release.set()
    assert reaper.wait(10)


def test_a_removal_that_keeps_failing_leaves_the_folder_for_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_docker_reaper, "_RETRY_PAUSE_S", 0.01)
    calls: list[str] = []

    def refuse(name: str) -> None:
        calls.append(name)
        raise OSError("the engine is away")

    reaper = Reaper(tmp_path, refuse, idle_s=0.1)
    killed(tmp_path, "a.1")
    reaper.submit("a.1")
    assert reaper.wait(10)
    assert len(calls) == _docker_reaper._RETRIES
    assert (tmp_path / "a.1" / "record.json").is_file(), "still on the to-do list"
    assert Reaper(tmp_path, lambda name: None).reap_now("a.1") is True, "the next reconcile finishes it"
    assert not (tmp_path / "a.1").exists()


def test_a_torn_or_containerless_record_only_loses_its_folder(tmp_path: Path) -> None:
    removed: list[str] = []
    reaper = Reaper(tmp_path, removed.append)
    killed(tmp_path, "never-made.1", container=None)
    (tmp_path / "torn.2").mkdir()
    (tmp_path / "torn.2" / "record.json").write_text("{")
    assert reaper.reap_now("never-made.1")
    assert reaper.reap_now("torn.2")
    assert reaper.reap_now("gone.3"), "finished already"
    assert removed == []
    assert list(tmp_path.iterdir()) == []


def test_the_worker_ends_when_idle_and_the_next_hand_in_starts_another(tmp_path: Path) -> None:
    removed: list[str] = []
    reaper = Reaper(tmp_path, removed.append, idle_s=0.05)
    killed(tmp_path, "a.1", "e2b-one")
    reaper.submit("a.1")
    assert reaper.wait(10)
    first = reaper._worker
    if first is not None:
        first.join(5)
    assert reaper._worker is None, "no thread stays behind once there is nothing to do"
    killed(tmp_path, "b.2", "e2b-two")
    reaper.submit("b.2")
    assert reaper.wait(10)
    assert removed == ["e2b-one", "e2b-two"]


def test_removals_wait_while_a_create_is_in_flight(tmp_path: Path) -> None:
    removed: list[str] = []
    reaper = Reaper(tmp_path, removed.append, idle_s=0.1)
    killed(tmp_path, "a.1", "e2b-one")
    with reaper.yielding():
        reaper.submit("a.1")
        assert reaper.wait(0.3) is False
        assert removed == [], "the create goes first"
    assert reaper.wait(10)
    assert removed == ["e2b-one"]


def test_a_removal_is_deferred_for_a_bounded_time_only(tmp_path: Path) -> None:
    removed: list[str] = []
    reaper = Reaper(tmp_path, removed.append, idle_s=0.1, max_defer_s=0.2)
    killed(tmp_path, "a.1", "e2b-one")
    with reaper.yielding():  # a create that never ends, or a steady stream of them
        reaper.submit("a.1")
        assert reaper.wait(10)
    assert removed == ["e2b-one"]
