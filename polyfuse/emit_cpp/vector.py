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

The emitter then loads a short array per eligible load and reads lane ``v`` from it (the methods of
:class:`VectorLanes`, part of the GPU emitter).
"""

from __future__ import annotations

from polyfuse.errors import NonAffineIndex
from polyfuse.ir.affine import linear_form
from polyfuse.ir.expr import Const, Expr
from polyfuse.emit_cpp.cfamily import SIZEOF
from polyfuse.tiling.htile import Dot, Reduce, Slice, TileLoad, TileStore, depends_on, tile_children

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


class VectorLanes:
    """The GPU emitter's vector accesses: which loads of a statement read ``vec`` lanes at once, and the
    arrays they are read into (``lane_arrays``, read at lane ``lane`` while a lane's value is printed)."""

    def lane_plan(self, exprs: list[Expr], axis: str) -> tuple[int, list[TileLoad]]:
        """Lanes per thread along ``axis`` and the loads read as vectors (see :mod:`~polyfuse.emit_cpp.vector`)."""
        loads: list[TileLoad] = []
        for e in exprs:
            for x in per_element_loads(e, self.materialized):
                if x not in loads and x.tensor.name not in self.shared_names and not x.tensor.dtype.is_bool:
                    loads.append(x)
        extent = self.sizes[axis]
        for vec in (8, 4, 2):
            if extent % vec:
                continue
            chosen = [x for x in loads if SIZEOF[self.stype(x.tensor.dtype)] * vec <= VECTOR_BYTES
                      and aligned(x.index, x.tensor.shape, axis, vec)
                      and (x.mask is None or not depends_on(x.mask, axis))]
            if chosen:
                return vec, chosen
        return 1, []

    def vector_store(self, s: TileStore, axis: str, vec: int) -> bool:
        t = s.tensor
        return (vec > 1 and s.reducer is None and t.name not in self.shared_names and not t.dtype.is_bool
                and aligned(s.index, t.shape, axis, vec) and (s.mask is None or not depends_on(s.mask, axis)))

    def load_lanes(self, loads: list[TileLoad], env: dict[str, str], vec: int) -> None:
        """Read each load's ``vec`` lanes at ``env`` (lane 0) into a register array."""
        self.lane_arrays = {}
        for x in loads:
            st = self.stype(x.tensor.dtype)
            arr = self.fresh("v")
            ctype, n = chunks(SIZEOF[st], vec)
            self.line(f"alignas(16) {st} {arr}[{vec}];")
            src = self.access(x.tensor, x.index, env)
            copy = " ".join(f"reinterpret_cast<{ctype}*>({arr})[{c}] = reinterpret_cast<const {ctype}*>(&{src})[{c}];"
                            for c in range(n))
            if x.mask is None:
                self.line(copy)
            else:
                other = self.to_storage(self.literal(x.other.value if x.other is not None else 0, x.tensor.dtype),
                                        x.tensor.dtype)
                self.line(f"if ({self.scalar(x.mask, env)}) {{ {copy} }} else {{ "
                          f"for (int pf_l = 0; pf_l < {vec}; ++pf_l) {arr}[pf_l] = {other}; }}")
            self.lane_arrays[x] = arr

    def lanes(self, env: dict[str, str], axis: str, vec: int):
        """``(lane, env of that lane)`` for each of ``vec`` consecutive elements from ``env``."""
        for v in range(vec):
            self.lane = v
            yield v, {**env, axis: f"({env[axis]} + {v})"}
        self.lane = None
