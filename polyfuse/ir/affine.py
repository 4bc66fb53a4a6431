"""Quasi-affine integer expressions: the boundary between IR indices and ISL.

An index, a loop binding or an extent is *quasi-affine* when it is built from
integer variables and constants with ``+``, ``-``, multiplication by a constant,
and ``//`` or ``%`` by a positive constant.  :func:`linear_form` decomposes such
an expression into integer coefficients of variables and of floor/mod atoms.
"""

from __future__ import annotations


from collections.abc import Mapping

from polyfuse.errors import NonAffineIndex
from polyfuse.ir.expr import BinOp, Const, Expr, Var

# A key of a linear form: a variable name, a floor-division/modulo atom, or 1 (the constant).
Atom = str | BinOp | int


class _NotAffine(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def linear_form(e: Expr) -> dict[Atom, int]:
    """Coefficients of ``e`` as a sum of atoms; raises NonAffineIndex if not quasi-affine."""
    try:
        return _linear(e)
    except _NotAffine as err:
        raise NonAffineIndex(f"{e} is not affine: {err.reason}") from None


def _add(x: dict[Atom, int], y: dict[Atom, int], sign: int = 1) -> dict[Atom, int]:
    out = dict(x)
    for k, v in y.items():
        out[k] = out.get(k, 0) + sign * v
        if out[k] == 0:
            del out[k]
    return out


def _constant(form: dict[Atom, int]) -> int | None:
    if not form:
        return 0
    if set(form) == {1}:
        return form[1]
    return None


def _linear(e: Expr) -> dict[Atom, int]:
    if not e.dtype.is_int:
        raise _NotAffine(f"it has dtype {e.dtype}, not an integer type")
    if isinstance(e, Const):
        return {1: int(e.value)} if e.value else {}
    if isinstance(e, Var):
        return {e.name: 1}
    if isinstance(e, BinOp):
        if e.op in ("+", "-"):
            return _add(_linear(e.a), _linear(e.b), 1 if e.op == "+" else -1)
        if e.op == "*":
            a, b = _linear(e.a), _linear(e.b)
            ca, cb = _constant(a), _constant(b)
            if ca is None and cb is None:
                raise _NotAffine(f"it multiplies two non-constant terms ({e.a} and {e.b})")
            k, other = (ca, b) if ca is not None else (cb, a)
            return {atom: k * v for atom, v in other.items() if k * v}
        if e.op in ("//", "%"):
            _linear(e.a)
            d = _constant(_linear(e.b))
            if d is None or d <= 0:
                raise _NotAffine(f"it divides by {e.b}, which is not a positive constant")
            return {e: 1}
        raise _NotAffine(f"operator {e.op!r} is not affine")
    raise _NotAffine(f"{type(e).__name__} nodes (data-dependent or non-integer) are not affine")


def variables(form: dict[Atom, int]) -> set[str]:
    """Names of the variables a linear form depends on (inside atoms too)."""
    from polyfuse.ir.visit import free_vars

    out: set[str] = set()
    for k in form:
        if isinstance(k, str):
            out.add(k)
        elif isinstance(k, BinOp):
            out |= free_vars(k)
    return out


def check_affine(e: Expr, *, allowed: set[str], what: str) -> None:
    """Raise NonAffineIndex naming ``what`` unless ``e`` is quasi-affine over ``allowed``."""
    try:
        form = _linear(e)
    except _NotAffine as err:
        raise NonAffineIndex(f"{what}: {e} is not affine: {err.reason}") from None
    stray = sorted(variables(form) - allowed)
    if stray:
        raise NonAffineIndex(
            f"{what}: {e} uses {', '.join(stray)}, which is not a variable in scope here "
            f"(in scope: {', '.join(sorted(allowed)) or 'none'})"
        )


def fold_div_mod(e: Expr, ranges: Mapping[str, int | None]) -> Expr:
    """``(d·q + r) % d`` -> ``r`` and ``(d·q + r) // d`` -> ``q`` when ``0 <= r < d`` over the loop ranges.

    Compacted buffers are indexed like ``i % 8`` with ``i = 8·i_0 + ax0``; folded, the
    index is ``ax0`` and the ``ax0`` loop can run as one NumPy axis.
    """
    from polyfuse.ir.visit import map_expr

    def fold(n: Expr) -> Expr | None:
        if not (isinstance(n, BinOp) and n.op in ("%", "//") and isinstance(n.b, Const)):
            return None
        d = int(n.b.value)
        inner = fold_div_mod(n.a, ranges)
        try:
            form = linear_form(inner)
        except NonAffineIndex:
            return None
        q, r = _split_form(form, d)
        if _within(r, d, ranges):
            return from_linear_form(r if n.op == "%" else q, n.dtype)
        if n.op == "//":
            # ``(a·q + r) // d`` -> ``q // (d/a)`` for a divisor a of d and ``0 <= r < a``: the heads of a
            # GQA group, ``(h_0·2 + h_1) // 4`` with ``h_1 < 2``, are ``h_0 // 2``.
            for a in (a for a in range(d // 2, 1, -1) if d % a == 0):
                q, r = _split_form(form, a)
                if set(r) - {1} and _within(r, a, ranges):
                    return BinOp("//", from_linear_form(q, n.dtype), Const(d // a, n.dtype))
        return None

    return map_expr(e, fold)


def _split_form(form: dict[Atom, int], d: int) -> tuple[dict[Atom, int], dict[Atom, int]]:
    """``form = d·q + r``: q from the terms whose coefficient d divides, r the others and the constant."""
    q = {k: c // d for k, c in form.items() if k != 1 and c % d == 0}
    r = {k: c for k, c in form.items() if k == 1 or c % d != 0}
    return q, r


def _within(r: dict[Atom, int], d: int, ranges: Mapping[str, int | None]) -> bool:
    """True if ``0 <= r < d`` over the loop ranges."""
    low = high = r.get(1, 0)
    for k, c in r.items():
        if k == 1:
            continue
        if not isinstance(k, str) or ranges.get(k) is None:
            return False
        top = c * (ranges[k] - 1)  # type: ignore[operator]
        low, high = low + min(0, top), high + max(0, top)
    return low >= 0 and high < d


def from_linear_form(form: dict, dtype) -> Expr:
    """The expression of a linear form (inverse of :func:`linear_form`)."""
    out: Expr = Const(0, dtype)
    for k, c in form.items():
        term: Expr = Const(c, dtype) if k == 1 else (Var(k, dtype) if isinstance(k, str) else k)
        if k != 1 and c != 1:
            term = BinOp("*", Const(c, dtype), term)
        out = term if out == Const(0, dtype) else BinOp("+", out, term)
    return out
