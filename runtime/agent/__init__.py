"""The in-sandbox agent: our implementation of envd."""

from __future__ import annotations
