"""Gathers: reads whose index on some dimension is a load of an integer input (``x[i, target[i]]``).

The polyhedral model cannot see such an index, so a gather is modelled as a *may* read of the whole
dimension it indexes (:mod:`polyfuse.deps.access`), which keeps every dependence it could carry, and
its value is checked against the dimension's extent when the program runs: by the interpreters, and by
the generated code of every backend (:func:`gather_error` is the one message they all raise).
"""

from __future__ import annotations

from polyfuse.errors import GatherOutOfBounds, NonAffineIndex
from polyfuse.ir.affine import check_affine
from polyfuse.ir.expr import Expr, Load


def is_gather_index(e: Expr) -> bool:
    """``e`` is a *gather index*: a load of an integer input tensor (``target[i]`` in ``x[i, target[i]]``).

    The polyhedral model cannot see its value, so the dependence analysis reads the whole dimension it
    indexes (a may-access) and the backends check it in bounds when the program runs.  The index tensor
    is an input, so its values are fixed while the program runs and the index is a function of the
    instance; its own indices are affine (no gather of a gather).
    """
    return isinstance(e, Load) and e.dtype.is_int and e.tensor.role == "input"


def check_gather_index(e: Expr, *, allowed: set[str], what: str) -> None:
    """Raise NonAffineIndex naming ``what`` unless ``e`` is affine or a gather index with affine indices."""
    if not isinstance(e, Load):
        check_affine(e, allowed=allowed, what=what)
        return
    if not is_gather_index(e):
        role = "an input" if e.tensor.role == "input" else f"a {e.tensor.role}"
        raise NonAffineIndex(
            f"{what}: {e} is a load of {role} tensor {e.tensor.name!r} of dtype {e.dtype}; a data-dependent "
            "index (a gather) must be a load of an integer (i32 or i64) input tensor, e.g. x[i, target[i]]")
    for d, inner in enumerate(e.indices):
        check_affine(inner, allowed=allowed, what=f"{what}: index {d} of the gather index {e}")


def gather_error(block: str, access: str, tensor: str, dim: int, index: str, value: int,
                 extent: int) -> GatherOutOfBounds:
    """The error of a gather whose index read ``value`` outside ``0 <= value < extent``."""
    return GatherOutOfBounds(
        f"block {block!r} gathers {access} out of bounds: index {dim} of tensor {tensor!r} is {index}, which "
        f"read {value}, but dimension {dim} has size {extent}; every value a gather reads from the index "
        f"tensor must lie in 0 <= {index} < {extent} (fix the values of the index tensor before the call)")


__all__ = ["check_gather_index", "gather_error", "is_gather_index"]
