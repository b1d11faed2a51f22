"""``python -m runtime.interpreter``: serve the Code Interpreter API (``--help`` for options)."""

from __future__ import annotations

from ._server import main

if __name__ == "__main__":
    main()
