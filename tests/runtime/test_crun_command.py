"""How ``CrunCommand`` runs the runtime's commands: in a group of their own, waited for, and bounded.

A shell script stands in for crun, so these need neither root nor a container: what they check is
the process handling around any runtime command (``crun._finished``). ``test_crun_boot_images``
shows the case it exists for, on real sandboxes: a checkpoint cut off by a server stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.backend import BackendError
from runtime.crun import CrunCommand

# The stand-in: notes its pid and process group, starts a child that outlives it unless its group is
# ended, runs for FAKE_SECONDS, then notes that it finished.
_FAKE_RUNTIME = """#!/bin/sh
echo $$ > "$0.pid"
cut -d' ' -f5 /proc/$$/stat > "$0.pgid"
sleep 60 </dev/null >/dev/null 2>&1 &
echo $! > "$0.child"
sleep "$FAKE_SECONDS"
touch "$0.done"
"""


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Path]:
    script = tmp_path / "fake-crun"
    script.write_text(_FAKE_RUNTIME)
    script.chmod(0o755)
    yield script
    for noted in (".pid", ".child"):  # what the test started, by pid
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(Path(f"{script}{noted}").read_text()), signal.SIGKILL)


def _command(script: Path, seconds: float) -> CrunCommand:
    return CrunCommand(str(script), script.parent, env={"PATH": os.environ["PATH"], "FAKE_SECONDS": str(seconds)})


def _noted(script: Path, what: str) -> int:
    return int(Path(f"{script}.{what}").read_text())


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def _started(script: Path) -> None:
    while not (Path(f"{script}.child").exists() and Path(f"{script}.pgid").read_text().strip()):
        await asyncio.sleep(0.01)


def test_a_command_runs_in_a_process_group_of_its_own(fake: Path) -> None:
    asyncio.run(_command(fake, 0).freeze("c"))
    assert (fake.parent / "fake-crun.done").exists()
    assert _noted(fake, "pgid") == _noted(fake, "pid"), "a signal to the server's group does not reach it"
    assert _noted(fake, "pgid") != os.getpgrp()


def test_a_cancelled_caller_waits_for_its_command_to_end(fake: Path) -> None:
    async def go() -> None:
        call = asyncio.ensure_future(_command(fake, 0.5).checkpoint("c", fake.parent / "images", config=fake))
        await _started(fake)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert (fake.parent / "fake-crun.done").exists(), "the command ended before the cancellation went on"
        assert not _running(_noted(fake, "pid"))

    asyncio.run(go())


def test_a_command_past_its_bound_is_ended_with_its_group(fake: Path) -> None:
    async def go() -> None:
        with pytest.raises(BackendError, match=r"fake-crun pause c did not finish within 0.5 s: ended"):
            await _command(fake, 60)._checked("pause", "c", timeout=0.5)

    asyncio.run(go())
    assert not _running(_noted(fake, "pid"))
    assert not _running(_noted(fake, "child")), "its whole group (crun and the CRIU it started)"
    assert not (fake.parent / "fake-crun.done").exists()


def test_a_cancelled_caller_waits_no_longer_than_the_bound(fake: Path) -> None:
    async def go() -> float:
        call = asyncio.ensure_future(_command(fake, 60)._checked("pause", "c", timeout=0.5))
        await _started(fake)
        began = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return time.monotonic() - began

    waited = asyncio.run(go())
    assert waited < 30, "ended at its bound, not run to its end"
    assert not _running(_noted(fake, "pid"))
    assert not _running(_noted(fake, "child"))
