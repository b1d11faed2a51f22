"""Stand-ins for collected pytest items, for the tests of what the live conftest does to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["CallSpec", "Item"]


@dataclass
class CallSpec:
    params: dict[str, Any]


@dataclass
class Item:
    callspec: CallSpec
    markers: list[pytest.MarkDecorator] = field(default_factory=list)

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker)
