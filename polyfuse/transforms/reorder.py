"""reorder: permute loops of a perfect nest.

Preconditions (checked first):
  1. every named loop encloses the block, each named once;
  2. the loops from the outermost to the innermost named one form a perfect nest
     (each loop's body is exactly the next loop);
  3. the permuted program keeps every dependence (checked with the dependence
     analysis; a violation is reported with a witness).

Before / after (``reorder(["j", "i"])``)::

    for i:              for j:
        for j:              for i:
            B               B

The named loops take, in the given order, the positions they occupied; unnamed
loops in between keep their place.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.errors import IllegalTransform
from polyfuse.ir.stmt import Loop, Program, Stmt
from polyfuse.transforms.tree import blocks_under, loops_of, replace_node
from polyfuse.transforms.verify import verify


def reorder(program: Program, *, block: str, loops: Sequence[str]) -> Program:
    """Reorder the named loops enclosing ``block`` into the given order."""
    where = f"reorder of loops {list(loops)} (block {block!r})"
    path = loops_of(program, block)
    names = [lp.var.name for lp in path]
    missing = [n for n in loops if n not in names]
    if missing or len(set(loops)) != len(loops):
        raise IllegalTransform(f"{where}: block {block!r} is inside loops {names}; "
                               f"{'not found: ' + ', '.join(missing) if missing else 'a loop is named twice'}")
    positions = sorted(names.index(n) for n in loops)
    segment = path[positions[0]:positions[-1] + 1]
    for outer, inner in zip(segment, segment[1:], strict=False):
        if outer.body is not inner:
            raise IllegalTransform(f"{where}: loop {outer.var.name!r} has more than loop {inner.var.name!r} in its "
                                   "body, so the loops are not a perfect nest")
    order = list(segment)
    by_name = {lp.var.name: lp for lp in segment}
    for pos, name in zip(positions, loops, strict=True):
        order[pos - positions[0]] = by_name[name]
    body: Stmt = segment[-1].body
    for lp in reversed(order):
        body = Loop(lp.var, lp.extent, body, lp.kind, lp.thread, lp.annotations)
    new = program.replace(body=replace_node(program.body, segment[0], body))
    # Only instances of blocks inside the permuted nest change their order.
    return verify(program, new, what=where, moved=[b.name for b in blocks_under(segment[0])])
