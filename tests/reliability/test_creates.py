"""A burst of concurrent creates from two owners: every sandbox is itself, alone on its address.

64 creates (``Counts.creates`` of the backend), 16 in flight, alternating between two owners'
keys, each with an environment variable and metadata value of its own. Every sandbox then says,
from inside, its hostname, the variable its ``/init`` delivered, its ``E2B_SANDBOX_ID`` and its
IPv4 addresses: each must be its own, no address may be another's, and each must lie in the /30
the host registry leased to it. Each owner lists only its own sandboxes. After the kills nothing
of the burst is left on the host.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from conformance._endpoint import ManagedServer

from ._harness import IDENTITY, Api, addresses_of, host_is_fine, host_state, leftovers, requests_made
from .conftest import counts, report

pytestmark = [pytest.mark.artifacts]


def test_concurrent_creates_from_two_owners(shared_server: ManagedServer, closing: Callable[[Api], Api]) -> None:
    began, requests_before = time.monotonic(), requests_made()
    burst, in_flight = counts(shared_server.backend).creates, counts(shared_server.backend).creates_in_flight
    second_key = shared_server.issue_key("reliability-b")
    owners = {"A": closing(Api(shared_server)), "B": closing(Api(shared_server, second_key))}
    before = host_state(shared_server)
    results: list[dict[str, Any]] = []

    def create(n: int) -> dict[str, Any]:
        owner = "AB"[n % 2]
        marker = uuid.uuid4().hex
        response = owners[owner].create(envVars={"E2B_RELIABILITY_MARKER": marker}, metadata={"marker": marker})
        body = response.json() if response.status_code == 201 else {}
        return {"owner": owner, "marker": marker, "status": response.status_code, "body": body, "text": response.text}

    def identify(made: dict[str, Any]) -> str:
        return owners[made["owner"]].envd(made["body"]).run(IDENTITY, timeout=60).stdout

    try:
        with ThreadPoolExecutor(in_flight) as pool:
            results = list(pool.map(create, range(burst)))
            created_s = time.monotonic() - began
            made = [r for r in results if r["status"] == 201]
            refused = [f"{r['status']}: {r['text'][:200]}" for r in results if r["status"] != 201]
            assert not refused, f"{len(refused)} of {burst} creates refused: {refused[:5]}"
            held = {o: set(api.states()) for o, api in owners.items()}
            seen = list(pool.map(identify, made))
        registry = addresses_of(shared_server.data_dir)
        ids = [r["body"]["sandboxID"] for r in made]
        assert len(set(ids)) == burst, "two creates answered with the same sandbox id"
        by_marker = {r["marker"]: r["body"]["sandboxID"] for r in made}
        problems: list[str] = []
        owner_of: dict[str, str] = {}
        for result, said in zip(made, seen, strict=True):
            me = result["body"]["sandboxID"]
            fields = said.strip().split("|")
            if len(fields) != 4:
                problems.append(f"{me}: said {said!r}")
                continue
            hostname, marker, env_id, addresses = fields
            if marker != result["marker"]:
                problems.append(f"{me}: its /init delivered the variable of {by_marker.get(marker, repr(marker))}")
            if (hostname, env_id) != (me, me):
                problems.append(f"{me}: hostname {hostname!r}, E2B_SANDBOX_ID {env_id!r}")
            mine = [a for a in addresses.split(",") if a]
            if len(mine) != 1:
                problems.append(f"{me}: addresses {mine}")
                continue
            if mine[0] in owner_of:
                problems.append(f"{me}: address {mine[0]} is also that of {owner_of[mine[0]]}")
            owner_of[mine[0]] = me
            subnet = registry.get(me, "")
            if not subnet or not _inside(mine[0], subnet):
                problems.append(f"{me}: address {mine[0]} is outside its leased subnet {subnet!r}")
        for owner in owners:
            own = {r["body"]["sandboxID"] for r in made if r["owner"] == owner}
            if held[owner] != own:
                problems.append(f"owner {owner} lists {len(held[owner])} sandboxes, made {len(own)}")
        assert not problems, f"{len(problems)} problems: " + "; ".join(problems[:10])
        host_is_fine(shared_server.data_dir)
    finally:
        with ThreadPoolExecutor(in_flight) as pool:
            kills = list(
                pool.map(lambda r: owners[r["owner"]].kill(r["body"]["sandboxID"]), [r for r in results if r["body"]])
            )
    assert all(code == 204 for code in kills), f"kill answers: {sorted(set(kills))}"
    still = set(owners["A"].states()) | set(owners["B"].states())
    left = leftovers(before, shared_server, still)
    assert not left, f"left on the host after the kills: {left[:10]}"
    report(
        "concurrent-creates",
        shared_server.backend,
        sandboxes_created=len(made),
        sandboxes_held_at_once=sum(len(h) for h in held.values()),
        owners=2,
        in_flight=in_flight,
        distinct_addresses=len(owner_of),
        create_burst_seconds=round(created_s, 1),
        requests=requests_made() - requests_before,
        misrouted=0,
        leftovers=0,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )


def _inside(address: str, subnet: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(address) in ipaddress.ip_network(subnet)
