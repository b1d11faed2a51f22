"""``python -m`` entry point of the gateway (the template's ``mcp-gateway`` command runs this)."""

import sys

from ._cli import main

sys.exit(main())
