"""Inline a product's temporary into its single reader (GPU tile programs).

In fused attention the key loop stores ``qk = dot(q, kᵀ)`` and the next statement reads it once
(``score = qk·scale``, masked); it stores ``pv_rf = dot(P, v)`` and the next statement reads it
once (``pv = pv·exp(m_prev - m) + pv_rf``).  Each such temporary costs a block-wide pass through
shared memory and a barrier on a GPU.  :func:`inline_products` substitutes the producing
statement's value into its reader, so that the reader holds the dot itself and the CUDA emitter
computes the whole statement in the dot's epilogue, from registers
(:meth:`~polyfuse.emit_cpp.cuda.CudaEmitter.dot_in_place`).

A statement ``S1: T[idx] = v`` (``v`` holding a dot) is inlined into ``S2`` when

* ``T`` is a temporary of ``v``'s dtype (the store rounds nothing), written whole by ``S1`` only
  (no mask, no reducer) and read by ``S2`` only, through exactly one load of the same elements
  (same scalar indices, slice starts and sizes);
* ``S1`` and ``S2`` are statements of one sequence, ``S1`` first, and no statement between them
  writes ``T`` or anything ``v`` reads.

Then ``S2`` reads ``v`` (its axes renamed to the load's, its inner reduction axes renamed apart)
where it read ``T``; ``S1`` and ``T`` are gone.  The values computed are the same operations on
the same operands in the same order, so results are bitwise unchanged (the tile interpreter
checks this in the tests).
"""

from __future__ import annotations

import dataclasses
import itertools

from polyfuse.ir.expr import Const, Expr
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Broadcast,
    Dot,
    Iota,
    Permute,
    Reduce,
    Slice,
    Squeeze,
    TileLoad,
    TileProgram,
    TileStore,
    axes_of,
    fold_constant_selects,
    map_tile_expr,
    walk_tile_expr,
    walk_tile_stmts,
)
from polyfuse.transforms.compact import ALLOC

def inline_products(program: TileProgram) -> TileProgram:
    """``program`` with each dot temporary read once inlined into its reader (see the module docstring)."""
    temps = {t.name for t in program.tensors if t.role not in (INPUT, OUTPUT)}
    body, gone = _fold(program.body), set()
    while True:
        found = _find(body, temps - gone)
        if found is None:
            break
        name, body = found
        gone.add(name)
    if not gone:
        return program
    body = _drop_allocs(body, gone)
    return dataclasses.replace(program, body=body, tensors=tuple(t for t in program.tensors if t.name not in gone))


# ------------------------------------------------------------------ search
def _find(body: Stmt, temps: set[str]) -> tuple[str, Stmt] | None:
    """One inlinable temporary and the body with it inlined, or None."""
    writers: dict[str, list[TileStore]] = {}
    readers: dict[str, list[TileStore]] = {}
    for s in walk_tile_stmts(body):
        if isinstance(s, TileStore):
            writers.setdefault(s.tensor.name, []).append(s)
            for n in _exprs(s):
                for x in walk_tile_expr(n):
                    if isinstance(x, TileLoad):
                        readers.setdefault(x.tensor.name, [])
                        if s not in readers[x.tensor.name]:
                            readers[x.tensor.name].append(s)
    for seq in (s for s in walk_tile_stmts(body) if isinstance(s, Seq)):
        for p, s1 in enumerate(seq.stmts):
            if not isinstance(s1, TileStore) or s1.tensor.name not in temps:
                continue
            name = s1.tensor.name
            if writers.get(name) != [s1] or len(readers.get(name, [])) != 1:
                continue
            s2 = readers[name][0]
            q = next((k for k in range(p + 1, len(seq.stmts)) if seq.stmts[k] is s2), None)
            if q is None or not _inlinable(s1, s2, seq.stmts[p + 1:q]):
                continue
            new_seq = seq.replace(stmts=(*seq.stmts[:p], *seq.stmts[p + 1:q], _substitute(s1, s2),
                                         *seq.stmts[q + 1:]))
            return name, _replace_stmt(body, seq, new_seq)
    return None


def _exprs(s: TileStore) -> list[Expr]:
    return [s.value] + ([s.mask] if s.mask is not None else []) + [
        i.start if isinstance(i, Slice) else i for i in s.index]


def _inlinable(s1: TileStore, s2: TileStore, between: tuple[Stmt, ...]) -> bool:
    if s1.mask is not None or s1.reducer is not None or s1.value.dtype != s1.tensor.dtype:
        return False
    if not any(isinstance(x, Dot) for x in walk_tile_expr(s1.value)):
        return False
    loads = [x for e in _exprs(s2) for x in walk_tile_expr(e)
             if isinstance(x, TileLoad) and x.tensor.name == s1.tensor.name]
    in_value = [x for x in walk_tile_expr(s2.value) if isinstance(x, TileLoad) and x.tensor.name == s1.tensor.name]
    if len(loads) != 1 or len(in_value) != 1 or loads[0].mask is not None:
        return False
    if not _same_elements(s1.index, loads[0].index, s1.tensor.shape):
        return False
    read = {x.tensor.name for x in walk_tile_expr(s1.value) if isinstance(x, TileLoad)} | {s1.tensor.name}
    for s in between:
        for w in walk_tile_stmts(s):
            if isinstance(w, TileStore) and w.tensor.name in read:
                return False
    return True


def _same_elements(store: tuple, load: tuple, shape: tuple) -> bool:
    """Whether two accesses touch the same elements (a scalar index into a dimension of size 1
    can only be 0, whatever expression it is written with)."""
    if len(store) != len(load):
        return False
    for a, b, n in zip(store, load, shape, strict=True):
        if not isinstance(a, Slice) and not isinstance(b, Slice) and isinstance(n, Const) and n.value == 1:
            continue
        if isinstance(a, Slice) != isinstance(b, Slice):
            return False
        if isinstance(a, Slice):
            if a.size != b.size or a.start != b.start:
                return False
        elif a != b:
            return False
    return True


# ------------------------------------------------------------------ rewriting
def _fold(s: Stmt) -> Stmt:
    """Selects on constant conditions replaced by the branch taken (``reduce_or`` tests that
    :func:`~polyfuse.tiling.simplify.simplify_tiles` decided), broadcast back to the select's axes."""
    if isinstance(s, Loop):
        return s.replace(body=_fold(s.body))
    if isinstance(s, Seq):
        return s.replace(stmts=tuple(_fold(c) for c in s.stmts))
    if isinstance(s, TileStore):
        return dataclasses.replace(s, value=fold_constant_selects(s.value))
    return s


def _substitute(s1: TileStore, s2: TileStore) -> TileStore:
    load = next(x for x in walk_tile_expr(s2.value) if isinstance(x, TileLoad) and x.tensor.name == s1.tensor.name)
    outer = {a.axis: b.axis for a, b in zip(s1.index, load.index, strict=True) if isinstance(a, Slice)}
    taken = set(outer.values()) | _axis_names(s2.value)
    fresh = (f"{base}_{k}" for k in itertools.count() for base in ("inl",))
    inner = {}
    for name in sorted(_axis_names(s1.value) - set(outer)):
        new = next(f for f in fresh if f not in taken)
        taken.add(new)
        inner[name] = new
    value = rename_axes(s1.value, {**outer, **inner})
    order = axes_of(load)
    if axes_of(value) != order:
        value = Permute(value, order)
    return dataclasses.replace(s2, value=map_tile_expr(s2.value, lambda x: value if x == load else None))


def _axis_names(e: Expr) -> set[str]:
    names: set[str] = set()
    for x in walk_tile_expr(e):
        if isinstance(x, TileLoad):
            names |= {i.axis for i in x.index if isinstance(i, Slice)}
        elif isinstance(x, (Iota, Squeeze, Reduce, Dot)):
            names.add(x.axis)
        elif isinstance(x, Broadcast):
            names |= {a for a, _ in x.axes}
        elif isinstance(x, Permute):
            names |= set(x.order)
    return names


def rename_axes(e: Expr, to: dict[str, str]) -> Expr:
    """``e`` with its tile axes renamed (``to``: old name → new name; others kept)."""

    def rn(a: str) -> str:
        return to.get(a, a)

    def fn(x: Expr) -> Expr | None:
        if isinstance(x, TileLoad):
            index = tuple(dataclasses.replace(i, axis=rn(i.axis)) if isinstance(i, Slice) else i for i in x.index)
            mask = None if x.mask is None else rename_axes(x.mask, to)
            return dataclasses.replace(x, index=index, mask=mask)
        if isinstance(x, Iota):
            return dataclasses.replace(x, axis=rn(x.axis))
        if isinstance(x, Broadcast):
            return Broadcast(rename_axes(x.tile, to), tuple((rn(a), n) for a, n in x.axes))
        if isinstance(x, Permute):
            return Permute(rename_axes(x.tile, to), tuple(rn(a) for a in x.order))
        if isinstance(x, (Squeeze, Reduce)):
            return dataclasses.replace(x, tile=rename_axes(x.tile, to), axis=rn(x.axis))
        if isinstance(x, Dot):
            return dataclasses.replace(x, a=rename_axes(x.a, to), b=rename_axes(x.b, to), acc=rename_axes(x.acc, to),
                                       axis=rn(x.axis))
        return None

    return map_tile_expr(e, fn)


def _replace_stmt(s: Stmt, old: Stmt, new: Stmt) -> Stmt:
    if s is old:
        return new
    if isinstance(s, Loop):
        body = _replace_stmt(s.body, old, new)
        return s if body is s.body else s.replace(body=body)
    if isinstance(s, Seq):
        stmts = tuple(_replace_stmt(c, old, new) for c in s.stmts)
        return s if all(a is b for a, b in zip(stmts, s.stmts, strict=True)) else s.replace(stmts=stmts)
    return s


def _drop_allocs(s: Stmt, gone: set[str]) -> Stmt:
    if isinstance(s, Loop):
        kept = tuple(a for a in s.annotations if not (a[0] == ALLOC and a[1] in gone))
        return s.replace(body=_drop_allocs(s.body, gone), annotations=kept)
    if isinstance(s, Seq):
        return s.replace(stmts=tuple(_drop_allocs(c, gone) for c in s.stmts))
    return s
