"""A division by a row value whose quotient is a 16-bit product operand, as a product by its reciprocal.

Attention that normalises inside the last reduction multiplies ``P = exp(s − m) / ℓ`` by ``V``: in a loop in
warp fragments (:mod:`~polyfuse.emit_cpp.fragments`) every score element pays an IEEE f32 division before P is
rounded once to 16 bits for the tensor cores.  ``x · r`` with ``r = 1/ℓ`` computed once per row costs one
multiply per element instead::

    pv = dot(exp(score − max) / broadcast(row_sum), v)     →     r[row] = 1 / row_sum[row]       (once per row)
                                                                  pv = dot(exp(score − max) · broadcast(r), v)

**Error.**  With ``u = 2^-24`` (f32), ``r = (1/ℓ)(1 + δ1)`` and ``fl(x·r) = (x/ℓ)(1 + δ1)(1 + δ2)``,
``|δ1|, |δ2| <= u``, so the quotient is off by a relative ``(1 + u)² − 1 = 2^-23 + 2^-48`` (the division's:
``2^-24``) — *before* it is rounded to 16 bits (``2^-11`` for f16, ``2^-8`` for bf16), where it only moves the
rounding boundary.  The operators' tolerance notes carry the term (attention's ``TOLERANCE_NOTE``).  Both
``δ`` are relative errors only where ``r`` is a normal number: the divisor's finite non-zero values lie in a
proven range ``[lo, hi]`` (:mod:`polyfuse.transforms.ranges`: a softmax denominator is in ``[1, n]``) with
``1/lo`` and ``1/hi`` normal.  A product ``x·r`` of a tiny ``x`` that lands in the f32 subnormal range is off
by at most ``2^-149`` absolutely, far below the f16 subnormal spacing ``2^-24`` (the tolerance's subnormal term);
``|x·r| <= |x|/lo``, so for ``lo >= 1`` it overflows only where ``x`` is infinite, where ``x/ℓ`` is too.

**Special divisors.**  Where ``ℓ`` is ±0, ±inf or NaN (a fully masked row: 0; a NaN row: NaN), ``1/ℓ`` is
exact (±inf, ±0, NaN) and ``x·(1/ℓ)`` is ``x/ℓ`` in every case of IEEE arithmetic: ``x/±0 = ±inf = x·±inf`` for
``x`` non-zero and ``0/0 = NaN = 0·inf``; ``x/±inf = ±0 = x·±0`` and ``inf/inf = NaN = inf·0``; NaN stays NaN.

**Where.**  Only for a quotient that *is* a product's ``a`` operand (where a mask selects it: 0 elsewhere)
computed from registers and rounded once to the product's 16-bit type (the options' ``round_operands``; split
hi + lo keeps about 22 bits, where the reciprocal's extra rounding would show), a divisor that is a row vector
of the loop's registers with a proven range, and the options' ``reciprocal_operands``.  Elsewhere the division
stays; the plan records which, and why.

**Constant divisors.**  A division by a constant ``c`` needs no proven range: :func:`reciprocal_constant` says
where ``x · fl(1/c)`` may replace it (the options' ``reciprocal_constants``; the GPU printer applies it to any
f32 division, the operators' tolerance notes carry the term).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from polyfuse.emit_cpp.dotplan import LOW, Frame, mma_type, staging
from polyfuse.ir.expr import BinOp, Const, Expr, Select
from polyfuse.tiling.htile import (
    Broadcast, Dot, TileLoad, TileStore, axes_of, axis_sizes, map_tile_expr, walk_tile_expr,
)

RELATIVE_ERROR = 2.0 ** -23 + 2.0 ** -48
"""The relative error of ``fl(x · fl(1/d))`` against ``x/d`` (the module docstring), before the 16-bit rounding."""
SMALLEST_NORMAL = 2.0 ** -126
"""f32's smallest normal number: ``1/d`` must be at least this for its error to be relative."""


@dataclass(frozen=True)
class Reciprocal:
    """The choice for one division ``x / divisor`` that statement ``block``'s product takes as its ``a``
    operand: where chosen, ``inverse`` (``1/divisor``, an expression of the statement's ``row`` axis) is
    computed once per row into ``register`` before the statement; ``reason``: the proven range it relies on, or
    why the division stays."""

    block: str
    divisor: str
    reason: str
    register: str | None = None
    row: str | None = None
    inverse: Expr | None = None

    @property
    def chosen(self) -> bool:
        return self.register is not None

    def describe(self) -> str:
        if self.register is None:
            return f"{self.block}: a = x / {self.divisor} divided per element ({self.reason})"
        return (f"{self.block}: a = x / {self.divisor} as x · {self.register} with {self.register} = "
                f"1 / {self.divisor} once per row, before the 16-bit rounding (relative 2^-23 + 2^-48; {self.reason})")


def plan(frame: Frame, body: tuple[TileStore, ...], rows: Mapping[str, str], dims: Mapping[str, tuple],
         values: Mapping[str, Expr], fresh: Callable[[str], str]) -> tuple[dict[str, Expr], tuple[Reciprocal, ...]]:
    """The statements' values with each qualifying division rewritten (the module docstring), and the choice
    for every division that is a register operand of a product.  ``rows``: each statement's row axis;
    ``dims``: the loop's tensors in registers (row dim, col dim, cols; col dim None: a row vector)."""
    out = dict(values)
    choices: list[Reciprocal] = []
    ranges = frame.ranges
    for s in body:
        for e in [n for n in walk_tile_expr(values[s.block]) if isinstance(n, Dot)]:
            found = _division(e.a, dims)
            if found is None:
                continue
            divisor = found.b.tile  # type: ignore[attr-defined]
            name = divisor.tensor.name
            reason = _refusal(frame, s, e, name, ranges)
            if reason is not None:
                choices.append(Reciprocal(s.block, name, reason))
                continue
            fact = ranges[name]
            inverse = BinOp("/", Const(1.0, divisor.dtype), divisor)
            product = BinOp("*", found.a, Broadcast(inverse, found.b.axes))  # type: ignore[attr-defined]
            out[s.block] = map_tile_expr(out[s.block], lambda n, found=found, product=product:
                                         product if n == found else None)
            choices.append(Reciprocal(s.block, name, f"{name} in [{fact.lo:g}, {fact.hi:g}]: {fact.proof}",
                                      fresh("rcp"), rows[s.block], inverse))
    return out, tuple(choices)


def _division(a: Expr, dims: Mapping[str, tuple]) -> BinOp | None:
    """The division ``x / broadcast(d)`` that ``a`` is (or is where a mask selects it, the constant 0 elsewhere),
    ``d`` a read of a row vector of the loop's registers, unmasked or 0 where masked (the padding rows: ``x/0``
    and ``x·(1/0)`` are the same); else None."""
    if isinstance(a, Select):
        zero = [isinstance(x, Const) and x.value == 0 for x in (a.true_value, a.false_value)]
        if zero == [True, False]:
            return _division(a.false_value, dims)
        if zero == [False, True]:
            return _division(a.true_value, dims)
        return None
    if not (isinstance(a, BinOp) and a.op == "/" and a.dtype.is_float and isinstance(a.b, Broadcast)):
        return None
    d = a.b.tile
    if not (isinstance(d, TileLoad) and d.tensor.name in dims and dims[d.tensor.name][1] is None):
        return None
    if d.mask is not None and not (d.other is not None and d.other.value == 0):
        return None
    return a if len(axes_of(d)) == 1 else None


def _refusal(frame: Frame, s: TileStore, e: Dot, name: str, ranges: Mapping) -> str | None:
    """Why the division by ``name`` in ``e``'s ``a`` operand stays (None: it may become a product)."""
    if not frame.options.reciprocal_operands:
        return "the options' reciprocal_operands is off"
    here = frame.at(axis_sizes(s))
    low = mma_type(here, e)
    a, _ = staging(here, e)
    if low is None or low.name not in LOW or (a.split and not frame.options.round_operands):
        return "the operand is split hi + lo, not rounded once to 16 bits (round_operands off)"
    fact = ranges.get(name)
    if fact is None:
        return f"no proven range of {name}"
    if not (fact.lo > 0 and 1.0 / fact.lo < math.inf and 1.0 / fact.hi >= SMALLEST_NORMAL):
        return f"{name} in [{fact.lo:g}, {fact.hi:g}]: 1/{name} may not be a normal number"
    return None


__all__ = ["RELATIVE_ERROR", "Reciprocal", "plan"]


def reciprocal_constant(c: float) -> float | None:
    """``fl32(1/c)`` where an f32 division by the constant ``c`` may be a multiplication by it (the options'
    ``reciprocal_constants``): ``|c| > 1``, finite, not a power of two (that one divides exactly: nothing to
    gain) and ``1/c`` normal in f32; else None.

    Error: ``fl(x · fl(1/c))`` is off from ``x / c`` by a relative :data:`RELATIVE_ERROR` (two roundings
    instead of one; absolutely below ``2^-149`` where the product is subnormal).  Why ``|c| > 1``: then
    ``|fl(1/c)| <= 1`` and ``|x · fl(1/c)| <= |x|``, so the product overflows nowhere that the division does not;
    ±0, ±inf and NaN in ``x`` give what the division gives."""
    if not math.isfinite(c) or abs(c) <= 1.0 or abs(c) >= 1.0 / SMALLEST_NORMAL:
        return None
    mantissa, _ = math.frexp(abs(c))
    if mantissa == 0.5:
        return None
    return float(np.float32(1.0) / np.float32(c))
