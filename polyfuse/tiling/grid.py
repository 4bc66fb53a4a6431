"""Split a tile program into GPU kernels: which loops become the grid, what each CTA runs.

Every top-level statement becomes one kernel launch, in program order:

1. a loop chain whose iterations touch disjoint memory (:func:`parallel_depth`) is a *CTA
   kernel*: one thread block per iteration of the collapsed chain; the chain's body runs in
   the block, its threads cooperating on every tile statement;
2. a loop with no parallel outer chain is a CTA kernel of one block;
3. a tile statement on its own is a *map kernel*: one thread per element it stores.

Before that, **split-k distribution** (FlashDecoding's partial and combine kernels): where the
body of a parallel chain is ``Seq[L, rest…]`` and ``L`` would become parallel too once the
temporaries allocated per chain iteration and shared by ``L`` and ``rest`` live in global
memory, the chain is distributed into ``chain{L}`` and ``chain{rest}`` and those temporaries are
*promoted*: one copy per chain iteration, indexed by the chain's variables in new leading
dimensions.  Distribution keeps the order of ``L`` before ``rest`` within every chain iteration,
and chain iterations touch disjoint memory, so it preserves the program's meaning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from polyfuse.tiling.parallel import ALLOC, allocated_at, independent_depth, parallel_depth, perfect_chain
from polyfuse.ir.expr import Expr
from polyfuse.ir.stmt import TEMP, WARPS, Loop, Seq, Stmt, Tensor
from polyfuse.tiling.htile import TileLoad, TileProgram, TileStore, map_tile_expr, walk_tile_expr, walk_tile_stmts

CTA = "cta"
MAP = "map"



@dataclass(frozen=True)
class GridNest:
    """One kernel: ``kind`` (:data:`CTA` or :data:`MAP`), its grid loops and the per-CTA body.

    ``shared`` names the temporaries that live in the CTA's shared memory (allocated at the last
    grid loop or inside the body); ``warps`` is the block size a schedule asked for (a ``warps``
    annotation of a grid loop, :meth:`~polyfuse.transforms.schedule.Schedule.warps`), None if none did.
    ``combines``: the nest is the split-k combine of the nest before it (it reads the partial results that nest
    writes to promoted temporaries); whether it runs in that nest's launch is the GPU plan's decision
    (:mod:`polyfuse.emit_cpp.fold`).
    """

    kind: str
    chain: tuple[Loop, ...]
    body: Stmt
    shared: tuple[str, ...]
    warps: int | None = None
    combines: bool = False


def partition(program: TileProgram) -> tuple[TileProgram, tuple[GridNest, ...]]:
    """The kernels of ``program``, and the program with promoted temporaries re-declared."""
    tensors = {t.name: t for t in program.tensors}
    nests: list[GridNest] = []
    for s in _flatten(program.body):
        if isinstance(s, TileStore):
            nests.append(GridNest(MAP, (), s, ()))
            continue
        if not isinstance(s, Loop):
            nests.append(GridNest(CTA, (), s, _allocated_within(s)))
            continue
        for k, piece in enumerate(_distribute(s, tensors)):
            depth = parallel_depth(piece)
            if depth == 0:
                nests.append(GridNest(CTA, (), piece, _allocated_within(piece), _warps((piece,)), k > 0))
                continue
            chain = tuple(perfect_chain(piece)[:depth])
            body = chain[-1].body
            nests.append(GridNest(CTA, chain, body, allocated_at(chain[-1]) + _allocated_within(body), _warps(chain),
                                  k > 0))
    new = dataclasses.replace(program, tensors=tuple(tensors[t.name] for t in program.tensors))
    return new, tuple(nests)


def _warps(chain: tuple[Loop, ...]) -> int | None:
    """The ``warps`` annotation of the first loop of ``chain`` that has one."""
    for lp in chain:
        for k, v in lp.annotations:
            if k == WARPS:
                return int(v)  # type: ignore[call-overload]
    return None


def _flatten(s: Stmt) -> list[Stmt]:
    if isinstance(s, Seq):
        return [x for c in s.stmts for x in _flatten(c)]
    return [s]


def _allocated_within(s: Stmt) -> tuple[str, ...]:
    return tuple(name for x in walk_tile_stmts(s) if isinstance(x, Loop) for name in allocated_at(x))


def _tensors_used(s: Stmt) -> set[str]:
    used: set[str] = set()
    for x in walk_tile_stmts(s):
        if isinstance(x, TileStore):
            used.add(x.tensor.name)
            exprs = [x.value, *([x.mask] if x.mask is not None else [])]
            for e in exprs:
                used |= {n.tensor.name for n in walk_tile_expr(e) if isinstance(n, TileLoad)}
    return used


def _distribute(loop: Loop, tensors: dict[str, Tensor]) -> list[Loop]:
    """``[loop]``, or its split-k distribution into a partial nest and a combine nest.  Also where the grid loops
    above the split all run once (decode with every head in one block at batch 1): the split is then the
    partial nest's grid, not a serial loop of one block."""
    depth = independent_depth(loop)
    chain = perfect_chain(loop)
    if depth == 0:
        return [loop]
    grid = chain[:depth]
    last = grid[-1]
    stmts = _flatten(last.body)
    if len(stmts) < 2 or not isinstance(stmts[0], Loop):
        return [loop]
    # One statement left stays bare, so that a loop of the combine can extend the grid chain.
    first, rest = stmts[0], (stmts[1] if len(stmts) == 2 else Seq(tuple(stmts[1:])))
    in_first, in_rest = _tensors_used(first), _tensors_used(rest)
    allocs = allocated_at(last)
    promoted = [n for n in allocs if n in in_first and n in in_rest]
    # Nothing to promote: the two parts communicate through global temporaries.  Distribute them only where the
    # loops above the split all run once (no grid of their own), so that the split becomes the partial's grid.
    if not promoted and depth == parallel_depth(loop):
        return [loop]
    grown = {n: _promote(tensors[n], grid) for n in promoted}
    first = _rewrite_stmt(first, grown, grid)
    rest = _rewrite_stmt(rest, grown, grid)
    kept = [(k, v) for k, v in last.annotations if k != ALLOC]
    partial_last = last.replace(body=first, annotations=(*kept, *((ALLOC, n) for n in allocs
                                                                 if n in in_first and n not in grown)))
    combine_last = last.replace(body=rest, annotations=(*kept, *((ALLOC, n) for n in allocs
                                                                if n not in in_first and n not in grown)))
    partial, combine = _rebuild(grid, partial_last), _rebuild(grid, combine_last)
    if parallel_depth(partial) <= depth:
        return [loop]
    tensors.update(grown)
    return [partial, *_distribute(combine, tensors)]


def _rebuild(grid: list[Loop], last: Loop) -> Loop:
    out = last
    for lp in reversed(grid[:-1]):
        out = lp.replace(body=out)
    return out


def _promote(t: Tensor, grid: list[Loop]) -> Tensor:
    return dataclasses.replace(t, shape=(*(lp.extent for lp in grid), *t.shape), role=TEMP)


def _rewrite_stmt(s: Stmt, grown: dict[str, Tensor], grid: list[Loop]) -> Stmt:
    prefix = tuple(lp.var for lp in grid)

    def expr(e: Expr) -> Expr:
        return map_tile_expr(e, lambda n: _reindex(n, grown, prefix))

    def walk(x: Stmt) -> Stmt:
        if isinstance(x, Seq):
            return Seq(tuple(walk(c) for c in x.stmts))
        if isinstance(x, Loop):
            return x.replace(body=walk(x.body))
        if isinstance(x, TileStore):
            new = dataclasses.replace(x, value=expr(x.value), mask=None if x.mask is None else expr(x.mask))
            if x.tensor.name in grown:
                new = dataclasses.replace(new, tensor=grown[x.tensor.name], index=(*prefix, *x.index))
            return new
        return x

    return walk(s)


def _reindex(n: Expr, grown: dict[str, Tensor], prefix: tuple[Expr, ...]) -> Expr | None:
    if isinstance(n, TileLoad) and n.tensor.name in grown:
        mask = None if n.mask is None else map_tile_expr(n.mask, lambda m: _reindex(m, grown, prefix))
        return dataclasses.replace(n, tensor=grown[n.tensor.name], index=(*prefix, *n.index), mask=mask)
    return None
