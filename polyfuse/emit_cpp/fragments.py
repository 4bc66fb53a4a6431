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
select is the registers' initial value (:func:`rewrite`); and where a scalar guard proves that no element of an
iteration's tile is masked, a statement is computed without its masks (:func:`mask_free`: the main part of a
causal or windowed loop).

A masked store keeps the register's old value where its mask is false, so the semantics are the tile
program's; the tiles the loop allocates per iteration start at zero at each iteration (their values at
masked-out elements are undefined in the program, and no unmasked read reaches them).  The tiles that outlive
the loop are read from memory before it and written back after it where another statement reads them
(:func:`in_memory`); the statements right after the loop that read them element by element (attention's
``out``) are computed from the registers instead (:func:`epilogue`), so that O and the statistics need no
shared memory at all.

On a device with warpgroup products (sm_90a) the same loop multiplies with ``wgmma.m64n64k16``
(:mod:`~polyfuse.emit_cpp.warpgroups`): the four warps of a warpgroup own 64 rows, each still in the per-warp
m16n8 layout above (the wgmma accumulator layout is that one, repeated), so nothing else changes; the operands
in shared memory are staged into 128-byte-swizzled panels of 64 columns that the product reads through
descriptors, and ``a`` from registers is packed exactly as for ``mma.sync``.  Where every product can be one, a
**producer warpgroup** of its own copies the operand tiles into two stages tracked by mbarriers and gives its
registers to the computing warps (:func:`_producer`), which then never wait at a block barrier.  The plan
(:class:`FragmentLoop`) is printed by :mod:`polyfuse.emit_cpp.fragment_emit`.

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
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from polyfuse.emit_cpp import reciprocal, tma, warpgroups
from polyfuse.emit_cpp.warpgroups import PRODUCER_REGISTERS, PRODUCER_WARPS, WARPGROUP_ROWS
from polyfuse.emit_cpp.cfamily import CHEAP_CALLS
from polyfuse.emit_cpp.fragment_values import (
    accumulated, constant, mask_free, reductions, rewrite, row_parts, store_exprs,
)
from polyfuse.emit_cpp.reciprocal import Reciprocal
from polyfuse.emit_cpp.resident import tile_shape
from polyfuse.emit_cpp.vector import VECTOR_BYTES, aligned
from polyfuse.emit_cpp.dotplan import (
    M16N8, MMA_SYNC, PANEL, SWIZZLE_ALIGN, WGMMA, DotPlan, Frame, OperandPlan, Staged,
    mma_type, raw_staging, staging,
)
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.errors import InternalError
from polyfuse.ir.expr import Call, Const, Expr, Select, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.visit import substitute
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Dot, Index, Reduce, Slice, Squeeze, TileLoad, TileStore, axes_of, axis_sizes, depends_on, tensors_read,
    tile_children,
    walk_tile_expr, walk_tile_stmts,
)
from polyfuse.tiling.inline import rename_axes
from polyfuse.tiling.relax import bounds
from polyfuse.tiling.parallel import allocated_at, on_warp_groups

STRIP = M16N8.rows
"""Rows of a tile each warp owns (one m16 strip)."""
STAGES = 2
"""Operand tiles in flight with a producer warpgroup: the one being computed on and the next."""
DEFERRED_STAGES = 3
"""Operand tiles in flight where a product is issued one iteration late (:class:`Deferred`): the previous
iteration's (its ``b`` is still read), this one's and the next."""
REGISTER_OVERHEAD = 24
"""Registers a fragment loop's thread needs beside its tiles and its largest product's accumulators
(:attr:`FragmentLoop.registers`): operand fragments, addresses, loop state.  A low estimate errs towards asking
``__launch_bounds__`` for a second block where the tiles nearly fit, which ptxas then meets by reusing the
registers of tiles that are dead at different times; a high one would leave the SM half empty."""


@dataclass(frozen=True)
class Held:
    """Tensor ``name`` in the registers ``register``: ``[cols / 8][4]`` per thread (a row vector: ``[2]``).
    ``row_dim``/``col_dim``: the dimensions of its accesses' ``index`` that are the tile's rows and columns;
    ``per_iteration``: allocated by the loop at each iteration (declared in its body); ``memory``: written back
    to its tensor after the loop (a temporary in global memory, or one that a statement other than the loop's
    and its epilogue's reads), and read from it before the loop unless the loop's first iteration reads only
    its ``initial`` value (``loaded``); otherwise it lives in registers only."""

    name: str
    register: str
    row_dim: int
    col_dim: int | None
    cols: int
    per_iteration: bool
    memory: bool
    index: tuple[Index, ...]
    initial: float = 0.0
    """The registers' value before the loop (unless ``loaded``): what the program's first iteration reads."""
    loaded: bool = False
    """Read from its tensor before the loop."""

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
    """The statement's value as computed here (:func:`rewrite`: the same value in every case of IEEE
    arithmetic, with less work per element)."""
    unmasked: tuple[Expr, Expr] | None = None
    """(condition, value): where the scalar condition holds at an iteration, every mask of the value (a select
    with a constant on one side: causal or window masks, ragged edges) takes its other side at every element of
    the tile, and the value is computed without them (:func:`mask_free`)."""
    row_parts: Mapping[Expr, tuple[Expr, ...]] = dataclasses.field(default_factory=dict)
    """For the value, the unmasked value and each reduction's tile: their parts computed once per row of the
    thread (:func:`row_parts`)."""
    accumulates: bool = False
    """Its value is a warpgroup product that starts from the rest of the value (:func:`accumulated`: a rolling
    update's rescaled accumulator): that rest is written into the statement's own registers, and the product
    accumulates straight into them — no accumulators of its own (FlashAttention-3's O rescaled in place)."""

    @property
    def elementwise(self) -> Expr | None:
        """What its elementwise pass computes: the value, or where it :attr:`accumulates`, the product's start."""
        if self.accumulates:
            assert isinstance(self.value, Dot)
            return self.value.acc
        return self.value

    @property
    def accumulators(self) -> int:
        """Registers per thread of its product's own accumulators (none where it :attr:`accumulates`)."""
        return 0 if self.dot is None or self.accumulates else warpgroups.accumulators(self.dot)


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
class Deferred:
    """Statement ``block``'s product issued one iteration late: at iteration ``j``, right after the product of
    statement ``after`` (``Q·Kᵀ`` of ``j``) is issued, the product of iteration ``j − 1`` (``P·V``) is issued
    from the A fragments kept since then, so it runs on the tensor cores while ``j``'s statements between the two
    (the softmax) run on the others; its statement's elementwise pass (``O = O·h + P·V``) runs at the end of
    iteration ``j``, after waiting for it, from ``j − 1``'s row values (``h``, kept in registers), and the last
    iteration's after the loop.  FlashAttention-3's intra-warpgroup overlap.  Where the statement
    :attr:`~FragmentStmt.accumulates`, the product is issued into its statement's registers instead, which the
    iteration before wrote its start into at its end: nothing is carried or folded.

    Equal to the program in every case: the statement's value reads, besides its product and its own tensor,
    only values of its row computed at its own place in iteration ``j − 1`` (:func:`_deferred` checks that no
    statement reads its tensor or writes what it reads after it).  Costs the product's accumulators and A
    fragments in registers across the softmax, and a third stage of operand tiles (the previous iteration's
    ``b`` is read during this one)."""

    block: str
    after: str


@dataclass(frozen=True)
class StagedStore:
    """An epilogue statement that writes a tile of rows to memory through shared memory
    (:func:`staged_store`): each element into row ``pf_m`` of ``pitch`` elements at the start of staging
    buffer ``buffer``, then each warp's rows copied out ``vec`` elements (16 bytes) at a time."""

    buffer: str
    pitch: int
    vec: int


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
    computing_registers: int = 0
    """With a producer: the registers each computing thread takes (``setmaxnreg.inc``) once the producer has
    given its own back (:func:`~polyfuse.emit_cpp.warpgroups.computing_registers`)."""
    barriers: str | None = None
    """With a producer warpgroup (:func:`_producer`): the shared array of its four mbarriers, ``full`` of the
    two stages (their copies landed) then ``empty`` (every computing thread is done with them)."""
    reciprocals: tuple[Reciprocal, ...] = ()
    """Each division that a product takes as its register operand: multiplied by a reciprocal computed once per
    row where that is proven within the tolerance, else divided (:mod:`~polyfuse.emit_cpp.reciprocal`)."""
    deferred: Deferred | None = None
    """With a producer warpgroup: the product issued one iteration late (:class:`Deferred`)."""
    turns: int = 0
    """With a product issued late: the computing warpgroups that issue their products in turns (the options'
    ``warpgroup_turns``; 0: none), warpgroup ``w`` at named barrier ``1 + w`` after warpgroup ``w − 1``."""
    boxes: Mapping[tuple[str, str], tma.TensorBox] = dataclasses.field(default_factory=dict)
    """With a producer warpgroup: each operand tile it copies, by (block, role), as one thread's bulk tensor
    copies (:mod:`~polyfuse.emit_cpp.tma`, the options' ``tma``); empty: cp.async by all its threads."""
    copies: str = ""
    """With a producer warpgroup: how it copies, and why not by bulk copies where it does not."""
    staged: Mapping[str, StagedStore] = dataclasses.field(default_factory=dict)
    """With a producer warpgroup: the epilogue statements written through shared memory, by block
    (:func:`staged_store`)."""
    divisions: tuple[reciprocal.RowDivision, ...] = ()
    """Each division of an epilogue statement by a value of its row (attention's ``pv / row_sum``): by its
    reciprocal once per row where that is proven within the tolerance, else divided
    (:func:`~polyfuse.emit_cpp.reciprocal.row_divisions`)."""

    @property
    def stages(self) -> int:
        """Iterations of operand tiles the buffers hold with prefetch (a producer's stages)."""
        return DEFERRED_STAGES if self.deferred is not None else STAGES

    @property
    def barrier_bytes(self) -> int:
        """A producer warpgroup's mbarriers: ``full`` and ``empty`` of each stage, 8 bytes each."""
        return 2 * self.stages * 8

    @property
    def row_values(self) -> tuple[SharedValue, ...]:
        """The values computed once per iteration before a statement: shared ones, then the reciprocals."""
        return self.shared + tuple(SharedValue((r.inverse,), r.register, r.block, r.row, None, 0)
                                   for r in self.reciprocals if r.inverse is not None and r.register and r.row)

    @property
    def producer(self) -> bool:
        """Whether a warpgroup of its own (after the ``rows / 16`` computing warps) copies the operand tiles."""
        return self.barriers is not None

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
        products = max((st.accumulators for st in self.stmts.values()), default=0)
        return self.tiles + products + REGISTER_OVERHEAD

    @property
    def tiles(self) -> int:
        """Registers a thread holds for the loop's tiles (``[cols / 8][4]``: ``cols / 2``; a row vector: 2)."""
        return sum(h.cols // 2 if h.col_dim is not None else 2 for h in self.held)

    def describe(self, offsets: Mapping[str, int]) -> list[str]:
        warps = -(-self.rows // STRIP)
        lines = [f"in warp fragments: {warps} warps of {STRIP} whole rows ({self.rows} real); "
                 f"register operands {'rounded once' if self.round_once else 'split hi+lo'}; "
                 + (f"warps {warps}-{warps + PRODUCER_WARPS - 1} copy the operand tiles into {self.stages} stages "
                    f"(mbarriers {self.barriers}; registers {PRODUCER_REGISTERS} for them, "
                    f"{self.computing_registers} for the others); {self.copies}"
                    if self.producer else "operands of the next iteration copied during this one" if self.prefetch
                    else "operands copied at the top of each iteration")]
        for h in self.held:
            shape = f"[{h.cols // 8}][4]" if h.col_dim is not None else "[2]"
            life = ("per iteration" if h.per_iteration else "read before, written back after" if h.loaded
                    else "written back after" if h.memory
                    else "registers only")
            lines.append(f"registers: {h.name} in {h.register}{shape} ({life})")
        for name, nbytes in self.buffers:
            lines.append(f"staging buffer {name}: {nbytes} bytes at {offsets[name]}")
        for v in self.shared:
            lines.append(f"computed once per iteration before {v.before}: {v.register} "
                         f"({'a tile' if v.col is not None else 'a row value'} that several statements use)")
        for r in self.reciprocals:
            lines.append(r.describe())
        for block, st in self.stmts.items():
            if st.accumulates:
                guarded = isinstance(st.value, Dot) and isinstance(st.value.a, Select)
                why = ("its guard on the product's a; its b's inputs declared finite" if guarded
                       else "no guard on the product: the guard on the running max")
                lines.append(f"{block}'s product accumulates into {block}'s registers, which first take the rest of "
                             f"its value ({why})")
        if self.deferred is not None:
            into = self.stmts[self.deferred.block].accumulates
            lines.append(f"{self.deferred.block}'s product issued one iteration late, after {self.deferred.after}'s: "
                         f"it runs during the statements between them, "
                         + ("its start written at the end of the iteration before" if into else
                            "its statement at the end of the next iteration (and the last after the loop)"))
        if self.turns:
            lines.append(f"the {self.turns} computing warpgroups issue their products in turns (named barriers "
                         f"1..{self.turns})")
        lines.extend(f"division {d.describe()}" for d in self.divisions)
        if self.epilogue:
            lines.append("after the loop, from registers: " + ", ".join(
                e.block + (f" (through {p.buffer}'s shared memory, rows of {p.pitch}, then {p.vec} elements per "
                           "copy)" if (p := self.staged.get(e.block)) else "") for e in self.epilogue))
        return lines


def _body(loop: Loop) -> tuple[TileStore, ...] | None:
    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    if not body or not all(isinstance(s, TileStore) for s in body):
        return None
    return tuple(body)  # type: ignore[arg-type]


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
        for x in store_exprs(s):
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
        dots = [n for x in store_exprs(s) for n in walk_tile_expr(x) if isinstance(n, Dot)]
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
            for x in store_exprs(s):
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
        if not all(_reads_own(x, here, row, cols, shape_dims, True) for x in store_exprs(s)):
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
    ``producer_warp``): where every product will be a warpgroup product
    (:func:`~polyfuse.emit_cpp.warpgroups.warpgroup_product`, judged here from the operands' shapes before they are
    planned) with its memory operands copied raw by cp.async, and the next iteration's tiles are copied during this
    one (``prefetch``).  Decided from the loop alone, so that the kernel's threads (:func:`warps_for`) and the plan
    (:func:`plan`) agree."""
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
        nodes = [n for x in store_exprs(s) for n in walk_tile_expr(x)]
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
        if not all(_reads_own(x, frame.at(sizes), row, cols, shape.dims, False) for x in store_exprs(s)):
            break
        found.append(s)
        written.add(s.tensor.name)
    return tuple(found)


def units(frame: Frame, body: Stmt) -> dict[int, tuple[Loop, tuple[TileStore, ...]]]:
    """The loops of a kernel body (of ``frame.warps`` warps) that run in warp fragments, by identity, each
    with its epilogue; none inside a loop run by warp groups (:mod:`~polyfuse.emit_cpp.groups`: its statements
    are planned for one group's threads)."""
    found: dict[int, tuple[Loop, tuple[TileStore, ...]]] = {}

    def visit(s: Stmt, after: Sequence[Stmt]) -> None:
        if isinstance(s, Seq):
            for k, c in enumerate(s.stmts):
                visit(c, s.stmts[k + 1:])
        elif isinstance(s, Loop) and not on_warp_groups(s):
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
                    for x in [*store_exprs(s), *(i.start if isinstance(i, Slice) else i for i in s.index)]
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
    where a memory operand comes from.

    Planned with every product's accumulators of its own first; where that issues no product late, planned again
    with products accumulating into their statements' registers (the options' ``accumulate_products``), kept where
    some does.  A late product with accumulators of its own adds them once after its wait, where accumulating into
    the registers puts a rescaling pass before each issue (the slower of the two where both fit), but
    accumulating saves the registers that let 128-wide heads issue late at all
    (benchmarks/results/2026-11-28_H200_f171eec_accumulate)."""
    apart = _plan(frame, loop, after, memory, operand, fresh, False)
    if not frame.options.accumulate_products or apart.deferred is not None:
        return apart
    into = _plan(frame, loop, after, memory, operand, fresh, True)
    return into if any(st.accumulates for st in into.stmts.values()) else apart


def _plan(frame: Frame, loop: Loop, after: tuple[TileStore, ...], memory: frozenset[str],
          operand: Callable[[str, Frame, Staged, DType], OperandPlan], fresh: Callable[[str], str],
          accumulate: bool) -> FragmentLoop:
    """:func:`plan`, with products accumulating into their statements' registers where they may (``accumulate``)."""
    shape = _analyse(frame, loop)
    body = _body(loop)
    assert shape is not None and body is not None
    allocated = set(allocated_at(loop))
    # A tensor kept in memory whose first iteration reads only a constant starts there too, not read before the
    # loop, where the loop runs at least once (its first write then replaces what memory held).
    runs = (c := constant(loop.extent)) is not None and c.value >= 1
    initial, values = rewrite(body, loop.var.name,
                              {n for n in shape.dims if n not in allocated and (runs or n not in memory)},
                              frozenset(n for n in shape.dims if n in allocated and n not in memory),
                              _finite_input(frame))
    held = tuple(Held(name, fresh(f"fr_{name}_"), rd, cd, cols, name in allocated, name in memory, shape.index[name],
                      initial.get(name, 0.0), name in memory and name not in initial)
                 for name, (rd, cd, cols) in shape.dims.items())
    values, reciprocals = reciprocal.plan(frame, body, {s.block: shape.axes[s.block][0] for s in body}, shape.dims,
                                          values, fresh)
    stmts: dict[str, FragmentStmt] = {}
    buffers: list[tuple[str, int]] = []
    staged: list[tuple[str, str, OperandPlan, DType, str]] = []  # (block, role, plan, type, buffer) per iteration
    for s in body:
        row, col = shape.axes[s.block]
        dots = [n for n in walk_tile_expr(s.value) if isinstance(n, Dot)]
        if not dots:
            stmts[s.block] = FragmentStmt(s.block, row, col, value=values[s.block],
                                          unmasked=mask_free(values[s.block], axis_sizes(s)) if col else None)
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
            source = next((w for b, r, tile, t, name in staged
                           if (w := warpgroups.window(here, tile, t, source, low, name, b)) is not None), source)
            ops.append(source)
            if source.own_bytes:
                name = fresh(f"f{role}")
                own[role] = name
                buffers.append((name, source.own_bytes))
                staged.append((s.block, role, source, low, name))
        ntiles = b.rows_pad // 8
        pair = 2 if ntiles % 2 == 0 else 1
        instruction = WGMMA if warpgroups.warpgroup_product(frame, shape.rows, ops[0], ops[1]) else MMA_SYNC
        width = warpgroups.width(frame, b) if instruction == WGMMA else 0
        dot = DotPlan(instruction, a.rows, b.rows, a.kk, low, ops[0], ops[1], a.rows_pad // STRIP, 1, ntiles, 1,
                      pair, None, M16N8, width)
        into = (_accumulates(frame, shape, s, values[s.block], row, col, b, instruction, from_registers, allocated)
                if accumulate else None)
        if into is not None:
            values[s.block] = into
        stmts[s.block] = FragmentStmt(s.block, row, col, dot, from_registers, own, values[s.block],
                                      mask_free(values[s.block], axis_sizes(s)), accumulates=into is not None)
    masks = {s.block: s.mask for s in body}
    stmts = {block: _with_row_parts(st, masks[block]) for block, st in stmts.items()}
    for s in after:
        loads = [n for x in store_exprs(s) for n in walk_tile_expr(x)
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
    prefetch = frame.options.prefetch and bool(buffers) and not every
    if prefetch:
        buffers = [(name, STAGES * nbytes) for name, nbytes in buffers]
    result = FragmentLoop(shape.rows, held, stmts, tuple(buffers), frame.options.reduce_chains, after, prefetch,
                          shared, reciprocals=reciprocals)
    if _producer(frame, loop, shape):
        if not (frame.swizzle and result.warpgroups and prefetch
                and set(sources) <= {"cp.async", "kept", "registers", "panels"}):
            raise InternalError(f"loop {loop.var.name}: a producer warp was planned for it, but its products or "
                                f"operands ({', '.join(sorted(set(sources)))}) do not allow one")
        result = dataclasses.replace(result, barriers=fresh("bar"),
                                     computing_registers=warpgroups.computing_registers(frame, shape.rows))
        result = _bulk_copies(frame, result)
    budget = min(warpgroups.THREAD_REGISTERS, result.computing_registers or frame.thread_registers)
    room = budget - result.tiles - REGISTER_OVERHEAD
    own = _own_tiles(result, body)
    result = dataclasses.replace(result, stmts={block: st if st.dot is None or st.accumulates else
                                                dataclasses.replace(st, dot=warpgroups.folded(
                                                    st.dot, room + own.get(block, 0)))
                                                for block, st in result.stmts.items()})
    deferred = _deferred(frame, loop, body, result, budget, own)
    if deferred is None:
        return _with_epilogue(frame, result)
    warpgroups_computing = shape.rows // WARPGROUP_ROWS
    return _with_epilogue(frame, dataclasses.replace(result, deferred=deferred,
                               buffers=tuple((name, nbytes // STAGES * DEFERRED_STAGES) for name, nbytes in buffers),
                               turns=warpgroups_computing if frame.options.warpgroup_turns and warpgroups_computing > 1
                               else 0))


def _with_epilogue(frame: Frame, fl: FragmentLoop) -> FragmentLoop:
    """``fl`` with its epilogue planned: each statement that may go through shared memory so
    (:func:`staged_store`), and its divisions by a value of the row (:func:`_epilogue_divisions`)."""
    staged = {s.block: p for s in fl.epilogue if (p := staged_store(frame, fl, s)) is not None}
    return dataclasses.replace(fl, staged=staged, divisions=_epilogue_divisions(frame, fl))


def _epilogue_divisions(frame: Frame, fl: FragmentLoop) -> tuple[reciprocal.RowDivision, ...]:
    """The divisions of ``fl``'s epilogue by a value of the row (attention's ``out = pv / row_sum``), each by its
    reciprocal once per row where the divisor's finite non-zero values are proven normal-invertible
    (:func:`~polyfuse.emit_cpp.reciprocal.row_divisions`: one IEEE division per output element, a dozen
    instructions, becomes a multiply).  Where that is not proven the division stays: the rows of a warp's
    fragment have no run-time test of their own."""
    found = reciprocal.row_divisions(fl.epilogue, frame.ranges, frame.options.reciprocal_rows,
                                     rows={s.block: fl.stmts[s.block].row for s in fl.epilogue})
    return tuple(dataclasses.replace(d, chosen=False, guarded=False) if d.guarded else d for d in found)


def staged_store(frame: Frame, fl: FragmentLoop, s: TileStore) -> StagedStore | None:
    """How epilogue statement ``s`` of ``fl`` writes its tile through shared memory, if it may (the options'
    ``staged_stores``).  From the registers, one store instruction of a warp writes two bytes in each of eight
    rows: eight partial sectors, issued at the end of every block where nothing else hides them.  Staged, each
    warp writes its 16 rows into shared memory, then copies them out 16 bytes per lane, whole lines per
    instruction.

    Planned where the loop has a producer warpgroup: once every computing warp has passed the barrier before the
    epilogue, each has waited for every copy the producer issued and for its own products, so no copy or product
    reads or writes the operand buffers any more and the first buffer large enough takes the tile (a row of
    ``cols`` elements and 16 bytes of padding, which keeps the fragment writes free of bank conflicts).  The
    statement writes a tile of rows and columns (not a row vector), unreduced, to a tensor in global memory whose
    last dimension is its column axis, 16-byte aligned at every row (:func:`~polyfuse.emit_cpp.vector.aligned`),
    and its mask, if any, does not depend on the column: each 16-byte piece is written whole or not at all."""
    if not (frame.options.staged_stores and fl.producer):
        return None
    st = fl.stmts[s.block]
    t = s.tensor
    if st.col is None or s.reducer is not None or t.dtype.is_bool or t.name in frame.shared_names:
        return None
    size = t.dtype.bits // 8
    vec = VECTOR_BYTES // size
    cols = axis_sizes(s)[st.col]
    if cols % vec or not aligned(s.index, t.shape, st.col, vec):
        return None
    if s.mask is not None and depends_on(s.mask, st.col):
        return None
    pitch = cols + vec
    need = -(-fl.rows // STRIP) * STRIP * pitch * size
    return next((StagedStore(name, pitch, vec) for name, nbytes in fl.buffers if nbytes >= need), None)


def _own_tiles(fl: FragmentLoop, body: tuple[TileStore, ...]) -> dict[str, int]:
    """Registers of each product statement's own tile that its product's accumulators may take: a tile the loop
    allocates at each iteration is dead from the iteration's start until its statement writes it, and the
    statement is what consumes the product (``score = (q·kᵀ)·scale``), so the two are never live together beyond
    that statement — counting both would halve the registers a loop of three computing warpgroups seems to have
    (160 each beside the producer)."""
    held = {h.name: h for h in fl.held}
    return {s.block: h.cols // 2 for s in body
            if fl.stmts[s.block].dot is not None and (h := held.get(s.tensor.name)) is not None
            and h.per_iteration and h.col_dim is not None}


def _bulk_copies(frame: Frame, fl: FragmentLoop) -> FragmentLoop:
    """``fl`` (with a producer warpgroup) copying its operand tiles by bulk tensor copies where the device has
    them, the options allow them and every tile it copies at each iteration can take them
    (:func:`~polyfuse.emit_cpp.tma.tensor_box`); else by cp.async, the plan saying why."""
    if not frame.tma:
        return dataclasses.replace(fl, copies="cp.async by its threads (no bulk tensor copies: "
                                   + ("the options' tma is off)" if not frame.options.tma
                                      else "the device has none)"))
    boxes: dict[tuple[str, str], tma.TensorBox] = {}
    for block, st in fl.stmts.items():
        for role, op in (("a", st.dot.a), ("b", st.dot.b)) if st.dot is not None else ():
            if op is None or op.source != "cp.async":
                continue
            assert st.dot.low is not None
            found = tma.tensor_box(frame, op.staged, st.dot.low) if len(op.parts) == 1 else "it is split in two"
            if isinstance(found, str):
                return dataclasses.replace(fl, copies=f"cp.async by its threads ({block}'s {role} cannot take bulk "
                                                      f"tensor copies: {found})")
            boxes[(block, role)] = found
    maps = ", ".join(m.name for m in tma.kernel_maps(boxes.values()))
    return dataclasses.replace(fl, boxes=boxes, copies=f"one of its threads issues bulk tensor copies ({maps})")


def _deferred(frame: Frame, loop: Loop, body: tuple[TileStore, ...], fl: FragmentLoop, budget: int,
              own: Mapping[str, int]) -> Deferred | None:
    """The product of ``fl`` to issue one iteration late (:class:`Deferred`), if one may be: with a producer
    warpgroup (the options' ``overlap_products``), the first warpgroup product whose ``a`` is computed from
    registers, issued whole, after another product (issued whole) of the iteration; its statement unmasked, its
    tensor read by no other statement and nothing it reads written after it, and its value reading, besides its
    product and its own tensor, only parts computed once per row (carried to the next iteration); and where the
    accumulators and A fragments it keeps across the iteration fit ``budget`` registers beside the loop's tiles and
    the other products' accumulators (:func:`deferred_registers`: the estimate refuses the 128-wide heads with
    128-key tiles, where ptxas spilled, benchmarks/results/2026-11-28_H200_0bc1944_overlap).  Not where the loop
    runs at most twice (bounded by the grid's constant extents): one product at most would overlap, and ptxas
    serialises the warpgroup products of a late product accumulating into its statement's registers where it sees
    that the loop after the first iteration runs at most once (warning C7511)."""
    if not (frame.options.overlap_products and fl.producer):
        return None
    most = bounds(loop.extent, frame.grid)
    if most is not None and most[1] <= 2:
        return None
    for k, s in enumerate(body):
        st = fl.stmts[s.block]
        if st.dot is None or not st.a_registers:
            continue
        before = [p for p in body[:k] if fl.stmts[p.block].dot is not None]
        if not before or st.dot.fold or st.dot.instruction != WGMMA or s.mask is not None or st.unmasked is not None:
            return None
        first = fl.stmts[before[-1].block].dot
        assert first is not None and st.value is not None
        if first.fold or first.instruction != WGMMA:
            return None
        name = s.tensor.name
        if next(h for h in fl.held if h.name == name).per_iteration:
            return None
        if any(name in tensors_read(other) for other in body if other is not s):
            return None
        read = {n.tensor.name for n in walk_tile_expr(st.value) if isinstance(n, TileLoad)}
        if any(later.tensor.name in read for later in body[k + 1:]):
            return None
        if not _elementwise_reads_only(st.value, set(st.row_parts[st.value]), name):
            return None
        others = max((max(p.accumulators - own.get(b, 0), 0) for b, p in fl.stmts.items() if b != s.block),
                     default=0)
        if fl.tiles + deferred_registers(st) + others + REGISTER_OVERHEAD > budget:
            return None
        return Deferred(s.block, before[-1].block)
    return None


def deferred_registers(st: FragmentStmt) -> int:
    """Registers per thread a product issued one iteration late keeps across the iteration: its own accumulators
    (none where it accumulates into its statement's registers) and its A fragments (16-bit pairs: ``k / 16`` steps
    of four)."""
    assert st.dot is not None and st.dot.a is not None
    return st.accumulators + st.dot.a.staged.kp // 16 * 4


def _elementwise_reads_only(x: Expr, rows: set[Expr], name: str) -> bool:
    """Whether ``x``, outside its product and its ``rows`` parts, reads no tensor but ``name``."""
    if isinstance(x, Dot) or x in rows:
        return True
    if isinstance(x, TileLoad) and x.tensor.name != name:
        return False
    return all(_elementwise_reads_only(c, rows, name) for c in tile_children(x))


def _finite_input(frame: Frame) -> Callable[[str], bool]:
    """Whether a tensor is an input declared finite (no ±inf or NaN)."""
    def finite(t: str) -> bool:
        x = frame.tensors.get(t)
        return x is not None and x.role == INPUT and x.finite

    return finite


def _accumulates(frame: Frame, shape: _Shape, s: TileStore, value: Expr, row: str, col: str | None, b: Staged,
                 instruction: str, from_registers: bool, allocated: set[str]) -> Dot | None:
    """Statement ``s``'s value as a product accumulating into its own registers (:attr:`FragmentStmt.accumulates`),
    where it may: a warpgroup product whose ``a`` is computed from
    registers, its value :func:`accumulated` (the inputs its ``b`` reads declared finite), the statement unmasked
    into a tensor the loop keeps in registers across iterations, of the product's columns, and the product's start
    reading, besides row values, only that tensor."""
    name = s.tensor.name
    if not (instruction == WGMMA and from_registers and col is not None
            and s.mask is None and name in shape.dims and name not in allocated
            and shape.dims[name][1] is not None and shape.dims[name][2] == b.rows_pad):
        return None
    into = accumulated(s, value, row, _finite_input(frame))
    if into is None or not _elementwise_reads_only(into.acc, set(row_parts([into.acc], row, col)), name):
        return None
    return into


def _with_row_parts(st: FragmentStmt, mask: Expr | None) -> FragmentStmt:
    """``st`` with its :attr:`~FragmentStmt.row_parts` planned."""
    masks = [mask] if mask is not None else []
    assert st.value is not None
    parts: dict[Expr, tuple[Expr, ...]] = {}
    if st.col is not None:
        for value in (st.value, *([st.unmasked[1]] if st.unmasked is not None else []),
                      *([st.elementwise] if st.accumulates else [])):
            parts[value] = tuple(row_parts([value, *masks], st.row, st.col))
    for r in reductions([st.value, *masks]):
        parts[r.tile] = tuple(row_parts([r.tile], st.row, r.axis))
    return dataclasses.replace(st, row_parts=parts)


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
