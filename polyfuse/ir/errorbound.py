"""Run a program and bound, elementwise, how far each result is from its exact value.

The exact value of a result is what the program computes on the same inputs in real arithmetic: every
operation exact, integer constants as written, and a constant that is not an integer the real number it stands
for (``1e-5``, a solver's ``1/M``), which its value in the IR approximates within one rounding.
:func:`interpret_with_bounds` runs the program with the NumPy interpreter (its values are bit for bit those of
:func:`~polyfuse.ir.interpret`) and carries, for every value, a bound ``e`` on ``|computed - exact|``
(Wilkinson's running error analysis): each operation propagates its operands' bounds through its own
sensitivity and adds its rounding, ``u_d·|result| + η_d`` for a correctly rounded operation in dtype ``d``
(``u`` the unit roundoff, ``η`` half the smallest subnormal where the result is below the smallest normal
number, so that underflow is covered; sums and differences are exact there, and a product with an exact 0 is
exact), ``LIBM_ULPS`` units in the last place for a library function (``exp``, ``log``, ``tanh``, ``pow`` …).
Reductions run in the program's order, so an ``n``-term sum accumulates ``u·Σ|partial sums| ≤ n·u·Σ|t|``, and
a difference of nearly equal values keeps the bounds of both: cancellation shows as a bound large next to the
result.

Propagation is exact where that is cheap, first order otherwise: ``a·b`` adds ``|a|e_b + |b|e_a + e_a e_b``;
``a/b`` gives ``(e_a + |a/b|·e_b) / (|b| - e_b)``, infinite when ``e_b ≥ |b|`` (the exact divisor may be 0);
``exp(a)`` gives ``exp(a)·(exp(e_a) - 1)``; ``log(a)`` gives ``log(a / (a - e_a))``, infinite when
``e_a ≥ a``; ``max``/``min`` are exact and pass on the chosen operand's bound (the larger one where the
operands' bounds overlap); ``abs``/``neg`` are exact; ``tanh`` is 1-Lipschitz; integer arithmetic is exact.

A comparison of values that carry error may come out differently in exact arithmetic: where
``|a - b| ≤ e_a + e_b`` (and the bounds are not both 0) its result is *uncertain* (an infinite bound on a
boolean), and a ``select`` on an uncertain condition covers the other branch too: its bound is
``max(e_chosen, |chosen - other| + e_other)``.  That is how a guard such as ``select(x == 0, x, x·q)``
that hides a singular or lost value shows: its bound stays large.  One select is a choice, not an approximation:
a repair's *surrogate* ``select(r == 0, τ, r)`` (τ the smallest normal number of r's dtype,
:mod:`polyfuse.transforms.numerics` condition 1) picks the reference point a repair rescales from, and the repair
is exact for any reference point, so the exact program may make the computed program's choice: its bound is the
chosen branch's, however uncertain ``r == 0`` is (a mass that underflowed to 0 is τ in both).  Non-finite results get an infinite
bound, except where they are exact consequences of exact operands (``-inf`` as a max identity,
``x - (-inf)``, a division by an exact 0); an overflow of finite operands is not exact.  Uninitialised
temporaries (NaN) have infinite bounds.

The bound is rigorous only to first order, and blind to correlation: a value and its copy (a producer's
running value and the one saved before its update) count as independent, so ``t - r + r'`` adds both
bounds although their errors cancel.  :mod:`polyfuse.differential` allows for that.

Bounds are computed in float64; their own rounding (relative 2^-53) is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var
from polyfuse.ir.interpreter import OPERATIONS, Runner, Value, apply, operands, prepare, results
from polyfuse.ir.stmt import INPUT, Block, Program, Tensor

UNIT_ROUNDOFF = {"f64": 2.0 ** -53, "f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp8e4m3": 2.0 ** -4}
"""``u_d``: the largest relative error of rounding to nearest in each float dtype."""
UNDERFLOW = {"f64": 2.0 ** -1074, "f32": 2.0 ** -150, "f16": 2.0 ** -25, "bf16": 2.0 ** -134, "fp8e4m3": 2.0 ** -10}
"""``η_d``: half the smallest subnormal of each float dtype, the absolute error an underflow may add (for f64 the
smallest subnormal itself: bounds are float64, where its half is 0)."""
LIBM_ULPS = 4
"""Units in the last place a library function may be off: NumPy documents its SIMD float32 ``exp`` and ``log``
to 2.52 and 3.83 ULP and its other vectorised functions to 4 ULP; glibc's are within 1.  An ULP of ``r`` is at
most ``2u·|r|``."""

_TINY = {name: float(ml_dtypes.finfo(dt.dtype(name).numpy).tiny) for name in UNIT_ROUNDOFF}
_ZERO = np.float64(0.0)
_INF = np.float64(np.inf)
_LIBM = ("exp", "exp2", "log", "log2", "tanh", "sigmoid", "pow")
_EXACT_CALLS = ("abs", "neg", "floor", "ceil")

Bounded = tuple[Value, Value]
"""A value and the bound on its error (float64, broadcastable to the value)."""


def interpret_with_bounds(program: Program, inputs: Mapping[str, np.ndarray], sizes: Mapping[str, int] | None = None,
                          *, return_temps: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run ``program`` like :func:`~polyfuse.ir.interpret` and return ``{output: (values, bounds)}``.

    ``bounds`` (float64, the output's shape) bounds ``|values - exact|`` elementwise, where ``exact`` is the
    program's result in real arithmetic on the same inputs (see the module docstring).
    """
    bound, buffers = prepare(program, inputs, sizes)
    errors = {t.name: np.full(buffers[t.name].shape, 0.0 if t.role == INPUT else np.inf) for t in bound.tensors}
    BoundRunner(bound, buffers, errors).execute()
    return {t.name: (buffers[t.name], errors[t.name]) for t in results(bound, return_temps)}


def rounding(d: DType, r: Value, *, underflow: bool = True) -> Value:
    """The error a correctly rounded operation in ``d`` with result ``r`` may add (0 for non-floats):
    ``u·|r|``, and ``η`` where ``r`` is below the smallest normal number (an addition or subtraction is exact
    there: ``underflow=False``)."""
    if not d.is_float:
        return _ZERO
    mag = np.abs(np.asarray(r, dtype=np.float64))
    err = UNIT_ROUNDOFF[d.name] * mag
    if underflow:
        err = err + np.where(mag < _TINY[d.name], UNDERFLOW[d.name], 0.0)
    return err


class BoundRunner(Runner):
    """The interpreter with a shadow buffer of error bounds per tensor (see the module docstring)."""

    def __init__(self, program: Program, buffers: dict[str, np.ndarray], errors: dict[str, np.ndarray]):
        super().__init__(program, buffers)
        self.errors = errors

    def stored(self, e: Expr, env: dict[str, Value], b: Block, guard: Value) -> Bounded:
        return self.bounded(e, env, b, guard)

    def store(self, b: Block, t: Tensor, idx: list[Value], value: object, mask: Value) -> None:
        v, err = value  # type: ignore[misc]
        self.write(self.buffers[t.name], b, t, idx, v, mask)
        self.write(self.errors[t.name], b, t, idx, np.broadcast_to(err, np.shape(v)), mask)

    def bounded(self, e: Expr, env: dict[str, Value], b: Block, guard: Value) -> Bounded:
        """The value of ``e`` (as :meth:`expr` computes it) and the bound on its error."""
        if isinstance(e, Var):
            return self.var(e, env, b), _ZERO
        if isinstance(e, Const):
            return self.expr(e, env, b, guard), _constant_error(e)
        if isinstance(e, Load):
            idx = self.index(e, env, b, guard)
            return np.asarray(self.buffers[e.tensor.name][idx]), np.asarray(self.errors[e.tensor.name][idx])
        if not isinstance(e, OPERATIONS):
            return self.expr(e, env, b, guard), _ZERO  # (raises, naming the block)
        pairs = [self.bounded(x, env, b, guard) for x in operands(e)]
        values = [v for v, _ in pairs]
        r = apply(e, values)
        with np.errstate(all="ignore"):
            err = propagate(e, values, [err for _, err in pairs], r)
        return r, err


def _constant_error(c: Const) -> Value:
    """A float constant stands for a real number rounded to its dtype (``1e-5``, a solver's ``1/M``): it carries
    that rounding, so programs that write one constant two ways agree — unless it is an integer or a short binary
    fraction (:func:`_short`: ``0.5``, ``-1.25``), which is what it says.  Taking such a threshold as rounded would
    make an input that equals it an uncertain comparison in every program, and a fused program that selects the
    same branch there (the comparison is exact in both) look less accurate than the plain one."""
    v = c.value
    if c.dtype.is_float and np.isfinite(v) and v != np.round(v) and not _short(float(v), c.dtype):
        return np.float64(UNIT_ROUNDOFF[c.dtype.name] * abs(v))
    return _ZERO


def _short(v: float, dtype: DType) -> bool:
    """Whether ``v``'s binary significand has at most half the bits of ``dtype``'s (a rounded real number takes
    them all, but for one in 2^(bits/2))."""
    m, _ = math.frexp(abs(v))
    n = int(m * 2.0 ** 53)  # (exact: a double's significand)
    n >>= (n & -n).bit_length() - 1
    return n.bit_length() <= round(-math.log2(UNIT_ROUNDOFF[dtype.name])) // 2


def propagate(e: BinOp | Call | Select | Cast, values: list[Value], errors: list[Value], r: Value) -> Value:
    """The error bound of ``r``, the value of ``e`` on operands ``values`` with bounds ``errors``."""
    a = [np.asarray(v, dtype=np.float64) for v in values]
    if isinstance(e, Select):
        # a surrogate's choice is the exact program's too: the chosen branch's bound
        return np.where(a[0] != 0, errors[1], errors[2]) if _surrogate(e) else _select(a, errors)
    if isinstance(e, BinOp) and e.dtype.is_bool:
        return _boolean(e.op, a, errors)
    if isinstance(e, Call) and e.fn == "not":
        return errors[0]
    if isinstance(e, Cast):
        return _finish(_cast(e, a[0], errors[0], r), r, a, errors, e)
    err = _binop(e, a, errors) if isinstance(e, BinOp) else _call(e, a[0], errors[0])
    if isinstance(e, BinOp) and e.op == "-" and e.a == e.b:
        # one value minus itself: exactly 0 in both the computed and the exact program (each side's error
        # is the same error), not |e_a| + |e_b|
        err = np.where(np.asarray(r, dtype=np.float64) == 0, _ZERO, err)
    if e.dtype.is_float:
        libm = isinstance(e, Call) and e.fn in _LIBM or isinstance(e, BinOp) and e.op == "pow"
        if libm:
            err = err + 2 * LIBM_ULPS * rounding(e.dtype, r)
        elif isinstance(e, BinOp) and e.op in ("+", "-"):
            err = err + rounding(e.dtype, r, underflow=False)
        elif isinstance(e, BinOp) and e.op == "*":
            zero = (a[0] == 0) & (errors[0] == 0) | (a[1] == 0) & (errors[1] == 0)
            err = np.where(zero, _ZERO, err + rounding(e.dtype, r))
        elif not (isinstance(e, Call) and e.fn in _EXACT_CALLS or isinstance(e, BinOp) and e.op in ("max", "min")):
            err = err + rounding(e.dtype, r)
    return _finish(err, r, a, errors, e)


def _finish(err: Value, r: Value, a: list[np.ndarray], errors: list[Value], e: Expr) -> Value:
    """NaN bounds become infinite; a result of exact operands one of which is infinite is exact (IEEE special
    values), and a non-finite result is exact only where it follows from exact operands."""
    err = np.where(np.isnan(err), _INF, err)
    if not e.dtype.is_float:
        return err
    rf = np.asarray(r, dtype=np.float64)
    special = np.bool_(False)
    for x in a:
        special = special | ~np.isfinite(x)
    if not np.any(special | ~np.isfinite(rf)):
        return err
    for ex in errors:
        special = special & (ex == 0)
    err = np.where(special & np.isfinite(rf), _ZERO, err)  # exp(-inf), 1/inf, tanh(inf): exact special values
    bad = ~np.isfinite(rf)
    return np.where(bad, np.where(_exact_nonfinite(e, rf, a, errors), _ZERO, _INF), err)


def _exact_nonfinite(e: Expr, r: np.ndarray, a: list[np.ndarray], errors: list[Value]) -> Value:
    """Where the non-finite ``r`` is what exact arithmetic gives too: its non-finite operands are exact and
    no value of the finite ones within their bounds changes it (``-inf - x``, ``inf·x`` for x away from 0,
    ``x / 0`` for an exact 0, ``exp(inf)``).  An overflow of finite operands is not exact; NaN is exact only
    from exact operands."""
    exact = np.bool_(True)
    some = np.bool_(False)
    for x, ex in zip(a, errors, strict=True):
        infinite = ~np.isfinite(x)
        some = some | infinite
        exact = exact & ~(infinite & (ex > 0)) & np.isfinite(ex)
    if isinstance(e, BinOp) and e.op in ("*", "/"):
        (x, y), (ex, ey) = a, errors
        away = (np.abs(x) > ex) & (np.abs(y) > ey)  # neither operand can be 0 (nor change sign)
        exact = exact & (away | ((ex == 0) & (ey == 0)))
        if e.op == "/":
            some = some | ((y == 0) & (ey == 0))
    all_exact = np.bool_(True)
    for ex in errors:
        all_exact = all_exact & (ex == 0)
    return np.where(np.isnan(r), all_exact, exact & some)


def _cast(e: Cast, x: np.ndarray, ex: Value, r: Value) -> Value:
    """A conversion to a float type rounds (its exact value is its operand's); to an integer it truncates and
    to a boolean it tests for 0, functions whose result jumps."""
    if e.type.is_float:
        return ex + np.abs(np.asarray(r, dtype=np.float64) - x)
    if e.type.is_bool:
        return np.where((ex > 0) & ~(np.abs(x) > ex), _INF, _ZERO)
    return np.where(ex > 0, ex + 1.0, _ZERO)


def _binop(e: BinOp, a: list[np.ndarray], errors: list[Value]) -> Value:
    (x, y), (ex, ey) = a, errors
    op = e.op
    if op in ("+", "-"):
        return ex + ey
    if op == "*":
        return np.abs(x) * ey + np.abs(y) * ex + ex * ey
    if op == "/":
        room = np.abs(y) - ey
        return np.where(room > 0, (ex + np.abs(x / y) * ey) / room, _INF)
    if op in ("max", "min"):
        # the larger bound where the exact operands may compare the other way, else the chosen one's
        first = (x >= y) if op == "max" else (x <= y)
        return np.where(np.abs(x - y) > ex + ey, np.where(first, ex, ey), np.maximum(ex, ey))
    if op == "pow":
        return _power(x, y, ex, ey)
    # floor division and remainder jump: exact only on exact operands
    return np.where((ex > 0) | (ey > 0), _INF, _ZERO)


def _power(x: np.ndarray, y: np.ndarray, ex: Value, ey: Value) -> Value:
    """|x^y - x*^y*| for |x - x*| <= ex, |y - y*| <= ey (mean value theorem on the worse end)."""
    whole = np.isfinite(y) & (y == np.round(y))
    hi = np.abs(x) + ex
    lo = np.abs(x) - ex
    grow = np.abs(y) * np.maximum(hi ** (y - 1), np.where(lo > 0, lo ** (y - 1), _INF)) * ex
    integral = np.where(y >= 1, np.abs(y) * hi ** (y - 1) * ex, np.where(lo > 0, grow, _INF))
    integral = np.where((y == 0) | (ex == 0), _ZERO, integral)
    fractional = np.where((x - ex > 0), grow, _INF)
    fractional = np.where(ex == 0, _ZERO, fractional)
    err = np.where(whole, integral, fractional)
    return err + np.where(ey > 0, np.abs(np.power(x, y) * np.log(np.abs(x))) * ey, _ZERO)


def _call(e: Call, x: np.ndarray, ex: Value) -> Value:
    fn = e.fn
    if fn in ("exp", "exp2"):
        scale = 1.0 if fn == "exp" else np.log(2.0)
        return (np.exp(x * scale) if fn == "exp" else np.exp2(x)) * np.expm1(ex * scale)
    if fn in ("log", "log2"):
        room = x - ex
        err = np.where(room > 0, np.log(x / np.where(room > 0, room, 1.0)), _INF)
        return err / (1.0 if fn == "log" else np.log(2.0))
    if fn == "sqrt":
        return np.sqrt(np.maximum(x, 0.0)) - np.sqrt(np.maximum(x - ex, 0.0))
    if fn == "tanh":
        return np.minimum(ex, 2.0)
    if fn == "sigmoid":
        return np.minimum(0.25 * ex, 1.0)
    if fn in ("floor", "ceil"):
        return np.where(ex > 0, ex + 1.0, _ZERO)
    return ex  # abs, neg


def _boolean(op: str, a: list[np.ndarray], errors: list[Value]) -> Value:
    """A comparison is uncertain where the operands' bounds overlap; ``and``/``or`` where an uncertain
    operand decides."""
    (x, y), (ex, ey) = a, errors
    if op == "and":
        uncertain = (ex > 0) & ((ey > 0) | (y != 0)) | (ey > 0) & (x != 0)
    elif op == "or":
        uncertain = (ex > 0) & ((ey > 0) | (y == 0)) | (ey > 0) & (x == 0)
    else:
        width = ex + ey
        uncertain = (width > 0) & ~(np.abs(x - y) > width)
    return np.where(uncertain, _INF, _ZERO)


def _surrogate(e: Select) -> bool:
    """Whether ``e`` is a repair's surrogate ``select(r == 0 [and …], τ, r)``: a choice of reference point (see the
    module docstring)."""
    r, tiny = e.false_value, e.true_value
    if not (isinstance(tiny, Const) and tiny.dtype.is_float and tiny.dtype.name in _TINY
            and tiny.value == _TINY[tiny.dtype.name]):
        return False
    conds = [e.cond]
    while conds:
        c = conds.pop()
        if isinstance(c, BinOp) and c.op == "and":
            conds += [c.a, c.b]
        elif isinstance(c, BinOp) and c.op == "==" and c.a == r and isinstance(c.b, Const) and c.b.value == 0:
            return True
    return False


def _select(a: list[np.ndarray], errors: list[Value]) -> Value:
    """The chosen branch's bound; where the condition is uncertain the exact value may be the other branch's,
    within ``|chosen - other| + e_other`` of the computed one."""
    (c, t, f), (ec, et, ef) = a, errors
    pick = c != 0
    chosen, other = np.where(pick, t, f), np.where(pick, f, t)
    e_chosen, e_other = np.where(pick, et, ef), np.where(pick, ef, et)
    flip = np.maximum(e_chosen, np.abs(chosen - other) + e_other)
    return np.where(ec > 0, np.where(np.isnan(flip), _INF, flip), e_chosen)


__all__ = ["LIBM_ULPS", "UNDERFLOW", "UNIT_ROUNDOFF", "interpret_with_bounds", "rounding"]
