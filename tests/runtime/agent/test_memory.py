"""The agent's start-up memory offered for merging, and address randomisation kept for its children."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap

import pytest

from runtime.agent._memory import ADDR_NO_RANDOMIZE, SHARE_MEMORY_ENV, mergeable_ranges, share_startup_memory

MAPS = "\n".join(
    [
        "55d0c0a00000-55d0c0a21000 r--p 00000000 00:1f 123                        /usr/bin/python3.11",
        "55d0c0c00000-55d0c0c40000 rw-p 00200000 00:1f 123                        /usr/bin/python3.11",
        "55d0c1000000-55d0c1400000 rw-p 00000000 00:00 0                          [heap]",
        "7f0000000000-7f0000100000 rw-p 00000000 00:00 0 ",  # the kernel pads a nameless mapping
        "7f0000100000-7f0000200000 rw-s 00000000 00:01 77                         /dev/zero (deleted)",
        "7f0000200000-7f0000300000 r--p 00000000 00:00 0 ",
        "7f0000300000-7f0000301000 ---p 00000000 00:00 0 ",
        "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]",
        "7ffc00100000-7ffc00102000 r--p 00000000 00:00 0                          [vvar]",
        "7ffc00102000-7ffc00104000 r-xp 00000000 00:00 0                          [vdso]",
    ]
)


def test_only_private_writable_anonymous_mappings_are_offered() -> None:
    assert mergeable_ranges(MAPS) == [(0x55D0C1000000, 0x55D0C1400000), (0x7F0000000000, 0x7F0000100000)]


def test_nothing_is_offered_unless_the_runtime_asks() -> None:
    environ = {"OTHER": "1"}
    assert share_startup_memory(environ) == 0
    assert share_startup_memory({SHARE_MEMORY_ENV: "0"}) == 0


def _run(code: str, *prefix: str) -> str:
    return subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, SHARE_MEMORY_ENV: "1"},
    ).stdout


def test_the_heap_is_marked_and_a_child_inherits_no_mark() -> None:
    out = _run(
        """
        import subprocess
        from runtime.agent._memory import share_startup_memory
        offered = share_startup_memory()
        smaps = open("/proc/self/smaps").read()
        marked = sum(" mg" in line for line in smaps.splitlines() if line.startswith("VmFlags"))
        child = subprocess.run(["cat", "/proc/self/smaps"], capture_output=True, text=True).stdout
        child_marked = sum(" mg" in line for line in child.splitlines() if line.startswith("VmFlags"))
        print(offered, marked, child_marked)
        """
    )
    offered, marked, child_marked = map(int, out.split())
    if not os.path.exists("/sys/kernel/mm/ksm/run"):
        pytest.skip("this kernel has no KSM (CONFIG_KSM): nothing can be marked")
    assert offered > 1024 * 1024
    assert marked >= 1
    assert child_marked == 0


@pytest.mark.skipif(shutil.which("setarch") is None, reason="util-linux setarch is not installed")
def test_an_agent_started_without_aslr_gives_its_children_aslr() -> None:
    out = _run(
        """
        import subprocess
        from runtime.agent._memory import randomize_children
        before = open("/proc/self/personality").read().strip()
        cleared = randomize_children()
        child = subprocess.run(["cat", "/proc/self/personality"], capture_output=True, text=True).stdout.strip()
        print(before, cleared, child)
        """,
        "setarch",
        platform.machine(),
        "--addr-no-randomize",
    )
    before, cleared, child = out.split()
    assert int(before, 16) & ADDR_NO_RANDOMIZE
    assert cleared == "True"
    assert not int(child, 16) & ADDR_NO_RANDOMIZE


def test_an_agent_with_aslr_changes_nothing() -> None:
    out = _run(
        """
        from runtime.agent._memory import randomize_children
        print(randomize_children())
        """
    )
    assert out.strip() == "False"
