"""Rows streamed through a block: a row kernel on chip whose outputs are all one value per row takes several rows
per block and loads the next row while it reduces the current one (CUDA, HIP).

A row kernel on chip (:mod:`~polyfuse.emit_cpp.onchip`) issues every load of its row, waits for all of them, then
reduces the row (block reductions, barriers) with no load in flight.  With one block per row, the blocks of an SM
start together, share the SM's part of the bandwidth and so receive their rows at about the same time, and then
all reduce at once: the SM's memory requests drain to nothing once per wave of blocks, and a grid of a few waves
pays that several times.  A kernel that also writes its row does not: its stores drain while the next blocks
load.  Little's law says what has to stay in flight: bandwidth × latency, about 3 TB/s × 1 µs ≈ 3 MB over an
H100's 132 SMs, ~24 KB per SM; a block's next row (16 KB for 4096 f32) is of that order.

So where every output is one value per row (no row tile is written), the kernel is printed as::

    (the block's first row, blockIdx.x, loaded into the `_next` registers)
    for (int64_t pf_row = blockIdx.x; pf_row < pf_rows; pf_row += gridDim.x) {
        (the row tiles read from memory) = (their `_next` registers)     // waits for this row's loads
        (the grid loops' values of pf_row)
        if (pf_row + gridDim.x < pf_rows)
            (the row pf_row + gridDim.x loaded into the `_next` registers)  // in flight during what follows
        (the steps of the one-row kernel on the current registers)
        (barrier: the next row reuses the block reductions' partials)
    }

with ``min(rows, grid)`` blocks, ``grid`` the blocks that reside on the device at once: the device's SMs times the
blocks per SM that the row tiles plus the next row's registers plus :data:`~polyfuse.emit_cpp.onchip.
RESERVED_REGISTERS` leave room for (``__launch_bounds__`` asks for them), at most what the threads, the shared
memory and the device's block limit allow.  Each row is reduced exactly as the one-row kernel reduces it (the same
steps, the same order), so results are bitwise those of ``stream_rows=False``.  :func:`plan` decides and records
why not; the options' ``stream_rows`` turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.device import DeviceSpec
from polyfuse.emit_cpp import onchip
from polyfuse.emit_cpp.cfamily import SIZEOF, STORAGE_TYPES
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.ir.expr import Var
from polyfuse.tiling.parallel import unit_loop
from polyfuse.tiling.htile import Gather, TileLoad, walk_tile_expr

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter
    from polyfuse.emit_cpp.plan import KernelPlan


@dataclass(frozen=True)
class RowStream:
    """``grid`` blocks (``blocks_per_sm`` per SM), each taking the rows ``blockIdx.x + k·gridDim.x`` in turn with
    the next row's loads (``next_bytes`` per block) in flight while it reduces the current one; ``registers``
    per thread for the row tiles and the next row's."""

    blocks_per_sm: int
    grid: int
    registers: int
    next_bytes: int

    def describe(self) -> str:
        return (f"rows streamed: every output is one value per row, so a grid of {self.grid} blocks "
                f"({self.blocks_per_sm} per SM) takes rows blockIdx.x, + gridDim.x, ..., each block loading its "
                f"next row ({self.next_bytes} bytes) before it reduces the current one; {self.registers} registers "
                f"per thread for the row tiles and the next row")


def plan(kernel: KernelPlan, device: DeviceSpec, options: CodegenOptions) -> RowStream | str:
    """Whether ``kernel`` (its rows on chip) streams its rows (see the module docstring), or why not."""
    rows = kernel.rows
    assert isinstance(rows, onchip.RowsOnChip)
    if not options.stream_rows:
        return "off (CodegenOptions.stream_rows)"
    if any(t.stored for t in rows.tiles):
        return "the kernel writes a row (its stores keep memory busy while the next blocks load)"
    if rows.blocks_per_sm == 1:
        return "the row tiles take the registers of one block per SM: none are left for a next row"
    if kernel.fold is not None or kernel.heavy_first is not None:
        return "the blocks' order is the plan's (a folded combine, or the heaviest blocks first)"
    if all(unit_loop(lp) for lp in kernel.nest.chain):
        return "one row in all (no grid loop)"
    if any(isinstance(i, Gather) for s in rows.stores for n in walk_tile_expr(s.value) if isinstance(n, TileLoad)
           for i in n.index):
        return "a row is read through a gather"
    loaded = [t for t in rows.tiles if t.loaded]
    per_row = rows.slots * rows.vec
    following = sum(per_row * -(-SIZEOF[STORAGE_TYPES[t.dtype]] // 4) for t in loaded)
    registers = rows.registers + following
    # (at least one: the row tiles fit the registers of two blocks per SM, so one block holds them and a next row)
    by_registers = device.registers_per_sm // ((registers + onchip.RESERVED_REGISTERS) * rows.threads)
    blocks = min(by_registers, device.resident_blocks(kernel.peak, rows.threads), device.max_blocks_per_sm)
    next_bytes = sum(rows.length * SIZEOF[STORAGE_TYPES[t.dtype]] for t in loaded)
    return RowStream(blocks, blocks * device.sms, registers, next_bytes)


def of(kernel: KernelPlan) -> RowStream | None:
    """The kernel's streamed rows, if its plan has them."""
    rows = kernel.rows
    return rows.stream if isinstance(rows, onchip.RowsOnChip) and isinstance(rows.stream, RowStream) else None


def emit(em: CudaEmitter, kernel: KernelPlan) -> None:
    """The body of ``kernel`` with its rows streamed (the loop of the module docstring)."""
    rows = kernel.rows
    assert isinstance(rows, onchip.RowsOnChip)
    chain = kernel.nest.chain
    em.line(f"const int64_t pf_rows = {' * '.join(f'({em.scalar(lp.extent, {})})' for lp in chain)};")
    state = onchip.declare(em, rows)
    for ctype, arr in onchip.loaded_arrays(state):
        em.line(f"alignas(16) {ctype} {arr}_next[{rows.slots * rows.vec}];")
    names = {lp.var.name: f"pf_next_{lp.var.name}" for lp in chain}
    following = {lp.var.name: Var(names[lp.var.name], lp.var.type) for lp in chain}
    em.line("// rows streamed: this block's rows in turn, the next one loaded while this one is reduced")
    em.open("")
    em.decode_grid(kernel, "blockIdx.x", "pf_nbid", names)
    onchip.load(em, state, following, "_next")
    em.close()
    em.open("for (int64_t pf_row = blockIdx.x; pf_row < pf_rows; pf_row += gridDim.x)")
    onchip.advance(em, state, "_next")
    em.decode_grid(kernel, "pf_row", "pf_bid", {})
    em.open("if (pf_row + gridDim.x < pf_rows)")
    em.decode_grid(kernel, "pf_row + gridDim.x", "pf_nbid", names)
    onchip.load(em, state, following, "_next")
    em.close()
    em.nest_part(kernel, rows_state=state)
    if rows.threads > em.warp:
        em.barrier()
    else:
        em.warp_barrier()
    em.close()
