"""``contract.lazy``: a package's names load their module on first use, once, and unknown names fail."""

from __future__ import annotations

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
