"""split_k_update: fuse a reduction with its producers into parallel partial reductions
and a repaired combine (Neptune Alg. 2, FlashDecoding-like).

``split_k_update(block=C, loop_block=B, loop=L)``, where L splits the reductions
(e.g. the outer loop of ``split(j, [n_splits, None])``; when an earlier call made B the
global combine of a privatized reduction, B's local block ``B_rf`` stands for it, so one
loop reference serves every consumer of a chain):

  1. dataflow: producers of C and the map blocks between them, inlined into C (copy); a map C
     reads that runs after L's nest moves before it (or is recomputed in C where it cannot);
  2. every producer is privatized over L: its local nest ``P_rf`` computes one partial
     result per iteration of L (``X_P_rf[..., t]``) and its global nest ``P`` combines
     them after L; a producer privatized by an earlier call is reused;
  3. naive fusion: C is placed under L (only temporal producer -> C edges may break).
     A consumer whose producers were all privatized earlier reads nothing written under
     L; it is cut into contiguous parts of its reduction, one per iteration of L
     (exact: Eq. 3 holds element by element, whichever elements a split holds); behind a
     max/min producer, only where isl proves the parts are its splits, none of them empty.
     Each iteration of L must hold whole splits of every fresh producer and of C, run
     forward from their inits, with a reduce loop inside L
     (:func:`~polyfuse.transforms.fusion_loops.require_split_loop`);
  4. the solver derives h from C's term.  A *state repair* (no single h, g a polynomial
     in the producers, :mod:`~polyfuse.transforms.auxiliary`) adds the auxiliary
     reductions ``A_k`` of g's Taylor coefficients next to C;
  5. C (and each A_k) is privatized over L too: ``C_rf`` reduces each split *with the
     local producer values* ``X_P_rf[..., t]`` (every split independent: L can run in
     parallel).  The global combines of the A_k are dropped: only C's combine reads the
     partial states;
  6. a plain-sum producer's partial (``Σ_split x/L``) is far from the data, so a state
     repair's local terms read a reference point instead: the partial divided by the
     fraction of the elements its split holds (``1/S`` for S equal splits; otherwise
     counted by a sibling sum ``P_rf_seen`` of ``1/N`` per element) — the split's mean;
  7. the global combine becomes ``X = X ⊕ G(h(X_rf[t], X_P_rf[..., t], X_P))`` (Eq. 11):
     each partial result is repaired from its split's producer values (or reference
     points) to the global ones; a state repair reads the partial state
     ``A_k_rf[..., t]`` too, and has no G.

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

A state repair (variance, ``mean = Σ x/L``, ``var = Σ (x - mean)²/L``, 4 splits of 10;
ρ = mean_l[b, j0] / 0.25 is the split's mean) — Chan's parallel formula::

    for b, j0:
        for j1: mean_l[b, j0] += x[b, 10·j0 + j1] / L
        for j1: var_l[b, j0] += (x[…] - ρ)² / L;  a1_l[b, j0] += -2(x[…] - ρ) / L;  a2_l[b, j0] += 1 / L
    for b, j0: mean[b] += mean_l[b, j0]
    for b, j0: var[b] += var_l[b, j0] + a1_l[b, j0]·(mean[b] - ρ) + a2_l[b, j0]·(mean[b] - ρ)²
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping

from polyfuse import deps
from polyfuse.deps.access import LOAD, STORE, block_accesses
from polyfuse.deps.dependence import Dependence
from polyfuse.deps.domains import param_names
from polyfuse.errors import IllegalTransform, NoRepairFound
from polyfuse.ir.expr import Const, Expr, Load, Var, cast, const
from polyfuse.ir.stmt import Block, Loop, Program, Seq, Store, Tensor
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import loads, map_expr, seq
from polyfuse.transforms.auxiliary import add_auxiliary_blocks, add_sibling_sums, estimate, plain_sum, with_references
from polyfuse.transforms.compute_at import naive_reverse_compute_at, own_nest, reverse_compute_at
from polyfuse.transforms.dataflow import (
    body_children, child_containing, naive_fuse_aligned, producers_in_place, rolled_by, under,
)
from polyfuse.transforms.fusion_common import (
    Fusion, guard_term, guarded_rows, infinite_identity, repaired_update, replace_block, solve_for, surrogate,
    with_surrogates,
)
from polyfuse.transforms.fuse_siblings import fuse_siblings, reads_under, sibling_anchor
from polyfuse.transforms.fusion_loops import require_split_loop
from polyfuse.transforms.rfactor import read_partials, rfactor
from polyfuse.transforms.signs import declared_signs
from polyfuse.transforms.tree import block_path, blocks_under, find_loop, loops_of, replace_node


def split_k_update(program: Program, *, block: str, loop_block: str, loop: str,
                   approximate: bool = False, signs: Mapping[str, str] | None = None,
                   factor_axis: int | None = None) -> tuple[Program, Fusion]:
    """Fuse reduction ``block`` with its producers as split partials over ``loop`` plus a repaired combine.

    ``factor_axis`` places the split dimension in the consumer's partial results (and its auxiliaries'),
    as in :func:`~polyfuse.transforms.rfactor.rfactor` (last by default): ``pv_rf[b, h, i, split, dv]``
    keeps a split's values contiguous.
    """
    what = f"split_k_update of block {block!r} over loop {loop!r} (enclosing block {loop_block!r})"
    if program.block(block).reduce_term() is None or program.block(block).init is None:
        raise IllegalTransform(f"{what}: block {block!r} is not a reduction X = X ⊕ g with an init; "
                               "only such a block can be fused with a repair")

    # Step 1. Producers (a privatized producer is found through its global combine).
    loop_block = _split_anchor(program, loop_block, loop)
    program, found = producers_in_place(program, block, loop_block, loop, what)
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
    notes: list[str] = []
    if not producers and not reads_under(program, block, anchor, loop):
        # A sibling (nothing under the loop writes what it reads): it runs beside a block with its iteration
        # space, and privatizing it (step 5) splits it like the others; no repair.
        beside = sibling_anchor(program, block, anchor, loop)
        program, broken = fuse_siblings(program, block=block, loop_block=beside, loop=loop, what=what), []
        notes.append(f"sibling of block {beside!r}: no dependence between them, split over the same loop "
                     "(fuse_siblings, then privatized)")
    else:
        program, broken = _naive_place(program, block, fresh, local, anchor, loop, what)
    stray = [d for d in broken if d.sink != block or d.source not in producers]
    if stray:
        raise IllegalTransform(f"{what}: naive fusion breaks a dependence no repair covers: {stray[0]}")
    require_split_loop(program, [*fresh, block], loop_block=anchor, loop=loop, what=what)

    # Step 4. The repair, from the consumer's own term; a state repair's auxiliary reductions join the consumer.
    r_loads, tensors, repair = solve_for(program, block, producers, approximate=approximate, what=what,
                                         signs=declared_signs(program, signs, what),
                                         call=("split_k_update", f'sch.loop("{loop_block}", "{loop}")'))
    self_guarded = guarded_rows(program, block, r_loads, tensors)
    aux_blocks: list[str] = []
    counts: dict[str, Expr] = {}
    if repair is not None and repair.auxiliaries:
        program, aux_blocks = add_auxiliary_blocks(program, block, repair)
        for p in {tensors[ld.tensor.name] for ld in r_loads} - set(local):
            if plain_sum(program, p):
                counts[p] = _instances(program.block(p))

    # Step 5. Privatize the consumer (and its auxiliaries: their global combines are dead, the consumer's
    # combine reads the partial states), then the producers, redirecting the consumer's local nests to their
    # split's producer values (Neptune's FUSEANDPRIVATIZE + REPLACETENSORREADS).
    program, c_rf = rfactor(program, block=block, loop=loop, factor_axis=factor_axis)
    locals_ = [c_rf]
    for name in aux_blocks:
        program, aux_rf = rfactor(program, block=name, loop=loop, factor_axis=factor_axis)
        program = _drop_combine(program, name)
        locals_.append(aux_rf)
    created += locals_
    for p in producers:
        if p in local:
            _, partial = local[p]
            x = program.block(p).store.tensor
            axis = _split_axis(program.block(p), partial)
            for name in locals_:
                program = replace_block(program, read_partials(program.block(name), x, partial.tensor, axis, loop,
                                                               what))
            continue
        program, rf = rfactor(program, block=p, loop=loop, redirect=locals_)
        created.append(rf)
    program = _after_producer_combines(program, block, producers)
    program = _after_local_producers(program, c_rf, [local_block(program, p, c_rf, loop) for p in producers], loop)

    # Step 6. Guard the local terms (each local nest reads its split's producer values); a state repair's
    # plain-sum producers get reference points near the data: Σ_split x/L is not the split's mean, but
    # divided by the fraction of the elements its split holds, it is.
    partial_reads = {name: _partial_reads(program, name, r_loads, tensors, loop, what) for name in locals_}
    numerics = repair.numerics if repair is not None else None
    surrogates = numerics.surrogates if numerics is not None else frozenset()
    if repair is not None and repair.is_identity and surrogates:
        # A surrogate is exact because the combine's repair reads the producer's final value (a row that
        # stays 0 gets the plain program's 0/0 there); an identity repair has no such step.
        raise NoRepairFound(
            f"{what}: the term of block {block!r} does not depend on {', '.join(str(ld) for ld in surrogates)} in "
            "real arithmetic (the repair is the identity), but in floating point it is singular while a split's "
            "partial value is 0, and no combine step evaluates it at the final value (a row of zeros gives "
            "the plain program's 0/0 only there); rolling_update evaluates it at the final value in the last "
            "step")
    for name in locals_:
        program = guard_term(program, name, [(partial_reads[name][ld], program.block(tensors[ld.tensor.name]))
                                             for ld in r_loads if numerics is None or ld in numerics.guards])
        program = replace_block(program, with_surrogates(program.block(name), {
            partial_reads[name][ld]: surrogate(partial_reads[name][ld]) for ld in surrogates}))

    references: dict[Load, Callable[[Load], Expr]] = {}
    if repair is not None and repair.auxiliaries:
        program, references, seen, state_notes = _references(program, r_loads, tensors, counts, c_rf, loop)
        created += seen
        notes += state_notes
    for name in locals_:
        refs = {pl: references[ld](pl) for ld, pl in partial_reads[name].items() if ld in references}
        if refs:
            program = replace_block(program, with_references(program.block(name), refs))

    # Step 7. Repair the global combine (Eq. 11): each partial (state) from its split's producer values to the
    # global ones.
    if repair is not None and not repair.is_identity:
        glob = program.block(block)
        g_split = _combine_split_var(glob)
        old: dict[Load, Expr] = {}
        for ld in r_loads:
            pl = partial_reads[c_rf][ld]
            idx = list(ld.indices)
            idx.insert(_split_axis(program.block(tensors[ld.tensor.name]), pl), g_split)
            at_split = Load(pl.tensor, tuple(idx))
            old[ld] = references[ld](at_split) if ld in references else \
                surrogate(at_split) if ld in surrogates else at_split
        state = _partial_state(glob, [program.block(name).store.tensor for name in locals_])
        producers_of = {ld: program.block(tensors[ld.tensor.name]) for ld in old}
        final_identity = {ld: p.reducer.identity for ld, p in producers_of.items()  # type: ignore[union-attr]
                          if numerics is not None and ld in numerics.guards and ld not in self_guarded}
        program = replace_block(program, repaired_update(glob, repair, "term", old, {ld: ld for ld in r_loads},
                                                         state, producers_of, final_identity=final_identity))
    fusion = Fusion("split_k_update", block, loop, tuple(producers), found.maps, tuple(broken), repair,
                    tuple(dict.fromkeys(created)), tuple(notes))
    return validate(program), fusion


def _naive_place(program: Program, block: str, fresh: list[str], local: dict[str, tuple[str, Load]], anchor: str,
                 loop: str, what: str) -> tuple[Program, list[Dependence]]:
    """Step 3's naive fusion of a consumer with producers: after the writers it reads under the loop, else
    aligned with a fresh producer's reduction, else cut by its producers' partials."""
    try:
        return naive_reverse_compute_at(program, block=block, loop_block=anchor, loop=loop)
    except IllegalTransform as err:
        try:
            if fresh:
                return naive_fuse_aligned(program, block=block, producers=fresh, loop_block=anchor, loop=loop,
                                          what=what)
            return _place_by_partials(program, block, local, anchor, loop, what)
        except IllegalTransform as err2:
            how = "a producer's reduction" if fresh else "the splits of its producers' partial results"
            raise IllegalTransform(f"{err}\nand aligning it with {how} failed too: {err2}") from None


def _place_by_partials(program: Program, block: str, local: dict[str, tuple[str, Load]], anchor: str, loop: str,
                       what: str) -> tuple[Program, list[Dependence]]:
    """Naive fusion of a consumer whose producers were all privatized by earlier calls (inertia's
    ``Σ w·|x - c|²`` after ``c``): it reads nothing written under the split loop, so it is placed as if it
    read its split's partials, with its reduction cut into contiguous parts ``j // f`` (f = ⌈E / S⌉ for
    reduce extent E and S splits), each under one iteration of the loop.

    Preconditions:
      1. the consumer has one reduce iteration, and it and the split loop have constant extents;
      2. for a max/min producer, the parts are exactly its splits and none is empty (isl proves both,
         :func:`_require_parts_are_splits`).  Any parts suit a repair (Eq. 3 holds element by element), but
         the guard of a fully masked split drops a part's terms where the producer's split holds only ±inf,
         and ``exp(x - m_local)`` stays at most 1 only where ``x`` is among the elements of ``m_local``.
    """
    c = program.block(block)
    splits = find_loop(program, anchor, loop).extent
    if len(c.reduce_iters) != 1 or not isinstance(c.reduce_iters[0].extent, Const) or not isinstance(splits, Const):
        raise IllegalTransform(f"{what}: block {block!r} reads no tensor written under loop {loop!r}; cutting its "
                               "reduction into the loop's splits needs one reduce iteration and constant extents")
    j = c.reduce_iters[0]
    part = j.var // -(-j.extent.value // splits.value)  # type: ignore[attr-defined]
    swapped: dict[Load, Load] = {}
    for p, (_, partial) in local.items():
        x = program.block(p).store.tensor
        axis = _split_axis(program.block(p), partial)
        for ld in loads(c.store.value):
            if ld.tensor == x:
                idx = list(ld.indices)
                idx.insert(axis, part)
                swapped[ld] = Load(partial.tensor, tuple(idx))
    reads_partials = c.replace(store=Store(c.store.tensor, c.store.indices, map_expr(
        c.store.value, lambda e: swapped.get(e) if isinstance(e, Load) else None)))
    for p, (name, partial) in local.items():
        if infinite_identity(program.block(name)):
            _require_parts_are_splits(program, reads_partials, p, name, partial.tensor, loop,
                                      splits.value, what)  # type: ignore[attr-defined]
    placed, _ = naive_reverse_compute_at(replace_block(program, reads_partials), block=block, loop_block=anchor,
                                         loop=loop)
    placed = replace_block(placed, placed.block(block).replace(store=c.store))
    info = deps.analyze(program, tensors=deps.tensors_of(c))
    return placed, deps.check_naive_fusion(info, placed, what=what)



def _require_parts_are_splits(program: Program, consumer: Block, producer: str, local_name: str, partials: Tensor,
                              loop: str, splits: int, what: str) -> None:
    """Prove that ``consumer`` (reading the partials ``partials`` of max/min ``producer`` in its part ``j // f``)
    cuts its reduction into exactly the producer's splits, none of them empty.

    With ``X_rf[r, t]`` a partial result (``t`` its split), isl checks:
      1. every partial the consumer reads holds at least one element (no ``where``/mask empties a split:
         with S splits of ⌈E/S⌉ reduce iterations, ``(S-1)·⌈E/S⌉ < E``), so its guard never drops a part;
      2. for each tensor both read, the elements the consumer reads in the part of ``X_rf[r, t]`` are
         exactly those the producer's split ``t`` reduces into ``X_rf[r, t]``: ``exp(x - m_local) <= 1``.
    """
    params = param_names(program)
    local_b = program.block(local_name)
    p_acc = block_accesses(local_b, deps.iteration_domain(local_b, params), params)
    c_acc = block_accesses(consumer, deps.iteration_domain(consumer, params), params)
    p_write = next(a.relation for a in p_acc if a.role == STORE)
    held = p_write.range()
    parts = [a.relation for a in c_acc if a.is_read and a.tensor == partials.name]
    cannot = (f"{what}: block {consumer.name!r} reads no tensor written under loop {loop!r}"
              f" and its producer {producer!r} is a {local_b.reducer.name}, so its parts must be exactly the "  # type: ignore[union-attr]
              "producer's splits, none of them empty")
    for part in parts:
        empty = part.range().subtract(held)
        if not empty.is_empty():
            raise IllegalTransform(
                f"{cannot}; but partial {empty.lexmin()} of {local_name!r} holds no element (a where/mask, or "
                f"{splits} splits of ⌈E/{splits}⌉ leave the last empty): the guard of a fully masked split would "
                f"drop the consumer's part; choose a split count S with (S-1)·⌈E/S⌉ < E and no mask, or fuse "
                f"{consumer.name!r} with {producer!r} in one split_k_update before privatizing it")
    p_reads = [a for a in p_acc if a.is_read and a.role == LOAD]
    shared = False
    for c_read in (a for a in c_acc if a.is_read and a.tensor != partials.name):
        mine = [a.relation for a in p_reads if a.tensor == c_read.tensor]
        if not mine:
            continue
        shared = True
        elements = functools.reduce(lambda u, v: u.union(v), mine)
        by_split = p_write.reverse().apply_range(elements)
        for part in parts:
            by_part = part.reverse().apply_range(c_read.relation)
            if not by_part.is_equal(by_split.intersect_domain(by_part.domain())):
                witness = by_part.subtract(by_split).union(by_split.intersect_domain(by_part.domain())
                                                            .subtract(by_part)).lexmin()
                raise IllegalTransform(
                    f"{cannot}; but {c_read.text} in the consumer's parts j // ⌈E/{splits}⌉ is not what the "
                    f"producer's splits reduce ({witness} differs): exp(x - m_local) could exceed 1; split the "
                    f"producer's reduction as [{splits}, None] over the consumer's elements, or fuse "
                    f"{consumer.name!r} with {producer!r} in one split_k_update")
    if not shared:
        raise IllegalTransform(f"{cannot}; but it reads no tensor that {producer!r} reduces, so nothing shows "
                               "that its parts are the producer's splits")

def _instances(producer: Block) -> Expr:
    """How many elements a reduction sums per result: the product of its reduce extents (its ``where``, if
    any, is not counted; the count only places a reference point, which any value keeps exact)."""
    return functools.reduce(operator.mul, [iv.extent for iv in producer.reduce_iters])


def _drop_combine(program: Program, block: str) -> Program:
    """``program`` without the combine ``block`` (its own nest) and the tensor only it writes."""
    x = program.block(block).store.tensor
    body = replace_node(program.body, own_nest(program, block), None)
    return program.replace(body=body, tensors=tuple(t for t in program.tensors if t != x))


def _partial_reads(program: Program, local_name: str, r_loads: list[Load], tensors: dict[str, str], loop: str,
                   what: str) -> dict[Load, Load]:
    """For each producer value ``ld`` the consumer reads, the local block's read of its split's partial."""
    out: dict[Load, Load] = {}
    split_iter = _split_iter(program, local_name, loop)
    for ld in r_loads:
        p = tensors[ld.tensor.name]
        found_local = _local_version(program, p, local_name, loop)
        if found_local is None:
            raise IllegalTransform(f"{what}: producer {p!r} has no partial results under loop {loop!r}")
        partial = found_local[1]
        idx = list(ld.indices)
        idx.insert(_split_axis(program.block(p), partial), split_iter)
        out[ld] = Load(partial.tensor, tuple(idx))
    return out


def _references(program: Program, r_loads: list[Load], tensors: dict[str, str], counts: dict[str, Expr],
                anchor: str, loop: str) -> tuple[Program, dict[Load, Callable[[Load], Expr]], list[str], list[str]]:
    """The reference point of each plain-sum producer value, as a function of a read of its partial; the
    program with the blocks counting what each split holds, their names, and notes for ``explain``.

    A plain sum's local nest that gives every split the same number of elements (no ``where``) is
    extrapolated by the number of splits; otherwise a sibling sum ``<P_rf>_seen`` adds ``1/N`` per element
    of the local nest, the fraction of the producer's N elements (``counts``, known for producers
    privatized by this call) that its split holds.  A producer privatized earlier without one keeps its
    partial as the reference: still exact, but less accurate at a large common offset (noted).
    """
    refs: dict[Load, Callable[[Load], Expr]] = {}
    created: list[str] = []
    notes: list[str] = []
    splits = find_loop(program, anchor, loop).extent
    for ld in r_loads:
        p = tensors[ld.tensor.name]
        p_rf = program.block(local_block(program, p, anchor, loop))
        if p not in counts and not plain_sum(program, p_rf.name):
            continue
        x_rf = p_rf.store.tensor
        if p_rf.where is None:
            refs[ld] = functools.partial(_scaled, fraction=(const(1), splits))
            notes.append(f"reference point of the state in each split: {x_rf.name}·{splits} (each of the {splits} "
                         f"splits holds as many elements), the split's running estimate of the plain sum {ld}; the "
                         "state repair is exact for any reference, and this one stays near the data")
            continue
        seen = next((t for t in program.tensors if t.name == f"{x_rf.name}_seen"), None)
        if seen is None and p not in counts:
            notes.append(f"no reference point near the data for {ld}: its partials {x_rf.name} were made by an "
                         "earlier split_k_update and their splits differ in size; the state repair is exact, but "
                         "at a large common offset its terms cancel")
            continue
        if seen is None:
            total = counts[p]
            step = const(1.0 / total.value, x_rf.dtype) if isinstance(total, Const) \
                else cast(x_rf.dtype, 1.0) / cast(x_rf.dtype, total)
            program, (name,) = add_sibling_sums(program, p_rf.name, [("seen", step)])
            created.append(name)
            seen = program.block(name).store.tensor
        refs[ld] = functools.partial(_seen_scaled, seen=seen)
        notes.append(f"reference point of the state in each split: {x_rf.name} / {seen.name}, where {seen.name} "
                     f"sums 1/N over the split's elements (its share of the N elements of the plain sum {ld}); the "
                     "state repair is exact for any reference, and this one stays near the data")
    return program, refs, created, notes


def _scaled(partial: Load, *, fraction: tuple[Expr, Expr]) -> Expr:
    return estimate(partial, fraction)


def _seen_scaled(partial: Load, *, seen: Tensor) -> Expr:
    return estimate(partial, (Load(seen, partial.indices), const(1.0, seen.dtype)))


def _partial_state(combine: Block, partials: list[Tensor]) -> list[Expr]:
    """The auxiliary partial states as the combine reads its own partial: ``X_rf[…, s]`` becomes
    ``A_rf[…, s]`` (``partials`` = [X_rf, A1_rf, …]), inside rfactor's guard of missing partials too."""
    x_rf, *aux = partials
    term = combine.reduce_term()
    assert term is not None
    return [map_expr(term, lambda e, a=a: Load(a, e.indices) if isinstance(e, Load) and e.tensor == x_rf else None)
            for a in aux]


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


def _split_anchor(program: Program, loop_block: str, loop: str) -> str:
    """A block under the split loop: ``loop_block``, or its local block when an earlier split_k_update
    made ``loop_block`` the global combine (whose loop of that name runs over the partials), so that one
    loop reference serves every consumer of a chain."""
    rf = f"{loop_block}_rf"
    if (rf in {b.name for b in program.blocks()} and any(lp.var.name == loop for lp in loops_of(program, rf))
            and _local_version(program, loop_block, rf, loop) is not None):
        return rf
    return loop_block


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
