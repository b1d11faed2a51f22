"""The one table from the backend's error tree to the clients' answers (``_errors.RUNTIME_ANSWERS``)."""

from __future__ import annotations

import pytest

from reference_server import _errors as text
from reference_server._errors import RUNTIME_ANSWERS, runtime_refusal
from runtime.backend import (
    BackendError,
    SandboxNotFoundError,
    SandboxRuntimeError,
    TemplateNotFoundError,
    TransitionError,
)

SECRET = "/var/lib/e2b-compat/runtime/sandboxes/x: token=abc"  # what a runtime message may carry


@pytest.mark.parametrize(
    ("operation", "error", "status", "message"),
    [
        ("create", TemplateNotFoundError(SECRET), 404, "Template 'base' not found"),
        ("delete_template", TransitionError(SECRET), 409, text.SNAPSHOT_IN_USE),
        ("create", BackendError(SECRET), 500, text.INTERNAL),
        ("pause", TransitionError(SECRET), 500, text.INTERNAL),
        ("resume", SandboxNotFoundError(SECRET), 500, text.INTERNAL),
        ("snapshot", SandboxRuntimeError(SECRET), 500, text.INTERNAL),
    ],
)
def test_runtime_failures_map_to_the_clients_answers(
    operation: str, error: SandboxRuntimeError, status: int, message: str
) -> None:
    answer = runtime_refusal(operation, error, template="base")
    assert (answer.status, answer.message) == (status, message)
    assert SECRET not in answer.message


def test_a_subclass_a_backend_adds_is_answered_by_its_base() -> None:
    class DiskFullError(BackendError):
        pass

    assert runtime_refusal("create", DiskFullError("no space")).status == 500


def test_every_row_names_a_runtime_error() -> None:
    for (_operation, kind), (status, message) in RUNTIME_ANSWERS.items():
        assert issubclass(kind, SandboxRuntimeError)
        assert 400 <= status < 600
        assert message
