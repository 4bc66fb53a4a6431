"""split_k_update: fuse a reduction with its producers into parallel partial reductions
and a repaired combine (Neptune Alg. 2, FlashDecoding-like).

``split_k_update(block=C, loop_block=B, loop=L)``, where L splits the reductions
(e.g. the outer loop of ``split(j, [n_splits, None])``):

  1. dataflow: producers of C and the map blocks between them, inlined into C (copy);
  2. every producer is privatized over L: its local nest ``P_rf`` computes one partial
     result per iteration of L (``X_P_rf[..., t]``) and its global nest ``P`` combines
     them after L; a producer privatized by an earlier call is reused;
  3. naive fusion: C is placed under L (only temporal producer -> C edges may break);
  4. C is privatized over L too: ``C_rf`` reduces each split *with the local producer
     values* ``X_P_rf[..., t]`` (every split independent: L can run in parallel);
  5. the solver derives h from C's term, and the global combine becomes
     ``X = X ⊕ G(h(X_rf[t], X_P_rf[..., t], X_P))`` (Eq. 11): each partial result is
     repaired from its split's producer values to the global ones.

Guards as in rolling update (each exact): a partial result equal to the identity,
or whose producer values equal the global ones, is taken as it is; a term computed
while a local max/min is still at its infinite identity (a fully masked split)
contributes the identity.

Before / after (Neptune Fig. 1a → Fig. 3, L = j0 with j = j0·2 + j1)::

    for i, j0:                                      # parallel over splits
        for j1: max_l[i, j0] = max(max_l[i, j0], inp[i, 2·j0 + j1])
        for j1: sum_l[i, j0] += exp(inp[i, 2·j0 + j1] - max_l[i, j0])
    for i, j0: max_g[i] = max(max_g[i], max_l[i, j0])
    for i, j0: sum_g[i] += G(exp(max_l[i, j0] - max_g[i]) · sum_l[i, j0])
"""

from __future__ import annotations

from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Expr, Load, Var
from polyfuse.ir.stmt import Loop, Program, Seq
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import loads, seq
from polyfuse.transforms.compute_at import naive_reverse_compute_at, own_nest, reverse_compute_at
from polyfuse.transforms.dataflow import (
    body_children, child_containing, find_producers, inline_paths, naive_fuse_aligned, rolled_by, under,
)
from polyfuse.transforms.fusion_common import Fusion, guard_term, repaired_update, replace_block, solve_for
from polyfuse.transforms.rfactor import read_partials
from polyfuse.transforms.tree import block_path, blocks_under, find_loop, loops_of, replace_node


def split_k_update(program: Program, *, block: str, loop_block: str, loop: str,
                   approximate: bool = False) -> tuple[Program, Fusion]:
    """Fuse reduction ``block`` with its producers as split partials over ``loop`` plus a repaired combine."""
    from polyfuse.transforms.rfactor import rfactor

    what = f"split_k_update of block {block!r} over loop {loop!r} (enclosing block {loop_block!r})"
    if program.block(block).reduce_term() is None or program.block(block).init is None:
        raise IllegalTransform(f"{what}: block {block!r} is not a reduction X = X ⊕ g with an init; "
                               "only such a block can be fused with a repair")

    # Step 1. Producers (a privatized producer is found through its global combine).
    found = find_producers(program, block, find_loop(program, loop_block, loop))
    program = inline_paths(program, block, found.maps)
    order = [b.name for b in program.blocks()]
    producers = sorted(found.reductions, key=order.index)

    # Step 2. Producers under the split loop; those privatized by an earlier call are found through their combine.
    # ``anchor`` is a block that stays under the split loop (a privatized block's loop moves with its combine).
    local: dict[str, tuple[str, Load]] = {}
    created: list[str] = []
    anchor = loop_block
    for p in producers:
        existing = _local_version(program, p, anchor, loop)
        if existing is not None:
            local[p] = existing
            continue
        if not under(program, p, find_loop(program, anchor, loop)):
            program = reverse_compute_at(program, block=p, loop_block=anchor, loop=loop)
        if not rolled_by(program.block(p), loop):
            raise IllegalTransform(f"{what}: loop {loop!r} does not split the reduction of producer {p!r}")

    # Step 3. Naive fusion of the consumer under the split loop: only temporal producer -> C edges may break.
    fresh = [p for p in producers if p not in local]
    try:
        program, broken = naive_reverse_compute_at(program, block=block, loop_block=anchor, loop=loop)
    except IllegalTransform as err:
        if not fresh:
            raise
        try:
            program, broken = naive_fuse_aligned(program, block=block, producers=fresh, loop_block=anchor,
                                                 loop=loop, what=what)
        except IllegalTransform as err2:
            raise IllegalTransform(f"{err}\nand aligning it with a producer's reduction failed too: {err2}") from None
    stray = [d for d in broken if d.sink != block or d.source not in producers]
    if stray:
        raise IllegalTransform(f"{what}: naive fusion breaks a dependence no repair covers: {stray[0]}")

    # Step 4. The repair, from the consumer's own term.
    r_loads, tensors, repair = solve_for(program, block, producers, approximate=approximate, what=what)

    # Step 5. Privatize the consumer, then the producers, redirecting the consumer's local
    # nest to its split's producer values (Neptune's FUSEANDPRIVATIZE + REPLACETENSORREADS).
    program, c_rf = rfactor(program, block=block, loop=loop)
    created.append(c_rf)
    for p in producers:
        if p in local:
            _, partial = local[p]
            x = program.block(p).store.tensor
            axis = _split_axis(program.block(p), partial)
            program = replace_block(program, read_partials(program.block(c_rf), x, partial.tensor, axis, loop, what))
            continue
        program, rf = rfactor(program, block=p, loop=loop, redirect=[c_rf])
        created.append(rf)
    program = _after_producer_combines(program, block, producers)
    program = _after_local_producers(program, c_rf, [local_block(program, p, c_rf, loop) for p in producers], loop)

    # Step 6. Guard the local terms; repair the global combine (Eq. 11).
    partial_reads: dict[Load, Load] = {}
    for ld in r_loads:
        p = tensors[ld.tensor.name]
        found_local = _local_version(program, p, c_rf, loop)
        if found_local is None:
            raise IllegalTransform(f"{what}: producer {p!r} has no partial results under loop {loop!r}")
        partial = found_local[1]
        axis = _split_axis(program.block(p), partial)
        split_iter = _split_iter(program, c_rf, loop)
        idx = list(ld.indices)
        idx.insert(axis, split_iter)
        partial_reads[ld] = Load(partial.tensor, tuple(idx))
    program = guard_term(program, c_rf, [(partial_reads[ld], program.block(tensors[ld.tensor.name]))
                                         for ld in r_loads])
    if repair is not None and not repair.is_identity:
        glob = program.block(block)
        g_split = _combine_split_var(glob)
        old = {}
        for ld in r_loads:
            idx = list(ld.indices)
            idx.insert(_split_axis(program.block(tensors[ld.tensor.name]), partial_reads[ld]), g_split)
            old[ld] = Load(partial_reads[ld].tensor, tuple(idx))
        program = replace_block(program, repaired_update(glob, repair, "term", old, {ld: ld for ld in r_loads}))
    fusion = Fusion("split_k_update", block, loop, tuple(producers), found.maps, tuple(broken), repair,
                    tuple(created))
    return validate(program), fusion


def _local_version(program: Program, producer: str, loop_block: str, loop: str) -> tuple[str, Load] | None:
    """If ``producer`` combines partial results computed under ``loop`` (an earlier privatization over it):
    the local block and the combine's read of the partials; else None.

    A combine reduces over exactly the splits (one reduce iteration with the split
    loop's extent) and reads, at that iteration, the tensor of its local block
    ``<producer>_rf`` (rfactor's name for it) written under the loop.
    """
    b = program.block(producer)
    lp = find_loop(program, loop_block, loop)
    if len(b.reduce_iters) != 1 or b.reduce_iters[0].extent != lp.extent or b.reduce_term() is None:
        return None
    split = b.reduce_iters[0].var
    for ld in loads(b.reduce_term()):  # type: ignore[arg-type]
        if split not in ld.indices:
            continue
        for other in program.blocks():
            if (other.store.tensor == ld.tensor and other.name.startswith(f"{producer}_rf")
                    and any(x is lp for x in loops_of(program, other.name))):
                return other.name, ld
    return None


def local_block(program: Program, producer: str, anchor: str, loop: str) -> str:
    found = _local_version(program, producer, anchor, loop)
    if found is None:
        raise IllegalTransform(f"split_k_update: producer {producer!r} has no local nest under loop {loop!r}")
    return found[0]


def _after_local_producers(program: Program, consumer_rf: str, locals_: list[str], loop: str) -> Program:
    """Move the consumer's local nest after the producers' local nests inside the split loop."""

    lp = find_loop(program, consumer_rf, loop)
    mine = child_containing(lp, consumer_rf)
    last = max(child_containing(lp, name) for name in locals_) if locals_ else -1
    if mine > last:
        return program
    kids = body_children(lp)
    moved = kids.pop(mine)
    kids.insert(last, moved)
    return validate(program.replace(body=replace_node(program.body, lp, lp.replace(body=seq(*kids)))))


def _split_iter(program: Program, rf_block: str, loop: str) -> Var:
    """The iteration variable of the local block bound to the split loop."""
    b = program.block(rf_block)
    for iv, bnd in zip(b.iters, b.bindings, strict=True):
        if not iv.is_reduce and isinstance(bnd, Var) and bnd.name == loop:
            return iv.var
    raise IllegalTransform(f"split_k_update: block {rf_block!r} has no iteration bound to split loop {loop!r}")


def _split_axis(producer_combine, partial: Load) -> int:
    """Where the split dimension sits in the partial results a combine reads."""
    split = _combine_split_var(producer_combine)
    for k, idx in enumerate(partial.indices):
        if idx == split:
            return k
    raise IllegalTransform(f"split_k_update: the combine {producer_combine.name!r} does not index its partial "
                           f"results {partial.tensor.name!r} by its split iteration {split.name!r}")


def _combine_split_var(block) -> Var:
    reduce = block.reduce_iters
    if len(reduce) != 1:
        raise IllegalTransform(f"split_k_update: the combine {block.name!r} should reduce over the splits only")
    return reduce[0].var


def _rf_indices(ld: Load, local_load: Load, split: Expr) -> tuple[Expr, ...]:
    """Index of the local partial for the producer value ``ld`` in split ``split``.

    The global combine reads ``X_rf[idx..., t]``; its indices equal the producer's
    store indices with the split variable in the rf dimension, so the consumer's
    ``X[e...]`` becomes ``X_rf[e..., split]`` (same position for the split)."""
    out: list[Expr] = []
    spatial = iter(ld.indices)
    for idx in local_load.indices:
        if isinstance(idx, Var) and idx not in ld.indices and not _is_producer_index(idx, ld):
            out.append(split)
        else:
            out.append(next(spatial))
    if len(out) != len(local_load.indices):
        raise IllegalTransform(f"split_k_update: cannot index the partial results {local_load.tensor.name}")
    return tuple(out)


def _is_producer_index(idx: Expr, ld: Load) -> bool:
    return any(idx == i for i in ld.indices)


def _after_producer_combines(program: Program, block: str, producers: list[str]) -> Program:
    """Move the consumer's combine nest after the producers' combine nests in the body holding them."""

    nest = own_nest(program, block)
    path, _ = block_path(program, block)
    parent = next((s for s in reversed(path) if isinstance(s, Loop) and _holds(s.body, nest)), None)
    body = program.body if parent is None else parent.body
    kids = list(body.stmts) if isinstance(body, Seq) else [body]
    mine = next(k for k, c in enumerate(kids) if c is nest)
    theirs = [k for k, c in enumerate(kids) if any(b.name in producers for b in blocks_under(c))]
    if not theirs or mine > max(theirs):
        return program
    kids.insert(max(theirs), kids.pop(mine))
    if parent is None:
        return validate(program.replace(body=seq(*kids)))
    return validate(program.replace(body=replace_node(program.body, parent, parent.replace(body=seq(*kids)))))


def _holds(body, nest) -> bool:

    return body is nest or (isinstance(body, Seq) and any(c is nest for c in body.stmts))


__all__ = ["split_k_update"]
