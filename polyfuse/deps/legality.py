"""Legality of a new schedule: which dependences it violates.

A transformed program keeps its blocks and their iteration domains (instances
are stable; only loops and bindings change), so the dependences of the original
program can be pushed through the new program's schedule: a pair ``a -> b`` is
violated when ``b`` does not run strictly after ``a``.

Naive fusion (Neptune, App. B of the earlier version) "no longer validates
temporal (tag) data dependency; memory-location checks still in effect": it may
violate temporal dependences, never any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import islpy as isl

from polyfuse.deps.analysis import Dependences
from polyfuse.deps.dependence import Dependence
from polyfuse.deps.domains import domains as iteration_domains
from polyfuse.deps.schedule import instance_schedule, orderings
from polyfuse.errors import IllegalTransform, IRError
from polyfuse.ir.stmt import Program

Schedule = Mapping[str, isl.Map]


def _schedule_of(dependences: Dependences, new: Program | Schedule) -> Schedule:
    """The new program's instance schedule, after checking it has the same instances."""
    if not isinstance(new, Program):
        return new
    doms = iteration_domains(new)
    for name, dom in dependences.domains.items():
        if name not in doms:
            raise IllegalTransform(
                f"program {new.name!r} has no block {name!r} (blocks: {', '.join(doms) or 'none'}); "
                f"the dependences of {dependences.program!r} cannot be checked against it"
            )
        if not doms[name].is_equal(dom):
            raise IllegalTransform(
                f"block {name!r} changed its iteration domain from {dom} to {doms[name]}; "
                "a schedule change must keep every block's instances"
            )
    try:
        return instance_schedule(new, doms)
    except IRError as err:
        raise IllegalTransform(f"program {new.name!r}: {err}") from err


def violation(dep: Dependence, schedule: Schedule) -> Dependence | None:
    """``dep`` restricted to the pairs that ``schedule`` does not order source-first, or None."""
    for name in (dep.source, dep.sink):
        if name not in schedule:
            raise IllegalTransform(f"the new schedule has no block {name!r}, needed to check {dep.label}")
    bad = dep.relation.intersect(schedule[dep.source].lex_ge_map(schedule[dep.sink]))
    if bad.is_empty():
        return None
    return replace(dep, relation=bad, witness=bad.wrap().lexmin().unwrap())


def violated(dependences: Dependences, new: Program | Schedule) -> list[Dependence]:
    """The dependences that ``new`` (a program with the same blocks, or its instance schedule) violates.

    Each returned dependence is restricted to its violating pairs and carries a
    witness (their lexicographic minimum).  Blocks that only ``new`` has are not
    checked: they have no dependences here (analyse the new program for those).
    """
    schedule = _schedule_of(dependences, new)
    if not isinstance(new, Program):
        return [v for d in dependences.all if (v := violation(d, schedule)) is not None]
    # Each pair of blocks is compared on the time coordinates that order the two (same order, fewer
    # coordinates for ISL's lexicographic comparison).
    order = orderings(new, iteration_domains(new))
    pairs: dict[tuple[str, str], Schedule] = {}
    found = []
    for d in dependences.all:
        key = (d.source, d.sink)
        if key not in pairs:
            pairs[key] = order(key)
        if (v := violation(d, pairs[key])) is not None:
            found.append(v)
    return found


def _report(violations: list[Dependence]) -> str:
    return "\n".join(f"  {v}".replace("\n", "\n  ") for v in violations)


def require_legal(dependences: Dependences, new: Program | Schedule, *, what: str) -> None:
    """Raise IllegalTransform naming every violated dependence of ``what`` (a transform's description)."""
    bad = violated(dependences, new)
    if bad:
        raise IllegalTransform(f"{what} violates {len(bad)} dependence(s) of {dependences.program!r}:\n{_report(bad)}")


def check_naive_fusion(dependences: Dependences, new: Program | Schedule, *,
                       what: str = "naive fusion") -> list[Dependence]:
    """The temporal dependences ``new`` breaks; IllegalTransform if it breaks any other.

    Naive fusion may let a consumer read a reduction's value before the
    reduction finishes (a temporal dependence, repaired afterwards); breaking a
    dependence on a memory location (a value read before it is ever written, a
    value overwritten before it is read, writes reordered, a reduction's own
    update chain) cannot be repaired and is refused.
    """
    found = violated(dependences, new)
    bad = [v for v in found if not v.temporal]
    if bad:
        allowed = f" ({len(found) - len(bad)} temporal violation(s) would be allowed)" if len(found) > len(bad) else ""
        raise IllegalTransform(
            f"{what} breaks {len(bad)} non-temporal dependence(s) of {dependences.program!r}{allowed}; only a "
            f"reduction's final value may be read early:\n{_report(bad)}"
        )
    return found


__all__ = ["check_naive_fusion", "require_legal", "violated", "violation"]
