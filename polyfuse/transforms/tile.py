"""tile: split several loops and move the outer parts outward (Neptune's ``tile``).

``tile(["i", "j"], [128, 32])`` on a perfect nest ``for i: for j:`` gives
``for i_0: for j_0: for i_1: for j_1:`` — outer (tile) loops first, then the
loops inside a tile, each of extent at most its tile size.  It is ``split`` of
every loop followed by ``reorder``, and is legal when that reorder is.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.errors import IllegalTransform
from polyfuse.ir.stmt import Program
from polyfuse.transforms.reorder import reorder
from polyfuse.transforms.split import split
from polyfuse.transforms.tree import fresh_loop_name


def tile(program: Program, *, block: str, loops: Sequence[str], sizes: Sequence[int]) -> tuple[Program, list[str]]:
    """Tile the named loops by ``sizes``; returns the program and the new loop names (outer ones first)."""
    if len(loops) != len(sizes) or not loops:
        raise IllegalTransform(f"tile of loops {list(loops)} (block {block!r}): "
                               f"give one size per loop, got {list(sizes)}")
    outer, inner = [], []
    taken: set[str] = set()
    for name, size in zip(loops, sizes, strict=True):
        o = fresh_loop_name(program, f"{name}_0", taken)
        taken.add(o)
        i = fresh_loop_name(program, f"{name}_1", taken)
        taken.add(i)
        program = split(program, block=block, loop=name, factors=[None, size], names=[o, i])
        outer.append(o)
        inner.append(i)
    if len(loops) > 1:
        program = reorder(program, block=block, loops=outer + inner)
    return program, outer + inner
