"""The control plane's error answers: one exception, one body shape, one table of texts.

Every refusal the server makes is ``{"code": <HTTP status as an integer>, "message": "..."}``
with that status (PROTOCOL.md §8.1): the JS client tells "not found" and "conflict" apart by the
body's ``code`` and the Python client puts ``message`` into its exception text, so the shape is
part of the contract, not decoration. Handlers raise ``ApiError``; the app turns it into the
response, and anything else that escapes becomes a 500 with no detail (the traceback goes to the
log, never to the client).

Exceptions::

    ApiError (status, message)   raised anywhere below a handler; answered as above
"""

from __future__ import annotations

from starlette.responses import JSONResponse

__all__ = ["ApiError", "error_response"]

# The fixed texts, by status (what upstream says in each case, in our words).
UNAUTHORIZED = "Invalid authentication credentials"
MISSING_KEY = "Missing API key: send it in the X-API-Key header"
SANDBOX_NOT_FOUND = "Sandbox not found"
SNAPSHOT_NOT_FOUND = "Snapshot not found"
SANDBOX_NOT_RUNNING = "Sandbox is not running"
LIFECYCLE_CONFLICT = "Sandbox lifecycle conflict"
ALREADY_PAUSED = "Sandbox is already paused"
ALREADY_RUNNING = "Sandbox is already running"
SNAPSHOT_IN_USE = "Snapshot is in use"
INVALID_CURSOR = "Invalid pagination cursor"
INTERNAL = "Internal server error"
BODY_TOO_LARGE = "Request body is too large"
ROUTE_NOT_FOUND = "Not found"
METHOD_NOT_ALLOWED = "Method not allowed"


class ApiError(Exception):
    """A refusal with its HTTP status and a message safe to show to the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r})"


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)
