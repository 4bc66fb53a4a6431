"""Skip the tiles a mask hides entirely: tail truncation of rolling loops, proven sound.

Causal attention masks a score tile with ``select(j > i, -INF, x)``; the rolling loop over key
tiles still runs over every tile, and about half of them are masked everywhere.  A masked
position contributes nothing — ``exp(-INF - m) = 0``, ``max(m, -INF) = m`` — so those iterations
leave every value the loop carries as it was, and the loop may stop before them.
:func:`skip_masked_tiles` shortens such loops, and only when it can prove that:

1. the loop is innermost (its body is tile statements) and one of them stores
   ``select(C, -INF, X)`` with ``C`` affine in loop variables, size parameters and iotas;
2. ISL computes the iterations whose tile ``C`` masks everywhere (on the elements the store
   writes), and of those the ones with only such iterations after them: a suffix of the loop for
   every point of the outer loops, which must never hold its first iteration (a masked prefix,
   as a sliding window also has, stays).  The new extent is one past the last iteration with an
   unmasked element, an affine expression of the outer loop variables and the sizes (e.g.
   ``i_0 // 2 + 1`` for 32×64 tiles), written back from ISL's piecewise form;
3. a small abstract evaluation of the body (:mod:`polyfuse.tiling.tileeval`), once on every
   iteration and once on the skipped ones, shows that every tensor the loop carries — what is
   read outside the loop, and, transitively, what that depends on from one iteration to the
   next — is stored back unchanged on the skipped ones.  Temporaries that no carried value
   depends on (``qk``, ``score``, the previous maximum) need not be; a carried one must not be
   allocated per iteration (``alloc`` on the loop).

Otherwise the loop is left as it was; the pass never changes results under its assumption:

    inputs are finite and no operation overflows, so the only infinities are the -INF of masks
    and of maxima over masked rows, and no value carried from one iteration to the next is NaN.

The first half of it is checked: every input the loop reads must be declared ``finite``
(``p.input(..., finite=True)``, which the interpreters enforce).

Under it a masked position adds exactly nothing, as in the unfused program: ``-INF - m`` is
-INF for a finite ``m``, ``0·v`` is 0 for a finite ``v``, ``x + 0 == x``.  Results are equal as
values (a sum may end in +0.0 where the full loop ends in -0.0).  Example (32×64 tiles)::

    for i_0 in range(8):                     for i_0 in range(8):
        for j_0 in range(4):          →          for j_0 in range(i_0 // 2 + 1):
            score = select(64*j_0 + iota(ax1) > 32*i_0 + iota(ax0), -INF, qk * 0.25)
            ...                                      ...
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from functools import reduce

import islpy as isl

from polyfuse.ir.expr import BinOp, Const, Expr, Select, binop
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Slice, TileLoad, TileProgram, TileStore, map_tile_expr, walk_tile_expr, walk_tile_stmts,
)
from polyfuse.tiling.simplify import simplify_tiles
from polyfuse.tiling.space import NotAffine, Space
from polyfuse.tiling.tileeval import GiveUp, TileEvaluator, carried, store_sizes
from polyfuse.transforms.compact import ALLOC


def skip_masked_tiles(program: TileProgram) -> TileProgram:
    """``program`` with every provably skippable suffix of masked iterations cut off its loop."""
    if not any(_masks(s) for s in walk_tile_stmts(program.body) if isinstance(s, TileStore)):
        return program
    simple = simplify_tiles(program)  # exact; its scalar tests are easier to decide

    def walk(orig: Stmt, simp: Stmt, path: tuple[Loop, ...]) -> Stmt:
        if isinstance(orig, Seq) and isinstance(simp, Seq):
            stmts = tuple(walk(o, s, path) for o, s in zip(orig.stmts, simp.stmts, strict=True))
            return orig if all(a is b for a, b in zip(stmts, orig.stmts, strict=True)) else Seq(stmts)
        if isinstance(orig, Loop) and isinstance(simp, Loop):
            body = walk(orig.body, simp.body, (*path, simp))
            out = orig if body is orig.body else orig.replace(body=body)
            extent = _Truncation(simple, path, simp).extent()
            if extent is None:
                return out
            return out.replace(extent=extent, body=_retarget(out.body, orig, extent))
        return orig

    body = walk(program.body, simple.body, ())
    return program if body is program.body else dataclasses.replace(program, body=body)


def _masks(s: TileStore) -> bool:
    """Whether ``s`` stores ``select(C, -INF, X)`` (or ``select(C, X, -INF)``)."""
    v = s.value
    return isinstance(v, Select) and (_is_neg_inf(v.true_value) or _is_neg_inf(v.false_value))


def _is_neg_inf(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == -math.inf


class _Truncation:
    """The analysis of one loop: its skippable suffix, the proof, the new extent."""

    def __init__(self, program: TileProgram, outer: tuple[Loop, ...], loop: Loop):
        self.program = program
        self.outer = outer
        self.loop = loop

    def extent(self) -> Expr | None:
        stmts = list(_flatten(self.loop.body))
        if not stmts or not all(isinstance(s, TileStore) for s in stmts):
            return None
        candidates = [s for s in stmts if _masks(s)]
        if not candidates or not _finite_inputs(self.program, stmts):
            return None
        try:
            axes = sorted({a for s in stmts for a in store_sizes(s)})
            space = Space([p.name for p in self.program.params], [*self.outer, self.loop], axes)
            for store in candidates:
                found = self._suffix(space, store)
                if found is not None and self._proven(space, stmts, found):
                    return found[1]
        except (NotAffine, GiveUp, isl.Error):
            return None
        return None

    def _suffix(self, space: Space, store: TileStore) -> tuple[isl.Set, Expr] | None:
        """The masked suffix of the loop (a set of iterations) and the extent that leaves it out."""
        sizes = store_sizes(store)
        select = store.value
        assert isinstance(select, Select)
        cond = space.condition(select.cond, sizes)
        if cond is None:
            return None
        masked = cond if _is_neg_inf(select.true_value) else space.universe.subtract(cond)
        elements = space.iterations().intersect(space.box(sizes))
        if store.mask is not None:
            where = space.condition(store.mask, sizes)
            elements = elements if where is None else elements.intersect(where)
        live = elements.subtract(masked)
        for a in space.axes:
            live = space.free(live, a)
        # every iteration at or before a live one (same outer point) cannot be skipped
        j = f"v_{self.loop.var.name}"
        ins = [f"{d}_" for d in space.dims]
        eqs = [f"{d} = {d}_" for d in space.dims if d != j] + [f"{j} <= {j}_"]
        before = isl.Map(f"{space.prefix}{{ [{', '.join(ins)}] -> [{', '.join(space.dims)}] : {' and '.join(eqs)} }}")
        skipped = space.iterations().subtract(live.apply(before))
        if skipped.is_empty() or not skipped.intersect(space.set(f"{j} = 0")).is_empty():
            return None
        # the new extent: one past the last live iteration
        n_outer, dims = len(self.outer), len(space.loop_vars)
        points = live.intersect(space.iterations()).project_out(isl.dim_type.set, dims, len(space.axes))
        last = isl.Map.from_range(points).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, n_outer)
        pw = last.lexmax_pw_multi_aff().get_pw_aff(0)
        extent = self._expression(pw)
        if extent is None:
            return None
        extent = binop("+", extent, Const(1, extent.dtype))
        outer = space.iterations(len(self.outer)).project_out(isl.dim_type.set, n_outer,
                                                              dims - n_outer + len(space.axes))
        if not pw.domain().is_equal(outer):  # where the loop may be empty (a size 0), keep it empty
            extent = binop("min", self.loop.extent, extent)
        return skipped, extent

    def _expression(self, pw: isl.PwAff) -> Expr | None:
        """``pw`` as an expression: one piece, or the min or max of its pieces where that is equal to it."""
        pieces = pw.get_pieces()
        if len(pieces) == 1:
            return self._aff(pieces[0][1])
        domain = pw.domain()
        whole = [isl.PwAff.from_aff(aff).intersect_domain(domain) for _, aff in pieces]
        for op in ("min", "max"):
            if reduce(lambda a, b: getattr(a, op)(b), whole).is_equal(pw):
                exprs = [self._aff(aff) for _, aff in pieces]
                return reduce(lambda a, b: binop(op, a, b), exprs)
        return None

    def _aff(self, aff: isl.Aff) -> Expr:
        """``floor(aff)`` as an expression of the outer loop variables and the size parameters."""
        params = {p.name: p for p in self.program.params}
        terms: list[tuple[Fraction, Expr]] = []
        for i in range(aff.dim(isl.dim_type.param)):
            terms.append((_fraction(aff.get_coefficient_val(isl.dim_type.param, i)),
                          params[aff.get_dim_name(isl.dim_type.param, i)[2:]]))
        for i, lp in enumerate(self.outer):
            terms.append((_fraction(aff.get_coefficient_val(isl.dim_type.in_, i)), lp.var))
        for k in range(aff.dim(isl.dim_type.div)):
            c = _fraction(aff.get_coefficient_val(isl.dim_type.div, k))
            if c:
                terms.append((c, self._aff(aff.get_div(k))))
        constant = _fraction(aff.get_constant_val())
        terms = [(c, t) for c, t in terms if c]
        den = math.lcm(constant.denominator, *(c.denominator for c, _ in terms))
        dtype = self.loop.var.dtype
        out: Expr | None = None
        for c, t in terms:
            k = int(c * den)
            scaled = t if abs(k) == 1 else binop("*", Const(abs(k), dtype), t)
            if out is None:
                out = scaled if k > 0 else binop("-", Const(0, dtype), scaled)
            else:
                out = binop("+" if k > 0 else "-", out, scaled)
        k = int(constant * den)
        if out is None:
            out = Const(k, dtype)
        elif k:
            out = binop("+" if k > 0 else "-", out, Const(abs(k), dtype))
        return out if den == 1 else binop("//", out, Const(den, dtype))

    def _proven(self, space: Space, stmts: list[TileStore], found: tuple[isl.Set, Expr]) -> bool:
        """Whether the skipped iterations store every carried tensor back unchanged (with the tests for
        the last iteration made tests for the new one, :func:`_retarget`)."""
        inside = {id(s) for s in stmts}
        skipped, extent = found
        stmts = [_retarget(s, self.loop, extent) for s in stmts]  # type: ignore[misc]
        written = {s.tensor.name for s in stmts}
        after = {t.name for t in self.program.tensors if t.role == OUTPUT}
        for s in walk_tile_stmts(self.program.body):
            if isinstance(s, TileStore) and id(s) not in inside:
                after |= _loaded(s)
        everywhere = TileEvaluator(space, self.program).run(stmts, space.iterations())
        keep = carried(everywhere, written & after)
        if keep & {str(v) for k, v in self.loop.annotations if k == ALLOC}:
            return False
        masked = TileEvaluator(space, self.program).run(stmts, skipped)
        return all(layer.unchanged for name in keep for layer in masked.get(name, []))


def _finite_inputs(program: TileProgram, stmts: list[TileStore]) -> bool:
    """Every program input the loop reads is declared ``finite``: the assumption the proof rests on
    (an infinite value at a masked position makes the plain program's 0·v a NaN the skip would lose)."""
    read = {n.tensor.name for s in stmts for e in (s.value, s.mask) if e is not None
            for n in walk_tile_expr(e) if isinstance(n, TileLoad)}
    return all(t.finite for t in program.tensors if t.role == INPUT and t.name in read)


def _retarget(s: Stmt, loop: Loop, extent: Expr) -> Stmt:
    """``s`` with every test for the last iteration of ``loop`` (``j == E - 1``) made a test for the last
    iteration of the truncated loop (``j == extent - 1``).

    Such tests mark the steps a reduction fusion takes once, at the end of its rolling loop: the
    consumer's init, a producer's real value where a surrogate stood, a masked row's guard lifted
    (:mod:`polyfuse.transforms.rolling_update`).  Each commutes with an iteration that changes nothing
    (it adds to, reads or replaces values those iterations leave as they were), so it may run at the
    new last iteration instead; the proof of the skipped iterations then sees them as not last.
    """
    var, old = loop.var, loop.extent

    def is_last(e: Expr) -> bool:
        if isinstance(e, BinOp) and e.op == "-" and e.a == old and e.b == Const(1, e.b.dtype):
            return True
        return isinstance(e, Const) and isinstance(old, Const) and e.value == old.value - 1

    def fix(e: Expr) -> Expr | None:
        if isinstance(e, BinOp) and e.op == "==" and (e.a == var and is_last(e.b) or e.b == var and is_last(e.a)):
            return BinOp("==", var, binop("-", extent, Const(1, extent.dtype)))
        return None

    if isinstance(s, Seq):
        return Seq(tuple(_retarget(c, loop, extent) for c in s.stmts))
    if isinstance(s, Loop):
        return s.replace(body=_retarget(s.body, loop, extent))
    if isinstance(s, TileStore):
        return dataclasses.replace(s, value=map_tile_expr(s.value, fix),
                                   mask=None if s.mask is None else map_tile_expr(s.mask, fix))
    return s


def _fraction(v: isl.Val) -> Fraction:
    return Fraction(int(v.get_num_si()), int(v.get_den_val().to_python()))


def _flatten(s: Stmt):
    if isinstance(s, Seq):
        for c in s.stmts:
            yield from _flatten(c)
    else:
        yield s


def _loaded(s: TileStore) -> set[str]:
    exprs = [s.value, *([s.mask] if s.mask is not None else [])]
    exprs += [i.start if isinstance(i, Slice) else i for i in s.index]
    return {n.tensor.name for e in exprs for n in walk_tile_expr(e) if isinstance(n, TileLoad)}
