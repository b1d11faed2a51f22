"""The control plane's error answers: one exception, one body shape, one table of texts.

Every refusal the server makes is ``{"code": <HTTP status as an integer>, "message": "..."}``
with that status (docs/PROTOCOL-NOTES.md, Control plane): the JS client tells "not found" and "conflict" apart by the
body's ``code`` and the Python client puts ``message`` into its exception text, so the shape is
part of the contract, not decoration. Handlers raise ``ApiError``; the app turns it into the
response, and anything else that escapes becomes a 500 with no detail (the traceback goes to the
log, never to the client).

Exceptions::

    ApiError (status, message, headers)   raised anywhere below a handler; answered as above,
                                          with its headers (``Retry-After``, ``Should-Retry``)

Failures of the runtime (``runtime.backend.SandboxRuntimeError`` and its subclasses) become
``ApiError`` in one place, ``runtime_refusal``, by the table ``RUNTIME_ANSWERS``.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from runtime.backend import SandboxRuntimeError, TemplateNotFoundError, TransitionError

__all__ = ["RUNTIME_ANSWERS", "ApiError", "error_response", "runtime_refusal"]

# The fixed texts, by status (what upstream says in each case, in our words).
UNAUTHORIZED = "Invalid authentication credentials"
MISSING_KEY = "Missing API key: send it in the X-API-Key header"
SANDBOX_NOT_FOUND = "Sandbox not found"
SNAPSHOT_NOT_FOUND = "Snapshot not found"
TEMPLATE_NOT_FOUND = "Template '{template}' not found"
SANDBOX_NOT_RUNNING = "Sandbox is not running"
LIFECYCLE_CONFLICT = "Sandbox lifecycle conflict"
MEMORY_SNAPSHOT_WITH_VOLUMES = "A snapshot of a sandbox with volumes mounted keeps its files only, not its memory"
ALREADY_PAUSED = "Sandbox is already paused"
ALREADY_RUNNING = "Sandbox is already running"
SNAPSHOT_IN_USE = "Snapshot is in use"
INVALID_CURSOR = "Invalid pagination cursor"
INTERNAL = "Internal server error"
BODY_TOO_LARGE = "Request body is too large"
ROUTE_NOT_FOUND = "Not found"
NOT_ON_BACKEND = "This server's isolation backend ({backend}) does not support {what}"
METHOD_NOT_ALLOWED = "Method not allowed"
VOLUME_NOT_FOUND = "Volume not found"
VOLUME_MOUNT_UNAVAILABLE = "Volume mount is unavailable"
VOLUME_EXISTS = "Volume already exists"
VOLUME_IN_USE = "Volume is in use"
GUEST_NOT_RESPONDING = "The sandbox's agent is not responding: it was not paused; retry later"
INVALID_VOLUME_TOKEN = "Invalid volume token"  # noqa: S105 - a message, not a secret


class ApiError(Exception):
    """A refusal with its HTTP status and a message safe to show to the caller."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r})"


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


# -- runtime failures → answers ---------------------------------------------------------------
# The one table that turns a backend's error tree (runtime.backend) into what the clients get.
# Keys are (operation, error class); "*" is any operation. The most specific class of the error's
# MRO wins, and an operation's own line wins over "*". Every runtime failure not named here is a
# 500 with no detail: the runtime's message (which may name host paths) goes to the log only.
ANY_OPERATION = "*"
RUNTIME_ANSWERS: dict[tuple[str, type[SandboxRuntimeError]], tuple[int, str]] = {
    ("create", TemplateNotFoundError): (404, TEMPLATE_NOT_FOUND),
    ("delete_template", TransitionError): (409, SNAPSHOT_IN_USE),
    (ANY_OPERATION, SandboxRuntimeError): (500, INTERNAL),
}


def runtime_refusal(operation: str, exc: SandboxRuntimeError, **context: str) -> ApiError:
    """The answer for ``exc`` raised by the runtime during ``operation`` (``context`` fills the text)."""
    for kind in type(exc).__mro__:
        if not issubclass(kind, SandboxRuntimeError):
            break
        for key in ((operation, kind), (ANY_OPERATION, kind)):
            answer = RUNTIME_ANSWERS.get(key)
            if answer is not None:
                status, message = answer
                return ApiError(status, message.format(**context))
    return ApiError(500, INTERNAL)
