"""Assembling and running the reference server: what ``e2b-compat serve`` does, in order.

1. Host checks (root): the runtime's packages and cgroup fix (the backend's ``prepare_host``, ``runtime.backends``), and
   name resolution for every name under the domain (``_nameres``), each saying what it changes.
2. The data directory: edge certificates (a local CA and a leaf for the domain and its
   wildcard), the master key that seals sandbox tokens, the SQLite store, the first API key.
3. The runtime and the template (built once, then cached by content).
4. Reconciliation against the runtime, before anything is served.
5. The soft open-file limit raised to the hard one (``_connections``; the default connection cap
   follows it), the reaper, the metrics sampler and the warm pool's refill (``_warm_pool``), then
   TLS listeners on every configured address (both ``127.0.0.1`` and ``::1``: Node resolves
   ``*.localhost`` to ``::1`` first), then the client environment is printed and written to
   ``<data_dir>/client.env``.

``open_server`` does steps 2-4 with an injectable backend and initializer (tests use the fake
backend); ``serve`` is the whole sequence for the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from runtime.agent import ENVD_VERSION, bind
from runtime.backend import Backend
from runtime.host import MemoryLedger
from runtime.templates import TEMPLATE_MEMORY_MB, Template
from runtime.volumes import VolumeStorage

from ._admission import admission_limits
from ._agent_init import HttpAgentInitializer
from ._build_files import BuildFiles
from ._client_env import ClientEnvironment, domain_with_port
from ._config import ServerConfig
from ._connections import ConnectionGate, connection_limit, edge_protocols, raise_open_file_limit
from ._control_plane import create_control_plane
from ._credentials import TokenVault, load_or_create_master_key
from ._edge import Edge
from ._files import replace_file
from ._image_source import RegistryImages
from ._keys import KeyStore, ensure_key
from ._metrics import MetricsBook
from ._proxy import SandboxProxy
from ._reconcile import Reconciliation, reconcile
from ._routing import parse_domain
from ._sandboxes import AgentInitializer, SandboxService, ServiceSettings
from ._snapshots import SnapshotStore
from ._store import Store
from ._template_service import TemplateService
from ._templates import TemplateStore
from ._tls import EdgeCertificates, ensure_certificates, ssl_context
from ._volumes import ORPHANED, VolumeReport, VolumeService, VolumeStore

__all__ = [
    "READY_LINE",
    "RunningServer",
    "ServerStartError",
    "listen_sockets",
    "open_server",
    "print_ready",
    "run",
    "serve",
]

log = logging.getLogger(__name__)

READY_LINE = "e2b-compat server ready"
PUBLIC_CA_FILE = "ca.pem"  # the CA certificate, readable by every local user (the tls folder is private)
KEEPALIVE_S = 640  # as upstream's edge: longer than any client's idle pool timeout
BUILD_UPLOAD_MAX_BYTES = 4 << 30  # one copied set of files for a template build


class ServerStartError(Exception):
    """Something the server needs is missing and could not be provided; the message says what."""


@dataclass
class RunningServer:
    config: ServerConfig
    store: Store
    keys: KeyStore
    service: SandboxService
    edge: Edge
    proxy: SandboxProxy
    certificates: EdgeCertificates
    api_key: str
    reconciliation: Reconciliation
    templates: TemplateService | None = None

    @property
    def client_environment(self) -> ClientEnvironment:
        return ClientEnvironment.for_server(
            self.api_key, self.config.domain, self.config.port, self.config.data_dir / PUBLIC_CA_FILE
        )


def _public_domain(config: ServerConfig) -> str:
    return domain_with_port(config.domain, config.port)


def _open_backend(config: ServerConfig, templates: Sequence[Template]) -> Backend:
    """The configured backend (``runtime.backends``) on ``<data_dir>/runtime``."""
    from runtime.backends import BackendOptions, open_backend  # noqa: PLC0415 - loads only the configured one

    runtime_dir = config.data_dir / "runtime"
    runtime_dir.mkdir(parents=True, exist_ok=True)
    # The templates checked at start-up are the ones served: a source change while the server
    # runs must not start a rebuild in the middle of a create request.
    options = BackendOptions(
        state_dir=runtime_dir,
        templates=templates,
        share_agent_memory=config.share_agent_memory,
        boot_images=config.boot_images,
    )
    return open_backend(config.backend, options)


def _publish_ca(source: Path, target: Path) -> None:
    """Copy the CA certificate (public by nature) where clients of any user can read it."""
    data = source.read_bytes()
    if target.exists() and target.read_bytes() == data:
        return
    replace_file(target, data, mode=0o644)


@contextlib.asynccontextmanager
async def open_server(
    config: ServerConfig,
    *,
    backend: Backend | None = None,
    initialize: AgentInitializer | None = None,
    templates: Sequence[Template] = (),
) -> AsyncIterator[RunningServer]:
    """Everything but the listeners and background tasks, reconciled and ready to serve."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    # o+x only: the runtime's idmapped sandbox users must traverse it to reach their layers.
    os.chmod(config.data_dir, 0o711)  # noqa: S103 - traverse only: no listing, no reading
    certificates = ensure_certificates(config.data_dir / "tls", config.domain)
    _publish_ca(certificates.ca_cert_path, config.data_dir / PUBLIC_CA_FILE)
    vault = TokenVault(load_or_create_master_key(config.data_dir / "master.key"))
    database = config.data_dir / "server.db"
    database.touch(mode=0o600, exist_ok=True)  # it holds key hashes; SQLite gives -wal/-shm the same mode
    database.chmod(0o600)
    store = await Store.open(database)
    own_initializer: HttpAgentInitializer | None = None
    if initialize is None:
        own_initializer = initialize = HttpAgentInitializer()
    proxy = SandboxProxy(
        # Every pooled connection in use serves one client connection: the pool is never the tighter cap.
        max_connections=connection_limit(config.max_connections),
        max_websockets=config.max_websockets,
        sandbox_max_requests=config.sandbox_max_requests,
        sandbox_max_websockets=config.sandbox_max_websockets,
    )
    builds: TemplateService | None = None
    template_store: TemplateStore | None = None
    service: SandboxService | None = None
    try:
        keys = KeyStore(store.db)
        api_key = await ensure_key(store.db, config.data_dir / "api-key", config.owner, keys=keys)
        # The host's backend shares the host's memory with every other server on it; a stand-in does not.
        ledger = MemoryLedger() if backend is None else None
        backend = backend if backend is not None else _open_backend(config, templates)
        settings = ServiceSettings(
            domain=_public_domain(config),
            envd_version=ENVD_VERSION,
            templates=frozenset({config.default_template, *config.templates}),
            cpu_count=config.cpu_count,
            memory_mb=config.memory_mb,
            template_memory_mb=TEMPLATE_MEMORY_MB,
            disk_mb=config.disk_mb,
            max_timeout_s=config.max_timeout_seconds,
            egress_enabled=config.egress_enabled,
            admission=admission_limits(config),
            memory_ledger=ledger,
            warm_pool=config.warm_pool_sizes(),
            warm_pool_memory_mb=config.warm_pool_memory_mb,
        )
        service = SandboxService(
            store=store,
            snapshots=SnapshotStore(store.db),
            backend=backend,
            vault=vault,
            settings=settings,
            initialize=initialize,
            metrics=MetricsBook(backend),
        )
        service.address_released = proxy.forget
        service.volumes = VolumeService(
            store=VolumeStore(store.db),
            storage=VolumeStorage(config.data_dir / "volumes"),
            vault=vault,
            size_mb=config.volume_mb,
            in_use=service.volume_in_use,
        )
        # Before the sandboxes: one restored after a host restart binds its volumes' files again.
        _report_volumes(await service.volumes.open())
        reconciliation = await reconcile(service)  # kills the sandboxes of builds a stop cut off
        if cut_off := await service.create_keys.open():
            log.warning(
                "%d create(s) with an Idempotency-Key were cut off by a stop: their keys are free again", cut_off
            )
        template_store = await TemplateStore.open(database)
        builds = TemplateService(
            sandboxes=service,
            store=template_store,
            files=BuildFiles(config.data_dir / "template-files", max_bytes=BUILD_UPLOAD_MAX_BYTES),
            concurrency=config.max_parallel_builds,
            images=RegistryImages(config.registry_settings()),
        )
        service.built = builds
        for build_id in await builds.recover():
            log.warning("template build %s was cut off by a stop: recorded failed", build_id)
        edge = Edge(
            domain=parse_domain(_public_domain(config)),
            control_plane=create_control_plane(service, keys, builds),
            service=service,
            proxy=proxy,
            vault=vault,
        )
        yield RunningServer(config, store, keys, service, edge, proxy, certificates, api_key, reconciliation, builds)
    finally:
        if service is not None:
            await service.pool.aclose()  # its sandboxes have no record: left running they would be orphans
        if builds is not None:
            await builds.aclose()
        if template_store is not None:
            await template_store.close()
        await proxy.aclose()
        if own_initializer is not None:
            await own_initializer.aclose()
        await store.close()


def _report_volumes(report: VolumeReport) -> None:
    if report.remade or report.orphaned or report.undone:
        log.warning(
            "volumes settled at start: %d made again empty (their files were gone), %d sets of files "
            "without a record set aside in %s, %d creates a stop cut off undone",
            len(report.remade),
            len(report.orphaned),
            ORPHANED,
            len(report.undone),
        )


async def _reaper(service: SandboxService, builds: TemplateService | None, interval: float) -> None:
    while True:
        try:
            await service.reap()
            if builds is not None:
                await builds.sweep()  # template layers nothing names any more
        except Exception:  # one failed sweep must not stop expiry for good
            log.exception("reaper sweep failed")
        await asyncio.sleep(interval)


async def _running_ids(service: SandboxService) -> list[str]:
    return [record.sandbox_id for record in await service.store.all(("running",))]


def listen_sockets(config: ServerConfig) -> list[socket.socket]:
    return [bind(host, config.port) for host in config.hosts]


async def run(
    server: RunningServer,
    sockets: list[socket.socket],
    *,
    on_ready: Callable[[RunningServer], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve on ``sockets`` (already bound) until uvicorn is told to stop (SIGINT/SIGTERM, or ``stop`` set)."""
    config = server.config
    gate = ConnectionGate(connection_limit(config.max_connections))
    # TLS is the protocol's (see _connections): uvicorn's own listener TLS would count and bound nothing.
    http, ws = edge_protocols(gate, ssl_context(server.certificates), head_timeout=config.request_head_timeout_seconds)
    uvicorn_config = uvicorn.Config(
        server.edge,
        http=http,
        ws=ws,
        lifespan="off",
        timeout_keep_alive=KEEPALIVE_S,
        log_level=config.log_level,
        access_log=False,
        server_header=False,
        date_header=False,  # proxied answers carry the sandbox's own Date
        proxy_headers=False,  # nothing sits in front of the edge: X-Forwarded-* from clients are not trusted
        timeout_graceful_shutdown=5,  # streams may never end on their own
    )
    tasks = [
        asyncio.create_task(_reaper(server.service, server.templates, config.reaper_interval_seconds)),
        asyncio.create_task(
            server.service.metrics.run(lambda: _running_ids(server.service), config.metrics_interval_seconds)
        ),
        asyncio.create_task(server.service.pool.run()),
    ]
    web = uvicorn.Server(uvicorn_config)
    watcher = asyncio.create_task(_announce(web, server, on_ready))
    if stop is not None:
        tasks.append(asyncio.create_task(_stop_when(stop, web)))
    try:
        with _stop_signals_handled():
            await web.serve(sockets=sockets)
    finally:
        gate.close_all()  # handshakes still running, WebSockets uvicorn no longer tracks
        for task in (*tasks, watcher):
            task.cancel()
        await asyncio.gather(*tasks, watcher, return_exceptions=True)


@contextlib.contextmanager
def _stop_signals_handled() -> Iterator[None]:
    """While uvicorn serves: SIGTERM and SIGINT stop it, and nothing more.

    uvicorn raises the signal it caught again once it has shut down, with the handler it found. Left
    at the default, SIGTERM would then end the process at once, skipping every ``finally`` after it:
    the warm pool's sandboxes (``open_server``) would outlive the server. A handler that does
    nothing lets the shutdown run to its end.
    """
    if threading.current_thread() is not threading.main_thread():  # signals are the main thread's
        yield
        return
    stopping = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda _sig, _frame: None) for sig in stopping}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _stop_when(stop: asyncio.Event, web: uvicorn.Server) -> None:
    await stop.wait()
    web.should_exit = True


async def _announce(
    web: uvicorn.Server, server: RunningServer, on_ready: Callable[[RunningServer], None] | None
) -> None:
    while not web.started:
        await asyncio.sleep(0.02)
    if on_ready is not None:
        on_ready(server)


def print_ready(server: RunningServer) -> None:
    environment = server.client_environment
    env_file = server.config.data_dir / "client.env"
    environment.write(env_file)
    print(environment.banner(env_file), flush=True)
    print(READY_LINE, flush=True)


def prepare_host(config: ServerConfig, say: Callable[[str], None]) -> None:
    """Root only: install and check what sandboxes and the domain's names need, saying what changes."""
    from runtime.backend import BackendError  # noqa: PLC0415
    from runtime.backends import backend_entry  # noqa: PLC0415

    from . import _nameres  # noqa: PLC0415

    is_root = os.geteuid() == 0
    try:
        backend_entry(config.backend).prepare_host(say)  # crun: runtime.host.prepare; the fake: nothing
        _nameres.ensure(config.domain, apply=is_root, say=say)
    except (BackendError, _nameres.NameResolutionError) as exc:
        raise ServerStartError(str(exc)) from None


def ensure_templates(config: ServerConfig, say: Callable[[str], None]) -> list[Template]:
    """Build (or find) the templates the server offers, before it listens."""
    from runtime.templates import TemplateError, ensure_template  # noqa: PLC0415

    built = []
    for name in dict.fromkeys((config.default_template, *config.templates)):
        try:
            template = ensure_template(name)
        except TemplateError as exc:
            raise ServerStartError(f"template {name}: {exc}") from None
        say(f"template {template.name}: {template.key[:16]}")
        built.append(template)
    return built


def serve(config: ServerConfig, say: Callable[[str], None] | None = None) -> int:
    """The whole start-up sequence, then serve until interrupted; the command's exit status."""
    say = say or (lambda message: print(f"e2b-compat: {message}", file=sys.stderr, flush=True))
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per proxied request would drown the rest
    sockets = listen_sockets(config)  # first: a taken port fails at once, not after a template build
    say(f"open-file limit: {raise_open_file_limit()} (client connections: {connection_limit(config.max_connections)})")
    prepare_host(config, say)
    templates = ensure_templates(config, say)

    async def main() -> None:
        async with open_server(config, templates=templates) as server:
            report = server.reconciliation
            say(
                f"reconciled with the runtime: {len(report.kept)} kept, {len(report.finished)} finished, "
                f"{len(report.released)} released, {len(report.orphans)} orphans removed"
            )
            await run(server, sockets, on_ready=print_ready)

    with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
        runner.run(main())
    return 0


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop the server runs on (setting ``event_loop``, ``_config.EVENT_LOOPS``).

    uvloop by default: under a loop of ``commands.run`` it took about 1 ms off each round trip
    (docs/BENCHMARKS.md). The server's subprocesses (crun) use only what both loops support, and
    the tests of what faces clients (the edge, its connections, the proxy) run on both.
    """
    if name == "uvloop":
        import uvloop  # noqa: PLC0415 (only the serving process needs it)

        return uvloop.new_event_loop
    if name == "asyncio":
        return asyncio.new_event_loop
    raise ValueError(f"unknown event loop {name!r}")
