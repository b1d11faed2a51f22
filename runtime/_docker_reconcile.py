"""Reconciling the docker backend after a server crash, a daemon restart or a host restart.

First the kills whose containers the reaper had not removed yet (``<state>/reaping/``) are
finished. Per record: a kill that did not finish is finished; a container that still runs keeps running
(its network namespace named and plugged again when that was lost); one whose processes are
gone (the daemon or the host restarted) is STOPPED, its files kept in the container's writable
layer, and resume boots it afresh; a record whose container is gone loses nothing when it never
ran (CREATED: the container is made again) and is set aside under ``<state>/quarantine/`` when it
had (its files went with the container). Then what no record owns is removed: this owner's
containers and snapshot images without a record or manifest, address leases, and network
namespaces of our prefix that no backend on the host claims (as ``OciBackend`` does).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import TYPE_CHECKING

import docker.errors

from . import _addresses, _hostfs, _network
from ._docker_engine import LABEL_KIND, LABEL_OWNER
from ._docker_reaper import REAPING
from .backend import ReconcileReport, SandboxRuntimeError, State

if TYPE_CHECKING:
    from .docker import DockerBackend, Record

_log = logging.getLogger(__name__)


def reconcile(backend: DockerBackend) -> ReconcileReport:
    adopted: list[str] = []
    cleaned: list[str] = []
    stopped: list[str] = []
    containers: set[str] = set()
    kept_subnets: set[tuple[str, str]] = set()
    known_netns: set[str] = set()
    for folder in sorted(p.name for p in (backend._dir / REAPING).iterdir()):
        if backend._reaper.reap_now(folder):
            cleaned.append(folder.split(".")[0])
    for record in backend._records():
        if record.releasing:
            try:
                backend._release(record)
                cleaned.append(record.sandbox_id)
                continue
            except (SandboxRuntimeError, OSError, docker.errors.DockerException) as exc:
                _log.warning("releasing %s still fails: %s", record.sandbox_id, exc)
        else:
            try:
                if not _settle(backend, record, stopped):
                    continue
            except (SandboxRuntimeError, OSError, docker.errors.DockerException) as exc:
                _log.warning("re-creating the resources of %s failed: %s", record.sandbox_id, exc)
            adopted.append(record.sandbox_id)
        if record.container:
            containers.add(record.container)
        if record.network:
            net = _network.SandboxNetwork.from_record(record.network)
            known_netns.add(net.netns)
            kept_subnets.add((str(net.subnet), record.sandbox_id))
    cleaned += _remove_unowned(backend, containers)
    cleaned += _addresses.sweep(
        backend._addresses, backend._owner, kept=kept_subnets, known_netns=known_netns, pool=backend._pool
    )
    for leftover in (backend._dir / "sandboxes").iterdir():
        if not (leftover / "record.json").exists():
            _hostfs.remove_tree(leftover)  # a create that died before its record
            cleaned.append(leftover.name)
    return ReconcileReport(tuple(adopted), tuple(cleaned), tuple(stopped), _failed(backend))


def _settle(backend: DockerBackend, record: Record, stopped: list[str]) -> bool:
    """Bring one record and its container into agreement; False when it was set aside or released."""
    state = State(record.state)
    container = backend._container(record)
    if container is None:
        if state is State.CREATED:  # nothing ran in it: nothing to lose, made again
            if record.network is None:
                backend._provision(record)
            else:
                backend._make_container(record)
            return True
        _quarantine(backend, record, "its container (and the files in it) is gone")
        return False
    status = container.status  # created, running, paused, restarting, exited, dead
    if state in (State.RUNNING, State.PAUSED) and status in ("running", "paused"):
        if state is State.RUNNING and status == "paused":  # a commit cut short by a crash
            container.unpause()
        if not backend._plugged(record, container):
            backend._plug(record, container)
        return True
    if status in ("running", "paused", "restarting"):  # a start or resume cut short: back to the record's state
        backend._stop(record, container)
    elif record.network is not None:
        _network.destroy(_network.SandboxNetwork.from_record(record.network))  # its namespace ended with it
    if state in (State.RUNNING, State.PAUSED):
        record.state = State.STOPPED.value
        backend._save(record)
        stopped.append(record.sandbox_id)
    return True


def _remove_unowned(backend: DockerBackend, containers: set[str]) -> list[str]:
    removed = []
    client = backend._docker
    for container in client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={backend._owner}"}):
        if container.name not in containers:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
                removed.append(str(container.name))
    manifests = {str(m.get("image")) for m in backend._manifests().values()}
    for image in client.images.list(filters={"label": [f"{LABEL_OWNER}={backend._owner}", f"{LABEL_KIND}=snapshot"]}):
        if image.id is not None and image.id not in manifests:  # committed, then a crash before its manifest
            with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                client.images.remove(image.id, force=True)
                removed.append(str(image.id))
    return removed


def _quarantine(backend: DockerBackend, record: Record, why: str) -> None:
    target = backend._dir / "quarantine" / record.sandbox_id
    if target.exists():
        target = target.with_name(f"{record.sandbox_id}.{secrets.token_hex(3)}")
    try:
        backend._release(record, keep=target)
    except (SandboxRuntimeError, OSError, docker.errors.DockerException) as exc:
        _log.error("could not set %s aside (%s): %s", record.sandbox_id, why, exc)
        return
    (target / "failed.txt").write_text(f"{why}\n")
    _log.error("sandbox %s could not be re-created (%s); its record is kept in %s", record.sandbox_id, why, target)


def _failed(backend: DockerBackend) -> tuple[str, ...]:
    folder = backend._dir / "quarantine"
    if not folder.is_dir():
        return ()
    return tuple(sorted({entry.name.split(".")[0] for entry in folder.iterdir() if entry.is_dir()}))
