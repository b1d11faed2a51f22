"""The ``e2b-compat`` command: one entry point for the contract, and later the server and harness."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
