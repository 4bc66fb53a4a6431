"""The ISL space in which :mod:`~polyfuse.tiling.skip` and :mod:`~polyfuse.tiling.tileeval` decide conditions.

One set of points per loop nest: the iterations of its loops (``v_*``) and the elements of a tile
(``a_*``, one dimension per tile axis), with the program's sizes as parameters (``p_*``).  An affine
condition on loop variables, sizes and iotas (``64*j_0 + iota(ax1) > 32*i_0 + iota(ax0)``) is a set of
these points; a context (where a statement runs, which half of a ``select`` is taken) is another, and
a question about the condition in a context is an inclusion or an emptiness test.  Anything else
raises :class:`NotAffine`, and the callers treat the condition as undecided.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.errors import PolyfuseError
from polyfuse.ir.expr import COMPARE_OPS, BinOp, Call, Const, Expr, Var
from polyfuse.ir.stmt import Loop
from polyfuse.tiling.htile import Broadcast, Iota, Permute, Reduce, Squeeze

_ISL_OPS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "="}


class NotAffine(PolyfuseError):
    """An expression the analysis cannot write as an ISL affine expression."""


class Space:
    """One ISL space for a loop nest: loop variables ``v_*``, tile axes ``a_*``, size parameters ``p_*``."""

    def __init__(self, params: list[str], loops: list[Loop], axes: list[str]):
        self.params = params
        self.loops = loops
        self.loop_vars = [lp.var.name for lp in loops]
        self.axes = axes
        self.dims = [f"v_{n}" for n in self.loop_vars] + [f"a_{a}" for a in axes]
        self.prefix = f"[{', '.join(f'p_{p}' for p in params)}] -> "
        self.universe = isl.Set(f"{self.prefix}{{ [{', '.join(self.dims)}] }}")
        self._renames: dict[tuple, isl.Map] = {}

    def set(self, constraint: str) -> isl.Set:
        return isl.Set(f"{self.prefix}{{ [{', '.join(self.dims)}] : {constraint} }}")

    def term(self, e: Expr) -> str:
        """ISL text of an affine integer expression; NotAffine otherwise."""
        if isinstance(e, Const) and e.dtype.is_int:
            return str(int(e.value))
        if isinstance(e, Var) and e.name in self.loop_vars:
            return f"v_{e.name}"
        if isinstance(e, Var) and e.name in self.params:
            return f"p_{e.name}"
        if isinstance(e, Iota) and e.axis in self.axes:
            return f"a_{e.axis}"
        if isinstance(e, (Broadcast, Permute)):
            return self.term(e.tile)
        if isinstance(e, BinOp) and e.dtype.is_int:
            if e.op in ("+", "-"):
                return f"({self.term(e.a)} {e.op} {self.term(e.b)})"
            if e.op == "*" and (isinstance(e.a, Const) or isinstance(e.b, Const)):
                return f"({self.term(e.a)} * {self.term(e.b)})"
            if e.op in ("//", "%") and isinstance(e.b, Const) and int(e.b.value) > 0:
                a, d = self.term(e.a), int(e.b.value)
                return f"floor(({a})/{d})" if e.op == "//" else f"(({a}) mod {d})"
            if e.op in ("min", "max"):
                return f"{e.op}({self.term(e.a)}, {self.term(e.b)})"
        raise NotAffine(type(e).__name__)

    def condition(self, e: Expr, sizes: dict[str, int]) -> isl.Set | None:
        """The points where the boolean tile ``e`` holds, or None when it is not affine."""
        try:
            return self._condition(e, sizes)
        except NotAffine:
            return None

    def _condition(self, e: Expr, sizes: dict[str, int]) -> isl.Set:
        if isinstance(e, Const) and e.dtype.is_bool:
            return self.universe if e.value else self.universe.subtract(self.universe)
        if isinstance(e, (Broadcast, Permute)):
            return self._condition(e.tile, sizes)
        if isinstance(e, Call) and e.fn == "not":
            return self.universe.subtract(self._condition(e.args[0], sizes))
        if isinstance(e, BinOp) and e.op in ("and", "or"):
            a, b = self._condition(e.a, sizes), self._condition(e.b, sizes)
            return a.intersect(b) if e.op == "and" else a.union(b)
        if isinstance(e, BinOp) and e.op in COMPARE_OPS and e.a.dtype.is_int:
            a, b = self.term(e.a), self.term(e.b)
            if e.op == "!=":
                return self.universe.subtract(self.set(f"{a} = {b}"))
            return self.set(f"{a} {_ISL_OPS[e.op]} {b}")
        if isinstance(e, Reduce) and e.op == "or" and e.axis in sizes:
            return self.free(self._condition(e.tile, sizes).intersect(self.box({e.axis: sizes[e.axis]})), e.axis)
        if isinstance(e, Squeeze) and e.axis in self.axes:
            return self.free(self._condition(e.tile, sizes).intersect(self.set(f"a_{e.axis} = 0")), e.axis)
        raise NotAffine(type(e).__name__)

    def free(self, s: isl.Set, axis: str) -> isl.Set:
        """``s`` with the constraints on ``axis`` projected away (the dimension stays, unconstrained)."""
        return s.eliminate(isl.dim_type.set, self.dims.index(f"a_{axis}"), 1)

    def box(self, sizes: dict[str, int]) -> isl.Set:
        parts = [f"0 <= a_{a} < {n}" for a, n in sizes.items() if a in self.axes]
        return self.set(" and ".join(parts)) if parts else self.universe

    def iterations(self, depth: int | None = None) -> isl.Set:
        """The iterations of the loop nest, or of its ``depth`` outermost loops (the others and the axes free)."""
        loops = self.loops[:depth]
        if not loops:
            return self.universe
        return self.set(" and ".join(f"0 <= v_{lp.var.name} < {self.term(lp.extent)}" for lp in loops))

    def decide(self, cond: isl.Set, ctx: isl.Set) -> bool | None:
        if ctx.is_subset(cond):
            return True
        if ctx.intersect(cond).is_empty():
            return False
        return None

    def equal(self, a: Expr, b: Expr, ctx: isl.Set) -> bool:
        if a == b:
            return True
        try:
            return ctx.is_subset(self.set(f"{self.term(a)} = {self.term(b)}"))
        except NotAffine:
            return False

    def rename(self, s: isl.Set, pairs: dict[str, str]) -> isl.Set:
        """``s`` over tile axes renamed ``old -> new`` (the other axes unconstrained)."""
        key = tuple(sorted(pairs.items()))
        if key not in self._renames:
            ins = [f"{d}_" for d in self.dims]
            eqs = [f"v_{n} = v_{n}_" for n in self.loop_vars] + [f"a_{new} = a_{old}_" for old, new in key]
            self._renames[key] = isl.Map(f"{self.prefix}{{ [{', '.join(ins)}] -> [{', '.join(self.dims)}] : "
                                         f"{' and '.join(eqs)} }}")
        return s.apply(self._renames[key])
