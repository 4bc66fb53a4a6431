"""Row groups: consecutive per-row statements of a thread block computed in one pass (CUDA, HIP).

A *row statement* stores one value per row of a tile — its index has one tile axis, the row
axis — possibly reducing along another axis: a rolling update's statistics (``m = max(m, max_j
s)``, ``s' = s·exp(m - m') + Σ_j exp(x - m')``, the saved previous maximum), a combine over
splits.  Emitted one by one (:meth:`CudaEmitter.store`), each statement is a pass of its own:
its reductions go through shared memory, its elementwise part runs on as many threads as it has
rows (16 of 256 for a decode head group), and a barrier follows each.  A rolling loop of
attention has four of them per key tile.

A run of row statements over the same row axis is emitted as one pass instead.  The block's
threads are split into ``R`` groups of ``L`` lanes (``L`` a power of two, at most a warp), one
group per row; every lane of a group evaluates the group's statements for its row, in order.
With fewer rows than that fills (decode's one query row of a head — a statement with no tile axis —
or two), each row gets a warp and the warps past the rows sit the pass out, where no reduction of
the group is longer than the block has threads:

* a reduction along another axis runs on the row's lanes, each taking every ``L``-th element,
  and combines them by xor shuffles, so every lane ends with the row's result (where the block's
  own reduction would span warps, each lane plays several of its threads: :func:`_virtual_reduce`);
* a statement's value stays in a register, and later statements of the group that read the
  tensor it writes, at the element it writes, read the register instead;
* after all statements, lane 0 of each row stores the values (after a warp barrier, so that no
  lane still reads an old value it overwrites).

Every value is computed by the same expression, in the same order, as in the statement-by-statement
code: a reduction runs on ``min(L, length)`` lanes (``length`` rounded up to a power of two), each
lane combining every such element (a few neighbours at once where they can be read as one vector),
then by a butterfly of shuffles, as :meth:`CudaEmitter.block_reduce` does (so the same bits, where the
compiler does not contract multiply-adds: ``fp_contract`` may fuse the two codes' products differently).
The group needs every read,
within it, of a tensor it writes to be of the written element: a statement that reads another
row's value starts a new pass.  Tensors written before the group are read from memory, published
by the barrier that ends every pass.

Row statements are also moved up, past independent statements (no tensor one writes is read or
written by the other), to join the row statements before them: the rolling update's row sum
joins its row maximum ahead of the value product.  With the product's repair factor computed per
fragment row (:meth:`CudaEmitter.dot_in_place`), MLA decode's loop has five block barriers per key
tile instead of ten; global decode's (one row) six instead of thirteen.  :func:`reorder` and
:func:`split` decide (the kernel plan records the groups, the options' ``row_groups`` turns them
off); :func:`emit` prints one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.cfamily import _REDUCE_INIT, COMPUTE_TYPES, STORAGE_TYPES, axis_var, reduce_lanes
from polyfuse.emit_cpp.dotplan import Frame
from polyfuse.ir.stmt import Stmt
from polyfuse.tiling.htile import (
    Dot, Reduce, Slice, TileLoad, TileStore, axes_of, axis_sizes, tensors_read, walk_tile_expr,
)

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter


@dataclass(frozen=True)
class RowGroup:
    """Row statements over ``rows`` rows of ``axis`` computed in one pass, ``lanes`` lanes per row."""

    stores: tuple[TileStore, ...]
    axis: str
    rows: int
    lanes: int

    def describe(self) -> str:
        rows = f"{self.rows} rows of {self.axis}" if self.axis else "one row"
        return f"row group {', '.join(s.block for s in self.stores)}: {rows}, {self.lanes} lanes each"


def row_axis(frame: Frame, s: Stmt) -> tuple[str, int] | None:
    """``(axis, rows)`` if ``s`` is a row statement the block can compute in a row group, else None; a statement
    with no tile axis (one row per block) is ``("", 1)``."""
    if not isinstance(s, TileStore) or s.mask is not None or s.reducer is not None:
        return None
    axes = [i for i in s.index if isinstance(i, Slice)]
    if len(axes) > 1 or STORAGE_TYPES[s.tensor.dtype.name] != COMPUTE_TYPES[s.tensor.dtype.name]:
        return None
    axis, rows = (axes[0].axis, axes[0].size) if axes else ("", 1)
    sizes = axis_sizes(s)
    longest = max((sizes[n.axis] for n in walk_tile_expr(s.value) if isinstance(n, Reduce)), default=0)
    if _lanes(frame, rows, longest) is None:
        return None
    for n in walk_tile_expr(s.value):
        if isinstance(n, Dot):
            return None
        if isinstance(n, Reduce):
            if n.axis == axis or set(axes_of(n)) - {axis}:
                return None
            if any(isinstance(m, (Reduce, Dot)) for m in walk_tile_expr(n.tile)):
                return None
    if set(axes_of(s.value)) - {axis}:
        return None
    if any(isinstance(n, TileLoad) and n.tensor.name == s.tensor.name and n.index != s.index
           for n in walk_tile_expr(s.value)):
        return None
    return axis, rows


def _lanes(frame: Frame, rows: int, longest: int = 0) -> int | None:
    """Lanes per row: a power of two, at most a warp, with the groups using at least ¾ of the block; or, with
    fewer rows (decode's one query row, or two), a warp per row where no reduction of the group is longer than
    the block has threads (each lane then takes the items of ``threads / warp`` of the block's threads:
    :func:`_virtual_reduce`; the warps past the rows sit the pass out).  The block's reductions of such rows
    pay two barriers and a thread-0 pass each; longer ones (a row kernel's chunk) keep the whole block."""
    if rows > frame.threads:
        return None
    lanes = _lanes_per_row(frame, rows)
    if rows * lanes * 4 >= frame.threads * 3:
        return lanes
    return lanes if lanes == frame.warp and longest <= frame.threads else None


def _lanes_per_row(frame: Frame, rows: int) -> int:
    return min(frame.warp, reduce_lanes(frame.threads, rows))


def _independent(a: Stmt, b: Stmt) -> bool:
    if not (isinstance(a, TileStore) and isinstance(b, TileStore)):
        return False
    wa, wb = a.tensor.name, b.tensor.name
    return wa != wb and wa not in tensors_read(b) and wb not in tensors_read(a)


def reorder(frame: Frame, stmts: list[Stmt]) -> list[Stmt]:
    """Move each row statement up past independent statements to the row statement before them, if any."""
    keys = {id(s): row_axis(frame, s) for s in stmts}
    out: list[Stmt] = []
    for s in stmts:
        key = keys[id(s)]
        at = len(out)
        if key is not None:
            while at > 0 and keys[id(out[at - 1])] is None and _independent(out[at - 1], s):
                at -= 1
            if not (at > 0 and keys[id(out[at - 1])] == key):
                at = len(out)
        out.insert(at, s)
    return out


def split(frame: Frame, stmts: list[Stmt]) -> list[Stmt | RowGroup]:
    """``stmts`` with each run of row statements that can share a pass replaced by a :class:`RowGroup`."""
    out: list[Stmt | RowGroup] = []
    run: list[TileStore] = []
    key: tuple[str, int] | None = None

    def flush() -> None:
        if run:
            assert key is not None
            lanes = _lanes_per_row(frame, key[1])
            out.append(RowGroup(tuple(run), key[0], key[1], lanes))
        run.clear()

    for s in stmts:
        k = row_axis(frame, s) if frame.options.row_groups else None
        if k is None:
            flush()
            out.append(s)
            key = None
            continue
        assert isinstance(s, TileStore)
        if k != key or not _joins(run, s):
            flush()
        run.append(s)
        key = k
    flush()
    return out


def _joins(run: list[TileStore], s: TileStore) -> bool:
    """Whether ``s`` can follow ``run`` in one pass: within the run plus ``s``, every read of a tensor
    the run or ``s`` writes is of the element its writer writes."""
    written = {t.tensor.name: t.index for t in [*run, s]}
    for t in [*run, s]:
        for n in walk_tile_expr(t.value):
            if isinstance(n, TileLoad) and n.tensor.name in written and n.index != written[n.tensor.name]:
                return False
    return True


def emit(em: CudaEmitter, row_group: RowGroup) -> None:
    """One pass computing ``row_group`` (row statements over one row axis; see :func:`split`)."""
    group, axis, rows, lanes = row_group.stores, row_group.axis, row_group.rows, row_group.lanes
    em.line(f"// row group: {', '.join(s.block for s in group)}")
    em.open("")
    em.line(f"const int pf_rl = pf_tid % {lanes}, pf_rr = pf_tid / {lanes};")
    idle = lanes == em.warp and rows * lanes < em.threads
    if idle:
        # Whole warps past the rows sit the pass out (a warp-uniform test: their shuffles are not needed), so that
        # none reads a value lane 0 of its row is storing.
        em.open(f"if (pf_rr < {rows})")
    env = {}
    if axis:
        row = axis_var(axis)
        em.line(f"const int {row} = pf_rr;" if idle else
                f"const int {row} = pf_rr < {rows} ? pf_rr : {rows - 1};  // lanes past the rows repeat the last")
        env = {axis: row}
    forwarded: list = []
    values: list[tuple[TileStore, str]] = []
    for s in group:
        em.sizes = {**getattr(em, "sizes", {}), **axis_sizes(s)}
        em.materialized = {}
        reduced: list[Reduce] = []
        for n in walk_tile_expr(s.value):
            if isinstance(n, Reduce) and n not in reduced and n not in em.overrides:
                reduced.append(n)
        for n in reduced:  # (no reduction holds another: row_axis)
            acc, ct = em.fresh("acc"), em.reduce_type(n)
            length = em.sizes[n.axis]
            width = reduce_lanes(em.threads, rows, length)  # block_reduce's lanes: the same order
            if width > em.warp:
                _virtual_reduce(em, n, env, acc, ct)
            else:
                width = min(lanes, width)
                em.line(f"{ct} {acc} = {_REDUCE_INIT[n.op]};")
                em.reduce_items(n, env, acc, ct, f"pf_rl % {width}" if width < lanes else "pf_rl", width)
                if width > 1:
                    em.shuffle_combine(n.op, acc, ct, width)
            em.overrides[n] = em.reduce_result(n, acc)
        value = em.convert(em.scalar(s.value, env), s.value.dtype, s.tensor.dtype)
        for n in reduced:
            del em.overrides[n]
        reg = em.fresh("g")
        em.line(f"const {em.ctype(s.tensor.dtype)} {reg} = {value};")
        values.append((s, reg))
        for t in group:
            for n in walk_tile_expr(t.value):
                if isinstance(n, TileLoad) and n.tensor.name == s.tensor.name and n.index == s.index and n.mask is None:
                    em.overrides[n] = reg
                    forwarded.append(n)
    for n in forwarded:
        em.overrides.pop(n, None)
    em.warp_barrier()
    em.open(f"if (pf_rl == 0 && pf_rr < {rows})")
    for s, reg in values:
        em.line(f"{em.access(s.tensor, s.index, env)} = {reg};")
    em.close()
    if idle:
        em.close()
    em.close()
    em.barrier()
    em.materialized = {}


def _virtual_reduce(em: CudaEmitter, n: Reduce, env: dict[str, str], acc: str, ct: str) -> None:
    """``acc`` = the reduction ``n`` of one row on one warp, in :meth:`CudaEmitter.block_reduce`'s order for a
    reduction that spans the block: lane ``l`` plays the block's threads ``l + w·warp`` (``w`` < warps), each
    taking every ``threads``-th item from its index; each of those partials is combined by the warp's
    butterfly, and the warps' results left to right — the same operations on the same values, so the same
    bits, with no shared memory and no barrier."""
    warps = em.threads // em.warp
    parts = [em.fresh("acc") for _ in range(warps)]
    for w, part in enumerate(parts):
        em.line(f"{ct} {part} = {_REDUCE_INIT[n.op]};")
        em.reduce_items(n, env, part, ct, f"(pf_rl + {w * em.warp})", em.threads)
        em.shuffle_combine(n.op, part, ct, em.warp)
    em.line(f"{ct} {acc} = {parts[0]};")
    for part in parts[1:]:
        em.line(f"{acc} = {em.combine(n.op, acc, part, ct)};")
