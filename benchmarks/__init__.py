"""Benchmarks (``nox -s bench``): measured against a floor taken in the same run, never asserted."""
