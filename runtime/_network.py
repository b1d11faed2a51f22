"""Per-sandbox networking: one network namespace and one veth pair per sandbox, one host firewall table.

Every sandbox gets a named network namespace (``/run/netns/e2b-<key>``, which crun joins through
the OCI spec's ``path``, or, where the runtime makes it, the name given to the container's with
``create(attach_pid=…)``) and a veth pair on a /30 of its own: the host end (``e2bh…``) holds the
first usable address, the sandbox end (``e2bs…``) the second. The host reaches the sandbox's
ports on that address (the data-plane proxy connects to the agent there); the sandbox gets no
default route unless asked for egress.

Why the pieces are shaped this way:

- **Two ``ip -batch`` processes, not one ``ip`` per step.** ``ip`` cannot change namespaces
  per batch line, so the host half (netns, veth created with its peer directly *inside* the
  namespace, so the sandbox end never appears on the host) is one batch and the sandbox half
  (``ip -n <netns>``) is another. With the one ``nft`` call below, creating a network takes
  about 25 ms here and destroying it about 40 ms (deleting a veth waits for the kernel).
- **Names are derived, never stored elsewhere.** The netns is ``e2b-<key>``; interface names
  may have 15 bytes, so they are ``e2bh``/``e2bs`` + 8 hex digits of sha256(key). ``create``
  refuses to start when any of the names is taken (`NamesTakenError`), because ``destroy`` deletes
  by name and would otherwise remove another sandbox's network; with 1,000 live sandboxes the
  chance that a new key's hash collides is about 1 in 4 million, and such a create just fails.
- **Crash recovery.** The runtime records a `SandboxNetwork` (``to_record``) before
  ``create``. ``destroy`` deletes the host end of the veth (which deletes both ends, even while
  a process still holds the namespace) and the netns name, tolerating either being missing, so
  it cleans up after a create that failed or crashed anywhere. ``list_owned`` finds namespaces
  no record mentions.
- **No IPv6 on the veth** (``addrgenmode none``): otherwise each end gets a link-local address
  and a sandbox could reach host services bound to ``::`` through ``fe80::…%e2bs…``.

Isolation is one nftables table of our own, ``table inet e2b_compat`` (`ensure_host_firewall`),
matching the host ends by name (``e2bh*``), so it holds for every sandbox without per-sandbox
rules:

- *input*: from a sandbox interface only replies (``ct state established,related``) reach the
  host; everything else is dropped. Any packet a sandbox addresses to *any* host address (its
  own host-side address, another sandbox's, the host's LAN address) arrives here, so services
  bound to 0.0.0.0 or ``::`` are unreachable, while connections the host opens into a sandbox
  work (their replies are established). The host's 127.0.0.0/8 is covered twice: inside the
  sandbox 127.0.0.1 is its own loopback, and the kernel drops packets for 127/8 that arrive on
  a non-loopback interface (unless ``route_localnet`` is set, which the drop above also covers).
- *forward*: sandbox → sandbox is dropped; nothing from outside may open connections into a
  sandbox (replies pass); sandbox → elsewhere is dropped unless the host end is in the set
  ``egress`` (``create(egress=True)`` adds it, ``destroy`` removes it). These only matter once
  the host forwards at all; the route inside the sandbox alone would not hold egress off, since
  a sandbox with ``CAP_NET_ADMIN`` could add its own default route.
- ``rp_filter=1`` on each host end: a sandbox cannot send with another sandbox's source address.

Drops are counted in named counters (`firewall_counters`). Why not the alternatives: rules
inside each netns can be removed by a sandbox holding ``CAP_NET_ADMIN`` there; routing tricks
(no address on the host end, a /32 route) still leave the host's other addresses reachable,
since Linux accepts a packet for any local address on any interface; a VRF would hide the host's
sockets but force the proxy to bind into it. nftables' drop is final whatever other tables
(firewalld, Docker) accept, so the table composes with an existing firewall.

Egress to the outside world needs the host to forward and to masquerade the pool: that is an
operator's decision, made only by calling `enable_host_forwarding` (never called by the tests).
It sets the host-wide ``net.ipv4.ip_forward=1``, which `remove_host_firewall` does not undo.

Host requirements: ``ip`` (iproute2) and ``nft`` (Debian package ``nftables``); a kernel with
network namespaces, veth, nf_tables and conntrack. Something that flushes the whole ruleset
(``nft flush ruleset``, Debian's ``nftables.service`` with its stock ``/etc/nftables.conf``)
also removes this table; ``create`` fails while the table is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .backend import BackendError

__all__ = [
    "DEFAULT_POOL",
    "FIREWALL_TABLE",
    "HOST_IF_PREFIX",
    "NETNS_DIR",
    "NETNS_PREFIX",
    "SANDBOX_IF_PREFIX",
    "AddressPool",
    "EgressPolicy",
    "NamesTakenError",
    "NetworkError",
    "PoolExhaustedError",
    "SandboxNetwork",
    "attached_to",
    "create",
    "destroy",
    "enable_host_forwarding",
    "ensure_host_firewall",
    "exists",
    "firewall_counters",
    "host_firewall_present",
    "list_owned",
    "plan",
    "policy_script",
    "remove_host_firewall",
    "set_policy",
]

DEFAULT_POOL = ipaddress.IPv4Network("10.201.0.0/16")
SUBNET_PREFIX = 30
NETNS_DIR = Path("/run/netns")
NETNS_PREFIX = "e2b-"
HOST_IF_PREFIX = "e2bh"
SANDBOX_IF_PREFIX = "e2bs"
FIREWALL_TABLE = "e2b_compat"
EGRESS_SET = "egress"
COUNTERS = ("sandbox_to_host", "sandbox_to_sandbox", "into_sandbox", "egress_denied", "policy_denied")
POLICY_MAP = "policies"

_IFNAMSIZ = 15  # bytes, without the terminating NUL
_HASH_CHARS = 8
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TABLE = f"inet {FIREWALL_TABLE}"


class NetworkError(BackendError):
    """A network command failed; the message carries the command's own error output."""


class PoolExhaustedError(NetworkError):
    """Every /30 of the pool is in use."""


class NamesTakenError(NetworkError):
    """The netns or interface name of a network to create already exists (it is not ours to touch)."""


class AddressPool:
    """An IPv4 range handed out as /30 subnets: network, host end, sandbox end, broadcast."""

    def __init__(self, network: ipaddress.IPv4Network | str = DEFAULT_POOL) -> None:
        self.network = ipaddress.IPv4Network(network)
        if self.network.prefixlen > SUBNET_PREFIX:
            raise ValueError(f"address pool {self.network} is smaller than one /{SUBNET_PREFIX}")
        self.size = 1 << (SUBNET_PREFIX - self.network.prefixlen)

    def allocate(self, used: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
        """The lowest /30 of the pool that overlaps none of ``used`` (networks outside the pool are ignored)."""
        base = int(self.network.network_address)
        blocked: list[tuple[int, int]] = []  # half-open ranges of /30 indexes
        for net in used:
            if not net.overlaps(self.network):
                continue
            first = max(int(net.network_address), base) - base
            last = min(int(net.broadcast_address), int(self.network.broadcast_address)) - base
            blocked.append((first >> 2, (last >> 2) + 1))
        candidate = 0
        for start, end in sorted(blocked):
            if start > candidate:
                break
            candidate = max(candidate, end)
        if candidate >= self.size:
            raise PoolExhaustedError(f"no free /{SUBNET_PREFIX} left in the address pool {self.network}")
        return ipaddress.IPv4Network((base + (candidate << 2), SUBNET_PREFIX))


def endpoints(subnet: ipaddress.IPv4Network) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    """The host end (first usable address) and the sandbox end (second) of a /30."""
    if subnet.prefixlen != SUBNET_PREFIX:
        raise ValueError(f"a sandbox subnet is a /{SUBNET_PREFIX}, not {subnet}")
    return subnet.network_address + 1, subnet.network_address + 2


@dataclass(frozen=True)
class SandboxNetwork:
    """Everything ``create`` makes and ``destroy`` removes, by name."""

    netns: str  # the name under /run/netns
    host_if: str
    sandbox_if: str
    subnet: ipaddress.IPv4Network
    host_ip: ipaddress.IPv4Address
    sandbox_ip: ipaddress.IPv4Address

    def __post_init__(self) -> None:
        if not self.netns or "/" in self.netns or self.netns in (".", ".."):
            raise ValueError(f"bad netns name {self.netns!r}")
        for name in (self.host_if, self.sandbox_if):
            if not 0 < len(name.encode()) <= _IFNAMSIZ or "/" in name or any(c.isspace() for c in name):
                raise ValueError(f"bad interface name {name!r} (1 to {_IFNAMSIZ} bytes, no '/' or space)")
        if (self.host_ip, self.sandbox_ip) != endpoints(self.subnet):
            raise ValueError(f"{self.host_ip} and {self.sandbox_ip} are not the two ends of {self.subnet}")

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def host_mac(self) -> str:
        return _mac(_HOST_MAC_PREFIX, self.host_ip)

    @property
    def sandbox_mac(self) -> str:
        return _mac(_SANDBOX_MAC_PREFIX, self.sandbox_ip)

    def to_record(self) -> dict[str, str]:
        return {
            "netns": self.netns,
            "host_if": self.host_if,
            "sandbox_if": self.sandbox_if,
            "subnet": str(self.subnet),
            "host_ip": str(self.host_ip),
            "sandbox_ip": str(self.sandbox_ip),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SandboxNetwork:
        fields = ("netns", "host_if", "sandbox_if", "subnet", "host_ip", "sandbox_ip")
        values: dict[str, str] = {}
        for name in fields:
            value = record.get(name)
            if not isinstance(value, str):
                raise ValueError(f"network record: {name!r} missing or not a string")
            values[name] = value
        return cls(
            netns=values["netns"],
            host_if=values["host_if"],
            sandbox_if=values["sandbox_if"],
            subnet=ipaddress.IPv4Network(values["subnet"]),
            host_ip=ipaddress.IPv4Address(values["host_ip"]),
            sandbox_ip=ipaddress.IPv4Address(values["sandbox_ip"]),
        )


def plan(sandbox_key: str, subnet: ipaddress.IPv4Network) -> SandboxNetwork:
    """The names and addresses of a sandbox's network (pure: nothing is created)."""
    if not _KEY.fullmatch(sandbox_key):
        raise ValueError(f"sandbox key {sandbox_key!r}: 1 to 64 of A-Z a-z 0-9 _ . -, starting alphanumeric")
    digest = hashlib.sha256(sandbox_key.encode()).hexdigest()[:_HASH_CHARS]
    host_ip, sandbox_ip = endpoints(subnet)
    return SandboxNetwork(
        netns=NETNS_PREFIX + sandbox_key,
        host_if=HOST_IF_PREFIX + digest,
        sandbox_if=SANDBOX_IF_PREFIX + digest,
        subnet=subnet,
        host_ip=host_ip,
        sandbox_ip=sandbox_ip,
    )


def _run(argv: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        package = {"nft": "nftables", "ip": "iproute2"}.get(argv[0], argv[0])
        raise NetworkError(f"{argv[0]} not found: install the Debian package {package}")
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)


def _check(argv: list[str], stdin: str = "") -> str:
    done = _run(argv, stdin)
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


# Each pair's two ends get fixed addresses (locally administered, from their IPv4 address) and
# know each other's without ARP: the first ARP request after a plug could be lost while the
# kernel was still activating the new link's queues, and the connection then waited out ARP's
# one-second retry (one resume in about thirty, measured).
_HOST_MAC_PREFIX, _SANDBOX_MAC_PREFIX = "02:e2:b0", "02:e2:b1"


def _mac(prefix: str, ip: ipaddress.IPv4Address) -> str:
    return prefix + "".join(f":{byte:02x}" for byte in ip.packed[1:])


def host_batch(net: SandboxNetwork, attach_pid: int | None = None) -> str:
    """``ip -batch`` lines for the host namespace: the netns and the veth, host end configured.

    With ``attach_pid``, the name is given to that process's network namespace (``netns attach``,
    a bind mount of ``/proc/<pid>/ns/net``) instead of a new one: an engine that makes the
    container's namespace itself (Docker's ``network_mode=none``) gets the same veth and rules.
    """
    netns = f"netns attach {net.netns} {attach_pid}" if attach_pid is not None else f"netns add {net.netns}"
    return (
        f"{netns}\n"
        f"link add {net.host_if} address {net.host_mac} type veth"
        f" peer name {net.sandbox_if} address {net.sandbox_mac} netns {net.netns}\n"
        f"link set dev {net.host_if} addrgenmode none\n"
        f"addr add {net.host_ip}/{net.subnet.prefixlen} dev {net.host_if}\n"
        f"neigh replace {net.sandbox_ip} lladdr {net.sandbox_mac} dev {net.host_if} nud permanent\n"
        f"link set dev {net.host_if} up\n"
    )


def sandbox_batch(net: SandboxNetwork, *, egress: bool) -> str:
    """``ip -n <netns> -batch`` lines: loopback up, the sandbox end configured, a default route for egress."""
    lines = (
        "link set dev lo up\n"
        f"link set dev {net.sandbox_if} addrgenmode none\n"
        f"addr add {net.sandbox_ip}/{net.subnet.prefixlen} dev {net.sandbox_if}\n"
        f"neigh replace {net.host_ip} lladdr {net.host_mac} dev {net.sandbox_if} nud permanent\n"
        f"link set dev {net.sandbox_if} up\n"
    )
    if egress:
        lines += f"route add default via {net.host_ip} dev {net.sandbox_if}\n"
    return lines


def _egress_script(host_if: str, *, allow: bool) -> str:
    # add-then-delete in one transaction removes an element whether or not it was there
    # (nft 1.0.6, Debian 12's, has no "destroy element").
    lines = f'add element {_TABLE} {EGRESS_SET} {{ "{host_if}" }}\n'
    if not allow:
        lines += f'delete element {_TABLE} {EGRESS_SET} {{ "{host_if}" }}\n'
    return lines


@dataclass(frozen=True)
class EgressPolicy:
    """E2B's network fields: ``allowOut`` wins over ``denyOut``; the rest follows ``egress``.

    Applies only to traffic the host forwards at all (see `enable_host_forwarding`).
    """

    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for cidr in (*self.allow_out, *self.deny_out):
            ipaddress.ip_network(cidr, strict=False)  # ValueError for anything that is not an address or CIDR

    def needs_route(self, egress: bool) -> bool:
        return egress or bool(self.allow_out)


def _policy_chain(host_if: str) -> str:
    return f"p_{host_if}"


def policy_script(host_if: str, policy: EgressPolicy | None) -> str:
    """``nft -f`` lines that replace (or, for None, remove) a sandbox's allow/deny chain."""
    chain = f"{_TABLE} {_policy_chain(host_if)}"
    # add-then-delete removes whether or not it existed (Debian 12's nft has no "destroy").
    lines = [
        f"add chain {chain}",
        f'add element {_TABLE} {POLICY_MAP} {{ "{host_if}" : jump {_policy_chain(host_if)} }}',
        f'delete element {_TABLE} {POLICY_MAP} {{ "{host_if}" }}',
        f"flush chain {chain}",
    ]
    if policy is None:
        lines.append(f"delete chain {chain}")
        return "\n".join(lines) + "\n"
    for verdict, cidrs in (("accept", policy.allow_out), ('counter name "policy_denied" drop', policy.deny_out)):
        for cidr in cidrs:
            family = "ip6" if ipaddress.ip_network(cidr, strict=False).version == 6 else "ip"
            lines.append(f"add rule {chain} {family} daddr {cidr} {verdict}")
    lines.append(f'add element {_TABLE} {POLICY_MAP} {{ "{host_if}" : jump {_policy_chain(host_if)} }}')
    return "\n".join(lines) + "\n"


def set_policy(net: SandboxNetwork, *, egress: bool, policy: EgressPolicy | None) -> None:
    """Change a live sandbox's egress: membership of the egress set, its chain, its default route."""
    apply_rules(net, egress=egress, policy=policy)
    wants_route = (policy or EgressPolicy()).needs_route(egress)
    has_route = bool(_run(["ip", "-n", net.netns, "-4", "route", "show", "default"]).stdout.strip())
    if wants_route and not has_route:
        _check(["ip", "-n", net.netns, "route", "add", "default", "via", str(net.host_ip), "dev", net.sandbox_if])
    elif has_route and not wants_route:
        _check(["ip", "-n", net.netns, "route", "del", "default"])


def create(
    net: SandboxNetwork,
    *,
    egress: bool = False,
    policy: EgressPolicy | None = None,
    attach_pid: int | None = None,
    rules_applied: bool = False,
) -> None:
    """Create the netns and the veth pair; without ``egress`` the sandbox has no default route.

    With ``attach_pid`` the netns is that process's (see `host_batch`); ``destroy`` removes the
    name the same way (the namespace itself ends with the last process in it).

    Needs the host firewall (`ensure_host_firewall`): the first step sets the host end's
    membership of the egress set (``apply_rules``; skipped when the caller did it already,
    ``rules_applied``), which fails while the table is missing, before anything exists. On any
    later failure what was made is destroyed again; a crash in between is cleaned up by
    ``destroy`` from the record.
    """
    taken = [name for name, present in exists(net).items() if present]
    if taken:
        raise NamesTakenError(f"{net.netns}/{net.host_if}: {', '.join(taken)} already exist(s)")
    if not rules_applied:
        apply_rules(net, egress=egress, policy=policy)
    try:
        _check(["ip", "-batch", "-"], host_batch(net, attach_pid))
        Path(f"/proc/sys/net/ipv4/conf/{net.host_if}/rp_filter").write_text("1\n")
        wants_route = (policy or EgressPolicy()).needs_route(egress)
        _check(["ip", "-n", net.netns, "-batch", "-"], sandbox_batch(net, egress=wants_route))
    except BaseException:
        with contextlib.suppress(NetworkError):
            destroy(net)
        raise


def apply_rules(net: SandboxNetwork, *, egress: bool = False, policy: EgressPolicy | None = None) -> None:
    """The host firewall's entries for the sandbox's host end: its egress membership and policy.

    They name the interface, which need not exist yet, so a caller may set them while the
    sandbox's namespace is still being made and then ``create(..., rules_applied=True)``.
    Setting them again replaces them; ``destroy`` removes them.
    """
    try:
        _check(["nft", "-f", "-"], _egress_script(net.host_if, allow=egress) + policy_script(net.host_if, policy))
    except NetworkError as exc:
        if not host_firewall_present():
            raise NetworkError(f"the host firewall (table {_TABLE}) is missing: call ensure_host_firewall()") from exc
        raise


def destroy(net: SandboxNetwork, *, keep_rules: bool = False) -> None:
    """Remove the veth pair, the netns name and the egress membership; missing pieces are fine.

    ``keep_rules``: the host firewall's entries stay (``apply_rules``), for a sandbox unplugged
    only while its processes are written to disk, whose next plug sets them again.
    """
    _run(["ip", "-force", "-batch", "-"], f"link del dev {net.host_if}\nnetns del {net.netns}\n")
    if not keep_rules and shutil.which("nft") is not None:
        done = _run(["nft", "-f", "-"], _egress_script(net.host_if, allow=False) + policy_script(net.host_if, None))
        if done.returncode != 0 and host_firewall_present():
            raise NetworkError(f"removing {net.host_if} from the egress set failed: {done.stderr.strip()}")
    left = [name for name, present in exists(net).items() if present]
    if left:
        raise NetworkError(f"{net.netns}/{net.host_if}: {', '.join(left)} still present after destroy")


def exists(net: SandboxNetwork) -> dict[str, bool]:
    """Which of the network's named pieces exist (``netns``, ``host_if``), without running a command."""
    try:
        socket.if_nametoindex(net.host_if)
        host_if = True
    except OSError:
        host_if = False
    return {"netns": os.path.lexists(net.netns_path), "host_if": host_if}


def attached_to(net: SandboxNetwork, pid: int) -> bool:
    """Whether the network's name and veth exist and the name is process ``pid``'s namespace."""
    try:
        same = os.stat(net.netns_path).st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return False
    return same and all(exists(net).values())


def list_owned(prefix: str = NETNS_PREFIX) -> list[str]:
    """Names of the namespaces under /run/netns starting with ``prefix`` (for reconciliation)."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(name for name in names if name.startswith(prefix))


def firewall_script() -> str:
    """The ``nft -f`` transaction behind `ensure_host_firewall`.

    ``add`` leaves existing objects (the egress set's elements, the counters) as they are;
    the two filter chains are flushed and refilled in the same transaction, so re-running it
    replaces the rules atomically, with no moment without them.
    """
    sandbox = f'"{HOST_IF_PREFIX}*"'
    lines = [
        f"add table {_TABLE}",
        f"add chain {_TABLE} input {{ type filter hook input priority filter; policy accept; }}",
        f"add chain {_TABLE} forward {{ type filter hook forward priority filter; policy accept; }}",
        f"add set {_TABLE} {EGRESS_SET} {{ type ifname; }}",
        f"add map {_TABLE} {POLICY_MAP} {{ type ifname : verdict; }}",
        *(f"add counter {_TABLE} {name}" for name in COUNTERS),
        f"flush chain {_TABLE} input",
        f"flush chain {_TABLE} forward",
        f"add rule {_TABLE} input iifname {sandbox} ct state established,related accept",
        f'add rule {_TABLE} input iifname {sandbox} counter name "sandbox_to_host" drop',
        f'add rule {_TABLE} forward iifname {sandbox} oifname {sandbox} counter name "sandbox_to_sandbox" drop',
        f"add rule {_TABLE} forward oifname {sandbox} ct state established,related accept",
        f'add rule {_TABLE} forward oifname {sandbox} counter name "into_sandbox" drop',
        # A sandbox's own allow/deny lists (its chain, jumped to by interface) come first.
        f"add rule {_TABLE} forward iifname {sandbox} iifname vmap @{POLICY_MAP}",
        f'add rule {_TABLE} forward iifname {sandbox} iifname != @{EGRESS_SET} counter name "egress_denied" drop',
    ]
    return "\n".join(lines) + "\n"


def ensure_host_firewall() -> None:
    """Create or refresh ``table inet e2b_compat`` (idempotent, atomic)."""
    _check(["nft", "-f", "-"], firewall_script())


def remove_host_firewall() -> None:
    """Delete the table, and with it the egress set and any NAT from `enable_host_forwarding`."""
    _check(["nft", "-f", "-"], f"add table {_TABLE}\ndelete table {_TABLE}\n")


def host_firewall_present() -> bool:
    if shutil.which("nft") is None:
        return False
    return _run(["nft", "list", "table", *_TABLE.split()]).returncode == 0


def firewall_counters() -> dict[str, int]:
    """Packets dropped so far, per reason (the names in ``COUNTERS``)."""
    document: Any = json.loads(_check(["nft", "-j", "list", "counters", "table", *_TABLE.split()]))
    counts: dict[str, int] = {}
    for item in document.get("nftables", []):
        counter = item.get("counter")
        if isinstance(counter, dict) and counter.get("table") == FIREWALL_TABLE:
            counts[str(counter["name"])] = int(counter["packets"])
    return counts


def forwarding_script(pool: ipaddress.IPv4Network = DEFAULT_POOL) -> str:
    """The NAT half of `enable_host_forwarding`: masquerade the pool towards non-sandbox interfaces."""
    return (
        f"add table {_TABLE}\n"
        f"add chain {_TABLE} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
        f"flush chain {_TABLE} postrouting\n"
        f'add rule {_TABLE} postrouting ip saddr {pool} oifname != "{HOST_IF_PREFIX}*" masquerade\n'
    )


def enable_host_forwarding(pool: ipaddress.IPv4Network = DEFAULT_POOL) -> None:
    """Operator setting, never called by the runtime on its own: let ``egress=True`` sandboxes out.

    Installs the isolation rules first (forwarding without them would connect sandboxes to
    each other), masquerades the pool, then sets the host-wide ``net.ipv4.ip_forward=1``, which
    stays set after `remove_host_firewall`. Other firewalls on the host (a ``FORWARD`` chain
    with policy drop, as Docker installs) may still need to allow the ``e2bh*`` interfaces.
    """
    ensure_host_firewall()
    _check(["nft", "-f", "-"], forwarding_script(pool))
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
