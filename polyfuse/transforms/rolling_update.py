"""rolling_update: fuse a reduction into the loop of its producer reductions (Neptune Alg. 1).

``rolling_update(block=C, loop_block=B, loop=L)`` fuses consumer reduction C under
loop L (which encloses B), breaking the temporal dependences from its producer
reductions and repairing C with the solver's ``h``:

  1. dataflow: the producer reductions of C and the map blocks between them
     (:mod:`~polyfuse.transforms.dataflow`); those maps are inlined into C (a copy); a map C
     reads that runs after L's nest moves before it (or is recomputed in C where it cannot);
  2. every producer not yet under L is placed there (``reverse_compute_at``, fully
     checked); L must start each element of a producer's reduction in its first iteration
     and hold all of it (:mod:`~polyfuse.transforms.fusion_loops`);
  3. naive fusion: C is placed under L (``naive_reverse_compute_at``); the broken
     dependences must be exactly temporal edges from producers to C, anything else
     is refused with the dependence and a witness;
  4. the solver matches C to ``X = X ⊕ g(r, c)`` and derives and proves ``h``;
  5. when C still reduces over loops inside L (a tile), C is privatized over L
     (``rfactor``): ``C_rf`` reduces one tile with the current producer values and
     the combine ``C`` moves into L, so the repair runs once per tile (Fig. 15);
  6. each producer keeps its previous value: a block ``P_save`` stores
     ``X_prev = X`` (the identity in the first iteration) before P's update;
  7. C's update becomes ``X = G(h(X, r_prev, r)) ⊕ rest``.

A *state repair* (no single h; :mod:`~polyfuse.transforms.auxiliary`) adds the
auxiliary reductions ``A_1 … A_m`` right after C.  Privatized in step 5, their
combines run in the order X, A_1, …, A_m: each repair reads the higher auxiliaries
as they were before this iteration.  A plain-sum producer's partial ``Σ x/N`` is far
from the data, so the terms and the repair read a reference point ``r·N/n`` instead,
n the count of elements reduced so far: ``min(T·(k + 1), N)`` for tiles of T (the last
may be partial).  After the last iteration it is exactly r, which keeps the repair exact.

Guards, each exact: ``G`` keeps ``X`` when it is still the reducer's identity
(distributivity makes h(identity) the identity; G is left out where h is ``t·exp(r - r')``
of a max producer, which maps 0 to exactly 0: ``Repair.decays``) or when no producer changed
(``h(t, r, r) = t``); a term computed while a max/min producer is still at its
infinite identity (every element seen so far masked to -inf) contributes the
identity, which is what that term is worth once the producer is finite.  So
``exp(-inf - -inf)`` never appears where the unfused program has a value.

With no producer (the first reduction of a chain, like the row max) there is
nothing to repair: C is only placed under L (``reverse_compute_at``), where it
keeps its running value; step 5 applies only when a repair must run per tile.
A *sibling* (C reads nothing written under L: the statistic of another tensor over
the same rows) is placed beside a block under L with its iteration space, instance for
instance (:mod:`~polyfuse.transforms.fuse_siblings`), so it shares the pass.

Before / after (Neptune Fig. 1a → 1c, ``rolling_update(s_sum, s_max, j)``)::

    s_max: xmax[i] = max(xmax[i], inp[i, j])      for i:  for j:
    s_exp: xexp[i, j] = exp(inp[i, j] - xmax[i])      s_max_save: xmax_prev[i] = j == 0 ? -inf : xmax[i]
    s_sum: xsum[i] += xexp[i, j]                      s_max:      xmax[i] = max(xmax[i], inp[i, j])
                                                      s_sum:      xsum[i] = G(xsum[i]·exp(xmax_prev[i] - xmax[i]))
                                                                            + exp(inp[i, j] - xmax[i])
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyfuse.errors import IllegalTransform, NonAffineIndex
from polyfuse.deps.domains import param_names, prune_where
from polyfuse.deps.islconv import aff_text, build_map, dim_env, param_env
from polyfuse.ir.affine import linear_form, variables
from polyfuse.ir.expr import (
    Const, Expr, Load, Var, conjuncts, const, eq, logical_and, logical_or, maximum, minimum, select,
)
from polyfuse.ir.stmt import SPATIAL, Block, IterVar, Loop, Program, Store, Tensor
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import free_vars, loads, seq
from polyfuse.transforms.auxiliary import add_auxiliary_blocks, estimate, plain_sum, with_references
from polyfuse.transforms.compute_at import naive_reverse_compute_at, reverse_compute_at
from polyfuse.transforms.dataflow import (
    body_children, child_containing, insert_into, naive_fuse_aligned, producers_in_place, rolled_by,
    spatial_loops_between, under,
)
from polyfuse.transforms.fusion_common import (
    Fusion, guard_term, guarded_rows, repaired_update, replace_block, solve_for, surrogate, with_surrogates,
)
from polyfuse.transforms.fuse_siblings import fuse_siblings, reads_under, sibling_anchor
from polyfuse.transforms.fusion_loops import require_rolling_loop
from polyfuse.transforms.repair import Repair
from polyfuse.transforms.signs import declared_signs
from polyfuse.transforms.tree import blocks_under, find_loop, loops_of, replace_node


def rolling_update(program: Program, *, block: str, loop_block: str, loop: str,
                   approximate: bool = False, signs: Mapping[str, str] | None = None) -> tuple[Program, Fusion]:
    """Fuse reduction ``block`` under ``loop`` (enclosing ``loop_block``), repaired; see the module docstring."""
    what = f"rolling_update of block {block!r} under loop {loop!r} (enclosing block {loop_block!r})"
    consumer = program.block(block)
    if consumer.reduce_term() is None or consumer.init is None:
        raise IllegalTransform(f"{what}: block {block!r} is not a reduction X = X ⊕ g with an init; "
                               "only such a block can be fused with a repair")

    notes: tuple[str, ...] = ()

    # Step 1. Producers, and the map blocks between them and the consumer.
    program, found = producers_in_place(program, block, loop_block, loop, what)

    # Step 2. Producers under the rolling loop, in program order.
    order = [b.name for b in program.blocks()]
    producers = sorted(found.reductions, key=order.index)
    for p in producers:
        if not under(program, p, find_loop(program, loop_block, loop)):
            program = _place_producer(program, p, block, loop_block, loop, what)
    producers = [p for p in producers if rolled_by(program.block(p), loop)]
    require_rolling_loop(program, producers, loop_block=loop_block, loop=loop, what=what)

    # Step 3. Naive fusion of the consumer: only temporal producer -> consumer edges may break.
    if producers:
        try:
            program, broken = naive_fuse_aligned(program, block=block, producers=producers, loop_block=loop_block,
                                                 loop=loop, what=what)
        except IllegalTransform as err:
            raise IllegalTransform(f"{err}{_privatized_hint(program, block, producers, loop)}") from None
    elif reads_under(program, block, loop_block, loop):
        program, broken = naive_reverse_compute_at(program, block=block, loop_block=loop_block, loop=loop)
    else:
        # Step 3b. A sibling: it reads nothing written under the loop and needs no repair, so it runs beside
        # a block with its iteration space, instance for instance (one pass over the data).
        anchor = sibling_anchor(program, block, loop_block, loop)
        program = fuse_siblings(program, block=block, loop_block=anchor, loop=loop, what=what)
        broken, notes = [], (f"sibling of block {anchor!r}: no dependence between them, one pass over the same "
                             "iteration space (fuse_siblings)",)
    stray = [d for d in broken if d.sink != block or d.source not in producers]
    if stray:
        raise IllegalTransform(f"{what}: naive fusion breaks a dependence no repair covers: {stray[0]}")

    # Step 4. The repair.
    r_loads, tensors, repair = solve_for(program, block, producers, approximate=approximate, what=what,
                                         signs=declared_signs(program, signs, what),
                                         call=("rolling_update", f'sch.loop("{loop_block}", "{loop}")'))
    self_guarded = guarded_rows(program, block, r_loads, tensors)

    # Step 4b. A state repair (no single h): the auxiliary reductions join the consumer, right after it.
    states: list[tuple[str, Repair | None]] = [(block, repair)]
    created: list[str] = []
    if repair is not None and repair.auxiliaries:
        program, aux_blocks = add_auxiliary_blocks(program, block, repair)
        states += [(name, aux.repair) for name, aux in zip(aux_blocks, repair.auxiliaries, strict=True)]
        created += aux_blocks

    # Step 4c. A non-identity init is the plain program's first operand, which no repair may rescale: the
    # consumer starts from the identity and takes the init at the last step (step 8).
    needs_repair = repair is not None and not repair.is_identity
    # An identity repair leaves t as it is, but its term still reads the producers' running values, where
    # (in floating point) it can be singular or meet an infinite identity (r/r is 0/0 while a mass is 0):
    # the same surrogates and guards as a repaired term, on a local consumer where it reduces inside.
    numerics = repair.numerics if repair is not None else None
    fixes_term = (repair is not None and repair.is_identity and numerics is not None
                  and bool(numerics.surrogates or numerics.guards))
    init = program.block(block).init
    identity = program.block(block).reducer.identity  # type: ignore[union-attr]
    late_init = needs_repair and init is not None and init != identity
    if late_init:
        program = replace_block(program, program.block(block).replace(init=_empty_or(program.block(block),
                                                                                    init, identity)))

    # Step 5. One repair per tile: privatize the consumer (and its auxiliaries) over the rolling loop.
    estimated: list[Load] = []
    locals_ = {name: name for name, _ in states}
    if (needs_repair or fixes_term) and _reduces_inside(program.block(block), loop):
        from polyfuse.transforms.rfactor import rfactor

        for name, _ in states:
            program, locals_[name] = rfactor(program, block=name, loop=loop)
            program = reverse_compute_at(program, block=name, loop_block=locals_[name], loop=loop)
            created.append(locals_[name])
        program = _in_state_order(program, [name for name, _ in states], loop)

    # Steps 6-7. Previous producer values, and the repaired updates (X first, then A_1, …: each reads
    # the higher auxiliaries before their update).
    if needs_repair:
        prev: dict[Load, Load] = {}
        for ld in r_loads:
            program, prev_tensor, saver = _keep_previous(program, tensors[ld.tensor.name], loop_block, loop)
            if saver:
                created.append(saver)
            prev[ld] = Load(prev_tensor, ld.indices)
        producers_of = {ld: program.block(tensors[ld.tensor.name]) for ld in r_loads}
        guards = [(ld, p) for ld, p in producers_of.items() if numerics is None or ld in numerics.guards]
        surrogates = numerics.surrogates if numerics is not None else frozenset()
        final = {ld: not _combined_later(program, tensors[ld.tensor.name], loop) for ld in r_loads}
        accumulators = [program.block(name).store.tensor for name, _ in states[1:]]
        estimated = [ld for ld in r_loads if accumulators and plain_sum(program, tensors[ld.tensor.name])]
        seen = {ld: _elements_seen(program, tensors[ld.tensor.name], loop) for ld in estimated}
        for name, h in states:
            program = _fix_term(program, locals_[name], guards, surrogates, final, loop)
            old: dict[Load, Expr] = {ld: surrogate(v) if ld in surrogates else v for ld, v in prev.items()}
            new: dict[Load, Expr] = {ld: surrogate(ld, _last(program, program.block(name), loop) if final[ld] else None)
                                     if ld in surrogates else ld for ld in r_loads}
            if estimated:
                # A state repair is exact for any reference point that ends at r itself (everything seen:
                # the fraction is exactly 1); a running estimate from the true count keeps it accurate.
                k_local = _rolled_index(program, program.block(locals_[name]), loop)
                program = replace_block(program, with_references(
                    program.block(locals_[name]), {ld: estimate(ld, seen[ld].fraction(k_local + 1))
                                                   for ld in estimated}))
                k = _rolled_index(program, program.block(name), loop)
                old |= {ld: estimate(prev[ld], seen[ld].fraction(maximum(k, 1))) for ld in estimated}
                new |= {ld: estimate(ld, seen[ld].fraction(k + 1)) for ld in estimated}
            if h is None or h.is_identity:
                continue
            state = _state_before(program.block(name), accumulators)
            final_identity = {ld: p.reducer.identity for ld, p in guards  # type: ignore[union-attr]
                              if final[ld] and ld not in self_guarded}
            program = _apply_repair(program, name, loop, h, old, new, producers_of, state, final_identity)

    elif fixes_term and numerics is not None:
        program = _fix_term(program, locals_[block],
                            [(ld, program.block(tensors[ld.tensor.name])) for ld in r_loads if ld in numerics.guards],
                            numerics.surrogates,
                            {ld: not _combined_later(program, tensors[ld.tensor.name], loop) for ld in r_loads}, loop)

    # Step 8. The init, combined once everything is summed (the order of a sum changes only its rounding).
    if late_init:
        b = program.block(block)
        last = _last(program, b, loop)
        value = select(last, b.reducer.apply(b.store.value, init), b.store.value)  # type: ignore[union-attr, arg-type]
        program = replace_block(program, b.replace(store=Store(b.store.tensor, b.store.indices, value)))
    notes += tuple(f"reference point of the state: {ld}·{seen[ld].describe(loop)}, a running estimate of the "
                  f"plain sum {ld}; the state repair is exact for any reference that ends at {ld} itself, and "
                  "this one stays near the data (the partial sum does not), so the terms do not cancel"
                  for ld in (estimated if needs_repair else ()))
    fusion = Fusion("rolling_update", block, loop, tuple(producers), found.maps, tuple(broken), repair,
                    tuple(created), notes)
    return validate(program), fusion


def _place_producer(program: Program, producer: str, block: str, loop_block: str, loop: str, what: str) -> Program:
    """Producer ``producer`` placed under the loop as it is (``reverse_compute_at``); a refusal says which call
    fuses it first when it reads running values itself (a chain fused out of order)."""
    try:
        return reverse_compute_at(program, block=producer, loop_block=loop_block, loop=loop)
    except IllegalTransform as err:
        if program.block(producer).reducer is None:
            raise
        raise IllegalTransform(
            f"{what}: producer {producer!r} of block {block!r} is not under loop {loop!r} yet, and placing it there "
            f"as it is fails; fuse the producer first, sch.rolling_update({producer!r}, "
            f'sch.loop("{loop_block}", "{loop}")), then {block!r} (a chain is fused in program order). '
            f"The placement said: {err}") from None


def _privatized_hint(program: Program, block: str, producers: list[str], loop: str) -> str:
    """Why a producer rolled over a tiled loop by an earlier call has no reduction to align with."""
    names = {b.name for b in program.blocks()}
    rolled = [p for p in producers if f"{p}_rf" in names and loop in {lp.var.name for lp in loops_of(program, p)}]
    if not rolled:
        return ""
    p = rolled[0]
    return (f"\n{p!r} was rolled over the tiles of loop {loop!r} by an earlier rolling_update: {p}_rf reduces each "
            f"tile and {p!r} now combines one partial per tile, so its repaired value exists per tile, not per "
            f"element; roll {block!r} over an untiled loop, or fuse the chain with split_k_update")


def _reduces_inside(block: Block, loop: str) -> bool:
    """True if loops other than ``loop`` bind the block's reduction (a tile inside the rolling loop)."""
    return any(free_vars(b) - {loop} for iv, b in zip(block.iters, block.bindings, strict=True) if iv.is_reduce)


def _keep_previous(program: Program, producer: str, loop_block: str, loop: str) -> tuple[Program, Tensor, str]:
    """A tensor holding the producer's value from before this iteration of ``loop``, and the block saving it."""
    p = program.block(producer)
    x = p.store.tensor
    name = f"{x.name}_prev"
    for t in program.tensors:
        if t.name == name:
            return program, t, ""
    prev = Tensor(name, x.shape, x.dtype, "temp", x.scope)
    lp = find_loop(program, loop_block, loop)
    step = Var(_fresh_iter(p, "t"))
    spatial = [(iv, b) for iv, b in zip(p.iters, p.bindings, strict=True) if not iv.is_reduce]
    iters = tuple(iv for iv, _ in spatial) + (IterVar(step, lp.extent, SPATIAL),)
    bindings = tuple(b for _, b in spatial) + (Var(loop),)
    identity = p.reducer.identity  # type: ignore[union-attr]
    value = select(eq(step, 0), identity, Load(x, p.store.indices))
    saver = Block(f"{producer}_save", iters, bindings, Store(prev, p.store.indices, value))
    # Only the producer's elements (with an init, its first instances exist exactly where it has any),
    # so the saver reads no element the producer never writes.
    first = p.origin_where() if p.init is not None else None
    if first is not None:
        saver = saver.replace(where=prune_where(saver, conjuncts(first), param_names(program)))
    nest = saver
    for copy in reversed(spatial_loops_between(program, producer, lp)):
        nest = Loop(copy.var, copy.extent, nest)  # type: ignore[assignment]
    new_loop = insert_into(lp, child_containing(lp, producer), nest)
    program = program.replace(tensors=program.tensors + (prev,), body=replace_node(program.body, lp, new_loop))
    return program, prev, saver.name


def _fresh_iter(block: Block, base: str) -> str:
    names = {iv.var.name for iv in block.iters}
    k, out = 0, base
    while out in names:
        k += 1
        out = f"{base}{k}"
    return out


def _in_state_order(program: Program, combines: list[str], loop: str) -> Program:
    """The combines of X, A_1, … in that order in the rolling loop's body.

    Each repair reads the higher auxiliaries as they were before this iteration's update,
    so X's combine must run first and A_m's last; ``reverse_compute_at`` puts each new
    combine right after the local nest, i.e. before the ones placed earlier.
    """
    lp = find_loop(program, combines[0], loop)
    kids = body_children(lp)
    slots = [child_containing(lp, name) for name in combines]
    if slots == sorted(slots):
        return program  # in order already (a local nest between two combines writes only its own partial)
    first = min(slots)
    if sorted(slots) != list(range(first, first + len(slots))):
        raise IllegalTransform(f"rolling_update: the combines {', '.join(combines)} of the state repair are not "
                               f"adjacent statements of loop {loop!r} (at {slots}) and not in the order the repair "
                               "needs; their order cannot be fixed without moving others")
    kids[first:first + len(slots)] = [kids[k] for k in slots]
    return program.replace(body=replace_node(program.body, lp, lp.replace(body=seq(*kids))))


@dataclass(frozen=True)
class _Count:
    """How many elements of a plain-sum producer the first n iterations of the rolling loop reduce,
    as a fraction ``(seen, total)`` of what all of them reduce.

    A tiling of its reduce iteration (extent N, tile T, E tiles) sees ``min(T·n, N)`` of
    ``min(T·E, N)``: a partial last tile holds fewer.  The fraction is exactly 1 after the
    last iteration whatever the binding, so the reference point ``r/fraction`` ends at r
    itself and the state repair stays exact; the true count keeps the reference near the
    data.  ``why`` says why a binding that is no such tiling counts iterations (n of E).
    """

    step: int
    extent: Expr
    total: Expr
    why: str = ""

    def fraction(self, iterations: Expr) -> tuple[Expr, Expr]:
        """(seen, total) after ``iterations`` iterations of the rolling loop."""
        return self._clip(iterations if self.step == 1 else iterations * self.step), self._clip(self._all())

    def describe(self, loop: str) -> str:
        seen, total = self.fraction(Var("k") + 1)
        how = f"{seen} of {total} elements reduced by iteration k of loop {loop!r}"
        return f"{total}/({seen}) ({how}; {self.why}, so iterations are counted)" if self.why else \
            f"{total}/({seen}) ({how})"

    def _all(self) -> Expr:
        """``T·E``: the elements E iterations would see without the bound N."""
        if isinstance(self.extent, Const):
            return const(self.step * int(self.extent.value), self.extent.dtype)
        return self.extent if self.step == 1 else self.extent * self.step

    def _clip(self, seen: Expr) -> Expr:
        """``min(seen, N)``, where the last tile can be partial."""
        if self.total == self._all():
            return seen
        if isinstance(seen, Const) and isinstance(self.total, Const):
            return const(min(seen.value, self.total.value), seen.dtype)
        if isinstance(self.extent, Const) and isinstance(self.total, Const) \
                and self.step * self.extent.value <= self.total.value:
            return seen
        return minimum(seen, self.total)


def _elements_seen(program: Program, producer: str, loop: str) -> _Count:
    """The count of ``producer``'s elements reduced by the first iterations of ``loop``.

    When iteration k of the loop reduces exactly ``T·k <= j < T·(k + 1)`` of the producer's
    reduce iteration ``j < N`` (``split(j, [None, T])``: ``j = j_0·T + j_1``; checked with ISL
    over the loops inside, so any enumeration of a tile qualifies), the first n reduce
    ``min(T·n, N)`` values of j; its other reduce iterations run in full under each.  Any
    other binding counts iterations.
    """
    lps = loops_of(program, producer)
    nest = lps[[lp.var.name for lp in lps].index(loop):]
    extent = nest[0].extent

    def by_iterations(why: str) -> _Count:
        return _Count(1, extent, extent, why)

    b = program.block(producer)
    rolled = [(iv, bnd) for iv, bnd in zip(b.iters, b.bindings, strict=True) if iv.is_reduce and loop in free_vars(bnd)]
    if len(rolled) != 1:
        return by_iterations(f"it binds {len(rolled)} reduce iterations of {producer!r}")
    iv, binding = rolled[0]
    what = f"rolling_update: block {producer!r}, binding of {iv.var.name!r}"
    try:
        form = linear_form(binding)
    except NonAffineIndex as err:
        return by_iterations(str(err))
    step = form.pop(loop, 0)
    if step <= 0 or loop in variables(form):
        return by_iterations(f"{iv.var.name} = {binding} is not {loop}·T plus a term of the inner loops")
    if step == 1 and len(nest) == 1 and iv.extent == extent:
        return _Count(1, extent, extent)
    try:
        params = param_names(program)
        sizes = param_env(params)
        names = [lp.var.name for lp in nest]
        total = aff_text(iv.extent, sizes, what=what)
        j = aff_text(binding, dim_env(names, params), what=what)
        box = [f"0 <= _a{k} < {aff_text(lp.extent, sizes, what=what)}" for k, lp in enumerate(nest)]
        reduced = build_map(params, names, [j], [*box, f"0 <= {j} < {total}"])
        tile = build_map(params, [loop, "r"], [f"{step}*_a0 + _a1"],
                         [box[0], f"0 <= _a1 < {step}", f"0 <= {step}*_a0 + _a1 < {total}"])
    except NonAffineIndex as err:
        return by_iterations(str(err))
    inner = isl.dim_type.in_
    if not reduced.project_out(inner, 1, len(nest) - 1).is_equal(tile.project_out(inner, 1, 1)):
        return by_iterations(f"iteration k of loop {loop!r} does not reduce {iv.var.name} in "
                             f"[{step}·k, {step}·(k + 1))")
    return _Count(step, extent, iv.extent)


def _state_before(combine: Block, accumulators: list[Tensor]) -> list[Expr]:
    """The auxiliary accumulators as the combine ``combine`` sees them: in its first iteration they
    are not yet initialised (their blocks come after it), and no element has been summed: 0."""
    first = functools.reduce(logical_and, [eq(iv.var, 0) for iv in combine.reduce_iters])
    indices = combine.store.indices
    zero = combine.reducer.identity  # type: ignore[union-attr]
    return [select(first, zero, Load(t, indices)) for t in accumulators]


def _fix_term(program: Program, local: str, guards: list[tuple[Load, Block]], surrogates: frozenset[Load],
              final: dict[Load, bool], loop: str) -> Program:
    """The term of ``local`` read at the producers' running values, made exact: guarded where a producer
    is at its infinite identity, and a mass at 0 read through its surrogate (its real value at the last
    step, where that value is final)."""
    program = guard_term(program, local, guards)
    b = program.block(local)
    return replace_block(program, with_surrogates(b, {
        ld: surrogate(ld, _last(program, b, loop) if final[ld] else None) for ld in surrogates}))


def _empty_or(block: Block, init: Expr, identity: Expr) -> Expr:
    """The init a consumer starts from when its init is taken at the last step instead: the identity, or
    the init itself where a size makes the reduction empty (no step runs: the value is the init alone)."""
    empty = [eq(iv.extent, 0) for iv in block.reduce_iters if not isinstance(iv.extent, Const)]
    return identity if not empty else select(functools.reduce(logical_or, empty), init, identity)


def _last(program: Program, block: Block, loop: str) -> Expr:
    """The condition "this is the last iteration of ``loop``" in ``block``'s variables."""
    extent = find_loop(program, block.name, loop).extent
    return eq(_rolled_index(program, block, loop), extent - 1)


def _combined_later(program: Program, producer: str, loop: str) -> bool:
    """True when the producer's value after ``loop`` is a partial result that a reduction outside the
    loop combines with others (a split's partial): its value after the last step is not final."""
    x = program.block(producer).store.tensor
    inside = {b.name for b in blocks_under(find_loop(program, producer, loop))}
    for b in program.blocks():
        if b.name in inside or b.reducer is None:
            continue
        reduce_names = {iv.var.name for iv in b.reduce_iters}
        if any(ld.tensor == x and any(free_vars(i) & reduce_names for i in ld.indices) for ld in loads(b.store.value)):
            return True
    return False


def _rolled_index(program: Program, block: Block, loop: str) -> Expr:
    """The iteration variable of ``block`` bound to the rolling loop (0 where the loop runs once)."""
    for iv, bnd in zip(block.iters, block.bindings, strict=True):
        if bnd == Var(loop):
            return iv.var
    if find_loop(program, block.name, loop).extent == const(1):
        return const(0)
    raise IllegalTransform(f"rolling_update: block {block.name!r} has no iteration bound to loop {loop!r}")


def _apply_repair(program: Program, block: str, loop: str, repair: Repair, old: dict[Load, Expr],
                  new: dict[Load, Expr], producers: dict[Load, Block], state: list[Expr],
                  final_identity: dict[Load, Expr]) -> Program:
    """``X = G(h(X, r_prev, r)) ⊕ rest`` in the (combine) block ``block``."""
    b = program.block(block)
    names = {iv.var.name for iv in b.iters}
    for ld in producers:
        stray = set().union(*(free_vars(i) for i in ld.indices)) - names
        if stray:
            raise IllegalTransform(f"rolling_update of block {block!r}: the combine has no iteration variable "
                                   f"{', '.join(sorted(stray))} to index producer result {ld}")
    first = eq(_rolled_index(program, b, loop), 0)
    return replace_block(program, repaired_update(b, repair, "acc", old, new, state, producers, first,
                                                  final_identity, _last(program, b, loop)))


__all__ = ["Fusion", "rolling_update"]
