"""Two servers on one host (own data folders and ports) creating at the same time share no address.

The shared server and a second one each make 16 sandboxes (``Counts.per_server``) at once, 8 in flight each; every
sandbox reads its own id and address from inside, no address is another's (across both
servers), and after the kills neither server left anything on the host.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from conformance._endpoint import ManagedServer

from ._harness import IDENTITY, Api, host_state, leftovers, requests_made
from .conftest import counts, report, running_server

pytestmark = [pytest.mark.artifacts]

IN_FLIGHT = 8


def _burst(api: Api, out: dict[str, Any], go: threading.Barrier, per_server: int) -> None:
    def one(_: int) -> tuple[str, str, str]:
        marker = uuid.uuid4().hex
        sandbox = api.created(envVars={"E2B_RELIABILITY_MARKER": marker})
        said = api.envd(sandbox).run(IDENTITY, timeout=60).stdout
        return sandbox["sandboxID"], marker, said

    go.wait()
    try:
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            out["made"] = list(pool.map(one, range(per_server)))
    except (AssertionError, OSError, httpx.HTTPError) as exc:  # reported by the test, beside the other server's
        out["error"] = repr(exc)


def test_two_servers_on_one_host_share_no_address(shared_server: ManagedServer, closing: Callable[[Api], Api]) -> None:
    began, requests_before = time.monotonic(), requests_made()
    per_server = counts(shared_server.backend).per_server
    with running_server("second", shared_server.backend) as other:
        apis = {"shared": closing(Api(shared_server)), "second": closing(Api(other))}
        befores = {name: host_state(api.server) for name, api in apis.items()}
        results: dict[str, dict[str, Any]] = {name: {} for name in apis}
        go = threading.Barrier(len(apis))
        threads = [threading.Thread(target=_burst, args=(apis[n], results[n], go, per_server)) for n in apis]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(600)
            errors = {name: r["error"] for name, r in results.items() if "error" in r}
            assert not errors, f"a burst failed: {errors}"
            seen_at: dict[str, str] = {}
            problems = []
            for name, result in results.items():
                for sandbox_id, marker, said in result["made"]:
                    fields = said.strip().split("|")
                    if len(fields) != 4 or fields[1:3] != [marker, sandbox_id]:
                        problems.append(f"{name}/{sandbox_id} said {said!r}")
                        continue
                    for address in filter(None, fields[3].split(",")):
                        if address in seen_at:
                            problems.append(f"{name}/{sandbox_id} has {address}, as {seen_at[address]} has")
                        seen_at[address] = f"{name}/{sandbox_id}"
            assert not problems, "; ".join(problems[:10])
        finally:
            for name, result in results.items():
                for sandbox_id, _, _ in result.get("made", []):
                    apis[name].kill(sandbox_id)
        for name, api in apis.items():
            left = leftovers(befores[name], api.server, api.states())
            assert not left, f"server {name} left: {left[:10]}"
    report(
        "two-servers",
        shared_server.backend,
        servers=2,
        sandboxes_created=2 * per_server,
        distinct_addresses=len(seen_at),
        requests=requests_made() - requests_before,
        leftovers=0,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )
