"""Access-function relaxation: a scalar access inside a tileable nest becomes a tile access.

Neptune's Appendix E relaxes an access whose coefficient matrix in the tile loop
variables is *1-sparse* — every tensor dimension uses at most one tile variable,
with coefficient 1 — into a slice per dimension along that variable; dimensions
using no tile variable stay scalar indices.  Compacted buffers are indexed
``i % 16`` with ``i = 16·i_0 + ax0``: :func:`fold_div_mod` first folds
``(c·q + r) % c`` to ``r`` (and ``// c`` to ``q``) when ``0 <= r < c`` over the loop
ranges, so such an index is the tile variable ``ax0`` again.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyfuse.errors import PolyfuseError, UntileableNest
from polyfuse.ir.affine import fold_div_mod, from_linear_form, linear_form, variables
from polyfuse.ir.expr import Const, Expr
from polyfuse.ir.visit import substitute
from polyfuse.tiling.htile import Index, Slice


def bounds(e: Expr, ranges: Mapping[str, int]) -> tuple[int, int] | None:
    """Inclusive integer bounds of an affine ``e`` over ``0 <= v < ranges[v]``, or None if unknown."""
    try:
        form = linear_form(e)
    except PolyfuseError:
        return None
    low = high = form.get(1, 0)
    for k, c in form.items():
        if k == 1:
            continue
        if not isinstance(k, str) or k not in ranges:
            return None
        top = c * (ranges[k] - 1)
        low, high = low + min(0, top), high + max(0, top)
    return low, high


def relax_access(tensor_name: str, indices: tuple[Expr, ...], tile_sizes: Mapping[str, int],
                 *, block: str, access: str) -> tuple[Index, ...]:
    """Slices along tile axes for a 1-sparse access; ``UntileableNest`` naming it otherwise.

    ``indices`` are already in loop variables (bindings substituted) and folded.
    """
    out: list[Index] = []
    used: dict[str, int] = {}
    for d, idx in enumerate(indices):
        try:
            form = linear_form(idx)
        except PolyfuseError as err:
            raise UntileableNest(f"block {block!r}: access {access} is not affine in dimension {d} "
                                 f"({err}); a tile access needs indices affine in the tile loops") from None
        tiled = [k for k in form if isinstance(k, str) and k in tile_sizes]
        hidden = sorted(variables({k: c for k, c in form.items() if not isinstance(k, str)}) & set(tile_sizes))
        if hidden:
            raise UntileableNest(f"block {block!r}: access {access} uses tile loop(s) {', '.join(hidden)} "
                                 f"under // or % in dimension {d} ({idx}); it is not a slice")
        if not tiled:
            out.append(idx)
            continue
        if len(tiled) > 1 or form[tiled[0]] != 1:
            raise UntileableNest(f"block {block!r}: access {access} is not 1-sparse in dimension {d} "
                                 f"({idx}): a slice needs one tile loop with coefficient 1")
        axis = tiled[0]
        if axis in used:
            raise UntileableNest(f"block {block!r}: access {access} uses tile loop {axis} in dimensions "
                                 f"{used[axis]} and {d}; a tile access needs each tile loop in one dimension")
        used[axis] = d
        start = fold_div_mod(substitute(idx, {axis: Const(0, idx.dtype)}), {})
        out.append(Slice(from_linear_form(linear_form(start), idx.dtype), tile_sizes[axis], axis))
    return tuple(out)
