"""Step 1 of both reduction fusions: find the producer reductions of a consumer.

Neptune's INLINEMAPRETURNREDUCE.  Walking back from the consumer along flow
dependences, through map-only (spatial) blocks:

- a reduction that is not yet complete when the fused consumer runs is a
  *producer*: the rolling loop binds one of its reduce iterations (it was fused
  there already, tile by tile), or it is elsewhere and the consumer reads it with
  one value per consumer element (see :func:`find_producers`);
- a reduction complete where the consumer runs (``qk`` under the key-tile loop, or
  ``qk`` read along the key axis) is an input ``c``;
- a map block is *on a path* when some producer lies behind it; those blocks are
  inlined into the consumer (as a copy: other readers keep them);
- a map block on no such path that runs after the rolling loop's nest (a cast of ``v`` written
  just before ``o = Σ p·v``, also read by the epilogue) would be read before it is written once
  the consumer moves into the loop: :func:`bring_maps_before` moves its nest before the loop's
  where the dependences allow, so that it serves the fused consumer and its other readers alike,
  and otherwise inlines a copy into the consumer (recomputed there; other readers keep the map).
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse import deps
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Expr, Var
from polyfuse.ir.stmt import Block, IterVar, Loop, Program, Seq, Stmt
from polyfuse.ir.visit import free_vars, seq
from polyfuse.transforms.inline import compute_inline
from polyfuse.transforms.tree import block_path, blocks_under, find_loop, loops_of


@dataclass(frozen=True)
class Producers:
    """The producer reductions of a consumer and the map blocks between them (closest to the consumer first)."""

    reductions: tuple[str, ...]
    maps: tuple[str, ...]


def rolled_by(block: Block, loop: str) -> bool:
    """True if ``loop`` binds one of ``block``'s reduce iterations."""
    return any(loop in free_vars(b) for iv, b in zip(block.iters, block.bindings, strict=True) if iv.is_reduce)


def under(program: Program, block: str, loop: Loop) -> bool:
    """True if ``block`` is inside ``loop`` (by identity)."""
    return any(lp is loop for lp in loops_of(program, block))


def find_producers(program: Program, consumer: str, loop: Loop) -> Producers:
    """The reductions ``consumer`` needs that are not complete at its fused position (see module docstring).

    A reduction under the rolling loop is a producer iff the loop binds its reduction.
    One in an earlier top-level nest is complete.  One elsewhere is a producer iff the
    consumer — with the map blocks in between inlined — reads it only at indices of
    its own spatial iterations (Neptune's ``X_r[φ_r(i)]``: one producer value per
    consumer element).  A reduction read
    along the consumer's reduction axis, like ``qk[.., j]`` in ``Σ_j exp(qk[.., j] - m)``,
    is an array of inputs ``c``, complete before the consumer needs it.
    """
    sources = _writers_before(program)
    behind: dict[str, set[str]] = {}  # map block -> candidate reductions behind it

    def visit(name: str, seen: frozenset[str]) -> set[str]:
        found: set[str] = set()
        for src in sorted(sources.get(name, ())):
            if src in seen:
                continue
            b = program.block(src)
            if b.is_reduction:
                found.add(src)
            else:
                sub = visit(src, seen | {src})
                if sub:
                    behind[src] = behind.get(src, set()) | sub
                    found |= sub
        return found

    candidates = visit(consumer, frozenset({consumer}))
    c_block = _substituted(program, consumer, tuple(behind))
    reduce_names = {iv.var.name for iv in c_block.reduce_iters}
    reductions = []
    for r in sorted(candidates, key=[b.name for b in program.blocks()].index):
        b = program.block(r)
        if under(program, r, loop):
            if rolled_by(b, loop.var.name):
                reductions.append(r)
            continue
        if _top_index(program, r) < _top_index(program, loop):
            continue  # computed entirely in an earlier nest: complete where the consumer runs
        reads = [ld for ld in _consumer_loads(c_block) if ld.tensor == b.store.tensor]
        if reads and all(not (free_vars(i) & reduce_names) for ld in reads for i in ld.indices):
            reductions.append(r)
    maps = tuple(m for m in behind if behind[m] & set(reductions))
    return Producers(tuple(reductions), maps)


def _writers_before(program: Program) -> dict[str, set[str]]:
    """For each block, the earlier blocks that write a tensor it reads (the block-level dataflow graph).

    Coarser than the instance-level flow dependences, and enough here: every candidate
    it yields is classified by placement and by how the consumer reads it.
    """
    writers: dict[str, list[str]] = {}
    out: dict[str, set[str]] = {}
    for b in program.blocks():
        reads = {ld.tensor.name for ld in _consumer_loads(b)}
        out[b.name] = {w for t in reads for w in writers.get(t, ()) if w != b.name}
        writers.setdefault(b.store.tensor.name, []).append(b.name)
    return out


def _substituted(program: Program, consumer: str, maps: tuple[str, ...]) -> Block:
    """The consumer with the map blocks substituted into it (no checks: only its loads are looked at)."""
    from polyfuse.ir.expr import Load
    from polyfuse.ir.visit import map_block_exprs, map_expr, substitute

    block = program.block(consumer)
    stores = {program.block(m).store.tensor.name: program.block(m).store for m in maps
              if _stores_by_iterations(program.block(m))}
    for _ in range(len(maps) + 1):
        def inline(e):
            return map_expr(e, lambda n: substitute(stores[n.tensor.name].value, dict(zip(
                [i.name for i in stores[n.tensor.name].indices], n.indices, strict=True)))  # type: ignore[attr-defined]
                if isinstance(n, Load) and n.tensor.name in stores else None)
        block = map_block_exprs(block, inline)
    return block


def _stores_by_iterations(block: Block) -> bool:
    """True if ``block`` stores at its iteration variables, each once (``T[e0, e1]`` is then its value with
    ``v_k := e_k``); a compacted temporary's ``xexp[0, j]`` is not, and compute_inline refuses it."""
    names = [i.name for i in block.store.indices if isinstance(i, Var)]
    return len(names) == len(block.store.indices) == len(set(names)) and set(names) == {
        iv.var.name for iv in block.iters}


def _top_index(program: Program, target: str | Loop) -> int:
    """Index of the top-level statement holding block ``target`` (or the loop ``target``)."""
    top = list(program.body.stmts) if isinstance(program.body, Seq) else [program.body]
    for k, stmt in enumerate(top):
        if isinstance(target, str):
            if any(b.name == target for b in blocks_under(stmt)):
                return k
        elif stmt is target or any(x is target for x in _walk_loops(stmt)):
            return k
    raise IllegalTransform(f"{target!r} is not in program {program.name!r}")


def _walk_loops(stmt: Stmt):
    from polyfuse.ir.stmt import walk_stmts

    return (s for s in walk_stmts(stmt) if isinstance(s, Loop))


def inline_paths(program: Program, consumer: str, maps: tuple[str, ...]) -> Program:
    """Inline the map blocks on producer paths into ``consumer`` (only), nearest first."""
    pending = list(maps)
    while pending:
        reads = {ld.tensor.name for ld in _consumer_loads(program.block(consumer))}
        ready = [m for m in pending if program.block(m).store.tensor.name in reads]
        if not ready:
            raise IllegalTransform(f"inlining into block {consumer!r}: blocks {', '.join(pending)} lie on a path "
                                   "from a producer reduction but the consumer does not reach them")
        for m in ready:
            try:
                program = compute_inline(program, block=m, into=[consumer])
            except IllegalTransform as err:
                hint = "" if _stores_by_iterations(program.block(m)) else (
                    " (a store at offsets, as compact_buffers leaves a temporary, is not one expression per element: "
                    "run compact_buffers after the reduction fusions)")
                raise IllegalTransform(f"block {consumer!r} reads a producer reduction through map block {m!r}, "
                                       f"which must be inlined into it: {err}{hint}") from None
            pending.remove(m)
    return program


def producers_in_place(program: Program, consumer: str, loop_block: str, loop: str,
                       what: str) -> tuple[Program, Producers]:
    """Step 1 of both fusions: the producers of ``consumer`` (:func:`find_producers`), the maps on their paths
    inlined into it (:func:`inline_paths`), and the maps it reads after the loop's nest brought before it
    (:func:`bring_maps_before`).  A nest moved there may hold a reduction, complete before the loop now: the
    producers are found again on the moved program (the record keeps every map inlined)."""
    found = find_producers(program, consumer, find_loop(program, loop_block, loop))
    program = inline_paths(program, consumer, found.maps)
    moved = bring_maps_before(program, consumer, loop_block, loop, what)
    if moved is program:
        return program, found
    again = find_producers(moved, consumer, find_loop(moved, loop_block, loop))
    return inline_paths(moved, consumer, again.maps), Producers(again.reductions, found.maps + again.maps)


def bring_maps_before(program: Program, consumer: str, loop_block: str, loop: str, what: str) -> Program:
    """``program`` with every map block that ``consumer`` reads and that runs in a top-level nest after the
    one holding ``loop`` (and before the consumer's) moved, with its whole nest, before that nest, or, where
    a dependence forbids the move (the nest reads what a statement in between writes), inlined as a copy into
    ``consumer``.

    The move is checked like any other step (:func:`~polyfuse.transforms.verify.verify`); the copy is
    ``compute_inline(into=[consumer])``, whose checks apply.  A map that reads a producer reduction is on a
    producer path and is handled by :func:`inline_paths`, before this.
    """
    from polyfuse.transforms.verify import verify

    for _ in range(sum(1 for _ in program.blocks())):
        top = list(program.body.stmts) if isinstance(program.body, Seq) else [program.body]
        at, end = _top_index(program, find_loop(program, loop_block, loop)), _top_index(program, consumer)
        reads = {ld.tensor.name for ld in _consumer_loads(program.block(consumer))}
        late = [b for b in program.blocks() if b.reducer is None and b.store.tensor.name in reads
                and at < _top_index(program, b.name) < end]
        if not late:
            return program
        m = late[0]
        k = _top_index(program, m.name)
        nest = [b.name for b in blocks_under(top[k])]
        moved = program.replace(body=seq(*top[:at], top[k], *top[at:k], *top[k + 1:]))
        try:
            program = verify(program, moved, what=f"{what}: moving map block {m.name!r} before loop {loop!r}",
                             moved=nest)
            continue
        except IllegalTransform:
            pass  # its nest reads what runs in between: recompute the map in the consumer instead
        try:
            program = compute_inline(program, block=m.name, into=[consumer])
        except IllegalTransform as err:
            raise IllegalTransform(
                f"{what}: block {consumer!r} reads {m.store.tensor.name!r}, which map block {m.name!r} writes after "
                f"loop {loop!r}; it can neither move before that loop's nest (a dependence forbids it) nor be "
                f"inlined into {consumer!r}: {err}") from None
    return program


def _consumer_loads(block: Block):
    from polyfuse.ir.visit import loads

    out = loads(block.store.value)
    return out + (loads(block.init) if block.init is not None else [])


# ------------------------------------------------------------------ loop-body surgery shared by the fusions

def body_children(loop: Loop) -> list[Stmt]:
    """The statements of a loop body in order."""
    return list(loop.body.stmts) if isinstance(loop.body, Seq) else [loop.body]


def child_containing(loop: Loop, block: str) -> int:
    """Index of the statement of ``loop``'s body that contains ``block``."""
    for k, s in enumerate(body_children(loop)):
        if any(b.name == block for b in blocks_under(s)):
            return k
    raise IllegalTransform(f"block {block!r} is not inside loop {loop.var.name!r}")


def insert_into(loop: Loop, index: int, stmt: Stmt) -> Loop:
    """``loop`` with ``stmt`` inserted before body statement ``index``."""
    kids = body_children(loop)
    kids.insert(index, stmt)
    return loop.replace(body=seq(*kids))


def spatial_loops_between(program: Program, block: str, loop: Loop) -> list[Loop]:
    """The loops strictly inside ``loop`` around ``block`` that bind only its spatial iterations."""
    path, b = block_path(program, block)
    inner = [s for s in path if isinstance(s, Loop)]
    inner = inner[[k for k, lp in enumerate(inner) if lp is loop][0] + 1:]
    reduce_vars = {v for iv, bnd in zip(b.iters, b.bindings, strict=True) if iv.is_reduce for v in free_vars(bnd)}
    return [lp for lp in inner if lp.var.name not in reduce_vars]


# ------------------------------------------------------------------ naive fusion by alignment

def naive_fuse_aligned(program: Program, *, block: str, producers: list[str], loop_block: str,
                       loop: str, what: str) -> tuple[Program, list]:
    """Place consumer ``block`` under ``loop`` with its reduction aligned to a producer's (naive fusion).

    Neptune's naive fusion puts the consumer's update for reduce index ``j`` in the
    iteration where the producer updates ``j`` — the tag correspondence
    ``X_P[i]⟨j⟩``.  The consumer takes the bindings of an anchor producer (the first
    one whose reduce extents equal its own) for its reduce iterations, and for every
    spatial iteration that indexes the anchor's result the same way the anchor's
    store does; other spatial iterations get loops of their own, in full, unless bound
    through a loop that also encloses ``loop`` (they keep that binding, see
    :func:`_kept_loops`).  Returns the program
    and the temporal dependences it breaks (anything else broken is refused).
    """
    from polyfuse.ir.visit import loads
    from polyfuse.transforms.compute_at import own_nest
    from polyfuse.transforms.tree import replace_node

    consumer = program.block(block)
    anchor, aligned = _anchor(program, consumer, producers, loop, what)
    bindings: dict[str, object] = {}
    p_bind = {iv.var.name: b for iv, b in zip(anchor.iters, anchor.bindings, strict=True)}
    for civ, piv in zip(consumer.reduce_iters, aligned, strict=True):
        bindings[civ.var.name] = p_bind[piv.var.name]
    spatial = {iv.var.name for iv in consumer.spatial_iters}
    for ld in loads(consumer.store.value):
        if ld.tensor != anchor.store.tensor:
            continue
        for c_idx, p_idx in zip(ld.indices, anchor.store.indices, strict=True):
            if isinstance(c_idx, Var) and c_idx.name in spatial and isinstance(p_idx, Var):
                bindings.setdefault(c_idx.name, p_bind[p_idx.name])
    lp = find_loop(program, loop_block, loop)
    inner = spatial_loops_between(program, anchor.name, lp) + _reduce_loops_between(program, anchor.name, lp)
    order = [x.var.name for x in _loops_inside(program, anchor.name, lp)]
    used = set().union(*(free_vars(b) for b in bindings.values())) if bindings else set()  # type: ignore[arg-type]
    copies = sorted((x for x in inner if x.var.name in used), key=lambda x: order.index(x.var.name))
    taken = {x.var.name for x in _loops_inside(program, anchor.name, lp)} | {
        x.var.name for x in loops_of(program, anchor.name)}
    own, kept = _kept_loops(program, consumer, set(bindings), lp, taken)
    bindings.update(kept)
    for iv in consumer.iters:
        if iv.var.name not in bindings:
            name = iv.var.name
            while name in taken:
                name += "_"
            taken.add(name)
            own.append(Loop(Var(name), iv.extent, consumer))  # body replaced below
            bindings[iv.var.name] = Var(name)
    placed = consumer.replace(bindings=tuple(bindings[iv.var.name] for iv in consumer.iters))  # type: ignore[misc]
    nest: Stmt = placed
    for x in reversed(own + copies):
        nest = Loop(x.var, x.extent, nest)
    before = program
    body = replace_node(program.body, own_nest(program, block), None)
    program = program.replace(body=body)
    lp = find_loop(program, loop_block, loop)
    reads = {ld.tensor.name for ld in loads(placed.store.value)}
    last = max(k for k, s in enumerate(body_children(lp))
               if any(b.store.tensor.name in reads for b in blocks_under(s)))
    program = program.replace(body=replace_node(program.body, lp, insert_into(lp, last + 1, nest)))
    from polyfuse.ir.validate import validate

    validate(program)
    info = deps.analyze(before, tensors=deps.tensors_of(before.block(block)))
    return program, deps.check_naive_fusion(info, program, what=what)


def _kept_loops(program: Program, consumer: Block, aligned: set[str], loop: Loop,
                taken: set[str]) -> tuple[list[Loop], dict[str, Expr]]:
    """The consumer's own loops that keep binding a spatial iteration tied to a loop around ``loop``.

    A spatial iteration the anchor does not bind, bound through a loop that also encloses the
    rolling loop (a column tile ``n = 64·n_0 + n_1`` with ``n_0`` outside it, as after
    ``recompute_at``), keeps its binding: enumerating it in full under every iteration of
    ``n_0`` would run each of its instances once per iteration.  Its loops inside the shared
    ones (``n_1``) move with it, if they bind nothing else.  Returns those loops (outermost
    first, renamed where ``taken``) and the kept bindings.
    """
    from polyfuse.ir.simplify import simplify
    from polyfuse.ir.visit import substitute

    path = loops_of(program, consumer.name)
    shared = {x.var.name for x in path if any(x is a for a in _enclosing(program, loop))}
    inner = {x.var.name: x for x in path if x.var.name not in shared}
    uses = {iv.var.name: free_vars(b) for iv, b in zip(consumer.iters, consumer.bindings, strict=True)}
    moved: dict[str, Var] = {}
    kept: dict[str, Expr] = {}
    for iv, b in zip(consumer.iters, consumer.bindings, strict=True):
        mine = uses[iv.var.name] - shared
        if iv.is_reduce or iv.var.name in aligned or not uses[iv.var.name] & shared or not mine <= set(inner):
            continue
        if any(mine & used for other, used in uses.items() if other != iv.var.name):
            continue
        for v in mine:
            name = v
            while name in taken:
                name += "_"
            taken.add(name)
            moved[v] = Var(name)
        kept[iv.var.name] = simplify(substitute(b, {v: moved[v] for v in mine}))
    order = [x.var.name for x in path]
    loops = [Loop(moved[v], inner[v].extent, consumer) for v in sorted(moved, key=order.index)]
    return loops, kept


def _enclosing(program: Program, loop: Loop) -> list[Loop]:
    """The loops around ``loop`` and ``loop`` itself, outermost first."""
    for b in blocks_under(loop):
        path = loops_of(program, b.name)
        return path[:next(k for k, x in enumerate(path) if x is loop) + 1]
    return [loop]


def _anchor(program: Program, consumer: Block, producers: list[str], loop: str,
            what: str) -> tuple[Block, list[IterVar]]:
    """The producer to align with, and its reduce iterations matching the consumer's.

    All its reduce iterations if their extents equal the consumer's; else those the
    rolling loop binds (a max over rows and features, rolled over rows, aligns with a
    sum over rows: the features stay inside each row's iteration)."""
    extents = [iv.extent for iv in consumer.reduce_iters]
    for p in producers:
        b = program.block(p)
        if [iv.extent for iv in b.reduce_iters] == extents:
            return b, list(b.reduce_iters)
        rolled = [iv for iv, bnd in zip(b.iters, b.bindings, strict=True) if iv.is_reduce and loop in free_vars(bnd)]
        if [iv.extent for iv in rolled] == extents:
            return b, rolled
    raise IllegalTransform(f"{what}: no producer ({', '.join(producers) or 'none'}) reduces over the same extents "
                           f"as block {consumer.name!r} ({', '.join(str(e) for e in extents)}), so there is no "
                           "reduction to align it with")


def _loops_inside(program: Program, block: str, loop: Loop) -> list[Loop]:
    path = loops_of(program, block)
    k = [n for n, x in enumerate(path) if x is loop][0]
    return path[k + 1:]


def _reduce_loops_between(program: Program, block: str, loop: Loop) -> list[Loop]:
    spatial = {x.var.name for x in spatial_loops_between(program, block, loop)}
    return [x for x in _loops_inside(program, block, loop) if x.var.name not in spatial]
