"""The interpreter server's bounds on what clients can make it hold.

Upstream bounds none of these (an unbounded output queue, any number of contexts, bodies of
any size); here each has a cap well above what the official clients send
(docs/PROTOCOL-NOTES.md, "Limits"). Refusals are plain-text bodies, like the server's other
errors; the clients put the status and text into their ``SandboxException``/``SandboxError``.

- ``MAX_CONTEXTS``: contexts at once, the default ones included. Each is a kernel process of
  tens of MiB: past the cap, ``POST /contexts`` (and a first run in a new language) is 429.
- ``MAX_REQUEST_BODY``: a request body (the code of a run, a context's settings): 413.
- ``MAX_PENDING_OUTPUT``: encoded output lines of one run that its client has not read yet.
  A kernel cannot be slowed down (its output channel drops what is not read), so past the cap
  further ``stdout``/``stderr``/``result`` lines are dropped, and once the client has caught up a
  ``stderr`` line says how many were lost. Errors and the end of the run are never dropped.
"""

from __future__ import annotations

from typing import Final

MAX_CONTEXTS: Final = 32
MAX_REQUEST_BODY: Final = 32 * 1024 * 1024
MAX_PENDING_OUTPUT: Final = 64 * 1024 * 1024
