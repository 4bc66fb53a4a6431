"""Vector memory accesses: which loads of a statement may read ``VEC`` neighbours in one instruction.

GPU threads that handle ``VEC`` consecutive elements along a tile axis read them with one 64- or
128-bit load (``LDG.E.128``: four f32 or eight f16) instead of ``VEC`` scalar ones, when

1. the axis runs along the tensor's last, contiguous dimension (``index[-1]`` is its slice, and
   no other dimension mentions it);
2. the first element's offset is a multiple of ``VEC``: the slice's start is affine with every
   coefficient a multiple of ``VEC`` and the tensor's last dimension is a constant multiple of
   ``VEC`` (the runtime checks that arrays start on 16-byte boundaries);
3. the load's mask does not depend on the axis (the ``VEC`` lanes are all read or all skipped);
4. the load is evaluated once per element (not inside a reduction or dot computed in place,
   whose other indices move).

The emitter then loads a short array per eligible load and reads lane ``v`` from it.
"""

from __future__ import annotations

from polyfuse.errors import NonAffineIndex
from polyfuse.ir.affine import linear_form
from polyfuse.ir.expr import Const, Expr
from polyfuse.tiling.htile import Dot, Reduce, Slice, TileLoad, tile_children

VECTOR_BYTES = 16
CHUNK_TYPES = {16: "uint4", 8: "uint2", 4: "uint32_t"}


def per_element_loads(e: Expr, done: dict) -> list[TileLoad]:
    """The loads of ``e`` evaluated once per element (not inside materialized nodes, reductions or dots)."""
    if e in done or isinstance(e, (Reduce, Dot)):
        return []
    if isinstance(e, TileLoad):
        return [e] + ([] if e.mask is None else per_element_loads(e.mask, done))
    return [x for c in tile_children(e) for x in per_element_loads(c, done)]


def aligned(index: tuple, tensor_shape: tuple, axis: str, vec: int) -> bool:
    """Conditions 1 and 2 for an access ``index`` of a tensor of ``tensor_shape``."""
    if not index or not isinstance(index[-1], Slice) or index[-1].axis != axis:
        return False
    if any(isinstance(i, Slice) and i.axis == axis for i in index[:-1]):
        return False
    last = tensor_shape[-1]
    if not isinstance(last, Const) or int(last.value) % vec:
        return False
    try:
        form = linear_form(index[-1].start)
    except NonAffineIndex:
        return False
    return all(c % vec == 0 for c in form.values())


def chunks(itemsize: int, vec: int) -> tuple[str, int]:
    """The C type of one vector access and how many of them read ``vec`` items of ``itemsize`` bytes."""
    total = itemsize * vec
    chunk = min(VECTOR_BYTES, total)
    return CHUNK_TYPES[chunk], total // chunk
