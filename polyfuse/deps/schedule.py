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

That padded layout is the program's schedule (legality reports and compaction
read it).  Dependence and order computations use :func:`ordering_schedule`
instead: the same order among a set of blocks on the few coordinates that can
tell their instances apart, because ISL's cost grows with every coordinate.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from types import MappingProxyType

import islpy as isl

from polyfuse.deps.domains import param_names
from polyfuse.deps.islconv import aff_text, build_map, dim_env, param_env
from polyfuse.deps.memo import memoized
from polyfuse.errors import IRError
from polyfuse.ir.expr import Const, Expr
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

    The result depends on the loops only through their variables and extents, so the
    inverted bindings are cached on those (not on the loop bodies, nor on the block's
    position): a schedule step rebuilds few blocks' maps.
    """
    return _block_schedule(block, tuple((lp.var.name, lp.extent) for lp in loops), path, params, domain, width)


@memoized(1024)
def _block_schedule(block: Block, headers: tuple[tuple[str, Expr], ...], path: tuple[int, ...],
                    params: tuple[str, ...], domain: isl.Set, width: int) -> isl.Map:
    instance_to_point = _instance_to_point(block, headers, params, domain)
    return instance_to_point.apply_range(_point_to_time(len(headers), path, params, width))


@memoized(4096)
def _instance_to_point(block: Block, headers: tuple[tuple[str, Expr], ...], params: tuple[str, ...],
                       domain: isl.Set) -> isl.Map:
    """``{ B[iters] -> [loop point] }``, after checking that every instance runs exactly once."""
    if len(block.bindings) != len(block.iters):
        raise IRError(f"block {block.name!r} has {len(block.iters)} iteration variables "
                      f"but {len(block.bindings)} bindings")
    point_to_instance = _loop_point_to_instance(block, headers, params, domain)
    _check_executed_once(block, point_to_instance, domain)
    return point_to_instance.reverse()


@memoized(1024)
def _point_to_time(depth: int, path: tuple[int, ...], params: tuple[str, ...], width: int) -> isl.Map:
    """``{ [l1, …, ld] -> [p0, l1, p1, …, ld, pd, 0, …] }`` (``width`` coordinates)."""
    time = [str(path[0])]
    for k in range(depth):
        time += [f"_a{k}", str(path[k + 1])]
    time += ["0"] * (width - len(time))
    return build_map(params, [f"l{k}" for k in range(depth)], time, [])


def _loop_bounds(headers: tuple[tuple[str, Expr], ...], params: tuple[str, ...]) -> list[str]:
    penv = param_env(params)
    return [f"0 <= _a{k} < {aff_text(extent, penv, what=f'extent of loop {name!r}')}"
            for k, (name, extent) in enumerate(headers)]


def loop_point_to_instance(block: Block, loops, params: tuple[str, ...], domain: isl.Set) -> isl.Map:
    """``{ [loop point] -> B[iters] }``: the block's bindings over the loop box, restricted to its
    domain (the implied guard).  ``loops`` are the loops that bind it, outermost first."""
    return _loop_point_to_instance(block, tuple((lp.var.name, lp.extent) for lp in loops), tuple(params), domain)


@memoized(4096)
def _loop_point_to_instance(block: Block, headers: tuple[tuple[str, Expr], ...], params: tuple[str, ...],
                            domain: isl.Set) -> isl.Map:
    """Cached on the loops' variables and extents (all it needs of them), like :func:`block_schedule`."""
    names = [name for name, _ in headers]
    env = dim_env(names, params)
    binds = [aff_text(b, env, what=f"block {block.name!r}, binding of {iv.var.name!r}")
             for iv, b in zip(block.iters, block.bindings, strict=True)]
    return build_map(params, names, binds, _loop_bounds(headers, params), out_name=block.name,
                     out_dims=[iv.var.name for iv in block.iters]).intersect_range(domain)


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


@memoized(64)
def _instance_schedule(program: Program, domains: tuple[tuple[str, isl.Set], ...]) -> MappingProxyType:
    doms = dict(domains)
    params = param_names(program)
    width = 2 * _depth(program) + 1
    maps = {b.name: block_schedule(b, loops, path, params, doms[b.name], width)
            for b, loops, path in _placements(program.body)}
    return MappingProxyType(maps)


def ordering_schedule(program: Program, domains: Mapping[str, isl.Set], blocks: Collection[str]) -> dict[str, isl.Map]:
    """The instance schedule of ``blocks`` with the time coordinates that cannot order them dropped.

    A coordinate can be dropped when every two instances (of these blocks) that agree on
    the coordinates before it also agree on it: a sequence position shared by all the
    blocks still together at that depth, a loop of extent 1, the padding of a finished
    nest, the position of a block that no other block shares loops with any more.
    Lexicographic order among the blocks' instances is unchanged, and ISL's dependence
    and order computations cost per time coordinate, so analyses use this (a block alone
    keeps just its loops of extent > 1).  The coordinates kept are read off the loop
    tree, not computed with ISL.
    """
    return orderings(program, domains)(blocks)


def orderings(program: Program, domains: Mapping[str, isl.Set]) -> Callable[[Collection[str]], dict[str, isl.Map]]:
    """:func:`ordering_schedule` of ``program`` for any set of blocks (for many sets: one lookup of the schedule)."""
    sched = instance_schedule(program, domains)
    templates = {b.name: _template(loops, path, sched[b.name].dim(isl.dim_type.out))
                 for b, loops, path in _placements(program.body)}

    def order(blocks: Collection[str]) -> dict[str, isl.Map]:
        placed = [name for name in templates if name in blocks]
        kept = _ordering_coordinates([templates[name] for name in placed])
        width = len(templates[placed[0]]) if placed else 0
        dropped = _runs([k for k in range(width) if k not in kept])
        out = {}
        for name in placed:
            m = sched[name]
            for first, n in dropped:
                m = m.project_out(isl.dim_type.out, first, n)
            out[name] = m
        return out

    return order


def _runs(coordinates: list[int]) -> list[tuple[int, int]]:
    """Maximal runs ``(first, count)`` of consecutive ``coordinates`` (ascending), the last run first."""
    runs: list[tuple[int, int]] = []
    for k in coordinates:
        if runs and runs[-1][0] + runs[-1][1] == k:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((k, 1))
    return runs[::-1]


def _is_unit(extent: object) -> bool:
    return isinstance(extent, Const) and extent.value == 1


def _template(loops: tuple[Loop, ...], path: tuple[int, ...], width: int) -> tuple[int | None, ...]:
    """A block's time vector with constants where they are known (None: a loop of extent > 1)."""
    coords: list[int | None] = [path[0]]
    for k, lp in enumerate(loops):
        coords += [0 if _is_unit(lp.extent) else None, path[k + 1]]
    return tuple(coords) + (0,) * (width - len(coords))


def _ordering_coordinates(templates: list[tuple[int | None, ...]]) -> set[int]:
    """The coordinates that can tell apart two instances agreeing on every coordinate before."""
    kept: set[int] = set()
    groups = [templates] if templates else []  # blocks whose instances may agree so far
    for k in range(len(templates[0]) if templates else 0):
        refined = []
        for group in groups:
            values = {t[k] for t in group}
            if None in values:
                kept.add(k)
                refined.append(group)
                continue
            if len(values) > 1:
                kept.add(k)
            refined += [[t for t in group if t[k] == v] for v in values]
        groups = refined
    return kept


__all__ = ["block_schedule", "instance_schedule", "ordering_schedule", "orderings"]
