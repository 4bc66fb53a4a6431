"""The schedule of a program: when each block instance executes.

The time of an instance is a vector read off the loop tree, sequence positions
interleaved with loop variables, ``(p0, l1, p1, …, ld, pd)``, zero-padded to one
width for the whole program so that any two instances compare
lexicographically.  Loops bind block iterations (``i = 4*i0 + i1``), so ISL
inverts the bindings: ``{loop point -> instance}`` (restricted to the implied
guard: the iteration domain, ``0 <= iter < extent`` and the block's ``where``)
reversed and composed with ``{loop point -> time}`` gives ``{instance -> time}``.
Every instance must run exactly once; a program where one runs twice or never is
malformed and rejected naming the block and an instance.
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from collections.abc import Iterator, Mapping

import islpy as isl

from polyfuse.deps.domains import param_names
from polyfuse.deps.islconv import aff_text, build_map, dim_env, param_env
from polyfuse.errors import IRError
from polyfuse.ir.expr import Var
from polyfuse.ir.stmt import Block, Loop, Program, Seq, Stmt


def _children(stmt: Stmt) -> list[Stmt]:
    """The statements of a body in order, nested sequences flattened."""
    if isinstance(stmt, Seq):
        return [c for s in stmt.stmts for c in _children(s)]
    return [stmt]


def _placements(stmt: Stmt, loops: tuple[Loop, ...] = (),
                path: tuple[int, ...] = ()) -> Iterator[tuple[Block, tuple[Loop, ...], tuple[int, ...]]]:
    """Each block with its enclosing loops and its sequence position at every level."""
    for k, s in enumerate(_children(stmt)):
        if isinstance(s, Block):
            yield s, loops, path + (k,)
        elif isinstance(s, Loop):
            yield from _placements(s.body, loops + (s,), path + (k,))
        else:
            raise IRError(f"unknown statement {type(s).__name__} in a program body")


def _depth(program: Program) -> int:
    return max((len(loops) for _, loops, _ in _placements(program.body)), default=0)


def block_schedule(block: Block, loops: tuple[Loop, ...], path: tuple[int, ...], params: tuple[str, ...],
                   domain: isl.Set, width: int) -> isl.Map:
    """``{ B[iters] -> [time] }`` for one block placed under ``loops`` at sequence ``path``.

    The result depends on the loops only through their variables and extents, so it is
    cached on those (not on the loop bodies): a schedule step rebuilds few blocks' maps.
    """
    headers = tuple((lp.var.name, lp.extent) for lp in loops)
    return _block_schedule(block, headers, path, params, domain, width)


@functools.lru_cache(maxsize=1024)
def _block_schedule(block: Block, headers: tuple[tuple[str, object], ...], path: tuple[int, ...],
                    params: tuple[str, ...], domain: isl.Set, width: int) -> isl.Map:
    loops = [_Header(name, extent) for name, extent in headers]
    if len(block.bindings) != len(block.iters):
        raise IRError(f"block {block.name!r} has {len(block.iters)} iteration variables "
                      f"but {len(block.bindings)} bindings")
    names = [lp.var.name for lp in loops]
    bounds = _loop_bounds(loops, params)
    point_to_instance = loop_point_to_instance(block, loops, params, domain)
    time = [str(path[0])]
    for k in range(len(loops)):
        time += [f"_a{k}", str(path[k + 1])]
    time += ["0"] * (width - len(time))
    point_to_time = build_map(params, names, time, bounds)
    _check_executed_once(block, point_to_instance, domain)
    return point_to_instance.reverse().apply_range(point_to_time)


def _loop_bounds(loops, params: tuple[str, ...]) -> list[str]:
    penv = param_env(params)
    return [f"0 <= _a{k} < {aff_text(lp.extent, penv, what=f'extent of loop {lp.var.name!r}')}"
            for k, lp in enumerate(loops)]


def loop_point_to_instance(block: Block, loops, params: tuple[str, ...], domain: isl.Set) -> isl.Map:
    """``{ [loop point] -> B[iters] }``: the block's bindings over the loop box, restricted to its
    domain (the implied guard).  ``loops`` are the loops that bind it, outermost first."""
    names = [lp.var.name for lp in loops]
    env = dim_env(names, params)
    binds = [aff_text(b, env, what=f"block {block.name!r}, binding of {iv.var.name!r}")
             for iv, b in zip(block.iters, block.bindings, strict=True)]
    return build_map(params, names, binds, _loop_bounds(loops, params), out_name=block.name,
                     out_dims=[iv.var.name for iv in block.iters]).intersect_range(domain)


class _Header:
    """A loop's variable and extent: all a block's schedule needs of it."""

    def __init__(self, name: str, extent: object):
        self.var = Var(name)
        self.extent = extent


def _check_executed_once(block: Block, point_to_instance: isl.Map, domain: isl.Set) -> None:
    """Each instance of the block's domain runs at exactly one loop point."""
    missing = domain.subtract(point_to_instance.range())
    if not missing.is_empty():
        raise IRError(
            f"block {block.name!r}: instances {missing} are never executed by the loops around it "
            f"(e.g. {missing.sample_point()}); its bindings must cover its iteration domain"
        )
    if not point_to_instance.is_injective():
        same = point_to_instance.apply_range(point_to_instance.reverse())
        twice = same.subtract(isl.Map.identity(same.get_space())).wrap()
        raise IRError(
            f"block {block.name!r}: some instances run at two loop points ({twice.sample_point()}); "
            "each block instance must execute exactly once"
        )


def instance_schedule(program: Program, domains: Mapping[str, isl.Set]) -> dict[str, isl.Map]:
    """``{ B[iters] -> [time] }`` for every block, all times of one width.

    ``domains`` must be the program's own (``deps.domains(program)``): the result is
    cached per program, since every legality check of a schedule step needs it again.
    """
    return dict(_instance_schedule(program, tuple(domains.items())))


@functools.lru_cache(maxsize=64)
def _instance_schedule(program: Program, domains: tuple[tuple[str, isl.Set], ...]) -> MappingProxyType:
    doms = dict(domains)
    params = param_names(program)
    width = 2 * _depth(program) + 1
    maps = {b.name: block_schedule(b, loops, path, params, doms[b.name], width)
            for b, loops, path in _placements(program.body)}
    return MappingProxyType(maps)



__all__ = ["block_schedule", "instance_schedule"]
