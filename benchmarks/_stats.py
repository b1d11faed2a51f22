"""The figures every benchmark gives of a list of timings: p50, p90 and the slowest, in ms."""

from __future__ import annotations

import statistics

__all__ = ["quantiles_ms"]


def quantiles_ms(samples: list[float]) -> dict[str, float]:
    """``p50_ms``, ``p90_ms``, ``max_ms`` and ``n`` of ``samples`` (seconds, at least one)."""
    ordered = sorted(samples)
    # Inclusive: with few samples (three transfers) the p90 lies between the two slowest, never past them.
    p90 = statistics.quantiles(ordered, n=10, method="inclusive")[8] if len(ordered) > 1 else ordered[0]
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p90_ms": p90 * 1000,
        "max_ms": ordered[-1] * 1000,
        "n": len(ordered),
    }
