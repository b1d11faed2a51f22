"""SIGKILL of the server at seeded random points of a burst of creates and kills: nothing lost, no orphan.

Each of 5 rounds (``Counts.crash_rounds`` of the backend) runs creates (4 in flight) and kills
of earlier sandboxes at once, SIGKILLs the server's process group after a random delay, and
starts it again on the same data folder. Then: every sandbox whose create was answered 201 is
listed unless a kill of it was asked; none whose kill was answered 204 is listed; the backend's
records, the runtime's containers and processes, the network namespaces, the cgroups and the
mounts hold exactly the listed sandboxes (a create the crash cut off leaves nothing, not even
files set aside as failed); each listed running one answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from runtime.backends import BackendOptions, open_backend

from ._harness import Api, host_is_fine, host_state, leftovers, requests_made
from .conftest import counts, report, running_server

pytestmark = [pytest.mark.artifacts]

SEED = 20261201
IN_FLIGHT = 4


def test_sigkill_at_random_points_loses_nothing(backend: str) -> None:
    began, requests_before = time.monotonic(), requests_made()
    rng = random.Random(SEED)
    rounds, per_round = counts(backend).crash_rounds, counts(backend).creates_per_round
    answered: set[str] = set()  # creates answered 201
    kill_asked: set[str] = set()
    kill_done: set[str] = set()  # kills answered 204
    interrupted = 0
    lock = threading.Lock()
    with running_server("crashes", backend) as server, Api(server) as api:
        before = host_state(server)
        options = BackendOptions(state_dir=server.data_dir / "runtime")

        def create() -> None:
            nonlocal interrupted
            try:
                response = api.create(timeout=900)
            except httpx.HTTPError:
                with lock:
                    interrupted += 1
                return
            if response.status_code == 201:
                with lock:
                    answered.add(response.json()["sandboxID"])

        def kill(sandbox_id: str) -> None:
            nonlocal interrupted
            with lock:
                kill_asked.add(sandbox_id)
            try:
                if api.kill(sandbox_id) == 204:
                    with lock:
                        kill_done.add(sandbox_id)
            except httpx.HTTPError:
                with lock:
                    interrupted += 1

        delays = []
        for _ in range(rounds):
            with lock:
                victims = sorted(answered - kill_asked)
            victims = rng.sample(victims, k=len(victims) // 2)
            delay = rng.uniform(0.5, 6.0)
            delays.append(round(delay, 2))
            pool = ThreadPoolExecutor(IN_FLIGHT)
            # Kills interleaved with the creates, so that the crash finds both under way.
            work: list[Callable[[], None]] = [create for _ in range(per_round)]
            for index, victim in enumerate(victims):
                work.insert(2 * index, functools.partial(kill, victim))
            burst = [pool.submit(task) for task in work]
            time.sleep(delay)
            server.stop(signal.SIGKILL)
            for future in burst:
                with contextlib.suppress(Exception):
                    future.result(120)
            pool.shutdown()
            server.start()
            states = api.states()
            lost = answered - kill_asked - set(states)
            assert not lost, f"answered creates lost after a SIGKILL: {sorted(lost)}"
            undead = kill_done & set(states)
            assert not undead, f"sandboxes whose kill was answered are listed again: {sorted(undead)}"
            runtime = {info.sandbox_id for info in asyncio.run(open_backend(backend, options).list())}
            assert runtime == set(states), (
                f"backend records {sorted(runtime - set(states))} unknown to the store; "
                f"store records {sorted(set(states) - runtime)} without a sandbox"
            )
            failed = set(host_state(server).quarantined)
            assert not failed & answered, f"answered sandboxes set aside as failed after a SIGKILL: {failed & answered}"
            left = leftovers(before, server, states)
            assert not left, f"orphans after a SIGKILL: {left[:10]}"
            for sandbox_id, state in states.items():
                if state == "running":
                    envd = api.envd({"sandboxID": sandbox_id})
                    assert envd.health() == 204, f"{sandbox_id} is listed running but does not answer"
            with lock:
                kill_asked -= set(states)  # a kill that did not happen before the crash may be asked again
        host_is_fine(server.data_dir)
        survivors = api.states()
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            codes = list(pool.map(api.kill, survivors))
        assert set(codes) <= {204}, codes
        assert not leftovers(before, server, ())
    report(
        "sigkill",
        backend,
        seed=SEED,
        faults_injected=rounds,
        kill_delays_s=delays,
        creates_answered=len(answered),
        kills_answered=len(kill_done),
        requests_cut_by_the_crash=interrupted,
        survivors_checked=len(survivors),
        requests=requests_made() - requests_before,
        orphans=0,
        lost=0,
        seconds=round(time.monotonic() - began, 1),
    )
