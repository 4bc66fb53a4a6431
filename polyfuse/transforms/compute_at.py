"""compute_at / reverse_compute_at: move a block under a loop of its consumer / producer.

Both move a block's own loop nest (the loops that enclose nothing but it) under
a loop ``loop`` enclosing another block, and give it new loops covering only the
region one iteration of ``loop`` (and of the loops around it) deals with.  The
region comes from ISL (:mod:`polyfuse.transforms.region`): the instances of the
blocks under ``loop`` as a function of the loop variables down to ``loop``,
carried through access relations to the moved block's instances, bounded per
iteration variable by a box ``lo(outer) + ax``, ``ax < size`` (the implied guard
trims a partial last tile).

``compute_at(block=P, loop_block=C, loop=L)`` (P produces what blocks under L read):
  1. P and C are different blocks, L encloses C;
  2. some block under L reads the tensor P writes;
  3. the instances of P those readers need in one iteration of L form a box of
     constant size per spatial iteration variable; P's reduce iterations keep
     their full range (a reduction is not cut);
  4. every instance of P still runs exactly once: the regions of different
     iterations must not overlap (no recomputation, so a stencil is refused)
     and together must cover P (readers elsewhere would lose their values);
  5. the dependences of the program hold (``verify``): e.g. another reader of P's
     result that runs before the new position is reported with a witness.

P is placed just before the first statement of L's body that reads its tensor.

``reverse_compute_at(block=C, loop_block=P, loop=L)`` (C consumes what blocks under L write):
  1-2. as above, with "some block under L writes a tensor C reads";
  3. C's instances handled in one iteration of L are those all of whose reads of
     tensors written under L fall in what that iteration writes; every iteration
     variable of C is cut to that region, reduce iterations included (which is
     what lets a reduction follow its producer tile by tile);
  4-5. as above; ``check="naive"`` (Neptune's naive fusion) lets temporal
     dependences break — a reduction's value read before it is final — and
     :func:`naive_reverse_compute_at` returns those broken dependences.

C is placed just after the last statement of L's body that writes a tensor it reads.

Before / after (``compute_at(block="q_s", loop_block="qk", loop="i_0")``)::

    for b, h, i, d:                          for b, h, i_0:
        q_s[b, h, i, d]                          for ax0 in range(32):
    for b, h, i_0:                                   for ax1 in range(D):
        for j, i_1, d:                                   q_s[b, h, i = i_0 * 32 + ax0, d = ax1]
            qk[..., i = i_0 * 32 + i_1, ...]     for j, i_1, d:
                                                     qk[..., i = i_0 * 32 + i_1, ...]
"""

from __future__ import annotations

import islpy as isl

from polyfuse import deps
from polyfuse.deps.access import LOAD, Access, block_accesses
from polyfuse.deps.dependence import Dependence
from polyfuse.deps.domains import iteration_domain, param_names
from polyfuse.errors import IllegalTransform, InternalError
from polyfuse.ir.expr import Const, Expr, Load, Var, const
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import Block, Loop, Program, Seq, Stmt
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import loads, seq
from polyfuse.transforms.region import Extent, box, instances_at
from polyfuse.transforms.tree import block_path, blocks_under, find_loop, loops_of, replace_node
from polyfuse.transforms.verify import verify

FULL = "full"
NAIVE = "naive"


def compute_at(program: Program, *, block: str, loop_block: str, loop: str) -> Program:
    """Move producer ``block`` under loop ``loop`` (enclosing ``loop_block``), before its first reader there."""
    what = f"compute_at of block {block!r} under loop {loop!r} (enclosing block {loop_block!r})"
    return verify(program, _place(program, block, loop_block, loop, reverse=False, what=what), what=what,
                  moved=[block])


def reverse_compute_at(program: Program, *, block: str, loop_block: str, loop: str, check: str = FULL) -> Program:
    """Move consumer ``block`` under loop ``loop`` (enclosing ``loop_block``), after the last writer it reads.

    ``check="naive"`` allows broken temporal dependences (see the module
    docstring); use :func:`naive_reverse_compute_at` to get them back.
    """
    if check == NAIVE:
        return naive_reverse_compute_at(program, block=block, loop_block=loop_block, loop=loop)[0]
    if check != FULL:
        raise IllegalTransform(f"reverse_compute_at of block {block!r}: check must be {FULL!r} or {NAIVE!r}, "
                               f"got {check!r}")
    what = f"reverse_compute_at of block {block!r} under loop {loop!r} (enclosing block {loop_block!r})"
    return verify(program, _place(program, block, loop_block, loop, reverse=True, what=what), what=what,
                  moved=[block])


def naive_reverse_compute_at(program: Program, *, block: str, loop_block: str,
                             loop: str) -> tuple[Program, list[Dependence]]:
    """``reverse_compute_at`` checked as naive fusion: the program and the temporal dependences it breaks.

    Every other dependence must hold (IllegalTransform naming it otherwise).
    """
    what = f"naive reverse_compute_at of block {block!r} under loop {loop!r} (enclosing block {loop_block!r})"
    new = validate(_place(program, block, loop_block, loop, reverse=True, what=what))
    info = deps.analyze(program, tensors=deps.tensors_of(program.block(block)))
    return new, deps.check_naive_fusion(info, new, what=what)


# ------------------------------------------------------------------ tree helpers (shared with inline, cache)

def own_nest(program: Program, block: str) -> Stmt:
    """The outermost statement that holds ``block`` and nothing else (its own loops, or the block)."""
    path, found = block_path(program, block)
    root: Stmt = found
    for s in reversed(path):
        if not (isinstance(s, Loop) and s.body is root):
            break
        root = s
    return root


def body_stmts(stmt: Stmt) -> list[Stmt]:
    """The statements of a body in order (a sequence flattened, anything else alone)."""
    if isinstance(stmt, Seq):
        return [c for s in stmt.stmts for c in body_stmts(s)]
    return [stmt]


def block_loads(block: Block) -> list[Load]:
    """Every load of a block: its stored value's, then its init's."""
    exprs = [block.store.value] + ([block.init] if block.init is not None else [])
    return [ld for e in exprs for ld in loads(e)]


def reads_tensor(block: Block, tensor: str) -> bool:
    return any(ld.tensor.name == tensor for ld in block_loads(block))


def loaded_tensors(block: Block) -> list[str]:
    """Tensors the block reads other than its own output, in order of first load (Neptune's read index)."""
    out: list[str] = []
    for ld in block_loads(block):
        if ld.tensor.name != block.store.tensor.name and ld.tensor.name not in out:
            out.append(ld.tensor.name)
    return out


# ------------------------------------------------------------------ the shared core

def _place(program: Program, block: str, loop_block: str, loop: str, *, reverse: bool, what: str) -> Program:
    # Step 1. Check the handles and find the blocks under the loop the moved block talks to.
    if block == loop_block:
        raise IllegalTransform(f"{what}: a block cannot be placed under a loop of its own")
    target = find_loop(program, loop_block, loop)
    outer = _loops_down_to(program, loop_block, target)
    _, mover = block_path(program, block)
    nest = own_nest(program, block)
    params = param_names(program)
    under = [b for b in blocks_under(target) if b.name != block]
    if reverse:
        wanted = {a.tensor for a in _accesses(mover, params) if a.is_read and a.role == LOAD}
        partners = [b for b in under if b.store.tensor.name in wanted]
        if not partners:
            raise IllegalTransform(f"{what}: no block under loop {loop!r} writes a tensor that {block!r} reads "
                                   f"({', '.join(sorted(wanted)) or 'it reads none'})")
    else:
        tensor = mover.store.tensor.name
        partners = [b for b in under if reads_tensor(b, tensor)]
        if not partners:
            raise IllegalTransform(f"{what}: no block under loop {loop!r} reads tensor {tensor!r}, "
                                   f"which {block!r} writes")

    # Step 2. The region of the moved block that one iteration of the loop deals with.
    region = (_consumable if reverse else _needed)(program, params, outer, mover, partners)
    if region.is_empty():
        why = ("has all its reads of tensors written there within a single iteration (its reads span several "
               "iterations, as in a stencil)" if reverse else "is read by the blocks there")
        raise IllegalTransform(f"{what}: no instance of block {block!r} {why} of loop {loop!r}")
    extents = box(region, what=f"{what}: region of block {block!r} per iteration")
    if not reverse:
        extents = [Extent(const(0), iv.extent) if iv.is_reduce else e
                   for iv, e in zip(mover.iters, extents, strict=True)]

    # Step 3. Rewrite: drop the old nest, build the new one, insert it next to the partners.
    taken = {lp.var.name for lp in outer} | set(params)
    new_nest = _nest(mover, extents, taken)
    rest = program.replace(body=replace_node(program.body, nest, None))
    target = find_loop(rest, loop_block, loop)
    kids = body_stmts(target.body)
    names = {b.name for b in partners}
    hits = [k for k, s in enumerate(kids) if any(b.name in names for b in blocks_under(s))]
    at = hits[-1] + 1 if reverse else hits[0]
    placed = target.replace(body=seq(*kids[:at], new_nest, *kids[at:]))
    new = rest.replace(body=replace_node(rest.body, target, placed))
    require_runs_once(new, block, loop, what, reverse=reverse)
    return new


def _loops_down_to(program: Program, block: str, target: Loop) -> list[Loop]:
    loops = loops_of(program, block)
    return loops[:next(k for k, lp in enumerate(loops) if lp is target) + 1]


def _inner_loops(program: Program, block: str, outer: list[Loop]) -> list[Loop]:
    loops = loops_of(program, block)
    if len(loops) < len(outer) or any(a is not b for a, b in zip(loops, outer, strict=False)):
        raise InternalError(f"block {block!r} is not under loop {outer[-1].var.name!r}")
    return loops[len(outer):]


def _accesses(block: Block, params: tuple[str, ...]) -> list[Access]:
    return block_accesses(block, iteration_domain(block, params), params)


def _per_iteration(program: Program, params: tuple[str, ...], outer: list[Loop], block: Block) -> isl.Map:
    hidden = _inner_loops(program, block.name, outer)
    return instances_at(params, outer, hidden, block, iteration_domain(block, params))


def _union(maps: list[isl.Map]) -> isl.Map:
    out = maps[0]
    for m in maps[1:]:
        out = out.union(m)
    return out


def _needed(program: Program, params: tuple[str, ...], outer: list[Loop], producer: Block,
            readers: list[Block]) -> isl.Map:
    """``{ [outer] -> P[iters] }``: the producer instances whose results the readers read per iteration."""
    tensor = producer.store.tensor.name
    elements = []
    for r in readers:
        inst = _per_iteration(program, params, outer, r)
        elements += [inst.apply_range(a.relation) for a in _accesses(r, params) if a.is_read and a.tensor == tensor]
    write = next(a for a in _accesses(producer, params) if not a.is_read)
    return _union(elements).apply_range(write.relation.reverse())


def _consumable(program: Program, params: tuple[str, ...], outer: list[Loop], consumer: Block,
                writers: list[Block]) -> isl.Map:
    """``{ [outer] -> C[iters] }``: consumer instances whose reads of tensors written under the loop
    all fall in what one iteration writes."""
    written: dict[str, list[isl.Map]] = {}
    for w in writers:
        store = next(a for a in _accesses(w, params) if not a.is_read)
        elements = _per_iteration(program, params, outer, w).apply_range(store.relation)
        written.setdefault(store.tensor, []).append(elements)
    hits = [_union(written[a.tensor]).apply_range(a.relation.reverse())
            for a in _accesses(consumer, params) if a.is_read and a.role == LOAD and a.tensor in written]
    out = hits[0]
    for h in hits[1:]:
        out = out.intersect(h)
    return out


def _nest(block: Block, extents: list[Extent], taken: set[str]) -> Stmt:
    """The block under one new loop ``axK`` per iteration variable whose region is wider than one point."""
    loops: list[tuple[str, Expr]] = []
    bindings: list[Expr] = []
    k = 0
    for ext in extents:
        if isinstance(ext.size, Const) and ext.size.value == 1:
            bindings.append(ext.lo)
            continue
        while f"ax{k}" in taken:
            k += 1
        name = f"ax{k}"
        taken.add(name)
        loops.append((name, ext.size))
        bindings.append(simplify(ext.lo + Var(name)))
    stmt: Stmt = block.replace(bindings=tuple(bindings))
    for name, size in reversed(loops):
        stmt = Loop(Var(name), size, stmt)
    return stmt


def require_runs_once(program: Program, block: str, loop: str, what: str, *, reverse: bool) -> None:
    """Every instance of the moved block runs at exactly one point of its new loops."""
    params = param_names(program)
    blk = program.block(block)
    dom = iteration_domain(blk, params)
    rel = instances_at(params, loops_of(program, block), [], blk, dom)
    missing = dom.subtract(rel.range())
    if not missing.is_empty():
        why = ("consume values that no single iteration of the loop produces" if reverse else
               "are read by no block under the loop (their readers are elsewhere)")
        raise IllegalTransform(
            f"{what}: instances {missing} of block {block!r} {why}, so they would never run "
            f"(e.g. {missing.sample_point()}); every instance must run exactly once")
    if not rel.is_injective():
        same = rel.apply_range(rel.reverse())
        twice = rel.intersect_domain(same.subtract(isl.Map.identity(same.get_space())).domain()).range()
        raise IllegalTransform(
            f"{what}: the regions of block {block!r} that different iterations of loop {loop!r} need overlap "
            f"(as in a stencil), so instances {twice} would run more than once (e.g. {twice.sample_point()}); "
            "placement does not recompute: every instance must run exactly once")


__all__ = ["FULL", "NAIVE", "block_loads", "body_stmts", "compute_at", "loaded_tensors", "naive_reverse_compute_at",
           "own_nest", "reads_tensor", "require_runs_once", "reverse_compute_at"]
