"""decompose_reduction: split a reduction's init off into a block of its own (TVM's primitive).

Preconditions (checked first):
  1. the block is a reduction that still has its init, and stores at indices of its spatial iterations only;
  2. the loop encloses the block, and every loop that binds a reduce iteration is that loop or inside it
     (the init of an element must run once, before all of its updates);
  3. no loop from that loop inward binds both spatial and reduce iterations (fuse after decomposing);
  4. no other block under the loop writes a tensor that the init reads (the init now runs earlier);
  5. in the new program the init block's value reaches exactly the first update of each element and
     nothing else reads it — checked with the dependence analysis, so no other access to the tensor can sit
     between the init's new place and the first update.

Before / after (``decompose_reduction(block="s_sum", loop="j")``)::

    for i in range(N):                    for i in range(N):
        for j in range(M):                    s_sum_init[i = i]:  xsum[i] = 0.0
            s_sum[i, j]   (init 0.0)          for j in range(M):
                                                  s_sum[i, j]   (no init: accumulates)

The init block ``<block>_init`` has the block's spatial iterations with the same bindings, under copies of the
loops from the given loop inward that bind them (loops binding only reduce iterations are dropped), and is
placed right before that loop.  With a ``where``, the init block's is the update's with every reduce iteration at
0: exactly the elements that have updates (the first one of each exists, see :class:`~polyfuse.ir.stmt.Block`).
The update keeps its instances and its reducer; its init becomes None, which the IR reads as "accumulate into
the tensor's current value".
"""

from __future__ import annotations

import islpy as isl

from polyfuse import deps
from polyfuse.deps.domains import first_reduce_instances, param_names, prune_where
from polyfuse.deps.islconv import build_map
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Expr, conjuncts
from polyfuse.ir.stmt import Block, Loop, Program, Stmt, Store
from polyfuse.ir.visit import free_vars, loads, seq
from polyfuse.transforms.tree import binding_loop_vars, block_path, blocks_under, find_loop, replace_node
from polyfuse.transforms.verify import verify


def decompose_reduction(program: Program, *, block: str, loop: str) -> tuple[Program, str]:
    """Move ``block``'s init into a new block placed right before loop ``loop``; returns the program and its name."""
    what = f"decompose_reduction of block {block!r} at loop {loop!r}"
    path, b = block_path(program, block)
    lp = find_loop(program, block, loop)
    loops = [s for s in path if isinstance(s, Loop)]
    if b.reducer is None:
        raise IllegalTransform(f"{what}: block {block!r} is not a reduction; it has no init to split off")
    if b.init is None:
        raise IllegalTransform(f"{what}: block {block!r} has no init (its reduction was decomposed already)")
    spatial = {iv.var.name for iv in b.spatial_iters}
    in_store = set().union(*(free_vars(i) for i in b.store.indices))
    if in_store - spatial:
        raise IllegalTransform(f"{what}: block {block!r} stores at indices that use reduce iteration(s) "
                               f"{', '.join(sorted(in_store - spatial))}, so it is not an ordinary reduction")
    pos = next(k for k, s in enumerate(loops) if s is lp)
    spatial_loops = binding_loop_vars(b, reduce=False)
    reduce_loops = binding_loop_vars(b, reduce=True)
    above = [s.var.name for s in loops[:pos] if s.var.name in reduce_loops]
    if above:
        raise IllegalTransform(f"{what}: loop {above[-1]!r} is outside {loop!r} and binds a reduce iteration of "
                               f"{block!r}; the init must precede every update, so decompose at loop "
                               f"{above[0]!r} or further out")
    mixed = [s.var.name for s in loops[pos:] if s.var.name in reduce_loops and s.var.name in spatial_loops]
    if mixed:
        raise IllegalTransform(f"{what}: loop {mixed[0]!r} binds both spatial and reduce iterations of "
                               f"{block!r}; decompose before fusing them")
    init_reads = {ld.tensor.name for ld in loads(b.init)}
    for other in blocks_under(lp):
        if other.name != block and other.store.tensor.name in init_reads:
            raise IllegalTransform(f"{what}: the init of {block!r} reads tensor {other.store.tensor.name!r}, "
                                   f"which block {other.name!r} writes inside loop {loop!r}; the init would read "
                                   "it before that write")
    name = f"{block}_init"
    if any(x.name == name for x in program.blocks()):
        raise IllegalTransform(f"{what}: the program already has a block named {name!r}")

    init_block = Block(name, b.spatial_iters,
                       tuple(bnd for iv, bnd in zip(b.iters, b.bindings, strict=True) if not iv.is_reduce),
                       Store(b.store.tensor, b.store.indices, b.init))
    if b.where is not None:
        init_block = init_block.replace(where=_init_where(program, b, init_block))
    nest: Stmt = init_block
    for s in reversed(loops[pos:]):
        if s.var.name in spatial_loops:
            nest = Loop(s.var, s.extent, nest, s.kind, s.thread, s.annotations)
    updated = replace_node(lp, b, b.replace(init=None))
    new = program.replace(body=replace_node(program.body, lp, seq(nest, updated)))
    verify(program, new, what=what)
    _require_init_reaches_first_updates(new, b, name, what)
    return new, name


def _init_where(program: Program, b: Block, init_block: Block) -> Expr | None:
    """The elements ``b`` updates: its ``where`` at the first update (every reduce iteration 0)."""
    first = b.origin_where()
    return None if first is None else prune_where(init_block, conjuncts(first), param_names(program))


def _require_init_reaches_first_updates(new: Program, b: Block, init_name: str, what: str) -> None:
    """Every first update of ``b`` reads exactly its element's init, and no other instance reads an init."""
    found = deps.analyze(new)
    first = first_reduce_instances(b, found.domains[b.name])
    spatial = [iv.var.name for iv in b.spatial_iters]
    image = ["0" if iv.is_reduce else f"_a{spatial.index(iv.var.name)}" for iv in b.iters]
    expected = (build_map(found.params, spatial, image, [], in_name=init_name, out_name=b.name)
                .intersect_domain(found.domains[init_name]).intersect_range(first))
    reached = isl.Map.empty(expected.get_space())
    for d in found.flow:
        if d.source != init_name:
            continue
        if d.sink != b.name or not d.relation.is_subset(expected):
            raise IllegalTransform(f"{what}: the init would be read by something other than the first update "
                                   f"of its element: {d}")
        reached = reached.union(d.relation)
    missing = expected.subtract(reached)
    if not missing.is_empty():
        intruders = [d for d in found.flow if d.sink == b.name and d.source != init_name
                     and not d.relation.intersect_range(missing.range()).is_empty()]
        cause = f": {intruders[0]}" if intruders else ""
        raise IllegalTransform(f"{what}: the first update of {b.name!r} would not read its init "
                               f"(e.g. {missing.range().sample_point()}){cause}")
