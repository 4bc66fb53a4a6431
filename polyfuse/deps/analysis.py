"""Dependence analysis of a program: flow, anti and output dependences.

All three are *direct* (:mod:`polyfuse.deps.direct` computes them from
``isl.UnionAccessInfo.compute_flow`` on tagged accesses):

- flow: value-based, each read from its last writer (exact last-writer relation);
- output: each write from the previous write of the same element;
- anti: each read to the next write of the same element.

Direct dependences are enough for legality: every memory-based dependence is a
chain of direct ones, so a schedule that keeps the direct ones keeps them all.
Pairs of an instance with itself are dropped (reads precede the write inside an
instance under every schedule).  See :mod:`polyfuse.deps.dependence` for the
``temporal`` and ``self_reduction`` flags.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import islpy as isl

from polyfuse.deps.access import ACCUMULATOR, STORE, Access, accesses
from polyfuse.deps.dependence import ANTI, FLOW, KINDS, OUTPUT, Dependence
from polyfuse.deps.direct import direct_maps
from polyfuse.deps.domains import domains as iteration_domains
from polyfuse.deps.domains import param_names
from polyfuse.deps.memo import memoized
from polyfuse.deps.schedule import instance_schedule, orderings
from polyfuse.errors import InternalError, PolyfuseError
from polyfuse.ir.stmt import Block, Program
from polyfuse.ir.visit import loads


@dataclass(frozen=True, eq=False)
class Dependences:
    """Everything the analysis found about one program.

    ``domains``/``schedule`` are read-only, by block name (``{ B[iters] }``,
    ``{ B[iters] -> [time] }``), ``accesses`` the tagged references, ``all`` every
    dependence in a stable order (flow, anti, output; then program order of the
    source and sink references).  A flow dependence from a reduction to another
    block can come in two parts with the same references: the pairs whose source
    is the reduction's final update (``temporal``) and the others (a reader that
    deliberately sees partial values, as in an already fused program).
    """

    program: str
    params: tuple[str, ...]
    domains: Mapping[str, isl.Set]
    accesses: tuple[Access, ...]
    schedule: Mapping[str, isl.Map]
    all: tuple[Dependence, ...]

    @property
    def flow(self) -> list[Dependence]:
        return [d for d in self.all if d.kind == FLOW]

    @property
    def anti(self) -> list[Dependence]:
        return [d for d in self.all if d.kind == ANTI]

    @property
    def output(self) -> list[Dependence]:
        return [d for d in self.all if d.kind == OUTPUT]

    @property
    def temporal(self) -> list[Dependence]:
        """Flow dependences on a reduction's final value (what naive fusion may break)."""
        return [d for d in self.all if d.temporal]

    @property
    def self_reductions(self) -> list[Dependence]:
        return [d for d in self.all if d.self_reduction]

    @property
    def inter_block(self) -> list[Dependence]:
        return [d for d in self.all if d.source != d.sink]

    def between(self, source: str, sink: str, kind: str | None = None) -> list[Dependence]:
        """Dependences from block ``source`` to block ``sink`` (of one ``kind`` if given)."""
        for name in (source, sink):
            if name not in self.domains:
                blocks = ", ".join(self.domains)
                raise PolyfuseError(f"program {self.program!r} has no block {name!r}; blocks: {blocks}")
        if kind is not None and kind not in KINDS:
            raise PolyfuseError(f"dependence kind {kind!r} is not one of {', '.join(KINDS)}")
        return [d for d in self.all if d.source == source and d.sink == sink and (kind is None or d.kind == kind)]

    def access(self, tag: str) -> Access:
        """The access with reference tag ``tag`` (e.g. ``s_exp__r1``)."""
        for a in self.accesses:
            if a.tag == tag:
                return a
        raise PolyfuseError(f"program {self.program!r} has no access tagged {tag!r}")

    def __iter__(self) -> Iterator[Dependence]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def __str__(self) -> str:
        return "\n".join(str(d) for d in self.all) or f"program {self.program!r} has no dependences"


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out


def _tag_of(space: isl.Space) -> str:
    return space.unwrap().get_tuple_name(isl.dim_type.out)


@memoized(1024)
def _final_updates(write: isl.Map, schedule: isl.Map) -> isl.Set:
    """Instances of a reduction (``write``: its store's relation) whose write of an element is the
    last one by that block under its own ``schedule`` (cached: a reduction outlives many steps)."""
    same_element = write.apply_range(write.reverse())
    later = schedule.lex_lt_map(schedule)
    overwritten = same_element.intersect(later).domain()
    return write.domain().subtract(overwritten)


class _Classifier:
    """Turns ISL's tagged dependence maps into flagged :class:`Dependence` objects."""

    def __init__(self, program: Program, by_tag: dict[str, Access],
                 order: Callable[[Collection[str]], dict[str, isl.Map]]):
        self.blocks = {b.name: b for b in program.blocks()}
        self.by_tag = by_tag
        self.order = order
        self._final: dict[str, isl.Set] = {}

    def final(self, block: Block) -> isl.Set:
        if block.name not in self._final:
            (own,) = self.order({block.name}).values()
            self._final[block.name] = _final_updates(self.by_tag[f"{block.name}__w"].relation, own)
        return self._final[block.name]

    def classify(self, kind: str, tagged: isl.Map) -> list[Dependence]:
        src = self.by_tag[_tag_of(tagged.get_space().domain())]
        dst = self.by_tag[_tag_of(tagged.get_space().range())]
        rel = tagged.domain_factor_domain().range_factor_domain()
        if src.block == dst.block:
            rel = rel.subtract(isl.Map.identity(rel.get_space()))
        if rel.is_empty():
            return []
        if src.tensor != dst.tensor:
            raise InternalError(f"dependence {src.tag} -> {dst.tag} relates tensors {src.tensor} and {dst.tensor}")

        def dep(r: isl.Map, **flags: bool) -> Dependence:
            return Dependence(kind, src.block, dst.block, src.tensor, src.tag, dst.tag, r, **flags)

        block = self.blocks[src.block]
        if not block.is_reduction or src.role != STORE:
            return [dep(rel)]
        if src.block == dst.block:
            own = dst.role in (STORE, ACCUMULATOR)
            return [dep(rel, self_reduction=own)]
        if kind != FLOW:
            return [dep(rel)]
        final = rel.intersect_domain(self.final(block))
        rest = rel.subtract(final)
        return [d for d in (dep(final, temporal=True), dep(rest)) if not d.relation.is_empty()]


def analyze(program: Program, *, tensors: Collection[str] | None = None,
            kinds: Collection[str] = (FLOW, ANTI, OUTPUT)) -> Dependences:
    """Domains, tagged accesses, schedule and all direct dependences of ``program``.

    ``tensors`` restricts the analysis to accesses of those tensors (dependences
    only ever relate accesses of one tensor, so this is exact for them); a step
    that moves one block can only break dependences on what that block touches.
    ``kinds`` selects the kinds computed (flow alone is cheaper).
    Cached per program (programs are immutable and hash structurally).
    """
    return _analyze(program, None if tensors is None else frozenset(tensors), frozenset(kinds))


def tensors_of(*blocks: Block) -> frozenset[str]:
    """The tensors ``blocks`` read or write (for a restricted :func:`analyze`)."""
    out: set[str] = set()
    for b in blocks:
        out.add(b.store.tensor.name)
        for e in (b.store.value, b.init):
            if e is not None:
                out |= {ld.tensor.name for ld in loads(e)}
    return frozenset(out)


@memoized(64)
def _analyze(program: Program, tensors: frozenset[str] | None, kinds: frozenset[str]) -> Dependences:
    doms = iteration_domains(program)
    accs = accesses(program, doms)
    if tensors is not None:
        accs = tuple(a for a in accs if a.tensor in tensors)
    found = _dependences(program, doms, accs, kinds)
    return Dependences(program.name, param_names(program), MappingProxyType(doms), accs,
                       MappingProxyType(instance_schedule(program, doms)), found)


def _dependences(program: Program, doms: Mapping[str, isl.Set], accs: tuple[Access, ...],
                 kinds: frozenset[str]) -> tuple[Dependence, ...]:
    # ISL's cost grows with the time coordinates: only those that order the analysed blocks.
    order = orderings(program, doms)
    maps = direct_maps(accs, order({a.block for a in accs}), flow_only=not kinds & {ANTI, OUTPUT})
    classifier = _Classifier(program, {a.tag: a for a in accs}, order)
    position = {a.tag: k for k, a in enumerate(accs)}
    found: list[Dependence] = []
    for kind, umap in ((FLOW, maps.flow), (ANTI, maps.anti), (OUTPUT, maps.output)):
        if kind not in kinds:
            continue
        deps = [t for m in _maps(umap) for d in classifier.classify(kind, m) for t in _with_twins(kind, d, maps.twins)]
        deps.sort(key=lambda d: (position[d.source_ref], position[d.sink_ref], not d.temporal))
        found.extend(deps)
    return tuple(found)


def _with_twins(kind: str, dep: Dependence, twins: Mapping[str, tuple[Access, ...]]) -> Iterator[Dependence]:
    """``dep`` and its copies for the reads that repeat its read (flow: the sink; anti: the source)."""
    yield dep
    if kind == FLOW:
        yield from (replace(dep, sink_ref=t.tag) for t in twins.get(dep.sink_ref, ()))
    elif kind == ANTI:
        yield from (replace(dep, source_ref=t.tag) for t in twins.get(dep.source_ref, ()))


__all__ = ["Dependences", "analyze"]
