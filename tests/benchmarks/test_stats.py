"""The timings' figures every benchmark reports."""

from __future__ import annotations

import pytest

from benchmarks._stats import quantiles_ms


def test_p50_p90_and_the_slowest_in_milliseconds() -> None:
    figures = quantiles_ms([0.7, 0.5, 0.6])
    assert figures == {
        "p50_ms": pytest.approx(600.0),
        "p90_ms": pytest.approx(680.0),  # inclusive: between the two slowest, never past the slowest
        "max_ms": pytest.approx(700.0),
        "n": 3,
    }


def test_one_sample_is_every_figure() -> None:
    assert quantiles_ms([0.25]) == {"p50_ms": 250.0, "p90_ms": 250.0, "max_ms": 250.0, "n": 1}


def test_a_slow_tail_shows_in_the_p90_not_the_p50() -> None:
    figures = quantiles_ms([0.001] * 18 + [0.010, 0.010])
    assert figures["p50_ms"] == pytest.approx(1.0)
    assert figures["p90_ms"] == pytest.approx(1.9)  # 10% of the way from the 18th to the 19th
    assert figures["max_ms"] == pytest.approx(10.0)
