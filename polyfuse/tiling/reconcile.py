"""Dimension-order reconciliation by name: squeeze, permute, unsqueeze (broadcast).

A loaded tile has its axes in the tensor's dimension order (``k[j, d]`` gives
``[j, d]``); a statement computes in its nest's loop order, a ``Dot`` wants
``[m, k]·[k, n]`` and a store wants the destination's dimension order.  The
earlier Neptune version's Appendix E matches dimensions *by loop variable*, not by
position: this module is the one place that turns "these names, this order" into
explicit ``Squeeze``/``Permute``/``Broadcast`` nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polyfuse.errors import UntileableNest
from polyfuse.ir.expr import Call, Cast, Expr
from polyfuse.tiling.htile import Broadcast, Permute, Squeeze, axes_of


def reconcile_dim_order(tile: Expr, target: Sequence[str], sizes: Mapping[str, int], *,
                        what: str = "tile") -> Expr:
    """``tile`` with exactly the axes ``target``, in that order.

    Axes of ``tile`` missing from ``target`` must have size 1 (squeezed); axes of
    ``target`` missing from ``tile`` are new broadcast axes.  Scalars stay scalars
    (they broadcast against anything).
    """
    have = axes_of(tile)
    if not have:
        return tile
    out = tile
    for name in have:
        if name not in target:
            if sizes.get(name) != 1:
                raise UntileableNest(f"{what}: axis {name} (size {sizes.get(name)}) has no place in "
                                     f"[{', '.join(target)}]; only axes of size 1 can be squeezed")
            out = Squeeze(out, name)
    kept = tuple(a for a in have if a in target)
    wanted = tuple(a for a in target if a in kept)
    if kept != wanted:
        out = permute(out, wanted)
    if wanted != tuple(target):
        out = Broadcast(out, tuple((a, sizes[a]) for a in target))
    return out


def permute(tile: Expr, order: tuple[str, ...]) -> Expr:
    """``Permute(tile, order)``, folded into an inner permute and pushed through unary ops.

    Pushing it down keeps the transpose next to the load it reorders (``k[j, d]`` read
    as ``[d, j]``), which is where a code generator wants it.
    """
    if axes_of(tile) == order:
        return tile
    if isinstance(tile, Permute):
        return permute(tile.tile, order)
    if isinstance(tile, Cast):
        return Cast(tile.type, permute(tile.value, order))
    if isinstance(tile, Call):
        return Call(tile.fn, (permute(tile.args[0], order),))
    return Permute(tile, order)


def union_order(tiles: Sequence[Expr], canonical: Sequence[str]) -> tuple[str, ...]:
    """The union of the tiles' axes, in the canonical (loop-nest) order."""
    names = {a for t in tiles for a in axes_of(t)}
    return tuple(a for a in canonical if a in names)


def unify(tiles: Sequence[Expr], canonical: Sequence[str], sizes: Mapping[str, int]) -> list[Expr]:
    """Bring the operands of one elementwise op to the same axes (their union, canonical order)."""
    target = union_order(tiles, canonical)
    return [t if not axes_of(t) or axes_of(t) == target else reconcile_dim_order(t, target, sizes)
            for t in tiles]
