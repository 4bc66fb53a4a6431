"""Iteration domains: the statement instances of each block as an ``isl.Set``.

A block instance is identified by the values of the block's own iteration
variables, not by the loops that bind them, so the domain of ``s_max`` is
``[N, M] -> { s_max[i, j] : 0 <= i < N and 0 <= j < M }`` before and after any
split, reorder or fusion.  That is what lets dependences computed on one
program be checked against the schedule of another.  A block's ``where`` adds
its comparisons to the box: ``{ s_rf[i, j0, j1] : ... and 16*j0 + j1 < 40 }``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import islpy as isl

from polyfuse.deps.islconv import aff_text, build_set, condition_texts, dim_env, param_env
from polyfuse.deps.memo import memoized
from polyfuse.errors import IRError
from polyfuse.ir.expr import Expr, logical_and
from polyfuse.ir.simplify import simplify_condition
from polyfuse.ir.stmt import Block, Program


def param_names(program: Program) -> tuple[str, ...]:
    """The program's size parameters, in declaration order (the ISL params)."""
    return tuple(p.name for p in program.params)


def iteration_domain(block: Block, params: Sequence[str]) -> isl.Set:
    """``{ B[iters] : 0 <= iter_k < extent_k and where }`` with extents as ISL params.

    Cached per block: a schedule step keeps most blocks as they are, and every analysis
    of the programs it produces needs their domains again.
    """
    return _iteration_domain(block, tuple(params))


@memoized(4096)
def _iteration_domain(block: Block, params: tuple[str, ...]) -> isl.Set:
    env = param_env(params)
    names = [iv.var.name for iv in block.iters]
    cons = []
    for k, iv in enumerate(block.iters):
        ext = aff_text(iv.extent, env, what=f"block {block.name!r}, extent of {iv.var.name!r}")
        cons.append(f"0 <= _a{k} < {ext}")
    if block.where is not None:
        cons += condition_texts(block.where, dim_env(names, params), what=f"block {block.name!r}, where")
    return build_set(params, block.name, names, cons)


def first_reduce_instances(block: Block, domain: isl.Set) -> isl.Set:
    """Instances whose reduce iterations are all 0: where the reduction's init happens."""
    out = domain
    for k, iv in enumerate(block.iters):
        if iv.is_reduce:
            out = out.fix_val(isl.dim_type.set, k, isl.Val.zero(out.get_ctx()))
    return out


def missing_init_origins(block: Block, params: tuple[str, ...]) -> isl.Set:
    """Spatial points of ``block`` that have instances but not the first one (reduce iterations all 0),
    for sizes >= 1; empty for a box.  The init runs at the first instance, so such a point would have none."""
    dom = iteration_domain(block, params)
    spatial = _spatial_points(block, dom)
    first = _spatial_points(block, first_reduce_instances(block, dom))
    return spatial.subtract(first).intersect_params(positive_sizes(params)).set_tuple_name(block.name)


def prune_where(block: Block, conds: Sequence[Expr], params: tuple[str, ...]) -> Expr | None:
    """The conjunction of the ``conds`` that ``block``'s box does not imply (for sizes >= 1), or None.

    Transforms derive predicates mechanically (``j_0 * 16 < 40`` at the first instance of a
    partial result); those that every point of the box satisfies are left out."""
    box = iteration_domain(block.replace(where=None), params).intersect_params(positive_sizes(params))
    kept = [c for c in conds if not box.is_subset(iteration_domain(block.replace(where=c), params))]
    return simplify_condition(functools.reduce(logical_and, kept)) if kept else None


def positive_sizes(params: tuple[str, ...]) -> isl.Set:
    """``[params] -> { : params >= 1 }``: the values sizes can take."""
    return build_set(params, None, [], [f"_p{k} >= 1" for k in range(len(params))]).params()


def require_init_origins(block: Block, params: tuple[str, ...]) -> None:
    """IRError naming the block and a point when :func:`missing_init_origins` is not empty."""
    missing = missing_init_origins(block, params)
    if not missing.is_empty():
        reduce = ", ".join(f"{iv.var.name} = 0" for iv in block.reduce_iters)
        raise IRError(
            f"block {block.name!r}: its where {block.where} excludes the first reduce instance ({reduce}) of "
            f"spatial points that have other instances, e.g. {_point_text(missing.sample_point(), block, params)}; "
            "the init runs at the first instance, so those elements would never be initialised")


def _point_text(point: isl.Point, block: Block, params: tuple[str, ...]) -> str:
    """``i = 1, N = 2``: a point of the spatial projection with the sizes it needs."""
    coords = [f"{iv.var.name} = {point.get_coordinate_val(isl.dim_type.set, k).to_python()}"
              for k, iv in enumerate(block.spatial_iters)]
    space = point.get_space()
    coords += [f"{p} = {point.get_coordinate_val(isl.dim_type.param, space.find_dim_by_name(isl.dim_type.param, p))}"
               for p in params]
    return ", ".join(coords)


def _spatial_points(block: Block, instances: isl.Set) -> isl.Set:
    """``instances`` projected onto the spatial iterations."""
    out = instances
    for k in reversed(range(len(block.iters))):
        if block.iters[k].is_reduce:
            out = out.project_out(isl.dim_type.set, k, 1)
    return out


def domains(program: Program) -> dict[str, isl.Set]:
    """Iteration domain of every block, by block name, in program order (cached per program)."""
    return dict(_domains(program))


@memoized(64)
def _domains(program: Program) -> tuple[tuple[str, isl.Set], ...]:
    params = param_names(program)
    return tuple((b.name, iteration_domain(b, params)) for b in program.blocks())


__all__ = ["domains", "first_reduce_instances", "iteration_domain", "missing_init_origins", "param_names",
           "positive_sizes", "prune_where", "require_init_origins"]
