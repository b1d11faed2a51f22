"""Jupyter messages → the NDJSON lines of ``POST /execute`` (docs/PROTOCOL-NOTES.md, Code Interpreter).

Sans-IO: ``Tracker`` is fed one execution's kernel messages (iopub and the shell reply) and
returns the lines to write; it also says when the execution is over. Timing (keepalives, a
kernel that died, a client that left) is the caller's business; the lines the server makes
up for those cases are built here too, so every line shape lives in one module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

Line = dict[str, Any]

# MIME type in a display_data / execute_result bundle → field of the result line, in the
# order the fields are written. MIME types not listed are kept under "extra".
MIME_FIELDS: Final[tuple[tuple[str, str], ...]] = (
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("e2b/data", "data"),
    ("e2b/chart", "chart"),
)

# iopub message type → whether its bundle is the cell's own value (is_main_result).
RESULT_MESSAGES: Final[Mapping[str, bool]] = {"execute_result": True, "display_data": False}

# execute_reply statuses that mean the code never ran to its end without raising: ipykernel
# says "aborted", bash_kernel says "abort" (after an interrupt).
ABORT_STATUSES: Final[frozenset[str]] = frozenset({"abort", "aborted"})

KEEPALIVE: Final[Mapping[str, str]] = {"type": "keepalive"}
END_OF_EXECUTION: Final[Mapping[str, str]] = {"type": "end_of_execution"}


def result_line(bundle: Mapping[str, Any], *, is_main_result: bool) -> Line:
    """A ``result`` line: known MIME types become fields, the rest goes to ``extra``; null
    fields are left out. ``text/plain`` loses the quotes of a quoted string repr (as upstream:
    single quotes only, so ``'abc'`` becomes ``abc`` while ``"it's"`` stays as it is)."""
    line: Line = {"type": "result"}
    known = dict(MIME_FIELDS)
    for mime, name in MIME_FIELDS:
        value = bundle.get(mime)
        if value is not None:
            line[name] = plain_text(value) if mime == "text/plain" and isinstance(value, str) else value
    extra = {mime: value for mime, value in bundle.items() if mime not in known and value is not None}
    if extra:
        line["extra"] = extra
    line["is_main_result"] = is_main_result
    return line


def plain_text(text: str) -> str:
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        return text[1:-1]
    return text


def timestamp(date: object) -> str:
    """The message's header date as ISO 8601 (UTC with ``Z``, the way Jupyter's JSON writes it).

    jupyter_client hands header dates over as aware datetimes; a string is passed through,
    anything else (a message without a date) gets the current time.
    """
    if isinstance(date, str) and date:
        return date
    moment = date if isinstance(date, datetime) else datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def stream_line(name: str, text: str, date: object) -> Line | None:
    if name not in ("stdout", "stderr"):
        return None
    return {"type": name, "text": text, "timestamp": timestamp(date)}


def error_line(name: str, value: str, traceback: list[str] | str) -> Line:
    """An ``error`` line; the kernel's traceback entries joined with newlines."""
    text = traceback if isinstance(traceback, str) else "\n".join(str(entry) for entry in traceback)
    return {"type": "error", "name": name, "value": value, "traceback": text}


def number_of_executions(count: int) -> Line:
    return {"type": "number_of_executions", "execution_count": count}


# Errors the server makes up (their names are upstream's).
def unexpected_end(reason: str) -> Line:
    return error_line("UnexpectedEndOfExecution", reason, "")


def context_restarting() -> Line:
    return error_line("ContextRestarting", "Context was restarted", "")


def execution_aborted() -> Line:
    return error_line("ExecutionAborted", "Execution was aborted", "")


def encode(line: Mapping[str, Any]) -> bytes:
    """One NDJSON line. Non-finite floats (a NaN in a JSON result) become null: JavaScript's
    ``JSON.parse`` would refuse the whole line otherwise."""
    try:
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(line), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8", "surrogatepass") + b"\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


@dataclass
class Tracker:
    """One execution's messages in, lines out.

    The execution is over once the kernel went idle for it *and* its ``execute_reply``
    arrived (they come on different sockets, in either order). An error line is written at
    most once: from the iopub ``error`` message, or, failing that, from an error reply when
    the execution ends; an aborted reply without an error becomes ``ExecutionAborted``.
    """

    errored: bool = False
    idle: bool = False
    reply: Mapping[str, Any] | None = field(default=None)

    @property
    def finished(self) -> bool:
        return self.idle and self.reply is not None

    def iopub(self, message: Mapping[str, Any]) -> list[Line]:
        kind = message.get("msg_type")
        content: Mapping[str, Any] = message.get("content") or {}
        if kind == "status":
            if content.get("execution_state") == "idle":
                self.idle = True
            return []
        if kind == "execute_input":
            count = content.get("execution_count")
            return [number_of_executions(count)] if isinstance(count, int) else []
        if kind == "stream":
            line = stream_line(str(content.get("name")), str(content.get("text", "")), _date(message))
            return [line] if line else []
        is_main_result = RESULT_MESSAGES.get(str(kind))
        if is_main_result is not None:
            bundle = content.get("data")
            if not isinstance(bundle, Mapping):
                return []
            return [result_line(bundle, is_main_result=is_main_result)]
        if kind == "error":
            return self._error(content)
        # clear_output, update_display_data, comm messages: nothing a client reads.
        return []

    def shell(self, message: Mapping[str, Any]) -> list[Line]:
        if message.get("msg_type") == "execute_reply":
            self.reply = message.get("content") or {}
        return []

    def closing_lines(self) -> list[Line]:
        """Lines owed once the execution is over (before ``end_of_execution``)."""
        if self.reply is None or self.errored:
            return []
        status = self.reply.get("status")
        if status == "error":
            return self._error(self.reply)
        if status in ABORT_STATUSES:
            self.errored = True
            return [execution_aborted()]
        return []

    def _error(self, content: Mapping[str, Any]) -> list[Line]:
        if self.errored:
            return []
        self.errored = True
        traceback = content.get("traceback")
        return [
            error_line(
                str(content.get("ename", "")),
                str(content.get("evalue", "")),
                traceback if isinstance(traceback, list | str) else [],
            )
        ]


def _date(message: Mapping[str, Any]) -> object:
    header = message.get("header")
    return header.get("date") if isinstance(header, Mapping) else None
