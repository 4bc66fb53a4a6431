"""Light algebraic simplification of integer index expressions.

Only rewrites that are exact on integers: constant folding, ``x + 0``, ``x * 1``,
``x * 0``, ``x // 1``, ``x % 1``.  Float expressions are left as written so the
program's rounding behaviour never changes.
"""

from __future__ import annotations

from polyfuse.ir.expr import BinOp, Const, Expr
from polyfuse.ir.visit import children, with_children


def _fold_int(op: str, a: int, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "//" and b != 0:
        return a // b
    if op == "%" and b != 0:
        return a % b
    if op == "max":
        return max(a, b)
    if op == "min":
        return min(a, b)
    return None


def simplify(e: Expr) -> Expr:
    """Simplify integer sub-expressions bottom-up."""
    kids = children(e)
    if kids:
        e = with_children(e, tuple(simplify(k) for k in kids))
    if not (isinstance(e, BinOp) and e.dtype.is_int):
        return e
    a, b = e.a, e.b
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold_int(e.op, int(a.value), int(b.value))
        if folded is not None:
            return Const(folded, e.dtype)
    if e.op == "+" and isinstance(b, Const) and b.value == 0:
        return a
    if e.op == "+" and isinstance(a, Const) and a.value == 0:
        return b
    if e.op == "-" and isinstance(b, Const) and b.value == 0:
        return a
    if e.op == "*" and isinstance(b, Const) and b.value == 1:
        return a
    if e.op == "*" and isinstance(a, Const) and a.value == 1:
        return b
    if e.op == "*" and ((isinstance(a, Const) and a.value == 0) or (isinstance(b, Const) and b.value == 0)):
        return Const(0, e.dtype)
    if e.op == "//" and isinstance(b, Const) and b.value == 1:
        return a
    if e.op == "%" and isinstance(b, Const) and b.value == 1:
        return Const(0, e.dtype)
    return e
