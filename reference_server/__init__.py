"""Reference server: control plane, data-plane edge and proxy, store, credentials, TLS.

Depends on ``contract`` and on ``runtime`` through its backend interface only.
See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

__all__: list[str] = []
