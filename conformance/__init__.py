"""Conformance harness: official clients, scenario, property and wire suites, signed reports.

Depends on ``contract`` (the inventory says what must be covered) and drives any
E2B-compatible endpoint. See docs/ARCHITECTURE.md and docs/REPORT.md.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:
    from ._cases import CASES, Case
    from ._clients import ensure_node_clients, ensure_python_clients
    from ._endpoint import ExternalEndpoint, ManagedServer
    from ._model import CaseResult, ClientInfo, Outcome, RunInfo, Target
    from ._run import RunOptions, main_run
    from ._signing import verify

# Loaded on first use (PEP 562): the scenario and client modules must not pull in the report stack.
_LAZY = {
    "CASES": "_cases",
    "Case": "_cases",
    "ensure_node_clients": "_clients",
    "ensure_python_clients": "_clients",
    "ExternalEndpoint": "_endpoint",
    "ManagedServer": "_endpoint",
    "CaseResult": "_model",
    "ClientInfo": "_model",
    "Outcome": "_model",
    "RunInfo": "_model",
    "Target": "_model",
    "RunOptions": "_run",
    "main_run": "_run",
    "verify": "_signing",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CASES",
    "Case",
    "CaseResult",
    "ClientInfo",
    "ExternalEndpoint",
    "ManagedServer",
    "Outcome",
    "RunInfo",
    "RunOptions",
    "Target",
    "ensure_node_clients",
    "ensure_python_clients",
    "main_run",
    "verify",
]
