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

**Row divisors in rows on chip.**  A kernel whose rows stay on chip (:mod:`~polyfuse.emit_cpp.onchip`) divides
every element of its row by a value of the row (``sum_sum``'s ``sqrt(max(m - 10, 1))``, a norm's
``sqrt(var + eps)``, softmax's denominator): one IEEE division per element, a dozen instructions each, where the
row is loaded once and the kernel should be bound by memory.  :func:`row_divisions` plans ``x · r`` with
``r = rcp_rz(d)``, ``1/d`` rounded toward zero once per row, where the finite non-zero values of ``d`` are proven
(:func:`finite_bounds`, an interval evaluation in f32 over the kernel's statements, the tensors' signs and the
range facts) to lie in ``[2^-126, 2^126]`` in magnitude; where that is not proven (``l2norm_stable``'s
``max|x|`` may be subnormal), the row tests it at run time and takes the product only where it holds, the
division elsewhere (one branch per row, the same for all its threads).  Then ``1/d`` is a normal number and
``|r| <= |1/d|`` with a relative error below ``2^-23``, so ``fl(x·r)`` is off from ``x/d`` by a relative
:data:`ROW_RELATIVE_ERROR` (the division's: ``2^-24``), absolutely at most ``2^-149`` more where the product is
subnormal, and — ``|x·r| <= |x/d|`` and rounding is monotone — it overflows nowhere the division does not.
±0, ±inf and NaN divisors give what the division gives (the special divisors above; ``rcp_rz`` of them is exact).
The operators' tolerance notes carry the term.

**Row divisors after a loop in warp fragments.**  The statements after such a loop (attention's
``out = pv / row_sum``) divide each element of a tile of rows by a row vector of the loop's registers; where its
finite non-zero values are proven as above (``row_divisions``' ``rows``: the divisor may vary along the row axis;
a masked row's 0 is one of the special divisors) each thread computes ``rcp_rz`` once per row it holds.  Unproven,
the division stays: a warp's rows have no run-time test of their own.

**Constant divisors.**  A division by a constant ``c`` needs no proven range: :func:`reciprocal_constant` says
where ``x · fl(1/c)`` may replace it (the options' ``reciprocal_constants``; the GPU printer applies it to any
f32 division, the operators' tolerance notes carry the term).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polyfuse.emit_cpp.dotplan import LOW, Frame, mma_type, staging
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Select
from polyfuse.tiling.htile import (
    Broadcast, Dot, Permute, Reduce, Slice, Squeeze, TileLoad, TileStore, axes_of, axis_sizes, map_tile_expr,
    tile_expr_str, walk_tile_expr,
)
from polyfuse.transforms.ranges import ValueRange

RELATIVE_ERROR = 2.0 ** -23 + 2.0 ** -48
"""The relative error of ``fl(x · fl(1/d))`` against ``x/d`` (the module docstring), before the 16-bit rounding."""
SMALLEST_NORMAL = 2.0 ** -126
"""f32's smallest normal number: ``1/d`` must be at least this for its error to be relative."""
ROW_RELATIVE_ERROR = 2.0 ** -23 + 2.0 ** -24 + 2.0 ** -47
"""The relative error of ``fl(x · rcp_rz(d))`` against ``x/d``: ``(1 + 2^-23)(1 + 2^-24) − 1`` (module docstring)."""
F32_MAX = float(np.finfo(np.float32).max)
_WIDEN = 2.0 ** -20
"""Relative widening of every computed bound: more than the f32 rounding of the operation it bounds."""


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


__all__ = ["RELATIVE_ERROR", "ROW_RELATIVE_ERROR", "Reciprocal", "RowDivision", "finite_bounds", "plan",
           "row_divisions"]


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


# ------------------------------------------------------------------------------------ row divisors (rows on chip)

@dataclass(frozen=True)
class Bounds:
    """What is known of an f32 expression's values: every value that is not NaN lies in ``[lo, hi]`` (±inf
    included), every finite one in ``[flo, fhi]``, or is 0 where ``zero`` (a range fact: its finite non-zero
    values in ``[flo, fhi]``, else ±0 or NaN)."""

    lo: float
    hi: float
    flo: float
    fhi: float
    zero: bool = False

    def plain(self) -> Bounds:
        """The same values with a possible 0 taken into ``[flo, fhi]``."""
        if not self.zero:
            return self
        return Bounds(self.lo, self.hi, min(self.flo, 0.0), max(self.fhi, 0.0))


UNKNOWN = Bounds(-math.inf, math.inf, -F32_MAX, F32_MAX)
NONNEGATIVE = Bounds(0.0, math.inf, 0.0, F32_MAX)


@dataclass(frozen=True)
class RowDivision:
    """A division ``x / divisor`` evaluated per element of statement ``block``'s row, ``divisor`` a value of
    the row: ``x · rcp_rz(divisor)`` where ``chosen`` (its reciprocal computed once per row), else divided per
    element; ``reason``: the proven range, or why not."""

    block: str
    divisor: Expr
    chosen: bool
    reason: str
    guarded: bool = False
    """Chosen without a proof: each row takes the product only where ``2^-126 <= |d| <= 2^126`` holds."""

    @property
    def text(self) -> str:
        return tile_expr_str(self.divisor)

    def describe(self) -> str:
        if self.guarded:
            return (f"{self.block}: x / d, d = {self.text}, as x · rcp_rz(d) with rcp_rz(d) once per row where "
                    f"2^-126 <= |d| <= 2^126 at run time, else divided ({self.reason})")
        if self.chosen:
            return (f"{self.block}: x / d, d = {self.text}, as x · rcp_rz(d) with rcp_rz(d) once per row (relative "
                    f"2^-23 + 2^-24; {self.reason})")
        return f"{self.block}: x / d, d = {self.text}, divided per element ({self.reason})"


def row_divisions(stores: Sequence[TileStore], ranges: Mapping[str, ValueRange], enabled: bool,
                  rows: Mapping[str, str] | None = None) -> tuple[RowDivision, ...]:
    """Every f32 division of the statements ``stores`` (a kernel whose rows stay on chip, in program order)
    that is evaluated per element of the row by a divisor that is one value per row and not a constant
    (constants: :func:`reciprocal_constant`), with the choice for it (the module docstring).  ``rows``: the
    statements are a tile of rows (the epilogue of a loop in warp fragments), each statement's row axis by
    block, along which the divisor may vary (a row vector)."""
    out: list[RowDivision] = []
    writes: dict[tuple, Expr] = {}
    for s in stores:
        seen: set[Expr] = set()
        for n in walk_tile_expr(s.value):
            if not (isinstance(n, BinOp) and n.op == "/" and n.dtype == dt.f32 and axes_of(n)):
                continue
            d = n.b.tile if isinstance(n.b, Broadcast) else n.b
            row = {rows[s.block]} if rows is not None else set()
            if isinstance(d, Const) or not set(axes_of(d)) <= row or d in seen:
                continue
            seen.add(d)
            if not enabled:
                out.append(RowDivision(s.block, d, False, "the options' reciprocal_rows is off"))
                continue
            b = finite_bounds(d, writes, ranges)
            low, high = _magnitudes(b)
            if low < SMALLEST_NORMAL or high > 1.0 / SMALLEST_NORMAL:
                why = ("no proof: its finite values may be 0 or near it" if low <= 0 else
                       f"no proof: its finite non-zero values lie in [{low:g}, {high:g}] in magnitude")
                out.append(RowDivision(s.block, d, True, why, guarded=True))
                continue
            out.append(RowDivision(s.block, d, True,
                                   f"its finite non-zero values lie in [{low:.3g}, {high:.3g}] in magnitude"))
        writes[_key(s)] = s.value
    return tuple(out)


def _magnitudes(b: Bounds) -> tuple[float, float]:
    """Bounds on the magnitude of ``b``'s finite non-zero values; ``(0, …)`` where they may come near 0."""
    if b.flo > 0:
        return b.flo, b.fhi
    if b.fhi < 0:
        return -b.fhi, -b.flo
    return 0.0, max(-b.flo, b.fhi)


def _key(a: TileLoad | TileStore) -> tuple:
    return (a.tensor.name, tuple(dataclasses.replace(i, axis="") if isinstance(i, Slice) else i for i in a.index))


def finite_bounds(e: Expr, writes: Mapping[tuple, Expr], ranges: Mapping[str, ValueRange]) -> Bounds:
    """Sound bounds on the f32 values of ``e`` (:class:`Bounds`) by interval arithmetic, each bound widened by
    more than the rounding of the operation (so the bounds hold for the rounded values too).  A read of a value
    an earlier statement wrote (``writes``: its value by tensor and index, a row's axis renamed ``""``) is that
    value's bounds; a read of a tensor with a range fact, the fact; of an input declared non-negative or
    positive, ``[0, ∞]``; a product of a value with itself and a sum or dot of such terms are ``>= 0``.
    Anything else is unknown: unknown means unproven, never wrong."""
    return _Evaluator(writes, ranges).bounds(e)


class _Evaluator:
    def __init__(self, writes: Mapping[tuple, Expr], ranges: Mapping[str, ValueRange]):
        self.writes, self.ranges = writes, ranges

    def bounds(self, e: Expr) -> Bounds:
        if e.dtype != dt.f32:
            return UNKNOWN
        if isinstance(e, Const):
            v = float(e.value)
            return Bounds(v, v, v, v) if math.isfinite(v) else UNKNOWN
        if isinstance(e, (Broadcast, Squeeze, Permute)):
            return self.bounds(e.tile)
        if isinstance(e, TileLoad):
            return self.load(e)
        if isinstance(e, Select):
            if isinstance(e.cond, Const):
                return self.bounds(e.true_value if e.cond.value else e.false_value)
            for x, other in ((e.true_value, e.false_value), (e.false_value, e.true_value)):
                if isinstance(other, Const) and float(other.value) == 0.0:  # (a masked row's 0: x's values, or 0)
                    b = self.bounds(x)
                    return Bounds(min(b.lo, 0.0), max(b.hi, 0.0), b.flo, b.fhi, zero=True)
            return _hull(self.bounds(e.true_value).plain(), self.bounds(e.false_value).plain())
        if isinstance(e, Call) and len(e.args) == 1:
            return self.call(e.fn, self.bounds(e.args[0]).plain())
        if isinstance(e, BinOp):
            return self.binop(e)
        if isinstance(e, Reduce):
            t = self.bounds(e.tile).plain()
            if e.op == "sum":
                return NONNEGATIVE if t.lo >= 0 else UNKNOWN
            if e.op in ("max", "min"):
                return Bounds(t.lo, t.hi, max(t.lo, t.flo), min(t.hi, t.fhi))
            return UNKNOWN
        if isinstance(e, Dot):
            terms = NONNEGATIVE if e.a == e.b else UNKNOWN
            return _add(self.bounds(e.acc).plain(), terms)
        return UNKNOWN

    def load(self, e: TileLoad) -> Bounds:
        if e.mask is not None:  # (a masked-off element reads ``other``: where that is 0, the load's values or 0)
            if e.other is not None and not (isinstance(e.other, Const) and float(e.other.value) == 0.0):
                return UNKNOWN
            b = self.load(dataclasses.replace(e, mask=None, other=None))
            return Bounds(min(b.lo, 0.0), max(b.hi, 0.0), b.flo, b.fhi, zero=True)
        fact = self.ranges.get(e.tensor.name)
        if fact is not None:
            return Bounds(min(fact.lo, 0.0), max(fact.hi, 0.0), fact.lo, fact.hi, zero=True)
        value = self.writes.get(_key(e))
        if value is not None:
            return self.bounds(value)
        if e.tensor.sign is not None:
            return NONNEGATIVE
        return UNKNOWN

    def call(self, fn: str, x: Bounds) -> Bounds:
        if fn == "neg":
            return _neg(x)
        if fn == "abs":
            hi = max(-x.lo, x.hi)
            fhi = max(-x.flo, x.fhi)
            lo = 0.0 if x.lo <= 0 <= x.hi else min(abs(x.lo), abs(x.hi))
            flo = 0.0 if x.flo <= 0 <= x.fhi else min(abs(x.flo), abs(x.fhi))
            return Bounds(lo, hi, flo, fhi)
        if fn == "sqrt":
            return _widened(math.sqrt(max(x.lo, 0.0)), math.sqrt(max(x.hi, 0.0)),
                            math.sqrt(max(x.flo, 0.0)), math.sqrt(max(x.fhi, 0.0)))
        if fn == "exp":
            return _widened(_exp(x.lo), _exp(x.hi), _exp(x.lo), min(_exp(x.fhi), F32_MAX))
        return UNKNOWN

    def binop(self, e: BinOp) -> Bounds:
        a = self.bounds(e.a).plain()
        if e.op == "*" and e.a == e.b:
            return _square(a)
        b = self.bounds(e.b).plain()
        if e.op == "+":
            return _add(a, b)
        if e.op == "-":
            return _add(a, _neg(b))
        if e.op == "*":
            return _mul(a, b)
        if e.op == "/" and isinstance(e.b, Const) and float(e.b.value) != 0 and math.isfinite(float(e.b.value)):
            r = 1.0 / float(e.b.value)
            return _mul(a, Bounds(r, r, r, r))
        if e.op == "max":
            flo = max(max(a.lo, b.lo), min(a.flo, b.flo))
            return Bounds(max(a.lo, b.lo), max(a.hi, b.hi), flo, max(a.fhi, b.fhi))
        if e.op == "min":
            fhi = min(min(a.hi, b.hi), max(a.fhi, b.fhi))
            return Bounds(min(a.lo, b.lo), min(a.hi, b.hi), min(a.flo, b.flo), fhi)
        return UNKNOWN


def _down(x: float) -> float:
    """Below every f32 rounding of a real number ``>= x`` (rounding keeps the sign: 0 stays a bound; past f32's
    largest, a value rounds to infinity)."""
    if math.isinf(x) or x < -F32_MAX:
        return -math.inf if x < 0 else x
    return max(0.0, x - x * _WIDEN - 2.0 ** -149) if x >= 0 else x - abs(x) * _WIDEN - 2.0 ** -149


def _up(x: float) -> float:
    return -_down(-x)


def _widened(lo: float, hi: float, flo: float, fhi: float) -> Bounds:
    """Bounds of a rounded operation's exact-value bounds, widened; finite bounds kept within f32's range."""
    return Bounds(_down(lo), _up(hi), max(_down(flo), -F32_MAX), min(_up(fhi), F32_MAX))


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _sum(x: float, y: float, inf: float) -> float:
    r = x + y
    return inf if math.isnan(r) else r


def _add(a: Bounds, b: Bounds) -> Bounds:
    return _widened(_sum(a.lo, b.lo, -math.inf), _sum(a.hi, b.hi, math.inf), a.flo + b.flo, a.fhi + b.fhi)


def _neg(a: Bounds) -> Bounds:
    return Bounds(-a.hi, -a.lo, -a.fhi, -a.flo, a.zero)


def _corners(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    products = [0.0 if math.isnan(x * y) else x * y for x in a for y in b]
    return min(products), max(products)


def _mul(a: Bounds, b: Bounds) -> Bounds:
    lo, hi = _corners((a.lo, a.hi), (b.lo, b.hi))
    flo, fhi = _corners((a.flo, a.fhi), (b.flo, b.fhi))
    return _widened(lo, hi, flo, fhi)


def _square(a: Bounds) -> Bounds:
    def sq(lo: float, hi: float) -> tuple[float, float]:
        top = max(lo * lo, hi * hi)
        return (0.0, top) if lo <= 0 <= hi else (min(lo * lo, hi * hi), top)
    lo, hi = sq(a.lo, a.hi)
    flo, fhi = sq(a.flo, a.fhi)
    return _widened(lo, hi, flo, fhi)


def _hull(a: Bounds, b: Bounds) -> Bounds:
    return Bounds(min(a.lo, b.lo), max(a.hi, b.hi), min(a.flo, b.flo), max(a.fhi, b.fhi))
