"""Small global temporaries that a loop updates in place stay in shared memory across it (CUDA, HIP).

A split-k decode partial rolls its statistics over the key tiles of its split: ``row_max_rf[.., j_0]`` and
``row_sum_rf[.., j_0]``, one number per query row, are read and written at every step at an index that does
not move with the step.  They live in global memory (the combine kernel reads them), so without this every
step's reads of them wait for the previous step's writes to come back from the L2 — several round trips
per step, each on the block's critical path.  Kept here, the loop reads and writes a shared-memory copy of
the tile it touches: the tile is read from global memory once before the loop and written back once after
it.

A tensor qualifies in a loop when it is a temporary in global memory (not an input or output, not in
shared memory already), the loop writes it but not with a product (a dot's accumulator: MHA decode's partial
``pv_rf`` of one row, kept, was slower in one measurement and no faster in a later one, whose profile shows the
loop bound by its barriers: benchmarks/results/2026-11-28_H200_c7a9948_refill), and
every access to it in the loop is unmasked, at one index (the same scalar indices and slices, whatever the
slices' axes are called) that does not depend on the loop's variable, of at most ``resident_elements``
elements (the options' ``resident_elements``).  :func:`plan` decides (the kernel plan records it);
:func:`load` and :func:`store` print the copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collections.abc import Callable, Mapping

from polyfuse.emit_cpp.dotplan import Frame
from polyfuse.ir.expr import Var
from polyfuse.ir.dtypes import DType
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop
from polyfuse.tiling.htile import Dot, Index, Slice, TileLoad, TileStore, walk_tile_expr, walk_tile_stmts

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

@dataclass(frozen=True)
class Resident:
    """The tile ``index`` of global ``tensor``, held in shared array ``name`` (row-major over the slices)."""

    tensor: str
    index: tuple[Index, ...]
    name: str
    dtype: DType

    @property
    def nbytes(self) -> int:
        return math.prod(self.extents) * max(1, self.dtype.bits // 8)

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple(i.size for i in self.index if isinstance(i, Slice))

    def at(self, env: dict[str, str], index: tuple[Index, ...]) -> str:
        """The element of the shared copy at an access ``index`` (one of the loop's) under ``env``."""
        slices = [i for i in index if isinstance(i, Slice)]
        text = ""
        for i, extent in zip(slices, self.extents, strict=True):
            text = env[i.axis] if not text else f"({text}) * {extent} + {env[i.axis]}"
        return text or "0"


def tile_shape(index: tuple[Index, ...]) -> tuple:
    """An access index with its slices' axis names left out (two accesses of one tile compare equal)."""
    return tuple(("slice", i.start, i.size) if isinstance(i, Slice) else ("at", i) for i in index)


def plan(frame: Frame, loop: Loop, registers: set[str], fresh: Callable[[str], str]) -> list[Resident]:
    """The temporaries of ``loop`` to keep in shared memory across it (``registers``: tensors of the loop's
    register accumulators, which stay out)."""
    if not frame.options.resident:
        return []
    accesses: dict[str, list] = {}
    written: set[str] = set()
    products: set[str] = set()
    for s in walk_tile_stmts(loop.body):
        if not isinstance(s, TileStore):
            continue
        accesses.setdefault(s.tensor.name, []).append(s)
        written.add(s.tensor.name)
        if any(isinstance(n, Dot) for n in walk_tile_expr(s.value)):
            products.add(s.tensor.name)
        exprs = [s.value, *([s.mask] if s.mask is not None else []),
                 *(i.start if isinstance(i, Slice) else i for i in s.index)]
        for x in exprs:
            for n in walk_tile_expr(x):
                if isinstance(n, TileLoad):
                    accesses.setdefault(n.tensor.name, []).append(n)
    kept = []
    for name in sorted(written):
        tensor = frame.tensors[name]
        found = accesses[name]
        if (tensor.role in (INPUT, OUTPUT) or name in frame.shared_names or name in registers or name in products
                or any(x.mask is not None for x in found)
                or any(isinstance(x, TileStore) and x.reducer for x in found)):
            continue
        first = tile_shape(found[0].index)
        if any(tile_shape(x.index) != first for x in found[1:]):
            continue
        if any(isinstance(n, Var) and n.name == loop.var.name
               for i in found[0].index for n in walk_tile_expr(i.start if isinstance(i, Slice) else i)):
            continue
        if math.prod(i.size for i in found[0].index if isinstance(i, Slice)) > frame.options.resident_elements:
            continue
        kept.append(Resident(name, found[0].index, fresh(f"kept_{name}"), tensor.dtype))
    return kept


def load(em: CudaEmitter, kept: list[Resident], offsets: Mapping[str, int]) -> None:
    """Declare the shared copies (at their planned ``offsets``) and read the tiles into them (before the loop)."""
    for r in kept:
        em.shared_array(em.stype(r.dtype), r.name, r.nbytes, offsets[r.name])
        em.line(f"// {r.tensor}: in shared memory across the loop")
        _each(em, r, lambda value, element: em.line(f"{element} = {value};"))
    if kept:
        em.barrier()


def store(em: CudaEmitter, kept: list[Resident]) -> None:
    """Write the shared copies back to the tensors (after the loop)."""
    if not kept:
        return
    em.barrier()
    for r in kept:
        _each(em, r, lambda value, element: em.line(f"{value} = {element};"))
    em.barrier()


def _each(em: CudaEmitter, r: Resident, body) -> None:
    """``body(global element, shared element)`` for each element of ``r``'s tile, spread over the threads."""
    slices = [i for i in r.index if isinstance(i, Slice)]
    total = math.prod(r.extents)
    em.element_loop(f"for (int pf_e = pf_tid; pf_e < {total}; pf_e += {em.threads})")
    env = {}
    stride = total
    for i in slices:
        stride //= i.size
        var = em.fresh("at")
        em.line(f"const int {var} = pf_e / {stride} % {i.size};")
        env[i.axis] = var
    body(em.access(em.tensors[r.tensor], r.index, env), f"{r.name}[pf_e]")
    em.close()
