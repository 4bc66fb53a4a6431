"""Iteration domains: the statement instances of each block as an ``isl.Set``.

A block instance is identified by the values of the block's own iteration
variables, not by the loops that bind them, so the domain of ``s_max`` is
``[N, M] -> { s_max[i, j] : 0 <= i < N and 0 <= j < M }`` before and after any
split, reorder or fusion.  That is what lets dependences computed on one
program be checked against the schedule of another.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.deps.islconv import aff_text, build_set, param_env
from polyfuse.ir.stmt import Block, Program


def param_names(program: Program) -> tuple[str, ...]:
    """The program's size parameters, in declaration order (the ISL params)."""
    return tuple(p.name for p in program.params)


def iteration_domain(block: Block, params: tuple[str, ...]) -> isl.Set:
    """``{ B[iters] : 0 <= iter_k < extent_k }`` with extents as ISL params."""
    env = param_env(params)
    names = [iv.var.name for iv in block.iters]
    cons = []
    for k, iv in enumerate(block.iters):
        ext = aff_text(iv.extent, env, what=f"block {block.name!r}, extent of {iv.var.name!r}")
        cons.append(f"0 <= _a{k} < {ext}")
    return build_set(params, block.name, names, cons)


def first_reduce_instances(block: Block, domain: isl.Set) -> isl.Set:
    """Instances whose reduce iterations are all 0: where the reduction's init happens."""
    out = domain
    for k, iv in enumerate(block.iters):
        if iv.is_reduce:
            out = out.fix_val(isl.dim_type.set, k, isl.Val.zero(out.get_ctx()))
    return out


def domains(program: Program) -> dict[str, isl.Set]:
    """Iteration domain of every block, by block name, in program order."""
    params = param_names(program)
    return {b.name: iteration_domain(b, params) for b in program.blocks()}


__all__ = ["domains", "first_reduce_instances", "iteration_domain", "param_names"]
