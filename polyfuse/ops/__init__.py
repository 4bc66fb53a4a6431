"""The operator catalog of OPERATORS.md: plain programs, NumPy references, sizes.

Each operator is an :class:`Operator` registered under its OPERATORS.md name.
``get(name)`` returns it; ``names()`` lists them in catalog order.  Operator
modules register themselves on import (see ``_MODULES``).
"""

from __future__ import annotations

import importlib
import sys

from polyfuse.ops.base import Comparison, Operator, compare

_MODULES = ("softmax", "attention", "norms", "cascades")
_REGISTRY: dict[str, Operator] = {}
_MODULE_OF: dict[str, str] = {}
_loaded = False


def register(op: Operator) -> Operator:
    """Add an operator to the catalog (names are unique)."""
    if op.name in _REGISTRY:
        raise ValueError(f"operator {op.name!r} registered twice")
    _REGISTRY[op.name] = op
    _MODULE_OF[op.name] = sys._getframe(1).f_globals.get("__name__", "")
    return op


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _MODULES:
            try:
                importlib.import_module(f"polyfuse.ops.{mod}")
            except ModuleNotFoundError as err:
                if err.name != f"polyfuse.ops.{mod}":
                    raise


def names() -> list[str]:
    """Operator names in catalog order: by module (``_MODULES``), then registration order."""
    _load()
    position = {f"polyfuse.ops.{m}": k for k, m in enumerate(_MODULES)}
    order = {name: k for k, name in enumerate(_REGISTRY)}
    return sorted(_REGISTRY, key=lambda n: (position.get(_MODULE_OF[n], len(position)), order[n]))


def get(name: str) -> Operator:
    """The operator called ``name`` (PolyfuseError listing the known names otherwise)."""
    from polyfuse.errors import PolyfuseError

    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PolyfuseError(f"no operator {name!r} in the catalog; known: {', '.join(_REGISTRY)}") from None


__all__ = ["Comparison", "Operator", "compare", "get", "names", "register"]
