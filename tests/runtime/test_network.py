"""Per-sandbox networking: the pure rules anywhere, the real thing (namespaces, veth, nftables) as root.

The kernel tests create namespaces named ``e2b-pytest-<random>-…`` (and one hand-made stand-in
for "the outside world", ``e2bt-pytest-…`` with host end ``e2bx…``, that exists only on this
host), take their subnets from the top of the default pool skipping every route the host already
has, and remove all of it in ``finally`` blocks. The firewall table is removed afterwards only
if it was not there before (a runtime on the same host keeps its own). Servers run as
``ip netns exec`` subprocesses, ended by their pid. Nothing is sent anywhere but to addresses of
this host and of these namespaces: forwarding is switched on only for interfaces the tests
created, and a sandbox that has to forward is given a route to the stand-in's /30 alone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import _network as network
from runtime._network import AddressPool, NamesTakenError, NetworkError, PoolExhaustedError, SandboxNetwork

IPv4Network = ipaddress.IPv4Network

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="creates network namespaces, veth pairs and nftables rules: needs root"
)

TEST_POOL = IPv4Network("10.201.240.0/20")  # top of the default pool; host routes there are skipped
RUN = f"pytest-{secrets.token_hex(3)}"
SANDBOX_PORT = 8000
ATTEMPT_TIMEOUT_S = 1.0

SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])), backlog=64)
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.sendall(sys.argv[3].encode())
"""

CLIENT = """
import errno, json, socket, sys
outcome, data = "connected", ""
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as conn:
        data = conn.recv(64).decode()
except ConnectionRefusedError:
    outcome = "refused"
except TimeoutError:
    outcome = "timeout"
except OSError as exc:
    outcome = "unreachable" if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH) else f"error {exc.errno}"
print(json.dumps([outcome, data]))
"""


# --- the pure rules ---------------------------------------------------------------------------


def _net(text: str) -> IPv4Network:
    return IPv4Network(text)


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        (set(), "10.201.0.0/30"),
        ({"10.201.0.0/30"}, "10.201.0.4/30"),
        ({"10.201.0.0/30", "10.201.0.8/30"}, "10.201.0.4/30"),  # the lowest hole, not the end
        ({"10.201.0.0/29"}, "10.201.0.8/30"),  # a larger network blocks every /30 it covers
        ({"10.201.0.4/32"}, "10.201.0.0/30"),
        ({"10.201.0.0/32", "10.201.0.5/32"}, "10.201.0.8/30"),  # overlaps count, not only equality
        ({"10.0.0.0/8"}, None),  # covers the whole pool
        ({"192.168.0.0/16", "10.200.0.0/30"}, "10.201.0.0/30"),  # outside the pool: ignored
    ],
)
def test_allocate_takes_the_lowest_free_subnet(used: set[str], expected: str | None) -> None:
    pool = AddressPool()
    if expected is None:
        with pytest.raises(PoolExhaustedError, match=r"10\.201\.0\.0/16"):
            pool.allocate({_net(u) for u in used})
    else:
        assert pool.allocate({_net(u) for u in used}) == _net(expected)


def test_allocate_is_pure_and_raises_when_exhausted() -> None:
    pool = AddressPool("192.168.7.0/29")
    used: set[IPv4Network] = set()
    assert pool.allocate(used) == pool.allocate(used) == _net("192.168.7.0/30")  # nothing is kept
    used.add(pool.allocate(used))
    used.add(pool.allocate(used))
    assert used == {_net("192.168.7.0/30"), _net("192.168.7.4/30")}
    with pytest.raises(PoolExhaustedError, match=r"no free /30 left in the address pool 192\.168\.7\.0/29"):
        pool.allocate(used)


@pytest.mark.parametrize("pool", ["10.0.0.0/31", "10.0.0.1/32"])
def test_pool_smaller_than_a_subnet_is_refused(pool: str) -> None:
    with pytest.raises(ValueError, match="smaller than one /30"):
        AddressPool(pool)


@given(
    used=st.sets(
        st.tuples(st.integers(min_value=0, max_value=255), st.integers(min_value=24, max_value=32)), max_size=40
    )
)
def test_allocate_property(used: set[tuple[int, int]]) -> None:
    pool = AddressPool("10.9.0.0/26")  # 16 subnets
    nets = {
        IPv4Network((int(IPv4Network("10.9.0.0/24").network_address) + host, bits), strict=False) for host, bits in used
    }
    candidates = list(pool.network.subnets(new_prefix=30))
    free = [c for c in candidates if not any(c.overlaps(n) for n in nets)]
    if not free:
        with pytest.raises(PoolExhaustedError):
            pool.allocate(nets)
    else:
        assert pool.allocate(nets) == free[0]


def test_plan_derives_short_names_and_the_two_ends() -> None:
    net = network.plan("sbx-0123456789abcdef", _net("10.201.3.8/30"))
    assert net.netns == "e2b-sbx-0123456789abcdef"
    assert net.netns_path == Path("/run/netns/e2b-sbx-0123456789abcdef")
    assert net.host_if.startswith("e2bh")
    assert net.sandbox_if.startswith("e2bs")
    assert len(net.host_if.encode()) == len(net.sandbox_if.encode()) == 12  # within the 15-byte limit
    assert net.host_if[4:] == net.sandbox_if[4:]
    assert (str(net.host_ip), str(net.sandbox_ip)) == ("10.201.3.9", "10.201.3.10")
    assert network.plan("sbx-0123456789abcdef", _net("10.201.3.8/30")) == net  # deterministic
    assert network.plan("sbx-0123456789abcdeg", _net("10.201.3.8/30")).host_if != net.host_if


@pytest.mark.parametrize("key", ["", "a/b", "..", "-x", ".x", "a b", "x" * 65, "ключ"])
def test_plan_refuses_unsafe_keys(key: str) -> None:
    with pytest.raises(ValueError, match="sandbox key"):
        network.plan(key, _net("10.201.0.0/30"))


def test_plan_refuses_other_than_a_slash_30() -> None:
    with pytest.raises(ValueError, match="/30"):
        network.plan("k", _net("10.201.0.0/29"))


def test_record_round_trip() -> None:
    net = network.plan("abc", _net("10.201.0.4/30"))
    record = net.to_record()
    assert record == {
        "netns": "e2b-abc",
        "host_if": net.host_if,
        "sandbox_if": net.sandbox_if,
        "subnet": "10.201.0.4/30",
        "host_ip": "10.201.0.5",
        "sandbox_ip": "10.201.0.6",
    }
    assert SandboxNetwork.from_record(json.loads(json.dumps(record))) == net


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"netns": None}, "'netns' missing"),
        ({"subnet": 5}, "'subnet' missing or not a string"),
        ({"host_ip": "10.201.0.6", "sandbox_ip": "10.201.0.5"}, "not the two ends"),
        ({"host_if": "e2bh-far-too-long-name"}, "bad interface name"),
        ({"netns": "../etc"}, "bad netns name"),
    ],
)
def test_record_rejects_bad_values(change: dict[str, object], message: str) -> None:
    record: dict[str, object] = {**network.plan("abc", _net("10.201.0.4/30")).to_record(), **change}
    if change.get("netns", "") is None:
        del record["netns"]
    with pytest.raises(ValueError, match=message):
        SandboxNetwork.from_record(record)


def test_default_route_only_with_egress() -> None:
    net = network.plan("abc", _net("10.201.0.4/30"))
    assert "default" not in network.sandbox_batch(net, egress=False)
    assert f"route add default via 10.201.0.5 dev {net.sandbox_if}\n" in network.sandbox_batch(net, egress=True)
    assert f"peer name {net.sandbox_if} address {net.sandbox_mac} netns e2b-abc\n" in network.host_batch(net)


def test_each_end_has_a_fixed_address_from_its_ip() -> None:
    net = network.plan("abc", _net("10.201.3.8/30"))
    assert (net.host_mac, net.sandbox_mac) == ("02:e2:b0:c9:03:09", "02:e2:b1:c9:03:0a")
    other = network.plan("abd", _net("10.201.3.12/30"))
    assert len({net.host_mac, net.sandbox_mac, other.host_mac, other.sandbox_mac}) == 4


@needs_root
def test_the_two_ends_know_each_other_without_arp(pair: Pair) -> None:
    """Permanent neighbour entries on both ends: no ARP request that a just-plugged link could lose."""
    for net in (pair.a, pair.b):
        host_side = _ip_json("neigh", "show", "dev", net.host_if)
        assert [(n["dst"], n["lladdr"], n["state"]) for n in host_side] == [
            (str(net.sandbox_ip), net.sandbox_mac, ["PERMANENT"])
        ]
        inside = json.loads(in_netns(net.netns, "-j", "neigh", "show", "dev", net.sandbox_if))
        assert [(n["dst"], n["lladdr"], n["state"]) for n in inside] == [
            (str(net.host_ip), net.host_mac, ["PERMANENT"])
        ]
        link = json.loads(in_netns(net.netns, "-j", "link", "show", "dev", net.sandbox_if))
        assert link[0]["address"] == net.sandbox_mac
        assert _ip_json("link", "show", "dev", net.host_if)[0]["address"] == net.host_mac


# --- helpers for the kernel tests ---------------------------------------------------------------


def _ip_json(*args: str) -> list[dict[str, object]]:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout
    parsed: list[dict[str, object]] = json.loads(out or "[]")
    return parsed


def _host_routes() -> set[IPv4Network]:
    """Every IPv4 destination the host routes anywhere, so test subnets collide with nothing."""
    found: set[IPv4Network] = set()
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst")
        if isinstance(dst, str) and dst != "default":
            found.add(IPv4Network(dst, strict=False))
    return found


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses outside loopback and the tests' interfaces (eth0's, say)."""
    found: list[str] = []
    for link in _ip_json("-4", "addr", "show"):
        name, infos = str(link.get("ifname", "")), link.get("addr_info")
        if name != "lo" and not name.startswith("e2b") and isinstance(infos, list):
            found += [str(info["local"]) for info in infos if isinstance(info, dict) and "local" in info]
    return found


class Subnets:
    def __init__(self) -> None:
        self.pool = AddressPool(TEST_POOL)
        self.used = _host_routes()

    def take(self) -> IPv4Network:
        subnet = self.pool.allocate(self.used)
        self.used.add(subnet)
        return subnet


@contextlib.contextmanager
def made(net: SandboxNetwork, *, egress: bool = False) -> Iterator[SandboxNetwork]:
    network.create(net, egress=egress)  # removes what it made if it fails
    try:
        yield net
    finally:
        network.destroy(net)


@contextlib.contextmanager
def server(netns: str | None, host: str, port: int, token: str) -> Iterator[int]:
    """A TCP server that sends ``token`` to every connection, in ``netns`` or on the host; yields its port."""
    argv = [sys.executable, "-I", "-c", SERVER, host, str(port), token]
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]  # exec's the command: the pid is the server's
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"server in {netns} did not start"
        yield int(line)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def attempt(netns: str, host: str, port: int) -> tuple[str, str]:
    """Connect from inside ``netns`` (at most ~1 s): ``(outcome, data received)``."""
    argv = ["ip", "netns", "exec", netns, sys.executable, "-I", "-c", CLIENT, host, str(port), str(ATTEMPT_TIMEOUT_S)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=True)
    outcome, data = json.loads(done.stdout)
    return str(outcome), str(data)


def from_host(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=ATTEMPT_TIMEOUT_S) as conn:
        return conn.recv(64).decode()


def in_netns(netns: str, *args: str) -> str:
    return subprocess.run(["ip", "-n", netns, *args], capture_output=True, text=True, check=True).stdout


@contextlib.contextmanager
def forwarding(*interfaces: str) -> Iterator[None]:
    """Let the host forward packets received on these (test-made) interfaces only."""
    paths = [Path(f"/proc/sys/net/ipv4/conf/{name}/forwarding") for name in interfaces]
    for path in paths:
        path.write_text("1\n")
    try:
        yield
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):  # gone with its interface
                path.write_text("0\n")


@contextlib.contextmanager
def routes(netns: str, *prefixes: str, via: ipaddress.IPv4Address) -> Iterator[None]:
    """Routes a root user inside the sandbox could add for itself."""
    added: list[str] = []
    try:
        for prefix in prefixes:
            in_netns(netns, "route", "add", prefix, "via", str(via))
            added.append(prefix)
        yield
    finally:
        for prefix in added:
            subprocess.run(["ip", "-n", netns, "route", "del", prefix], capture_output=True, check=False)


def dropped(before: dict[str, int], reason: str) -> int:
    return network.firewall_counters()[reason] - before[reason]


@dataclass(frozen=True)
class Pair:
    a: SandboxNetwork
    b: SandboxNetwork
    subnets: Subnets


@pytest.fixture(scope="module")
def firewall() -> Iterator[None]:
    was_there = network.host_firewall_present()
    network.ensure_host_firewall()
    try:
        yield
    finally:
        if not was_there:
            network.remove_host_firewall()


@pytest.fixture(scope="module")
def pair(firewall: None) -> Iterator[Pair]:
    """Two sandboxes without egress, each serving its name on port 8000."""
    subnets = Subnets()
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(made(network.plan(f"{RUN}-a", subnets.take())))
        b = stack.enter_context(made(network.plan(f"{RUN}-b", subnets.take())))
        stack.enter_context(server(a.netns, "0.0.0.0", SANDBOX_PORT, "sandbox-a"))
        stack.enter_context(server(b.netns, "0.0.0.0", SANDBOX_PORT, "sandbox-b"))
        yield Pair(a, b, subnets)


# --- the kernel tests ---------------------------------------------------------------------------


@needs_root
def test_host_reaches_sandbox_ports(pair: Pair) -> None:
    assert from_host(str(pair.a.sandbox_ip), SANDBOX_PORT) == "sandbox-a"
    assert from_host(str(pair.b.sandbox_ip), SANDBOX_PORT) == "sandbox-b"
    assert attempt(pair.a.netns, "127.0.0.1", SANDBOX_PORT) == ("connected", "sandbox-a")  # lo is up inside


@needs_root
def test_sandbox_has_no_default_route_and_no_ipv6_on_the_veth(pair: Pair) -> None:
    for net in (pair.a, pair.b):
        assert in_netns(net.netns, "-4", "route", "show").splitlines() == [
            f"{net.subnet} dev {net.sandbox_if} proto kernel scope link src {net.sandbox_ip} "
        ]
        assert in_netns(net.netns, "-6", "route", "show", "default") == ""
        assert in_netns(net.netns, "-6", "addr", "show", "dev", net.sandbox_if) == ""
        assert _ip_json("-6", "addr", "show", "dev", net.host_if) in ([], [{}])  # no link-local to reach the host by
        assert Path(f"/proc/sys/net/ipv4/conf/{net.host_if}/rp_filter").read_text().strip() == "1"


@needs_root
def test_sandboxes_cannot_reach_each_other(pair: Pair) -> None:
    a, b = pair.a, pair.b
    assert attempt(a.netns, str(b.sandbox_ip), SANDBOX_PORT)[0] == "unreachable"  # no route at all
    assert attempt(a.netns, str(b.host_ip), SANDBOX_PORT)[0] == "unreachable"

    # Even with routes of its own and a host that forwards, the firewall holds.
    before = network.firewall_counters()
    with (
        routes(a.netns, str(b.subnet), via=a.host_ip),
        routes(b.netns, str(a.subnet), via=b.host_ip),
        forwarding(a.host_if, b.host_if),
    ):
        assert attempt(a.netns, str(b.sandbox_ip), SANDBOX_PORT)[0] == "timeout"
        assert dropped(before, "sandbox_to_sandbox") >= 1
        assert attempt(a.netns, str(b.host_ip), SANDBOX_PORT)[0] == "timeout"  # another sandbox's host end
        assert dropped(before, "sandbox_to_host") >= 1
    assert from_host(str(b.sandbox_ip), SANDBOX_PORT) == "sandbox-b"


@needs_root
def test_sandbox_cannot_reach_host_services(pair: Pair) -> None:
    a = pair.a
    host_addresses = _host_addresses()
    with server(None, "0.0.0.0", 0, "host-any") as any_port, server(None, "127.0.0.1", 0, "host-lo") as lo_port:
        # The services are up: the host itself reaches them, also through the sandbox's host end.
        assert from_host("127.0.0.1", any_port) == "host-any"
        assert from_host(str(a.host_ip), any_port) == "host-any"
        assert from_host("127.0.0.1", lo_port) == "host-lo"

        before = network.firewall_counters()
        assert attempt(a.netns, str(a.host_ip), any_port)[0] == "timeout"  # 0.0.0.0 through the host end
        assert dropped(before, "sandbox_to_host") >= 1
        assert attempt(a.netns, "127.0.0.1", lo_port)[0] == "refused"  # the sandbox's own loopback
        assert attempt(a.netns, str(a.host_ip), lo_port)[0] == "timeout"
        for address in host_addresses:  # the host's other addresses: no route, and none that works
            assert attempt(a.netns, address, any_port)[0] == "unreachable"
            with routes(a.netns, f"{address}/32", via=a.host_ip):
                assert attempt(a.netns, address, any_port)[0] == "timeout"


@dataclass(frozen=True)
class Outside:
    """A stand-in for the outside world: a namespace of the test's own, reached through the host."""

    netns: str
    subnet: IPv4Network
    ip: ipaddress.IPv4Address
    host_if: str


@contextlib.contextmanager
def stand_in_outside(pair: Pair, name: str) -> Iterator[Outside]:
    subnet = pair.subnets.take()
    netns = f"e2bt-{RUN}{name}"
    tag = secrets.token_hex(4)
    host_if, outside_if = f"e2bx{tag}", f"e2by{tag}"
    host_ip, ip = network.endpoints(subnet)
    setup = (
        f"netns add {netns}\n"
        f"link add {host_if} type veth peer name {outside_if} netns {netns}\n"
        f"addr add {host_ip}/30 dev {host_if}\n"
        f"link set dev {host_if} up\n"
    )
    try:
        subprocess.run(["ip", "-batch", "-"], input=setup, text=True, check=True)
        subprocess.run(
            ["ip", "-n", netns, "-batch", "-"],
            input=(
                f"addr add {ip}/30 dev {outside_if}\nlink set dev {outside_if} up\n"
                f"route add {TEST_POOL} via {host_ip}\n"
            ),
            text=True,
            check=True,
        )
        yield Outside(netns, subnet, ip, host_if)
    finally:
        subprocess.run(["ip", "link", "del", "dev", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


@needs_root
def test_egress_only_for_members_of_the_egress_set(pair: Pair) -> None:
    """A stand-in for the outside world on this host: only an ``egress=True`` sandbox gets through."""
    c_net = network.plan(f"{RUN}-c", pair.subnets.take())
    with stand_in_outside(pair, "e") as outside:
        outside_ns, outside_subnet, outside_ip, outside_host_if = (
            outside.netns,
            outside.subnet,
            outside.ip,
            outside.host_if,
        )
        with (
            made(c_net, egress=True) as c,
            server(outside_ns, "0.0.0.0", SANDBOX_PORT, "outside"),
            server(c.netns, "0.0.0.0", SANDBOX_PORT, "sandbox-c"),
        ):
            assert in_netns(c.netns, "-4", "route", "show", "default").split() == [
                "default",
                "via",
                str(c.host_ip),
                "dev",
                c.sandbox_if,
            ]
            elements = _egress_elements()
            assert c.host_if in elements
            assert pair.a.host_if not in elements
            network.ensure_host_firewall()  # refreshing the rules keeps the set
            assert c.host_if in _egress_elements()

            # Only routes to the stand-in, so nothing here can reach the real outside world.
            in_netns(c.netns, "route", "del", "default")
            before = network.firewall_counters()
            with (
                routes(c.netns, str(outside_subnet), via=c.host_ip),
                routes(pair.a.netns, str(outside_subnet), via=pair.a.host_ip),
                forwarding(c.host_if, pair.a.host_if, outside_host_if),
            ):
                assert attempt(c.netns, str(outside_ip), SANDBOX_PORT) == ("connected", "outside")
                assert attempt(pair.a.netns, str(outside_ip), SANDBOX_PORT)[0] == "timeout"
                assert dropped(before, "egress_denied") >= 1
                # Nothing outside may open a connection into a sandbox, egress or not.
                assert attempt(outside_ns, str(c.sandbox_ip), SANDBOX_PORT)[0] == "timeout"
                assert dropped(before, "into_sandbox") >= 1
        assert c_net.host_if not in _egress_elements()  # destroy took it out
    assert not Path(f"/run/netns/{outside_ns}").exists()


@needs_root
def test_allow_and_deny_lists_decide_before_the_egress_flag(pair: Pair) -> None:
    """E2B's allowOut/denyOut: an allowed CIDR gets out without egress; a denied one stays in with it."""
    d_net = network.plan(f"{RUN}-d", pair.subnets.take())
    with stand_in_outside(pair, "p") as outside:
        outside_ns, outside_subnet, outside_ip, outside_host_if = (
            outside.netns,
            outside.subnet,
            outside.ip,
            outside.host_if,
        )
        allow = network.EgressPolicy(allow_out=(f"{outside_ip}/32",))
        network.create(d_net, egress=False, policy=allow)
        try:
            with server(outside_ns, "0.0.0.0", SANDBOX_PORT, "outside"), forwarding(d_net.host_if, outside_host_if):
                # The allow list gives the sandbox a default route; send it only toward the stand-in.
                in_netns(d_net.netns, "route", "del", "default")
                with routes(d_net.netns, str(outside_subnet), via=d_net.host_ip):
                    assert attempt(d_net.netns, str(outside_ip), SANDBOX_PORT) == ("connected", "outside")
                    before = network.firewall_counters()
                    deny = network.EgressPolicy(deny_out=(f"{outside_subnet}",))
                    network.set_policy(d_net, egress=True, policy=deny)
                    in_netns(d_net.netns, "route", "del", "default")  # set_policy added one: egress is on
                    assert attempt(d_net.netns, str(outside_ip), SANDBOX_PORT)[0] == "timeout"
                    assert dropped(before, "policy_denied") >= 1
        finally:
            network.destroy(d_net)
        chains = subprocess.run(
            ["nft", "list", "table", f"inet {network.FIREWALL_TABLE}"], capture_output=True, text=True, check=True
        ).stdout
        assert f"p_{d_net.host_if}" not in chains, "destroy removes the sandbox's policy chain"


def _egress_elements() -> list[str]:
    out = subprocess.run(
        ["nft", "-j", "list", "set", "inet", network.FIREWALL_TABLE, network.EGRESS_SET],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for item in json.loads(out)["nftables"]:
        if "set" in item:
            return [str(e) for e in item["set"].get("elem", [])]
    return []


@needs_root
def test_rules_set_ahead_and_kept_over_an_unplug(pair: Pair) -> None:
    """A restore's order: the firewall's entries first (the veth does not exist yet), the veth after.

    An unplug that keeps them (a checkpoint's) leaves the membership for the next plug; a full
    destroy takes it out.
    """
    net = network.plan(f"{RUN}-ahead", pair.subnets.take())
    try:
        network.apply_rules(net, egress=True)
        assert net.host_if in _egress_elements(), "an entry may name an interface that is not there yet"
        assert network.exists(net) == {"netns": False, "host_if": False}
        network.create(net, egress=True, rules_applied=True)
        assert network.exists(net) == {"netns": True, "host_if": True}
        network.destroy(net, keep_rules=True)
        assert network.exists(net) == {"netns": False, "host_if": False}
        assert net.host_if in _egress_elements(), "kept for the next plug"
        network.create(net, egress=True, rules_applied=True)
        assert in_netns(net.netns, "-4", "route", "show", "default").split()[:3] == ["default", "via", str(net.host_ip)]
        # Set again without egress: the membership goes, whether or not it was there.
        network.apply_rules(net, egress=False)
        assert net.host_if not in _egress_elements()
    finally:
        network.destroy(net)
    assert net.host_if not in _egress_elements()
    assert network.exists(net) == {"netns": False, "host_if": False}


@needs_root
def test_create_refuses_names_that_exist(pair: Pair) -> None:
    with pytest.raises(NamesTakenError, match="netns, host_if already exist"):
        network.create(pair.a)
    assert from_host(str(pair.a.sandbox_ip), SANDBOX_PORT) == "sandbox-a"  # untouched


@needs_root
def test_create_needs_the_firewall(firewall: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network, "_TABLE", "inet e2b_compat_pytest_absent")
    net = network.plan(f"{RUN}-nofw", IPv4Network("10.201.255.252/30"))
    with pytest.raises(NetworkError, match=r"missing: call ensure_host_firewall\(\)"):
        network.create(net)
    assert network.exists(net) == {"netns": False, "host_if": False}


@needs_root
def test_failed_create_and_half_made_networks_are_cleaned_up(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    net = network.plan(f"{RUN}-half", pair.subnets.take())
    try:
        # Only the namespace, as after a crash right after "netns add".
        subprocess.run(["ip", "netns", "add", net.netns], check=True)
        assert network.exists(net) == {"netns": True, "host_if": False}
        network.destroy(net)
        assert network.exists(net) == {"netns": False, "host_if": False}

        # The sandbox half fails after the host half was made: create removes it again.
        monkeypatch.setattr(network, "sandbox_batch", lambda net, *, egress: "link set dev nonexistent0 up\n")
        with pytest.raises(NetworkError, match="nonexistent0"):
            network.create(net)
        assert network.exists(net) == {"netns": False, "host_if": False}
    finally:
        network.destroy(net)


@needs_root
def test_lifecycle_and_timing(pair: Pair, capsys: pytest.CaptureFixture[str]) -> None:
    net = network.plan(f"{RUN}-life", pair.subnets.take())
    try:
        network.create(net)
        assert network.exists(net) == {"netns": True, "host_if": True}
        assert net.netns in network.list_owned()
        assert net.netns in network.list_owned(f"e2b-{RUN}-")
        with pytest.raises(ConnectionRefusedError):  # the address answers; nothing listens on port 1
            from_host(str(net.sandbox_ip), 1)
    finally:
        network.destroy(net)
    assert network.exists(net) == {"netns": False, "host_if": False}
    assert net.netns not in network.list_owned()
    network.destroy(net)  # twice is fine

    creates: list[float] = []
    destroys: list[float] = []
    for _ in range(20):
        started = time.perf_counter()
        network.create(net)
        created = time.perf_counter()
        network.destroy(net)
        creates.append(created - started)
        destroys.append(time.perf_counter() - created)
    with capsys.disabled():
        print(
            f"\n[network] create: median {statistics.median(creates) * 1000:.1f} ms, max {max(creates) * 1000:.1f} ms;"
            f" destroy: median {statistics.median(destroys) * 1000:.1f} ms, max {max(destroys) * 1000:.1f} ms"
            f" (n={len(creates)})"
        )


@needs_root
def test_forwarding_rules_pass_nft_check_without_changing_anything(firewall: None) -> None:
    before = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    check = subprocess.run(
        ["nft", "--check", "-f", "-"],
        input=network.forwarding_script(TEST_POOL),
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    after = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    assert before == after


@needs_root
def test_attached_to_names_the_namespace_of_that_process_only(firewall: None) -> None:
    net = network.plan(f"{RUN}-at", Subnets().take())
    # A process in a network namespace of its own, as a runtime's container init is.
    holder = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < deadline, "unshare did not enter a namespace"
            time.sleep(0.01)
        assert not network.attached_to(net, holder.pid), "nothing is named yet"
        network.create(net, egress=False, attach_pid=holder.pid)
        try:
            assert network.attached_to(net, holder.pid)
            assert not network.attached_to(net, os.getpid()), "the name is another namespace's"
            subprocess.run(["ip", "link", "del", net.host_if], check=True)
            assert not network.attached_to(net, holder.pid), "the veth went"
        finally:
            network.destroy(net)
    finally:
        holder.kill()
        holder.wait()
