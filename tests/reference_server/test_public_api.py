"""``reference_server`` exposes a curated surface; everything in ``__all__`` exists and nothing private leaks."""

from __future__ import annotations

import importlib


def test_all_is_sorted_complete_and_importable() -> None:
    package = importlib.import_module("reference_server")

    # Constants, then classes, then functions, each alphabetical (the order ruff's RUF022 keeps).
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert package.__all__ == sorted(package.__all__, key=kind)
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    public = {n for n in vars(package) if not n.startswith("_") and not isinstance(getattr(package, n), type(package))}
    assert public - {"annotations"} <= set(package.__all__)
