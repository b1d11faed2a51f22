"""``contract.lazy``: a package's names load their module on first use, once, and unknown names fail.

Every package front built on it keeps the one rule of docs/ARCHITECTURE.md ("Public surfaces"):
a curated ``__all__``, sorted as ruff's RUF022 keeps it, whose names all resolve, and no public
name outside it.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from contract.lazy import lazy_getattr


def test_a_name_loads_its_module_once_and_unknown_names_fail() -> None:
    namespace: dict[str, object] = {}
    getattr_ = lazy_getattr("contract", {"load_lock": "_lock"}, namespace)
    value = getattr_("load_lock")
    assert value is sys.modules["contract._lock"].load_lock
    assert namespace == {"load_lock": value}  # stored: the hook is not asked again
    with pytest.raises(AttributeError, match="module 'contract' has no attribute 'nothing'"):
        getattr_("nothing")


def test_every_lazy_package_resolves_its_whole_surface() -> None:
    import conformance
    import contract
    import reference_server
    import runtime
    import runtime.agent
    import runtime.interpreter

    packages: list[types.ModuleType] = [
        contract,
        conformance,
        reference_server,
        runtime,
        runtime.agent,
        runtime.interpreter,
    ]
    for package in packages:
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"


@pytest.mark.parametrize("name", ["conformance", "reference_server", "runtime.agent"])
def test_all_is_sorted_complete_and_importable(name: str) -> None:
    package = importlib.import_module(name)

    # Constants, then classes, then functions, each alphabetical (the order ruff's RUF022 keeps).
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert package.__all__ == sorted(package.__all__, key=kind)
    for exported in package.__all__:
        assert getattr(package, exported) is not None, exported
    public = {n for n in vars(package) if not n.startswith("_") and not isinstance(getattr(package, n), type(package))}
    assert public - {"annotations"} <= set(package.__all__)
