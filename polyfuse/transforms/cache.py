"""cache_read / cache_write / set_scope: stage a tensor through a buffer in another memory scope.

``cache_read(block=B, tensor=X, scope=s)`` makes B read a copy of X in scope s.
Preconditions (checked first):
  1. ``s`` is ``global``, ``shared`` or ``local``;
  2. B reads X (named, or given as its index among the tensors B reads in order of
     first load, B's own output excluded: Neptune's ``cache_read(b0, 0, "shared")``);
  3. no block in the top-level statement holding B writes X (the copy runs
     before that statement, so it must see the values B would have read);
  4. the elements of X that B reads span a box ``[lo, lo + size)`` per dimension.

A new temp tensor ``X_s`` (X's shape, scope s) and a new block ``X_s`` copying
that box, ``X_s[lo + v] = X[lo + v]``, go right before the top-level statement
holding B, and B reads ``X_s``.  ``compute_at`` then moves the copy next to B
with the region one iteration needs (Neptune Fig. 13)::

    for b, h, i, j, d:                    for b, h, i, d:
        qk[...] += q[b, h, i, d] * ...        q_shared[b, h, i, d] = q[b, h, i, d]
                                          for b, h, i, j, d:
                                              qk[...] += q_shared[b, h, i, d] * ...

``cache_write(block=B, scope=s)`` makes B write (and accumulate into) ``Y_s`` and a
new block ``Y_s`` copy it back to B's tensor Y right after the top-level
statement holding B.  Preconditions: 1 as above; B reads Y only as its own
accumulator; no other block in that top-level statement reads or writes Y; the
elements B writes are exactly a box (the copy writes back nothing else).  A
reduction without an init (``decompose_reduction`` moved it to a block of its own)
accumulates into Y's current value, so the cache must start from it: a block
``Y_s_in`` copies the box of Y into ``Y_s`` right before that top-level statement,
after whatever initialised Y.

``set_scope(block=B, scope=s)`` moves the temp tensor B writes to scope s
(inputs and outputs stay global).

These add or retarget blocks rather than reorder instances, so they end with
``validate`` instead of ``verify``: the copy covers the region by construction
(the box is computed from the accesses), runs before (after) the whole
top-level statement holding B, and checks 3 rule out a value changing in between.
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from polyfuse.deps.access import Access, block_accesses
from polyfuse.deps.domains import iteration_domain, param_names
from polyfuse.deps.islconv import aff_text, build_set, param_env
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Expr, Load, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import SCOPES, TEMP, Block, IterVar, Loop, Program, Stmt, Store, Tensor
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import map_block_exprs, map_expr, replace_tensor, seq
from polyfuse.transforms.compute_at import block_loads, body_stmts, loaded_tensors, reads_tensor
from polyfuse.transforms.region import Extent, box
from polyfuse.transforms.tree import block_path, blocks_under, map_blocks


def cache_read(program: Program, *, block: str, tensor: str | int, scope: str) -> tuple[Program, str]:
    """Stage what ``block`` reads of ``tensor`` through a new ``scope`` buffer; returns the program and
    the name of the copy block (also the new tensor's name)."""
    what = f"cache_read of tensor {tensor!r} for block {block!r} into {scope}"
    # Step 1. Check the scope, the tensor, and that nothing rewrites it near the block.
    _check_scope(scope, what)
    _, reader = block_path(program, block)
    source = program.tensor(_read_tensor(reader, tensor, what))
    kids, at = _top_level(program, block)
    writers = [b.name for b in blocks_under(kids[at]) if b.store.tensor.name == source.name]
    if writers:
        raise IllegalTransform(f"{what}: {', '.join(writers)} write(s) {source.name!r} in the same loop nest as "
                               f"{block!r}, so a copy made before that nest would be stale")

    # Step 2. The box of elements the block reads.
    reads = [a for a in _accesses(program, reader) if a.is_read and a.tensor == source.name]
    region = _read_union(reads)
    extents = box(isl.Map.from_range(region), what=f"{what}: elements of {source.name!r} read")

    # Step 3. The copy block before the nest; the block reads the copy.
    name = _fresh(program, f"{source.name}_{scope}")
    cache = Tensor(name, source.shape, source.dtype, TEMP, scope)
    iters = _iter_names(program, reader, source.name)
    copy = _copy_nest(name, iters, extents, src=source, dst=cache)

    def redirect(e: Expr) -> Expr:
        return map_expr(e, lambda n: Load(cache, n.indices) if isinstance(n, Load) and n.tensor == source else None)

    body = map_blocks(seq(*kids[:at], copy, *kids[at:]),
                      lambda b: map_block_exprs(b, redirect) if b.name == block else b)
    return validate(program.replace(body=body, tensors=_declare_after(program.tensors, source, cache))), name


def cache_write(program: Program, *, block: str, scope: str) -> tuple[Program, str]:
    """Make ``block`` write a new ``scope`` buffer copied back to its tensor afterwards; returns the
    program and the name of the copy-back block (also the new tensor's name)."""
    _, writer = block_path(program, block)
    target = writer.store.tensor
    what = f"cache_write of tensor {target.name!r} of block {block!r} into {scope}"
    # Step 1. Check the scope, the block's own reads of its tensor and its neighbours.
    _check_scope(scope, what)
    acc = Load(target, writer.store.indices)
    stray = [ld for ld in block_loads(writer) if ld.tensor == target and not (writer.is_reduction and ld == acc)]
    if stray:
        raise IllegalTransform(f"{what}: {block!r} reads {stray[0]} besides its own accumulator; the cache would "
                               "not hold that value")
    kids, at = _top_level(program, block)
    others = [b.name for b in blocks_under(kids[at])
              if b.name != block and (b.store.tensor == target or reads_tensor(b, target.name))]
    if others:
        raise IllegalTransform(f"{what}: {', '.join(others)} access(es) {target.name!r} in the same loop nest as "
                               f"{block!r}, before the copy back would run")

    # Step 2. The elements written must be exactly a box.
    written = next(a for a in _accesses(program, writer) if not a.is_read).relation.range()
    extents = box(isl.Map.from_range(written), what=f"{what}: elements of {target.name!r} written")
    params = param_names(program)
    sizes = build_set(params, None, [], [f"_p{k} >= 1" for k in range(len(params))]).params()
    if not _box_set(written, extents, params).intersect_params(sizes).is_equal(written.intersect_params(sizes)):
        raise IllegalTransform(f"{what}: the elements {written} that {block!r} writes are not a box, so copying "
                               "the box back would overwrite elements it does not compute")

    # Step 3. The block writes the cache; a copy block writes it back after the nest.
    name = _fresh(program, f"{target.name}_{scope}")
    cache = Tensor(name, target.shape, target.dtype, TEMP, scope)
    iters = _iter_names(program, writer, target.name)
    copy = _copy_nest(name, iters, extents, src=cache, dst=target)
    # A reduction without an init accumulates into the current value: the cache starts as a copy of it.
    fill = [_copy_nest(_fresh(program, f"{name}_in"), iters, extents, src=target, dst=cache)] \
        if writer.is_reduction and writer.init is None else []

    def retarget(b: Block) -> Block:
        if b.name != block:
            return b
        b = map_block_exprs(b, lambda e: map_expr(
            e, lambda n: Load(cache, n.indices) if isinstance(n, Load) and n.tensor == target else None))
        return b.replace(store=Store(cache, b.store.indices, b.store.value))

    body = map_blocks(seq(*kids[:at], *fill, kids[at], copy, *kids[at + 1:]), retarget)
    return validate(program.replace(body=body, tensors=_declare_after(program.tensors, target, cache))), name


def set_scope(program: Program, *, block: str, scope: str) -> Program:
    """Move the temp tensor ``block`` writes to memory scope ``scope``."""
    _, writer = block_path(program, block)
    t = writer.store.tensor
    what = f"set_scope of tensor {t.name!r} (written by block {block!r}) to {scope}"
    _check_scope(scope, what)
    if t.role != TEMP:
        raise IllegalTransform(f"{what}: {t.name!r} is a program {t.role}, which lives in global memory")
    return validate(replace_tensor(program, t, replace(t, scope=scope)))


# ------------------------------------------------------------------ helpers

def _check_scope(scope: str, what: str) -> None:
    if scope not in SCOPES:
        raise IllegalTransform(f"{what}: scope must be one of {', '.join(SCOPES)}")


def _read_tensor(block: Block, tensor: str | int, what: str) -> str:
    names = loaded_tensors(block)
    if isinstance(tensor, int) and not isinstance(tensor, bool):
        if not 0 <= tensor < len(names):
            raise IllegalTransform(f"{what}: block {block.name!r} reads {len(names)} tensor(s) "
                                   f"({', '.join(names) or 'none'}); index {tensor} is out of range")
        return names[tensor]
    if tensor not in names:
        raise IllegalTransform(f"{what}: block {block.name!r} does not read tensor {tensor!r}; "
                               f"it reads {', '.join(names) or 'none'}")
    return tensor  # type: ignore[return-value]


def _top_level(program: Program, block: str) -> tuple[list[Stmt], int]:
    kids = body_stmts(program.body)
    return kids, next(k for k, s in enumerate(kids) if any(b.name == block for b in blocks_under(s)))


def _read_union(reads: list[Access]) -> isl.Set:
    out = reads[0].relation.range()
    for a in reads[1:]:
        out = out.union(a.relation.range())
    return out


def _fresh(program: Program, base: str) -> str:
    used = {t.name for t in program.tensors} | {b.name for b in program.blocks()}
    name, k = base, 1
    while name in used:
        name, k = f"{base}_{k}", k + 1
    return name


def _iter_names(program: Program, block: Block, tensor: str) -> list[str]:
    """Names for the copy's iteration variables: the block's index variables where plain, else ``axK``."""
    first = next(ld for ld in block_loads(block) + [Load(block.store.tensor, block.store.indices)]
                 if ld.tensor.name == tensor)
    taken = {p.name for p in program.params}
    out = []
    for k, idx in enumerate(first.indices):
        name = idx.name if isinstance(idx, Var) and idx.name not in taken else f"ax{k}"
        while name in taken:
            name += "_"
        taken.add(name)
        out.append(name)
    return out


def _copy_nest(name: str, iters: list[str], extents: list[Extent], *, src: Tensor, dst: Tensor) -> Stmt:
    """``for v...: dst[lo + v] = src[lo + v]`` over the box, one loop per dimension."""
    idx = tuple(simplify(e.lo + Var(v)) for v, e in zip(iters, extents, strict=True))
    stmt: Stmt = Block(name, tuple(IterVar(Var(v), e.size) for v, e in zip(iters, extents, strict=True)),
                       tuple(Var(v) for v in iters), Store(dst, idx, Load(src, idx)))
    for v, e in reversed(list(zip(iters, extents, strict=True))):
        stmt = Loop(Var(v), e.size, stmt)
    return stmt


def _box_set(like: isl.Set, extents: list[Extent], params: tuple[str, ...]) -> isl.Set:
    env = param_env(params)
    cons = []
    for k, e in enumerate(extents):
        lo = aff_text(e.lo, env, what="box bound")
        cons.append(f"{lo} <= _a{k} < {lo} + {aff_text(e.size, env, what='box size')}")
    out = build_set(params, like.get_tuple_name(), [f"d{k}" for k in range(len(extents))], cons)
    return out.align_params(like.get_space())


def _declare_after(tensors: tuple[Tensor, ...], anchor: Tensor, new: Tensor) -> tuple[Tensor, ...]:
    out: list[Tensor] = []
    for t in tensors:
        out.append(t)
        if t == anchor:
            out.append(new)
    return tuple(out)


def _accesses(program: Program, block: Block) -> list[Access]:
    params = param_names(program)
    return block_accesses(block, iteration_domain(block, params), params)


__all__ = ["cache_read", "cache_write", "set_scope"]
