"""Removing killed docker sandboxes' containers off the kill's path.

A kill ends the sandbox at once: its processes get SIGKILL, its network namespace and address
lease go, and its folder moves from ``<state>/sandboxes/<id>`` to ``<state>/reaping/<id>.<tag>`` (nothing
lists, inspects or reaches it any more). What is left is the engine's slow part: removing the
container, whose writable layer is a btrfs subvolume with a qgroup. Under a burst that took the
engine more than a minute for 32 containers at once, past the clients' request timeout, while
the sandboxes were long gone for their users.

The reaper removes those containers one at a time on a thread of its own (the engine and btrfs
serialise them anyway; one at a time leaves the engine free for creates), then the folder. A
removal waits while a create or boot is in flight (``yielding``), at most ``MAX_DEFER_S``: those
are what a client is waiting for under its request timeout, a removal is only deferred work. The
``reaping/`` folder is the to-do list: a server that stops or crashes first leaves it to the next
reconcile (``runtime._docker_reconcile``), which finishes it before anything else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker.errors

from . import _hostfs

__all__ = ["MAX_DEFER_S", "REAPING", "Reaper"]

REAPING = "reaping"
MAX_DEFER_S = 30.0  # so removals still progress under a steady stream of creates
_RETRIES = 3
_RETRY_PAUSE_S = 1.0  # times the attempt: 1 s, then 2 s

_log = logging.getLogger(__name__)


class Reaper:
    """One worker thread removing the containers of folders under ``folder`` as they are handed in."""

    def __init__(
        self,
        folder: Path,
        remove_container: Callable[[str], None],
        *,
        idle_s: float = 5.0,
        max_defer_s: float = MAX_DEFER_S,
    ) -> None:
        self._folder = folder
        self._idle_s = idle_s  # how long the worker waits for more before it ends
        self._max_defer_s = max_defer_s
        self._remove = remove_container
        self._queue: queue.Queue[str] = queue.Queue()
        self._busy = 0  # handed in and not finished (queued or being removed)
        self._yielding_to = 0  # creates and boots in flight
        self._idle = threading.Condition()
        self._worker: threading.Thread | None = None

    def submit(self, name: str) -> None:
        """Remove the container named in ``<folder>/<name>/record.json``, then that folder."""
        with self._idle:
            self._busy += 1
            if self._worker is None or not self._worker.is_alive():
                # A daemon: a process that exits mid-removal leaves the folder to the next reconcile.
                self._worker = threading.Thread(target=self._work, name="docker-reaper", daemon=True)
                self._worker.start()
            self._queue.put(name)  # under the lock: a worker about to stop sees it

    @contextlib.contextmanager
    def yielding(self) -> Iterator[None]:
        """Around a create or a boot: the next removal waits until none is in flight (or ``max_defer_s``)."""
        with self._idle:
            self._yielding_to += 1
        try:
            yield
        finally:
            with self._idle:
                self._yielding_to -= 1
                self._idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until everything handed in is finished (True) or ``timeout`` seconds passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def reap_now(self, name: str) -> bool:
        """Remove one folder's container and the folder here and now; False when the removal failed."""
        home = self._folder / name
        try:
            container = json.loads((home / "record.json").read_text()).get("container")
        except FileNotFoundError:
            return True  # finished already
        except (OSError, ValueError):
            container = None  # a torn record: what it named is found by reconcile's sweep of unowned containers
        if container:
            try:
                self._remove(str(container))
            except (OSError, docker.errors.DockerException) as exc:  # the engine's or the socket's: retried
                _log.warning("removing the container of killed sandbox %s failed: %s", name, exc)
                return False
        try:
            _hostfs.remove_tree(home)  # never through a volume's view a crash left mounted
        except OSError as exc:
            _log.warning("removing the folder of killed sandbox %s failed: %s", name, exc)
            return False
        return True

    def _work(self) -> None:
        while True:
            try:
                name = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._idle:
                    if self._queue.empty():
                        self._worker = None  # the next submit starts another
                        return
                continue
            with self._idle:
                self._idle.wait_for(lambda: self._yielding_to == 0, self._max_defer_s)
            try:
                for attempt in range(1, _RETRIES + 1):
                    if self.reap_now(name):
                        break
                    if attempt < _RETRIES:
                        time.sleep(_RETRY_PAUSE_S * attempt)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
