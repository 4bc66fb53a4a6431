"""Dependence analysis of a program: flow, anti and output dependences.

All three come from ``isl.UnionAccessInfo.compute_flow`` on tagged accesses, so
each dependence is *direct*:

- flow: value-based, each read from its last writer (exact last-writer relation);
- output: each write from the previous write of the same element;
- anti: each read to the next write of the same element (ISL's may-dependences
  of writes on reads, killed by intervening writes).

Direct dependences are enough for legality: every memory-based dependence is a
chain of direct ones, so a schedule that keeps the direct ones keeps them all.
Pairs of an instance with itself are dropped (reads precede the write inside an
instance under every schedule).  See :mod:`polyfuse.deps.dependence` for the
``temporal`` and ``self_reduction`` flags.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import islpy as isl

from polyfuse.deps.access import ACCUMULATOR, STORE, Access, accesses, tagged_union
from polyfuse.deps.dependence import ANTI, FLOW, KINDS, OUTPUT, Dependence
from polyfuse.deps.domains import domains as iteration_domains
from polyfuse.deps.domains import param_names
from polyfuse.deps.schedule import instance_schedule
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


def _tagged_schedule(items: tuple[Access, ...], schedule: Mapping[str, isl.Map]) -> isl.UnionMap:
    """Schedule of tagged instances: the block's time plus one trailing dimension (reads 0, writes 1)."""
    out = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    for a in items:
        order = isl.Set("{ [0] }" if a.is_read else "{ [1] }")
        timed = schedule[a.block].flat_range_product(isl.Map.from_domain_and_range(a.relation.domain(), order))
        out = out.union(isl.UnionMap.from_map(a.untag.apply_range(timed)))
    return out


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out


def _tag_of(space: isl.Space) -> str:
    return space.unwrap().get_tuple_name(isl.dim_type.out)


def _final_updates(write: Access, schedule: isl.Map) -> isl.Set:
    """Instances of a reduction whose write of an element is the last one by that block."""
    same_element = write.relation.apply_range(write.relation.reverse())
    later = schedule.lex_lt_map(schedule)
    overwritten = same_element.intersect(later).domain()
    return write.relation.domain().subtract(overwritten)


class _Classifier:
    """Turns ISL's tagged dependence maps into flagged :class:`Dependence` objects."""

    def __init__(self, program: Program, by_tag: dict[str, Access], schedule: Mapping[str, isl.Map]):
        self.blocks = {b.name: b for b in program.blocks()}
        self.by_tag = by_tag
        self.schedule = schedule
        self._final: dict[str, isl.Set] = {}

    def final(self, block: Block) -> isl.Set:
        if block.name not in self._final:
            self._final[block.name] = _final_updates(self.by_tag[f"{block.name}__w"], self.schedule[block.name])
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
    ``kinds`` skips the anti/output computations when only flow is needed.
    Cached per program (programs are immutable and hash structurally).
    """
    return _analyze(program, None if tensors is None else frozenset(tensors), frozenset(kinds))


def _reversed_time(schedule: isl.UnionMap) -> isl.UnionMap:
    """``schedule`` with every time coordinate negated (lexicographic order reversed)."""
    maps: list[isl.Map] = []
    schedule.foreach_map(maps.append)
    if not maps:
        return schedule
    width = maps[0].dim(isl.dim_type.out)
    names = ", ".join(f"t{k}" for k in range(width))
    negated = ", ".join(f"-t{k}" for k in range(width))
    return schedule.apply_range(isl.UnionMap(f"{{ [{names}] -> [{negated}] }}"))


def tensors_of(*blocks: Block) -> frozenset[str]:
    """The tensors ``blocks`` read or write (for a restricted :func:`analyze`)."""
    out: set[str] = set()
    for b in blocks:
        out.add(b.store.tensor.name)
        for e in (b.store.value, b.init):
            if e is not None:
                out |= {ld.tensor.name for ld in loads(e)}
    return frozenset(out)


@functools.lru_cache(maxsize=64)
def _analyze(program: Program, tensors: frozenset[str] | None, kinds: frozenset[str]) -> Dependences:
    doms = iteration_domains(program)
    accs = accesses(program, doms)
    if tensors is not None:
        accs = tuple(a for a in accs if a.tensor in tensors)
    sched = instance_schedule(program, doms)
    reads = [a for a in accs if a.is_read]
    writes = [a for a in accs if not a.is_read]
    tsched = _tagged_schedule(accs, sched)
    read_map, write_map = tagged_union(reads), tagged_union(writes)

    empty = isl.UnionMap.empty(read_map.get_space())
    flow = (isl.UnionAccessInfo.from_sink(read_map).set_must_source(write_map)
            .set_schedule_map(tsched).compute_flow().get_must_dependence()) if FLOW in kinds else empty
    output_map = (isl.UnionAccessInfo.from_sink(write_map).set_must_source(write_map)
                  .set_schedule_map(tsched).compute_flow().get_must_dependence()) if OUTPUT in kinds else empty
    # Each read paired with the next write to its element: the last write before the read in
    # reversed time (every time coordinate negated).  A must-source flow there is much cheaper
    # than ISL's may-source form (reads as may-sources of writes) and gives the same relation.
    anti_map = (isl.UnionAccessInfo.from_sink(read_map).set_must_source(write_map)
                .set_schedule_map(_reversed_time(tsched)).compute_flow().get_must_dependence().reverse()
                ) if ANTI in kinds else empty

    by_tag = {a.tag: a for a in accs}
    classifier = _Classifier(program, by_tag, sched)
    order = {a.tag: k for k, a in enumerate(accs)}
    found: list[Dependence] = []
    for kind, umap in ((FLOW, flow), (ANTI, anti_map), (OUTPUT, output_map)):
        deps = [d for m in _maps(umap) for d in classifier.classify(kind, m)]
        deps.sort(key=lambda d: (order[d.source_ref], order[d.sink_ref], not d.temporal))
        found.extend(deps)
    return Dependences(program.name, param_names(program), MappingProxyType(doms), accs, MappingProxyType(sched),
                       tuple(found))


__all__ = ["Dependences", "analyze"]
