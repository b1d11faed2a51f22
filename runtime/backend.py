"""The backend-neutral sandbox runtime interface, its errors, and the lifecycle table.

Every isolation backend (crun now; gVisor, Docker and microVMs later) implements
``Backend``, and ``runtime.backends`` names them; the server never talks to a runtime any
other way. One shared Hypothesis state machine (tests/runtime/test_backend_conformance.py)
holds every backend in that table to it.

Exceptions::

    SandboxRuntimeError
    ├── SandboxNotFoundError   no sandbox with that id (or it was killed)
    ├── TransitionError        the operation is not allowed in the current state
    ├── TemplateNotFoundError  no template or snapshot with that id
    └── BackendError           the isolation mechanism failed (message says how)
        ├── NetworkError           a network command failed (runtime._network)
        │   ├── PoolExhaustedError     every /30 of the address pool is in use
        │   └── NamesTakenError        a sandbox network's names exist already
        ├── IdRangeError           no subordinate id range is free (runtime._idranges)
        ├── HostNotReadyError      the host lacks what a backend needs (runtime.host)
        └── UnknownBackendError    no backend of that name (runtime.backends; also a ValueError)

A backend raises nothing else: an operating-system error, a failed command or a malformed
value met inside a backend method comes out as a ``BackendError`` saying what failed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol


class SandboxRuntimeError(Exception):
    """Base of the runtime's errors."""


class SandboxNotFoundError(SandboxRuntimeError):
    pass


class TransitionError(SandboxRuntimeError):
    pass


class TemplateNotFoundError(SandboxRuntimeError):
    pass


class BackendError(SandboxRuntimeError):
    pass


class State(enum.Enum):
    CREATED = "created"  # resources exist, nothing runs yet
    RUNNING = "running"  # processes run, the agent answers
    PAUSED = "paused"  # frozen in memory (pause with memory=True)
    STOPPED = "stopped"  # processes gone, writable layer kept (pause with memory=False)
    KILLED = "killed"  # everything released; terminal


class Action(enum.Enum):
    START = "start"
    PAUSE_MEMORY = "pause_memory"
    PAUSE_FILESYSTEM = "pause_filesystem"
    RESUME = "resume"
    DISCARD_MEMORY = "discard_memory"
    KILL = "kill"
    SNAPSHOT = "snapshot"


# The lifecycle as data: (state, action) → next state. Anything absent is a TransitionError,
# except KILL, which every live state allows. A snapshot leaves the state as it was.
TRANSITIONS: dict[tuple[State, Action], State] = {
    (State.CREATED, Action.START): State.RUNNING,
    (State.RUNNING, Action.PAUSE_MEMORY): State.PAUSED,
    (State.RUNNING, Action.PAUSE_FILESYSTEM): State.STOPPED,
    (State.PAUSED, Action.RESUME): State.RUNNING,
    (State.STOPPED, Action.RESUME): State.RUNNING,
    # A resume without memory (the newer clients' connect with memory false): the processes a
    # memory pause kept end, the files stay, and the next resume boots afresh from them.
    (State.PAUSED, Action.DISCARD_MEMORY): State.STOPPED,
    (State.RUNNING, Action.SNAPSHOT): State.RUNNING,
    (State.PAUSED, Action.SNAPSHOT): State.PAUSED,
    (State.STOPPED, Action.SNAPSHOT): State.STOPPED,
    **{(s, Action.KILL): State.KILLED for s in State if s is not State.KILLED},
}


def next_state(state: State, action: Action) -> State:
    try:
        return TRANSITIONS[(state, action)]
    except KeyError:
        raise TransitionError(f"cannot {action.value} a sandbox that is {state.value}") from None


class Feature(enum.Enum):
    """What a backend may lack; ``Backend.features`` lists what it provides.

    The server reads the list before an operation that needs a feature: one the backend lacks is
    refused the way upstream refuses an unsupported operation, never done another way. The
    conformance report prints each backend's list, so a difference between backends is shown
    and explained rather than found by a failing case.
    """

    PAUSE_MEMORY = "pause-memory"  # pause(memory=True): processes and memory kept, resumed where they were
    # That pause writes memory to disk and frees the RAM; the paused sandbox survives a host restart.
    PAUSE_MEMORY_ON_DISK = "pause-memory-on-disk"
    SNAPSHOT = "snapshot"  # snapshot() of the filesystem, and creates from it
    # snapshot(memory=True) keeps the processes and memory too: a sandbox created from it
    # continues them (forks, "full" snapshots), under its own id, id range, address and hostname.
    SNAPSHOT_MEMORY = "snapshot-memory"
    DISK_LIMIT = "disk-limit"  # Limits.disk_mb enforced by the kernel (ENOSPC inside)
    EGRESS_RULES = "egress-rules"  # allow_out / deny_out honoured, changed live by update_network
    OWN_ID_RANGE = "own-id-range"  # sandbox root is an unprivileged host uid of a range of its own
    METRICS = "metrics"  # cpu, memory, pids and disk figures from the kernel


# What a backend without a list of its own provides: everything but what needs its memory on disk.
DEFAULT_FEATURES: frozenset[Feature] = frozenset(Feature) - {Feature.PAUSE_MEMORY_ON_DISK, Feature.SNAPSHOT_MEMORY}


@dataclass(frozen=True)
class Limits:
    cpu_count: int = 2
    memory_mb: int = 512
    pids: int = 1024
    disk_mb: int | None = None  # the sandbox's disk, MiB, enforced by the kernel; None: the backend's default


@dataclass(frozen=True)
class VolumeMount:
    """A volume's files (``source``, a host folder: ``runtime.volumes``) seen at ``target`` inside the sandbox.

    Owners in ``source`` are the sandbox's own ids (uid 1000 is its ``user``): the backend shifts
    the view into whatever host ids the sandbox's ids are. Writable; nosuid and nodev.
    """

    source: str
    target: str  # absolute, normalised; the backend makes it if the sandbox's files lack it


@dataclass(frozen=True)
class SandboxSpec:
    sandbox_id: str
    template: str  # template name or snapshot id
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    hostname: str | None = None
    # Egress (only where the operator lets the host forward): allow_out wins over deny_out,
    # everything else follows allow_internet_access, as E2B's network fields do.
    allow_internet_access: bool = False
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    volumes: tuple[VolumeMount, ...] = ()  # kept across pauses and host restarts, as the files are
    # The lowercase hex SHA-512 of the agent's access token (of "" for none), published in the
    # sandbox's metadata: what lets /init replace the token of an agent restored from another
    # sandbox's memory (envd's metadata-service rule). None: the agent's first /init sets it.
    access_token_hash: str | None = None


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    template: str
    state: State
    host: str | None  # where the host reaches the sandbox's ports (None unless running)


@dataclass(frozen=True)
class Metrics:
    cpu_count: int
    cpu_usage_ns: int
    memory_bytes: int
    memory_limit_bytes: int
    pids: int
    disk_used_bytes: int = 0  # what the sandbox's disk holds (its writable layer)
    disk_total_bytes: int = 0  # the size of the sandbox's disk, as its filesystem counts it


@dataclass(frozen=True)
class ReconcileReport:
    adopted: tuple[str, ...]  # sandboxes kept (intact, or re-created as stopped)
    cleaned: tuple[str, ...]  # resources released because nothing owned them any more
    # Kept, but their processes were gone (a host restart): now STOPPED, resume boots them afresh.
    stopped: tuple[str, ...] = ()
    # Could not be re-created (a template gone, say): not listed any more, their files kept
    # aside for the operator (the backend says where); reported by every reconcile until removed.
    failed: tuple[str, ...] = ()


class Backend(Protocol):
    """What every isolation backend provides."""

    name: str
    features: frozenset[Feature]  # what it provides of the features it may lack

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        """Allocate everything the sandbox needs; nothing runs yet (state CREATED)."""
        ...

    async def start(self, sandbox_id: str) -> SandboxInfo:
        """Run it; returns once the agent inside answers its health check."""
        ...

    async def pause(self, sandbox_id: str, *, memory: bool) -> SandboxInfo: ...

    async def resume(self, sandbox_id: str) -> SandboxInfo: ...

    async def discard_memory(self, sandbox_id: str) -> SandboxInfo:
        """PAUSED → STOPPED: the kept processes end (none of their code runs again), the files stay."""
        ...

    async def kill(self, sandbox_id: str) -> bool:
        """Release everything; False when there was no such sandbox."""
        ...

    async def inspect(self, sandbox_id: str) -> SandboxInfo: ...

    async def list(self) -> list[SandboxInfo]: ...

    async def metrics(self, sandbox_id: str) -> Metrics: ...

    async def snapshot(self, sandbox_id: str, *, memory: bool = False, transient: bool = False) -> str:
        """Capture the writable layer as a new template; returns its id.

        ``memory`` (``Feature.SNAPSHOT_MEMORY``, a running sandbox only): its processes and memory
        too, taken while it is frozen, so files and processes agree; it runs on afterwards. The
        first start of a sandbox created from such a snapshot continues those processes.
        ``transient``: made for creates now in flight (a fork's), released by ``release_snapshot``
        after them, or by the next ``reconcile`` when the server stopped before that.
        """
        ...

    async def release_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot nobody will create from again once no sandbox stands on it (a fork's)."""
        ...

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Remove a snapshot; False when there is none, TransitionError while a sandbox uses it."""
        ...

    async def update_network(
        self, sandbox_id: str, *, allow_internet_access: bool, allow_out: tuple[str, ...], deny_out: tuple[str, ...]
    ) -> None:
        """Change a live sandbox's egress rules."""
        ...

    async def address(self, sandbox_id: str, port: int) -> tuple[str, int]:
        """Where the host connects to ``port`` inside the sandbox."""
        ...

    async def reconcile(self) -> ReconcileReport:
        """After a crash or a host restart: keep every recorded sandbox's files, re-create what it can.

        What lost its processes becomes STOPPED; what cannot be re-created is set aside as failed.
        """
        ...
