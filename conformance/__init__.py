"""Conformance harness: official clients, property-based and wire suites, signed reports.

Depends on ``contract`` (the inventory says what must be covered) and drives any
E2B-compatible endpoint. See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

__all__: list[str] = []
