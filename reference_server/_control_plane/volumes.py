"""Volume operations: the place prepared for them, with no routes yet.

Volumes are declared unsupported (``conformance/features.json``): ``POST /volumes`` and the other
volume routes answer 404 like any unknown route, and a create body with ``volumeMounts`` is
refused with 400 "Volume mount is unavailable" (``sandboxes``). ``docs/CONTRIBUTING.md`` ("Add a
control-plane resource") says how to fill this module: handlers here, their decisions in a
service, their records in the store, rows in ``ENDPOINTS``.
"""

from __future__ import annotations

from ._common import Endpoint

__all__ = ["ENDPOINTS"]

ENDPOINTS: tuple[Endpoint, ...] = ()
