"""split: one loop becomes a nest of loops whose product covers it.

Preconditions (checked first):
  1. the loop encloses the block and is a plain serial loop (not bound or annotated);
  2. at most one factor is None (inferred) and every other factor is a positive integer;
  3. with a symbolic extent, only the outermost factor may be inferred.

Before / after (factors ``[None, 4]`` on ``i`` of extent 10)::

    for i in range(10):            for i_0 in range(3):
        B[i = i]                       for i_1 in range(4):
                                           B[i = i_0 * 4 + i_1]   # runs iff i < 10

The implied guard of every block (its iteration values lie in its domain) drops
the points past the old extent, so non-divisible factors need no extra code.
Splitting never reorders iterations, so it is always legal.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Const, Expr, Var, const
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import SERIAL, Loop, Program, Stmt
from polyfuse.transforms.tree import find_loop, fresh_loop_name, loops_of, rebind, replace_node


def split(program: Program, *, block: str, loop: str, factors: Sequence[int | None],
          names: Sequence[str] | None = None) -> Program:
    """Split loop ``loop`` (enclosing ``block``) into ``len(factors)`` nested loops."""
    lp = find_loop(program, block, loop)
    where = f"split of loop {loop!r} (block {block!r})"
    if lp.kind != SERIAL or lp.thread is not None or lp.annotations:
        raise IllegalTransform(f"{where}: the loop is {lp.kind}{' ' + lp.thread if lp.thread else ''}; "
                               "split it before binding or annotating it")
    extents = _factor_extents(lp.extent, list(factors), where)
    if names is None:
        taken: set[str] = set()
        names = []
        for k in range(len(extents)):
            n = fresh_loop_name(program, f"{loop}_{k}", taken)
            taken.add(n)
            names.append(n)
    elif len(names) != len(extents) or len(set(names)) != len(names):
        raise IllegalTransform(f"{where}: need {len(extents)} distinct loop names, got {list(names)}")
    check_loop_names(program, block, [loop], names, where)
    value: Expr = const(0)
    for name, ext in zip(names, extents, strict=True):
        value = Var(name) if value == const(0) else value * ext + Var(name)
    body: Stmt = rebind(lp.body, {loop: simplify(value)})
    for name, ext in reversed(list(zip(names, extents, strict=True))):
        body = Loop(Var(name), ext, body)
    # Iterations keep their order: validation (which includes the exact-cover check of the
    # schedule, via deps) is all a split needs.
    return _validated(program.replace(body=replace_node(program.body, lp, body)), where)


def check_loop_names(program: Program, block: str, replaced: Sequence[str], names: Sequence[str], where: str) -> None:
    """New loop names replacing the loops ``replaced`` around ``block``: identifiers, none a size or another
    loop around the block (a nested loop of the same name would hide the outer one)."""
    taken = {p.name for p in program.params} | {lp.var.name for lp in loops_of(program, block)} - set(replaced)
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise IllegalTransform(f"{where}: a loop name must be an identifier, got {name!r}")
        if name in taken:
            raise IllegalTransform(f"{where}: {name!r} already names a size or a loop around block {block!r}")


def _validated(program: Program, what: str) -> Program:
    from polyfuse import deps
    from polyfuse.errors import IRError
    from polyfuse.ir.validate import validate

    validate(program)
    try:
        deps.instance_schedule(program, deps.domains(program))
    except IRError as err:
        raise IllegalTransform(f"{what}: {err}") from err
    return program


def _factor_extents(extent: Expr, factors: list[int | None], where: str) -> list[Expr]:
    if len(factors) < 2:
        raise IllegalTransform(f"{where}: give at least two factors, got {factors}")
    if sum(f is None for f in factors) > 1:
        raise IllegalTransform(f"{where}: at most one factor may be None (inferred), got {factors}")
    for f in factors:
        if f is not None and (isinstance(f, bool) or not isinstance(f, int) or f < 1):
            raise IllegalTransform(f"{where}: factors must be positive integers or None, got {factors}")
    known = 1
    for f in factors:
        known *= f or 1
    if None not in factors:
        if isinstance(extent, Const) and known < extent.value:
            raise IllegalTransform(f"{where}: factors {factors} cover {known} iterations, the loop has {extent}")
        if not isinstance(extent, Const):
            raise IllegalTransform(f"{where}: the extent {extent} is symbolic; make the outermost factor None")
        return [const(f) for f in factors]  # type: ignore[arg-type]
    k = factors.index(None)
    if not isinstance(extent, Const) and k != 0:
        raise IllegalTransform(f"{where}: the extent {extent} is symbolic; only the outermost factor can be inferred")
    inferred = simplify((extent + (known - 1)) // known)
    return [inferred if f is None else const(f) for f in factors]
