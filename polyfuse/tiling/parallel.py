"""Which outer loops of a tile program may run their iterations in parallel.

A chain of perfectly nested loops ``L1 > L2 > … > Lk`` may be collapsed and run in parallel
when distinct iterations touch disjoint memory:

1. every tensor allocated (``("alloc", T)``) at one of ``L1..Lk-1`` would be shared by the
   iterations of the loops below it, so a chain stops above such a loop's children;
2. every other tensor written inside ``Lk`` is accessed (read or written) there only through
   indices that agree, for every loop var ``v`` of the chain with extent > 1, in one dimension
   whose index is ``a·v + c`` with ``c`` free of the chain's and the body's loop variables and
   ``|a|`` at least the slice size there: then iterations with different ``v`` use disjoint
   elements.

Tensors allocated inside ``Lk`` (or at ``Lk`` itself) are private to an iteration.
"""

from __future__ import annotations

from polyfuse.errors import NonAffineIndex
from polyfuse.ir.affine import linear_form, variables
from polyfuse.ir.expr import Const, Expr
from polyfuse.ir.stmt import WARP_GROUPS, Loop, Stmt
from polyfuse.tiling.htile import Index, Slice, TileLoad, TileStore, walk_tile_expr, walk_tile_stmts

ALLOC = "alloc"


def allocated_at(loop: Loop) -> tuple[str, ...]:
    """Names of the tensors allocated once per iteration of ``loop``."""
    return tuple(str(v) for k, v in loop.annotations if k == ALLOC)


def perfect_chain(loop: Loop) -> list[Loop]:
    """``loop`` and the loops perfectly nested in it (each the only statement of its parent), down to the first
    loop run by groups of a block's warps (:func:`on_warp_groups`), which runs inside a block, never in a grid
    (none where ``loop`` is one)."""
    if on_warp_groups(loop):
        return []
    chain = [loop]
    while isinstance(chain[-1].body, Loop) and not on_warp_groups(chain[-1].body):
        chain.append(chain[-1].body)
    return chain


def on_warp_groups(loop: Loop) -> bool:
    """Whether ``loop``'s iterations run on groups of the warps of a thread block (bound to
    :data:`~polyfuse.ir.stmt.WARP_GROUPS`)."""
    return loop.thread == WARP_GROUPS


def parallel_depth(loop: Loop) -> int:
    """How many loops of ``loop``'s perfect chain can be collapsed into one parallel loop (0: none, or only loops
    that run once)."""
    depth = independent_depth(loop)
    return depth if any(not unit_loop(lp) for lp in perfect_chain(loop)[:depth]) else 0


def independent_depth(loop: Loop) -> int:
    """How many loops of ``loop``'s perfect chain have independent iterations, loops that run once included."""
    chain = perfect_chain(loop)
    for depth in range(len(chain), 0, -1):
        if _independent(chain[:depth]):
            return depth
    return 0


def unit_loop(loop: Loop) -> bool:
    """Whether ``loop`` runs exactly once (a constant extent of 1)."""
    return isinstance(loop.extent, Const) and loop.extent.value == 1


def _accesses(body: Stmt) -> list[tuple[str, tuple[Index, ...], bool]]:
    """(tensor, index, is_write) of every access in ``body``."""
    found: list[tuple[str, tuple[Index, ...], bool]] = []
    for s in walk_tile_stmts(body):
        if isinstance(s, TileStore):
            found.append((s.tensor.name, s.index, True))
            exprs: list[Expr] = [s.value, *(i for i in s.index if not isinstance(i, Slice))]
            exprs += [i.start for i in s.index if isinstance(i, Slice)]
            if s.mask is not None:
                exprs.append(s.mask)
            for e in exprs:
                found += [(n.tensor.name, n.index, False) for n in walk_tile_expr(e) if isinstance(n, TileLoad)]
    return found


def _loop_vars(body: Stmt) -> set[str]:
    return {s.var.name for s in walk_tile_stmts(body) if isinstance(s, Loop)}


def _independent(chain: list[Loop]) -> bool:
    if any(allocated_at(lp) for lp in chain[:-1]):
        return False
    body = chain[-1].body
    private = set(allocated_at(chain[-1])) | {t for s in walk_tile_stmts(body) if isinstance(s, Loop)
                                              for t in allocated_at(s)}
    chain_vars = {lp.var.name for lp in chain}
    bound = chain_vars | _loop_vars(body)
    accesses = [a for a in _accesses(body) if a[0] not in private]
    written = {name for name, _, w in accesses if w}
    for name in written:
        indices = [index for t, index, _ in accesses if t == name]
        for lp in chain:
            if not unit_loop(lp) and not any(_separates(indices, d, lp.var.name, bound)
                                         for d in range(len(indices[0]))):
                return False
    return True


def _separates(indices: list[tuple[Index, ...]], dim: int, var: str, bound: set[str]) -> bool:
    first = indices[0][dim]
    if any(index[dim] != first for index in indices[1:]):
        return False
    start, size = (first.start, first.size) if isinstance(first, Slice) else (first, 1)
    try:
        form = linear_form(start)
    except NonAffineIndex:
        return False
    coeff = form.get(var, 0)
    rest = {k: v for k, v in form.items() if k != var}
    return abs(coeff) >= size and not (variables(rest) & bound)

