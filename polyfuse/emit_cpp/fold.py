"""Split-k combines folded into their partial kernel's launch: the last block of a row combines.

Split-k distribution (:mod:`polyfuse.tiling.grid`) cuts a reduction into a *partial* kernel, one block per
(row, split), that writes each split's partial results to promoted temporaries in global memory, and a
*combine* kernel, one block per row (and column block, where the schedule spread it), that reads them.  Launched
one after the other, the combine waits for the whole partial grid, and small-batch decode pays two launches.

Folded, there is one launch.  Each block of the partial kernel writes its partials, makes them visible to the
device (``__threadfence``) and takes a ticket of its row (``atomicAdd`` on a counter per row); the block that
takes the last ticket (``splits - 1``) knows every other block of its row has finished, fences again (the
acquire side) and runs the combine of that row, its column blocks one after another.  The other blocks leave.

**Counters.** One ``int`` per row in global scratch (``pf_tickets_k<n>``, an argument after the temporaries).
The runtime zero-fills the buffer once, when it allocates it (:attr:`~polyfuse.emit_cpp.target.KernelSource.
zeroed`); the last block of a row resets its row's counter to 0 before it combines, so every launch leaves them
all at 0: no launch clears them, and a CUDA graph replays the kernel as it is.  (Only a launch that dies half-way
leaves them dirty, and then the scratch buffers are suspect anyway.)

**Legality** (:func:`plan_fold`, on the tile program; refused with the reason, and the two launches kept):

1. both nests are block kernels; the combine's grid loops start with loops of the partial's grid (the *row*),
   and the partial has grid loops beyond them (the *splits*); the combine's other grid loops (column blocks)
   are free of the splits' variables;
2. every temporary in global memory that the partial writes and the combine reads is indexed, in every store of
   the partial and every load of the combine, by each row loop's variable alone in one same dimension: a row's
   combine reads only elements that the blocks of that row write, and those are the blocks it waited for;
3. the combine writes no global tensor that the partial reads or writes (another row's blocks may still run);
4. the partial's warps do not trade registers (a producer warpgroup's ``setmaxnreg``): the combine runs on all
   the block's threads (checked on the partial's plan, :func:`refuse_for_plan`).

The combine is planned for the partial's threads; its shared memory reuses the partial's (the ticket's barrier
lies between them), so the kernel takes the larger of the two.

**Staged partials** (the options' ``stage_partials``).  The combine reads each row's partials from global memory,
statement after statement — the maximum, then the rescaled sums, then the rescaled columns — and its column
blocks one after another, each statement a round trip to the L2 on the critical path of the launch: the last
row's combine starts only when its last partial is written, and nothing else runs then.  Where each partial
tensor the combine reads is, in every read, at one index in its leading dimensions that depends on the row
alone, and whole in the rest (a contiguous block: decode's ``row_max_rf[b, i, h, 0, 0, 0, :]`` and ``pv_rf[b, i,
h, 0, 0, 0, :, :]``), the last block copies those blocks into shared memory at once (one round trip: 16 bytes at a
time, by ``cp.async`` where the device has it, or element by element where a row is not whole 16-byte pieces),
and the combine reads them there.  Planned where the copies
fit beside the combine's own shared memory without fewer blocks of the kernel on an SM; the copies are what
the global reads would have returned, so values are unchanged.  Example, decode attention (grid ``b, i, h``,
split ``j_0 < 4``; combine ``b, i, h`` and column block ``ax0_0 < 2``)::

    partial: store(row_max_rf[b, i, h, 0, 0, 0, j_0], ...)
    combine: ... load(row_max_rf[b, i, h, 0, 0, 0, :4@ax1]) ...

is one kernel of ``b·i·h·4`` blocks; the last of the four of a row runs ``for ax0_0 in 0..1: combine``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.fragment_values import constant
from polyfuse.emit_cpp.vector import VECTOR_BYTES
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import BinOp, Const, Expr, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import INPUT, TEMP, Tensor
from polyfuse.tiling.grid import CTA, GridNest
from polyfuse.tiling.htile import Gather, Index, Slice, TileLoad, TileStore, walk_tile_expr, walk_tile_stmts

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter
    from polyfuse.emit_cpp.plan import KernelPlan

TICKETS = "pf_tickets"
"""The prefix of a folded kernel's ticket counters (``pf_tickets_k0``)."""


@dataclass(frozen=True)
class GridAxis:
    """One grid loop of a kernel: its variable and extent."""

    var: Var
    extent: Expr

    def __str__(self) -> str:
        return f"{self.var.name} < {self.extent}"


@dataclass(frozen=True)
class StagedPartial:
    """The partials of one row that a folded combine reads, copied into shared array ``name`` (from byte
    ``offset``) before it: ``tensor`` at ``row`` in its leading dimensions, its last ``len(extents)`` whole."""

    tensor: Tensor
    row: tuple[Expr, ...]
    extents: tuple[int, ...]
    offset: int
    name: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.extents) * max(1, self.tensor.dtype.bits // 8)

    @property
    def end(self) -> int:
        """The shared-memory byte after the copy."""
        return self.offset + self.nbytes

    def describe(self) -> str:
        whole = ", ".join(":" for _ in self.extents)
        return (f"{self.tensor.name}[{', '.join(map(str, self.row))}, {whole}] ({self.nbytes} bytes at "
                f"{self.offset})")


@dataclass(frozen=True)
class CombineFold:
    """A combine run at the end of its partial kernel by the last block of each row.

    ``rows``: the grid loops the two nests share (one row: one counter); ``splits``: the partial's other grid
    loops (the blocks that take a ticket of a row); ``serial``: the combine's other grid loops, run one after
    another by the last block; ``counter``: the ticket array, one ``int`` per row.
    """

    rows: tuple[GridAxis, ...]
    splits: tuple[GridAxis, ...]
    serial: tuple[GridAxis, ...]
    counter: Tensor
    staged: tuple[StagedPartial, ...] = ()
    """The partials copied into shared memory before the combine (:func:`stage`); empty: read from memory."""
    copy_async: bool = False
    """Whether the 16-byte copies are ``cp.async`` (else loads and stores through registers)."""
    unstaged: str = ""
    """Why the combine reads its partials from memory (the options, their layout, or the shared memory)."""

    @property
    def split_count(self) -> Expr:
        return _product(lp.extent for lp in self.splits)

    def describe(self) -> str:
        rows = ", ".join(lp.var.name for lp in self.rows) or "the whole grid"
        splits = " x ".join(map(str, self.splits))
        serial = f", its column blocks {' x '.join(map(str, self.serial))} one after another" if self.serial else ""
        staged = (f"; the row's partials copied into shared memory first: {', '.join(p.describe() for p in self.staged)}"
                  if self.staged else f"; its partials read from memory: {self.unstaged}" if self.unstaged else "")
        return (f"split-k combine folded in: the last of the {splits} blocks of each row ({rows}) combines{serial}; "
                f"one ticket per row in {self.counter.name} (zeroed at allocation, reset by that block){staged}")


def plan_fold(partial: GridNest, combine: GridNest, name: str, tensors: dict[str, Tensor],
              shared: frozenset[str]) -> CombineFold | str:
    """The fold of ``combine`` into ``partial`` (the kernel ``name``), or why it is refused (conditions 1–3 of
    the module docstring)."""
    if partial.kind != CTA or combine.kind != CTA:
        return "the partial or the combine is not a block kernel"
    n = 0
    while (n < min(len(partial.chain), len(combine.chain)) and partial.chain[n].var == combine.chain[n].var
           and partial.chain[n].extent == combine.chain[n].extent):
        n += 1
    rows, splits, serial = partial.chain[:n], partial.chain[n:], combine.chain[n:]
    if not splits:
        return "the partial kernel has no grid loop beyond the combine's (no splits to wait for)"
    split_vars = {lp.var.name for lp in splits}
    for lp in serial:
        used = {v.name for v in walk_tile_expr(lp.extent) if isinstance(v, Var)}
        if lp.var.name in split_vars or used & split_vars:
            return f"the combine's grid loop {lp.var.name} < {lp.extent} depends on the splits"
    written, read = _accesses(partial.body, shared, tensors)
    c_written, c_read = _accesses(combine.body, shared, tensors)
    for t in sorted(set(c_written) & (set(written) | set(read))):
        return (f"the combine writes {t}, which the partial kernel accesses ({_where(written.get(t) or read[t])}): "
                f"blocks of other rows may still use it")
    for t in sorted(set(written) & set(c_read)):
        indices = written[t] + c_read[t]
        for lp in rows:
            if not _pinned(indices, lp.var):
                offending = next(i for i in indices if not _pinned([i], lp.var))
                return (f"the combine reads {t}[{', '.join(map(str, offending))}] of the partials: not indexed by "
                        f"the row's {lp.var.name} in the dimension its partials are written at, so a row's combine "
                        f"could read partials of blocks it does not wait for")
    count = _product(lp.extent for lp in rows)
    counter = Tensor(f"{TICKETS}_{name.rsplit('_', 1)[-1]}", (count,), dt.i32, TEMP)
    def axes(loops) -> tuple[GridAxis, ...]:
        return tuple(GridAxis(lp.var, lp.extent) for lp in loops)

    return CombineFold(axes(rows), axes(splits), axes(serial), counter)


def stage(fold: CombineFold, partial: GridNest, combine: GridNest, tensors: dict[str, Tensor],
          shared: frozenset[str], start: int) -> tuple[StagedPartial, ...] | str:
    """The partials of a row that the combine reads, laid out from byte ``start`` of shared memory (each at a
    16-byte boundary), or why they are read from memory: each must be read, in every read, at one index of its
    leading dimensions that depends on the row's variables alone, and whole in the rest (constant extents)."""
    written, _ = _accesses(partial.body, shared, tensors)
    _, c_read = _accesses(combine.body, shared, tensors)
    row_vars = {a.var.name for a in fold.rows}
    staged: list[StagedPartial] = []
    offset = -(-start // VECTOR_BYTES) * VECTOR_BYTES
    for name in sorted(set(written) & set(c_read)):
        tensor, indices = tensors[name], c_read[name]
        lead = 0
        while lead < len(tensor.shape) and _row_index([i[lead] for i in indices], row_vars):
            lead += 1
        dims = [constant(simplify(d)) for d in tensor.shape[lead:]]
        if lead == 0 or not dims:
            return f"the combine reads {name} at indices not pinned by the row ({_where(indices)})"
        if any(d is None for d in dims):
            return f"{name}'s dimensions past the row are not constants"
        extents = tuple(int(d.value) for d in dims)  # type: ignore[union-attr]
        part = StagedPartial(tensor, tuple(indices[0][:lead]), extents, offset, f"pf_staged_{name}")
        staged.append(part)
        offset += -(-part.nbytes // VECTOR_BYTES) * VECTOR_BYTES
    if not staged:
        return "the combine reads no partials"
    return tuple(staged)


def _row_index(column: list[Index], row_vars: set[str]) -> bool:
    """Whether every read has the same index in this dimension, an expression of the row's variables alone."""
    first = column[0]
    if isinstance(first, (Slice, Gather)) or any(i != first for i in column[1:]):
        return False
    return all(v.name in row_vars for v in walk_tile_expr(first) if isinstance(v, Var))


def serial_blocks(fold: CombineFold) -> int | None:
    """How many blocks of the combine the last block of a row runs one after another (None: not a number)."""
    count = _product(a.extent for a in fold.serial)
    return count.value if isinstance(count, Const) else None


def refuse_for_plan(plan: KernelPlan) -> str:
    """Why the partial kernel as planned cannot run a combine after its body (condition 4), or ``""``."""
    if any(lp.fragments is not None and lp.fragments.producer for lp in plan.loops.values()):
        return ("the partial kernel's producer warpgroup gives its registers away (setmaxnreg): the combine "
                "cannot run on all the block's threads")
    return ""


def emit(em: CudaEmitter, fold: CombineFold, combine: KernelPlan) -> None:
    """After the partial's body: the ticket of the block's row, then, in the last block only, the combine."""
    counter = fold.counter.name
    row = "0"
    for lp in fold.rows:
        row = lp.var.name if row == "0" else f"({row}) * {em.scalar(lp.extent, {})} + {lp.var.name}"
    em.line(f"// {fold.describe()}")
    em.line("__threadfence();  // this block's partials, visible to the block that combines them")
    em.barrier()
    em.line("int pf_ticket = 0;")
    em.open("if (pf_tid == 0)")
    em.line(f"pf_ticket = atomicAdd(&{counter}[{row}], 1);")
    em.line("__threadfence();  // the other blocks' partials, seen by this block's reads below")
    em.close()
    em.line(f"if (!__syncthreads_or(pf_tid == 0 && pf_ticket == {em.scalar(fold.split_count, {})} - 1)) return;")
    em.line(f"if (pf_tid == 0) {counter}[{row}] = 0;  // the next launch's tickets start at 0")
    em.scratch = 0
    _copy_staged(em, fold)
    t = em.widths.loop
    for lp in fold.serial:
        v = lp.var.name
        em.open(f"for ({t} {v} = 0; {v} < {em.scalar(lp.extent, {})}; ++{v})")
    outer, em.staged = em.staged, {p.tensor.name: p for p in fold.staged}
    em.nest_part(combine, scoped=True)
    em.staged = outer
    for _ in fold.serial:
        em.barrier()  # the next column block reuses the shared memory
        em.close()


def _copy_staged(em: CudaEmitter, fold: CombineFold) -> None:
    """The row's partials into their shared arrays, every copy issued before any is waited for."""
    if not fold.staged:
        return
    em.line("// the row's partials, into shared memory at once")
    for p in fold.staged:
        ctype = em.stype(p.tensor.dtype)
        em.line(f"{ctype}* {p.name} = reinterpret_cast<{ctype}*>(pf_smem + {p.offset});")
        em.peak = max(em.peak, p.end)
    for p in fold.staged:
        src = em.access(p.tensor, p.row + (Const(0, dt.i64),) * len(p.extents), {})
        # 16 bytes at a time where the row is whole 16-byte pieces (it starts at a multiple of its size), else
        # element by element through registers
        vector = p.nbytes % VECTOR_BYTES == 0
        unit = "uint4" if vector else em.stype(p.tensor.dtype)
        count = p.nbytes // VECTOR_BYTES if vector else math.prod(p.extents)
        em.open("")
        em.line(f"const {unit}* pf_from = reinterpret_cast<const {unit}*>(&{src});")
        em.line(f"{unit}* pf_to = reinterpret_cast<{unit}*>({p.name});")
        em.line("#pragma unroll 4")
        em.open(f"for (int pf_g = pf_tid; pf_g < {count}; pf_g += {em.threads})")
        em.line("pf::cp_async16(&pf_to[pf_g], &pf_from[pf_g], true);" if vector and fold.copy_async
                else "pf_to[pf_g] = pf_from[pf_g];")
        em.close()
        em.close()
    if fold.copy_async and any(p.nbytes % VECTOR_BYTES == 0 for p in fold.staged):
        em.line("pf::cp_async_commit();")
        em.line("pf::cp_async_wait<0>();")
    em.barrier()


def staged_access(p: StagedPartial, idx: list[str]) -> str:
    """The element of ``p``'s shared copy at the access indices ``idx`` of its whole dimensions (32-bit)."""
    text = ""
    for extent, i in zip(p.extents, idx, strict=True):
        text = f"({i})" if not text else f"({text} * {extent} + {i})"
    return f"{p.name}[{text}]"


def _accesses(body, shared: frozenset[str], tensors: dict[str, Tensor]
              ) -> tuple[dict[str, list[tuple[Index, ...]]], dict[str, list[tuple[Index, ...]]]]:
    """(stores, loads) of the global tensors of ``body`` other than inputs: the index of each access, by tensor."""
    written: dict[str, list[tuple[Index, ...]]] = {}
    read: dict[str, list[tuple[Index, ...]]] = {}

    def global_(t: Tensor) -> bool:
        return t.name not in shared and tensors.get(t.name, t).role != INPUT

    for s in walk_tile_stmts(body):
        if not isinstance(s, TileStore):
            continue
        if global_(s.tensor):
            written.setdefault(s.tensor.name, []).append(s.index)
        for e in (s.value, *([s.mask] if s.mask is not None else [])):
            for x in walk_tile_expr(e):
                if isinstance(x, TileLoad) and global_(x.tensor):
                    read.setdefault(x.tensor.name, []).append(x.index)
    return written, read


def _pinned(indices: list[tuple[Index, ...]], var: Var) -> bool:
    """Whether one dimension holds ``var`` alone in every index of ``indices``."""
    common = None
    for index in indices:
        at = {d for d, i in enumerate(index) if i == var}
        common = at if common is None else common & at
    return bool(common)


def _where(indices: list[tuple[Index, ...]]) -> str:
    return f"[{', '.join(map(str, indices[0]))}]"


def _product(extents) -> Expr:
    out: Expr | None = None
    for e in extents:
        out = e if out is None else BinOp("*", out, e)
    return Const(1, dt.i64) if out is None else simplify(out)
