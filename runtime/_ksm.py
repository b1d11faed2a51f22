"""The host's same-page merging (KSM), for the agents' start-up memory (``runtime.agent._memory``).

ksmd merges only what a process marked mergeable; the crun backend's agents mark their start-up
pages. ksmd is host-wide and off by default: a backend that shares agent memory switches it on
(``run`` = 1) and raises its pace to ``PAGES_TO_SCAN`` pages per ``sleep_millisecs`` (20 ms by
default: about 200 MB/s of marked memory scanned), never lowering what an operator set. Its CPU
time is the cost; ``benchmarks.backends`` reports it beside the memory it saves (read with
``runtime.host.ksm_counters`` and ``ksmd_cpu_seconds``).
"""

from __future__ import annotations

import logging
from pathlib import Path

KSM_DIR = Path("/sys/kernel/mm/ksm")
PAGES_TO_SCAN = 1000

log = logging.getLogger(__name__)


def available(root: Path = KSM_DIR) -> bool:
    """The kernel has KSM (``CONFIG_KSM``)."""
    return (root / "run").is_file()


def ensure_running(root: Path = KSM_DIR) -> bool:
    """ksmd merging (``run`` 1) at ``PAGES_TO_SCAN`` at least; False where it cannot be (no KSM, read-only sysfs).

    ``run`` 2 (an operator unmerging everything) is left alone, and then this is False too.
    """
    if not available(root):
        return False
    try:
        state = (root / "run").read_text().strip()
        if state == "0":
            (root / "run").write_text("1\n")
        elif state != "1":
            return False
        scan = root / "pages_to_scan"
        if int(scan.read_text()) < PAGES_TO_SCAN:
            scan.write_text(f"{PAGES_TO_SCAN}\n")
    except (OSError, ValueError) as exc:
        log.warning("same-page merging cannot be switched on (%s): agents' memory is not shared", exc)
        return False
    return True
