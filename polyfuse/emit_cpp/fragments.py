"""Loops whose tiles stay in warp fragments: chained tensor-core products without shared memory between them.

Attention's key loop is a chain of tile statements: ``S = Q·Kᵀ``, a score tile from ``S`` (scale, mask,
bias), row statistics (``max``, ``sum``), ``P = exp(score − max)`` and ``O = O·h + P·V``.  Printed one statement
at a time, every tile goes through shared memory, with a barrier after each statement and the exponentials
computed once per statement that reads them.  But the accumulator layout of ``mma.m16n8k16`` (lane ``l`` holds
rows ``l/4`` and ``l/4 + 8`` of its warp's 16-row strip, two neighbouring columns of every 8-column tile) is
also the layout of the A operand of the next product, once pairs of f32 become pairs of 16-bit values.  So
where **each warp owns whole rows of every tile of the loop**, nothing needs to leave the warp:

* every tile the loop writes lives in registers, ``float name[cols / 8][4]`` per thread (a row vector,
  ``name[2]``: the thread's two rows), at the fragment position of each element;
* an elementwise statement computes each of its thread's elements from the registers of the same element;
* a reduction along a row combines the thread's columns, then the four lanes of the row (two ``shfl_xor``);
* a product's accumulators start at zero and its epilogue is the statement's value at each element; its
  ``a`` operand, where computed from registers (``P``), is evaluated per element and packed in pairs straight
  into the A fragment, rounded once to the other operand's 16-bit type (the options' ``round_operands``;
  off: split hi + lo and multiplied twice, as the shared-memory path does);
* operands that come from memory (``Q``, ``K``, ``V``) are staged as before (kept tiles, cp.async), the next
  iteration's copied while this one computes (two buffers each, one barrier per iteration; the options'
  ``prefetch``; off: all of an iteration's copies issued at its top, one wait and barrier per product).

Less work per element, each rewrite equal to the program in IEEE arithmetic or inside an existing term of the
tolerance: a costly value that several statements compute at the same elements (``exp(score − max)`` in ``P``
and in the row sum) is computed once (:class:`SharedValue`); parts of a value that depend only on the row are
computed once per row; ``select(p, x, f·x)`` is ``x·select(p, 1, f)``; a rolling update's first-iteration
select is the registers' initial value (:func:`_rewrite`); and where a scalar guard proves that no element of an
iteration's tile is masked, a statement is computed without its masks (:func:`_mask_free`: the main part of a
causal or windowed loop).

A masked store keeps the register's old value where its mask is false, so the semantics are the tile
program's; the tiles the loop allocates per iteration start at zero at each iteration (their values at
masked-out elements are undefined in the program, and no unmasked read reaches them).  The tiles that outlive
the loop are read from memory before it and written back after it where another statement reads them
(:func:`in_memory`); the statements right after the loop that read them element by element (attention's
``out``) are computed from the registers instead (:func:`epilogue`), so that O and the statistics need no
shared memory at all.

On a device with warpgroup products (sm_90a) the same loop multiplies with ``wgmma.m64n64k16`` (:func:`_warpgroup`):
the four warps of a warpgroup own 64 rows, each still in the per-warp m16n8 layout above (the wgmma accumulator
layout is that one, repeated), so nothing else changes; the operands in shared memory are staged into
128-byte-swizzled panels of 64 columns that the product reads through descriptors, and ``a`` from registers is
packed exactly as for ``mma.sync``.  Where every product can be one, a **producer warpgroup** of its own copies
the operand tiles into two stages tracked by mbarriers and gives its registers to the computing warps
(:func:`_producer`, :func:`_specialised`), which then never wait at a block barrier.

A loop qualifies (:func:`plan`) where its body is tile statements only, each writing an f32 temporary at one
index that does not move with the loop, every statement having one *row* axis (a product's ``m``, or the axis
that indexes a row tensor's row dimension) and at most one *column* axis; every read of a loop tensor is of
the element the statement computes (the same row, and the statement's column, a reduction's axis or a
product's ``k``); columns are multiples of 16 (rows are padded to a warp's 16: the padding rows compute copies
of the last row and are never written); every product is a tensor-core one over (row, column), ``b`` from
memory; and at least one product's ``a`` is computed from the loop's registers (a loop with only products of
memory operands — a GEMM's k loop — keeps the register accumulators of :mod:`~polyfuse.emit_cpp.registers`,
which spread one output tile over all warps).  The kernel then has ``rows / 16`` warps (:func:`warps_for`), and
only where the rows are at least the options' ``fragment_min_rows``: decode's few query rows are better spread
over the key columns by all warps.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.cfamily import _REDUCE_INIT, CHEAP_CALLS, axis_var
from polyfuse.emit_cpp.resident import tile_shape
from polyfuse.emit_cpp.dotplan import (
    LOW, M16N8, MMA_SYNC, PANEL, SWIZZLE_ALIGN, WGMMA, DotPlan, Frame, LdmatrixFragment, OperandPlan, Staged,
    mma_type, raw_staging, staging,
)
from polyfuse.emit_cpp.staging import copy_async, stage_elements, stage_raw, stage_vector
from polyfuse.emit_cpp.stream import consume
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.errors import InternalError, NonAffineIndex
from polyfuse.ir.affine import from_linear_form, linear_form
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Select, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.visit import substitute
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Broadcast, Dot, Index, Iota, Permute, Reduce, Slice, Squeeze, TileLoad, TileStore, axes_of, axis_sizes, depends_on,
    map_tile_expr, tile_children, walk_tile_expr, walk_tile_stmts,
)
from polyfuse.tiling.inline import rename_axes
from polyfuse.tiling.parallel import allocated_at

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

STRIP = M16N8.rows
"""Rows of a tile each warp owns (one m16 strip)."""
WARPGROUP_ROWS = 4 * STRIP
"""Rows of a warpgroup product (``wgmma.m64nNk16``): its four warps' strips."""
STAGES = 2
"""Operand tiles in flight with a producer warpgroup: the one being computed on and the next."""
BARRIER_BYTES = 2 * STAGES * 8
"""A producer warpgroup's mbarriers: ``full`` and ``empty`` of each stage, 8 bytes each."""
PRODUCER_WARPS = 4
"""The producer is a warpgroup: ``setmaxnreg`` gives registers back per warpgroup."""
PRODUCER_REGISTERS = 24
"""Registers a producer thread keeps (``setmaxnreg.dec``): addresses and counters of its copies."""
SUBPARTITION_REGISTERS = 16384
"""Registers of one of an SM's four sub-partitions (sm_90): each warp lives in one, so a block of
``4·n`` warps has ``16384 / (32·n)`` registers per thread unless warpgroups trade them (``setmaxnreg``)."""
REGISTER_OVERHEAD = 24
"""Registers a fragment loop's thread needs beside its tiles and its largest product's accumulators
(:attr:`FragmentLoop.registers`): operand fragments, addresses, loop state.  A low estimate errs towards asking
``__launch_bounds__`` for a second block where the tiles nearly fit, which ptxas then meets by reusing the
registers of tiles that are dead at different times; a high one would leave the SM half empty."""


@dataclass(frozen=True)
class Held:
    """Tensor ``name`` in the registers ``register``: ``[cols / 8][4]`` per thread (a row vector: ``[2]``).
    ``row_dim``/``col_dim``: the dimensions of its accesses' ``index`` that are the tile's rows and columns;
    ``per_iteration``: allocated by the loop at each iteration (declared in its body); ``memory``: read from
    its tensor before the loop and written back after it (a temporary in global memory, or one that a
    statement other than the loop's and its epilogue's reads); otherwise it lives in registers only."""

    name: str
    register: str
    row_dim: int
    col_dim: int | None
    cols: int
    per_iteration: bool
    memory: bool
    index: tuple[Index, ...]
    initial: float = 0.0
    """The registers' value before the loop (registers only): what the program's first iteration reads."""

    @property
    def element(self) -> str:
        """C text of the thread's register of the element at ``pf_h`` (row half), ``pf_nb``, ``pf_q``."""
        return f"{self.register}[pf_nb][pf_q]" if self.col_dim is not None else f"{self.register}[pf_h]"

    def declaration(self) -> str:
        shape = f"[{self.cols // 8}][4]" if self.col_dim is not None else "[2]"
        if self.initial == 0.0:
            return f"float {self.register}{shape} = {{}};"
        value = (("-" if self.initial < 0 else "") + "INFINITY" if math.isinf(self.initial)
                 else f"{float.hex(self.initial)}f")
        fill = f"for (auto& pf_x : {self.register}) " + ("for (float& pf_y : pf_x) pf_y" if self.col_dim is not None
                                                        else "pf_x")
        return f"float {self.register}{shape}; {fill} = {value};"


@dataclass(frozen=True)
class FragmentStmt:
    """One statement of the loop: its row axis and column axis (None: a row statement), the plan of its
    product if it has one, whether that product's ``a`` is computed from registers, the shared buffers
    of the product's operands staged per iteration (by role ``a``/``b``; none for kept tiles and registers),
    and the value it computes."""

    block: str
    row: str
    col: str | None
    dot: DotPlan | None = None
    a_registers: bool = False
    buffers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    value: Expr | None = None
    """The statement's value as computed here (:func:`_rewrite`: the same value in every case of IEEE
    arithmetic, with less work per element)."""
    unmasked: tuple[Expr, Expr] | None = None
    """(condition, value): where the scalar condition holds at an iteration, every mask of the value (a select
    with a constant on one side: causal or window masks, ragged edges) takes its other side at every element of
    the tile, and the value is computed without them (:func:`_mask_free`)."""
    row_parts: Mapping[Expr, tuple[Expr, ...]] = dataclasses.field(default_factory=dict)
    """For the value, the unmasked value and each reduction's tile: their parts computed once per row of the
    thread (:func:`_row_parts`)."""


@dataclass(frozen=True)
class SharedValue:
    """A costly value several statements of the loop compute at the same elements (attention's
    ``exp(score − max)``, in ``P`` and in the row sum): computed once per iteration into the registers
    ``register`` (``[cols / 8][4]`` over ``row``/``col``, or ``[2]`` per row where ``col`` is None) before
    statement ``before``, and read by every statement that has it."""

    nodes: tuple[Expr, ...]
    """The value as each statement that uses it writes it (its axes named as there); the first is computed."""
    register: str
    before: str
    row: str
    col: str | None
    cols: int


@dataclass(frozen=True)
class FragmentLoop:
    """A loop computed in warp fragments: ``rows`` rows per tile (``rows / 16`` warps), the tensors in
    registers, the statements' plans by block (the loop's and its ``epilogue``'s: the statements after the
    loop computed from its registers and written to memory), and the staging buffers (name → bytes) it
    allocates; ``prefetch``: the next iteration's operands are copied while this one computes (the buffers
    hold two iterations), else each iteration copies its own at its top."""

    rows: int
    held: tuple[Held, ...]
    stmts: Mapping[str, FragmentStmt]
    buffers: tuple[tuple[str, int], ...]
    chains: int
    """Independent partial results a thread keeps when it reduces its columns of a row (the options'
    ``reduce_chains``)."""
    epilogue: tuple[TileStore, ...] = ()
    prefetch: bool = False
    shared: tuple[SharedValue, ...] = ()
    barriers: str | None = None
    """With a producer warpgroup (:func:`_producer`): the shared array of its four mbarriers, ``full`` of the
    two stages (their copies landed) then ``empty`` (every computing thread is done with them)."""

    @property
    def producer(self) -> bool:
        """Whether a warpgroup of its own (after the ``rows / 16`` computing warps) copies the operand tiles."""
        return self.barriers is not None

    @property
    def computing_registers(self) -> int:
        """With a producer: the registers each computing thread takes (``setmaxnreg.inc``) once the producer
        has given its own back: a sub-partition holds one producer warp and ``rows / 64`` computing ones."""
        per = -(-self.rows // STRIP) // PRODUCER_WARPS
        return min(256, (SUBPARTITION_REGISTERS // 32 - PRODUCER_REGISTERS) // per // 8 * 8)

    @property
    def round_once(self) -> bool:
        """Whether the f32 operands its products take from registers are rounded once (not split hi + lo)."""
        return not any(st.dot.a.staged.split for st in self.stmts.values()
                       if st.dot is not None and st.dot.a is not None and st.dot.a.source == "registers")

    @property
    def warpgroups(self) -> bool:
        """Whether its products are warpgroup products (``wgmma``, operands staged swizzled)."""
        dots = [st.dot for st in self.stmts.values() if st.dot is not None]
        return bool(dots) and all(d.instruction == WGMMA for d in dots)

    @property
    def align(self) -> int:
        """Byte alignment of its shared buffers."""
        return SWIZZLE_ALIGN if self.warpgroups else 16

    @property
    def registers(self) -> int:
        """Registers a thread needs, estimated: its tiles, the largest product's accumulators (each of its
        output tiles' four) and ``REGISTER_OVERHEAD`` for addresses, operand fragments and temporaries."""
        tiles = sum(h.cols // 2 if h.col_dim is not None else 2 for h in self.held)
        products = max((st.dot.per * 4 for st in self.stmts.values() if st.dot is not None), default=0)
        return tiles + products + REGISTER_OVERHEAD

    def describe(self, offsets: Mapping[str, int]) -> list[str]:
        warps = -(-self.rows // STRIP)
        lines = [f"in warp fragments: {warps} warps of {STRIP} whole rows ({self.rows} real); "
                 f"register operands {'rounded once' if self.round_once else 'split hi+lo'}; "
                 + (f"warps {warps}-{warps + PRODUCER_WARPS - 1} copy the operand tiles into {STAGES} stages "
                    f"(mbarriers {self.barriers}; registers {PRODUCER_REGISTERS} for them, "
                    f"{self.computing_registers} for the others)"
                    if self.producer else "operands of the next iteration copied during this one" if self.prefetch
                    else "operands copied at the top of each iteration")]
        for h in self.held:
            shape = f"[{h.cols // 8}][4]" if h.col_dim is not None else "[2]"
            life = ("per iteration" if h.per_iteration else "read before, written back after" if h.memory
                    else "registers only")
            lines.append(f"registers: {h.name} in {h.register}{shape} ({life})")
        for name, nbytes in self.buffers:
            lines.append(f"staging buffer {name}: {nbytes} bytes at {offsets[name]}")
        for v in self.shared:
            lines.append(f"computed once per iteration before {v.before}: {v.register} "
                         f"({'a tile' if v.col is not None else 'a row value'} that several statements use)")
        if self.epilogue:
            lines.append("after the loop, from registers: " + ", ".join(e.block for e in self.epilogue))
        return lines


def _body(loop: Loop) -> tuple[TileStore, ...] | None:
    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    if not body or not all(isinstance(s, TileStore) for s in body):
        return None
    return tuple(body)  # type: ignore[arg-type]


def _exprs(s: TileStore) -> list[Expr]:
    return [s.value, *([s.mask] if s.mask is not None else [])]


def _shape(index: tuple[Index, ...], unit: Mapping[str, Expr]) -> tuple:
    """:func:`~polyfuse.emit_cpp.resident.tile_shape` of ``index`` with the grid loops of one iteration at 0
    (``b`` and 0 index the same tile)."""
    def at(x: Expr) -> Expr:
        return simplify(substitute(x, unit))

    return tile_shape(tuple(dataclasses.replace(i, start=at(i.start)) if isinstance(i, Slice) else at(i)
                            for i in index))


def _mentions(x: Expr, name: str) -> bool:
    return any(isinstance(n, Var) and n.name == name for n in walk_tile_expr(x))


@dataclass(frozen=True)
class _Shape:
    """What :func:`_analyse` found: rows, per-statement (row, col) axes, per-tensor (row dim, col dim, cols)."""

    rows: int
    axes: Mapping[str, tuple[str, str | None]]
    dims: Mapping[str, tuple[int, int | None, int]]
    index: Mapping[str, tuple[Index, ...]]


def _analyse(frame: Frame, loop: Loop) -> _Shape | None:
    """The fragment shape of ``loop``, if its statements have one (the module docstring's conditions but the
    warps); None otherwise."""
    body = _body(loop)
    if body is None:
        return None
    names = {s.tensor.name for s in body}
    accesses: dict[str, list[tuple[Index, ...]]] = {n: [] for n in names}
    for s in body:
        if (s.tensor.role in (INPUT, OUTPUT) or s.tensor.dtype != dt.f32 or s.reducer is not None
                or not any(isinstance(i, Slice) for i in s.index)):
            return None
        accesses[s.tensor.name].append(s.index)
        for x in _exprs(s):
            for n in walk_tile_expr(x):
                if isinstance(n, TileLoad) and n.tensor.name in names:
                    accesses[n.tensor.name].append(n.index)
        for i in s.index:
            for n in walk_tile_expr(i.start if isinstance(i, Slice) else i):
                if isinstance(n, TileLoad):
                    return None
    index: dict[str, tuple[Index, ...]] = {}
    unit = {v.name: Const(0, v.dtype) for v in frame.unit_vars}
    for name, found in accesses.items():
        first = _shape(found[0], unit)
        if any(_shape(i, unit) != first for i in found[1:]):
            return None
        if any(_mentions(i.start if isinstance(i, Slice) else i, loop.var.name) for i in found[0]):
            return None
        index[name] = found[0]
    # Row axes: a product's m, then whatever indexes a known row dimension (to a fixed point).
    rows_of: dict[str, str] = {}
    dims: dict[str, tuple[int, int | None]] = {}
    for s in body:
        dots = [n for x in _exprs(s) for n in walk_tile_expr(x) if isinstance(n, Dot)]
        if len(dots) > 1 or (s.mask is not None and any(isinstance(n, Dot) for n in walk_tile_expr(s.mask))):
            return None
        if dots:
            e = dots[0]
            m = [a for a in axes_of(e.a) if a != e.axis]
            if len(m) != 1:
                return None
            rows_of[s.block] = m[0]
    changed = True
    while changed:
        changed = False
        for s in body:
            found = {rows_of[s.block]} if s.block in rows_of else set()
            for x in _exprs(s):
                for n in walk_tile_expr(x):
                    if isinstance(n, TileLoad) and n.tensor.name in dims:
                        i = n.index[dims[n.tensor.name][0]]
                        if not isinstance(i, Slice):
                            return None
                        found.add(i.axis)
            if len(found) > 1:
                return None
            if not found:
                continue
            row = found.pop()
            rows_of[s.block] = row
            slices = [(d, i) for d, i in enumerate(s.index) if isinstance(i, Slice)]
            at = [d for d, i in slices if i.axis == row]
            others = [d for d, i in slices if i.axis != row]
            if len(at) != 1 or len(others) > 1:
                return None
            role = (at[0], others[0] if others else None)
            old = dims.get(s.tensor.name)
            if old is not None and old != role:
                return None
            if old is None:
                dims[s.tensor.name] = role
                changed = True
    if set(dims) != names or any(s.block not in rows_of for s in body):
        return None
    sizes = {s.block: axis_sizes(s) for s in body}
    row_sizes = {sizes[s.block][rows_of[s.block]] for s in body}
    if len(row_sizes) != 1:
        return None
    rows = row_sizes.pop()
    shape_dims: dict[str, tuple[int, int | None, int]] = {}
    for name, (rd, cd) in dims.items():
        cols = index[name][cd].size if cd is not None else 0  # type: ignore[union-attr]
        if cd is not None and cols % 16:
            return None
        shape_dims[name] = (rd, cd, cols)
    axes: dict[str, tuple[str, str | None]] = {}
    for s in body:
        row = rows_of[s.block]
        col = next((i.axis for i in s.index if isinstance(i, Slice) and i.axis != row), None)
        axes[s.block] = (row, col)
        here = frame.at(sizes[s.block])
        cols = {col: here.sizes[col]} if col is not None else {}
        if not all(_reads_own(x, here, row, cols, shape_dims, True) for x in _exprs(s)):
            return None
    return _Shape(rows, axes, shape_dims, index)


def _reads_own(x: Expr, frame: Frame, row: str, cols: Mapping[str, int],
               dims: Mapping[str, tuple[int, int | None, int]], top: bool) -> bool:
    """Whether every read of a loop tensor in ``x`` is of the element being computed: its row dimension at
    ``row``, its column dimension at one of ``cols`` (axis → size); reductions along a column, and (``top``:
    on an elementwise path from the value) a tensor-core product over (row, column) with ``b`` from memory."""
    if isinstance(x, TileLoad) and x.tensor.name in dims:
        rd, cd, size = dims[x.tensor.name]
        r = x.index[rd]
        if not isinstance(r, Slice) or r.axis != row:
            return False
        if cd is not None:
            c = x.index[cd]
            if not isinstance(c, Slice) or cols.get(c.axis) != size:
                return False
        return all(_reads_own(n, frame, row, cols, dims, False) for n in tile_children(x))
    if isinstance(x, Reduce):
        size = frame.sizes.get(x.axis, 0)
        if x.axis == row or size % 16 or not set(axes_of(x.tile)) <= {row, x.axis}:
            return False
        return _reads_own(x.tile, frame, row, {x.axis: size}, dims, False)
    if isinstance(x, Squeeze):
        return not any(isinstance(n, TileLoad) and n.tensor.name in dims for n in walk_tile_expr(x))
    if isinstance(x, Dot):
        if not top or mma_type(frame, x) is None:
            return False
        n_axes = [a for a in axes_of(x.b) if a != x.axis]
        if len(n_axes) != 1 or n_axes != list(cols) or set(axes_of(x.a)) != {row, x.axis}:
            return False
        if any(isinstance(n, TileLoad) and n.tensor.name in dims for n in walk_tile_expr(x.b)):
            return False
        k = frame.sizes[x.axis]
        from_registers = any(isinstance(n, TileLoad) and n.tensor.name in dims for n in walk_tile_expr(x.a))
        if from_registers and (k % 16 or any(isinstance(n, (Reduce, Dot)) for n in walk_tile_expr(x.a))):
            return False
        return (_reads_own(x.a, frame, row, {x.axis: k}, dims, False)
                and _reads_own(x.acc, frame, row, cols, dims, False))
    elementwise = not isinstance(x, (Reduce, Dot))
    return all(_reads_own(c, frame, row, cols, dims, top and elementwise) for c in tile_children(x))


def _chained(loop: Loop, dims: Mapping[str, object]) -> bool:
    """Whether some product of the loop has an ``a`` operand computed from the loop's registers."""
    body = _body(loop) or ()
    return any(isinstance(n, Dot) and any(isinstance(m, TileLoad) and m.tensor.name in dims
                                          for m in walk_tile_expr(n.a))
               for s in body for n in walk_tile_expr(s.value))


def warps_for(frame: Frame, loop: Loop) -> int | None:
    """The warps a kernel needs for ``loop`` to run in fragments (rows / 16), or None where it does not
    qualify (the options, no tensor cores, no chained product, too few rows, more than 32 warps)."""
    o = frame.options
    if not (o.fragment_loops and frame.tensor_cores):
        return None
    shape = _analyse(frame, loop)
    if shape is None or not _chained(loop, shape.dims):
        return None
    warps = -(-shape.rows // STRIP)
    if warps * STRIP < o.fragment_min_rows or warps > 32:
        return None
    return warps + (PRODUCER_WARPS if _producer(frame, loop, shape) else 0)


def _producer(frame: Frame, loop: Loop, shape: _Shape) -> bool:
    """Whether a warpgroup of its own copies the loop's operand tiles (warp specialisation, the options'
    ``producer_warp``): where every product will be a warpgroup product (:func:`_warpgroup`, judged here from
    the operands' shapes before they are planned) with its memory operands copied raw by cp.async, and the
    next iteration's tiles are copied during this one (``prefetch``).  Decided from the loop alone, so that the
    kernel's threads (:func:`warps_for`) and the plan (:func:`plan`) agree."""
    o = frame.options
    if not (frame.wgmma and o.producer_warp and o.prefetch and o.async_staging) or shape.rows % WARPGROUP_ROWS:
        return False
    for s in _body(loop) or ():
        for e in (n for n in walk_tile_expr(s.value) if isinstance(n, Dot)):
            here = dataclasses.replace(frame.at(axis_sizes(s)), swizzle=True)
            low = mma_type(here, e)
            if low is None:
                return False
            a, b = staging(here, e)
            registers = any(isinstance(n, TileLoad) and n.tensor.name in shape.dims for n in walk_tile_expr(e.a))
            copied = [b] if registers else [a, b]
            if not all(op.swizzled and raw_staging(op, low) is not None for op in copied) or b.rows_pad % PANEL:
                return False
            if registers and not o.round_operands:
                return False
            if not registers and (a.trans or a.rows_pad != shape.rows):
                return False
    return True


def epilogue(frame: Frame, loop: Loop, after: Sequence[Stmt]) -> tuple[TileStore, ...]:
    """The statements right after ``loop`` (``after``) computed from its registers and written to memory: each
    reads the loop's tensors at the element it writes (attention's ``out = pv / row_sum``), as a statement of
    the loop would, holds no product, and writes neither a loop tensor nor a tensor an earlier one reads."""
    shape = _analyse(frame, loop)
    if shape is None:
        return ()
    found: list[TileStore] = []
    written: set[str] = set()
    for s in after:
        if not isinstance(s, TileStore) or s.reducer is not None or s.tensor.name in shape.dims:
            break
        nodes = [n for x in _exprs(s) for n in walk_tile_expr(x)]
        index = [n for i in s.index for n in walk_tile_expr(i.start if isinstance(i, Slice) else i)]
        if any(isinstance(n, Dot) for n in nodes) or any(isinstance(n, TileLoad) for n in index):
            break
        loads = [n for n in nodes if isinstance(n, TileLoad)]
        if any(n.tensor.name in written for n in loads):
            break
        rows = {i.axis for n in loads if n.tensor.name in shape.dims
                for i in (n.index[shape.dims[n.tensor.name][0]],) if isinstance(i, Slice)}
        sizes = axis_sizes(s)
        slices = [i.axis for i in s.index if isinstance(i, Slice)]
        if len(rows) != 1 or len(slices) > 2:
            break
        row = rows.pop()
        col = next((a for a in slices if a != row), None)
        if row not in slices or sizes[row] != shape.rows or (col is not None and sizes[col] % 16):
            break
        cols = {col: sizes[col]} if col is not None else {}
        if not all(_reads_own(x, frame.at(sizes), row, cols, shape.dims, False) for x in _exprs(s)):
            break
        found.append(s)
        written.add(s.tensor.name)
    return tuple(found)


def units(frame: Frame, body: Stmt) -> dict[int, tuple[Loop, tuple[TileStore, ...]]]:
    """The loops of a kernel body (of ``frame.warps`` warps) that run in warp fragments, by identity, each
    with its epilogue."""
    found: dict[int, tuple[Loop, tuple[TileStore, ...]]] = {}

    def visit(s: Stmt, after: Sequence[Stmt]) -> None:
        if isinstance(s, Seq):
            for k, c in enumerate(s.stmts):
                visit(c, s.stmts[k + 1:])
        elif isinstance(s, Loop):
            if warps_for(frame, s) == frame.warps:
                found[id(s)] = (s, epilogue(frame, s, after))
            else:
                visit(s.body, ())

    visit(body, ())
    return found


def in_memory(frame: Frame, body: Stmt, loop: Loop, after: tuple[TileStore, ...]) -> frozenset[str]:
    """The tensors of a fragment ``loop`` that must be read before it and written back after it: those not
    allocated per iteration that live in global memory, or that a statement of the kernel ``body`` other than
    the loop's and its epilogue's (``after``) reads."""
    shape = _analyse(frame, loop)
    assert shape is not None
    inside = {id(s) for s in _body(loop) or ()} | {id(s) for s in after}
    read_outside = {n.tensor.name for s in walk_tile_stmts(body) if isinstance(s, TileStore) and id(s) not in inside
                    for x in [*_exprs(s), *(i.start if isinstance(i, Slice) else i for i in s.index)]
                    for n in walk_tile_expr(x) if isinstance(n, TileLoad)}
    allocated = set(allocated_at(loop))
    return frozenset(name for name in shape.dims if name not in allocated
                     and (name not in frame.shared_names or name in read_outside))


def registers_only(frame: Frame, body: Stmt) -> frozenset[str]:
    """The temporaries of a kernel body that its fragment loops keep in registers only (no shared memory)."""
    names: set[str] = set()
    for loop, after in units(frame, body).values():
        shape = _analyse(frame, loop)
        assert shape is not None
        names |= set(shape.dims) - in_memory(frame, body, loop, after)
    return frozenset(names)


def plan(frame: Frame, loop: Loop, after: tuple[TileStore, ...], memory: frozenset[str],
         operand: Callable[[str, Frame, Staged, DType], OperandPlan],
         fresh: Callable[[str], str]) -> FragmentLoop:
    """The fragment plan of ``loop`` (one of :func:`units`) with its epilogue ``after``: ``memory``, the tensors
    read before it and written back after it (:func:`in_memory`); ``operand(block, frame, staged, low)``:
    where a memory operand comes from."""
    shape = _analyse(frame, loop)
    body = _body(loop)
    assert shape is not None and body is not None
    allocated = set(allocated_at(loop))
    initial, values = _rewrite(body, loop.var.name, {n for n in shape.dims if n not in memory and n not in allocated})
    held = tuple(Held(name, fresh(f"fr_{name}_"), rd, cd, cols, name in allocated, name in memory, shape.index[name],
                      initial.get(name, 0.0))
                 for name, (rd, cd, cols) in shape.dims.items())
    stmts: dict[str, FragmentStmt] = {}
    buffers: list[tuple[str, int]] = []
    for s in body:
        row, col = shape.axes[s.block]
        dots = [n for n in walk_tile_expr(s.value) if isinstance(n, Dot)]
        if not dots:
            stmts[s.block] = FragmentStmt(s.block, row, col, value=values[s.block],
                                          unmasked=_mask_free(values[s.block], axis_sizes(s)) if col else None)
            continue
        e = dots[0]
        here = frame.at(axis_sizes(s))
        low = mma_type(here, e)
        assert low is not None
        a, b = staging(here, e)
        from_registers = any(isinstance(n, TileLoad) and n.tensor.name in shape.dims for n in walk_tile_expr(e.a))
        ops: list[OperandPlan] = []
        own: dict[str, str] = {}
        for role, op in (("a", a), ("b", b)):
            if role == "a" and from_registers:
                # rounded once to the product's type, or split hi + lo (the options' round_operands)
                ops.append(OperandPlan(dataclasses.replace(op, split=op.split and not frame.options.round_operands),
                                       "registers"))
                continue
            source = operand(s.block, here, op, low)
            ops.append(source)
            if source.own_bytes:
                name = fresh(f"f{role}")
                own[role] = name
                buffers.append((name, source.own_bytes))
        ntiles = b.rows_pad // 8
        pair = 2 if ntiles % 2 == 0 else 1
        instruction = WGMMA if _warpgroup(frame, shape.rows, ops[0], ops[1]) else MMA_SYNC
        dot = DotPlan(instruction, a.rows, b.rows, a.kk, low, ops[0], ops[1], a.rows_pad // STRIP, 1, ntiles, 1,
                      pair, None, M16N8)
        stmts[s.block] = FragmentStmt(s.block, row, col, dot, from_registers, own, values[s.block],
                                      _mask_free(values[s.block], axis_sizes(s)))
    masks = {s.block: s.mask for s in body}
    stmts = {block: _with_row_parts(st, masks[block]) for block, st in stmts.items()}
    for s in after:
        loads = [n for x in _exprs(s) for n in walk_tile_expr(x)
                 if isinstance(n, TileLoad) and n.tensor.name in shape.dims]
        i = loads[0].index[shape.dims[loads[0].tensor.name][0]]
        assert isinstance(i, Slice)
        col = next((x.axis for x in s.index if isinstance(x, Slice) and x.axis != i.axis), None)
        stmts[s.block] = _with_row_parts(FragmentStmt(s.block, i.axis, col, value=s.value), s.mask)
    shared = _shared_values(frame, body, shape, {b: [v, *([m] if m is not None else [])]
                                                 for b, (v, m) in ((x.block, (values[x.block], x.mask)) for x in body)},
                            fresh)
    # The next iteration's copies during this one: two buffers per operand; not where a tile is copied at every
    # iteration into a buffer of the loop (kept, or held by another product): those have one.
    sources = [op.source for st in stmts.values() if st.dot is not None for op in (st.dot.a, st.dot.b)
               if op is not None]
    every = any(op.source == "held" or (op.source == "kept" and op.every_iteration)
                for st in stmts.values() if st.dot is not None for op in (st.dot.a, st.dot.b) if op is not None)
    prefetch = frame.options.prefetch and bool(buffers) and not every and "held" not in sources
    if prefetch:
        buffers = [(name, 2 * nbytes) for name, nbytes in buffers]
    result = FragmentLoop(shape.rows, held, stmts, tuple(buffers), frame.options.reduce_chains, after, prefetch,
                          shared)
    if _producer(frame, loop, shape):
        if not (frame.swizzle and result.warpgroups and prefetch and set(sources) <= {"cp.async", "kept", "registers"}):
            raise InternalError(f"loop {loop.var.name}: a producer warp was planned for it, but its products or "
                                f"operands ({', '.join(sorted(set(sources)))}) do not allow one")
        result = dataclasses.replace(result, barriers=fresh("bar"))
    return result




def _warpgroup(frame: Frame, rows: int, a: OperandPlan, b: OperandPlan) -> bool:
    """Whether a product of a loop of ``rows`` rows runs as warpgroup products (``wgmma.m64n64k16``, one per
    64 rows, 64 columns of ``b`` and 16 of ``k``): where the operands are staged swizzled (:class:`Frame`'s
    ``swizzle``), the rows fill whole warpgroups, ``b`` (staged swizzled: 16-bit, not split) has whole panels of
    64 columns, and ``a`` is computed in registers and rounded once, or staged K-major with the loop's rows.  (Not
    an operand read from another product's tile: that tile has its own layout.)"""
    if not frame.swizzle or rows % WARPGROUP_ROWS:
        return False
    if not (b.source != "held" and b.staged.swizzled and b.staged.rows_pad % PANEL == 0):
        return False
    if a.source == "registers":
        return not a.staged.split
    return a.source != "held" and a.staged.swizzled and not a.staged.trans and a.staged.rows_pad == rows


def _mask_free(value: Expr, sizes: Mapping[str, int]) -> tuple[Expr, Expr] | None:
    """``value`` with its masks resolved, and the scalar condition (of the loop and grid variables) under which
    that is ``value`` at every element of the tile; None where it has no mask whose condition is an affine
    comparison of the tile's axes.  A mask is a select with a constant on one side; it resolves to the other
    side, the live value.  The condition is exact arithmetic on the comparison's extremes over the tile
    (:func:`_uniform`), so the fast path is taken only where it is the program."""
    guards: list[Expr] = []

    def resolve(n: Expr) -> Expr | None:
        if isinstance(n, (Reduce, Dot)):
            return n  # (computed before the elements: left as they are)
        if not isinstance(n, Select):
            return None
        constant = [_constant(n.true_value) is not None, _constant(n.false_value) is not None]
        if constant[0] == constant[1]:
            return None
        live_if = not constant[0]  # the live side is taken where the condition is live_if
        guard = _uniform(n.cond, live_if, sizes)
        if guard is None:
            return None
        guards.append(guard)
        return map_tile_expr(n.true_value if live_if else n.false_value, resolve)

    fast = map_tile_expr(value, resolve)
    if not guards:
        return None
    condition = guards[0]
    for g in guards[1:]:
        condition = BinOp("and", condition, g)
    return condition, fast


def _constant(x: Expr) -> Const | None:
    """The constant ``x`` is (possibly broadcast or permuted), else None."""
    while isinstance(x, (Broadcast, Permute)):
        x = x.tile
    return x if isinstance(x, Const) else None


_FLIP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def _uniform(cond: Expr, truth: bool, sizes: Mapping[str, int]) -> Expr | None:
    """A scalar condition under which ``cond`` is ``truth`` at every element of the tile (tile axes of
    ``sizes``), or None: comparisons of affine integer expressions of the tile axes and scalars, under ``and``,
    ``or`` and ``not``."""
    if isinstance(cond, Broadcast):
        return _uniform(cond.tile, truth, sizes)
    if isinstance(cond, Call) and cond.fn == "not":
        return _uniform(cond.args[0], not truth, sizes)
    if isinstance(cond, BinOp) and cond.op in ("and", "or"):
        a, b = _uniform(cond.a, truth, sizes), _uniform(cond.b, truth, sizes)
        if (cond.op == "and") == truth:  # all parts must be so
            return None if a is None or b is None else BinOp("and", a, b)
        return a if b is None else b if a is None else BinOp("or", a, b)
    if not (isinstance(cond, BinOp) and cond.op in _FLIP):
        return None
    op = cond.op if truth else _FLIP[cond.op]
    difference = _scalar(BinOp("-", cond.a, cond.b))
    if difference is None:
        return None
    try:
        form = linear_form(difference)
    except NonAffineIndex:
        return None
    # d = lhs - rhs must satisfy ``d op 0`` at every element: at its smallest over the tile for > and >=, at its
    # largest for < and <=.
    smallest = op in (">", ">=")
    bound: dict = {}
    for atom, c in form.items():
        if isinstance(atom, str) and atom.startswith("pf_axis_"):
            size = sizes[atom[len("pf_axis_"):]]
            if (c < 0) == smallest:
                bound[1] = bound.get(1, 0) + c * (size - 1)
        elif not isinstance(atom, str) and atom != 1:
            return None  # a floor or modulo atom of the axes: no simple extreme
        else:
            bound[atom] = bound.get(atom, 0) + c
    bound = {k: v for k, v in bound.items() if v}
    return BinOp(op, from_linear_form(bound, difference.dtype), Const(0, difference.dtype))


def _scalar(x: Expr) -> Expr | None:
    """``x`` (integer index arithmetic of tile axes) as a scalar expression, tile axis ``a`` the variable
    ``pf_axis_a``; None where it reads a tensor or is not integer arithmetic."""
    if isinstance(x, (Broadcast, Permute)):
        return _scalar(x.tile)
    if isinstance(x, Iota):
        return Var(f"pf_axis_{x.axis}", x.dtype)
    if isinstance(x, (Var, Const)):
        return x if x.dtype.is_int else None
    if isinstance(x, BinOp) and x.op in ("+", "-", "*") and x.dtype.is_int:
        a, b = _scalar(x.a), _scalar(x.b)
        return None if a is None or b is None else BinOp(x.op, a, b)
    return None


def _with_row_parts(st: FragmentStmt, mask: Expr | None) -> FragmentStmt:
    """``st`` with its :attr:`~FragmentStmt.row_parts` planned."""
    masks = [mask] if mask is not None else []
    assert st.value is not None
    parts: dict[Expr, tuple[Expr, ...]] = {}
    if st.col is not None:
        for value in (st.value, *([st.unmasked[1]] if st.unmasked is not None else [])):
            parts[value] = tuple(_row_parts([value, *masks], st.row, st.col))
    for r in _reductions([st.value, *masks]):
        parts[r.tile] = tuple(_row_parts([r.tile], st.row, r.axis))
    return dataclasses.replace(st, row_parts=parts)


def _rewrite(body: tuple[TileStore, ...], var: str, registers_only: set[str]
             ) -> tuple[dict[str, float], dict[str, Expr]]:
    """The values of the loop's statements with less work per element, equal in IEEE arithmetic:

    * a rolling update's first-iteration case ``select(var == 0, c, T)``, where ``T`` lives in registers only,
      its first write in the body is unmasked and every read of it up to that write is such a select with the
      same constant ``c``, is ``T`` itself once ``T``'s registers start at ``c`` (returned by tensor);
    * ``select(p, x, f·x)`` is ``x · select(p, 1, f)`` (``x·1`` is ``x`` for every ``x``, NaN, ±0 and ±inf
      included): one product per element, the select per row where ``p`` and ``f`` are.
    """
    def first_select(n: Expr, name: str) -> float | None:
        if (isinstance(n, Select) and isinstance(n.cond, BinOp) and n.cond.op == "=="
                and isinstance(n.cond.a, Var) and n.cond.a.name == var and isinstance(n.cond.b, Const)
                and n.cond.b.value == 0 and isinstance(n.true_value, Const) and isinstance(n.false_value, TileLoad)
                and n.false_value.tensor.name == name and n.false_value.mask is None):
            return float(n.true_value.value)
        return None

    initial: dict[str, float] = {}
    for name in sorted(registers_only):
        writers = [k for k, s in enumerate(body) if s.tensor.name == name]
        if not writers or body[writers[0]].mask is not None:
            continue  # (a masked first write would leave the initial value where the program has its own)
        constants: set[float] = set()
        loads = covered = 0
        for s in body[:writers[0] + 1]:
            for x in _exprs(s):
                for n in walk_tile_expr(x):
                    loads += isinstance(n, TileLoad) and n.tensor.name == name
                    c = first_select(n, name)
                    if c is not None:
                        covered += 1
                        constants.add(c)
        if loads and loads == covered and len(constants) == 1:
            initial[name] = constants.pop()

    def factor(n: Expr) -> Expr | None:
        if isinstance(n, Select) and n.dtype.is_float:
            for keep, scaled, first in ((n.true_value, n.false_value, True), (n.false_value, n.true_value, False)):
                if isinstance(scaled, BinOp) and scaled.op == "*":
                    for f, other in ((scaled.a, scaled.b), (scaled.b, scaled.a)):
                        if other == keep:
                            one = Const(1.0, f.dtype)
                            choice = Select(n.cond, one, f) if first else Select(n.cond, f, one)
                            return BinOp("*", map_tile_expr(keep, factor), map_tile_expr(choice, factor))
        return None

    values: dict[str, Expr] = {}
    for k, s in enumerate(body):
        def first(n: Expr, k: int = k) -> Expr | None:
            for name, c in initial.items():
                if first_select(n, name) == c and k <= min(j for j, x in enumerate(body) if x.tensor.name == name):
                    return n.false_value  # type: ignore[attr-defined]
            return None

        values[s.block] = map_tile_expr(map_tile_expr(s.value, first), factor)
    return initial, values


def _shared_values(frame: Frame, body: tuple[TileStore, ...], shape: _Shape, exprs: Mapping[str, list[Expr]],
                   fresh: Callable[[str], str]) -> tuple[SharedValue, ...]:
    """The largest costly subexpressions (a math function of the loop's tensors, no reduction or product)
    that two or more statements compute at the same elements (equal once their row and column axes are
    named alike), where no statement between the first and the last of them writes what they read; each is
    computed once, before the first."""
    def candidates(s: TileStore) -> dict[Expr, Expr]:
        row = shape.axes[s.block][0]
        found: dict[Expr, Expr] = {}

        def visit(x: Expr) -> None:
            nodes = list(walk_tile_expr(x))
            axes = axes_of(x)
            if (any(isinstance(n, Call) and n.fn not in CHEAP_CALLS for n in nodes)
                    and any(isinstance(n, TileLoad) and n.tensor.name in shape.dims for n in nodes)
                    and not any(isinstance(n, (Reduce, Dot, Squeeze)) for n in nodes)
                    and row in axes and len(axes) <= 2):
                col = next((a for a in axes if a != row), None)
                found.setdefault(rename_axes(x, {row: "_row", **({col: "_col"} if col else {})}), x)
            for c in tile_children(x):
                visit(c)

        for x in exprs[s.block]:
            visit(x)
        return found

    per_stmt = [candidates(s) for s in body]
    chosen: list[SharedValue] = []
    taken: set[Expr] = set()
    for k, s in enumerate(body):
        # largest first; a part of a value already shared is not shared again
        for key, node in sorted(per_stmt[k].items(), key=lambda kv: -sum(1 for _ in walk_tile_expr(kv[0]))):
            if key in taken or any(key in set(walk_tile_expr(t)) for t in taken):
                continue
            users = [j for j in range(k + 1, len(body)) if key in per_stmt[j]]
            if not users:
                continue
            reads = {n.tensor.name for n in walk_tile_expr(node) if isinstance(n, TileLoad)}
            if reads & {body[j].tensor.name for j in range(k, users[-1])}:
                continue
            row = shape.axes[s.block][0]
            col = next((a for a in axes_of(node) if a != row), None)
            widths = {_width(body[j], per_stmt[j][key], shape) for j in (k, *users)}
            cols = widths.pop()
            if widths or cols % 16:
                continue
            taken.add(key)
            chosen.append(SharedValue((node, *(per_stmt[j][key] for j in users)), fresh("cse"), s.block, row, col,
                                      cols))
    return tuple(chosen)


def _width(s: TileStore, node: Expr, shape: _Shape) -> int:
    """The size of ``node``'s column axis in statement ``s`` (0: a row value)."""
    row = shape.axes[s.block][0]
    col = next((a for a in axes_of(node) if a != row), None)
    return axis_sizes(s)[col] if col is not None else 0


# ---------------------------------------------------------------------------------------------- printing
def emit(em: CudaEmitter, loop: Loop, fl: FragmentLoop, offsets: Mapping[str, int],
         kept: tuple[tuple[str, int], ...]) -> None:
    """``loop`` and its epilogue as ``fl`` says; ``kept``: the loop's kept tiles (buffer, bytes), declared here."""
    body = _body(loop)
    assert body is not None
    held = {h.name: h for h in fl.held}
    em.line(f"// loop {loop.var.name} in warp fragments: each warp holds {STRIP} whole rows of every tile")
    em.open("")
    em.line(f"const int pf_warp = pf_tid / {em.warp}, pf_lane = pf_tid % {em.warp};")
    for name, nbytes in (*kept, *fl.buffers):
        em.shared_array("uint16_t", name, nbytes, offsets[name], fl.align)
    if fl.producer:
        assert fl.barriers is not None
        em.shared_array("uint64_t", fl.barriers, BARRIER_BYTES, offsets[fl.barriers])
        _specialised(em, loop, fl, body, held)
    else:
        _in_step(em, loop, fl, body, held)
    em.close()
    em.barrier()


def _in_step(em: CudaEmitter, loop: Loop, fl: FragmentLoop, body: tuple[TileStore, ...],
             held: Mapping[str, Held]) -> None:
    """Every warp copies and computes: the copies of an iteration published by a block barrier."""
    _load_held(em, fl)
    copies = any(st.dot is not None and any(op.source in ("kept", "cp.async") for op in (st.dot.a, st.dot.b)
                                              if op is not None) for st in fl.stmts.values())
    var, t = loop.var.name, em.widths.loop
    extent = em.scalar(loop.extent, {})
    if fl.prefetch:
        em.open(f"if ({extent} > 0)")  # the first iteration's copies
        em.line(f"const {t} {var} = 0;")
        _issue(em, fl, body, "first", var)
        em.close()
        em.line("pf::cp_async_commit();")
    em.open(em.loop_header(loop))
    if fl.prefetch:
        # This iteration's tiles have landed; after the barrier every warp is past the previous iteration's
        # products, so the other buffer is free for the next iteration's copies.
        em.line("pf::cp_async_wait<0>();")
        if fl.warpgroups:
            em.line("pf::fence_async_shared();  // (the copies, visible to the warpgroup products)")
        em.barrier()
        arrays = _issue(em, fl, body, "read", var)
        em.open(f"if ({var} + 1 < {extent})")
        em.line(f"const {t} pf_next = {var} + 1;")
        em.open("")
        em.line(f"const {t} {var} = pf_next;  // the next iteration's tiles")
        _issue(em, fl, body, "next", var)
        em.close()
        em.close()
        em.line("pf::cp_async_commit();")
        waits: dict[str, int | None] = {b: None for b in fl.stmts}
    else:
        em.barrier()  # the previous iteration's products have read the buffers this one refills
        arrays, single = _issue_each(em, fl, body)
        waits = dict(single)
    _iteration(em, fl, body, held, arrays, waits)
    em.close()
    if copies:
        em.line("pf::cp_async_wait<0>();")
    _finish(em, fl, held)


def _specialised(em: CudaEmitter, loop: Loop, fl: FragmentLoop, body: tuple[TileStore, ...],
                 held: Mapping[str, Held]) -> None:
    """Warp specialisation: the last warpgroup copies iteration ``j``'s operand tiles into stage ``j % 2`` once
    the computing warps have released it (``empty``), each of its threads arriving on ``full`` when its copies
    land; the computing warps wait for ``full``, compute, and arrive on ``empty``.  The producer gives registers
    back and the others take them (``setmaxnreg``: the computing warps hold every tile in registers).  The tiles
    copied once (the query tile) are copied by every thread before the roles split.  mbarrier phases: stage
    ``s`` completes phase ``j / 2`` at iteration ``j``, so ``full`` is waited with parity ``(j / 2) & 1`` and
    ``empty`` (for the iteration two before) with the other one."""
    bars, var = fl.barriers, loop.var.name
    computing = -(-fl.rows // STRIP) * em.warp
    producers = PRODUCER_WARPS * em.warp
    extent = em.scalar(loop.extent, {})
    em.open(f"if ({extent} > 0)")
    em.line(f"[[maybe_unused]] const {em.widths.loop} {var} = 0;")
    _issue(em, fl, body, "kept", var)
    em.close()
    em.line("pf::cp_async_commit();")
    em.line("pf::cp_async_wait<0>();")
    em.line("pf::fence_async_shared();")
    em.open("if (pf_tid == 0)")
    for stage in range(STAGES):
        em.line(f"pf::mbarrier_init(&{bars}[{stage}], {producers});  // full: one arrival per copying thread")
        em.line(f"pf::mbarrier_init(&{bars}[{STAGES + stage}], {computing});  // empty: every computing thread")
    em.close()
    em.barrier()
    em.open(f"if (pf_tid >= {computing})")
    em.line(f"pf::setmaxnreg_dec<{PRODUCER_REGISTERS}>();")
    em.open(em.loop_header(loop))
    em.line(f"if ({var} >= {STAGES}) pf::mbarrier_wait(&{bars}[{STAGES} + ({var} & 1)], (({var} >> 1) & 1) ^ 1);")
    with em.threads_as(f"pf_tid - {computing}", producers):
        _issue(em, fl, body, "next", var)
    em.line(f"pf::cp_async_arrive(&{bars}[{var} & 1]);")
    em.close()
    em.line("pf::cp_async_wait<0>();")
    em.close()
    em.open("else")
    em.line(f"pf::setmaxnreg_inc<{fl.computing_registers}>();")
    _load_held(em, fl)
    em.open(em.loop_header(loop))
    em.line(f"pf::mbarrier_wait(&{bars}[{var} & 1], ({var} >> 1) & 1);")
    em.line("pf::fence_async_shared();  // (the producer's copies, visible to the warpgroup products)")
    arrays = _issue(em, fl, body, "read", var)
    _iteration(em, fl, body, held, arrays, {b: None for b in fl.stmts})
    em.line(f"pf::mbarrier_arrive(&{bars}[{STAGES} + ({var} & 1)]);")
    em.close()
    _finish(em, fl, held)
    em.close()


def _load_held(em: CudaEmitter, fl: FragmentLoop) -> None:
    """Declare the registers that outlive an iteration, reading those the loop keeps in memory."""
    for h in fl.held:
        if not h.per_iteration:
            em.line(h.declaration())
        if h.memory:
            _each(em, fl.rows, h, lambda h, env: em.line(
                f"{h.element} = {em.from_storage(em.access(em.tensors[h.name], h.index, env), dt.f32)};"))


def _iteration(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...], held: Mapping[str, Held],
               arrays: Mapping[tuple[str, str], str], waits: Mapping[str, int | None]) -> None:
    """One iteration's statements on the registers (``arrays``: the operands in shared memory)."""
    for h in fl.held:
        if h.per_iteration:
            em.line(h.declaration())
    shared: list[Expr] = []
    try:
        for s in body:
            for v in fl.shared:
                if v.before == s.block:
                    _shared_value(em, fl, held, v)
                    shared += v.nodes
            _statement(em, fl, held, s, arrays, waits.get(s.block))
    finally:
        for node in shared:
            em.overrides.pop(node, None)


def _finish(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held]) -> None:
    """The epilogue's statements from the registers, and the tensors the loop keeps in memory written back."""
    for s in fl.epilogue:
        _statement(em, fl, held, s, {}, None)
    for h in fl.held:
        if h.memory:
            _each(em, fl.rows, h, lambda h, env: em.line(
                f"{em.access(em.tensors[h.name], h.index, env)} = {em.to_storage(h.element, dt.f32)};"),
                  writer=True)


def _each(em: CudaEmitter, rows: int, h: Held, body: Callable[[Held, dict[str, str]], None],
          writer: bool = False) -> None:
    """``body(h, env)`` for every element of ``h`` the thread holds (``writer``: real rows only, and one lane per
    row of a row vector)."""
    index_axes = {d: i.axis for d, i in enumerate(h.index) if isinstance(i, Slice)}
    _rows(em, index_axes[h.row_dim], rows)
    if writer and rows % STRIP:
        em.open(f"if (pf_m < {rows})")
    if h.col_dim is not None:
        _cols(em, index_axes[h.col_dim], h.cols)
        body(h, {index_axes[h.row_dim]: axis_var(index_axes[h.row_dim]),
                 index_axes[h.col_dim]: axis_var(index_axes[h.col_dim])})
        em.close()
        em.close()
    else:
        em.open("if (pf_lane % 4 == 0)" if writer else "")
        body(h, {index_axes[h.row_dim]: axis_var(index_axes[h.row_dim])})
        em.close()
    if writer and rows % STRIP:
        em.close()
    em.close()


def _rows(em: CudaEmitter, axis: str, rows: int) -> None:
    """Open the loop over the thread's two rows (``pf_h``; ``pf_m`` the row), binding ``axis`` to the row.  Past
    ``rows`` (the last strip's padding) the axis is the last row: those registers compute a copy of it, read
    nothing out of bounds and are never written back."""
    em.line("#pragma unroll")
    em.open("for (int pf_h = 0; pf_h < 2; ++pf_h)")
    em.line(f"const int pf_m = pf_warp * {STRIP} + {M16N8.row('pf_lane', 'pf_h')};")
    row = "pf_m" if rows % STRIP == 0 else f"(pf_m < {rows} ? pf_m : {rows - 1})"
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(axis)} = {row};")


def _cols(em: CudaEmitter, axis: str, size: int) -> None:
    """Open the loops over the thread's columns of a ``size``-wide tile (``pf_nb``, ``pf_j``; register ``pf_q``),
    binding ``axis`` to the column."""
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {size // 8}; ++pf_nb)")
    em.line("#pragma unroll")
    em.open("for (int pf_j = 0; pf_j < 2; ++pf_j)")
    em.line("[[maybe_unused]] const int pf_q = pf_h * 2 + pf_j;")
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(axis)} = pf_nb * 8 + {M16N8.col('pf_lane', 'pf_j')};")


def _buffer(fl: FragmentLoop, name: str, var: str) -> str:
    """C text of a staging buffer's part for the iteration ``var`` names (with prefetch, two alternate)."""
    if not fl.prefetch:
        return name
    half = dict(fl.buffers)[name] // 4  # 16-bit elements of one of its two parts
    return f"({name} + ({var} & 1) * {half})"


def _issue(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...], mode: str, var: str
           ) -> dict[tuple[str, str], str]:
    """With prefetch: the copies of the iteration whose loop variable ``var`` is in scope (``first``: before the
    loop, kept tiles too; ``next``: the next iteration's; ``kept``: the kept tiles only) or (``read``) only the
    arrays this iteration's products read.  Returns each memory operand's array by (block, role)."""
    arrays: dict[tuple[str, str], str] = {}
    for st, role, op, low in _memory_operands(em, fl, body):
        if op.source == "kept":
            assert op.buffer is not None
            arrays[(st.block, role)] = op.buffer
            if mode in ("first", "kept"):
                copy_async(em, op.staged, low, op.buffer)
            continue
        arr = _buffer(fl, st.buffers[role], var)
        arrays[(st.block, role)] = arr
        if mode in ("first", "next"):
            _stage(em, op, low, arr)
    return arrays


def _memory_operands(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...]):
    """(statement plan, role, operand plan, 16-bit type) of every product operand that comes from memory, in
    order, with the emitter's axis sizes set to its statement's."""
    for s in body:
        st = fl.stmts[s.block]
        if st.dot is None:
            continue
        em.sizes = axis_sizes(s)
        low = st.dot.low
        assert low is not None
        for role, op in (("a", st.dot.a), ("b", st.dot.b)):
            assert op is not None
            if op.source != "registers":
                yield st, role, op, low


def _stage(em: CudaEmitter, op: OperandPlan, low: DType, arr: str) -> None:
    """Copy or convert operand ``op`` into ``arr`` (cp.async where raw, else through registers)."""
    if op.source == "cp.async":
        for part, offset in op.parts:
            copy_async(em, part, low, f"({arr} + {offset})" if offset else arr)
    elif not (op.source == "raw" and stage_raw(em, op.staged, low, arr)) and not stage_vector(
            em, op.staged, LOW[low.name], arr):
        stage_elements(em, op.staged, LOW[low.name], arr)


def _issue_each(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...]
                ) -> tuple[dict[tuple[str, str], str], dict[str, int]]:
    """Without prefetch: stage every memory operand of the iteration's products, in order, at its top (the
    cp.async copies of each product one group).  Returns each operand's array by (block, role), and by block
    the number of copy groups committed at every iteration after the product's own: what its wait may leave in
    flight (a tile kept from the first iteration commits only then, so it is not counted: waiting for fewer is
    safe)."""
    arrays: dict[tuple[str, str], str] = {}
    groups: list[tuple[str, int]] = []
    for block, operands in itertools.groupby(_memory_operands(em, fl, body), key=lambda x: x[0].block):
        count, own_async = 0, False
        for st, role, op, low in operands:
            if op.source in ("kept", "held"):
                arr = em.fresh(f"t{role}")
                consume(em, op, low, arr)  # (a kept tile commits its own group)
                count += int(op.source == "kept" and op.every_iteration)
            else:
                arr = st.buffers[role]
                _stage(em, op, low, arr)
                own_async = own_async or op.source == "cp.async"
            arrays[(block, role)] = arr
        if own_async:
            em.line("pf::cp_async_commit();")
            count += 1
        groups.append((block, count))
    waits: dict[str, int] = {}
    later = 0
    for block, count in reversed(groups):
        waits[block] = later
        later += count
    return arrays, waits


def _statement(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], s: TileStore,
               arrays: Mapping[tuple[str, str], str], wait: int | None) -> None:
    """Statement ``s`` on the thread's fragment elements: into its registers, or (the epilogue) into memory
    for the real rows.  ``wait``: copy groups its product may leave in flight before its barrier (None: the
    iteration's copies have been waited for)."""
    st = fl.stmts[s.block]
    em.sizes = axis_sizes(s)
    em.materialized = {}
    em.line(f"// {s.block}")
    em.open("")
    env = {a: axis_var(a) for a in em.sizes}
    added: list[Expr] = []

    def override(node: Expr, text: str) -> None:
        em.overrides[node] = text
        added.append(node)

    value_expr = st.value if st.value is not None else s.value
    exprs = [value_expr, *([s.mask] if s.mask is not None else [])]
    added += _load_overrides(em, held, exprs, env)
    try:
        for r in _reductions(exprs):
            # The thread's columns in fl.chains independent partials (column tiles in turn), combined in a tree,
            # then the four lanes of the row by shuffles: short dependency chains.  (A reduction's order is
            # free: max and min are exact, f32 sums are within the tolerance's term for any order.)
            name, ct = em.fresh("fr"), em.reduce_type(r)
            em.line(f"{ct} {name}[2];")
            _rows(em, st.row, fl.rows)
            for x in st.row_parts[r.tile]:
                part = em.fresh("row")
                em.line(f"[[maybe_unused]] const {em.ctype(x.dtype)} {part} = {em.scalar(x, env)};")
                override(x, part)
            acc = em.fresh("acc")
            chains = min(fl.chains, 2 * (em.sizes[r.axis] // 8))
            em.line(f"{ct} {acc}[{chains}];")
            em.line("#pragma unroll")
            em.line(f"for (int pf_c = 0; pf_c < {chains}; ++pf_c) {acc}[pf_c] = {_REDUCE_INIT[r.op]};")
            _cols(em, r.axis, em.sizes[r.axis])
            at = f"{acc}[(pf_nb * 2 + pf_j) % {chains}]"
            em.line(f"{at} = {em.combine(r.op, at, em.scalar(r.tile, env), ct)};")
            em.close()
            em.close()
            step = chains // 2
            while step:
                em.line("#pragma unroll")
                em.line(f"for (int pf_c = 0; pf_c < {step}; ++pf_c) "
                        f"{acc}[pf_c] = {em.combine(r.op, f'{acc}[pf_c]', f'{acc}[pf_c + {step}]', ct)};")
                step //= 2
            em.line(f"{ct} {acc}_row = {acc}[0];")
            em.shuffle_combine(r.op, f"{acc}_row", ct, 4)  # the four lanes of the row
            em.line(f"{name}[pf_h] = {em.reduce_result(r, f'{acc}_row')};")
            em.close()
            override(r, f"{name}[pf_h]")
        if st.dot is not None:
            e = next(n for n in walk_tile_expr(value_expr) if isinstance(n, Dot))
            acc = _product(em, fl, st, e, env, arrays, wait)
            total = f"{acc}[pf_nb][pf_q]"
            zero = _constant(e.acc)
            if zero is None or zero.value != 0:  # (the accumulators started at +0)
                total = em.rounded(f"({em.scalar(e.acc, env)} + {total})", e.dtype)
            override(e, total)
        if st.unmasked is not None:
            # Where no element of this iteration's tile is masked (the main part of a causal or windowed
            # loop, a tile away from a ragged edge), the elements are computed without the masks.
            em.open(f"if ({em.scalar(st.unmasked[0], {})})")
            _elements(em, fl, held, s, st, st.unmasked[1], env)
            em.close()
            em.open("else")
        _elements(em, fl, held, s, st, value_expr, env)
        if st.unmasked is not None:
            em.close()
    finally:
        for node in added:
            em.overrides.pop(node, None)
    em.close()


def _elements(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], s: TileStore, st: FragmentStmt,
              value_expr: Expr, env: dict[str, str]) -> None:
    """The elementwise pass of statement ``s``: ``value_expr`` at every element the thread holds, into its
    registers or (the epilogue) into memory for the real rows."""
    target = held.get(s.tensor.name)
    _rows(em, st.row, fl.rows)
    if target is None and fl.rows % STRIP:
        em.open(f"if (pf_m < {fl.rows})")  # (the padding rows' registers are copies of the last row)
    parts: list[Expr] = []
    if st.col is not None:
        for x in st.row_parts[value_expr]:
            name = em.fresh("row")
            em.line(f"[[maybe_unused]] const {em.ctype(x.dtype)} {name} = {em.scalar(x, env)};")
            if x not in em.overrides:
                em.overrides[x] = name
                parts.append(x)
        _cols(em, st.col, em.sizes[st.col])
    if target is not None:
        value = em.convert(em.scalar(value_expr, env), value_expr.dtype, dt.f32)
        if s.mask is not None:
            value = f"({em.scalar(s.mask, env)}) ? {value} : {target.element}"
        em.line(f"{target.element} = {value};")
    else:
        em.assign(s, env)
    if st.col is not None:
        em.close()
        em.close()
    if target is None and fl.rows % STRIP:
        em.close()
    em.close()
    for x in parts:  # (their variables are out of scope now)
        del em.overrides[x]


def _shared_value(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], v: SharedValue) -> None:
    """Compute shared value ``v`` into its registers; statements read it from there (an override)."""
    em.line(f"// computed once for the statements that use it: {v.register}")
    em.line(f"float {v.register}{f'[{v.cols // 8}][4]' if v.col is not None else '[2]'};")
    node = v.nodes[0]
    env = {a: axis_var(a) for a in axes_of(node)}
    added = _load_overrides(em, held, [node], env)
    try:
        _rows(em, v.row, fl.rows)
        if v.col is not None:
            _cols(em, v.col, v.cols)
        element = f"{v.register}[pf_nb][pf_q]" if v.col is not None else f"{v.register}[pf_h]"
        em.line(f"{element} = {em.convert(em.scalar(node, env), node.dtype, dt.f32)};")
        if v.col is not None:
            em.close()
            em.close()
        em.close()
    finally:
        for node in added:
            em.overrides.pop(node, None)
    for n in v.nodes:
        em.overrides[n] = element


def _load_overrides(em: CudaEmitter, held: Mapping[str, Held], exprs: list[Expr], env: dict[str, str]) -> list[Expr]:
    """Make every load of a held tensor in ``exprs`` read its register (masked loads: under the mask, else
    ``other``); returns the nodes overridden."""
    added: list[Expr] = []
    for x in exprs:
        for n in walk_tile_expr(x):
            if isinstance(n, TileLoad) and n.tensor.name in held and n not in em.overrides:
                element = held[n.tensor.name].element
                if n.mask is not None:
                    other = em.literal(n.other.value if n.other is not None else 0, n.tensor.dtype)
                    element = f"({em.scalar(n.mask, env)} ? {element} : {other})"
                em.overrides[n] = element
                added.append(n)
    return added


def _row_parts(exprs: list[Expr], row: str, col: str) -> list[Expr]:
    """The largest parts of a statement's value that depend on no axis but its ``row`` (a rolling update's
    rescale factor and conditions, ALiBi's slope) and read a tensor or a reduction or call a math function:
    computed once per row of the thread, before its columns.  Not inside a product or a reduction (their
    operands have other axes)."""
    found: list[Expr] = []

    def visit(x: Expr) -> None:
        if x in found or isinstance(x, (Var, Const, Dot, Reduce)):
            return
        nodes = list(walk_tile_expr(x))
        if (set(axes_of(x)) <= {row, col} and not depends_on(x, col) and not isinstance(x, TileLoad)
                and any(_costly(n) for n in nodes) and not any(isinstance(n, Dot) for n in nodes)):
            found.append(x)
            return
        for c in tile_children(x):
            visit(c)

    for x in exprs:
        visit(x)
    return found


def _costly(n: Expr) -> bool:
    """A node worth computing once where it can: a read, a reduction, a math function, a power or division."""
    return (isinstance(n, (TileLoad, Reduce)) or (isinstance(n, Call) and n.fn not in CHEAP_CALLS)
            or (isinstance(n, BinOp) and n.op in ("pow", "/", "//", "%")))


def _reductions(exprs: list[Expr]) -> list[Reduce]:
    """The statement's reductions, innermost first, each once (none inside a product)."""
    found: list[Reduce] = []

    def visit(x: Expr) -> None:
        if isinstance(x, Dot):
            visit(x.acc)
            return
        for c in tile_children(x):
            visit(c)
        if isinstance(x, Reduce) and x not in found:
            found.append(x)

    for x in exprs:
        visit(x)
    return found


def _product(em: CudaEmitter, fl: FragmentLoop, st: FragmentStmt, e: Dot, env: dict[str, str],
             arrays: Mapping[tuple[str, str], str], wait: int | None) -> str:
    """The accumulators of the statement's product (zero-based, ``float name[ntiles][4]``); returns the name."""
    plan = st.dot
    assert plan is not None and plan.a is not None and plan.b is not None and plan.low is not None
    low = LOW[plan.low.name]
    a, b = plan.a.staged, plan.b.staged
    ntiles = b.rows_pad // 8
    acc = em.fresh("fc")
    em.line(f"float {acc}[{ntiles}][4] = {{}};")
    split = a.split
    if not st.a_registers:
        sa = arrays[(st.block, "a")]
    sb = arrays[(st.block, "b")]
    if wait is not None:
        em.line(f"pf::cp_async_wait<{wait}>();")
        if plan.instruction == WGMMA:
            em.line("pf::fence_async_shared();")
        em.barrier()
    if plan.instruction == WGMMA:
        _warpgroup_product(em, fl, st, e, env, acc, None if st.a_registers else sa, sb)
        return acc
    em.line("#pragma unroll")
    em.open(f"for (int pf_ks = 0; pf_ks < {a.kp // 16}; ++pf_ks)")
    if st.a_registers:
        em.line("uint32_t pf_fa[4];")
        if split:
            em.line("uint32_t pf_fa_lo[4];")
        _register_a(em, fl, st, e, env, "pf_fa", "pf_fa_lo" if split else None)
    else:
        fa = LdmatrixFragment("a", a.trans)
        at = fa.address("pf_lane", "pf_warp", "pf_ks * 16", a.stride)
        for name, offset in (("pf_fa", ""), ("pf_fa_lo", f"{a.size} + ")) if split else (("pf_fa", ""),):
            em.line(f"uint32_t {name}[4];")
            em.line(f"{fa.instruction}({name}, &{sa}[{offset}{at}]);")
    fb = LdmatrixFragment("b", b.trans, plan.pair)
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {ntiles}; pf_nb += {plan.pair})")
    at = fb.address("pf_lane", "pf_nb", "pf_ks * 16", b.stride)
    parts = (("pf_fb", ""), ("pf_fb_lo", f"{b.size} + ")) if b.split else (("pf_fb", ""),)
    for name, offset in parts:
        em.line(f"uint32_t {name}[{fb.registers}];")
        em.line(f"{fb.instruction}({name}, &{sb}[{offset}{at}]);")
        for j in range(plan.pair if plan.pair > 1 else 0):  # (one ldmatrix.x4: two tiles' fragments)
            em.line(f"const uint32_t {name}_{j}[2] = {{{name}[{2 * j}], {name}[{2 * j + 1}]}};")
    products = [("pf_fa", "pf_fb"), *((("pf_fa_lo", "pf_fb"),) if split else ()),
                *((("pf_fa", "pf_fb_lo"),) if b.split else ())]
    for fa_name, fb_name in products:
        for j in range(plan.pair):
            operand = f"{fb_name}" if plan.pair == 1 else f"{fb_name}_{j}"
            em.line(f"pf::mma_{low}({acc}[pf_nb{f' + {j}' if j else ''}], {fa_name}, {operand});")
    em.close()
    em.close()
    return acc


def _register_a(em: CudaEmitter, fl: FragmentLoop, st: FragmentStmt, e: Dot, env: dict[str, str], fa: str,
                fa_lo: str | None) -> None:
    """The A fragment of k step ``pf_ks`` of a product whose ``a`` is computed from registers, into the four
    registers ``fa`` (and the lo parts into ``fa_lo`` where split).

    a's values of the step (two 8-column tiles of the registers' columns) are computed here, so that only one
    step's are live, then packed in pairs: registers 0-3 are (row g, k 2t..), (g + 8, 2t..), (g, 2t + 8..),
    (g + 8, 2t + 8..), the accumulator layout of tiles 2·step and 2·step + 1 (per warp, the same for
    ``mma.sync`` and for the four warps of a warpgroup product)."""
    plan = st.dot
    assert plan is not None and plan.a is not None and plan.low is not None
    low = LOW[plan.low.name]
    a = plan.a.staged
    values = em.fresh("fa")
    em.line(f"float {values}[2][4];  // a = {a.rows}x{a.kk} from registers, k {16} columns of this step")
    _rows(em, st.row, fl.rows)
    em.line("#pragma unroll")
    em.open("for (int pf_t = 0; pf_t < 2; ++pf_t)")
    em.line("#pragma unroll")
    em.open("for (int pf_j = 0; pf_j < 2; ++pf_j)")
    em.line("[[maybe_unused]] const int pf_nb = 2 * pf_ks + pf_t, pf_q = pf_h * 2 + pf_j;")
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(e.axis)} = pf_nb * 8 + "
            f"{M16N8.col('pf_lane', 'pf_j')};")
    em.line(f"{values}[pf_t][pf_q] = {em.convert(em.scalar(e.a, env), e.a.dtype, dt.f32)};")
    em.close()
    em.close()
    em.close()
    for r, (nb, q) in enumerate(((0, 0), (0, 2), (1, 0), (1, 2))):
        pair = [f"{values}[{nb}][{q + j}]" for j in (0, 1)]
        em.line(f"{fa}[{r}] = pf::pack_{low}({pair[0]}, {pair[1]});")
        if fa_lo is not None:
            rest = [f"pf::split_rest({p}, pf::round_{low}({p}))" for p in pair]
            em.line(f"{fa_lo}[{r}] = pf::pack_{low}({rest[0]}, {rest[1]});")


def _warpgroup_product(em: CudaEmitter, fl: FragmentLoop, st: FragmentStmt, e: Dot, env: dict[str, str],
                       acc: str, sa: str | None, sb: str) -> None:
    """The statement's product as warpgroup products into ``acc``: warpgroup ``pf_warp / 4`` multiplies its 64
    rows of ``a`` (from swizzled ``sa``, or from registers where ``sa`` is None) by each 64-column chunk ``c``
    of ``b`` (swizzled ``sb``) into tiles ``8c ..`` of ``acc``, one ``wgmma.m64n64k16`` per chunk and k step.

    A wgmma reads its register operands asynchronously: every A fragment is computed before the fence that
    precedes the first product, and the accumulators are read after the wait for all of them."""
    plan = st.dot
    assert plan is not None and plan.a is not None and plan.b is not None and plan.low is not None
    a, b = plan.a.staged, plan.b.staged
    steps = a.kp // 16
    name = f"pf::wgmma_m64n64k16_{LOW[plan.low.name]}"
    if sa is None:
        em.line(f"uint32_t pf_fa[{steps}][4];  // every k step's A fragment, before the fence")
        em.line("#pragma unroll")
        em.open(f"for (int pf_ks = 0; pf_ks < {steps}; ++pf_ks)")
        _register_a(em, fl, st, e, env, "pf_fa[pf_ks]", None)
        em.close()
    em.line("pf::wgmma_fence();")
    em.line("#pragma unroll")
    em.open(f"for (int pf_ks = 0; pf_ks < {steps}; ++pf_ks)")
    # Element offsets (k steps of 16 columns: 32 bytes along a K-major panel's rows, 16 rows of an N-major one).
    k_major = "(pf_ks / 4) * {panel} + (pf_ks % 4) * 16"
    if sa is not None:
        at = k_major.format(panel=a.outer_pad * PANEL) + f" + (pf_warp / 4) * {WARPGROUP_ROWS * PANEL}"
        em.line(f"const uint64_t pf_da = pf::wgmma_desc_k128({sa} + {at});")
    for c in range(b.rows_pad // PANEL):
        if b.trans:
            at = f"{c * b.outer_pad * PANEL} + pf_ks * {16 * PANEL}"
        else:
            at = k_major.format(panel=b.outer_pad * PANEL) + (f" + {c * PANEL * PANEL}" if c else "")
        db = f"pf::wgmma_desc_k128({sb} + {at})"
        template = f"<{int(b.trans)}, {c}>"
        if sa is None:
            em.line(f"{name}_rs{template}({acc}, pf_fa[pf_ks], {db}, pf_ks > 0);")
        else:
            em.line(f"{name}{template}({acc}, pf_da, {db}, pf_ks > 0);")
    em.close()
    em.line("pf::wgmma_commit();")
    em.line("pf::wgmma_wait<0>();")
