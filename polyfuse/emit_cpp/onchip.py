"""Rows kept on chip: a block kernel whose whole body works on one row loads the row once into registers.

A row kernel after fusion without a rolling loop (one block per row; ``softmax``: ``s_max``, ``s_exp``,
``s_sum``, ``s_norm``) reads its row in several statements, each a pass through memory, and ends each
statement with a barrier.  Where every row tile the kernel holds fits in the registers of the block's threads,
it is printed instead as:

1. every 16-byte load of the row issued up front into per-thread register arrays (thread ``t`` holds the
   vectors ``t, t + T, t + 2T, …`` of ``vec`` elements: the layout every statement then uses);
2. each statement in program order, from registers: a reduction along the row accumulates the thread's
   elements, then the pending reductions are combined in *one* block reduction (a butterfly of shuffles per
   warp, one partial per warp in shared memory, one barrier; every thread combines the partials in warp order,
   so all hold the same result) as late as possible — just before the first statement that reads one of
   them, so that independent reductions share one barrier; a reduction nested in another (``sum_sum``'s
   scale inside its second sum) is combined first, one level at a time;
3. an elementwise row statement computes into registers; its row is written with 16-byte stores if it is not
   a temporary of the block (``softmax``'s ``xexp`` lives in registers only, never in shared memory);
   a scalar statement is computed by every thread and written by thread 0.

Reductions run in another order than the rolling loop's (per thread, then per warp, then across warps): f32
sums differ by rounding within the terms the operators' tolerance notes already give for reordered f32
sums; max/min/or are exact.  Two-pass statistics from registers need no repair factor.

Where the row tiles do not fit the registers of two blocks per SM (rows of 32768 f32: 128 registers per thread
and tile at 256 threads), the block gets the device's most threads (:func:`warps_for`) and the register budget
of one block per SM: the tiles it holds stay in registers, in program order, and the rest live in shared memory
— the row itself, each thread's vectors at their own places, so that a thread only reads back what it wrote and
no barrier is needed (filled by ``cp.async`` where the device has it; read and written 16 bytes at a time).  The
row is still read from memory once.  Rows that fit neither (65536 f32: 256 KB a tile) stay in memory, and the
plan says why.

The kernel plan asks :func:`plan` for every block kernel (the options' ``rows_on_chip`` turns it off); the
default GPU schedules (:mod:`polyfuse.ops.schedules`) build the row kernel without rolling, plan it, and keep
it where every kernel's rows went on chip, else roll over chunks.  :func:`warps_for` gives short rows fewer
warps (down to one warp per row: no shared memory and no block barrier at all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.device import DeviceSpec
from polyfuse.emit_cpp.cfamily import _REDUCE_INIT, COMPUTE_TYPES, SIZEOF, STORAGE_TYPES, align16
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.emit_cpp.reciprocal import RowDivision, row_divisions
from polyfuse.emit_cpp.vector import VECTOR_BYTES, aligned, chunks
from polyfuse.ir.expr import BinOp, Const, Expr
from polyfuse.ir.stmt import Seq, Stmt
from polyfuse.tiling.htile import (
    Dot, Iota, Reduce, Slice, TileLoad, TileStore, axes_of, tile_children, walk_tile_expr,
)
from polyfuse.transforms.ranges import ValueRange

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

RESERVED_REGISTERS = 32
"""32-bit registers per thread left to everything but the row tiles (indices, accumulators, addresses)."""
SHARED_RESERVE = 4096
"""Bytes of shared memory per block left to the kernel's temporaries and block-reduction partials when row
tiles are placed in shared memory (:func:`plan`)."""
SLOTS_PER_THREAD = 4
"""Vectors per thread a short row is spread to before the block gets more warps (:func:`warps_for`)."""


@dataclass(frozen=True)
class RowTile:
    """A row of ``tensor`` at ``index`` (its one slice's axis renamed ``""``) held in registers: ``loaded`` up
    front from memory, or computed by a statement of the kernel and ``stored`` to memory unless it is a
    temporary of the block."""

    tensor: str
    index: tuple
    dtype: str
    loaded: bool
    stored: bool
    shared_at: int | None = None
    """Where registers cannot hold it: the byte offset of the row in shared memory (each thread's vectors at
    their own places in the row, so that only the thread that wrote an element reads it: no barrier)."""

    @property
    def in_shared(self) -> bool:
        return self.shared_at is not None


@dataclass(frozen=True)
class Accumulate:
    """Each thread's partials of the reductions of level ``level`` of statement ``block`` (level 0 holds no
    other reduction; level ``k`` reads the results of level ``k - 1``)."""

    block: str
    level: int


@dataclass(frozen=True)
class Combine:
    """One block reduction of the pending partials ``items`` (``(block, level)``), their per-warp partials at
    byte ``at`` of shared memory (``nbytes``; none with a single warp); then the values of ``finished``, the
    statements of one value per row whose reductions it completes."""

    items: tuple[tuple[str, int], ...]
    at: int
    nbytes: int
    finished: tuple[str, ...]


@dataclass(frozen=True)
class RowsOnChip:
    """The plan of a block kernel whose rows stay on chip: ``length`` elements per row, ``vec`` per access,
    ``slots`` vectors per thread, the row tiles, and the steps in order: :class:`Accumulate`, :class:`Combine`,
    or a statement whose value is computed there (a row into registers, or one value per row)."""

    stores: tuple[TileStore, ...]
    length: int
    vec: int
    slots: int
    threads: int
    tiles: tuple[RowTile, ...]
    steps: tuple[TileStore | Accumulate | Combine, ...]
    registers: int
    budget: int
    blocks_per_sm: int = 2
    """The resident blocks per SM the register budget is for: 2, or 1 where row tiles had to go to shared memory."""
    async_copy: bool = False
    """Row tiles in shared memory are filled by ``cp.async`` (no registers in between), else by vector copies."""
    divisions: tuple[RowDivision, ...] = ()
    """Each per-element division by a value of the row: by its reciprocal once per row, or divided, and why."""

    @property
    def kept(self) -> frozenset[str]:
        """Temporaries of the block that live in registers only (no shared memory)."""
        return frozenset(t.tensor for t in self.tiles if not t.loaded and not t.stored)

    def describe(self) -> list[str]:
        loaded = [t.tensor for t in self.tiles if t.loaded]
        computed = [t.tensor + ("" if t.stored else " (shared memory only)" if t.in_shared else " (registers only)")
                    for t in self.tiles if not t.loaded]
        combines = [s for s in self.steps if isinstance(s, Combine)]
        barrier = "no barrier (one warp)" if self.threads <= 32 else f"{len(combines)} barrier(s)"
        lines = [f"rows on chip: {self.length} elements per row, {self.vec} per access, {self.slots} vector(s) per "
                 f"thread; {self.registers} registers per thread for the row tiles (budget {self.budget})",
                 f"  loaded once: {', '.join(loaded) or 'none'}; "
                 f"computed on chip: {', '.join(computed) or 'none'}",
                 f"  {len(combines)} block reduction(s), {barrier}"]
        if self.blocks_per_sm == 1:
            shared = [f"{t.tensor} ({self.length * SIZEOF[STORAGE_TYPES[t.dtype]]} bytes at {t.shared_at})"
                      for t in self.tiles if t.in_shared]
            how = "cp.async" if self.async_copy else "vector copies through registers"
            lines.insert(1, f"  over the register budget of two blocks per SM: one block of {self.threads} threads "
                            f"per SM" + (f"; in shared memory: {', '.join(shared)}, loaded rows by {how}"
                                         if shared else ""))
        for c in combines:
            what = ", ".join(f"{b}" + (f" (level {k})" if k else "") for b, k in c.items)
            lines.append(f"    combine {what}: {c.nbytes} bytes of partials at {c.at}")
        lines.extend(f"  division {d.describe()}" for d in self.divisions)
        return lines


def row_tile_key(e: TileLoad | TileStore) -> tuple[str, tuple] | None:
    """``(tensor, index with the slice's axis renamed "")`` of an access with exactly one slice, else None."""
    slices = [i for i in e.index if isinstance(i, Slice)]
    if len(slices) != 1:
        return None
    return e.tensor.name, tuple(dataclasses.replace(i, axis="") if isinstance(i, Slice) else i for i in e.index)


def first_row(e: Reduce) -> bool:
    """Whether ``e`` is ``reduce_or(iota(axis) == 0)`` over its own axis: the first-iteration test of a
    reduction's initialisation, true for any row of at least one element."""
    t = e.tile
    return (e.op == "or" and isinstance(t, BinOp) and t.op == "==" and isinstance(t.a, Iota) and t.a.axis == e.axis
            and isinstance(t.b, Const) and t.b.value == 0)


def levels(s: TileStore) -> list[list[Reduce | Dot]]:
    """The reductions along the row of ``s``'s value by level: level 0 holds no other reduction, level ``k``
    holds some of level ``k - 1`` (:func:`first_row` tests aside: they are constants)."""
    depth: dict[Expr, int] = {}

    def visit(e: Expr) -> int:
        inner = max((visit(c) for c in _children(e)), default=0)
        if _is_reduction(e):
            depth.setdefault(e, inner)
            return inner + 1
        return inner

    visit(s.value)
    out: list[list[Reduce | Dot]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for e, d in depth.items():
        out[d].append(e)  # type: ignore[arg-type]
    return out


def _is_reduction(e: Expr) -> bool:
    return isinstance(e, Dot) or (isinstance(e, Reduce) and not first_row(e))


def _children(e: Expr) -> list[Expr]:
    return list(tile_children(e))


def body_stores(body: Stmt) -> list[TileStore] | None:
    if isinstance(body, TileStore):
        return [body]
    if isinstance(body, Seq) and all(isinstance(s, TileStore) for s in body.stmts):
        return list(body.stmts)  # type: ignore[arg-type]
    return None


def plan(stores: list[TileStore] | None, threads: int, warp: int, shared_names: frozenset[str],
         device: DeviceSpec, options: CodegenOptions, take, ranges: Mapping[str, ValueRange]) -> RowsOnChip | str:
    """The on-chip plan of a block kernel's body ``stores``, or why its rows stay in memory.  ``take(nbytes)``
    allocates shared memory for the row tiles placed there and for the partials of each block reduction.

    Where the row tiles fit the register budget of two resident blocks per SM (:func:`register_budget`), they
    all live in registers.  Otherwise the budget of one block per SM keeps as many tiles as it holds in
    registers, in program order, and the rest live in shared memory, if the block may have that much
    (:data:`SHARED_RESERVE` left to the rest of the kernel); else the rows stay in memory.  ``ranges``: the
    program's range facts, for the divisions by a value of the row
    (:func:`~polyfuse.emit_cpp.reciprocal.row_divisions`)."""
    if not options.rows_on_chip:
        return "off (CodegenOptions.rows_on_chip)"
    if stores is None:
        return "the kernel's body has a loop (rolling over chunks of the row, or another nest)"
    found = _shape(stores)
    if isinstance(found, str):
        return found
    length, tiles = found
    tiles = kept_tiles(tiles, shared_names)
    fit = _fit(stores, tiles, length, threads, device, options)
    if isinstance(fit, str):
        return fit
    vec, slots, in_shared, registers, budget, blocks = fit
    placed = [dataclasses.replace(t, shared_at=take(length * SIZEOF[STORAGE_TYPES[t.dtype]]))
              if t in in_shared else t for t in tiles]
    async_copy = device.cp_async and all(SIZEOF[STORAGE_TYPES[t.dtype]] * vec == VECTOR_BYTES
                                         for t in in_shared if t.loaded)
    steps = _steps(stores, threads, warp, take)
    return RowsOnChip(tuple(stores), length, vec, slots, threads, tuple(placed), tuple(steps), registers, budget,
                      blocks, async_copy and any(t.loaded for t in in_shared),
                      row_divisions(stores, ranges, options.reciprocal_rows))


def register_budget(device: DeviceSpec, options: CodegenOptions, threads: int, blocks: int) -> int:
    """32-bit registers per thread for the row tiles with ``blocks`` blocks of ``threads`` resident per SM: the
    register file shared out, less :data:`RESERVED_REGISTERS`, at most the options' ``row_registers``."""
    return min(options.row_registers, device.registers_per_sm // (blocks * threads) - RESERVED_REGISTERS)


def _fit(stores: list[TileStore], tiles: list[RowTile], length: int, threads: int, device: DeviceSpec,
         options: CodegenOptions) -> tuple[int, int, list[RowTile], int, int, int] | str:
    """Where the row tiles go at ``threads`` threads: ``(vec, slots, tiles in shared memory, registers of the
    tiles in registers, their budget, blocks per SM of the budget)``, or why they do not fit on chip."""
    vec = _vector(stores, tiles, length)
    slots = -(-length // (vec * threads))
    held = [t for t in tiles if t.loaded or _read_later(stores, t)]

    def regs(t: RowTile) -> int:
        return slots * vec * -(-SIZEOF[STORAGE_TYPES[t.dtype]] // 4)

    registers = sum(regs(t) for t in held)
    budget = register_budget(device, options, threads, 2)
    if registers <= budget:
        return vec, slots, [], registers, budget, 2
    alone = register_budget(device, options, threads, 1)
    in_registers = 0
    in_shared = []
    for t in held:
        if in_registers + regs(t) <= alone:
            in_registers += regs(t)
        else:
            in_shared.append(t)
    nbytes = sum(length * SIZEOF[STORAGE_TYPES[t.dtype]] for t in in_shared)
    room = device.shared_per_block - SHARED_RESERVE
    if nbytes > room:
        return (f"a row of {length} elements takes {registers} registers per thread for its {len(held)} row "
                f"tile(s) at {threads} threads, over the budget of {budget}; with one block per SM ({alone} "
                f"registers) the tiles left over take {nbytes} bytes of shared memory, over the {room} a block has "
                f"for them")
    return vec, slots, in_shared, in_registers, alone, 1


def warps_for(stores: list[TileStore] | None, device: DeviceSpec, options: CodegenOptions) -> int | None:
    """Warps for a kernel whose rows can stay on chip: the fewest (down to one) that give each thread at most
    :data:`SLOTS_PER_THREAD` vectors of the row, at most the device's default; where the row tiles then fit
    neither the registers of two blocks per SM nor the shared memory (:func:`plan`), but fit at the block's most
    threads, those (more threads, fewer registers each).  None where the rows cannot stay on chip."""
    if not options.rows_on_chip or stores is None:
        return None
    found = _shape(stores)
    if isinstance(found, str):
        return None
    length, tiles = found
    per_warp = _vector(stores, tiles, length) * device.warp_size * SLOTS_PER_THREAD
    warps = max(1, min(device.default_warps, -(-length // per_warp)))
    if warps < device.default_warps:
        return warps
    here = _fit(stores, tiles, length, warps * device.warp_size, device, options)
    if not isinstance(here, str) and here[5] == 2:
        return warps  # (every row tile in registers)
    most = device.max_threads_per_block // device.warp_size
    return most if not isinstance(_fit(stores, tiles, length, most * device.warp_size, device, options), str) else warps


def _shape(stores: list[TileStore]) -> tuple[int, list[RowTile]] | str:
    """The row length and row tiles of ``stores``, or why they cannot stay on chip."""
    length: int | None = None
    written: dict[tuple, TileStore] = {}
    tiles: dict[tuple, RowTile] = {}
    for s in stores:
        if s.mask is not None or s.reducer is not None:
            return f"block {s.block} stores under a mask or with a reducer"
        key = row_tile_key(s)
        slices = [i for i in s.index if isinstance(i, Slice)]
        if slices and key is None:
            return f"block {s.block} writes a tile of more than one axis"
        for n in walk_tile_expr(s.value):
            size = None
            if isinstance(n, TileLoad) and any(isinstance(i, Slice) for i in n.index):
                k = row_tile_key(n)
                if k is None or n.mask is not None:
                    return f"block {s.block} reads a tile of {n.tensor.name} that is not one row"
                size = next(i.size for i in n.index if isinstance(i, Slice))
                if k in written or k in tiles:
                    continue
                if any(w.tensor.name == n.tensor.name for w in written.values()) or any(
                        t.tensor.name == n.tensor.name for t in stores[stores.index(s):]):
                    return f"block {s.block} reads {n.tensor.name} where the kernel writes it elsewhere or later"
                tiles[k] = RowTile(n.tensor.name, k[1], n.tensor.dtype.name, True, False)
            elif _is_reduction(n):
                if isinstance(n, Dot) and not (axes_of(n.a) == axes_of(n.b) == (n.axis,) and not axes_of(n.acc)):
                    return f"block {s.block} has a product of tiles, not a dot of two rows"
                if isinstance(n, Reduce) and axes_of(n.tile) != (n.axis,):
                    return f"block {s.block} reduces a tile of more than the row"
            if size is not None:
                if length is not None and size != length:
                    return f"rows of {length} and {size} elements in one kernel"
                length = size
        if slices:
            if length is not None and slices[0].size != length:
                return f"rows of {length} and {slices[0].size} elements in one kernel"
            length = slices[0].size
            assert key is not None
            written[key] = s
            tiles[key] = RowTile(s.tensor.name, key[1], s.tensor.dtype.name, False, True)
        elif axes_of(s.value):
            return f"block {s.block} stores one element but its value is a tile"
    if length is None:
        return "no statement reads or writes a row"
    return length, list(tiles.values())


def kept_tiles(tiles: list[RowTile], shared_names: frozenset[str]) -> list[RowTile]:
    """``tiles`` with the block's temporaries computed in registers marked not stored."""
    return [dataclasses.replace(t, stored=False) if not t.loaded and t.tensor in shared_names else t for t in tiles]


def _read_later(stores: list[TileStore], tile: RowTile) -> bool:
    return any(isinstance(n, TileLoad) and row_tile_key(n) == (tile.tensor, tile.index)
               for s in stores for n in walk_tile_expr(s.value))


def _vector(stores: list[TileStore], tiles: list[RowTile], length: int) -> int:
    """Elements per access: 16 bytes of the narrowest row tile, halved until every row access is aligned."""
    accesses = [n for s in stores for n in [s, *walk_tile_expr(s.value)]
                if isinstance(n, (TileLoad, TileStore)) and row_tile_key(n) is not None]
    vec = VECTOR_BYTES // min((SIZEOF[STORAGE_TYPES[t.dtype]] for t in tiles), default=4)
    while vec > 1:
        if length % vec == 0 and all(
                aligned(a.index, a.tensor.shape, next(i.axis for i in a.index if isinstance(i, Slice)), vec)
                and SIZEOF[STORAGE_TYPES[a.tensor.dtype.name]] * vec % 4 == 0 for a in accesses):
            return vec
        vec //= 2
    return 1


def _steps(stores: list[TileStore], threads: int, warp: int, take) -> list[TileStore | Accumulate | Combine]:
    """Statements in order, each block reduction placed just before the first step that needs a result still
    pending (so that independent reductions share one barrier)."""
    steps: list[TileStore | Accumulate | Combine] = []
    pending: list[tuple[TileStore, int]] = []
    finish: list[TileStore] = []
    by_level = {s.block: levels(s) for s in stores}

    def flush() -> None:
        if not pending:
            return
        warps = threads // warp
        nbytes = 0 if warps == 1 else sum(
            align16(warps * SIZEOF["int" if isinstance(r, Reduce) and r.op == "or" else COMPUTE_TYPES[r.dtype.name]])
            for s, k in pending for r in by_level[s.block][k])
        steps.append(Combine(tuple((s.block, k) for s, k in pending), take(nbytes) if nbytes else 0, nbytes,
                             tuple(s.block for s in finish)))
        pending.clear()
        finish.clear()

    def reads_pending(exprs: list[Expr]) -> bool:
        reads = {(n.tensor.name, n.index) for e in exprs for n in walk_tile_expr(e) if isinstance(n, TileLoad)}
        return any((f.tensor.name, f.index) in reads for f in finish)

    for s in stores:
        lv = by_level[s.block]
        for k, level in enumerate(lv):
            if k > 0 or reads_pending(level):
                flush()
            steps.append(Accumulate(s.block, k))
            pending.append((s, k))
        if lv and row_tile_key(s) is None:
            finish.append(s)  # (its value is computed by the block reduction that completes it)
            continue
        if lv or reads_pending([s.value]):
            flush()
        steps.append(s)
    flush()
    return steps


# ---------------------------------------------------------------------------------------------- printing

def emit(em: CudaEmitter, rows: RowsOnChip) -> None:
    """The kernel body ``rows`` plans (see the module docstring)."""
    where = "in registers" + (" and shared memory" if any(t.in_shared for t in rows.tiles) else "") + (
        ", one block per SM" if rows.blocks_per_sm == 1 else "")
    em.line(f"// rows on chip: {rows.length} elements per row {where}, {rows.slots} x {rows.vec} per thread")
    em.materialized = {}
    state = _State(rows, {(t.tensor, t.index): em.fresh("row") for t in rows.tiles})
    for t in rows.tiles:
        name = state.arrays[(t.tensor, t.index)]
        if t.in_shared:
            em.shared_array(STORAGE_TYPES[t.dtype], name, rows.length * SIZEOF[STORAGE_TYPES[t.dtype]], t.shared_at)
        else:
            em.line(f"alignas(16) {STORAGE_TYPES[t.dtype]} {name}[{rows.slots * rows.vec}];")
    stores = {s.block: s for s in rows.stores}
    _copy(em, rows, [(n, state.arrays[row_tile_key(n)], state.tile(n).in_shared)
                     for n in _first_loads(list(stores.values()), rows)], to_memory=False)
    for step in rows.steps:
        if isinstance(step, Accumulate):
            s = stores[step.block]
            _overrides(em, state, s)
            _reciprocals(em, state, s)
            state.partials[(step.block, step.level)] = _accumulate(em, state, levels(s)[step.level])
        elif isinstance(step, Combine):
            _combine(em, state, step)
            for block in step.finished:
                _scalar_store(em, state, stores[block])
        elif (key := row_tile_key(step)) is not None:
            _row_store(em, state, step, key)
        else:
            _scalar_store(em, state, step)
        em.overrides.clear()
    em.inverses, em.guards = {}, {}  # (the reciprocals are this kernel's registers)


def _row_store(em: CudaEmitter, state: _State, step: TileStore, key: tuple) -> None:
    """A statement computing a row tile: into registers (written to memory after, if stored), or into the
    thread's vectors of the row in shared memory (each written to memory at once, if stored)."""
    rows = state.rows
    tile = state.tile(step)
    _overrides(em, state, step)
    _reciprocals(em, state, step)
    axis = next(i.axis for i in step.index if isinstance(i, Slice))
    arr = state.arrays[key]
    target = f"{arr}_v[pf_v]" if tile.in_shared else f"{arr}[pf_k * {rows.vec} + pf_v]"
    write = (tile, arr, step if tile.stored else None)

    def elements() -> None:
        with _elements(em, rows, reads=_shared_reads(state, [step.value]), write=write):
            value = em.convert(em.scalar(step.value, {axis: "pf_j"}), step.value.dtype, step.tensor.dtype)
            em.line(f"{target} = {em.to_storage(value, step.tensor.dtype)};")

    _guarded(em, [step.value], elements)
    if tile.in_shared:
        return
    if tile.stored:
        _copy(em, rows, [(step, arr, False)], to_memory=True)
    if step.value.dtype == step.tensor.dtype and em.stype(step.tensor.dtype) == em.ctype(step.tensor.dtype):
        state.values[step.value] = f"{arr}[pf_k * {rows.vec} + pf_v]"  # (read again below: no recompute)


def _shared_reads(state: _State, exprs: list[Expr]) -> list[tuple[RowTile, str]]:
    """The row tiles in shared memory that ``exprs`` read where printed (not under a value already at hand),
    with their arrays: each is read a vector at a time."""
    found: dict[tuple, tuple[RowTile, str]] = {}

    def visit(e: Expr) -> None:
        if e in state.results or e in state.values or (isinstance(e, Reduce) and first_row(e)):
            return
        if isinstance(e, TileLoad) and (k := row_tile_key(e)) in state.arrays:
            if state.tile(e).in_shared:
                found.setdefault(k, (state.tile(e), state.arrays[k]))
            return
        for c in _children(e):
            visit(c)

    for e in exprs:
        visit(e)
    return list(found.values())


@dataclass
class _State:
    """What the printer of a kernel on chip has at hand: the row tiles' register arrays, the per-thread
    partials by ``(block, level)``, the combined results, the values of scalar statements and of rows."""

    rows: RowsOnChip
    arrays: dict[tuple, str]
    partials: dict[tuple[str, int], list[tuple[Reduce | Dot, str, str]]] = dataclasses.field(default_factory=dict)
    results: dict[Expr, str] = dataclasses.field(default_factory=dict)
    scalars: dict[tuple, str] = dataclasses.field(default_factory=dict)
    values: dict[Expr, str] = dataclasses.field(default_factory=dict)

    def tile(self, access: TileLoad | TileStore) -> RowTile:
        key = row_tile_key(access)
        return next(t for t in self.rows.tiles if (t.tensor, t.index) == key)


def _scalar_store(em: CudaEmitter, state: _State, s: TileStore) -> None:
    """A statement of one value per row: computed by every thread (its reductions combined), written by one."""
    _overrides(em, state, s)
    reg = em.fresh("s")
    value = em.convert(em.scalar(s.value, {}), s.value.dtype, s.tensor.dtype)
    em.line(f"const {em.ctype(s.tensor.dtype)} {reg} = {value};")
    em.line(f"if (pf_tid == 0) {em.access(s.tensor, s.index, {})} = {em.to_storage(reg, s.tensor.dtype)};")
    state.scalars[(s.tensor.name, s.index)] = reg


def _first_loads(stores: list[TileStore], rows: RowsOnChip) -> list[TileLoad]:
    """One load of each row tile read from memory."""
    seen: dict[tuple, TileLoad] = {}
    for s in stores:
        for n in walk_tile_expr(s.value):
            if isinstance(n, TileLoad) and (k := row_tile_key(n)) is not None and k not in seen and any(
                    (t.tensor, t.index) == k and t.loaded for t in rows.tiles):
                seen[k] = n
    return list(seen.values())


class _elements:
    """A fully unrolled loop over a thread's elements of the row (``pf_k``: vector, ``pf_v``: lane, ``pf_j``:
    element), skipping those past the row's end.  Per vector, the row tiles in shared memory of ``reads`` are
    read first into lane arrays (``{array}_v``: one 16-byte access each), and ``write``'s tile, computed into
    its lane array, is written after to shared memory and, if it names a store, to memory."""

    def __init__(self, em: CudaEmitter, rows: RowsOnChip, lanes: bool = True,
                 reads: list[tuple[RowTile, str]] | None = None,
                 write: tuple[RowTile, str, TileStore | None] | None = None):
        self.em, self.rows, self.lanes = em, rows, lanes
        self.reads, self.write = reads or [], write if write is not None and write[0].in_shared else None

    def __enter__(self) -> None:
        em, r = self.em, self.rows
        em.line("#pragma unroll")
        em.open(f"for (int pf_k = 0; pf_k < {r.slots}; ++pf_k)")
        em.line(f"const int pf_j0 = (pf_tid + pf_k * {r.threads}) * {r.vec};")
        self.ragged = r.length % (r.vec * r.threads) != 0
        if self.ragged:
            em.open(f"if (pf_j0 < {r.length})")
        for t, arr in self.reads:
            em.line(f"alignas(16) {STORAGE_TYPES[t.dtype]} {arr}_v[{r.vec}];")
            _vector_copy(em, t.dtype, r.vec, f"&{arr}_v[0]", f"&{arr}[pf_j0]", asynchronous=False)
        if self.write is not None:
            tile, arr, _ = self.write
            em.line(f"alignas(16) {STORAGE_TYPES[tile.dtype]} {arr}_v[{r.vec}];")
        if self.lanes:
            em.line("#pragma unroll")
            em.open(f"for (int pf_v = 0; pf_v < {r.vec}; ++pf_v)")
            em.line("[[maybe_unused]] const int pf_j = pf_j0 + pf_v;")

    def __exit__(self, *exc: object) -> None:
        if self.lanes:
            self.em.close()
        if self.write is not None:
            tile, arr, store = self.write
            _vector_copy(self.em, tile.dtype, self.rows.vec, f"&{arr}[pf_j0]", f"&{arr}_v[0]", asynchronous=False)
            if store is not None:
                axis = next(i.axis for i in store.index if isinstance(i, Slice))
                mem = f"&{self.em.access(store.tensor, store.index, {axis: 'pf_j0'})}"
                _vector_copy(self.em, tile.dtype, self.rows.vec, mem, f"&{arr}_v[0]", asynchronous=False)
        if self.ragged:
            self.em.close()
        self.em.close()


def _vector_copy(em: CudaEmitter, dtype: str, vec: int, dst: str, src: str, asynchronous: bool) -> None:
    """``vec`` elements of ``dtype`` from ``src`` to ``dst`` in 16-byte (or narrower) accesses; with
    ``asynchronous``, global to shared memory by ``cp.async`` (16-byte chunks only)."""
    ctype, n = chunks(SIZEOF[STORAGE_TYPES[dtype]], vec)
    for c in range(n):
        if asynchronous:
            em.line(f"pf::cp_async16(reinterpret_cast<{ctype}*>({dst}) + {c}, "
                    f"reinterpret_cast<const {ctype}*>({src}) + {c}, true);")
        else:
            em.line(f"reinterpret_cast<{ctype}*>({dst})[{c}] = reinterpret_cast<const {ctype}*>({src})[{c}];")


def _copy(em: CudaEmitter, rows: RowsOnChip, triples: list, to_memory: bool) -> None:
    """Vector copies between each access's row (loads or a store) and its register array, or (loads) the
    thread's vectors of the row in shared memory (``cp.async`` where the plan says so, waited for at once)."""
    if not triples:
        return
    asynchronous = False
    streamed = em.kernel_plan.streamed if em.kernel_plan is not None else frozenset()
    with _elements(em, rows, lanes=False):
        for access, arr, in_shared in sorted(triples, key=lambda t: not t[2]):  # (the asynchronous ones first)
            axis = next(i.axis for i in access.index if isinstance(i, Slice))
            mem = f"&{em.access(access.tensor, access.index, {axis: 'pf_j0'})}"
            reg = f"&{arr}[pf_j0]" if in_shared else f"&{arr}[pf_k * {rows.vec}]"
            dst, src = (mem, reg) if to_memory else (reg, mem)
            use_async = in_shared and rows.async_copy and not to_memory
            asynchronous |= use_async
            if use_async or in_shared:
                _vector_copy(em, access.tensor.dtype.name, rows.vec, dst, src, use_async)
                continue
            once = not to_memory and access.tensor.name in streamed
            st = STORAGE_TYPES[access.tensor.dtype.name]
            ctype, n = chunks(SIZEOF[st], rows.vec)
            const = "" if to_memory else "const "
            for c in range(n):
                source = (f"pf::load_once(reinterpret_cast<const {ctype}*>({src}) + {c})" if once
                          else f"reinterpret_cast<{const}{ctype}*>({src})[{c}]")
                em.line(f"reinterpret_cast<{ctype}*>({dst})[{c}] = {source};")
    if asynchronous:
        em.line("pf::cp_async_commit();")
        em.line("pf::cp_async_wait<0>();  // (each thread reads back only the vectors it copied: no barrier)")


def _overrides(em: CudaEmitter, state: _State, s: TileStore) -> None:
    """Point ``s``'s reads of row tiles at their registers (element ``pf_k, pf_v``), its reads of earlier
    statements' values, rows and reductions at theirs, and its first-iteration tests at ``true``."""
    vec = state.rows.vec
    for n in walk_tile_expr(s.value):
        if n in state.results:
            em.overrides[n] = state.results[n]
        elif n in state.values:
            em.overrides[n] = state.values[n]
        elif isinstance(n, TileLoad):
            k = row_tile_key(n)
            if k in state.arrays:
                element = "_v[pf_v]" if state.tile(n).in_shared else f"[pf_k * {vec} + pf_v]"
                em.overrides[n] = em.from_storage(f"{state.arrays[k]}{element}", n.tensor.dtype)
            elif (n.tensor.name, n.index) in state.scalars and n.mask is None:
                em.overrides[n] = state.scalars[(n.tensor.name, n.index)]
        elif isinstance(n, Reduce) and first_row(n):
            em.overrides[n] = "true"


def _reciprocals(em: CudaEmitter, state: _State, s: TileStore) -> None:
    """``rcp_rz`` of each divisor of ``s`` the plan divides by its reciprocal, once per row, where every
    reduction it reads is complete (a divisor of a later level waits for its own step); for a guarded one, also
    whether the row may use it (``pf::rcp_normal``)."""
    for d in state.rows.divisions:
        if not d.chosen or d.block != s.block or d.divisor in em.inverses:
            continue
        if any(_is_reduction(n) and n not in state.results for n in walk_tile_expr(d.divisor)):
            continue
        reg = em.fresh("rcp")
        if d.guarded:
            value, ok = em.fresh("div"), em.fresh("ok")
            em.line(f"const float {value} = {em.scalar(d.divisor, {})};")
            em.line(f"const bool {ok} = pf::rcp_normal({value});  // (the same for every thread of the row)")
            em.line(f"const float {reg} = pf::rcp_rz({value});")
            em.guards[d.divisor] = ok
        else:
            em.line(f"const float {reg} = pf::rcp_rz({em.scalar(d.divisor, {})});")
        em.inverses[d.divisor] = reg


def _guarded(em: CudaEmitter, exprs: list[Expr], elements: Callable[[], None]) -> None:
    """``elements()``, the loop over the thread's elements that computes ``exprs``; where they divide by a guarded
    divisor, twice: with its reciprocal where every such divisor of the row passed its test, else dividing."""
    used = [d for d in em.guards if any(n == d for e in exprs for n in walk_tile_expr(e))]
    if not used:
        elements()
        return
    em.open(f"if ({' && '.join(em.guards[d] for d in used)})")
    elements()
    em.close()
    em.open("else")
    kept = {d: em.inverses.pop(d) for d in used}
    elements()
    em.inverses.update(kept)
    em.close()


def _accumulate(em: CudaEmitter, state: _State, level: list[Reduce | Dot]) -> list[tuple[Reduce | Dot, str, str]]:
    """Each thread's partial of every reduction of ``level`` over its elements, in one pass."""
    found = []
    for r in level:
        acc = em.fresh("acc")
        ct = em.reduce_type(r) if isinstance(r, Reduce) else COMPUTE_TYPES[r.dtype.name]
        em.line(f"{ct} {acc} = {_REDUCE_INIT[r.op] if isinstance(r, Reduce) else '0'};")
        found.append((r, acc, ct))
    exprs = [x for r in level for x in ([r.tile] if isinstance(r, Reduce) else [r.a, r.b])]

    def elements() -> None:
        with _elements(em, state.rows, reads=_shared_reads(state, exprs)):
            for r, acc, ct in found:
                env = {r.axis: "pf_j"}
                if isinstance(r, Reduce):
                    em.line(f"{acc} = {em.combine(r.op, acc, em.scalar(r.tile, env), ct)};")
                else:
                    em.line(f"{acc} = ({acc} + ({em.scalar(r.a, env)} * {em.scalar(r.b, env)}));")

    _guarded(em, exprs, elements)
    return found


def _combine(em: CudaEmitter, state: _State, step: Combine) -> None:
    """One block reduction of the pending partials; then every thread holds each result."""
    pending = [p for item in step.items for p in state.partials[item]]
    warps = state.rows.threads // em.warp
    em.line(f"// block reduction: {', '.join(b for b, _ in step.items)}")
    for r, acc, ct in pending:
        em.shuffle_combine(_op(r), acc, ct, em.warp)
    if warps > 1:
        names = []
        for _, _, ct in pending:
            name = em.fresh("part")
            em.shared_array(ct, name, warps * SIZEOF[ct], step.at if not names else None)
            names.append(name)
        em.open(f"if (pf_tid % {em.warp} == 0)")
        for (_, acc, _), name in zip(pending, names, strict=True):
            em.line(f"{name}[pf_tid / {em.warp}] = {acc};")
        em.close()
        em.barrier()
        for (r, acc, ct), name in zip(pending, names, strict=True):
            em.line(f"{acc} = {name}[0];")
            em.line("#pragma unroll")
            step_text = em.combine(_op(r), acc, f"{name}[pf_w]", ct)
            em.line(f"for (int pf_w = 1; pf_w < {warps}; ++pf_w) {acc} = {step_text};")
    for r, acc, _ in pending:
        if isinstance(r, Reduce):
            state.results[r] = em.reduce_result(r, acc)
        else:
            # (the accumulator's own value: the first-iteration test folded, earlier results at hand)
            for n in walk_tile_expr(r.acc):
                if isinstance(n, Reduce) and first_row(n):
                    em.overrides[n] = "true"
            state.results[r] = f"({em.scalar(r.acc, {})} + {acc})"


def _op(r: Reduce | Dot) -> str:
    return r.op if isinstance(r, Reduce) else "sum"
