"""Interval bounds of sympy expressions: what the numerical side conditions of a repair rest on.

The repair solver proves facts like "the factor ``exp(m - m')`` lies in [0, 1]" or "the
denominator ``sqrt(s/M + eps)`` is never 0" (:mod:`~polyfuse.transforms.numerics`).  Each is a
question about the range of an expression over a region given by ranges of its symbols, which
interval arithmetic answers soundly (never a range too small) and quickly.  Intervals keep
whether each end is attained, because "can it be 0?" is the question a division asks: the range
of a positive symbol is (0, ∞), not [0, ∞).

Interval arithmetic loses the correlation between two occurrences of a symbol (``x/|x|`` looks
unbounded); the regions the caller builds substitute the producers away so that sympy cancels
what it can, and :func:`bound` recognises ``x^a·|x|^-a = sign(x)^a`` in a product.  Anything it
does not know evaluates to (-∞, ∞): unknown means unproven, never wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import sympy

__all__ = ["Interval", "bound", "symbol_range"]

_INF = math.inf
SMALLEST_SUBNORMAL = 2.0 ** -149
"""float32's smallest positive number; nearer to 0, a value of either float dtype may round to 0."""


@dataclass(frozen=True)
class Interval:
    """The real numbers from ``lo`` to ``hi``; ``lo_in``/``hi_in`` say whether the ends are attained
    (an infinite end never is)."""

    lo: float
    hi: float
    lo_in: bool = True
    hi_in: bool = True

    def __post_init__(self) -> None:
        if math.isinf(self.lo) and self.lo_in:
            object.__setattr__(self, "lo_in", False)
        if math.isinf(self.hi) and self.hi_in:
            object.__setattr__(self, "hi_in", False)

    @staticmethod
    def point(v: float) -> Interval:
        return Interval(v, v)

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def contains(self, v: float) -> bool:
        """True if ``v`` may be a value of the expression."""
        above = self.lo < v or (self.lo == v and self.lo_in)
        below = v < self.hi or (v == self.hi and self.hi_in)
        return above and below

    def may_be_zero(self) -> bool:
        """True if a floating-point value in the interval may be 0: 0 is in it, or an end lies nearer to 0
        than float32's smallest subnormal number.  Real arithmetic's ``exp(x) > 0``, ``1/(1 + e^x) > 0`` and
        ``tanh(x) < 1`` hold for no float: a value that small rounds to 0 (``1 - tanh(20)`` is 0)."""
        return (self.contains(0.0) or 0.0 <= self.lo < SMALLEST_SUBNORMAL
                or -SMALLEST_SUBNORMAL < self.hi <= 0.0)

    def within(self, lo: float, hi: float) -> bool:
        """True if every value lies in [lo, hi]."""
        return lo <= self.lo and self.hi <= hi

    def __str__(self) -> str:
        return f"{'[' if self.lo_in else '('}{self.lo:g}, {self.hi:g}{']' if self.hi_in else ')'}"


ANY = Interval(-_INF, _INF)


def symbol_range(sym: sympy.Symbol) -> Interval:
    """The range sympy's assumptions give a symbol: a stored value, so a positive one is a positive float,
    at least the smallest subnormal number."""
    if sym.is_positive:
        return Interval(1.0, _INF) if sym.is_integer else Interval(SMALLEST_SUBNORMAL, _INF)
    if sym.is_nonnegative:
        return Interval(0.0, _INF)
    if sym.is_negative:
        return Interval(-_INF, -SMALLEST_SUBNORMAL)
    if sym.is_nonpositive:
        return Interval(-_INF, 0.0)
    return ANY


def bound(e: sympy.Basic, ranges: Mapping[sympy.Symbol, Interval] | None = None) -> Interval:
    """A sound interval holding every value of ``e`` when each symbol lies in its range (``ranges``,
    else its assumptions)."""
    return _Bounder(dict(ranges or {})).of(e)


class _Bounder:
    def __init__(self, ranges: dict[sympy.Symbol, Interval]):
        self.ranges = ranges

    def of(self, e: sympy.Basic) -> Interval:
        if e.is_Number:
            if e in (sympy.oo, -sympy.oo):
                return Interval(float(e), float(e), False, False)
            if e is sympy.nan or e is sympy.zoo:
                return ANY
            return Interval.point(float(e))
        if e is sympy.E:
            return Interval.point(math.e)
        if e is sympy.pi:
            return Interval.point(math.pi)
        if isinstance(e, sympy.Symbol):
            return self.ranges.get(e) or symbol_range(e)
        if isinstance(e, sympy.Add):
            out = Interval.point(0.0)
            for a in e.args:
                out = _add(out, self.of(a))
            return out
        if isinstance(e, sympy.Mul):
            return self._mul(e)
        if isinstance(e, sympy.Pow):
            return self._pow(*e.args)
        if isinstance(e, sympy.exp):
            return _exp_of(self.of(e.args[0]))
        if isinstance(e, sympy.log):
            x = self.of(e.args[0])
            if x.hi < 0 or (x.hi == 0 and not x.hi_in):
                return ANY
            return _monotone(Interval(max(x.lo, 0.0), x.hi, x.lo_in and x.lo > 0, x.hi_in), _log)
        if isinstance(e, sympy.tanh):
            x = _monotone(self.of(e.args[0]), math.tanh)
            return Interval(max(x.lo, -1.0), min(x.hi, 1.0), x.lo_in and x.lo > -1, x.hi_in and x.hi < 1)
        if isinstance(e, sympy.Abs):
            return _abs(self.of(e.args[0]))
        if isinstance(e, sympy.sign):
            x = self.of(e.args[0])
            zero = x.contains(0)
            return Interval(-1.0 if x.lo < 0 else (0.0 if zero else 1.0), 1.0 if x.hi > 0 else (0.0 if zero else -1.0))
        if isinstance(e, (sympy.Max, sympy.Min)):
            parts = [self.of(a) for a in e.args]
            pick = max if isinstance(e, sympy.Max) else min
            lo = pick(p.lo for p in parts)
            hi = pick(p.hi for p in parts)
            return Interval(lo, hi, any(p.lo == lo and p.lo_in for p in parts),
                            any(p.hi == hi and p.hi_in for p in parts))
        if isinstance(e, sympy.Heaviside):
            return Interval(0.0, 1.0)
        if isinstance(e, sympy.Piecewise):
            parts = [self.of(v) for v, _ in e.args]
            return _hull(parts)
        return ANY

    def _mul(self, e: sympy.Mul) -> Interval:
        """A product, with ``x^a·|x|^-a`` taken together as ``sign(x)^a`` (in [-1, 1])."""
        factors = list(e.args)
        out = Interval.point(1.0)
        powers: dict[sympy.Basic, list[tuple[bool, sympy.Basic]]] = {}
        for f in factors:
            base, ex = (f.args if isinstance(f, sympy.Pow) else (f, sympy.Integer(1)))
            is_abs = isinstance(base, sympy.Abs)
            inner = base.args[0] if is_abs else base
            powers.setdefault(inner, []).append((is_abs, ex))
        for inner, parts in powers.items():
            plain = sum((ex for is_abs, ex in parts if not is_abs), sympy.Integer(0))
            of_abs = sum((ex for is_abs, ex in parts if is_abs), sympy.Integer(0))
            if plain != 0 and of_abs != 0 and plain + of_abs == 0 and plain.is_integer:
                value = Interval(0.0, 1.0) if plain.is_even else Interval(-1.0, 1.0)
            else:
                value = Interval.point(1.0)
                for is_abs, ex in parts:
                    value = _mul(value, self._pow(sympy.Abs(inner) if is_abs else inner, ex))
            out = _mul(out, value)
        return out

    def _pow(self, base: sympy.Basic, ex: sympy.Basic) -> Interval:
        if base is sympy.E:
            return _exp_of(self.of(ex))
        if not ex.is_Number:
            return ANY
        b = self.of(base)
        if ex.is_integer:
            n = int(ex)
            if n < 0:
                return _reciprocal(self._pow(base, -ex))
            if n == 0:
                return Interval.point(1.0)
            return _monotone(_abs(b), lambda v: v ** n) if n % 2 == 0 else _monotone(b, lambda v: v ** n)
        if ex.is_Rational or ex.is_Float:
            p = float(ex)
            if b.lo < 0:
                return ANY
            up = _monotone(b, lambda v: v ** abs(p))
            return up if p > 0 else _reciprocal(up)
        return ANY


def _exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return _INF


EXP_UNDERFLOW = -104.0
"""Below this argument ``exp`` rounds to 0 in float32 (its smallest subnormal is e^-103.3); float64's
threshold is lower, so this one holds for both."""


def _exp_of(x: Interval) -> Interval:
    """``exp`` of ``x`` in floating point: 0 is a value (attained) wherever the argument can go below
    the underflow threshold, ``exp(-inf)`` included; ``exp(x) > 0`` holds only in real arithmetic."""
    out = _monotone(x, _exp)
    if x.lo < EXP_UNDERFLOW:
        return Interval(0.0, out.hi, True, out.hi_in)
    return out


def _log(v: float) -> float:
    return -_INF if v == 0 else math.log(v)


def _monotone(x: Interval, fn) -> Interval:
    """``fn`` (nondecreasing) applied to the ends."""
    return Interval(fn(x.lo), fn(x.hi), x.lo_in, x.hi_in)


def _add(a: Interval, b: Interval) -> Interval:
    lo = a.lo + b.lo if not (math.isinf(a.lo) and math.isinf(b.lo) and a.lo != b.lo) else -_INF
    hi = a.hi + b.hi if not (math.isinf(a.hi) and math.isinf(b.hi) and a.hi != b.hi) else _INF
    return Interval(lo, hi, a.lo_in and b.lo_in, a.hi_in and b.hi_in)


def _mul(a: Interval, b: Interval) -> Interval:
    """The product: its extremes are products of ends; 0·∞ counts as 0 (the other corners bound the
    products of small and large values), attained where the 0 end is."""
    ends = []
    for x, xi in ((a.lo, a.lo_in), (a.hi, a.hi_in)):
        for y, yi in ((b.lo, b.lo_in), (b.hi, b.hi_in)):
            if x == 0 and math.isinf(y):
                ends.append((0.0, xi))
            elif y == 0 and math.isinf(x):
                ends.append((0.0, yi))
            else:
                ends.append((x * y, xi and yi))
    lo = min(v for v, _ in ends)
    hi = max(v for v, _ in ends)
    return Interval(lo, hi, any(v == lo and i for v, i in ends), any(v == hi and i for v, i in ends))


def _reciprocal(x: Interval) -> Interval:
    """1/x where x keeps one sign (0 at most as an end that is not attained); else anything."""
    if x.contains(0) or x.lo < 0 < x.hi:
        return ANY
    if x.hi <= 0:
        return _neg(_reciprocal(_neg(x)))
    lo = 0.0 if math.isinf(x.hi) else 1.0 / x.hi
    hi = _INF if x.lo == 0 else 1.0 / x.lo
    return Interval(lo, hi, x.hi_in, x.lo_in)


def _neg(x: Interval) -> Interval:
    return Interval(-x.hi, -x.lo, x.hi_in, x.lo_in)


def _abs(x: Interval) -> Interval:
    if x.lo >= 0:
        return x
    if x.hi <= 0:
        return Interval(-x.hi, -x.lo, x.hi_in, x.lo_in)
    hi = max(-x.lo, x.hi)
    hi_in = (x.hi == hi and x.hi_in) or (-x.lo == hi and x.lo_in)
    return Interval(0.0, hi, True, hi_in)


def _hull(parts: list[Interval]) -> Interval:
    lo = min(p.lo for p in parts)
    hi = max(p.hi for p in parts)
    return Interval(lo, hi, any(p.lo == lo and p.lo_in for p in parts), any(p.hi == hi and p.hi_in for p in parts))
