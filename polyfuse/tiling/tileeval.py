"""Abstract evaluation of one iteration of a loop body of tile statements (for :mod:`~polyfuse.tiling.skip`).

Each tile value is abstracted by one fact that holds for every element:

* :class:`Known` — every element is one constant (``-INF``, ``0.0``, ``True`` …);
* :class:`Start` — every element is ``tensor[index]`` as it was when the iteration began;
* :class:`Unknown` — anything, depending at most on the start values of ``deps``, and
  ``finite`` when it is known to be neither infinite nor NaN.

Each statement is evaluated in a *context*, an ISL set of loop iterations and tile elements
(:class:`~polyfuse.tiling.space.Space`): affine conditions are decided in it, a ``select`` on an
affine condition evaluates its branches in the two halves, a store's mask narrows it, a
reduction frees its axis.  A ``select`` on ``x == -INF`` evaluates its other branch knowing
that ``x`` is finite.  Every store becomes a :class:`Layer` of its tensor; a later load finds
the value through the layers when its index is the store's up to renaming tile axes, and is
otherwise :class:`Unknown` and dependent on the tensor.

The rules are exact for the values the assumption of :mod:`~polyfuse.tiling.skip` allows
(finite inputs, no overflow, no NaN read from a previous iteration): ``x + 0 = x``,
``max(x, -INF) = x``, ``-INF - m = -INF`` and ``exp(-INF) = 0`` for a finite ``m``,
``0·v = 0`` and ``acc + Σ 0·v = acc`` for a finite ``v``, ``x == x`` for the start value of a tensor.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import islpy as isl

from polyfuse.errors import InternalError, PolyfuseError
from polyfuse.ir.expr import COMPARE_OPS, BinOp, Call, Cast, Const, Expr, Select, Var
from polyfuse.ir.stmt import INPUT
from polyfuse.tiling.htile import (
    Broadcast, Dot, Index, Iota, Permute, Reduce, Slice, Squeeze, TileLoad, TileProgram, TileStore, axis_sizes,
    walk_tile_expr,
)
from polyfuse.tiling.space import Space


class GiveUp(PolyfuseError):
    """A loop body outside what the analysis handles (the loop is then left as it was)."""


@dataclass(frozen=True)
class Known:
    value: float | int | bool


@dataclass(frozen=True)
class Start:
    tensor: str
    index: tuple[Index, ...]


@dataclass(frozen=True)
class Unknown:
    deps: frozenset[str]
    finite: bool


Value = Known | Start | Unknown
Fact = tuple[str, tuple[Index, ...]]
"""``tensor[index]`` at the start of the iteration is not -INF (so, by the assumption, finite)."""

_NONE: frozenset[str] = frozenset()
_SPECIAL = (0.0, 1.0, -1.0, math.inf, -math.inf)
_REDUCER_OPS = {"sum": "+", "prod": "*", "max": "max", "min": "min"}
_FOLD = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "max": max, "min": min,
         "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
         "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "and": lambda a, b: a and b,
         "or": lambda a, b: a or b}
_EXACT_CALLS = {("exp", -math.inf): 0.0, ("exp", 0.0): 1.0, ("exp2", -math.inf): 0.0, ("exp2", 0.0): 1.0,
                ("tanh", 0.0): 0.0, ("sigmoid", -math.inf): 0.0}
_FINITE_CALLS = ("exp", "exp2", "tanh", "sigmoid", "neg", "abs", "floor", "ceil")


@dataclass(frozen=True)
class Layer:
    """One store into a tensor: its index, where it stores, the value and whether that is the start value."""

    index: tuple[Index, ...]
    partial: bool
    where: isl.Set | None
    value: Value
    deps: frozenset[str]
    unchanged: bool


def deps(v: Value) -> frozenset[str]:
    if isinstance(v, Start):
        return frozenset({v.tensor})
    return v.deps if isinstance(v, Unknown) else _NONE


def carried(layers: dict[str, list[Layer]], roots: set[str]) -> set[str]:
    """``roots`` and every tensor whose start value one of them depends on, transitively."""
    keep, todo = set(roots), list(roots)
    while todo:
        for layer in layers.get(todo.pop(), []):
            for d in layer.deps - keep:
                keep.add(d)
                todo.append(d)
    return keep


class TileEvaluator:
    """One evaluation of a loop body in a context (see the module docstring)."""

    def __init__(self, space: Space, program: TileProgram):
        self.space = space
        self.inputs = {t.name for t in program.tensors if t.role == INPUT}
        self.layers: dict[str, list[Layer]] = {}
        self.written: set[str] = set()
        self.sizes: dict[str, int] = {}
        self.conditions: dict[int, isl.Set | None] = {}

    def run(self, stores: list[TileStore], base: isl.Set) -> dict[str, list[Layer]]:
        self.written = {s.tensor.name for s in stores}
        for s in stores:
            self.store(s, base)
        return self.layers

    def store(self, s: TileStore, base: isl.Set) -> None:
        self.check_index(s.tensor.name, s.index)
        self.sizes, self.conditions = store_sizes(s), {}
        ctx = base.intersect(self.space.box(self.sizes))
        partial, where, mask_deps = False, None, _NONE
        if s.mask is not None:
            where = self.condition(s.mask)
            decided = None if where is None else self.space.decide(where, ctx)
            if decided is False:
                return
            if decided is True:
                where = None
            else:
                partial = True
                if where is not None:
                    ctx = ctx.intersect(where)
                else:
                    mask_deps = deps(self.expr(s.mask, ctx, ()))
        value = self.expr(s.value, ctx, ())
        if s.reducer is not None:
            value = self.binary(_REDUCER_OPS[s.reducer], self.lookup(s.tensor.name, s.index, ctx), value, ctx, ())
        unchanged = self.same(value, Start(s.tensor.name, s.index), ctx)
        layer = Layer(s.index, partial, where, value, deps(value) | mask_deps, unchanged)
        self.layers.setdefault(s.tensor.name, []).append(layer)

    # ------------------------------------------------------------ memory
    def lookup(self, name: str, index: tuple[Index, ...], ctx: isl.Set) -> Value:
        """The value of ``name[index]``: through this iteration's stores, else its start value."""
        layers = self.layers.get(name, [])
        result: Value = Start(name, index)
        for layer in layers:
            pairs = self.match(layer.index, index, ctx)
            if pairs is None:
                return Unknown(frozenset({name}).union(*(x.deps for x in layers)), False)
            value = _renamed(layer.value, pairs)
            if not layer.partial:
                result = value
                continue
            decided = None if layer.where is None else self.space.decide(self.space.rename(layer.where, pairs), ctx)
            if decided is True:
                result = value
            elif decided is None:
                result = self.join(value, result, ctx, (), layer.deps)
        return result

    def match(self, stored: tuple[Index, ...], loaded: tuple[Index, ...], ctx: isl.Set) -> dict[str, str] | None:
        """The renaming of tile axes under which ``loaded`` is the index ``stored``, or None."""
        if len(stored) != len(loaded):
            return None
        pairs: dict[str, str] = {}
        for s, x in zip(stored, loaded, strict=True):
            if isinstance(s, Slice) and isinstance(x, Slice):
                if s.size != x.size or not self.space.equal(s.start, x.start, ctx):
                    return None
                if pairs.setdefault(s.axis, x.axis) != x.axis:
                    return None
            elif isinstance(s, Slice) or isinstance(x, Slice) or not self.space.equal(s, x, ctx):
                return None
        return pairs if len(set(pairs.values())) == len(pairs) else None

    def same(self, a: Value, b: Value, ctx: isl.Set) -> bool:
        if isinstance(a, Known) and isinstance(b, Known):
            return a.value == b.value
        if isinstance(a, Start) and isinstance(b, Start) and a.tensor == b.tensor:
            pairs = self.match(a.index, b.index, ctx)
            return pairs is not None and all(k == v for k, v in pairs.items())
        return False

    def finite(self, v: Value, facts: tuple[Fact, ...], ctx: isl.Set) -> bool:
        if isinstance(v, Known):
            return math.isfinite(v.value)
        if isinstance(v, Start):
            return any(self.same(v, Start(*f), ctx) for f in facts)
        return v.finite

    def join(self, a: Value, b: Value, ctx: isl.Set, facts: tuple[Fact, ...], extra: frozenset[str]) -> Value:
        if self.same(a, b, ctx):
            return a
        return Unknown(deps(a) | deps(b) | extra, self.finite(a, facts, ctx) and self.finite(b, facts, ctx))

    # ------------------------------------------------------------ expressions
    def condition(self, e: Expr) -> isl.Set | None:
        if id(e) not in self.conditions:
            self.conditions[id(e)] = self.space.condition(e, self.sizes)
        return self.conditions[id(e)]

    def enter(self, ctx: isl.Set, axis: str, *, squeeze: bool = False) -> isl.Set:
        """The context inside a reduction (or squeeze) of ``axis``: every value of it (or 0)."""
        if axis not in self.sizes:
            raise GiveUp(f"axis {axis} of unknown size")
        bound = self.space.set(f"a_{axis} = 0") if squeeze else self.space.box({axis: self.sizes[axis]})
        return self.space.free(ctx, axis).intersect(bound)

    def expr(self, e: Expr, ctx: isl.Set, facts: tuple[Fact, ...]) -> Value:
        if isinstance(e, Const):
            return Known(e.value)
        if e.dtype.is_bool and not isinstance(e, TileLoad):
            where = self.condition(e)
            if where is not None:
                decided = self.space.decide(where, ctx)
                return Unknown(_NONE, True) if decided is None else Known(decided)
        if isinstance(e, (Var, Iota)):
            return Unknown(_NONE, True)
        if isinstance(e, TileLoad):
            return self.load(e, ctx, facts)
        if isinstance(e, (Broadcast, Permute)):
            return self.expr(e.tile, ctx, facts)
        if isinstance(e, (Squeeze, Reduce)):
            inner_ctx, inner_facts = self.enter(ctx, e.axis, squeeze=isinstance(e, Squeeze)), _drop(facts, e.axis)
            x = self.expr(e.tile, inner_ctx, inner_facts)
            if isinstance(x, Known) and (isinstance(e, Squeeze) or _reduces_to_itself(e.op, x.value)):
                return x
            return Unknown(deps(x), self.finite(x, inner_facts, inner_ctx))
        if isinstance(e, Dot):
            return self.dot(e, ctx, facts)
        if isinstance(e, BinOp):
            return self.binary(e.op, self.expr(e.a, ctx, facts), self.expr(e.b, ctx, facts), ctx, facts)
        if isinstance(e, Call):
            return self.call(e.fn, self.expr(e.args[0], ctx, facts), ctx, facts)
        if isinstance(e, Cast):
            x = self.expr(e.value, ctx, facts)
            if isinstance(x, Known) and x.value in _SPECIAL:  # exact in every type
                if e.type.is_bool or e.type.is_float:
                    return Known(bool(x.value) if e.type.is_bool else float(x.value))
                if math.isfinite(x.value):
                    return Known(int(x.value))
            return Unknown(deps(x), self.finite(x, facts, ctx))
        if isinstance(e, Select):
            return self.select(e, ctx, facts)
        raise GiveUp(f"cannot evaluate {type(e).__name__}")

    def check_index(self, name: str, index: tuple[Index, ...]) -> None:
        """GiveUp where an index reads a tensor the loop writes (a gather whose dependences are not tracked)."""
        for i in index:
            for n in walk_tile_expr(i.start if isinstance(i, Slice) else i):
                if isinstance(n, TileLoad) and n.tensor.name in self.written:
                    raise GiveUp(f"an index of {name} reads {n.tensor.name}, which the loop writes")

    def load(self, e: TileLoad, ctx: isl.Set, facts: tuple[Fact, ...]) -> Value:
        self.check_index(e.tensor.name, e.index)
        if e.mask is None:
            return self.element(e, ctx)
        other = Known(e.other.value if e.other is not None else 0)
        where = self.condition(e.mask)
        if where is not None:
            decided = self.space.decide(where, ctx)
            if decided is False:
                return other
            value = self.element(e, ctx.intersect(where))
            return value if decided else self.join(value, other, ctx, facts, _NONE)
        mask = self.expr(e.mask, ctx, facts)
        if isinstance(mask, Known):
            return self.element(e, ctx) if mask.value else other
        return self.join(self.element(e, ctx), other, ctx, facts, deps(mask))

    def element(self, e: TileLoad, ctx: isl.Set) -> Value:
        if e.tensor.name not in self.written:
            return Unknown(_NONE, e.tensor.name in self.inputs)  # the assumption: inputs are finite
        return self.lookup(e.tensor.name, e.index, ctx)

    def dot(self, e: Dot, ctx: isl.Set, facts: tuple[Fact, ...]) -> Value:
        inner_ctx, inner_facts = self.enter(ctx, e.axis), _drop(facts, e.axis)
        a, b = self.expr(e.a, inner_ctx, inner_facts), self.expr(e.b, inner_ctx, inner_facts)
        acc = self.expr(e.acc, ctx, facts)
        fa, fb = self.finite(a, inner_facts, inner_ctx), self.finite(b, inner_facts, inner_ctx)
        if (_is(a, 0.0) and fb) or (_is(b, 0.0) and fa):
            return acc
        return Unknown(deps(a) | deps(b) | deps(acc), fa and fb and self.finite(acc, facts, ctx))

    def binary(self, op: str, a: Value, b: Value, ctx: isl.Set, facts: tuple[Fact, ...]) -> Value:
        fa, fb = self.finite(a, facts, ctx), self.finite(b, facts, ctx)
        if isinstance(a, Known) and isinstance(b, Known) and op in _FOLD and _foldable(a.value, b.value):
            return Known(_FOLD[op](a.value, b.value))
        if op == "+":
            if _is(a, 0.0) or _is(b, 0.0):
                return b if _is(a, 0.0) else a
            if (_is(a, -math.inf) and fb) or (_is(b, -math.inf) and fa):
                return Known(-math.inf)
        elif op == "-":
            if _is(b, 0.0):
                return a
            if _is(a, -math.inf) and fb:
                return a
            if fa and self.same(a, b, ctx):
                return Known(0.0)
        elif op == "*":
            if (_is(a, 0.0) and fb) or (_is(b, 0.0) and fa):
                return a if _is(a, 0.0) else b
            if _is(a, 1.0) or _is(b, 1.0):
                return b if _is(a, 1.0) else a
        elif op == "/" and _is(b, 1.0):
            return a
        elif op in ("max", "min"):
            identity = -math.inf if op == "max" else math.inf
            if _is(a, identity) or _is(b, identity):
                return b if _is(a, identity) else a
            if self.same(a, b, ctx):
                return a
        elif op in ("and", "or"):
            for x, y in ((a, b), (b, a)):
                if isinstance(x, Known):
                    return y if bool(x.value) == (op == "and") else x
        elif op in COMPARE_OPS and self.same(a, b, ctx) and _not_nan(a):
            return Known(op in ("==", "<=", ">="))
        bool_valued = op in COMPARE_OPS or op in ("and", "or")
        return Unknown(deps(a) | deps(b), bool_valued or (op in ("+", "-", "*", "max", "min") and fa and fb))

    def call(self, fn: str, x: Value, ctx: isl.Set, facts: tuple[Fact, ...]) -> Value:
        if isinstance(x, Known):
            if fn == "not":
                return Known(not x.value)
            if fn in ("neg", "abs") and isinstance(x.value, float):
                return Known(-x.value if fn == "neg" else abs(x.value))
            if (fn, x.value) in _EXACT_CALLS:
                return Known(_EXACT_CALLS[(fn, x.value)])
        return Unknown(deps(x), fn == "not" or (fn in _FINITE_CALLS and self.finite(x, facts, ctx)))

    def select(self, e: Select, ctx: isl.Set, facts: tuple[Fact, ...]) -> Value:
        split = self.split_affine(e)
        if split is not None:
            return self.select(split, ctx, facts)
        where = self.condition(e.cond)
        if where is not None:
            inside, outside = ctx.intersect(where), ctx.subtract(where)
            if outside.is_empty():
                return self.expr(e.true_value, inside, facts)
            if inside.is_empty():
                return self.expr(e.false_value, outside, facts)
            return self.join(self.expr(e.true_value, inside, facts), self.expr(e.false_value, outside, facts),
                             ctx, facts, _NONE)
        cond = self.expr(e.cond, ctx, facts)
        if isinstance(cond, Known):
            return self.expr(e.true_value if cond.value else e.false_value, ctx, facts)
        true_facts = false_facts = facts
        test = self.infinity_test(self.decided_parts(e.cond, ctx), ctx, facts)
        if test is not None:
            fact, when_true = test
            if when_true:
                false_facts = (*facts, fact)
            else:
                true_facts = (*facts, fact)
        return self.join(self.expr(e.true_value, ctx, true_facts), self.expr(e.false_value, ctx, false_facts),
                         ctx, facts, deps(cond))

    def split_affine(self, e: Select) -> Select | None:
        """``select(A or B, t, f)`` as ``select(A, t, select(B, t, f))`` (``and`` alike) when only A is
        affine, so that A splits the context as an affine condition does; None otherwise."""
        cond = e.cond
        while isinstance(cond, (Broadcast, Permute)):
            cond = cond.tile
        if not (isinstance(cond, BinOp) and cond.op in ("and", "or")) or self.condition(cond) is not None:
            return None
        for a, b in ((cond.a, cond.b), (cond.b, cond.a)):
            if self.condition(a) is not None:
                if cond.op == "or":
                    return Select(a, e.true_value, Select(b, e.true_value, e.false_value))
                return Select(a, Select(b, e.true_value, e.false_value), e.false_value)
        return None

    def decided_parts(self, cond: Expr, ctx: isl.Set) -> Expr:
        """``cond`` with each operand of ``and``/``or`` that is affine and decided in ``ctx`` folded away
        (``x == -INF and not last`` is ``x == -INF`` where the iteration is not the last)."""
        if isinstance(cond, (Broadcast, Permute)):
            return self.decided_parts(cond.tile, ctx)
        if not (isinstance(cond, BinOp) and cond.op in ("and", "or")):
            return cond
        parts = [self.decided_parts(x, ctx) for x in (cond.a, cond.b)]
        for k, part in enumerate(parts):
            where = self.condition(part)
            decided = None if where is None else self.space.decide(where, ctx)
            if decided is not None and decided == (cond.op == "and"):
                return parts[1 - k]
        return cond

    def infinity_test(self, cond: Expr, ctx: isl.Set, facts: tuple[Fact, ...]) -> tuple[Fact, bool] | None:
        """For ``x == -INF`` (``!=``, negated) with ``x`` a start value: that fact, and whether true means -INF."""
        negated = False
        while isinstance(cond, (Broadcast, Permute)) or (isinstance(cond, Call) and cond.fn == "not"):
            if isinstance(cond, Call):
                negated, cond = not negated, cond.args[0]
            else:
                cond = cond.tile
        if not (isinstance(cond, BinOp) and cond.op in ("==", "!=")):
            return None
        for x, y in ((cond.a, cond.b), (cond.b, cond.a)):
            if isinstance(y, Const) and y.value == -math.inf:
                v = self.expr(x, ctx, facts)
                if isinstance(v, Start):
                    return (v.tensor, v.index), (cond.op == "==") != negated
        return None


def store_sizes(s: TileStore) -> dict[str, int]:
    """The size of every tile axis named in ``s``; GiveUp if one name has two sizes."""
    try:
        return axis_sizes(s)
    except InternalError as err:
        raise GiveUp(str(err)) from None


def _renamed(v: Value, pairs: dict[str, str]) -> Value:
    if not isinstance(v, Start):
        return v
    index = tuple(dataclasses.replace(i, axis=pairs.get(i.axis, i.axis)) if isinstance(i, Slice) else i
                  for i in v.index)
    return Start(v.tensor, index)


def _drop(facts: tuple[Fact, ...], axis: str) -> tuple[Fact, ...]:
    """The facts that still hold inside a reduction over ``axis`` (those that do not name it)."""
    return tuple(f for f in facts if not any(isinstance(i, Slice) and i.axis == axis for i in f[1]))


def _is(v: Value, x: float) -> bool:
    return isinstance(v, Known) and not isinstance(v.value, bool) and v.value == x


def _not_nan(v: Value) -> bool:
    """Start values are not NaN by the assumption; unknown ones only when finite."""
    if isinstance(v, Known):
        return not (isinstance(v.value, float) and math.isnan(v.value))
    return isinstance(v, Start) or v.finite


def _foldable(a: float | int | bool, b: float | int | bool) -> bool:
    """Constants whose operations are exact in every float type (other values would need the node's rounding)."""
    return all(isinstance(x, (bool, int)) or x in _SPECIAL for x in (a, b))


def _reduces_to_itself(op: str, v: float | int | bool) -> bool:
    """Whether ``op`` over any number of copies of ``v`` is ``v``."""
    if op in ("max", "min", "or"):
        return True
    if op == "sum":
        return v == 0 or (isinstance(v, float) and math.isinf(v))
    return op == "prod" and v in (0, 1)
