"""Padded rows: the ragged last tile of a parallel axis computed whole, its extra rows discarded.

A row loop split into tiles that do not divide it (4096 query rows in tiles of 192) guards every
statement of the last tile with the rows it holds: ``192·i_0 + iota(ax0) < 4096``.  (A rolling loop's ragged
last tile — 40 keys in tiles of 32 — is a family too; the statements that reduce or contract over its keys keep
the guard, by the rule below, and the proof does not ask the loop to be parallel.)  The guard is in
each store's mask, in each load's mask, and inside the selects that start a reduction, so every
statement of the tile loop is masked: the GPU code generator then keeps the tile in shared memory
instead of registers, cannot inline the products into their readers nor issue them late, and
evaluates the guard on every element.  GPU kernels compute the extra rows instead (as
FlashAttention does): they cost nothing in a tile that is computed whole anyway, and what they
compute never reaches memory outside the block.

:func:`pad_rows` drops such a guard where that is proven harmless.  A *family* is one guard
``T·g + iota(ax, T) < N`` (``g`` a loop of constant extent ``E`` with ``T·(E − 1) < N < T·E``); its
*statements* are the tile statements whose value, mask or loads contain it, ``ax`` being each one's
row axis.  A temporary is *padded* when every access to it anywhere in the program is in a statement
of the family, through a slice ``0 .. T − 1`` along that statement's row axis in a dimension of
extent ``T``: so its rows are the block's rows, each statement reads and writes row ``r`` of it for its
own row ``r`` only, and no statement outside the family sees it.  The guard is dropped (replaced by
*true*) in the statements that store to a padded temporary — everywhere in them but the masks of
their loads of other tensors (inputs, outputs, temporaries in global memory), which stay — provided
they neither reduce nor contract over their row axis.  Statements storing elsewhere keep it whole.

Why the results are unchanged: for a row the guard admits, every dropped guard was *true*, so each
statement computes what it computed.  A row the guard refuses now computes values, from loads that
still read the masked ``other`` where they would leave the tensor, into the padded temporaries only;
those rows are read only by the same row of statements of the family (no reduction or product over
the row axis, every access a slice at offset 0), and every store to any other tensor still carries
the guard.  So nothing a refused row computes reaches a row the guard admits or memory the program
did not write.  A refused row may compute inf or NaN (from zero-filled inputs); GPU arithmetic does
not trap, and the row is discarded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from polyfuse.ir.expr import BinOp, Call, Const, Expr, Var
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop, Seq, Stmt, Tensor
from polyfuse.tiling.htile import (
    Dot, Iota, Reduce, Slice, TileLoad, TileProgram, TileStore, broadcast_like, constant_condition,
    fold_constant_selects, map_tile_expr, walk_tile_expr, walk_tile_stmts,
)

@dataclasses.dataclass(frozen=True)
class _Guard:
    """``size·loop + iota(·, size) < extent``: the rows of tile ``loop`` that exist."""

    loop: str
    size: int
    extent: int


def pad_rows(program: TileProgram) -> TileProgram:
    """``program`` with the row guards of ragged parallel tiles dropped where proven harmless (module
    docstring)."""
    extents = {lp.var.name: int(lp.extent.value) for lp in walk_tile_stmts(program.body)
               if isinstance(lp, Loop) and isinstance(lp.extent, Const)}
    temps = {t.name: t for t in program.tensors if t.role not in (INPUT, OUTPUT)}
    families = dict.fromkeys(g for s in _stores(program.body) for g, _ in _guards(s, extents))
    body = program.body
    for guard in families:
        body = _pad(body, guard, extents, temps)
    return program if body is program.body else dataclasses.replace(program, body=body)


def _pad(body: Stmt, guard: _Guard, extents: dict[str, int], temps: dict[str, Tensor]) -> Stmt:
    stores = list(_stores(body))
    rows: dict[int, str] = {}
    for s in stores:
        axes = {ax for g, ax in _guards(s, extents) if g == guard}
        if len(axes) > 1:
            return body
        if axes:
            rows[id(s)] = axes.pop()
    padded = set(temps)
    for s in stores:
        for name, index in _accesses(s):
            if name in padded and not _row_slice(index, rows.get(id(s)), guard.size, temps[name].shape):
                padded.discard(name)
    changed = {id(s) for s in stores if id(s) in rows and s.tensor.name in padded
               and not _mixes_rows(s, rows[id(s)])}
    if not changed:
        return body

    def drop(s: TileStore) -> TileStore:
        if id(s) not in changed:
            return s
        fn = _dropper(guard, padded)
        value = _fold(map_tile_expr(s.value, fn))
        mask = None if s.mask is None else _fold(map_tile_expr(s.mask, fn))
        return dataclasses.replace(s, value=value, mask=None if constant_condition(mask) is True else mask)

    return _map_stores(body, drop)


def _dropper(guard: _Guard, padded: set[str]):
    def fn(e: Expr) -> Expr | None:
        if isinstance(e, TileLoad):
            if e.tensor.name not in padded:
                return e  # the mask of a load of another tensor keeps the guard
            mask = None if e.mask is None else _fold(map_tile_expr(e.mask, fn))
            if mask is None or constant_condition(mask) is True:
                return dataclasses.replace(e, mask=None, other=None)
            return dataclasses.replace(e, mask=mask)
        found = _match(e)
        if found is not None and found[0] == guard:
            return Const(True, e.dtype)
        return None
    return fn


def _match(e: Expr) -> tuple[_Guard, str] | None:
    """``(guard, axis)`` where ``e`` is ``size·loop + iota(axis, size) < extent`` (terms in either order)."""
    if not (isinstance(e, BinOp) and e.op == "<" and isinstance(e.b, Const) and isinstance(e.a, BinOp)
            and e.a.op == "+"):
        return None
    for scaled, iota in ((e.a.a, e.a.b), (e.a.b, e.a.a)):
        if not (isinstance(iota, Iota) and isinstance(scaled, BinOp) and scaled.op == "*"):
            continue
        for var, size in ((scaled.a, scaled.b), (scaled.b, scaled.a)):
            if isinstance(var, Var) and isinstance(size, Const) and size.value == iota.size:
                return _Guard(var.name, iota.size, int(e.b.value)), iota.axis
    return None


def _guards(s: TileStore, extents: dict[str, int]) -> Iterator[tuple[_Guard, str]]:
    """The row guards of ragged tiles in ``s`` (value, mask, loads' masks), with their row axes."""
    for root in (s.value, *((s.mask,) if s.mask is not None else ())):
        for node in walk_tile_expr(root):
            found = _match(node)
            if found is None:
                continue
            g, axis = found
            e = extents.get(g.loop)
            if e is not None and g.size * (e - 1) < g.extent < g.size * e:
                yield g, axis


def _accesses(s: TileStore) -> Iterator[tuple[str, tuple]]:
    yield s.tensor.name, s.index
    for root in (s.value, *((s.mask,) if s.mask is not None else ())):
        for node in walk_tile_expr(root):
            if isinstance(node, TileLoad):
                yield node.tensor.name, node.index


def _row_slice(index: tuple, axis: str | None, size: int, shape: tuple) -> bool:
    """Whether an access (in a statement of row axis ``axis``) takes whole tile rows 0 .. size − 1 of a
    dimension of extent ``size`` along ``axis``, and ``axis`` nowhere else."""
    if axis is None:
        return False
    dims = [d for d, i in enumerate(index) if isinstance(i, Slice) and i.axis == axis]
    if len(dims) != 1:
        return False
    (d,) = dims
    i = index[d]
    return (isinstance(i.start, Const) and i.start.value == 0 and i.size == size
            and isinstance(shape[d], Const) and shape[d].value == size)


def _mixes_rows(s: TileStore, axis: str) -> bool:
    """Whether ``s`` reduces or contracts over its row axis (a row's value would read other rows)."""
    return any((isinstance(n, Reduce) and n.axis == axis) or (isinstance(n, Dot) and n.axis == axis)
               for n in walk_tile_expr(s.value))


def _fold(e: Expr) -> Expr:
    """``e`` with the logic of decided conditions folded (``true ∧ x`` → ``x``, ``not true`` → ``false``) and the
    selects on them replaced by the branch taken, each kept over the axes of what it replaces."""
    def fn(x: Expr) -> Expr | None:
        if isinstance(x, BinOp) and x.op in ("and", "or"):
            a, b = _fold(x.a), _fold(x.b)
            neutral = x.op == "and"  # true ∧ y = y; false ∨ y = y
            for known, other in ((a, b), (b, a)):
                if constant_condition(known) is neutral and (kept := broadcast_like(other, x)) is not None:
                    return kept
            return BinOp(x.op, a, b)
        if isinstance(x, Call) and x.fn == "not":
            a = _fold(x.args[0])
            value = constant_condition(a)
            return Call("not", (a,)) if value is None else broadcast_like(Const(not value, x.dtype), x)
        return None
    return fold_constant_selects(map_tile_expr(e, fn))


def _stores(s: Stmt) -> Iterator[TileStore]:
    return (x for x in walk_tile_stmts(s) if isinstance(x, TileStore))


def _map_stores(s: Stmt, fn) -> Stmt:
    if isinstance(s, TileStore):
        return fn(s)
    if isinstance(s, Loop):
        return s.replace(body=_map_stores(s.body, fn))
    if isinstance(s, Seq):
        return s.replace(stmts=tuple(_map_stores(c, fn) for c in s.stmts))
    return s
