"""The host-wide address registry: one /30 per sandbox across threads, processes and servers."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import _network
from runtime._addresses import AddressRegistry, host_networks, sweep
from runtime._network import AddressPool, NetworkError, PoolExhaustedError

POOL = "10.250.0.0/26"  # 16 subnets of /30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(folder: Path, clock: Clock | None = None, interfaces: list[str] | None = None) -> AddressRegistry:
    nets = [ipaddress.IPv4Network(net, strict=False) for net in interfaces or []]
    return AddressRegistry(folder, pool=POOL, interfaces=lambda: nets, clock=clock or Clock(), cool_down_s=60)


def test_parallel_threads_never_share_a_subnet(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    got: list[ipaddress.IPv4Network] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        subnet = reg.allocate("server-a", f"sb{n}")
        with lock:
            got.append(subnet)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(got)) == 16
    with pytest.raises(PoolExhaustedError, match="16 leased"):
        reg.allocate("server-a", "one-too-many")


ALLOCATOR = """
import sys
from pathlib import Path
from runtime._addresses import AddressRegistry
reg = AddressRegistry(Path(sys.argv[1]), pool=sys.argv[2], interfaces=lambda: [])
print("\\n".join(str(reg.allocate(sys.argv[3], f"k{n}")) for n in range(8)))
"""


def test_two_servers_on_one_host_never_share_a_subnet(tmp_path: Path) -> None:
    """Two processes (two servers' backends) allocate at the same time from one registry folder."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ALLOCATOR, str(tmp_path), "10.250.0.0/25", owner],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        for owner in ("server-a", "server-b")
    ]
    outputs = [proc.communicate(timeout=60)[0].split() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(outputs[0]) == len(outputs[1]) == 8
    assert not set(outputs[0]) & set(outputs[1])


def test_a_released_subnet_is_not_reused_at_once(tmp_path: Path) -> None:
    clock = Clock()
    reg = registry(tmp_path, clock)
    first = reg.allocate("s", "a")
    assert reg.release(first, "s", "a")
    handed = {reg.allocate("s", f"b{n}") for n in range(15)}  # the rest of the pool
    assert first not in handed
    with pytest.raises(PoolExhaustedError, match="1 cooling down"):
        reg.allocate("s", "c")
    clock.now += 61
    assert reg.allocate("s", "c") == first


def test_next_fit_moves_on_even_after_a_release(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    a = reg.allocate("s", "a")
    reg.release(a, "s", "a")
    b = reg.allocate("s", "b")
    assert b != a
    assert int(b.network_address) == int(a.network_address) + 4


def test_a_subnet_on_a_host_interface_is_skipped(tmp_path: Path) -> None:
    reg = registry(tmp_path, interfaces=["10.250.0.1/30", "10.250.0.6/32", "192.168.1.5/24"])
    assert reg.allocate("s", "a") == ipaddress.IPv4Network("10.250.0.8/30")


def test_release_ends_only_the_owners_lease(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    subnet = reg.allocate("server-a", "sb")
    assert not reg.release(subnet, "server-b", "sb")
    assert not reg.release(subnet, "server-a", "other")
    assert [lease.key for lease in reg.leases("server-a")] == ["sb"]
    assert reg.leases("server-b") == []
    assert reg.release(subnet, "server-a", "sb")
    assert reg.leases("server-a") == []
    assert not reg.release(subnet, "server-a", "sb"), "a second release finds nothing"


def test_a_damaged_registry_stops_allocation(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    reg.allocate("s", "a")
    (tmp_path / "addresses.json").write_text("{not json")
    with pytest.raises(NetworkError, match="damaged"):
        reg.allocate("s", "b")


def test_the_registry_is_private(tmp_path: Path) -> None:
    folder = tmp_path / "reg"
    registry(folder).allocate("s", "a")
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (folder / "addresses.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((folder / "addresses.json").read_text())["leases"] == {
        "10.250.0.0/30": {"owner": "s", "key": "a"}
    }


def test_host_networks_reads_the_loopback() -> None:
    assert ipaddress.IPv4Network("127.0.0.0/8") in host_networks()


def test_sweep_ends_what_no_sandbox_holds_and_spares_what_another_backend_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = registry(tmp_path / "registry")
    mine, theirs, gone = (str(tmp_path / name) for name in ("mine", "theirs", "gone"))
    (tmp_path / "theirs" / "sandboxes").mkdir(parents=True)  # a live backend; "gone" has no folder
    held = reg.allocate(mine, "held")
    reg.allocate(mine, "crashed")  # a lease whose record was never saved
    reg.allocate(theirs, "their1")
    reg.allocate(gone, "ghost")
    namespaces = [_network.NETNS_PREFIX + key for key in ("held", "their1", "ghost", "stray")]
    destroyed: list[str] = []
    monkeypatch.setattr(_network, "list_owned", lambda prefix=_network.NETNS_PREFIX: namespaces)
    monkeypatch.setattr(_network, "destroy", lambda net: destroyed.append(net.netns))
    removed = sweep(
        reg, mine, kept=[(str(held), "held")], known_netns=[_network.NETNS_PREFIX + "held"], pool=AddressPool(POOL)
    )
    assert sorted((lease.owner, lease.key) for lease in reg.leases()) == [(mine, "held"), (theirs, "their1")]
    assert removed == destroyed == [_network.NETNS_PREFIX + "ghost", _network.NETNS_PREFIX + "stray"]


def test_sweep_keeps_a_namespace_whose_lease_appears_after_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another server's create takes its lease, then makes its namespace; the sweep lists namespaces first."""
    reg = registry(tmp_path / "registry")
    theirs = str(tmp_path / "theirs")
    (tmp_path / "theirs" / "sandboxes").mkdir(parents=True)
    listed: list[str] = []
    real_leases = reg.leases

    def leases_while_they_create(owner: str | None = None) -> list[Any]:
        found = real_leases(owner)
        if not listed:  # their create lands between the sweep's two reads, whichever comes first
            reg.allocate(theirs, "racing")
            listed.append(_network.NETNS_PREFIX + "racing")
        return found

    destroyed: list[str] = []
    monkeypatch.setattr(reg, "leases", leases_while_they_create)
    monkeypatch.setattr(_network, "list_owned", lambda prefix=_network.NETNS_PREFIX: list(listed))
    monkeypatch.setattr(_network, "destroy", lambda net: destroyed.append(net.netns))
    assert sweep(reg, str(tmp_path / "mine"), kept=[], known_netns=[], pool=AddressPool(POOL)) == []
    assert [lease.key for lease in real_leases()] == ["racing"]
    assert destroyed == []
