"""``benchmarks.backends``: the per-backend summary, its ratios to the floors and the side-by-side table."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import backends
from runtime.backends import backend_entry

FLOORS = {
    "floor_process_spawn": 1.0,
    "floor_http_round_trip": 0.2,
    "floor_http_upload": 50.0,
    "floor_http_download": 100.0,
    "floor_idle_process": 0.5,
}


def _raw(command_s: float, pause_error: str | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "floor_process_spawn": [0.001, 0.001, 0.003],
        "floor_http_round_trip": [0.0002, 0.0002, 0.0004],
        "create_to_first_run": [0.5, 0.6, 0.7],
        "warm_commands_run_true": [command_s] * 3,
        "upload": [0.5, 0.25, 1.0],
        "download": [0.2, 0.2, 0.2],
        "floor_http_upload": [0.05] * 3,
        "floor_http_download": [0.1] * 3,
        "pause_resume": [0.1, 0.2, 0.3],
        "idle_memory": {
            "before": 1000 << 20,
            "after": 960 << 20,
            "count": 4,
            "backend_bytes": [8 << 20, 9 << 20, 30 << 20],
        },
    }
    if pause_error is not None:
        del raw["pause_resume"]
        raw["pause_error"] = pause_error
    return raw


def test_a_summary_has_p50s_idle_memory_per_sandbox_and_ratios_to_its_floors() -> None:
    results = backends.summarise(_raw(0.004))
    assert results["create_to_first_run"] == {
        "p50_ms": pytest.approx(600.0),
        "p90_ms": pytest.approx(680.0),  # inclusive: 80% of the way from the second to the slowest
        "max_ms": pytest.approx(700.0),
        "n": 3,
    }
    assert results["idle_memory_host_drop"] == {"mib": pytest.approx(10.0), "n": 4}
    assert results["idle_memory_per_sandbox"] == {"mib": pytest.approx(9.0), "n": 3}, "the median of the figures"
    floors = FLOORS
    assert backends.ratios(results, floors) == {
        "create_to_first_run": pytest.approx(600.0),
        "warm_commands_run_true": pytest.approx(20.0),
        "upload": pytest.approx(10.0),
        "download": pytest.approx(2.0),
        "pause_resume": pytest.approx(1000.0),
        "idle_memory_per_sandbox": pytest.approx(18.0),
        "idle_memory_host_drop": pytest.approx(20.0),
    }


def test_a_backend_without_a_memory_figure_says_why() -> None:
    raw = _raw(0.004)
    del raw["idle_memory"]["backend_bytes"]
    raw["idle_memory"]["backend_error"] = "BackendError: no metrics"
    assert backends.summarise(raw)["idle_memory_per_sandbox"] == {"error": "BackendError: no metrics"}


def test_a_paused_sandbox_is_shown_beside_itself_running() -> None:
    raw = _raw(0.004)
    raw["idle_memory"] |= {"running": 40 << 20, "paused": 0}
    results = backends.summarise(raw)
    assert results["paused_memory"] == {"mib": 0.0, "running_mib": pytest.approx(40.0)}
    report = {
        "started_at": "now",
        "counts": {"transfer_mib": 100},
        "floors": FLOORS,
        "backends": {"crun": {"results": results, "ratios": backends.ratios(results, FLOORS), "floors": FLOORS}},
    }
    (row,) = [line for line in backends.table(report).splitlines() if line.startswith("| memory of a memory-paused")]
    assert "0.0 MiB" in row
    assert "running 40.0 MiB" in row
    raw["idle_memory"] = {"paused_error": "BackendError: gone"}
    assert backends.summarise(raw)["paused_memory"] == {"error": "BackendError: gone"}


def test_the_table_puts_backends_side_by_side_with_refusals_and_failures_shown() -> None:
    floors = FLOORS
    crun = backends.summarise(_raw(0.004))
    gvisor = backends.summarise(_raw(0.008, pause_error="SandboxException: 501: not implemented"))
    report = {
        "started_at": "2026-12-01T19:00:00Z",
        "counts": {"sandboxes": 3, "transfer_mib": 100},
        "backends": {
            "crun": {"results": crun, "floors": floors, "ratios": backends.ratios(crun, floors)},
            "gvisor": {"results": gvisor, "floors": floors, "ratios": backends.ratios(gvisor, floors)},
            "docker": {"features": [], "error": "HostNotReadyError: no dockerd"},
        },
    }
    table = backends.table(report)
    assert "| metric | crun | gvisor | docker |" in table
    assert "| warm commands.run(true) | 4.0 ms (x20.0; p90 4.0) | 8.0 ms (x40.0; p90 8.0) | failed |" in table
    # 100 MiB in the p50 of 0.5 s: 209.7 MB/s, ten times the floor's 50 ms; its p90 time, 0.9 s, is
    # the lower rate, 116.5 MB/s. 0.2 s: 524.3 MB/s, twice the floor's 100 ms.
    assert "| upload (files.write) | 209.7 MB/s (x10.0; p90 116.5) | 209.7 MB/s (x10.0; p90 116.5) | failed |" in table
    assert "| download (files.read) | 524.3 MB/s (x2.0; p90 524.3) | 524.3 MB/s (x2.0; p90 524.3) | failed |" in table
    assert (
        "| pause → resume → command | 200.0 ms (x1000.0; p90 280.0) "
        "| n/a (SandboxException: 501: not implemented) | failed |" in table
    )
    assert "- docker: none; error: HostNotReadyError: no dockerd" in table


def test_the_memory_floor_is_an_idle_process_resident_size() -> None:
    floor = backends.idle_process_floor(2)
    assert 0.1 < floor < 20, "a sleep process holds some hundreds of KiB to a few MiB"


def test_the_ratios_of_a_run_are_against_one_set_of_floors(monkeypatch: pytest.MonkeyPatch) -> None:
    commands = {"crun": 0.004, "gvisor": 0.008, "docker": 0.006}
    spawn = {"crun": [0.001], "gvisor": [0.002], "docker": [0.003]}

    boot_images_seen: list[bool] = []

    def bench(name: str, counts: object, budget: float, *, boot_images: bool = True) -> dict[str, Any]:
        boot_images_seen.append(boot_images)
        raw = _raw(commands[name])
        raw["floor_process_spawn"] = spawn[name]
        return backends.summarise(raw)

    monkeypatch.setattr(backends, "bench_backend", bench)
    monkeypatch.setattr(backends, "idle_process_floor", lambda count: 1.0)
    fake = backend_entry("fake")
    monkeypatch.setattr(backends, "backend_entry", lambda name: fake)  # whatever the real table holds
    report = backends.run(("crun", "gvisor", "docker"), (1, 1, 1, 1, 1, 1), 60.0, boot_images=False)
    assert boot_images_seen == [False, False, False], "each server run with the setting asked for"
    assert report["boot_images"] is False
    assert "boot images off" in backends.table(report)
    assert report["floors"]["floor_process_spawn"] == pytest.approx(2.0), "the median of the three runs' floors"
    assert report["backends"]["crun"]["floors"]["floor_process_spawn"] == pytest.approx(1.0), "each kept as measured"
    ratios = {name: entry["ratios"]["create_to_first_run"] for name, entry in report["backends"].items()}
    assert ratios == {"crun": pytest.approx(300.0), "gvisor": pytest.approx(300.0), "docker": pytest.approx(300.0)}


def test_the_table_notes_what_merging_held_and_cost_and_the_density_it_gives() -> None:
    raw = _raw(0.004)
    raw["idle_memory"]["ksm"] = {"pages_sharing": 2560.0, "settle_s": 12.0, "ksmd_cpu_percent": 3.25}
    merged = backends.summarise(raw)
    assert merged["same_page_merging"]["pages_sharing"] == 2560.0
    plain = backends.summarise(_raw(0.004))
    assert "same_page_merging" not in plain
    report = {
        "started_at": "2026-12-06T05:00:00Z",
        "counts": {"sandboxes": 3, "transfer_mib": 100},
        "backends": {
            "crun": {"results": merged, "floors": FLOORS, "ratios": backends.ratios(merged, FLOORS)},
            "docker": {"results": plain, "floors": FLOORS, "ratios": backends.ratios(plain, FLOORS)},
        },
    }
    text = backends.table(report)
    # 2560 pages of 4 KiB; a 10 MiB drop per sandbox: 24 GiB / 10 MiB = 2457 sandboxes.
    assert "- crun: ksmd shared 10 MiB of pages, settled in 12 s, then used 3.2% of a core" in text
    assert "at that, 2457 idle sandboxes in 24 GiB" in text
    assert "- docker: no same-page merging; at that, 2457 idle sandboxes in 24 GiB" in text


def test_a_refused_snapshot_is_shown_with_its_error_and_taken_ones_get_ratios() -> None:
    raw = _raw(0.004)
    raw |= {"snapshot": [0.3, 0.4, 0.5], "snapshot_create_to_first_run": [0.2, 0.3, 0.4]}
    results = backends.summarise(raw)
    assert results["snapshot_create_to_first_run"]["p50_ms"] == pytest.approx(300.0)
    assert backends.ratios(results, FLOORS)["snapshot"] == pytest.approx(400.0 / 0.2)
    refused = _raw(0.004) | {"snapshot_error": "SandboxException: 501: not implemented"}
    assert backends.summarise(refused)["snapshot"] == {"error": "SandboxException: 501: not implemented"}
