"""Runtime: sandbox backends behind one interface, templates, and the in-sandbox agent (envd).

Depends on ``contract`` (the generated envd protobuf modules). See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

__all__: list[str] = []
