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

import dataclasses
from collections.abc import Callable, Mapping

from polyfuse.emit_cpp.cfamily import CHEAP_CALLS
from polyfuse.errors import NonAffineIndex
from polyfuse.ir.affine import from_linear_form, linear_form
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Select, Var
from polyfuse.tiling.htile import (
    Broadcast, Dot, Gather, Iota, Permute, Reduce, Slice, TileLoad, TileStore, axes_of, broadcast_like, depends_on,
    expr_axis_sizes, map_tile_expr, tile_children, walk_tile_expr,
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


def rewrite(body: tuple[TileStore, ...], var: str, registers_only: set[str],
            per_iteration: frozenset[str] = frozenset(), finite: Callable[[str], bool] = lambda name: False
            ) -> tuple[dict[str, float], dict[str, Expr]]:
    """The values of the loop's statements with less work per element, equal in IEEE arithmetic (up to the sign
    of a zero maximum, which exp and comparisons do not see):

    * a rolling update's first-iteration case ``select(var == 0, c, T)``, where ``T`` is in ``registers_only``
      (its registers need not start with what memory holds: it lives in registers only, or the loop runs at
      least once), its first write in the body is unmasked and every read of it up to that write is such a
      select with the same constant ``c``, is ``T`` itself once ``T``'s registers start at ``c`` (returned by
      tensor);
    * ``select(p, x, f·x)`` is ``x · select(p, 1, f)`` (``x·1`` is ``x`` for every ``x``, NaN, ±0 and ±inf
      included): one product per element, the select per row where ``p`` and ``f`` are;
    * a tile of ``per_iteration`` (allocated in the loop: written and read within one iteration) that one
      unmasked statement writes as ``Y·c``, ``c`` a positive finite constant, read by unmasked loads only,
      stores ``Y`` and its readers read ``Y·c`` (:func:`scaled_tiles`): each computes the value the tile held, and
      a reader ``exp(T − m)`` becomes ``exp(Y·c − m)``, one fused multiply-add where the build contracts them;
    * ``reduce_max(Z·c)`` is ``reduce_max(Z)·c`` for a positive finite constant ``c`` (rounding ``c·z`` is monotone
      in ``z``, NaN stays NaN and ±∞ stay, so the same element is the maximum; a zero max may take the other
      sign where ``c·z`` underflows), likewise ``min``: the product once per row;
    * ``reduce(op, select(p, e, x))`` is ``select(p, e, reduce(op, x))`` where ``p`` does not vary along the
      reduced axis and ``e`` is ``op``'s identity (0 for a sum, which sums zeros to +0, −∞ for a max, ∞ for a
      min): the select once per row;
    * a rolling update's guard ``select(m == −∞, 0, E)``, ``E`` the exponentials ``exp(Z − m)`` of the tile the
      running max ``m`` was just taken over (``m = max(m_old, reduce_max(Z))`` earlier in the iteration, nothing
      written between), alone, summed, or as a product's A operand (whose B reads ``finite`` tensors only, or
      whose guard is on the operand itself), is ``E`` with ``m`` read as ``select(m == −∞, 0, m)``
      (:func:`guarded_by_the_max`): where ``m`` is −∞ every ``Z`` is −∞ (``m`` is at least each of them and a
      NaN would have made ``m`` NaN: the generated max propagates NaN), so each exponential is
      ``exp(−∞ − 0) = +0`` and ``E`` is 0 as the guard says (a product of +0 and finite values: ±0); elsewhere
      nothing changes.  The select once per row instead of once per element.
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

    scaled = scaled_tiles(body, per_iteration)

    def read_scaled(n: Expr) -> Expr | None:
        if isinstance(n, TileLoad) and n.tensor.name in scaled:
            return BinOp("*", n, Const(scaled[n.tensor.name][1], n.dtype))
        return None

    values: dict[str, Expr] = {}
    for k, s in enumerate(body):
        def first(n: Expr, k: int = k) -> Expr | None:
            for name, c in initial.items():
                if first_select(n, name) == c and k <= min(j for j, x in enumerate(body) if x.tensor.name == name):
                    return n.false_value  # type: ignore[attr-defined]
            return None

        value = scaled[s.tensor.name][0] if s.tensor.name in scaled else s.value
        value = map_tile_expr(map_tile_expr(map_tile_expr(value, read_scaled), first), factor)
        values[s.block] = map_tile_expr(value, _per_row)
    return initial, guarded_by_the_max(body, values, finite)


def guarded_by_the_max(body: tuple[TileStore, ...], values: dict[str, Expr], finite: Callable[[str], bool]
                       ) -> dict[str, Expr]:
    """``values`` with the guards ``select(m == −∞, 0, E)`` that :func:`rewrite` moves onto ``m`` moved there."""
    out = dict(values)
    for k, s in enumerate(body):
        def unguard(n: Expr, k: int = k) -> Expr | None:
            if not (isinstance(n, Select) and is_zero(n.true_value)):
                return None
            cond = n.cond
            while isinstance(cond, Broadcast):
                cond = cond.tile
            if not (isinstance(cond, BinOp) and cond.op == "==" and isinstance(cond.a, TileLoad)
                    and constant(cond.b) is not None and float(constant(cond.b).value) == float("-inf")):
                return None
            covered = _max_taken_over(body, values, k, cond.a)
            if covered is None:
                return None
            safe = Select(cond, Const(0.0, cond.a.dtype), cond.a)
            live = n.false_value
            if isinstance(live, Reduce) and live.op == "sum":
                inner = _exponentials(live.tile, cond.a, covered, safe)
                return None if inner is None else dataclasses.replace(live, tile=inner)
            if isinstance(live, Dot) and is_zero(live.acc) and all(
                    finite(x.tensor.name) for x in walk_tile_expr(live.b) if isinstance(x, TileLoad)):
                inner = _exponentials(live.a, cond.a, covered, safe)
                return None if inner is None else dataclasses.replace(live, a=inner)
            return _exponentials(live, cond.a, covered, safe)

        out[s.block] = map_tile_expr(values[s.block], unguard)
    return out


def _max_taken_over(body: tuple[TileStore, ...], values: dict[str, Expr], k: int, m: TileLoad) -> Expr | None:
    """The tile ``Z`` whose maximum the running max ``m`` (read by statement ``k``) was last updated with, in
    this iteration before ``k``: its writer stores ``max(m_old, reduce_max(Z))`` (or ``reduce_max(Y)·c``,
    ``Z = Y·c``) unmasked at the element ``m`` reads, and nothing between writes ``m`` or what ``Z`` reads."""
    writers = [j for j in range(k) if body[j].tensor == m.tensor]
    if not writers:
        return None
    w = body[writers[-1]]
    value = values[w.block]
    if w.mask is not None or w.index != m.index or m.mask is not None or not (
            isinstance(value, BinOp) and value.op == "max"):
        return None
    for r in (value.a, value.b):
        split = _positive_factor(r) if isinstance(r, BinOp) else None
        if split is not None:
            r = split[0]
        if isinstance(r, Reduce) and r.op == "max":
            covered = r.tile if split is None else BinOp("*", r.tile, Const(split[1], r.dtype))
            read = {x.tensor.name for x in walk_tile_expr(covered) if isinstance(x, TileLoad)} | {m.tensor.name}
            if any(body[j].tensor.name in read for j in range(writers[-1] + 1, k)):
                return None
            return covered
    return None


def _anonymous(e: Expr) -> Expr:
    """``e`` with its loads' axes unnamed: the same elements read under any axis names compare equal."""
    def strip(n: Expr) -> Expr | None:
        if isinstance(n, TileLoad) and n.mask is None and not any(isinstance(i, Gather) for i in n.index):
            return dataclasses.replace(n, index=tuple(dataclasses.replace(i, axis="") if isinstance(i, Slice) else i
                                                      for i in n.index))
        return None

    return map_tile_expr(e, strip)


def _exponentials(e: Expr, m: TileLoad, covered: Expr, safe: Expr) -> Expr | None:
    """``e`` = ``exp(Z − m)`` (possibly cast) with ``Z`` the ``covered`` tile and ``m`` over its rows, with ``m``
    read as ``safe``; None for anything else."""
    inner = e.value if isinstance(e, Cast) else e
    if not (isinstance(inner, Call) and inner.fn == "exp" and isinstance(inner.args[0], BinOp)
            and inner.args[0].op == "-" and _anonymous(inner.args[0].a) == _anonymous(covered)):
        return None
    shift = inner.args[0].b
    axes = None
    if isinstance(shift, Broadcast):
        shift, axes = shift.tile, shift.axes
    if shift != m:
        return None
    argument = BinOp("-", inner.args[0].a, safe if axes is None else Broadcast(safe, axes))
    rebuilt = Call("exp", (argument,))
    return dataclasses.replace(e, value=rebuilt) if isinstance(e, Cast) else rebuilt


def scaled_tiles(body: tuple[TileStore, ...], per_iteration: frozenset[str]) -> dict[str, tuple[Expr, float]]:
    """The tiles of ``per_iteration`` that one unmasked statement of ``body`` writes as ``Y·c`` (``c`` a positive
    finite constant, also through selects whose other side is 0 or ±∞, which ``c`` keeps) and that only unmasked
    loads read: ``{name: (Y, c)}``."""
    found: dict[str, tuple[Expr, float]] = {}
    for name in sorted(per_iteration):
        writers = [s for s in body if s.tensor.name == name]
        if len(writers) != 1 or writers[0].mask is not None:
            continue
        if any(isinstance(n, TileLoad) and n.tensor.name == name and n.mask is not None
               for s in body for x in store_exprs(s) for n in walk_tile_expr(x)):
            continue
        split = _positive_factor(writers[0].value)
        if split is not None and not any(isinstance(n, TileLoad) and n.tensor.name == name
                                         for n in walk_tile_expr(split[0])):
            found[name] = split
    return found


def _positive_factor(e: Expr) -> tuple[Expr, float] | None:
    """``e`` as ``(Y, c)`` with ``e = Y·c`` exactly for every value, ``c`` a positive finite constant."""
    if isinstance(e, BinOp) and e.op == "*" and e.dtype.is_float:
        for f, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(f, Const) and 0 < float(f.value) < float("inf"):
                return y, float(f.value)
    if isinstance(e, Select):
        sides = [constant(x) for x in (e.true_value, e.false_value)]
        kept = [c is not None and float(c.value) in (0.0, float("inf"), float("-inf")) for c in sides]
        for k, (live, other) in enumerate(((e.false_value, e.true_value), (e.true_value, e.false_value))):
            if kept[k]:
                inner = _positive_factor(live)
                if inner is not None:
                    y, c = inner
                    return (Select(e.cond, other, y) if k == 0 else Select(e.cond, y, other)), c
    return None


_IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}


def _per_row(n: Expr) -> Expr | None:
    """The reduction rewrites of :func:`rewrite` (a positive factor out of a max or min, a select on a condition
    constant along the axis out of a reduction of its identity)."""
    if not isinstance(n, Reduce):
        return None
    tile = map_tile_expr(n.tile, _per_row)
    if n.op in ("max", "min") and (split := _positive_factor(tile)) is not None and isinstance(tile, BinOp):
        y, c = split
        return BinOp("*", Reduce(n.op, y, n.axis), Const(c, n.dtype))
    if n.op in _IDENTITY and isinstance(tile, Select) and n.dtype.is_float:
        cond = tile.cond
        while isinstance(cond, Broadcast):
            cond = cond.tile
        identity = constant(tile.true_value)
        if identity is not None and float(identity.value) == _IDENTITY[n.op] and not depends_on(cond, n.axis):
            reduced = Reduce(n.op, tile.false_value, n.axis)
            cond_row, value = broadcast_like(cond, reduced), broadcast_like(Const(identity.value, n.dtype), reduced)
            if cond_row is not None and value is not None:
                return Select(cond_row, value, reduced)
    return dataclasses.replace(n, tile=tile) if tile is not n.tile else None




def accumulated(s: TileStore, value: Expr, row: str, finite: Callable[[str], bool]) -> Dot | None:
    """Statement ``s``'s ``value`` as one product that starts from the rest of the value, where it is
    ``X + dot(a, b, 0)`` (``dot(a, b, X)``), or ``X + select(c, 0, dot(a, b, 0))`` (either order of the sum) with
    ``c`` a condition of ``row`` alone, ``X``
    free of products and reductions, and ``b`` reading only ``finite`` tensors: ``dot(select(c, 0, a), b,
    acc=X)`` — a rolling update's rescaled accumulator plus the tile's product, guarded where the row's running
    maximum is −∞ (attention's ``O·h + P·V``).  Equal in IEEE arithmetic: where ``c`` holds the product sums
    ``0·b`` over finite ``b``, ±0, and ``X + ±0`` is ``X`` (up to the sign of a zero); elsewhere it is the same
    sum.  The product can then accumulate into the statement's registers (:attr:`FragmentStmt.accumulates
    <polyfuse.emit_cpp.fragments.FragmentStmt.accumulates>`): no accumulators of its own."""
    if not (isinstance(value, BinOp) and value.op == "+" and value.dtype == s.tensor.dtype == dt.f32):
        return None
    for rest, guarded in ((value.a, value.b), (value.b, value.a)):
        if isinstance(guarded, Dot):  # (unguarded: X + dot(a, b, 0) sums the same terms from X)
            if (not is_zero(guarded.acc) or any(isinstance(n, (Dot, Reduce)) for n in walk_tile_expr(rest))
                    or axes_of(rest) != axes_of(guarded.acc)):
                return None
            return Dot(guarded.a, guarded.b, rest, guarded.axis)
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
