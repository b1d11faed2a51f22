"""Progress of a template build, as events handed to one injectable callable.

A cold build runs for a minute or more (debootstrap, pip), so it says what it is doing.
The builder only emits ``ProgressEvent`` values; what happens to them is the caller's
choice: ``RichProgress`` draws a spinner with the elapsed time on a terminal,
``PlainProgress`` writes ``step: …`` lines for logs, and tests or the server pass any
function that takes an event (``list.append`` will do).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Protocol, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress as _LiveProgress
from rich.progress import SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column

__all__ = ["PlainProgress", "Progress", "ProgressEvent", "RichProgress", "default_progress", "step"]

State = Literal["start", "detail", "done", "failed", "note"]


@dataclass(frozen=True)
class ProgressEvent:
    """One thing that happened in a build.

    ``start``/``done``/``failed`` bracket a timed step (``elapsed`` in seconds since its
    start); ``detail`` is a line of the running command's output; ``note`` is a one-off
    message outside any step (a cached template, the mirror in use).
    """

    step: str
    state: State
    elapsed: float = 0.0
    detail: str = ""


class Progress(Protocol):
    """Receives the events of a build, in order; it runs on the building thread."""

    def __call__(self, event: ProgressEvent, /) -> None: ...


@contextmanager
def step(progress: Progress, title: str) -> Iterator[Callable[[str], None]]:
    """Report ``title`` as started, then done or failed; yields a function for output lines."""
    started = time.monotonic()
    progress(ProgressEvent(title, "start"))

    def detail(line: str) -> None:
        progress(ProgressEvent(title, "detail", time.monotonic() - started, line))

    try:
        yield detail
    except BaseException:
        # KeyboardInterrupt included: the reporter must not leave a spinner running.
        progress(ProgressEvent(title, "failed", time.monotonic() - started))
        raise
    progress(ProgressEvent(title, "done", time.monotonic() - started))


class PlainProgress:
    """``step: …`` lines without output details, for logs and CI."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def __call__(self, event: ProgressEvent, /) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        if event.state == "start":
            line = f"step: {event.step} …"
        elif event.state == "done":
            line = f"step: {event.step}: done in {event.elapsed:.1f} s"
        elif event.state == "failed":
            line = f"step: {event.step}: failed after {event.elapsed:.1f} s"
        elif event.state == "note":
            line = f"step: {event.step}"
        else:
            return  # command output only ever shows up in an error's tail
        print(line, file=stream, flush=True)


def _shrinking() -> Column:
    return Column(no_wrap=True, overflow="ellipsis", min_width=8)


class RichProgress:
    """A spinner, the elapsed time and the command's latest output line for the running step.

    Each step gets its own transient live display, replaced by a ✓ or ✗ line with the
    time it took once it ends, so nothing keeps redrawing between steps.
    """

    def __init__(self, console: Console | None = None) -> None:
        self._console = console if console is not None else Console(stderr=True)
        self._live: _LiveProgress | None = None
        self._task: TaskID | None = None

    def __call__(self, event: ProgressEvent, /) -> None:
        if event.state == "start":
            self._stop()
            self._live = _LiveProgress(
                SpinnerColumn(),
                # A narrow terminal shortens the texts, never the time.
                TimeElapsedColumn(table_column=Column(min_width=7, no_wrap=True)),
                TextColumn("{task.description}", table_column=_shrinking()),
                # Output lines are shown as they are: markup would misread their brackets.
                TextColumn("{task.fields[detail]}", style="dim", markup=False, table_column=_shrinking()),
                console=self._console,
                transient=True,
            )
            self._task = self._live.add_task(escape(event.step), total=None, detail="")
            self._live.start()
        elif event.state == "detail":
            if self._live is not None and self._task is not None:
                self._live.update(self._task, detail=event.detail[:80])
        elif event.state in ("done", "failed"):
            self._stop()
            mark = "[green]✓[/green]" if event.state == "done" else "[red]✗[/red]"
            self._console.print(f"{mark} {escape(event.step)} [dim]{event.elapsed:.1f} s[/dim]")
        else:
            self._console.print(f"[dim]·[/dim] {escape(event.step)}")

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
        self._live = None
        self._task = None


def default_progress(stream: TextIO | None = None) -> Progress:
    """``RichProgress`` when ``stream`` (default stderr) is a terminal, ``PlainProgress`` otherwise."""
    target = stream if stream is not None else sys.stderr
    if target.isatty():
        return RichProgress(Console(file=target))
    return PlainProgress(target)
