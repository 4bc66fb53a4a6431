"""The values of a fragment loop's statements (:mod:`polyfuse.emit_cpp.fragments`), rewritten for less work per
element and taken apart for where they are computed.

Each rewrite is equal to the program in IEEE arithmetic: a rolling update's first-iteration select folded into
the registers' initial value and ``select(p, x, f·x)`` as ``x·select(p, 1, f)`` (:func:`rewrite`); a statement's
masks resolved under a scalar guard that proves every element of the tile unmasked (:func:`mask_free`).  The
parts of a value that depend only on its row are computed once per row (:func:`row_parts`), the reductions
before the elements (:func:`reductions`).  Kept apart from the loop's plan so that what a value *is* and where a
loop *keeps* it are decided in separate places.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from polyfuse.emit_cpp.cfamily import CHEAP_CALLS
from polyfuse.errors import NonAffineIndex
from polyfuse.ir.affine import from_linear_form, linear_form
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Select, Var
from polyfuse.tiling.htile import (
    Broadcast, Dot, Iota, Permute, Reduce, TileLoad, TileStore, axes_of, depends_on, expr_axis_sizes, map_tile_expr,
    tile_children, walk_tile_expr,
)


def store_exprs(s: TileStore) -> list[Expr]:
    return [s.value, *([s.mask] if s.mask is not None else [])]


def mask_free(value: Expr, sizes: Mapping[str, int]) -> tuple[Expr, Expr] | None:
    """``value`` with its masks resolved, and the scalar condition (of the loop and grid variables) under which
    that is ``value`` at every element of the tile; None where it has no mask whose condition is an affine
    comparison of the tile's axes.  A mask is a select with a constant on one side; it resolves to the other
    side, the live value.  The condition is exact arithmetic on the comparison's extremes over the tile
    (:func:`uniform`), so the fast path is taken only where it is the program."""
    guards: list[Expr] = []

    def resolve(n: Expr) -> Expr | None:
        if isinstance(n, (Reduce, Dot)):
            return n  # (computed before the elements: left as they are)
        if not isinstance(n, Select):
            return None
        constants = [constant(n.true_value) is not None, constant(n.false_value) is not None]
        if constants[0] == constants[1]:
            return None
        live_if = not constants[0]  # the live side is taken where the condition is live_if
        guard = uniform(n.cond, live_if, sizes)
        if guard is None:
            return None
        guards.append(guard)
        return map_tile_expr(n.true_value if live_if else n.false_value, resolve)

    fast = map_tile_expr(value, resolve)
    if not guards:
        return None
    condition = guards[0]
    for g in guards[1:]:
        condition = BinOp("and", condition, g)
    return condition, fast


def constant(x: Expr) -> Const | None:
    """The constant ``x`` is (possibly broadcast or permuted), else None."""
    while isinstance(x, (Broadcast, Permute)):
        x = x.tile
    return x if isinstance(x, Const) else None


_FLIP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def uniform(cond: Expr, truth: bool, sizes: Mapping[str, int]) -> Expr | None:
    """A scalar condition under which ``cond`` is ``truth`` at every element of the tile (tile axes of
    ``sizes``), or None: comparisons of affine integer expressions of the tile axes and scalars, under ``and``,
    ``or`` and ``not``."""
    if isinstance(cond, Broadcast):
        return uniform(cond.tile, truth, sizes)
    if isinstance(cond, Call) and cond.fn == "not":
        return uniform(cond.args[0], not truth, sizes)
    if isinstance(cond, BinOp) and cond.op in ("and", "or"):
        a, b = uniform(cond.a, truth, sizes), uniform(cond.b, truth, sizes)
        if (cond.op == "and") == truth:  # all parts must be so
            return None if a is None or b is None else BinOp("and", a, b)
        return a if b is None else b if a is None else BinOp("or", a, b)
    if not (isinstance(cond, BinOp) and cond.op in _FLIP):
        return None
    op = cond.op if truth else _FLIP[cond.op]
    difference = scalar(BinOp("-", cond.a, cond.b))
    if difference is None:
        return None
    try:
        form = linear_form(difference)
    except NonAffineIndex:
        return None
    # d = lhs - rhs must satisfy ``d op 0`` at every element: at its smallest over the tile for > and >=, at its
    # largest for < and <=.
    smallest = op in (">", ">=")
    bound: dict = {}
    for atom, c in form.items():
        if isinstance(atom, str) and atom.startswith("pf_axis_"):
            size = sizes[atom[len("pf_axis_"):]]
            if (c < 0) == smallest:
                bound[1] = bound.get(1, 0) + c * (size - 1)
        elif not isinstance(atom, str) and atom != 1:
            return None  # a floor or modulo atom of the axes: no simple extreme
        else:
            bound[atom] = bound.get(atom, 0) + c
    bound = {k: v for k, v in bound.items() if v}
    return BinOp(op, from_linear_form(bound, difference.dtype), Const(0, difference.dtype))


def scalar(x: Expr) -> Expr | None:
    """``x`` (integer index arithmetic of tile axes) as a scalar expression, tile axis ``a`` the variable
    ``pf_axis_a``; None where it reads a tensor or is not integer arithmetic."""
    if isinstance(x, (Broadcast, Permute)):
        return scalar(x.tile)
    if isinstance(x, Iota):
        return Var(f"pf_axis_{x.axis}", x.dtype)
    if isinstance(x, (Var, Const)):
        return x if x.dtype.is_int else None
    if isinstance(x, BinOp) and x.op in ("+", "-", "*") and x.dtype.is_int:
        a, b = scalar(x.a), scalar(x.b)
        return None if a is None or b is None else BinOp(x.op, a, b)
    return None


def rewrite(body: tuple[TileStore, ...], var: str, registers_only: set[str]
             ) -> tuple[dict[str, float], dict[str, Expr]]:
    """The values of the loop's statements with less work per element, equal in IEEE arithmetic:

    * a rolling update's first-iteration case ``select(var == 0, c, T)``, where ``T`` is in ``registers_only``
      (its registers need not start with what memory holds: it lives in registers only, or the loop runs at
      least once), its first write in the body is unmasked and every read of it up to that write is such a
      select with the same constant ``c``, is ``T`` itself once ``T``'s registers start at ``c`` (returned by
      tensor);
    * ``select(p, x, f·x)`` is ``x · select(p, 1, f)`` (``x·1`` is ``x`` for every ``x``, NaN, ±0 and ±inf
      included): one product per element, the select per row where ``p`` and ``f`` are.
    """
    def first_select(n: Expr, name: str) -> float | None:
        if (isinstance(n, Select) and isinstance(n.cond, BinOp) and n.cond.op == "=="
                and isinstance(n.cond.a, Var) and n.cond.a.name == var and isinstance(n.cond.b, Const)
                and n.cond.b.value == 0 and isinstance(n.true_value, Const) and isinstance(n.false_value, TileLoad)
                and n.false_value.tensor.name == name and n.false_value.mask is None):
            return float(n.true_value.value)
        return None

    initial: dict[str, float] = {}
    for name in sorted(registers_only):
        writers = [k for k, s in enumerate(body) if s.tensor.name == name]
        if not writers or body[writers[0]].mask is not None:
            continue  # (a masked first write would leave the initial value where the program has its own)
        constants: set[float] = set()
        loads = covered = 0
        for s in body[:writers[0] + 1]:
            for x in store_exprs(s):
                for n in walk_tile_expr(x):
                    loads += isinstance(n, TileLoad) and n.tensor.name == name
                    c = first_select(n, name)
                    if c is not None:
                        covered += 1
                        constants.add(c)
        if loads and loads == covered and len(constants) == 1:
            initial[name] = constants.pop()

    def factor(n: Expr) -> Expr | None:
        if isinstance(n, Select) and n.dtype.is_float:
            for keep, scaled, first in ((n.true_value, n.false_value, True), (n.false_value, n.true_value, False)):
                if isinstance(scaled, BinOp) and scaled.op == "*":
                    for f, other in ((scaled.a, scaled.b), (scaled.b, scaled.a)):
                        if other == keep:
                            one = Const(1.0, f.dtype)
                            choice = Select(n.cond, one, f) if first else Select(n.cond, f, one)
                            return BinOp("*", map_tile_expr(keep, factor), map_tile_expr(choice, factor))
        return None

    values: dict[str, Expr] = {}
    for k, s in enumerate(body):
        def first(n: Expr, k: int = k) -> Expr | None:
            for name, c in initial.items():
                if first_select(n, name) == c and k <= min(j for j, x in enumerate(body) if x.tensor.name == name):
                    return n.false_value  # type: ignore[attr-defined]
            return None

        values[s.block] = map_tile_expr(map_tile_expr(s.value, first), factor)
    return initial, values




def accumulated(s: TileStore, value: Expr, row: str, finite: Callable[[str], bool]) -> Dot | None:
    """Statement ``s``'s ``value`` as one product that starts from the rest of the value, where it is
    ``X + select(c, 0, dot(a, b, 0))`` (either order of the sum) with ``c`` a condition of ``row`` alone, ``X``
    free of products and reductions, and ``b`` reading only ``finite`` tensors: ``dot(select(c, 0, a), b,
    acc=X)`` — a rolling update's rescaled accumulator plus the tile's product, guarded where the row's running
    maximum is −∞ (attention's ``O·h + P·V``).  Equal in IEEE arithmetic: where ``c`` holds the product sums
    ``0·b`` over finite ``b``, ±0, and ``X + ±0`` is ``X`` (up to the sign of a zero); elsewhere it is the same
    sum.  The product can then accumulate into the statement's registers (:attr:`FragmentStmt.accumulates
    <polyfuse.emit_cpp.fragments.FragmentStmt.accumulates>`): no accumulators of its own."""
    if not (isinstance(value, BinOp) and value.op == "+" and value.dtype == s.tensor.dtype == dt.f32):
        return None
    for rest, guarded in ((value.a, value.b), (value.b, value.a)):
        if not (isinstance(guarded, Select) and is_zero(guarded.true_value) and isinstance(guarded.false_value, Dot)):
            continue
        product = guarded.false_value
        cond = guarded.cond
        while isinstance(cond, (Broadcast, Permute)):
            cond = cond.tile
        if (not is_zero(product.acc) or not set(axes_of(cond)) <= {row} or row not in axes_of(product.a)
                or any(isinstance(n, (Dot, Reduce)) for n in walk_tile_expr(rest))
                or not all(finite(n.tensor.name) for n in walk_tile_expr(product.b) if isinstance(n, TileLoad))
                or axes_of(rest) != axes_of(product.acc)):
            return None
        sizes = dict(expr_axis_sizes([product.a]))
        a_axes = tuple((x, sizes[x]) for x in axes_of(product.a))
        zero = Const(0.0, product.a.dtype)
        return Dot(Select(Broadcast(cond, a_axes), zero, product.a), product.b, rest, product.axis)
    return None


def is_zero(x: Expr) -> bool:
    """Whether ``x`` is the constant 0 (possibly broadcast or permuted)."""
    c = constant(x)
    return c is not None and c.value == 0


def row_parts(exprs: list[Expr], row: str, col: str) -> list[Expr]:
    """The largest parts of a statement's value that depend on no axis but its ``row`` (a rolling update's
    rescale factor and conditions, ALiBi's slope) and read a tensor or a reduction or call a math function:
    computed once per row of the thread, before its columns.  Not inside a product or a reduction (their
    operands have other axes)."""
    found: list[Expr] = []

    def visit(x: Expr) -> None:
        if x in found or isinstance(x, (Var, Const, Dot, Reduce)):
            return
        nodes = list(walk_tile_expr(x))
        if (set(axes_of(x)) <= {row, col} and not depends_on(x, col) and not isinstance(x, TileLoad)
                and any(costly(n) for n in nodes) and not any(isinstance(n, Dot) for n in nodes)):
            found.append(x)
            return
        for c in tile_children(x):
            visit(c)

    for x in exprs:
        visit(x)
    return found


def costly(n: Expr) -> bool:
    """A node worth computing once where it can: a read, a reduction, a math function, a power or division."""
    return (isinstance(n, (TileLoad, Reduce)) or (isinstance(n, Call) and n.fn not in CHEAP_CALLS)
            or (isinstance(n, BinOp) and n.op in ("pow", "/", "//", "%")))


def reductions(exprs: list[Expr]) -> list[Reduce]:
    """The statement's reductions, innermost first, each once (none inside a product)."""
    found: list[Reduce] = []

    def visit(x: Expr) -> None:
        if isinstance(x, Dot):
            visit(x.acc)
            return
        for c in tile_children(x):
            visit(c)
        if isinstance(x, Reduce) and x not in found:
            found.append(x)

    for x in exprs:
        visit(x)
    return found
