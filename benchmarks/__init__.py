"""Benchmarks (``nox -s bench``): measured against a floor taken in the same run, never asserted.

``agent`` (the envd agent through the pinned client), ``crun`` (the runtime), ``server`` (create →
first command through the reference server) and ``interpreter`` (create → first ``run_code`` and warm
``run_code`` round trips on ``code-interpreter-v1``, against ``base`` create → first command and warm
``commands.run`` on the same sandbox) and ``backends`` (every serving backend side by side: create →
first command, warm command, pause → resume, idle memory). The ``*_client.py`` scripts run inside the official clients'
own environments.
"""
