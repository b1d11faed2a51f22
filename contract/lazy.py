"""PEP 562 lazy exports for the packages' curated ``__init__`` modules.

A package keeps its public names in ``__all__`` and, for the ones that live in heavier
private modules, a table ``name -> module``; ``lazy_getattr`` turns that table into the
package's module-level ``__getattr__``. The module is imported on the first use of one of
its names, and the value is stored in the package's namespace, so the hook runs once per
name. This module is public and imports nothing of the project's, so a package may use it
without loading anything it would rather keep lazy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, exports: Mapping[str, str], namespace: MutableMapping[str, Any]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``exports`` maps a name to the submodule (``"_app"``) holding it."""

    def module_getattr(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    return module_getattr
