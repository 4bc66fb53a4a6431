"""Pieces shared by the two reduction fusions (rolling update, split-k update)."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polyfuse.deps.dependence import Dependence
from polyfuse.errors import IllegalTransform, InternalError, NoRepairFound, PolyfuseError
from polyfuse.ir.expr import (
    BinOp, Const, Expr, Load, Select, Var, const, eq, logical_and, logical_not, logical_or, select,
)
from polyfuse.ir.stmt import Block, Program, Store
from polyfuse.ir.visit import free_vars, loads, map_expr, substitute
from polyfuse.transforms.auxiliary import plain_sum
from polyfuse.transforms.numerics import MapDefinition, ProducerFacts, expand_maps, in_loops
from polyfuse.transforms.repair import Repair, reducer_kind, solve_repair
from polyfuse.transforms.signs import missing_signs, sign_of, value_signs
from polyfuse.transforms.tree import loops_of, map_blocks


@dataclass(frozen=True)
class Fusion:
    """What a reduction fusion did, for ``polyfuse explain`` and tests."""

    kind: str
    consumer: str
    loop: str
    producers: tuple[str, ...]
    inlined: tuple[str, ...]
    broken: tuple[Dependence, ...]
    repair: Repair | None
    created: tuple[str, ...]
    notes: tuple[str, ...] = ()


def solve_for(program: Program, block: str, producers: list[str], *, approximate: bool,
              what: str, signs: Mapping[str, str] | None = None, call: tuple[str, str] | None = None,
              ) -> tuple[list[Load], dict[str, str], Repair | None]:
    """The producer loads in ``block``'s term, producer tensor -> block, and the proven repair (None if no load).

    The repair is proven in floating point too (:mod:`~polyfuse.transforms.numerics`), from what the
    program guarantees about each producer's running value (:func:`producer_facts`) and the sign facts
    (:mod:`~polyfuse.transforms.signs`; ``signs`` are the call's promises).  ``call`` is the primitive and
    the loop handle (as Python) the user called, for a refusal that says how to declare a missing sign.
    """
    consumer = program.block(block)
    term = consumer.reduce_term()
    tensors = {program.block(p).store.tensor.name: p for p in producers}
    r_loads = list(dict.fromkeys(ld for ld in loads(term) if ld.tensor.name in tensors))  # type: ignore[arg-type]
    reduce_names = {iv.var.name for iv in consumer.reduce_iters}
    for ld in r_loads:
        if any(free_vars(i) & reduce_names for i in ld.indices):
            raise IllegalTransform(f"{what}: block {block!r} reads producer result {ld} at an index that varies "
                                   "along the reduction; a repair needs one producer value per consumer element")
    if not r_loads:
        return r_loads, tensors, None
    known = value_signs(program, signs)
    try:
        return r_loads, tensors, _solve(program, consumer, term, r_loads, tensors, approximate,  # type: ignore[arg-type]
                                        known)
    except NoRepairFound as err:
        if call is None:
            raise
        hint = missing_signs(program, r_loads, known, primitive=call[0], block=block, loop=call[1]) \
            if "not provably >= 0" in str(err) else ""
        raise NoRepairFound(f"{what}: {err}" + (f"\n{hint}" if hint else "")) from None


def _solve(program: Program, consumer: Block, term: Expr, r_loads: list[Load], tensors: dict[str, str],
           approximate: bool, signs: Mapping[str, str]) -> Repair:
    """The repair of ``consumer``'s update by ``term`` (its reduce term, or a repaired block's term operand).

    A producer whose running values have a known sign is >= 0 for the proof of Eq. 4 (>= 0 and not > 0:
    a sum starts from 0, which the numerics' surrogates deal with)."""
    facts = tuple(producer_facts(program, consumer, ld, program.block(tensors[ld.tensor.name]), approximate,
                                 signs) for ld in r_loads)
    return solve_repair(consumer.reducer, term, r_loads,  # type: ignore[arg-type]
                        nonnegative=[f.load for f in facts if f.mass or f.load.tensor.name in signs],
                        reduce_vars={iv.var.name for iv in consumer.reduce_iters}, approximate=approximate,
                        auxiliary=True, facts=facts, signs=signs,
                        finite=[t.name for t in program.inputs if t.finite],
                        loops=_bindings(program, consumer), maps=map_definitions(program),
                        ranges=loop_ranges(program, consumer))


def map_definitions(program: Program) -> tuple[MapDefinition, ...]:
    """The temporaries one map block computes elementwise (its store indices its own iterations, each
    once): an analysis may write a read of one out as its definition."""
    writers: dict[str, list[Block]] = {}
    for b in program.blocks():
        writers.setdefault(b.store.tensor.name, []).append(b)
    out = []
    for blocks in writers.values():
        (b, *more) = blocks
        if more or b.reducer is not None or b.store.tensor.role != "temp" or b.where is not None:
            continue
        names = [i.name for i in b.store.indices if isinstance(i, Var)]
        if len(names) != len(b.store.indices) or len(set(names)) != len(names):
            continue
        if {iv.var.name for iv in b.iters} != set(names):
            continue
        out.append(MapDefinition(b.store.tensor, tuple(names), b.store.value))
    return tuple(out)


def loop_ranges(program: Program, block: Block) -> dict[str, int]:
    """The constant extents of the loops around ``block``, by loop variable: what a floor division or a
    remainder of an index in those variables may be folded over (:func:`~polyfuse.transforms.numerics.in_loops`).
    Only the block's own loops: another nest may reuse a name with another extent."""
    return {lp.var.name: int(lp.extent.value) for lp in loops_of(program, block.name) if isinstance(lp.extent, Const)}


def _bindings(program: Program, block: Block) -> tuple[tuple[str, Expr], ...]:
    """Each iteration variable of ``block`` with its binding; a loop of extent 1 is its only value, 0."""
    single = {lp.var.name: Const(0, lp.var.dtype) for lp in loops_of(program, block.name)
              if isinstance(lp.extent, Const) and lp.extent.value == 1}
    return tuple((iv.var.name, substitute(b, single)) for iv, b in zip(block.iters, block.bindings, strict=True))


def producer_facts(program: Program, consumer: Block, load: Load, producer: Block,
                   approximate: bool, signs: Mapping[str, str]) -> ProducerFacts:
    """What the program guarantees about the producer value ``load`` that ``consumer`` reads, at the
    consumer's current element: the producer's reducer, its term for that element (in loop variables,
    :func:`in_loops`), whether it is a mass (a sum or max of terms >= 0 from an init >= 0), and its own
    repair when it is itself rescaled as it runs (found again by the solver, which is deterministic)."""
    try:
        kind: str | None = reducer_kind(producer.reducer)  # type: ignore[arg-type]
    except PolyfuseError:
        kind = None
    found = element_term(program, producer)
    if kind is None or found is None:
        return ProducerFacts(load, kind, None, False)
    block, term, repaired = found
    term = unguarded(term)
    at = _at_consumer(program, consumer, block, term)
    sign = sign_of(at, signs) is not None
    init = producer.init
    init_ok = init is None or init == producer.reducer.identity or (  # type: ignore[union-attr]
        isinstance(init, Const) and float(init.value) >= 0)
    mass = kind in ("sum", "max") and sign and init_ok
    own = None
    if repaired:
        names = {b.store.tensor.name: b.name for b in program.blocks() if b.reducer is not None and b is not producer}
        inner = [ld for ld in loads(term) if ld.tensor.name in names]
        if inner:
            try:
                own = _solve(program, block, term, inner, names, approximate, signs)
            except PolyfuseError:
                own = None
    decaying = own is not None and own.numerics is not None and own.numerics.decays
    reference = kind in ("max", "min") or (kind == "sum" and decaying)
    estimate = kind == "sum" and plain_sum(program, producer.name)
    return ProducerFacts(load, kind, at, bool(mass), own, _bindings(program, block), reference, estimate)


def _at_consumer(program: Program, consumer: Block, block: Block, term: Expr) -> Expr:
    """``block``'s ``term`` in the consumer's loop variables, at an element of the current step.

    The loops the two share stand for themselves.  Each loop of ``block``'s own below them is
    renamed to one of the consumer's of the same extent: the producer's current value has reduced
    its term at every point of the current step, so any choice of those values is a true fact; the
    one chosen makes the most reads of the two terms coincide (the same element).  A loop left
    without a partner keeps a name of its own, a value about which nothing is assumed.
    """
    mine, theirs = loops_of(program, consumer.name), loops_of(program, block.name)
    shared = 0
    while shared < min(len(mine), len(theirs)) and mine[shared] is theirs[shared]:
        shared += 1
    free, targets = theirs[shared:], mine[shared:]
    maps = {m.tensor: m for m in map_definitions(program)}
    ranges = loop_ranges(program, consumer)
    reads = {ld for ld in loads(expand_maps(maps, in_loops(_bindings(program, consumer), consumer.reduce_term(),
                                                            ranges), ranges))}
    best, best_score = None, -1
    for chosen in itertools.permutations(targets + [None] * len(free), len(free)):
        if any(t is not None and t.extent != f.extent for f, t in zip(free, chosen, strict=True)):
            continue
        renaming = {f.var.name: Var(t.var.name if t is not None else f"{f.var.name}__own", f.var.dtype)
                    for f, t in zip(free, chosen, strict=True)}
        candidate = expand_maps(maps, in_loops(
            tuple((n, substitute(b, renaming)) for n, b in _bindings(program, block)), term, ranges), ranges)
        score = sum(ld in reads for ld in loads(candidate))
        if score > best_score:
            best, best_score = candidate, score
    return best  # type: ignore[return-value]


def element_term(program: Program, producer: Block) -> tuple[Block, Expr, bool] | None:
    """The producer's term for one element, the block it is in, and whether the producer is repaired.

    A plain reduction's own term; a repaired update ``X = h(X) ⊕ term`` gives its other operand; a combine
    of partials (``X = h(X) ⊕ X_rf[…, k]`` after rolling over tiles, ``X = X ⊕ h(X_rf[…, k], …)`` after a
    split) the term of the local block ``<producer>_rf`` that reduces them."""
    term = producer.reduce_term()
    repaired = term is None
    if repaired:
        term = _term_operand(producer)
        if term is None:
            return None
    reduce_names = {iv.var.name for iv in producer.reduce_iters}
    partials = {ld.tensor for ld in loads(term) if any(free_vars(i) & reduce_names for i in ld.indices)}
    for other in program.blocks():
        if other.store.tensor in partials and other.name.startswith(f"{producer.name}_rf"):
            inner = other.reduce_term() if other.reducer is not None else other.store.value
            # a split-k combine that repairs each partial (X = X ⊕ h(X_rf[…], …)) rescales it too
            rescaled = repaired or not isinstance(unguarded(term), Load)
            return (other, inner, rescaled) if inner is not None else None
    return producer, term, repaired


def unguarded(term: Expr) -> Expr:
    """A fused term without what an earlier fusion wrapped around it: the guard of a producer at its
    infinite identity (:func:`guard_term`) and the surrogates of masses at 0 (:func:`surrogate`).
    Both are exact, so the term is the producer's own term for an element."""
    def tests(cond: Expr, value: float) -> bool:
        parts = [cond]
        while parts:
            c = parts.pop()
            if isinstance(c, BinOp) and c.op in ("and", "or"):
                parts += [c.a, c.b]
            elif isinstance(c, BinOp) and c.op == "==" and isinstance(c.b, Const) and c.b.value == value:
                return True
        return False

    def strip(e: Expr) -> Expr | None:
        if not isinstance(e, Select) or not isinstance(e.true_value, Const):
            return None
        v = e.true_value.value
        if isinstance(e.false_value, Load) and e.false_value.dtype.is_float \
                and v == float(np.finfo(e.false_value.dtype.numpy).tiny) and tests(e.cond, 0.0):
            return e.false_value
        infinite = tests(e.cond, math.inf) or tests(e.cond, -math.inf)
        if isinstance(v, float) and (v == 0.0 or math.isinf(v)) and infinite:
            return unguarded(e.false_value)
        return None

    return map_expr(term, strip)


def guarded_rows(program: Program, block: str, loads_: Sequence[Load], tensors: Mapping[str, str]) -> set[Load]:
    """The producer values among ``loads_`` (the producers' blocks by tensor in ``tensors``) at whose infinite
    identity ``block``'s term is its identity as a whole: an earlier fusion guarded it (``select(r == -inf, 0,
    …)``, :func:`guard_term`: the local term of a split whose producer holds only masked elements).  In the
    program being transformed, a row whose elements all leave such a producer at its identity is then the
    identity, not ``exp(-inf - -inf)``: the repair keeps its accumulator there instead of computing that NaN
    (``final_identity``)."""
    consumer = program.block(block)
    term, identity = consumer.reduce_term(), consumer.reducer.identity.value  # type: ignore[union-attr]
    producers = {ld: program.block(tensors[ld.tensor.name]) for ld in loads_}
    found: set[Load] = set()
    while isinstance(term, Select) and isinstance(term.true_value, Const) and term.true_value.value == identity:
        conds, tested = [term.cond], set()
        while conds:
            c = conds.pop()
            if isinstance(c, BinOp) and c.op == "or":
                conds += [c.a, c.b]
            elif isinstance(c, BinOp) and c.op == "==" and isinstance(c.a, Load) and isinstance(c.b, Const):
                tested.add((c.a, c.b.value))
        found |= {ld for ld in loads_ if infinite_identity(producers[ld])
                  and (ld, producers[ld].reducer.identity.value) in tested}  # type: ignore[union-attr]
        term = term.false_value
    return found


def _term_operand(block: Block) -> Expr | None:
    """Of ``X = A ⊕ B``, the operand that does not read X (None if not exactly one)."""
    value, acc = block.store.value, Load(block.store.tensor, block.store.indices)
    if block.reducer is None or not isinstance(value, BinOp) or value.op != getattr(block.reducer.combine, "op", ""):
        return None
    reads = [acc in loads(x) for x in (value.a, value.b)]
    if reads == [True, False]:
        return value.b
    if reads == [False, True]:
        return value.a
    return None


def infinite_identity(block: Block) -> bool:
    """True for a reduction whose identity is ±inf (a max or min): its partial may be the identity."""
    ident = block.reducer.identity if block.reducer else None
    return isinstance(ident, Const) and isinstance(ident.value, float) and math.isinf(ident.value)


def guard_term(program: Program, local: str, guards: list[tuple[Load, Block]]) -> Program:
    """In ``local``'s term, a producer value still at its infinite identity makes the term the identity.

    ``guards`` pairs each producer value as ``local`` reads it with the producer block
    whose reducer says what its identity is; the caller passes only those the repair's
    numerics proved exact (:class:`~polyfuse.transforms.numerics.Numerics` ``guards``): a max/min
    producer at ±inf has seen only ±inf elements, and the unfused program's term for such an
    element is the consumer's identity (``exp(-inf - m) = 0``), whereas the fused one would compute
    ``exp(-inf - -inf)``.  A state repair's auxiliary is guarded alike even where its term does not
    read the producer (a count Σ 1): every component of the state then holds the same elements.
    Where the producer is still at its identity after the last element, the plain program's value
    is NaN (``exp(-inf - -inf)``): the repair makes it so (``final_identity`` of
    :func:`repaired_update`).
    """
    b = program.block(local)
    names = {iv.var.name for iv in b.iters}
    conds = []
    for ld, producer in guards:
        if not infinite_identity(producer):
            continue
        stray = set().union(*(free_vars(i) for i in ld.indices)) - names
        if stray:
            raise InternalError(f"block {local!r} has no iteration {', '.join(sorted(stray))} to read producer "
                                f"value {ld} it should guard")
        conds.append(eq(ld, producer.reducer.identity))  # type: ignore[union-attr]
    if not conds:
        return program
    acc = Load(b.store.tensor, b.store.indices)
    term = b.reduce_term()
    guarded = select(functools.reduce(logical_or, conds), b.reducer.identity, term)  # type: ignore[union-attr]
    new = b.replace(store=Store(b.store.tensor, b.store.indices, b.reducer.apply(acc, guarded)))  # type: ignore[union-attr]
    return replace_block(program, new)


def surrogate(value: Expr, keep: Expr | None = None) -> Expr:
    """``value``, or the smallest normal number of its dtype while it is 0 (and ``keep`` is false).

    A mass producer (a sum or max of terms >= 0) is 0 only while every term it has seen is 0; the
    consumer's terms so far are then ``0·(data)`` whatever value stands for the producer, and the
    repair is exact for any value (Eq. 3 holds for every r).  The smallest normal number keeps
    ``0/0`` out, stays below every later nonzero normal value (so ``Q = r/r'`` still decays) and
    survives flushing subnormals to zero.  ``keep`` (the last step of a rolling loop) uses the real
    value, so a row that stays 0 gives what the plain program gives.
    """
    tiny = const(float(np.finfo(value.dtype.numpy).tiny), value.dtype)
    zero = eq(value, const(0.0, value.dtype))
    return select(zero if keep is None else logical_and(zero, logical_not(keep)), tiny, value)


def with_surrogates(block: Block, values: Mapping[Load, Expr]) -> Block:
    """``block`` with each producer value of ``values`` in its stored value replaced by its surrogate
    expression."""
    if not values:
        return block
    value = map_expr(block.store.value, lambda n: values.get(n) if isinstance(n, Load) else None)
    return block.replace(store=Store(block.store.tensor, block.store.indices, value))


def replace_block(program: Program, new: Block) -> Program:
    """``program`` with the block of ``new``'s name replaced by ``new``."""
    return program.replace(body=map_blocks(program.body, lambda x: new if x.name == new.name else x))


def repaired_update(block: Block, repair: Repair, acc_operand: str, old: dict[Load, Expr],
                    new: dict[Load, Expr], state: Sequence[Expr] = (),
                    producers: Mapping[Load, Block] | None = None, first: Expr | None = None,
                    final_identity: Mapping[Load, Expr] | None = None, final: Expr | None = None) -> Block:
    """``block`` with its update repaired; ``acc_operand`` says which operand h applies to.

    ``"acc"`` (rolling update, Eq. 7): ``X = G(h(X, r_old, r_new)) ⊕ rest``;
    ``"term"`` (split-k update, Eq. 11): ``X = X ⊕ G(h(rest, r_old, r_new))``.
    ``G`` keeps its argument when it is the reducer's identity (h of the identity is
    the identity, by distributivity, but IEEE's ``0·inf`` is NaN).  It is left out where the
    numerics proved ``h = t·Q`` with Q in [0, 1], finite where the previous producer values are their
    identities (``t·exp(r - r')`` of a max producer): h then maps the identity to itself, at the first
    step of a rolling loop (the saved values are the identities) and after masked elements alike.
    ``repair.apply`` keeps the argument when no producer changed (``h(t, r, r) = t``), and at the
    ``first`` step of a rolling loop where Q is not finite at every producer's identity (the saved
    values then); ``final_identity`` and ``final`` as in :meth:`~polyfuse.transforms.repair.Repair.apply`.

    A state repair reads the auxiliary accumulators ``state`` (for X, its A's; for A_k,
    the higher ones) and has no ``G``: X = 0 with A ≠ 0 still changes.  Instead, it keeps
    its argument while an old producer value is still at its infinite identity
    (``producers`` maps each value to its block): every term so far was guarded to the
    identity (:func:`guard_term`), so the state is empty, and h would compute ``0·inf``.
    And in a combine, a partial that rfactor marks missing (``rest = select(exists,
    X_rf[…], identity)``, its producer values never written) is kept out around h:
    ``select(exists, h(X_rf[…], …), identity)``.
    """
    acc = Load(block.store.tensor, block.store.indices)
    rest = block.reduce_term()
    if rest is None:
        raise InternalError(f"block {block.name!r} is not in the form X = X ⊕ term")
    identity = block.reducer.identity  # type: ignore[union-attr]
    target = acc if acc_operand == "acc" else rest
    exists = None
    if repair.state and acc_operand == "term" and isinstance(rest, Select) and rest.false_value == identity:
        exists, target = rest.cond, rest.true_value
        state = [s.true_value if isinstance(s, Select) and s.cond == exists else s for s in state]
    numerics = repair.numerics
    keep = first if first is not None and numerics is not None and not numerics.first_safe else None
    h = repair.apply(target, old=old, new=new, state=state, keep=keep, final_identity=final_identity, final=final)
    if numerics is not None and numerics.decays and numerics.identity_safe:
        repaired = h
    elif repair.keeps_identity:
        repaired = select(eq(target, identity), target, h)
    else:
        unseen = [eq(old[ld], p.reducer.identity) for ld, p in (producers or {}).items()  # type: ignore[union-attr]
                  if ld in old and infinite_identity(p)]
        repaired = select(functools.reduce(logical_or, unseen), target, h) if unseen else h
    if exists is not None:
        repaired = select(exists, repaired, identity)
    value = block.reducer.apply(repaired, rest) if acc_operand == "acc" else block.reducer.apply(acc, repaired)  # type: ignore[union-attr]
    return block.replace(store=Store(block.store.tensor, block.store.indices, value))
