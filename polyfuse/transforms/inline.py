"""compute_inline / reverse_compute_inline: fold a spatial block into its consumer / producer.

``compute_inline(block=P)`` substitutes P's expression into every read of the
tensor T it writes and removes P and T.  Preconditions (checked first):
  1. P is spatial (a reduction's value is not one expression);
  2. T is not a program output, and P is the only block writing it;
  3. P stores ``T[v0, v1, ...]`` with its iteration variables, each once, so
     ``T[e0, e1, ...]`` is P's value with ``v_k := e_k``;
  4. P does not read T;
  5. every read of T is of a value P wrote before it (a flow dependence from P);
  6. no tensor P reads is overwritten between P and a reader of its result
     (the inlined reads move to the reader's time), else refused with a witness.

``reverse_compute_inline(block=C)`` merges a spatial consumer ``Y[g(c)] = f(T[e(c)])``
into the producer P of T: P then stores ``Y[g(c(p))] = f(P's value)``.  Preconditions:
  1. C is spatial, does not read Y, and reads exactly one tensor T written by a
     spatial block (its producer P), at one index ``e(c)``;
  2. P satisfies 2-4 above, and C is the only reader of T;
  3. ``c -> T[e(c)] <- p`` is a bijection between C's and P's instances given by
     one affine map (the epilogue ``out = cast(o / s)`` of a spatial ``o``, not a broadcast);
  4. C's reads of T are of values P wrote before them;
  5. nothing reads or writes Y, or writes another tensor C reads, between the P
     instance and its C instance (C's accesses move to P's time).

Before / after (``compute_inline(block="p_exp")``)::

    p_exp[b, h, i, j] = exp(score[b, h, i, j] - row_max[b, h, i])
    row_sum[b, h, i] += p_exp[b, h, i, j]       row_sum[b, h, i] += exp(score[b, h, i, j] - row_max[b, h, i])

Instances of the remaining blocks and their schedule are unchanged, so instead
of ``verify`` (which compares the same blocks) these end with ``validate`` after
the dataflow checks (5-6, resp. 4-5), which are what make the substitution exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import islpy as isl

from polyfuse import deps
from polyfuse.deps.access import Access
from polyfuse.deps.dependence import FLOW
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Expr, Load, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import Block, Program, Store
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import map_block_exprs, map_expr, substitute
from polyfuse.transforms.compute_at import block_loads, own_nest, reads_tensor
from polyfuse.transforms.region import aff_to_expr
from polyfuse.transforms.tree import block_path, map_blocks, replace_node


def compute_inline(program: Program, *, block: str, into: Sequence[str] | None = None) -> Program:
    """Substitute spatial block ``block`` into every reader of its tensor and remove it.

    With ``into``, only those readers get the substituted expression (a copy); the
    block and its tensor stay for the other readers and go only when none is left
    (an output's block always stays, so an output may be copied this way).
    """
    what = f"compute_inline of block {block!r}"
    # Step 1. The producer is a pure function of its iteration variables.
    _, producer = block_path(program, block)
    tensor = _require_pure_producer(program, producer, what, copy=into is not None)
    all_readers = [b for b in program.blocks() if b.name != block and reads_tensor(b, tensor)]
    readers = all_readers if into is None else [b for b in all_readers if b.name in into]
    if into is not None and len(readers) != len(set(into)):
        missing = sorted(set(into) - {b.name for b in readers})
        raise IllegalTransform(f"{what}: block(s) {', '.join(missing)} do not read {tensor!r}")

    # Step 2. Every read of the tensor sees P's value, and P's inputs do not change before it is read.
    info = deps.analyze(program, tensors=deps.tensors_of(producer, *readers))
    p_write = _access(info, block, write=True)
    for r in readers:
        for a in _reads(info, r.name, tensor):
            _require_served(info, a, block, what)
            pairs = p_write.relation.apply_range(a.relation.reverse())
            for x in _reads(info, block):
                _require_unchanged(info, pairs, x.relation, x.tensor, block, r.name, what,
                                   why=f"read by {block!r} and inlined into {r.name!r}")

    # Step 3. Rewrite the readers, drop the block and its tensor.
    st = producer.store
    names = [i.name for i in st.indices]  # type: ignore[attr-defined]

    def inline(e: Expr) -> Expr:
        return map_expr(e, lambda n: substitute(st.value, dict(zip(names, n.indices, strict=True)))
                        if isinstance(n, Load) and n.tensor.name == tensor else None)

    keep = len(readers) < len(all_readers) or producer.store.tensor.role != "temp"
    body = program.body if keep else replace_node(program.body, own_nest(program, block), None)
    body = map_blocks(body, lambda b: map_block_exprs(b, inline) if b.name in {r.name for r in readers} else b)
    tensors = program.tensors if keep else tuple(t for t in program.tensors if t.name != tensor)
    return validate(program.replace(body=body, tensors=tensors))


def reverse_compute_inline(program: Program, *, block: str) -> Program:
    """Merge spatial consumer ``block`` into the producer of the tensor it reads, and remove it."""
    what = f"reverse_compute_inline of block {block!r}"
    # Step 1. The consumer, its one producer, and the producer's purity.
    _, consumer = block_path(program, block)
    out = consumer.store.tensor.name
    if consumer.is_reduction:
        raise IllegalTransform(f"{what}: {block!r} is a reduction; only a spatial consumer can be merged "
                               "into its producer's store")
    if reads_tensor(consumer, out):
        raise IllegalTransform(f"{what}: {block!r} reads its own output {out!r}")
    producer, tensor = _only_producer(program, consumer, what)
    _require_pure_producer(program, producer, what)
    others = [b.name for b in program.blocks() if b.name not in (block, producer.name) and reads_tensor(b, tensor)]
    if others:
        raise IllegalTransform(f"{what}: tensor {tensor!r} of producer {producer.name!r} is also read by "
                               f"{', '.join(others)}; only a sole reader can be merged into its producer")
    idx = {ld.indices for ld in _loads(consumer, tensor)}
    if len(idx) != 1:
        raise IllegalTransform(f"{what}: {block!r} reads {tensor!r} at {len(idx)} different indices; "
                               "merging needs one element per instance")

    # Step 2. The instances correspond one to one, and nothing in between sees the move.
    info = deps.analyze(program, tensors=deps.tensors_of(producer, program.block(block)))
    p_write = _access(info, producer.name, write=True)
    reads = _reads(info, block, tensor)
    pairs = p_write.relation.apply_range(reads[0].relation.reverse())
    _require_bijection(info, pairs, producer.name, block, tensor, what)
    for a in reads:
        _require_served(info, a, producer.name, what)
    for a in _reads(info, block):
        if a.tensor != tensor:
            _require_unchanged(info, pairs, pairs.apply_range(a.relation), a.tensor, producer.name, block, what,
                               why=f"read by {block!r}, whose read moves to {producer.name!r}")
    written = pairs.apply_range(_access(info, block, write=True).relation)
    _require_unchanged(info, pairs, written, out, producer.name, block, what,
                       why=f"written by {block!r}, whose write moves to {producer.name!r}", any_access=True)

    # Step 3. The producer stores the consumer's value; drop the consumer and the tensor.
    c_of_p = _function(pairs, what)
    value = producer.store.value

    def merge(e: Expr) -> Expr:
        return map_expr(e, lambda n: value if isinstance(n, Load) and n.tensor.name == tensor
                        else c_of_p.get(n.name) if isinstance(n, Var) else None)

    st = consumer.store
    merged = producer.replace(store=Store(st.tensor, tuple(simplify(merge(i)) for i in st.indices), merge(st.value)))
    body = replace_node(program.body, own_nest(program, block), None)
    body = map_blocks(body, lambda b: merged if b.name == producer.name else b)
    return validate(program.replace(body=body, tensors=tuple(t for t in program.tensors if t.name != tensor)))


# ------------------------------------------------------------------ checks

def _require_served(info: deps.Dependences, read: Access, writer: str, what: str) -> None:
    """Every instance of ``read`` reads a value that block ``writer`` wrote before it."""
    served = [d.relation.range() for d in info.all
              if d.kind == FLOW and d.source == writer and d.sink_ref == read.tag]
    covered = read.relation.domain()
    for s in served:
        covered = covered.subtract(s)
    if not covered.is_empty():
        raise IllegalTransform(
            f"{what}: the read {read.text} of block {read.block!r} ({read.tag}) at instances {covered} does not "
            f"read a value written by {writer!r} (e.g. {covered.sample_point()}); the value it reads would change")


def _require_unchanged(info: deps.Dependences, pairs: isl.Map, elements: isl.Map, tensor: str, first: str,
                       later: str, what: str, *, why: str, any_access: bool = False) -> None:
    """No block writes (or with ``any_access`` touches) the ``elements`` of ``tensor`` between an
    instance of ``first`` and its partner instance of ``later`` (``pairs`` maps one to the other)."""
    sched = info.schedule
    for acc in info.accesses:
        if acc.tensor != tensor or (acc.is_read and not any_access):
            continue
        after_first = elements.apply_range(acc.relation.reverse()).intersect(
            sched[first].lex_lt_map(sched[acc.block]))
        between = pairs.reverse().apply_range(after_first).intersect(sched[later].lex_gt_map(sched[acc.block]))
        if not between.is_empty():
            witness = between.wrap().lexmin().unwrap()
            verb = "reads" if acc.is_read else "writes"
            raise IllegalTransform(
                f"{what}: block {acc.block!r} {verb} tensor {tensor!r} ({why}) in between, at {acc.text} "
                f"({acc.tag}) after {first!r} and before {later!r}; witness ({later} -> {acc.block}): {witness}")


def _require_pure_producer(program: Program, producer: Block, what: str, copy: bool = False) -> str:
    st = producer.store
    tensor = st.tensor.name
    if producer.is_reduction:
        red = ", ".join(iv.var.name for iv in producer.reduce_iters)
        raise IllegalTransform(f"{what}: block {producer.name!r} is a reduction ({producer.reducer.name} over "  # type: ignore[union-attr]
                               f"{red}); only a spatial block is one expression per element")
    if st.tensor.role != "temp" and not copy:
        raise IllegalTransform(f"{what}: block {producer.name!r} writes {st.tensor.role} tensor {tensor!r}, "
                               "which must stay in memory")
    names = [iv.var.name for iv in producer.iters]
    plain = [i.name for i in st.indices if isinstance(i, Var)]
    if len(plain) != len(st.indices) or sorted(plain) != sorted(names):
        text = ", ".join(str(i) for i in st.indices)
        raise IllegalTransform(f"{what}: block {producer.name!r} stores {tensor}[{text}]; inlining needs the "
                               f"store indices to be its iteration variables {', '.join(names)}, each once")
    if reads_tensor(producer, tensor):
        raise IllegalTransform(f"{what}: block {producer.name!r} reads the tensor {tensor!r} it writes")
    writers = [b.name for b in program.blocks() if b.store.tensor.name == tensor and b.name != producer.name]
    if writers:
        raise IllegalTransform(f"{what}: tensor {tensor!r} is also written by {', '.join(writers)}")
    return tensor


def _only_producer(program: Program, consumer: Block, what: str) -> tuple[Block, str]:
    found = []
    for ld in _loads(consumer, None):
        writers = [b for b in program.blocks() if b.store.tensor.name == ld.tensor.name]
        if writers and ld.tensor.name not in [t for _, t in found]:
            found.append((writers, ld.tensor.name))
    spatial = [(w[0], t) for w, t in found if len(w) == 1 and not w[0].is_reduction]
    if len(spatial) == 1:
        return spatial[0]
    listed = ", ".join(f"{t} (by {', '.join(b.name for b in w)}{', a reduction' if w[0].is_reduction else ''})"
                       for w, t in found) or "none"
    why = "several of them are" if spatial else "none of them is"
    raise IllegalTransform(f"{what}: block {consumer.name!r} must read exactly one tensor written by a spatial "
                           f"block; it reads tensors written by other blocks: {listed}, and {why}")


def _require_bijection(info: deps.Dependences, pairs: isl.Map, producer: str, consumer: str, tensor: str,
                       what: str) -> None:
    whole = pairs.domain().is_equal(info.domains[producer]) and pairs.range().is_equal(info.domains[consumer])
    if not (whole and pairs.is_single_valued() and pairs.is_injective()):
        raise IllegalTransform(f"{what}: the instances of {producer!r} and {consumer!r} do not correspond one to one "
                               f"through {tensor!r} ({pairs}); merging needs a bijection")


def _function(pairs: isl.Map, what: str) -> dict[str, Expr]:
    """The consumer's iteration variables as expressions of the producer's, from a bijection."""
    pieces: list[isl.MultiAff] = []
    isl.PwMultiAff.from_map(pairs).foreach_piece(lambda _s, maff: pieces.append(maff))
    if len(pieces) != 1:
        raise IllegalTransform(f"{what}: the index mapping {pairs} is piecewise; merging needs one affine map")
    maff = pieces[0]
    return {pairs.get_dim_name(isl.dim_type.out, k): aff_to_expr(maff.get_at(k))
            for k in range(maff.dim(isl.dim_type.out))}


def _access(info: deps.Dependences, block: str, *, write: bool) -> Access:
    return next(a for a in info.accesses if a.block == block and a.is_read != write)


def _reads(info: deps.Dependences, block: str, tensor: str | None = None) -> list[Access]:
    return [a for a in info.accesses if a.block == block and a.is_read and tensor in (None, a.tensor)]


def _loads(block: Block, tensor: str | None) -> list[Load]:
    return [ld for ld in block_loads(block) if tensor in (None, ld.tensor.name)]


__all__ = ["compute_inline", "reverse_compute_inline"]
