"""fuse_siblings: run a block in the loop of another over the same iteration space (horizontal fusion).

Two reductions over the same rows with no dependence between them (the statistics of two tensors, a dot
product next to two norms) are *siblings*: neither reads what the other writes, so neither is a producer
that a repair would need, and ``reverse_compute_at`` has nothing to cut the moved block by.  They can
still share one pass over the data: instance ``(i, j)`` of the sibling runs where instance ``(i, j)`` of
the anchor runs.

``fuse_siblings(program, block=B, loop_block=A, loop=L)`` moves B under loop L (which encloses A),
at the end of L's body (siblings in the order they were fused), with B's iterations bound as A's are:

  1. B and A are different blocks, L encloses A and not B;
  2. *same iteration space*: B's spatial iterations and reduce iterations pair, in order, with A's
     (spatial with spatial, reduce with reduce) and each pair has equal extents; B's k-th iteration
     takes the binding of A's k-th.  Inside L, B gets copies of A's loops (sharing every loop of A when
     L is A's innermost loop: one loop body);
  3. every instance of B still runs exactly once (its own ``where`` is kept);
  4. every dependence of the program holds (ISL, :func:`~polyfuse.transforms.verify.verify`).  A sibling
     reads nothing a block under L writes; a block that does is a producer of B, and the refusal says
     which fusion repairs it (``rolling_update`` / ``split_k_update``).

``rolling_update`` of a reduction with no producer and nothing under the loop that it reads places it
this way too (a sibling needs no repair), so the fusions of a cascade and the statistics beside it can
all share the rolling loop.

Before / after (``fuse_siblings(block="s_b", loop_block="s_a", loop="j")``)::

    for i, j: a[i] = max(a[i], x[i, j])          for i:
    for i, j: b[i] = b[i] + y[i, j]·y[i, j]          for j:
                                                         a[i] = max(a[i], x[i, j])
                                                         b[i] = b[i] + y[i, j]·y[i, j]
"""

from __future__ import annotations

from polyfuse import deps
from polyfuse.errors import IllegalTransform
from polyfuse.ir.stmt import Block, Loop, Program, Stmt
from polyfuse.ir.validate import validate
from polyfuse.transforms.compute_at import own_nest, require_runs_once
from polyfuse.transforms.dataflow import body_children, insert_into, under
from polyfuse.transforms.tree import blocks_under, find_loop, loops_of, replace_node


def fuse_siblings(program: Program, *, block: str, loop_block: str, loop: str, what: str | None = None) -> Program:
    """Move ``block`` under ``loop`` (enclosing ``loop_block``), bound as ``loop_block``; see the module
    docstring.  ``what`` names the call in messages (another primitive placing a sibling this way)."""
    what = what or f"fuse_siblings of block {block!r} with block {loop_block!r} under loop {loop!r}"

    # Step 1. Handles.
    if block == loop_block:
        raise IllegalTransform(f"{what}: a block is not its own sibling; name another block under loop {loop!r}")
    target = find_loop(program, loop_block, loop)
    if under(program, block, target):
        raise IllegalTransform(f"{what}: block {block!r} is already under loop {loop!r}")
    sibling, anchor = program.block(block), program.block(loop_block)

    # Step 2. Same iteration space.
    try:
        bindings = _paired_bindings(sibling, anchor, what)
    except IllegalTransform as err:
        if not loop_block.endswith("_rf"):
            raise
        raise IllegalTransform(f"{err}; {loop_block!r} holds the partials of a privatized reduction (rfactor, "
                               "split_k_update), whose iterations are no longer the row's: fuse the siblings before "
                               "privatizing it") from None

    # Step 3. Rewrite: B's nest leaves, B joins L bound as A, under copies of A's loops inside L.
    inner = loops_of(program, loop_block)
    inner = inner[next(k for k, lp in enumerate(inner) if lp is target) + 1:]
    nest: Stmt = sibling.replace(bindings=bindings)
    for lp in reversed(inner):
        nest = Loop(lp.var, lp.extent, nest)
    rest = program.replace(body=replace_node(program.body, own_nest(program, block), None))
    target = find_loop(rest, loop_block, loop)
    placed = insert_into(target, len(body_children(target)), nest)
    new = validate(rest.replace(body=replace_node(rest.body, target, placed)))
    require_runs_once(new, block, loop, what, reverse=True)

    # Step 4. Every dependence holds.
    info = deps.analyze(program, tensors=deps.tensors_of(sibling))
    broken = deps.violated(info, new)
    if broken:
        raise IllegalTransform(_refusal(program, broken, block, target, what))
    return new


def paired_iterations(sibling: Block, anchor: Block) -> bool:
    """True if ``sibling`` has ``anchor``'s iteration space (condition 2)."""
    try:
        _paired_bindings(sibling, anchor, "")
    except IllegalTransform:
        return False
    return True


def sibling_anchor(program: Program, block: str, loop_block: str, loop: str) -> str:
    """The block under ``loop`` to align ``block`` with: ``loop_block`` if it has ``block``'s iteration space,
    else the first block under the loop that has (``loop_block`` when none has: its refusal says why)."""
    sibling = program.block(block)
    candidates = [program.block(loop_block)] + [b for b in blocks_under(find_loop(program, loop_block, loop))
                                                if b.name not in (block, loop_block)]
    return next((b.name for b in candidates if paired_iterations(sibling, b)), loop_block)


def reads_under(program: Program, block: str, loop_block: str, loop: str) -> list[str]:
    """The blocks under ``loop`` (enclosing ``loop_block``) that write a tensor ``block`` reads."""
    from polyfuse.transforms.compute_at import loaded_tensors

    wanted = set(loaded_tensors(program.block(block)))
    return [b.name for b in blocks_under(find_loop(program, loop_block, loop))
            if b.name != block and b.store.tensor.name in wanted]


def _paired_bindings(sibling: Block, anchor: Block, what: str) -> tuple:
    out = {}
    for kind, mine, theirs in (("spatial", sibling.spatial_iters, anchor.spatial_iters),
                               ("reduce", sibling.reduce_iters, anchor.reduce_iters)):
        shape = ", ".join(f"{iv.var.name} < {iv.extent}" for iv in mine) or "none"
        other = ", ".join(f"{iv.var.name} < {iv.extent}" for iv in theirs) or "none"
        if [iv.extent for iv in mine] != [iv.extent for iv in theirs]:
            raise IllegalTransform(
                f"{what}: block {sibling.name!r} and block {anchor.name!r} do not have the same iteration space: "
                f"{kind} iterations {shape} against {other}; siblings pair their spatial and their reduce "
                "iterations in order, with equal extents (split or tile the anchor's loops, not the iterations)")
        binding = dict(zip((iv.var.name for iv in anchor.iters), anchor.bindings, strict=True))
        out |= {a.var.name: binding[b.var.name] for a, b in zip(mine, theirs, strict=True)}
    return tuple(out[iv.var.name] for iv in sibling.iters)


def _refusal(program: Program, broken: list, block: str, loop: Loop, what: str) -> str:
    """Why the sibling cannot share the loop, in the user's terms: a producer under it (then which fusion),
    or the dependence in ISL notation."""
    inside = {b.name for b in blocks_under(loop)}
    for d in broken:
        if d.sink == block and d.source in inside and d.kind == "flow":
            reducer = program.block(d.source).reducer
            how = (f"fuse it with sch.rolling_update({block!r}, …) or sch.split_k_update({block!r}, …), which "
                   "repair a read of a running reduction" if reducer is not None and program.block(block).reducer
                   is not None else f"place it with sch.reverse_compute_at({block!r}, …)")
            return (f"{what}: block {block!r} reads {d.tensor!r}, which block {d.source!r} writes under loop "
                    f"{loop.var.name!r}, so they are not siblings ({d.source!r} is a producer of {block!r}); {how}:"
                    f"\n  {d}")
        if d.source == block and d.sink in inside:
            return (f"{what}: block {d.sink!r} under loop {loop.var.name!r} reads {d.tensor!r}, which block "
                    f"{block!r} writes, so it must run after all of {block!r}: they are not siblings:\n  {d}")
    return f"{what} violates {len(broken)} dependence(s):\n" + "\n".join(f"  {d}" for d in broken)


__all__ = ["fuse_siblings", "paired_iterations", "reads_under", "sibling_anchor"]
