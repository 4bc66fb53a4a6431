"""Existential masks to scalar tests: ``reduce_or`` over an affine condition, solved with ISL.

Fusion leaves tests such as "is this the first element of the reduction" in tile programs as
``reduce_or(iota(d) == 0 ∧ rows_in_bounds ∧ cols_in_bounds, d)``.  Evaluated as written, that
is a reduction per output element; on a GPU it costs as much as the tile product beside it.
It is a quantifier: ``∃ d ∈ [0, size): c(d)``.  :func:`simplify_tiles` rewrites it exactly:

1. the conjuncts of ``c`` that do not depend on ``d`` leave the quantifier (their broadcast
   over ``d`` is dropped);
2. the conjuncts left must be affine comparisons of ``iota(d)`` and scalars (loop variables,
   size parameters); ISL projects ``d`` out of ``{ d : 0 <= d < size ∧ c(d) }`` and the result,
   a condition on the scalars, is turned back into an expression (a disjunction of conjunctions
   of affine comparisons, ``True`` or ``False``).

Anything else is left as it was.  Example (``j_0`` a loop variable, tiles of 16)::

    reduce_or((16*j_0 + iota(j_1:16)) == 0 ∧ broadcast(rows_ok, [i_1, j_1]), j_1)
      →  rows_ok ∧ (j_0 == 0)
"""

from __future__ import annotations

import dataclasses

import islpy as isl

from polyfuse.errors import NonAffineIndex
from polyfuse.ir import dtypes as dt
from polyfuse.ir.affine import from_linear_form, linear_form
from polyfuse.ir.expr import BinOp, Const, Expr, Var
from polyfuse.ir.stmt import Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Broadcast, Iota, Reduce, Slice, TileLoad, TileProgram, TileStore, axes_of, depends_on, map_tile_expr, tile_children,
)

_COMPARISONS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "="}
_PLACEHOLDER = "pf_quantified"


def simplify_tiles(program: TileProgram) -> TileProgram:
    """``program`` with every solvable ``reduce_or`` replaced by its quantifier-free form."""
    def expr(e: Expr) -> Expr:
        return map_tile_expr(e, _rewrite)

    def walk(s: Stmt) -> Stmt:
        if isinstance(s, Seq):
            return Seq(tuple(walk(c) for c in s.stmts))
        if isinstance(s, Loop):
            return s.replace(body=walk(s.body))
        if isinstance(s, TileStore):
            return dataclasses.replace(s, value=expr(s.value), mask=None if s.mask is None else expr(s.mask))
        return s

    return dataclasses.replace(program, body=walk(program.body))


def _rewrite(e: Expr) -> Expr | None:
    if not (isinstance(e, Reduce) and e.op == "or"):
        return None
    inner = map_tile_expr(e.tile, _rewrite)
    terms = _conjuncts(inner)
    free = [t for t in terms if not depends_on(t, e.axis)]
    bound = [t for t in terms if depends_on(t, e.axis)]
    kept = []
    for t in free:
        dropped = _drop_axis(t, e.axis)
        if dropped is None:
            return None
        kept.append(dropped)
    size = _axis_size(e)
    condition = _exists(bound, e.axis, size) if bound else Const(True, dt.bool_)
    if condition is None:
        return None
    if condition == Const(False, dt.bool_):
        kept = [condition]
    elif condition != Const(True, dt.bool_):
        kept.append(condition)
    out: Expr = kept[0] if kept else Const(True, dt.bool_)
    for t in kept[1:]:
        out = BinOp("and", out, t)
    axes = axes_of(e)
    if len(axes_of(out)) < len(axes):
        sizes = _sizes_of(e)
        out = Broadcast(out, tuple((a, sizes[a]) for a in axes))
    return out


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, BinOp) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)
    if isinstance(e, Broadcast) and isinstance(e.tile, BinOp) and e.tile.op == "and":
        return [Broadcast(t, e.axes) if axes_of(t) else t for t in _conjuncts(e.tile)]
    return [e]


def _drop_axis(t: Expr, axis: str) -> Expr | None:
    """``t`` (constant along ``axis``) without ``axis``; None when that cannot be done structurally."""
    if axis not in axes_of(t):
        return t
    if isinstance(t, Broadcast) and axis not in axes_of(t.tile):
        axes = tuple((a, n) for a, n in t.axes if a != axis)
        return t.tile if tuple(a for a, _ in axes) == axes_of(t.tile) else Broadcast(t.tile, axes)
    if isinstance(t, BinOp):
        a, b = _drop_axis(t.a, axis), _drop_axis(t.b, axis)
        return None if a is None or b is None else BinOp(t.op, a, b)
    return None


def _sizes_of(e: Expr) -> dict[str, int]:
    sizes: dict[str, int] = {}
    stack = [e]
    while stack:
        n = stack.pop()
        if isinstance(n, Iota):
            sizes[n.axis] = n.size
        elif isinstance(n, Broadcast):
            sizes.update(dict(n.axes))
        elif isinstance(n, TileLoad):
            sizes.update({i.axis: i.size for i in n.index if isinstance(i, Slice)})
        stack.extend(tile_children(n))
    return sizes


def _axis_size(e: Reduce) -> int:
    return _sizes_of(e.tile)[e.axis]


def _exists(terms: list[Expr], axis: str, size: int) -> Expr | None:
    """``∃ axis ∈ [0, size): ∧ terms`` as a scalar expression, or None if a term is not affine."""
    constraints, params = [], set()
    for t in terms:
        core = t.tile if isinstance(t, Broadcast) else t
        if not (isinstance(core, BinOp) and core.op in _COMPARISONS):
            return None
        try:
            form = _form(BinOp("-", core.a, core.b), axis)
        except (NonAffineIndex, _NotScalar):
            return None
        if any(not isinstance(k, (str, int)) for k in form):
            return None
        params |= {k for k in form if isinstance(k, str) and k != _PLACEHOLDER}
        constraints.append(f"{_isl_text(form)} {_COMPARISONS[core.op]} 0")
    names = sorted(params)
    text = (f"[{', '.join(names)}] -> {{ [{_PLACEHOLDER}] : 0 <= {_PLACEHOLDER} < {size} and "
            f"{' and '.join(constraints)} }}")
    projected = isl.Set(text).project_out(isl.dim_type.set, 0, 1).coalesce()
    if projected.is_empty():
        return Const(False, dt.bool_)
    if projected.plain_is_universe():
        return Const(True, dt.bool_)
    disjuncts = []
    for bset in projected.get_basic_sets():
        parts = []
        for c in bset.get_constraints():
            form = {names[i]: int(c.get_coefficient_val(isl.dim_type.param, i).to_python())
                    for i in range(len(names))}
            form = {k: v for k, v in form.items() if v}
            constant = int(c.get_constant_val().to_python())
            if constant:
                form[1] = constant
            op = "==" if c.is_equality() else ">="
            parts.append(BinOp(op, from_linear_form(form, dt.i32), Const(0, dt.i32)))
        if not parts:
            return Const(True, dt.bool_)
        conj = parts[0]
        for p in parts[1:]:
            conj = BinOp("and", conj, p)
        disjuncts.append(conj)
    out = disjuncts[0]
    for d in disjuncts[1:]:
        out = BinOp("or", out, d)
    return out


class _NotScalar(Exception):
    pass


def _form(e: Expr, axis: str) -> dict:
    """The linear form of ``e`` with ``iota(axis)`` as a variable; other tile nodes are refused."""
    def place(n: Expr) -> Expr | None:
        if isinstance(n, Iota):
            if n.axis != axis:
                raise _NotScalar
            return Var(_PLACEHOLDER, dt.i32)
        if isinstance(n, (Broadcast, Reduce, TileLoad)):
            raise _NotScalar
        return None

    return linear_form(map_tile_expr(e, place))


def _isl_text(form: dict) -> str:
    parts = []
    for k, c in form.items():
        parts.append(str(c) if k == 1 else f"{c}*{k}")
    return " + ".join(parts) if parts else "0"
