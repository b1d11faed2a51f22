"""The one place that says which envd version this agent implements.

The clients gate features on the advertised version (docs/PROTOCOL-NOTES.md, Control plane): ≥0.1.4 recursive
watch, ≥0.3.0 stdin, ≥0.4.0 default user, ≥0.5.2 close-stdin, ≥0.5.7 octet-stream and gzip
uploads, ≥0.6.2 file metadata, ≥0.6.3 watch events with entry info, ≥0.6.4 watches on
network mounts. The agent implements all of them, and nothing newer is gated, so it
advertises 0.6.4. Internal orchestrator routes of later versions (``/files/compose``,
``/freeze`` …) and NFS volume mounts in ``/init`` are not implemented.
"""

from __future__ import annotations

ENVD_VERSION = "0.6.4"
