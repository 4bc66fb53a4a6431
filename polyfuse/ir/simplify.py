"""Light algebraic simplification of integer index expressions.

Only rewrites that are exact on integers: constant folding, ``x + 0``, ``x * 1``,
``x * 0``, ``x // 1``, ``x % 1``.  Float expressions are left as written so the
program's rounding behaviour never changes.
"""

from __future__ import annotations

import functools

from polyfuse.ir.expr import BinOp, Const, Expr, conjuncts, logical_and
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


_COMPARE = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__, "==": int.__eq__}


def simplify_condition(cond: Expr) -> Expr | None:
    """A conjunction of integer comparisons with its operands simplified and the
    comparisons of constants that hold dropped; None when every conjunct holds."""
    kept = []
    for c in conjuncts(cond):
        c = simplify(c)
        if (isinstance(c, BinOp) and c.op in _COMPARE and isinstance(c.a, Const) and isinstance(c.b, Const)
                and c.a.dtype.is_int and _COMPARE[c.op](int(c.a.value), int(c.b.value))):
            continue
        kept.append(c)
    return functools.reduce(logical_and, kept) if kept else None
