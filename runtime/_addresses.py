"""One address allocator for the whole host: every backend of every server on it shares one registry.

Each sandbox gets a /30 of one pool (``_network.DEFAULT_POOL``). Bookkeeping inside one
process cannot keep two servers on the host apart (a running server and ``nox -s
conformance``), nor two threads of one server (creates provision in worker threads): both once
handed the same /30 to two sandboxes, so one tenant's ``/init`` and traffic reached another's
agent. So the leases live in one file per host, changed only under an exclusive ``flock``::

    <folder>/addresses.json   {"next": {<pool>: <index>}, "leases": {<subnet>: {"owner", "key"}},
                               "cooling": {<subnet>: <released at, unix seconds>}}
    <folder>/addresses.lock   the lock (flock: released by the kernel if the holder dies)

- ``allocate(owner, key)`` hands out the next /30 after the last one handed out (next fit,
  wrapping around the pool), skipping leased ones, ones released less than ``cool_down_s``
  ago (no immediate reuse: a late packet or a stale route for the old sandbox must not reach
  the new one), and any that overlaps an address already on an interface of the host.
- ``release(subnet, owner, key)`` ends that owner's lease (another's is left alone) and starts
  the subnet's cool-down.
- ``leases(owner)`` lists one owner's leases, so that a backend's reconciliation can end the
  ones no sandbox of its own holds any more.
- ``sweep(...)`` is that part of every backend's reconciliation: it ends the leases no sandbox
  holds and removes the network namespaces no backend on the host claims.

``owner`` is the backend's state folder, ``key`` the sandbox id. The default folder is under
``/run``, which the host empties at boot, when every network namespace is gone too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _network
from ._hostregistry import LockedState
from ._network import DEFAULT_POOL, SUBNET_PREFIX, AddressPool, NetworkError, PoolExhaustedError

__all__ = ["DEFAULT_REGISTRY", "AddressRegistry", "Lease", "host_networks", "sweep"]

DEFAULT_REGISTRY = Path("/run/e2b-compat")
COOL_DOWN_S = 60.0

InterfaceLister = Callable[[], Iterable[ipaddress.IPv4Network]]


def host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network configured on an interface of the host (``ip -json -4 addr``)."""
    proc = subprocess.run(["ip", "-json", "-4", "addr", "show"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NetworkError(f"ip addr show failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    found = []
    for link in json.loads(proc.stdout or "[]"):
        for address in link.get("addr_info", []):
            if address.get("family") == "inet":
                found.append(ipaddress.IPv4Network(f"{address['local']}/{address['prefixlen']}", strict=False))
    return found


@dataclass(frozen=True)
class Lease:
    subnet: ipaddress.IPv4Network
    owner: str
    key: str


class AddressRegistry:
    def __init__(
        self,
        folder: Path | None = None,  # default: DEFAULT_REGISTRY, shared by everything on the host
        *,
        pool: ipaddress.IPv4Network | str = DEFAULT_POOL,
        cool_down_s: float = COOL_DOWN_S,
        interfaces: InterfaceLister | None = None,  # default: host_networks
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = folder if folder is not None else DEFAULT_REGISTRY
        self.pool = ipaddress.IPv4Network(pool)
        if self.pool.prefixlen > SUBNET_PREFIX:
            raise ValueError(f"address pool {self.pool} is smaller than one /{SUBNET_PREFIX}")
        self._size = 1 << (SUBNET_PREFIX - self.pool.prefixlen)
        self._cool_down_s = cool_down_s
        self._interfaces = interfaces if interfaces is not None else host_networks
        self._clock = clock

    # -- the file, under the lock -------------------------------------------------------

    def _locked(self) -> contextlib.AbstractContextManager[dict[str, Any]]:
        """The registry, read under the host-wide lock and written back (atomically) on success."""
        return LockedState(self.folder, "addresses", NetworkError, "next", "leases", "cooling").locked()

    # -- operations ------------------------------------------------------------------------

    def allocate(self, owner: str, key: str) -> ipaddress.IPv4Network:
        with self._locked() as state:
            now = self._clock()
            cooling = {net: at for net, at in state["cooling"].items() if now - float(at) < self._cool_down_s}
            state["cooling"] = cooling
            taken = [ipaddress.IPv4Network(net) for net in (*state["leases"], *cooling)]
            taken += [net for net in self._interfaces() if net.overlaps(self.pool)]
            start = int(state["next"].get(str(self.pool), 0)) % self._size
            for step in range(self._size):
                index = (start + step) % self._size
                candidate = ipaddress.IPv4Network((int(self.pool.network_address) + (index << 2), SUBNET_PREFIX))
                if any(candidate.overlaps(net) for net in taken):
                    continue
                state["leases"][str(candidate)] = {"owner": owner, "key": key}
                state["next"][str(self.pool)] = index + 1
                return candidate
            raise PoolExhaustedError(
                f"no free /{SUBNET_PREFIX} left in the address pool {self.pool} "
                f"({len(state['leases'])} leased, {len(cooling)} cooling down)"
            )

    def release(self, subnet: ipaddress.IPv4Network | str, owner: str, key: str) -> bool:
        """End ``owner``'s lease of ``subnet`` for ``key``; False when it holds none (nothing changes)."""
        name = str(ipaddress.IPv4Network(subnet))
        with self._locked() as state:
            lease = state["leases"].get(name)
            if lease != {"owner": owner, "key": key}:
                return False
            del state["leases"][name]
            state["cooling"][name] = self._clock()
            return True

    def leases(self, owner: str | None = None) -> list[Lease]:
        """The leases of ``owner`` (of every owner when None), in address order."""
        with self._locked() as state:
            return [
                Lease(ipaddress.IPv4Network(net), lease["owner"], lease["key"])
                for net, lease in sorted(state["leases"].items(), key=lambda item: ipaddress.IPv4Network(item[0]))
                if owner is None or lease["owner"] == owner
            ]


def sweep(
    registry: AddressRegistry,
    owner: str,
    *,
    kept: Iterable[tuple[str, str]],
    known_netns: Iterable[str],
    pool: AddressPool,
) -> list[str]:
    """End ``owner``'s leases no sandbox holds and remove the namespaces no backend claims.

    ``kept`` is the (subnet, sandbox id) of every lease a record of ``owner`` still holds and
    ``known_netns`` those records' namespace names. A lease of another owner is ended only when
    its state folder is gone (a test's, a deleted data folder); while it exists, its sandboxes'
    namespaces share our prefix and are not orphans. Returns the namespaces removed.
    """
    kept_leases = set(kept)
    claimed = set(known_netns)
    # Namespaces first, leases second: another server's create takes its lease before it makes
    # its namespace, so every namespace listed here has its lease in the later read.
    owned_netns = _network.list_owned()
    for lease in registry.leases():
        if lease.owner == owner:
            stale = (str(lease.subnet), lease.key) not in kept_leases
        else:
            stale = not (Path(lease.owner) / "sandboxes").is_dir()
            if not stale:
                claimed.add(_network.NETNS_PREFIX + lease.key)
        if stale:
            registry.release(lease.subnet, lease.owner, lease.key)
    removed = []
    for netns in owned_netns:
        if netns not in claimed:
            # Names derive from the sandbox id alone; any subnet gives the same names to remove.
            orphan = _network.plan(netns[len(_network.NETNS_PREFIX) :], pool.allocate(set()))
            with contextlib.suppress(NetworkError, ValueError):
                _network.destroy(orphan)
                removed.append(netns)
    return removed
