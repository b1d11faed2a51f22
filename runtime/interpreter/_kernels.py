"""Kernel processes: the server's own kernel specs, starting and stopping kernels with
jupyter_client, and routing their messages to whoever waits for them.

No Jupyter server and no kernelspec directories: the specs live in memory (``KernelSpecs``),
so nothing installed in the kernel environment or in ``~/.local/share/jupyter`` changes what
runs. The Python and Bash kernels talk over ZeroMQ ``ipc`` sockets in a private runtime folder
(mode 0700) the server owns; the others (Deno, R, Java) can only listen on loopback TCP, where
every message must carry the HMAC of the connection file's key (in that private folder).

Each ``Kernel`` has one client and two pump tasks (iopub, shell) that hand every message to
the subscriber registered for its parent ``msg_id``; messages nobody waits for are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager

from ._languages import kind_of

logger = logging.getLogger(__name__)

STARTUP_FILE: Final = Path(__file__).with_name("kernel_startup.py")

# Our kernel names, one per kind of kernel (``_languages.KERNEL_KINDS``): jupyter_client silently
# renames a kernel called "python" to "python3".
KERNEL_NAMES: Final[Mapping[str, str]] = {
    "python": "e2b-python",
    "bash": "e2b-bash",
    "deno": "e2b-deno",
    "r": "e2b-r",
    "java": "e2b-java",
}

# ZeroMQ ``ipc`` sockets for the kernels built on libzmq's Python binding. Deno's kernel (a Rust
# ZeroMQ), IRkernel and jjava (JeroMQ) only form tcp addresses: theirs listen on loopback, their
# messages signed with the connection file's key, which only the server and the kernel can read.
_IPC_KINDS: Final = frozenset({"python", "bash"})

# Deno's kernel ignores SIGINT while a cell runs and jjava's JVM would end on it; both stop a run
# on an interrupt request.
_MESSAGE_INTERRUPT: Final = frozenset({"deno", "java"})

# Deno's kernel may publish a cell's execute_result a moment after its idle status and its reply
# (seen: 1 ms; the result of a top-level await comes from another task): a run on it ends only
# after its messages stopped for this long.
_LATE_IOPUB_S: Final[Mapping[str, float]] = {"deno": 0.05}

# What each kind gets in its environment besides the sandbox's: Deno's results as plain text,
# not ANSI-coloured.
_KIND_ENV: Final[Mapping[str, Mapping[str, str]]] = {"deno": {"NO_COLOR": "1"}}

# Seconds a kernel gets to stop on its own (shutdown request, SIGINT, then SIGTERM) before
# it is killed; bounds restart and delete for a kernel stuck in user code.
SHUTDOWN_WAIT_S: Final = 3.0

# What subscribers receive: a kernel message with the channel it came on, or a notice with
# an empty message: the kernel is being restarted or closed under them, or (put there by the
# run itself) the client of the run went away.
Channel = Literal["iopub", "shell", "restarting", "closed", "abandoned"]
Event = tuple[Channel, dict[str, Any]]


class KernelStartError(Exception):
    """The kernel process could not be started or did not answer in time."""


def kernel_argv(kind: str, kernel_python: str) -> list[str]:
    """The command line of a kernel (``{connection_file}`` is filled in by jupyter_client).

    Every kernel's files live in the kernels' venv beside ``kernel_python`` (deno, jjava's jar);
    R and the JDK are the rootfs's own.
    """
    venv = Path(kernel_python).parent.parent
    if kind == "python":
        return [
            kernel_python,
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            # Formatters for e2b/chart, e2b/data and JSON (see kernel_startup.py).
            f"--IPKernelApp.exec_files={STARTUP_FILE}",
            # Upstream's template configures IPython with colors off: tracebacks without ANSI.
            "--InteractiveShell.colors=nocolor",
        ]
    if kind == "bash":
        return [kernel_python, "-m", "bash_kernel", "-f", "{connection_file}"]
    if kind == "deno":
        return [str(venv / "bin/deno"), "jupyter", "--kernel", "--conn", "{connection_file}"]
    if kind == "r":
        return ["R", "--no-echo", "--no-save", "--no-restore", "-e", "IRkernel::main()", "--args", "{connection_file}"]
    if kind == "java":
        # jjava's own launcher adds only the first --add-opens; the others let the environment
        # statements (``_languages``) reach System.getenv's map and ProcessBuilder's.
        opens = ["jdk.jshell/jdk.jshell", "java.base/java.util", "java.base/java.lang"]
        flags = [part for module in opens for part in ("--add-opens", f"{module}=ALL-UNNAMED")]
        jar = venv / "share/jupyter/kernels/java/jjava.jar"
        return ["java", *flags, "-jar", str(jar), "{connection_file}"]
    raise ValueError(f"no kernel for {kind!r}")


def kernel_env(kind: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment a kernel of ``kind`` starts with."""
    return {**env, **_KIND_ENV.get(kind, {})}


class KernelSpecs(KernelSpecManager):
    """Kernel specs held in memory, one per supported language."""

    def __init__(self, kernel_python: str) -> None:
        super().__init__()
        self._specs = {
            name: KernelSpec(
                name=name,
                display_name=f"{kind} (e2b-compat)",
                language=kind,
                argv=kernel_argv(kind, kernel_python),
                interrupt_mode="message" if kind in _MESSAGE_INTERRUPT else "signal",
            )
            for kind, name in KERNEL_NAMES.items()
        }

    def find_kernel_specs(self) -> dict[str, str]:
        return dict.fromkeys(self._specs, "")

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        try:
            return self._specs[kernel_name]
        except KeyError:
            raise NoSuchKernel(kernel_name) from None


class Kernel:
    """One running kernel process of a context."""

    def __init__(self, manager: AsyncKernelManager, client: AsyncKernelClient, kind: str = "python") -> None:
        self.kind = kind
        # Seconds of quiet on a run's messages after it finished before it is over (``_LATE_IOPUB_S``).
        self.late_iopub_s = _LATE_IOPUB_S.get(kind, 0.0)
        self._manager = manager
        self._client = client
        self._subscribers: dict[str, asyncio.Queue[Event]] = {}
        self._pumps: list[asyncio.Task[None]] = []

    @classmethod
    async def start(
        cls,
        *,
        specs: KernelSpecs,
        language: str,
        kernel_id: str,
        runtime_dir: Path,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
    ) -> Kernel:
        kind = kind_of(language)
        # A short ipc prefix: unix socket paths are limited to about 100 bytes.
        transport = {"transport": "ipc", "ip": str(runtime_dir / kernel_id[:8])} if kind in _IPC_KINDS else {}
        manager = AsyncKernelManager(
            kernel_name=KERNEL_NAMES[kind],
            kernel_spec_manager=specs,
            kernel_id=kernel_id,
            connection_file=str(runtime_dir / f"kernel-{kernel_id}.json"),
            shutdown_wait_time=SHUTDOWN_WAIT_S,
            **transport,
        )
        try:
            await manager.start_kernel(cwd=cwd, env=kernel_env(kind, env))
        except Exception as exc:  # Popen errors (a missing cwd or interpreter), spec errors
            await _discard(manager, None)
            raise KernelStartError(str(exc) or type(exc).__name__) from exc
        kernel = cls(manager, manager.client(), kind)
        try:
            await kernel._connect(timeout)
        except Exception as exc:
            await _discard(manager, kernel._client)
            raise KernelStartError(str(exc) or type(exc).__name__) from exc
        return kernel

    async def _connect(self, timeout: float) -> None:
        self._client.start_channels()
        await self._client.wait_for_ready(timeout=timeout)
        self._pumps = [
            asyncio.create_task(self._pump("iopub"), name="kernel-iopub"),
            asyncio.create_task(self._pump("shell"), name="kernel-shell"),
        ]

    async def _pump(self, channel: Literal["iopub", "shell"]) -> None:
        receive = self._client.get_iopub_msg if channel == "iopub" else self._client.get_shell_msg
        while True:
            try:
                message: dict[str, Any] = await receive()
            except asyncio.CancelledError:
                raise
            except Exception:  # a message that does not decode; keep reading
                logger.warning("bad %s message from a kernel", channel, exc_info=True)
                await asyncio.sleep(0.1)  # a broken socket must not become a busy loop
                continue
            parent = message.get("parent_header") or {}
            queue = self._subscribers.get(parent.get("msg_id", ""))
            if queue is not None:
                queue.put_nowait((channel, message))

    def execute(self, code: str, *, silent: bool) -> tuple[str, asyncio.Queue[Event]]:
        """Send an execute request; returns its msg_id and the queue its messages arrive on.

        The queue is registered before control returns to the event loop, so the pumps cannot
        deliver a message for it before it exists. ``stop_on_error`` is off: the server never
        queues a second request behind a failing one, and with it on ipykernel would abort
        the silent request that restores environment variables after an error.
        """
        msg_id: str = self._client.execute(
            code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=False
        )
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._subscribers[msg_id] = queue
        return msg_id, queue

    def unsubscribe(self, msg_id: str) -> None:
        self._subscribers.pop(msg_id, None)

    def notify(self, channel: Literal["restarting", "closed"]) -> None:
        """Tell everyone waiting on this kernel that it is going away under them."""
        for queue in self._subscribers.values():
            queue.put_nowait((channel, {}))

    async def is_alive(self) -> bool:
        alive: bool = await self._manager.is_alive()
        return alive

    async def interrupt(self) -> None:
        try:
            await self._manager.interrupt_kernel()
        except Exception:  # the kernel is already gone: nothing left to interrupt
            logger.warning("could not interrupt a kernel", exc_info=True)

    async def restart(self, timeout: float) -> None:
        """A fresh process with the same launch arguments (cwd, env) and a new client."""
        await self._disconnect()
        try:
            await self._manager.restart_kernel(now=False)
            self._client = self._manager.client()
            await self._connect(timeout)
        except Exception as exc:
            raise KernelStartError(str(exc) or type(exc).__name__) from exc

    async def shutdown(self) -> None:
        await self._disconnect()
        await _discard(self._manager, None)

    async def _disconnect(self) -> None:
        for task in self._pumps:
            task.cancel()
        for task in self._pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pumps = []
        self._client.stop_channels()


async def _discard(manager: AsyncKernelManager, client: AsyncKernelClient | None) -> None:
    """Stop whatever part of a kernel exists; never raises (used on failure paths)."""
    if client is not None:
        with contextlib.suppress(Exception):
            client.stop_channels()
    try:
        if manager.has_kernel:
            await manager.shutdown_kernel(now=False)
        else:
            await manager.cleanup_resources()
    except Exception:
        logger.warning("could not stop a kernel cleanly", exc_info=True)
