"""A docker container whose removal is already under way is waited for, not reported as a failed kill."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest
import requests

from runtime import docker as docker_backend


class Engine:
    """``api.remove_container`` answering from a script: an exception to raise, or None for success."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.api = SimpleNamespace(remove_container=self.remove_container)

    def remove_container(self, name: str, *, force: bool) -> None:
        assert force
        self.calls += 1
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


def api_error(status: int, explanation: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError("remove", response=response, explanation=explanation)


IN_PROGRESS = "removal of container e2b-x is already in progress"


def remove(engine: Engine) -> None:
    backend: Any = SimpleNamespace(_docker=engine)
    docker_backend.DockerBackend._remove_container(backend, "e2b-x")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runtime.docker.time.sleep", lambda seconds: None)


def test_a_removal_in_progress_is_waited_for_until_the_container_is_gone() -> None:
    engine = Engine(api_error(409, IN_PROGRESS), api_error(409, IN_PROGRESS), docker.errors.NotFound("gone"))
    remove(engine)
    assert engine.calls == 3


def test_a_removed_or_missing_container_is_fine() -> None:
    remove(Engine(None))
    remove(Engine(docker.errors.NotFound("gone")))


def test_another_conflict_is_an_error() -> None:
    with pytest.raises(docker.errors.APIError):
        remove(Engine(api_error(409, "container is paused and must be unpaused first")))


def test_a_removal_that_never_ends_is_an_error_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 10_000, 60))
    monkeypatch.setattr("runtime.docker.time.monotonic", lambda: float(next(clock)))
    with pytest.raises(docker.errors.APIError):
        remove(Engine(*[api_error(409, IN_PROGRESS)] * 10))
