"""Rows a reduction kernel reads once: their loads carry the cache-streaming hint (evicted first from L1 and L2).

A row kernel whose rows stay on chip (:mod:`~polyfuse.emit_cpp.onchip`) loads each element of its input once.
Kept in the L2 at the normal priority, those lines push out lines that are still useful — the dirty lines the
kernel before wrote among them, which must then be written back while this kernel streams its input in.  Loaded
*evict first* into registers (``ld.global.cs``), a streamed line is the first to go.  The hint changes no value,
only which lines the caches drop first (HIP: plain loads).

The rule (:func:`streamed`, recorded in the kernel plan): a block kernel whose rows stay on chip in the
registers of two or more resident blocks per SM and which writes no row back — its outputs are values per row
(``logsumexp``, ``l2norm_stable``, ``variance``, ``sum_sum``) — streams each tensor it does not write, reads as
one row tile held in registers, and reads at most once over the whole launch: the map from the grid loops and
the tile's slice to the element's index is injective, proven by ISL whatever the program's parameters (a weight
that every row reads is not; an index ISL cannot write, a gather, keeps the normal loads).  Kernels that also
write their rows (``softmax``, ``rmsnorm_amax``), rows so long that one block takes an SM (32768 f32, in
registers or copied into shared memory with an evict-first ``L2::cache_hint``) and decode's key and value copies
measured slower with the hint, so they keep the normal loads
(benchmarks/results/2026-11-29_H200_8b60573_streaming).
"""

from __future__ import annotations

from collections.abc import Sequence

import islpy as isl

from polyfuse.emit_cpp import onchip
from polyfuse.ir.stmt import Loop
from polyfuse.tiling.htile import Gather, Slice, TileLoad, walk_tile_expr
from polyfuse.tiling.space import NotAffine, Space


def streamed(grid: Sequence[Loop], params: Sequence[str], rows: onchip.RowsOnChip | str) -> frozenset[str]:
    """The tensors a kernel with grid loops ``grid`` and rows-on-chip plan ``rows`` streams (see the module
    docstring); ``params``: the program's size parameters."""
    if not isinstance(rows, onchip.RowsOnChip) or any(t.stored for t in rows.tiles) or rows.blocks_per_sm < 2:
        return frozenset()
    in_registers = {(t.tensor, t.index) for t in rows.tiles if t.loaded and not t.in_shared}
    written = {s.tensor.name for s in rows.stores}
    sites: dict[str, list[TileLoad]] = {}
    for s in rows.stores:
        exprs = [s.value, *([s.mask] if s.mask is not None else []),
                 *(i.start if isinstance(i, Slice) else i for i in s.index if not isinstance(i, Gather))]
        for x in exprs:
            for n in walk_tile_expr(x):
                if isinstance(n, TileLoad) and n.tensor.name not in written:
                    sites.setdefault(n.tensor.name, []).append(n)
    # One register load of a row tile, whatever statements read it: one key per tensor.
    return frozenset(name for name, loads in sites.items()
                     if len({onchip.row_tile_key(n) for n in loads}) == 1
                     and onchip.row_tile_key(loads[0]) in in_registers
                     and _read_once(grid, loads[0], params))


def _read_once(grid: Sequence[Loop], load: TileLoad, params: Sequence[str]) -> bool:
    """Whether ``load`` reads each element of its tensor at most once over the blocks of ``grid``."""
    if any(isinstance(i, Gather) for i in load.index):
        return False
    slices = [i for i in load.index if isinstance(i, Slice)]
    space = Space(list(params), list(grid), [i.axis for i in slices])
    try:
        terms = [f"{space.term(i.start)} + a_{i.axis}" if isinstance(i, Slice) else space.term(i)
                 for i in load.index]
        where = space.iterations().intersect(space.box({i.axis: i.size for i in slices}))
    except NotAffine:
        return False
    mapping = isl.Map(f"{space.prefix}{{ [{', '.join(space.dims)}] -> [{', '.join(terms)}] }}")
    return mapping.intersect_domain(where).is_injective()
