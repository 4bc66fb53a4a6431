"""Direct dependences between tagged accesses, with as few ISL dataflow problems as possible.

ISL's ``compute_flow`` solves one parametric last-writer problem per sink
reference and per time coordinate, and it dominates every analysis, so this
module asks it only what cannot be had more cheaply, and exactly:

- output (``W -> W'``: the write of the same element just before ``W'``) and the
  flow into reads of other elements than the reading instance writes come from
  ``compute_flow`` (writes as must-sources); a tensor's only write, when no two of
  its instances write one element, has no output dependences and is left out;
- a read of the element its own instance writes (a reduction's accumulator, an
  in-place update) has the last writer of that write: within an instance the
  reads come first and nothing runs between them and the write, so its flow is
  the output dependence into its instance's write;
- anti (``R -> W``: the next write of the element after the read) follows from
  the other two: the writes of one element are totally ordered (an instance
  writes once), so the next write after ``R`` is the next write after ``R``'s last
  writer (output, read backwards), or, for a read before any write, the first
  write of its element.  A write of the reading instance itself counts as next
  (reads precede the write in an instance); such pairs are dropped later with
  every pair of an instance with itself.

A read repeated in one block (``row_max[b, h, i]`` loaded twice in one update)
has the dependences of its first occurrence: reads are only ever sinks, never
sources or kills, so only one of them is analysed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import islpy as isl

from polyfuse.deps.access import Access, tagged_union


@dataclass(frozen=True)
class DirectMaps:
    """Tagged dependence maps ``{ [B[i] -> ref[]] -> [B'[i'] -> ref'[]] }`` over the distinct reads.

    ``twins`` maps the tag of an analysed read to the reads that repeat it.
    """

    flow: isl.UnionMap
    anti: isl.UnionMap
    output: isl.UnionMap
    twins: Mapping[str, tuple[Access, ...]]


def direct_maps(accesses: Sequence[Access], time: Mapping[str, isl.Map], *, flow_only: bool = False) -> DirectMaps:
    """Flow, anti and output dependences among ``accesses`` under the instance schedule ``time``.

    ``time`` may be any schedule that orders the accesses' blocks as the program does
    (:func:`~polyfuse.deps.schedule.ordering_schedule`).  With ``flow_only`` the anti
    and output maps are left empty, and the flow into every read comes from ISL
    (cheaper than computing the output dependences to derive some of it).
    """
    reads, twins = _distinct_reads(accesses)
    writes = [a for a in accesses if not a.is_read]
    read_map, write_map = tagged_union(reads), tagged_union(writes)
    schedule = _tagged_schedule([*reads, *writes], time)
    if flow_only:
        empty = isl.UnionMap.empty(write_map.get_space())
        return DirectMaps(_last_writes(read_map, write_map, schedule), empty, empty, twins)

    rewritten = tagged_union(_rewrites(writes))
    output = _last_writes(rewritten, rewritten, schedule)
    own, others = _split_own_element_reads(reads, writes)
    flow = _last_writes(tagged_union(others), write_map, schedule).union(output.apply_range(own))

    first_writes = write_map.intersect_domain(write_map.domain().subtract(output.range()))
    unwritten_reads = read_map.intersect_domain(read_map.domain().subtract(flow.range()))
    anti = flow.reverse().apply_range(output).union(unwritten_reads.apply_range(first_writes.reverse()))
    return DirectMaps(flow, anti, output, twins)


def _last_writes(sinks: isl.UnionMap, writes: isl.UnionMap, schedule: isl.UnionMap) -> isl.UnionMap:
    """``{ write -> sink }``: each sink instance from the last write of its element before it."""
    return (isl.UnionAccessInfo.from_sink(sinks).set_must_source(writes).set_schedule_map(schedule)
            .compute_flow().get_must_dependence())


def _rewrites(writes: Sequence[Access]) -> list[Access]:
    """The writes that can overwrite an element: all but a tensor's only write when it is injective."""
    count: dict[str, int] = {}
    for w in writes:
        count[w.tensor] = count.get(w.tensor, 0) + 1
    return [w for w in writes if count[w.tensor] > 1 or not w.relation.is_injective()]


def _tagged_schedule(items: Sequence[Access], time: Mapping[str, isl.Map]) -> isl.UnionMap:
    """``{ [B[i] -> ref[]] -> [time] }``: every tagged instance at its block instance's time.

    The reads and the write of one instance share a time; flow and output never
    relate an instance to itself, so they need no order within it.
    """
    out = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    for a in items:
        out = out.union(isl.UnionMap.from_map(a.untag.apply_range(time[a.block])))
    return out


def _split_own_element_reads(reads: Sequence[Access],
                             writes: Sequence[Access]) -> tuple[isl.UnionMap, list[Access]]:
    """``{ [B[i] -> write[]] -> [B[i] -> read[]] }`` for the reads of the element their instance
    writes, and the other reads."""
    write_of = {w.block: w for w in writes}
    own = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    others: list[Access] = []
    for r in reads:
        w = write_of.get(r.block)
        if w is not None and w.tensor == r.tensor and r.relation.is_subset(w.relation):
            own = own.union(isl.UnionMap.from_map(w.untag.apply_range(r.untag.reverse())))
        else:
            others.append(r)
    return own, others


def _distinct_reads(accesses: Sequence[Access]) -> tuple[list[Access], dict[str, tuple[Access, ...]]]:
    """The reads to analyse, and for each the later reads that repeat it (same block, role and relation)."""
    distinct: list[Access] = []
    twins: dict[str, tuple[Access, ...]] = {}
    for a in accesses:
        if not a.is_read:
            continue
        first = next((d for d in distinct if (d.block, d.role, d.text) == (a.block, a.role, a.text)
                      and d.relation.is_equal(a.relation)), None)
        if first is None:
            distinct.append(a)
        else:
            twins[first.tag] = twins.get(first.tag, ()) + (a,)
    return distinct, twins


__all__ = ["DirectMaps", "direct_maps"]
