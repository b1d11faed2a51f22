"""Conformance harness: official clients, scenario, property and wire suites, signed reports.

Depends on ``contract`` (the inventory says what must be covered) and drives any
E2B-compatible endpoint. See docs/ARCHITECTURE.md and docs/REPORT.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from contract.lazy import lazy_getattr as _lazy_getattr

if _TYPE_CHECKING:
    from ._cases import CASES, Case
    from ._clients import available_node_versions, available_python_versions, ensure_node_clients, ensure_python_clients
    from ._endpoint import EndpointError, ExternalEndpoint, ManagedServer
    from ._matrix import MatrixError, load_report, write_matrix
    from ._model import CaseResult, ClientInfo, Outcome, RunInfo, Target
    from ._mutant_run import HEAVY_LOCK, MutantOptions, main_mutants
    from ._run import RunOptions, endpoint_from_environment, main_run
    from ._signing import SigningKeyError, load_or_create_signing_key, verify

# Loaded on first use (PEP 562): the scenario and client modules must not pull in the report stack.
_LAZY = {
    "CASES": "_cases",
    "Case": "_cases",
    "available_node_versions": "_clients",
    "available_python_versions": "_clients",
    "ensure_node_clients": "_clients",
    "ensure_python_clients": "_clients",
    "EndpointError": "_endpoint",
    "ExternalEndpoint": "_endpoint",
    "ManagedServer": "_endpoint",
    "CaseResult": "_model",
    "ClientInfo": "_model",
    "Outcome": "_model",
    "RunInfo": "_model",
    "Target": "_model",
    "MatrixError": "_matrix",
    "load_report": "_matrix",
    "write_matrix": "_matrix",
    "HEAVY_LOCK": "_mutant_run",
    "MutantOptions": "_mutant_run",
    "main_mutants": "_mutant_run",
    "RunOptions": "_run",
    "endpoint_from_environment": "_run",
    "main_run": "_run",
    "verify": "_signing",
    "SigningKeyError": "_signing",
    "load_or_create_signing_key": "_signing",
}


__getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "CASES",
    "HEAVY_LOCK",
    "Case",
    "CaseResult",
    "ClientInfo",
    "EndpointError",
    "ExternalEndpoint",
    "ManagedServer",
    "MatrixError",
    "MutantOptions",
    "Outcome",
    "RunInfo",
    "RunOptions",
    "SigningKeyError",
    "Target",
    "available_node_versions",
    "available_python_versions",
    "endpoint_from_environment",
    "ensure_node_clients",
    "ensure_python_clients",
    "load_or_create_signing_key",
    "load_report",
    "main_mutants",
    "main_run",
    "verify",
    "write_matrix",
]
