"""fuse: a perfect nest of loops becomes one loop over the product of their extents.

Preconditions (checked first):
  1. the loops enclose the block and are consecutive, each the whole body of the previous;
  2. their extents are integers (a product of sizes is not affine);
  3. they are plain serial loops.

Before / after (``fuse(["i", "j"])`` with extents 4, 8)::

    for i in range(4):          for i_j in range(32):
        for j in range(8):          B[i = i_j // 8, j = i_j % 8]
            B[i, j]

Iterations keep their order, so fusion is always legal.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Const, Expr, Var, const
from polyfuse.ir.stmt import SERIAL, Loop, Program
from polyfuse.transforms.tree import fresh_loop_name, loops_of, rebind, replace_node
from polyfuse.transforms.split import _validated, check_loop_names


def fuse(program: Program, *, block: str, loops: Sequence[str], name: str | None = None) -> Program:
    """Fuse consecutive perfectly nested loops (outermost first) into one."""
    where = f"fuse of loops {list(loops)} (block {block!r})"
    path = loops_of(program, block)
    names = [lp.var.name for lp in path]
    if len(loops) < 2 or any(n not in names for n in loops):
        raise IllegalTransform(f"{where}: name at least two loops enclosing the block; its loops are {names}")
    start = names.index(loops[0])
    segment = path[start:start + len(loops)]
    if [lp.var.name for lp in segment] != list(loops):
        raise IllegalTransform(f"{where}: the loops must be consecutive, outermost first; "
                               f"the block's loops are {names}")
    for outer, inner in zip(segment, segment[1:], strict=False):
        if outer.body is not inner:
            raise IllegalTransform(f"{where}: loop {outer.var.name!r} has more than loop {inner.var.name!r} in "
                                   "its body, so the loops are not a perfect nest")
    for lp in segment:
        if not isinstance(lp.extent, Const):
            raise IllegalTransform(f"{where}: loop {lp.var.name!r} has symbolic extent {lp.extent}; "
                                   "bind the sizes first (a product of sizes is not affine)")
        if lp.kind != SERIAL or lp.thread is not None or lp.annotations:
            raise IllegalTransform(f"{where}: loop {lp.var.name!r} is {lp.kind}; fuse before binding or annotating")
    if name is not None:
        check_loop_names(program, block, loops, [name], where)
    fused = Var(name or fresh_loop_name(program, "_".join(loops)))
    mapping: dict[str, Expr] = {}
    stride = 1
    for k, lp in enumerate(reversed(segment)):
        ext = int(lp.extent.value)  # type: ignore[union-attr]
        v: Expr = fused if stride == 1 else fused // stride
        mapping[lp.var.name] = v if k == len(segment) - 1 else v % ext
        stride *= ext
    new_loop = Loop(fused, const(stride), rebind(segment[-1].body, mapping))
    return _validated(program.replace(body=replace_node(program.body, segment[0], new_loop)), where)
