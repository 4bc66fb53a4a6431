"""Loop program -> tile program (Neptune §5, Algorithm 3 "Loop-to-Tile").

1. Tileable nests: walking up from a block, the loops passed before a sequence of
   several statements, a bound or annotated loop, or a loop of non-constant extent
   are its *tile axes*; everything above stays a scalar ``Loop``/``Seq``.  Each nest
   holds one block, so its instances run together as one tile statement.
2. Every access is relaxed to slices (:mod:`polyfuse.tiling.relax`) and reconciled
   by axis name to the nest's loop order (:mod:`polyfuse.tiling.reconcile`).
3. The block is classified: *elementwise* (no reduce iteration bound to a tile
   axis), *dot* (a sum of a product of two tiles sharing exactly the one reduce
   axis) or *reduce* (``Reduce`` over the reduce axes, then ``acc ⊕ ·``).
   Reductions whose reduce loop is scalar are elementwise updates inside it.
4. The implied guards (bindings inside the iteration box) and ``where`` become
   masks: on loads (no out-of-range access), on reduction terms (the identity) and
   on the store.  The init runs where the tile holds a first reduce instance.

Anything else raises :class:`~polyfuse.errors.UntileableNest` naming the block and
the access or condition.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.errors import UntileableNest
from polyfuse.ir.affine import fold_div_mod
from polyfuse.ir.gather import is_gather_index
from polyfuse.ir.empty import init_empty_reductions
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var, conjuncts
from polyfuse.ir.printer import expr_to_str
from polyfuse.ir.stmt import BOUND, BUILTIN_REDUCERS, Block, Loop, Program, Seq, Stmt
from polyfuse.ir.visit import free_vars, loads, substitute
from polyfuse.tiling.htile import (
    Broadcast, Dot, Gather, Index, Iota, Reduce, TileLoad, TileProgram, TileStore, axes_of, slice_axes,
)
from polyfuse.tiling.reconcile import permute, reconcile_dim_order, union_order, unify
from polyfuse.tiling.relax import bounds, relax_access
from polyfuse.transforms.ranges import value_ranges

_COMBINE_OP = {"sum": "+", "prod": "*", "max": "max", "min": "min"}


def to_tiles(program: Program) -> TileProgram:
    """Translate every tileable nest of ``program`` into tile statements (see module docstring); the
    reductions a loop of zero trips would skip get their init first (:mod:`polyfuse.ir.empty`)."""
    program = init_empty_reductions(program)
    return TileProgram(program.name, program.params, program.tensors, _stmt(program.body, {}, {}),
                       value_ranges(program))


def _static(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Const) else None


def _tileable(loop: Loop) -> bool:
    """Bound, thread-mapped and annotated loops (and symbolic extents) delimit tiles."""
    return loop.kind != BOUND and loop.thread is None and not loop.annotations and _static(loop.extent) is not None


def _chain(s: Stmt) -> tuple[list[Loop], Block] | None:
    """The tileable loops from ``s`` down to its only block, or None if ``s`` is no such chain."""
    loops: list[Loop] = []
    while True:
        if isinstance(s, Seq) and len(s.stmts) == 1:
            s = s.stmts[0]
        elif isinstance(s, Loop) and _tileable(s):
            loops.append(s)
            s = s.body
        elif isinstance(s, Block):
            return loops, s
        else:
            return None


def _stmt(s: Stmt, ranges: dict[str, int], symbolic: dict[str, Expr]) -> Stmt:
    """``s`` as tiles, under outer loops of constant extents ``ranges`` and of size-parameter extents ``symbolic``."""
    split = _fission(s)
    if split is not None:
        return _stmt(split, ranges, symbolic)
    found = _chain(s)
    if found is not None:
        loops, block = found
        axes = [(lp.var.name, int(_static(lp.extent) or 0)) for lp in loops]
        return _Nest(block, axes, ranges, symbolic).translate()
    if isinstance(s, Seq):
        return s.replace(stmts=tuple(_stmt(c, ranges, symbolic) for c in s.stmts))
    if isinstance(s, Loop):
        inner, inner_symbolic = dict(ranges), dict(symbolic)
        ext = _static(s.extent)
        inner.pop(s.var.name, None)
        inner_symbolic.pop(s.var.name, None)
        if ext is not None:
            inner[s.var.name] = ext
        elif isinstance(s.extent, Var):
            inner_symbolic[s.var.name] = s.extent
        return s.replace(body=_stmt(s.body, inner, inner_symbolic))
    raise UntileableNest(f"cannot translate statement {type(s).__name__}")


def _fission(s: Stmt) -> Stmt | None:
    """``for v: {S1; S2; …}`` as ``{for v: S1; for v: S2; …}`` when that lets each ``Si`` become tiles.

    Legal when no statement of the body touches a tensor another one writes: the statements
    then commute across iterations.  Only done for an innermost loop (every part is a block), so
    that the loop becomes a tile axis of each block and no outer loop changes role.
    """
    if not (isinstance(s, Loop) and _tileable(s) and isinstance(s.body, Seq) and len(s.body.stmts) > 1):
        return None
    parts = s.body.stmts
    if not all(isinstance(p, Block) for p in parts):
        return None
    touched = [_tensors(p) for p in parts]
    for k, (_, writes) in enumerate(touched):
        for j, (reads, others) in enumerate(touched):
            if j != k and writes & (reads | others):
                return None
    return Seq(tuple(s.replace(body=p) for p in parts))


def _tensors(s: Stmt) -> tuple[set[str], set[str]]:
    """(read, written) tensor names of the blocks in ``s``."""
    reads: set[str] = set()
    writes: set[str] = set()
    stack = [s]
    while stack:
        x = stack.pop()
        if isinstance(x, Seq):
            stack.extend(x.stmts)
        elif isinstance(x, Loop):
            stack.append(x.body)
        elif isinstance(x, Block):
            writes.add(x.store.tensor.name)
            exprs = [x.store.value, *x.store.indices, *x.bindings]
            exprs += [e for e in (x.where, x.init) if e is not None]
            reads |= {ld.tensor.name for e in exprs for ld in loads(e)}
    return reads, writes


def _and(parts: list[Expr]) -> Expr | None:
    out: Expr | None = None
    for p in parts:
        out = p if out is None else BinOp("and", out, p)
    return out


@dataclass
class _Cond:
    """One conjunct of a block's mask: its tile form and the axes it uses."""

    text: str
    tile: Expr
    axes: frozenset[str]
    variables: frozenset[str]


class _Nest:
    """One tileable nest: a block under tile loops ``axes`` (name, extent), outer loops in ``ranges`` (constant
    extents) and ``symbolic`` (a size parameter's extent: a grid loop over the rows of a generic program)."""

    def __init__(self, block: Block, axes: list[tuple[str, int]], ranges: dict[str, int],
                 symbolic: dict[str, Expr] | None = None):
        self.block = block
        self.symbolic = symbolic or {}
        self.order = tuple(name for name, _ in axes)
        self.sizes = dict(axes)
        self.ranges = {**ranges, **self.sizes}
        self.binding = {iv.var.name: b for iv, b in zip(block.iters, block.bindings, strict=True)}
        self.conds: list[_Cond] = []
        self.conds = self._conditions()

    # ------------------------------------------------------------ helpers
    def sub(self, e: Expr) -> Expr:
        """``e`` (in iteration variables) in loop variables, div/mod folded."""
        return fold_div_mod(substitute(e, self.binding), self.ranges)

    def fold(self, e: Expr) -> Expr:
        """``e`` (already in loop variables) with div/mod folded."""
        return fold_div_mod(e, self.ranges)

    def unify(self, tiles: list[Expr]) -> list[Expr]:
        return unify(tiles, self.order, self.sizes)

    def fit(self, tile: Expr, target: tuple[str, ...], what: str) -> Expr:
        return reconcile_dim_order(tile, target, self.sizes, what=f"block {self.block.name!r}: {what}")

    def tile_axes(self, e: Expr) -> frozenset[str]:
        return frozenset(free_vars(e) & set(self.order))

    def spans(self, e: Expr, extent: Expr) -> bool:
        """Whether ``e`` is a loop variable that runs over exactly ``[0, extent)`` for a size parameter ``extent``
        (the iteration and the tensor dimension of a symbolic size, walked by a loop of that extent)."""
        return (isinstance(e, Var) and isinstance(extent, Var) and e.name in self.symbolic
                and self.symbolic[e.name].name == extent.name)

    def _conditions(self) -> list[_Cond]:
        raw: list[Expr] = []
        for iv in self.block.iters:
            b = self.fold(self.binding[iv.var.name])
            ext = iv.extent
            if self.spans(b, ext):
                continue
            rng = bounds(b, self.ranges)
            n = _static(ext)
            if rng is None or rng[0] < 0:
                raw.append(BinOp(">=", b, Const(0, b.dtype)))
            if rng is None or n is None or rng[1] >= n:
                raw.append(BinOp("<", b, ext if ext.dtype == b.dtype else Cast(b.dtype, ext)))
        if self.block.where is not None:
            raw += [self.sub(c) for c in conjuncts(self.block.where)]
        return [_Cond(expr_to_str(c), self.expr(c, None), self.tile_axes(c), frozenset(free_vars(c))) for c in raw]

    def mask(self, within: frozenset[str] | None, target: tuple[str, ...]) -> Expr | None:
        """The conjuncts using only axes in ``within`` (all when None), as one tile over ``target``."""
        parts = [c.tile for c in self.conds if within is None or c.axes <= within]
        if not parts:
            return None
        m = _and(self.unify(parts))
        if m is None or within is None:
            return m
        return self.fit(m, target, "mask")

    def access(self, tensor_name: str, indices: tuple[Expr, ...], text: str):
        """Relax an access whose indices are in loop variables."""
        return relax_access(tensor_name, indices, self.sizes, block=self.block.name, access=text)

    def _may_leave(self, ld: Load, axes: tuple[str, ...]) -> bool:
        """Whether an index of ``ld`` can leave its tensor over the loops' whole ranges while what keeps it
        inside is a condition on axes the load does not have: one that ties an outer loop variable of the
        index to another axis (``j_0·4 + ax0 < 16`` for ``r_rf[j_0]``).  Conditions on its own axes mask
        it already."""
        outer: set[str] = set()
        leaves = False
        for idx, extent in zip(ld.indices, ld.tensor.shape, strict=True):
            e = self.sub(idx)
            if self.spans(e, extent):
                continue
            rng, n = bounds(e, self.ranges), _static(extent)
            if rng is None or n is None or rng[0] < 0 or rng[1] >= n:
                leaves = True
                outer |= free_vars(e) - set(self.order)
        return leaves and any(not c.axes <= set(axes) and c.variables & outer for c in self.conds)

    def _live(self, axes: tuple[str, ...]) -> Expr | None:
        """True over ``axes`` where some instance of the tile runs: the whole mask, or-reduced over the
        axes a load does not have.  A load whose index depends on an outer loop only (``r_rf[j_0]``) is
        evaluated for a whole tile; where every instance of it is masked off (the last, empty split of a
        reduction) its index may be past the buffer."""
        live = self.mask(None, ())
        if live is None:
            return None
        for a in self.order:
            if a not in axes and a in axes_of(live):
                live = Reduce("or", live, a)
        return self.fit(live, axes, "mask")

    def load(self, ld: Load, fill: Const | None = None) -> Expr:
        """A relaxed, masked load, reconciled to the nest's loop order."""
        index = self._gathered(ld)
        axes = slice_axes(index)
        mask = self.mask(frozenset(axes), axes)
        if self._may_leave(ld, axes):
            live = self._live(axes)
            if live is not None:
                mask = live if mask is None else self.fit(_and(self.unify([mask, live])), axes, "mask")  # type: ignore[arg-type]
        other = fill if fill is not None else Const(False if ld.dtype.is_bool else 0, ld.dtype)
        tile = TileLoad(ld.tensor, index, mask, other if mask is not None else None)
        canon = tuple(a for a in self.order if a in axes)
        return permute(tile, canon)

    def _gathered(self, ld: Load) -> tuple[Index, ...]:
        """The relaxed index of ``ld``; a gather index becomes a :class:`Gather` of its own (masked) load."""
        dims = [d for d, i in enumerate(ld.indices) if is_gather_index(i)]
        affine = tuple(Const(0, i.dtype) if d in dims else i for d, i in enumerate(ld.indices))
        index = list(self.access(ld.tensor.name, affine, expr_to_str(ld)))
        for d in dims:
            index[d] = Gather(self.load(ld.indices[d]), expr_to_str(ld.indices[d]))  # type: ignore[arg-type]
        return tuple(index)

    def expr(self, e: Expr, acc: tuple[Load, Expr] | None) -> Expr:
        """A scalar expression in loop variables (see :meth:`sub`) as a tile expression."""
        if isinstance(e, Load):
            if acc is not None and e == acc[0]:
                return acc[1]
            return self.load(e)
        if isinstance(e, Var):
            return self._loopvar(e)
        if isinstance(e, Const):
            return e
        if isinstance(e, BinOp):
            a, b = self.unify([self.expr(e.a, acc), self.expr(e.b, acc)])
            return BinOp(e.op, a, b)
        if isinstance(e, Call):
            return Call(e.fn, (self.expr(e.args[0], acc),))
        if isinstance(e, Cast):
            return Cast(e.type, self.expr(e.value, acc))
        if isinstance(e, Select):
            c, t, f = self.unify([self.expr(x, acc) for x in (e.cond, e.true_value, e.false_value)])
            return Select(c, t, f)
        raise UntileableNest(f"block {self.block.name!r}: cannot tile expression {e}")

    def _loopvar(self, v: Var) -> Expr:
        return Iota(v.name, self.sizes[v.name]) if v.name in self.sizes else v

    # ------------------------------------------------------------ classification
    def translate(self) -> TileStore:
        b = self.block
        st = b.store
        store_text = f"{st.tensor.name}[{', '.join(expr_to_str(i) for i in st.indices)}] (store)"
        store_indices = tuple(self.sub(i) for i in st.indices)
        index = self.access(st.tensor.name, store_indices, store_text)
        out_axes = slice_axes(index)
        reduce_axes = tuple(a for a in self.order
                            if any(a in free_vars(self.fold(self.binding[iv.var.name])) for iv in b.reduce_iters))
        spatial_axes = tuple(a for a in self.order if a not in reduce_axes)
        for a in spatial_axes:
            if a not in out_axes and self.sizes[a] != 1:
                raise UntileableNest(f"block {b.name!r}: the store {store_text} does not use tile loop {a}, "
                                     f"so {self.sizes[a]} instances would write one element")
        value_expr = self.sub(st.value)
        for ld in loads(value_expr):
            if ld.tensor == st.tensor and ld.indices != store_indices and (out_axes or reduce_axes):
                raise UntileableNest(f"block {b.name!r}: reads {expr_to_str(ld)} from the tensor it writes "
                                     f"at another index; the tile would read stale values")
        acc_load = Load(st.tensor, store_indices)
        canon_out = tuple(a for a in self.order if a in out_axes)
        if not reduce_axes:
            acc = self._accumulator(acc_load, canon_out, ())
            value = self.expr(value_expr, (acc_load, acc) if acc is not None else None)
            mask = self.mask(None, ())
        else:
            value, mask = self._reduction(acc_load, canon_out, reduce_axes)
        value = self.fit(value, out_axes, f"value stored by {store_text}")
        if mask is not None:
            mask = self.fit(mask, out_axes, f"mask of {store_text}")
        return TileStore(b.name, st.tensor, index, value, mask)

    def _first(self, reduce_axes: tuple[str, ...]) -> Expr | None:
        """True where the tile holds the block's first reduce instance of an output element."""
        parts = [self.expr(BinOp("==", self.sub(iv.var), Const(0, iv.var.dtype)), None)
                 for iv in self.block.reduce_iters]
        parts += [c.tile for c in self.conds]
        first = _and(self.unify(parts))
        if first is None:
            return None
        for a in reduce_axes:
            if a in axes_of(first):
                first = Reduce("or", first, a)
        return first

    def _accumulator(self, acc_load: Load, canon_out: tuple[str, ...], reduce_axes: tuple[str, ...]) -> Expr | None:
        """The destination's value before this tile: the init where the tile starts the reduction."""
        b = self.block
        if b.reducer is None:
            return None
        current = self.fit(self.load(acc_load), canon_out, "accumulator")
        if b.init is None:
            return current
        first = self._first(reduce_axes)
        init = self.expr(self.sub(b.init), None)
        if first is None:
            return init
        c, i, cur = self.unify([first, init, current])
        return self.fit(Select(c, i, cur), canon_out, "accumulator")

    def _reduction(self, acc_load: Load, canon_out: tuple[str, ...],
                   reduce_axes: tuple[str, ...]) -> tuple[Expr, Expr | None]:
        b = self.block
        red = b.reducer
        assert red is not None or not reduce_axes
        if red is None or red.name not in BUILTIN_REDUCERS:
            raise UntileableNest(f"block {b.name!r} reduces over tile loop(s) {', '.join(reduce_axes)} "
                                 f"with {'no' if red is None else 'the custom'} reducer; tiles reduce with "
                                 f"{', '.join(BUILTIN_REDUCERS)}")
        raw_term = b.reduce_term()
        if raw_term is None:
            raise UntileableNest(f"block {b.name!r}: its update is not acc ⊕ term, so it cannot be reduced "
                                 f"over tile loop(s) {', '.join(reduce_axes)}")
        term = self.sub(raw_term)
        acc = self._accumulator(acc_load, canon_out, reduce_axes)
        assert acc is not None
        full = self.mask(None, ())
        mask = full
        if mask is not None:
            for a in reduce_axes:
                if a in axes_of(mask):
                    mask = Reduce("or", mask, a)
        if red.name == "sum" and len(reduce_axes) == 1:
            dot = self._dot(term, acc, canon_out, reduce_axes[0])
            if dot is not None:
                return dot, mask
        g = self.expr(term, None)
        if full is not None:
            c, g2 = self.unify([full, g])
            g = Select(c, g2, red.identity)
        g = self.fit(g, union_order([g], self.order) + tuple(a for a in reduce_axes if a not in axes_of(g)),
                     "reduction term")
        g = self.fit(g, tuple(a for a in self.order if a in axes_of(g)), "reduction term")
        for a in reduce_axes:
            if a not in axes_of(g):  # a term constant along the axis is still summed over its extent
                g = Broadcast(g, (*((x, self.sizes[x]) for x in axes_of(g)), (a, self.sizes[a])))
            g = Reduce(red.name, g, a)
        x, y = self.unify([acc, g])
        return BinOp(_COMBINE_OP[red.name], x, y), mask

    def _dot(self, term: Expr, acc: Expr, canon_out: tuple[str, ...], k: str) -> Expr | None:
        """``acc + Σ_k x·y`` as a ``Dot`` when the term is (selects around) a product sharing only ``k``."""
        peeled: list[tuple[Expr, bool]] = []
        zero_like = (Const(0.0, term.dtype), Const(0, term.dtype))
        while isinstance(term, Select):
            if k in self.tile_axes(term.cond):
                return None
            if term.true_value in zero_like:
                peeled.append((term.cond, True))
                term = term.false_value
            elif term.false_value in zero_like:
                peeled.append((term.cond, False))
                term = term.true_value
            else:
                return None
        if not (isinstance(term, BinOp) and term.op == "*"):
            return None
        x, y = self.expr(term.a, None), self.expr(term.b, None)
        ax, ay = axes_of(x), axes_of(y)
        if k not in ax or k not in ay or set(ax) | set(ay) != set(canon_out) | {k}:
            return None
        for c in self.conds:
            if k in c.axes:
                if not (c.axes <= set(ax) and c.axes <= set(ay)):
                    return None
        kmask_x, kmask_y = self._kmask(k, ax), self._kmask(k, ay)
        if kmask_x is not None:
            m, xx = self.unify([kmask_x, x])
            x = Select(m, xx, Const(0, x.dtype))
        if kmask_y is not None:
            m, yy = self.unify([kmask_y, y])
            y = Select(m, yy, Const(0, y.dtype))
        batch = [a for a in self.order if a in ax and a in ay and a != k]
        m_axes = [a for a in self.order if a in ax and a not in ay]
        n_axes = [a for a in self.order if a in ay and a not in ax]
        a_tile = self.fit(x, tuple(batch + m_axes + [k]), "dot operand")
        b_tile = self.fit(y, tuple(batch + [k] + n_axes), "dot operand")
        out = tuple(batch + m_axes + n_axes)
        result: Expr = Dot(a_tile, b_tile, self.fit(acc, out, "dot accumulator"), k)
        for cond, identity_when_true in reversed(peeled):
            c = self.fit(self.expr(cond, None), out, "dot condition")
            keep = self.fit(acc, out, "dot accumulator")
            result = Select(c, keep, result) if identity_when_true else Select(c, result, keep)
        return self.fit(result, canon_out, "dot result")

    def _kmask(self, k: str, axes: tuple[str, ...]) -> Expr | None:
        parts = [c.tile for c in self.conds if k in c.axes and c.axes <= set(axes)]
        return _and(self.unify(parts)) if parts else None
