"""Pieces shared by the two reduction fusions (rolling update, split-k update)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polyfuse.deps.dependence import Dependence
from polyfuse.errors import IllegalTransform, InternalError
from polyfuse.ir.expr import Const, Expr, Load, Select, eq, logical_or, select
from polyfuse.ir.stmt import Block, Program, Store
from polyfuse.ir.visit import free_vars, loads
from polyfuse.transforms.repair import Repair, result_sign, solve_repair
from polyfuse.transforms.tree import map_blocks


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
              what: str) -> tuple[list[Load], dict[str, str], Repair | None]:
    """The producer loads in ``block``'s term, producer tensor -> block, and the proven repair (None if no load)."""
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
    signs = {ld: result_sign(program.block(tensors[ld.tensor.name])) for ld in r_loads}
    repair = solve_repair(consumer.reducer, term, r_loads,  # type: ignore[arg-type]
                          nonnegative=[ld for ld, s in signs.items() if s == "nonnegative"],
                          positive=[ld for ld, s in signs.items() if s == "positive"],
                          reduce_vars=reduce_names, approximate=approximate, auxiliary=True)
    return r_loads, tensors, repair


def infinite_identity(block: Block) -> bool:
    """True for a reduction whose identity is ±inf (a max or min): its partial may be the identity."""
    ident = block.reducer.identity if block.reducer else None
    return isinstance(ident, Const) and isinstance(ident.value, float) and math.isinf(ident.value)


def guard_term(program: Program, local: str, guards: list[tuple[Load, Block]]) -> Program:
    """In ``local``'s term, a producer value still at its infinite identity makes the term the identity.

    ``guards`` pairs each producer value as ``local`` reads it with the producer block
    whose reducer says what its identity is.  A max/min producer at ±inf has seen
    only masked (±inf) elements; the unfused program's term for such an element is
    the consumer's identity, whereas the fused one would compute ``exp(-inf - -inf)``.
    A state repair's auxiliary is guarded alike even where its term does not read the
    producer (a count Σ 1): every component of the state then holds the same elements.
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


def replace_block(program: Program, new: Block) -> Program:
    """``program`` with the block of ``new``'s name replaced by ``new``."""
    return program.replace(body=map_blocks(program.body, lambda x: new if x.name == new.name else x))


def repaired_update(block: Block, repair: Repair, acc_operand: str, old: dict[Load, Expr],
                    new: dict[Load, Expr], state: Sequence[Expr] = (),
                    producers: Mapping[Load, Block] | None = None) -> Block:
    """``block`` with its update repaired; ``acc_operand`` says which operand h applies to.

    ``"acc"`` (rolling update, Eq. 7): ``X = G(h(X, r_old, r_new)) ⊕ rest``;
    ``"term"`` (split-k update, Eq. 11): ``X = X ⊕ G(h(rest, r_old, r_new))``.
    ``G`` keeps its argument when it is the reducer's identity (h of the identity is
    the identity, by distributivity, but IEEE's ``0·inf`` is NaN); it is left out where
    h provably maps 0 to 0 (``Repair.decays``: ``t·exp(r - r')`` of a max producer).
    ``repair.apply`` keeps the argument when no producer changed (``h(t, r, r) = t``).

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
    h = repair.apply(target, old=old, new=new, state=state)
    if repair.decays({ld: p.reducer.name for ld, p in (producers or {}).items() if p.reducer is not None}):
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
