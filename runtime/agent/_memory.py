"""The agent's start-up memory, offered to the host's same-page merging (KSM); ASLR for its children.

Every agent of a template imports the same modules in the same order, so after start-up its
heap holds the same bytes as every other agent's, provided that the addresses inside them are
the same too: the runtime starts the agent without address randomisation (``setarch -R``) and
with a fixed string-hash seed (``PYTHONHASHSEED=0``), and names ``E2B_COMPAT_SHARE_MEMORY``.
The agent then marks its private writable mappings mergeable (``madvise(MADV_MERGEABLE)``) once
it listens, and the host's ksmd keeps one copy of each page that is still the same. Measured in
docs/BENCHMARKS.md ("Idle memory").

What is shared, and what never is:

- Only the agent's own mappings as they are at that moment: start-up pages, before any request
  brought a tenant's data. A page written later is copied back out for the agent that wrote it.
  The mark is on those mappings only (not the process-wide ``PR_SET_MEMORY_MERGE``, which every
  process the agent starts would inherit): nothing a tenant runs is ever offered.
- The cyclic garbage collector would write into every object it examines, and so unshare the
  pages: the start-up objects are moved out of its reach first (``gc.freeze``).
- Address randomisation is restored for everything the agent starts: the personality flag is
  cleared in the agent before it starts anything (a template service, a command), and a
  process inherits its parent's flag.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import re
from collections.abc import Iterable, MutableMapping

SHARE_MEMORY_ENV = "E2B_COMPAT_SHARE_MEMORY"
ADDR_NO_RANDOMIZE = 0x0040000  # <linux/personality.h>
_QUERY_PERSONALITY = 0xFFFFFFFF
_MADV_MERGEABLE = 12  # <asm-generic/mman-common.h>
# /proc/self/maps: start-end perms offset dev inode [path]
_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)\s*(.*)$")
_ANONYMOUS_NAMES = ("", "[heap]")  # not [stack] (it moves), [vdso], [vvar]: the kernel's


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def randomize_children() -> bool:
    """Clear ``ADDR_NO_RANDOMIZE`` from this process's personality; True when it was set."""
    libc = _libc()
    current = libc.personality(_QUERY_PERSONALITY)
    if current == -1 or not current & ADDR_NO_RANDOMIZE:
        return False
    if libc.personality(current & ~ADDR_NO_RANDOMIZE) == -1:
        raise OSError(ctypes.get_errno(), "personality")
    return True


def mergeable_ranges(maps: str) -> list[tuple[int, int]]:
    """The private, writable, anonymous mappings of a ``/proc/<pid>/maps`` text, as (start, end)."""
    ranges = []
    for line in maps.splitlines():
        found = _MAPS_LINE.match(line)
        if found is None:
            continue
        start, end, perms, inode, name = found.groups()
        if perms[:2] == "rw" and perms[3] == "p" and inode == "0" and name.strip() in _ANONYMOUS_NAMES:
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def share_startup_memory(environ: MutableMapping[str, str] = os.environ) -> int:
    """Offer the start-up pages to KSM when the runtime asked (``E2B_COMPAT_SHARE_MEMORY=1``).

    Returns the bytes offered (0 when not asked, or where the kernel has no KSM).
    """
    if environ.pop(SHARE_MEMORY_ENV, None) != "1":
        return 0
    gc.collect()
    gc.freeze()
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        ranges = mergeable_ranges(maps.read())
    return _madvise(ranges)


def _madvise(ranges: Iterable[tuple[int, int]]) -> int:
    libc = _libc()
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    offered = 0
    for start, end in ranges:
        if libc.madvise(start, end - start, _MADV_MERGEABLE) == 0:
            offered += end - start
        elif ctypes.get_errno() == errno.EINVAL:  # a kernel without KSM: nothing else will succeed
            return offered
        # ENOMEM: a mapping that a thread unmapped meanwhile; skipped
    return offered
