"""recompute_at: place a producer under a loop of its consumer, recomputing it in every iteration that needs it.

``compute_at`` refuses a producer whose region is needed by several iterations of the
loop (every instance runs exactly once).  ``recompute_at(block=P, loop_block=C, loop=L)``
places such a producer anyway, by first giving it one copy per iteration of the loops
that share its instances: it is what a GEMM tile needs of a per-row statistic (quant_gemm's
``amax[i]``, read by every column tile ``n_0`` of row tile ``i_0``: each (i_0, n_0) block
recomputes the rows it scales).

  1. P and C are different blocks, L encloses C; P is the only block writing its tensor X,
     X is a temporary, and every block reading X (other than P) is under L;
  2. the *replicating loops* R are the fewest loops down to L (innermost first on a tie)
     such that a copy ``(R values, P instance)`` is needed by exactly one iteration: the
     loops across whose iterations the regions of P overlap.  With none, nothing is
     recomputed: this is ``compute_at``;
  3. each loop of R has an extent of sizes only, and each reader's values of R are one
     quasi-affine expression of its iteration variables (loops bind them: e.g. ``n // 64``
     for ``n = 64·n_0 + n_1``);
  4. the copies are placed with ``compute_at``, all of whose checks apply: every copy runs
     in exactly one iteration and the dependences hold.

Rewrite (the expansion; then ``compute_at``): X gets one leading dimension per loop of R,
P one spatial iteration ``r`` per loop of R (the loop's name) and stores ``X[r.., idx]``,
and a reader's load ``X[idx]`` becomes ``X[r(reader).., idx]``.  Where one copy needs only
part of P (a halo around a stencil's tile), P's ``where`` keeps that box of it,
``lo(r) <= iter < lo(r) + size``.  The expansion is exact by construction: every copy
computes the same values from the same inputs, and each reader reads the copy of the
iteration it runs in, which holds what that iteration reads.  ``compact_buffers`` then
shrinks X back to what one iteration uses.

Before / after (``recompute_at(block="s_amax", loop_block="s_gemm", loop="n_0")``)::

    for i, k:                                   for i_0, n_0:
        amax[i] = max(amax[i], |A[i, k]|)           for ax0, ax1:
    for i_0, n_0, i_1, n_1, k:                          amax[n_0, i] = max(amax[n_0, i], |A[i, k]|)
        C[i, n] += 448·A[i, k]/amax[i]·W[k, n]      for i_1, n_1, k:
                                                        C[i, n] += 448·A[i, k]/amax[n // 64, i]·W[k, n]
"""

from __future__ import annotations

import functools
from itertools import combinations

import islpy as isl

from polyfuse.deps.domains import iteration_domain, param_names
from polyfuse.deps.islconv import build_map
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Expr, Load, Var, const, logical_and
from polyfuse.ir.stmt import TEMP, Block, IterVar, Loop, Program, Store, Tensor
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import free_vars, map_block_exprs, map_expr, substitute
from polyfuse.transforms.compute_at import (
    _loops_down_to, _needed, _place, own_nest, reads_tensor,
)
from polyfuse.transforms.region import aff_to_expr, box, instances_at
from polyfuse.transforms.tree import blocks_under, find_loop, fresh_loop_name, loops_of, map_blocks, replace_node
from polyfuse.transforms.verify import verify


def recompute_at(program: Program, *, block: str, loop_block: str, loop: str) -> Program:
    """Place producer ``block`` under ``loop`` (enclosing ``loop_block``), one copy per iteration that needs it."""
    what = f"recompute_at of block {block!r} under loop {loop!r} (enclosing block {loop_block!r})"
    expanded = _expand(program, block, loop_block, loop, what)
    return verify(expanded, _place(expanded, block, loop_block, loop, reverse=False, what=what), what=what,
                  moved=[block])


# ------------------------------------------------------------------ checks

def _check(program: Program, block: str, loop_block: str, loop: str, what: str) -> list[Block]:
    """Step 1: the handles, the tensor and its readers (returned)."""
    if block == loop_block:
        raise IllegalTransform(f"{what}: a block cannot be placed under a loop of its own")
    producer = program.block(block)
    x = producer.store.tensor
    if x.role != TEMP:
        raise IllegalTransform(f"{what}: block {block!r} writes {x.role} tensor {x.name!r}; only a temporary can be "
                               "recomputed (its copies are internal)")
    others = [b.name for b in program.blocks() if b.name != block and b.store.tensor.name == x.name]
    if others:
        raise IllegalTransform(f"{what}: tensor {x.name!r} is also written by {', '.join(others)}; a recomputed "
                               "producer must be the only writer of its tensor")
    target = find_loop(program, loop_block, loop)
    inside = {b.name for b in blocks_under(target)}
    if block in inside:
        raise IllegalTransform(f"{what}: block {block!r} is already under loop {loop!r}")
    readers = [b for b in program.blocks() if b.name != block and reads_tensor(b, x.name)]
    if not readers:
        raise IllegalTransform(f"{what}: no block reads tensor {x.name!r}, which {block!r} writes")
    outside = [b.name for b in readers if b.name not in inside]
    if outside:
        raise IllegalTransform(f"{what}: {', '.join(outside)} also read {x.name!r} outside loop {loop!r}; the copies "
                               "exist per iteration of the loop, so every reader must be under it")
    return readers


def _replicating(program: Program, block: str, loop_block: str, loop: str, what: str) -> tuple[list[Loop], isl.Map]:
    """Step 2: the fewest loops down to ``loop`` that make each copy needed by one iteration, and the
    instances each copy needs, ``{ [their values] -> P[iters] }``."""
    params = param_names(program)
    outer = _loops_down_to(program, loop_block, find_loop(program, loop_block, loop))
    producer = program.block(block)
    readers = [b for b in blocks_under(outer[-1]) if b.name != block and reads_tensor(b, producer.store.tensor.name)]
    needed = _needed(program, params, outer, producer, readers)
    names = [lp.var.name for lp in outer]
    for size in range(len(outer) + 1):
        for chosen in combinations(reversed(range(len(outer))), size):
            keep = sorted(chosen)
            pick = build_map(params, names, [f"_a{k}" for k in keep], [], out_dims=[names[k] for k in keep])
            if pick.range_product(needed).reverse().is_single_valued():
                return [outer[k] for k in keep], pick.reverse().apply_range(needed)
    raise IllegalTransform(f"{what}: the region of block {block!r} is needed by several iterations of the same "
                           f"loops; no copy per iteration of {', '.join(names)} is needed by one iteration only")


# ------------------------------------------------------------------ the expansion

def _expand(program: Program, block: str, loop_block: str, loop: str, what: str) -> Program:
    """Steps 2-3 and the rewrite: the program with one copy of ``block`` per iteration of the replicating loops."""
    readers = _check(program, block, loop_block, loop, what)
    copies, per_copy = _replicating(program, block, loop_block, loop, what)
    if not copies:
        return program
    params = set(param_names(program))
    for lp in copies:
        if free_vars(lp.extent) - params:
            raise IllegalTransform(f"{what}: loop {lp.var.name!r} has extent {lp.extent}, which depends on other "
                                   "loops; the copies need an extent of sizes only")
    producer = program.block(block)
    x = producer.store.tensor
    taken = {iv.var.name for iv in producer.iters} | params
    names = []
    for lp in copies:
        name = lp.var.name
        while name in taken:
            name += "_"
        taken.add(name)
        names.append(name)
    wide = Tensor(x.name, tuple(lp.extent for lp in copies) + x.shape, x.dtype, x.role, x.scope)
    at_reader = {b.name: _copy_index(program, b, copies, what) for b in readers}

    def widen(b: Block, prefix: tuple[Expr, ...]) -> Block:
        def fix(e: Expr) -> Expr:
            return map_expr(e, lambda n: Load(wide, prefix + tuple(fix(i) for i in n.indices))
                            if isinstance(n, Load) and n.tensor.name == x.name else None)
        return map_block_exprs(b, fix)

    own = [Var(n) for n in names]
    # The loops enumerating the copies where P was (compute_at replaces them): names used nowhere else.
    outside: list[Var] = []
    for n in names:
        outside.append(Var(fresh_loop_name(program, n, {v.name for v in outside})))
    renamed = {lp.var.name: v for lp, v in zip(copies, own, strict=True)}
    copy = widen(producer, tuple(own))
    copy = copy.replace(iters=tuple(IterVar(v, lp.extent) for v, lp in zip(own, copies, strict=True)) + copy.iters,
                        bindings=tuple(outside) + copy.bindings,
                        store=Store(wide, tuple(own) + copy.store.indices, copy.store.value),
                        where=_copy_where(producer, per_copy, renamed, what))
    nest = own_nest(program, block)
    new_nest = map_blocks(nest, lambda b: copy if b.name == block else b)
    for v, lp in reversed(list(zip(outside, copies, strict=True))):
        new_nest = Loop(v, lp.extent, new_nest)
    body = replace_node(program.body, nest, new_nest)
    body = map_blocks(body, lambda b: widen(b, at_reader[b.name]) if b.name in at_reader else b)
    tensors = tuple(wide if t.name == x.name else t for t in program.tensors)
    return validate(program.replace(tensors=tensors, body=body))


def _copy_where(producer: Block, per_copy: isl.Map, renamed: dict[str, Var], what: str) -> Expr | None:
    """The producer's ``where`` and, where a copy needs less than all of it (a halo around a tile),
    ``lo(r) <= iter < lo(r) + size`` per iteration variable: each copy holds only what its iteration reads."""
    conds = [] if producer.where is None else [producer.where]
    for iv, ext in zip(producer.iters, box(per_copy, what=f"{what}: region of one copy"), strict=True):
        if ext.lo == const(0) and ext.size == iv.extent:
            continue
        lo = substitute(ext.lo, renamed)
        conds += [lo <= iv.var, iv.var < lo + ext.size]
    return functools.reduce(logical_and, conds) if conds else None


def _copy_index(program: Program, reader: Block, copies: list[Loop], what: str) -> tuple[Expr, ...]:
    """The values of the replicating loops where ``reader`` runs, in its iteration variables."""
    params = param_names(program)
    loops = loops_of(program, reader.name)
    depth = max(k for k, lp in enumerate(loops) if any(lp is c for c in copies)) + 1
    at = instances_at(params, loops[:depth], loops[depth:], reader, iteration_domain(reader, params)).reverse()
    positions = [next(k for k, lp in enumerate(loops) if lp is c) for c in copies]
    out: list[Expr] = []
    for k, lp in zip(positions, copies, strict=True):
        value = at.project_out(isl.dim_type.out, k + 1, depth - k - 1).project_out(isl.dim_type.out, 0, k)
        pieces = (isl.PwMultiAff.from_map(value).get_pw_aff(0).coalesce().get_pieces()
                  if value.is_single_valued() else [])
        if not pieces or any(not aff.plain_is_equal(pieces[0][1]) for _, aff in pieces[1:]):
            raise IllegalTransform(f"{what}: the iteration of loop {lp.var.name!r} block {reader.name!r} runs in is "
                                   f"not one quasi-affine expression of its iteration variables ({value})")
        out.append(aff_to_expr(pieces[0][1]))
    return tuple(out)


__all__ = ["recompute_at"]
