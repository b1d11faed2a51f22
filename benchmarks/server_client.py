"""Runs inside the pinned Python client's environment against the reference server.

``python -I server_client.py <sandboxes> <pace seconds>`` creates that many sandboxes one after
another, each ``pace`` seconds after the last was killed, and times, for each,
``Sandbox.create()`` and the first ``commands.run("true")`` result (the client is configured
only by the server's four variables). Prints one JSON object of samples in seconds. Every
sandbox is killed before the next is made.
"""

from __future__ import annotations

import json
import sys
import time

from e2b import Sandbox


def main() -> None:
    count, pace = int(sys.argv[1]), float(sys.argv[2])
    create, first_run, total, kill = [], [], [], []
    for _ in range(count):
        time.sleep(pace)
        start = time.perf_counter()
        sbx = Sandbox.create()
        created = time.perf_counter()
        sbx.commands.run("true")
        ran = time.perf_counter()
        sbx.kill()
        killed = time.perf_counter()
        create.append(created - start)
        first_run.append(ran - created)
        total.append(ran - start)
        kill.append(killed - ran)
    print(json.dumps({"create": create, "first_run": first_run, "total": total, "kill": kill}))


if __name__ == "__main__":
    main()
