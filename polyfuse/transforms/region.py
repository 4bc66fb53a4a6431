"""Region inference for the placement primitives, with ISL.

``compute_at`` and ``reverse_compute_at`` move a block under a loop and give it
new loops covering only what one iteration of that loop (and of its outer
loops) needs.  The outer loop variables play the role of ISL parameters: the
instances a block runs at one point of the kept loops are

    { [outer loop vars] -> B[iters] }      (inner loops existentially quantified)

and composing such maps with access relations carries a region from one block
to another.  :func:`box` turns the map into one loop per iteration variable,
``iter = lo(outer) + ax`` for ``ax`` in ``range(extent)``, with ``extent``
constant in the outer loops; the blocks' implied guard trims what lies outside
the iteration domain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import islpy as isl

from polyfuse.deps.schedule import loop_point_to_instance
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Expr, Var, const
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import Block, Loop


def instances_at(params: Sequence[str], kept: Sequence[Loop], hidden: Sequence[Loop], block: Block,
                 domain: isl.Set) -> isl.Map:
    """``{ [kept loop vars] -> B[iters] }``: the instances ``block`` runs at each point of the ``kept`` loops.

    ``kept`` and ``hidden`` are the loops around the block, outermost first; the
    ``hidden`` (inner) ones are projected out.  Only instances inside the
    block's iteration ``domain`` count (the implied guard).
    """
    rel = loop_point_to_instance(block, [*kept, *hidden], tuple(params), domain)
    return rel.project_out(isl.dim_type.in_, len(kept), len(hidden))


@dataclass(frozen=True)
class Extent:
    """One iteration variable's range per outer point: ``lo + ax`` for ``ax`` in ``range(size)``."""

    lo: Expr
    size: Expr


def box(rel: isl.Map, *, what: str) -> list[Extent]:
    """Per output dimension of ``rel`` (``{ [outer] -> B[iters] }``), a lower bound and a size.

    The lower bound is affine in the outer variables and the size does not depend
    on them, so the box ``[lo, lo + size)`` covers the region at every outer point:
    the exact ``dim_min``/``dim_max`` when their difference is constant, else the
    piece of ``dim_min`` that bounds the region from below everywhere with the
    smallest maximal size (a partial last tile is then covered by a full-size
    box, the excess trimmed by the implied guard).
    """
    if rel.is_empty():
        raise IllegalTransform(f"{what}: the region is empty")
    n = rel.dim(isl.dim_type.out)
    return [_dim_box(rel.project_out(isl.dim_type.out, k + 1, n - k - 1).project_out(isl.dim_type.out, 0, k),
                     rel.get_dim_name(isl.dim_type.out, k), what) for k in range(n)]


def _dim_box(rel: isl.Map, name: str, what: str) -> Extent:
    low, high = rel.dim_min(0), rel.dim_max(0)
    best: tuple[int, Extent] | None = None
    for _, piece in low.get_pieces():
        lo = isl.PwAff.from_aff(piece).intersect_domain(low.domain())
        if not _at_least(low.sub(lo), 0):
            continue
        spread = high.sub(lo)
        exact = _outer_free(spread)
        if exact is not None:
            return Extent(aff_to_expr(piece), aff_to_expr(exact.add_constant_val(isl.Val.one(exact.get_ctx()))))
        top = spread.max_val()
        if top.is_int():
            size = top.to_python() + 1
            if best is None or size < best[0]:
                best = (size, Extent(aff_to_expr(piece), const(size)))
    if best is None:
        raise IllegalTransform(f"{what}: cannot bound iteration variable {name!r} by a box of constant size: "
                               f"it ranges from {low} to {high}")
    return best[1]


def _at_least(pw: isl.PwAff, bound: int) -> bool:
    low = pw.min_val()
    return not low.is_nan() and (low.is_infty() or (not low.is_neginfty() and low.to_python() >= bound))


def _outer_free(pw: isl.PwAff) -> isl.Aff | None:
    """The single affine piece of ``pw`` if it depends on parameters only, else None."""
    pieces = pw.get_pieces()
    if len(pieces) != 1:
        return None
    aff = pieces[0][1]
    if aff.dim(isl.dim_type.div):
        return None
    if any(not aff.get_coefficient_val(isl.dim_type.in_, k).is_zero() for k in range(aff.dim(isl.dim_type.in_))):
        return None
    return aff


def aff_to_expr(aff: isl.Aff) -> Expr:
    """An integer-valued ISL affine expression as an IR index expression (floor divisions as ``//``)."""
    return simplify(_linear(aff))


def _linear(aff: isl.Aff) -> Expr:
    terms: list[tuple[isl.Val, Expr]] = []
    for kind in (isl.dim_type.in_, isl.dim_type.param):
        for k in range(aff.dim(kind)):
            c = aff.get_coefficient_val(kind, k)
            if not c.is_zero():
                terms.append((c, Var(aff.get_dim_name(kind, k))))
    for k in range(aff.dim(isl.dim_type.div)):
        c = aff.get_coefficient_val(isl.dim_type.div, k)
        if not c.is_zero():
            terms.append((c, _linear(aff.get_div(k))))
    constant = aff.get_constant_val()
    denom = math.lcm(*(_den(c) for c, _ in terms), _den(constant))
    out: Expr | None = None
    for c, e in terms:
        k = _scaled(c, denom)
        if out is None:
            out = e if k == 1 else e * k
        else:
            term = e if abs(k) == 1 else e * abs(k)
            out = out + term if k > 0 else out - term
    rest = _scaled(constant, denom)
    if out is None:
        out = const(rest)
    elif rest:
        out = out + rest if rest > 0 else out - (-rest)
    return out // denom if denom != 1 else out


def _den(v: isl.Val) -> int:
    return v.get_den_val().to_python()


def _scaled(v: isl.Val, denom: int) -> int:
    return v.get_num_si() * (denom // _den(v))


__all__ = ["Extent", "aff_to_expr", "box", "instances_at"]
