"""Typed access to the committed operation inventory (what later parts consume)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

INVENTORY_PATH = Path(__file__).parent / "derived" / "inventory.json"


@dataclass(frozen=True)
class Operation:
    """One public operation of the E2B protocol, as the pinned clients use it."""

    id: str
    surface: str  # control-plane, envd-http, envd-rpc, volume-content, interpreter
    transport: str  # http or connect
    streaming: str  # unary, server-stream, client-stream, ndjson-stream
    path: str
    method: str | None
    procedure: str | None
    python_entry_points: tuple[str, ...]
    js_entry_points: tuple[str, ...]
    called_by_sdk: bool
    source: str


def load_inventory(path: Path = INVENTORY_PATH) -> list[Operation]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [
        Operation(
            id=raw["id"],
            surface=raw["surface"],
            transport=raw["transport"],
            streaming=raw["streaming"],
            path=raw["path"],
            method=raw.get("method"),
            procedure=raw.get("procedure"),
            python_entry_points=tuple(raw["entry_points"]["python"]),
            js_entry_points=tuple(raw["entry_points"]["js"]),
            called_by_sdk=raw["called_by_sdk"],
            source=raw["source"],
        )
        for raw in data["operations"]
    ]
