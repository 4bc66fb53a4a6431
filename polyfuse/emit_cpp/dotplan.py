"""How a ``Dot`` runs in a thread block, decided once as data: the :class:`DotPlan`.

A dot ``out[m.., n..] = acc + Σ_k a[m.., k]·b[k, n..]`` becomes one of four instructions:

``mma.sync.m16n8k16`` (tensor cores) when
  1. the device has them, the options allow them and the result is f32; where an operand is split (below),
     every program input the operands read is declared ``finite`` (:func:`finite_inputs`);
  2. an operand is exactly f16 or bf16 (a load of such a tensor, possibly cast to f32, permuted or selected
     against zero) and the other is the same type or f32.  An f32 operand (attention's P in P·V) is split into
     two 16-bit parts, ``hi = round(x)`` and ``lo = round(x - hi)``, multiplied twice: ``x·y = hi·y + lo·y``
     with 22 (f16) or 16 (bf16) significant bits of ``x`` instead of 11 or 8, so the product keeps the
     accuracy the f32 program has at the catalog's tolerances.  Two f32 operands (quant_gemm, moe_routing's
     gate, performer) are both split into bf16 parts (f32's exponent range) and multiplied three times,
     ``hi·hi + lo·hi + hi·lo``: about 2⁻¹⁶ relative per product, which those operators' tolerances absorb;
  3. ``a`` and ``b`` share no axis but ``k`` (no batch axes);
``block reduce`` for a dot of two f32 operands with few outputs and a long ``k`` (a row's sum of squares);
``per-output loop`` for a dot with batch axes; ``fma`` (operands staged in shared memory) otherwise.

A tensor-core dot's operands lie in shared memory as 16-bit values (:class:`Staged`), padded to M×K
multiples of 16 and N of 8, in the layout that keeps their global reads coalesced; ``ldmatrix`` turns rows
into fragments.  Each warp owns a 16-row strip and up to eight 8-column tiles of the output
(:func:`warp_tiling`), whose accumulators stay in registers across the k loop, laid out by the m16n8
accumulator :class:`FragmentLayout`; a long ``k`` with few output tiles is split among the warps
(:func:`k_groups`).  Where each operand comes from (a copy of its own, a loop's kept tile, cp.async) is
the :class:`OperandPlan`.  :mod:`polyfuse.emit_cpp.plan` makes these decisions for every dot of a kernel
before any text is written; :mod:`polyfuse.emit_cpp.mma` prints them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.emit_cpp.vector import aligned
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import Cast, Const, Expr, Select, Var
from polyfuse.ir.stmt import INPUT, Tensor
from polyfuse.tiling.htile import Broadcast, Dot, Permute, Slice, TileLoad, axes_of, depends_on, walk_tile_expr
from polyfuse.transforms.ranges import ValueRange

LOW = {"f16": "f16", "bf16": "bf16"}
VEC16 = 8
"""16-bit values per 128-bit copy."""
REDUCE_LANES = 8
"""A non-tensor-core dot with at least this many threads per output and this long a ``k`` runs as a
block reduction instead of staging its operands for per-output FMA loops."""

MMA_SYNC = "mma.sync.m16n8k16"
WGMMA = "wgmma"
PANEL = 64
"""16-bit elements of one 128-byte swizzled row: a swizzled operand lies in panels this many columns wide."""
SWIZZLE_ALIGN = 1024
"""Byte alignment of a swizzled operand tile in shared memory (its 8-row atoms)."""
FMA = "fma"
BLOCK_REDUCE = "block reduce"
PER_OUTPUT = "per-output loop"


@dataclass(frozen=True)
class Frame:
    """What a decision about one statement of a kernel reads: the statement's tile axis sizes, the block's
    threads and warp size, whether tensor cores may be used, the options, and the kernel's facts (tensors
    by name, which live in shared memory, the inputs split before the kernels, grid loops of one
    iteration)."""

    sizes: Mapping[str, int]
    threads: int
    warp: int
    tensor_cores: bool
    options: CodegenOptions
    tensors: Mapping[str, Tensor] = dataclasses.field(default_factory=dict)
    shared_names: frozenset[str] = frozenset()
    presplit: Mapping[str, tuple[Tensor, Tensor]] = dataclasses.field(default_factory=dict)
    unit_vars: tuple[Var, ...] = ()
    wgmma: bool = False
    """The device has warpgroup products (sm_90a) and the options allow them."""
    swizzle: bool = False
    """The operands staged here lie in 128-byte-swizzled panels (:class:`Staged`), for warpgroup products."""
    tma: bool = False
    """The device has bulk tensor copies (sm_90a), the options allow them and the products are warpgroup ones."""
    registers_per_sm: int = 65536
    """The device's register file (:class:`~polyfuse.device.DeviceSpec`)."""
    blocks: int = 1
    """Blocks of the kernel planned to reside on one SM at once: each thread may hold ``registers_per_sm //
    (blocks · threads)`` registers (a kernel with a producer warpgroup trades them between its warps:
    :func:`~polyfuse.emit_cpp.warpgroups.computing_registers`)."""
    ranges: Mapping[str, ValueRange] = dataclasses.field(default_factory=dict)
    """The range facts of the tile program's tensors by name (:attr:`~polyfuse.tiling.htile.TileProgram.ranges`)."""
    grid: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The extents of the kernel's grid loops that are constants, by variable: what bounds a loop inside them."""

    def at(self, sizes: Mapping[str, int]) -> Frame:
        return dataclasses.replace(self, sizes=dict(sizes))

    @property
    def warps(self) -> int:
        return self.threads // self.warp

    @property
    def thread_registers(self) -> int:
        """The registers each thread may hold where its block shares the SM with ``blocks - 1`` others."""
        return self.registers_per_sm // (self.blocks * self.threads)


def exact_low(x: Expr) -> DType | None:
    """The 16-bit float type ``x`` holds exactly (its values are such numbers), else None."""
    if x.dtype.name in LOW:
        return x.dtype
    if isinstance(x, Cast):
        return exact_low(x.value) if x.value.dtype.name in LOW or isinstance(x.value, (Permute, Select)) else None
    if isinstance(x, Permute):
        return exact_low(x.tile)
    if isinstance(x, Broadcast) and axes_of(x.tile) == tuple(a for a, _ in x.axes):
        return exact_low(x.tile)
    if isinstance(x, Select):
        t, f = x.true_value, x.false_value
        if isinstance(f, Const) and f.value == 0:
            return exact_low(t)
        if isinstance(t, Const) and t.value == 0:
            return exact_low(f)
    return None


def contiguous_axis(x: Expr, default: str) -> str:
    """The tile axis that runs along the last dimension of the first tensor ``x`` loads."""
    for n in walk_tile_expr(x):
        if isinstance(n, TileLoad):
            if any(isinstance(i, Slice) for i in n.index):
                last = n.index[-1]
                return last.axis if isinstance(last, Slice) else default
    return default


def mma_type(frame: Frame, e: Dot) -> DType | None:
    """The operand type of a tensor-core lowering of ``e``, or None if it does not qualify."""
    if not frame.tensor_cores or e.dtype != dt.f32:
        return None
    a_axes, b_axes = axes_of(e.a), axes_of(e.b)
    if e.axis not in a_axes or e.axis not in b_axes:
        return None
    if set(a_axes) & set(b_axes) - {e.axis}:
        return None
    ta, tb = exact_low(e.a), exact_low(e.b)
    if ta is not None and tb is not None and ta != tb:
        return None
    if (ta is None or tb is None) and not finite_inputs(e):
        return None
    if ta is None and tb is None:
        # Two f32 operands: both split into bf16 hi + lo (f32's range; f16's would overflow past
        # 65504), three products hi·hi + lo·hi + hi·lo; a block reduction if there are few outputs.
        if few_outputs(frame, e):
            return None
        return dt.bf16 if e.a.dtype == dt.f32 and e.b.dtype == dt.f32 else None
    return ta or tb


def finite_inputs(e: Dot) -> bool:
    """Every program input the operands read is declared ``finite``: a split product needs it.

    With an f32 operand split, ``x·y`` is ``hi·y + lo·y`` (or three products of parts): an infinite x
    or y meets a part that is 0 or of the other sign, ``0·inf`` or ``inf - inf``, NaN where the program
    has ±inf.  NaN inputs stay NaN either way, and values computed in the kernel from finite inputs
    are finite or NaN (a probability ``exp(s - m) <= 1``, a scaled value ``448·a/max|a|``).  Without
    the declaration the dot multiplies in f32 with FMAs, as the program does.
    """
    loads = [n for x in (e.a, e.b) for n in walk_tile_expr(x) if isinstance(n, TileLoad)]
    return all(ld.tensor.finite for ld in loads if ld.tensor.role == INPUT)


def few_outputs(frame: Frame, e: Dot) -> bool:
    """Whether ``e`` has so few outputs for its ``k`` that a block reduction suits it."""
    k = e.axis
    m_axes = [x for x in axes_of(e.a) if x != k]
    n_axes = [x for x in axes_of(e.b) if x != k and x not in m_axes]
    outputs = math.prod(frame.sizes[x] for x in m_axes + n_axes)
    return outputs * REDUCE_LANES <= frame.threads and frame.sizes[k] >= REDUCE_LANES


@dataclass(frozen=True)
class Staged:
    """How one operand of a tensor-core dot lies in shared memory: ``[k][rows]`` if ``trans``, else
    ``[rows][k]``, zero-padded to ``rows_pad`` × ``kp``, rows ``stride`` elements apart (the padding of 8
    elements puts the eight rows one ``ldmatrix`` reads in different banks); a split operand's lo part
    follows its hi part, ``size`` elements later.  A ``swizzled`` operand (for ``wgmma``, which reads shared
    memory through descriptors) has no padding: its ``inner`` extent is cut into panels of ``PANEL`` columns,
    each ``[outer_pad][64]`` with the 16-byte chunks of row ``r`` permuted by ``r % 8`` (``pf::swizzled_at``).

    Staging writes ``outer × inner`` elements.  ``[rows][k]`` operands skip their padding rows: row ``r``
    of a product depends on row ``r`` of ``a`` (column of ``b``) only, and the epilogue drops padding
    rows and columns, so whatever the shared memory held there never reaches a result (decode's single
    query row stages 1 row of 16, not 16).  The padding of ``k`` is written as zeros: it enters every sum.
    """

    x: Expr
    rows: int
    rows_pad: int
    rows_axes: tuple[str, ...]
    trans: bool
    stride: int
    split: bool
    size: int
    k: str
    kk: int
    kp: int
    swizzled: bool = False

    @property
    def outer(self) -> int:
        return self.kp if self.trans else self.rows

    @property
    def inner(self) -> int:
        return self.rows_pad if self.trans else self.kp

    @property
    def outer_pad(self) -> int:
        """Rows of the staged array (its outer extent with padding)."""
        return self.kp if self.trans else self.rows_pad

    @property
    def nbytes(self) -> int:
        """Bytes of its staging array (both parts of a split operand)."""
        return self.size * 2 * (2 if self.split else 1)

    def at(self, outer: str, inner: str) -> str:
        """C text of the element offset of (``outer``, ``inner``) in the staged array."""
        if self.swizzled:
            return f"pf::swizzled_at({outer}, {inner}, {self.outer_pad})"
        return f"{outer} * {self.stride} + {inner}"

    def describe(self) -> str:
        layout = "[k][rows]" if self.trans else "[rows][k]"
        place = (f"in 128-byte-swizzled panels of {PANEL} columns" if self.swizzled
                 else f"row pitch {self.stride}")
        return (f"{self.rows}x{self.kk} as {layout} padded to {self.rows_pad}x{self.kp}, {place}"
                f"{', split hi+lo' if self.split else ''}")


def staging(frame: Frame, e: Dot) -> tuple[Staged, Staged]:
    """The shared-memory layouts of ``e``'s operands (``e`` has a tensor-core lowering)."""
    k = e.axis
    kk = frame.sizes[k]
    kp = _up(kk, 16)
    out = []
    for x, pad in ((e.a, 16), (e.b, 8)):
        axes = tuple(a for a in axes_of(x) if a != k)
        rows = math.prod(frame.sizes[a] for a in axes)
        rows_pad = _up(rows, pad)
        trans = contiguous_axis(x, k) != k
        inner, outer = (rows_pad, kp) if trans else (kp, rows_pad)
        split = exact_low(x) is None
        swizzled = frame.swizzle and not split and inner % PANEL == 0 and outer % 8 == 0
        stride = inner if swizzled else inner + 8
        out.append(Staged(x, rows, rows_pad, axes, trans, stride, split, outer * stride, k, kk, kp, swizzled))
    return out[0], out[1]


WARP_TILE_COLUMNS = 64
"""The widest warp tile of a tensor-core dot (eight m16n8 tiles): an output with more columns per 16-row
strip than the warps cover this way gives a warp several tiles (and no register accumulators)."""


def warp_tiling(frame: Frame, mp: int, np_: int) -> tuple[int, int, int]:
    """How the warps cover an ``mp × np_`` output: ``mtiles`` strips of 16 rows, each in ``groups``
    groups of ``per`` 8-column tiles; warp ``w`` takes tiles ``w, w + warps, …`` (``t → (t / groups,
    t % groups)``).  ``per`` is the largest power of two up to 8 (:data:`WARP_TILE_COLUMNS`) that still
    gives every warp a tile."""
    mtiles, ntiles = mp // 16, np_ // 8
    per = min(ntiles, WARP_TILE_COLUMNS // 8)
    while per > 1 and mtiles * -(-ntiles // per) < frame.warps:
        per //= 2
    return mtiles, -(-ntiles // per), per


def k_groups(frame: Frame, mtiles: int, ntiles: int, ksteps: int) -> int:
    """Into how many groups of warps the ``k`` steps of a tensor-core dot split (1: not split).

    Each warp owns ``split_k_tiles`` 8-column tiles and sums every ``g``-th ``k`` step of them, ``g`` the
    number of groups; the groups' partial sums meet in shared memory before the epilogue.  Where each warp
    would otherwise own one tile of a long ``k`` (MLA decode's score: 16 heads × 64 keys, k = 576), every
    warp reloaded the same rows of ``a`` from shared memory at each of 36 steps and waited on a chain of
    36 dependent mma; split in two, each ``a`` fragment serves two tiles and the chains are 18 deep.
    Applies where the output has a multiple of ``split_k_tiles`` columns of tiles, the warps divide into
    whole groups of its ``mtiles × ntiles / split_k_tiles`` warp tiles, and each group gets
    ``split_k_steps / 4`` steps or more of a ``k`` of at least ``split_k_steps``.  The sums are in another
    order than the unsplit product's (f32, within the catalog tolerance); a register accumulator's dot is not
    split (its registers follow :func:`warp_tiling`)."""
    o = frame.options
    if not o.split_k or ksteps < o.split_k_steps or ntiles % o.split_k_tiles:
        return 1
    units = mtiles * (ntiles // o.split_k_tiles)
    warps = frame.warps
    if warps % units or warps // units < 2 or ksteps < (warps // units) * o.split_k_steps // 4:
        return 1
    return warps // units


def raw_operand(x: Expr, low: DType) -> tuple[TileLoad, list[Expr]] | None:
    """The load whose 16-bit values ``x`` is, and the conditions under which it is not zero, if so."""
    conditions: list[Expr] = []
    while True:
        if isinstance(x, Permute):
            x = x.tile
        elif isinstance(x, Cast) and x.value.dtype in (low, dt.f32):
            x = x.value
        elif isinstance(x, Broadcast) and axes_of(x.tile) == tuple(a for a, _ in x.axes):
            x = x.tile
        elif isinstance(x, Select) and isinstance(x.false_value, Const) and x.false_value.value == 0:
            conditions.append(x.cond)
            x = x.true_value
        else:
            break
    if not isinstance(x, TileLoad) or x.tensor.dtype != low:
        return None
    if x.mask is not None:
        if x.other is not None and x.other.value != 0:
            return None
        conditions.append(x.mask)
    return x, conditions


def raw_staging(op: Staged, low: DType) -> tuple[TileLoad, list[Expr]] | None:
    """The load and its conditions if ``op`` can be staged by copying its 16-bit values eight at a time."""
    found = raw_operand(op.x, low)
    if found is None or (op.trans and len(op.rows_axes) != 1):
        return None
    load, conditions = found
    fast = op.rows_axes[0] if op.trans else op.k
    extent = op.rows if op.trans else op.kk
    if extent % VEC16 or op.inner % VEC16 or not aligned(load.index, load.tensor.shape, fast, VEC16):
        return None
    if any(depends_on(c, fast) for c in conditions):
        return None
    return load, conditions


def plain_f32_load(x: Expr) -> TileLoad | None:
    """The unmasked load of an f32 input tensor that ``x`` is (possibly permuted), else None."""
    while isinstance(x, Permute):
        x = x.tile
    if isinstance(x, TileLoad) and x.mask is None and x.tensor.role == INPUT and x.tensor.dtype == dt.f32:
        return x
    return None


def presplit_parts(frame: Frame, op: Staged) -> tuple[TileLoad, TileLoad] | None:
    """The loads of the hi and lo arrays that hold split operand ``op``, if its tensor was split before the
    kernels (:mod:`polyfuse.emit_cpp.presplit`)."""
    load = plain_f32_load(op.x) if op.split else None
    if load is None or load.tensor.name not in frame.presplit:
        return None
    return tuple(dataclasses.replace(load, tensor=part) for part in frame.presplit[load.tensor.name])


@dataclass(frozen=True)
class FragmentLayout:
    """Where the elements of one warp's ``rows × cols`` accumulator tile live: (lane, register) ↔ (row, col).

    For ``mma.sync.m16n8`` with f32 accumulators (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane
    ``l`` holds four registers ``c0..c3``: row ``l / 4`` (``c0, c1``) and ``l / 4 + 8`` (``c2, c3``),
    columns ``2·(l % 4)`` and ``2·(l % 4) + 1``.  Every epilogue and the register accumulators index
    results through this one object.
    """

    rows: int = 16
    cols: int = 8
    registers: int = 4

    def row(self, lane: str, half: str) -> str:
        """C text of the tile row held by ``lane`` in register pair ``half`` (``reg / 2``)."""
        return f"{lane} / 4 + {half} * 8" if half != "0" else f"{lane} / 4"

    def col(self, lane: str, j: str) -> str:
        """C text of the tile column held by ``lane`` in register ``j`` of a pair (``reg % 2``)."""
        return f"({lane} % 4) * 2 + {j}" if j != "0" else f"({lane} % 4) * 2"

    def element(self, lane: int, register: int) -> tuple[int, int]:
        """(row, col) of ``register`` of ``lane`` (for tests and plans)."""
        return lane // 4 + (register // 2) * 8, (lane % 4) * 2 + register % 2


M16N8 = FragmentLayout()


@dataclass(frozen=True)
class WarpgroupFragment:
    """Where the f32 accumulators of ``wgmma.m64nNk16`` live: thread ``t`` of the warpgroup (warp ``t / 32``,
    lane ``l``), register ``4i + q`` ↔ row ``16·(t/32) + l/4 + 8·(q/2)``, column ``8i + 2·(l%4) + q%2``: the
    m16n8 pattern of :data:`M16N8`, one 16-row strip per warp and ``N / 8`` column tiles per thread
    (``pf::wgmma_m64n64k16_f16``; checked on the GPU by ``tests/test_hopper_primitives.py``)."""

    n: int

    @property
    def registers(self) -> int:
        return self.n // 2

    def element(self, thread: int, register: int) -> tuple[int, int]:
        row, col = M16N8.element(thread % 32, register % 4)
        return 16 * (thread // 32) + row, 8 * (register // 4) + col

    def as_a_operand(self, step: int) -> tuple[tuple[int, int], ...]:
        """The register pairs that form the A fragment (four 32-bit registers of two 16-bit values) of k16 step
        ``step`` of a product whose k is this product's columns: registers ``8·step + 2q`` and ``+1``
        (the GPU primitive tests convert them so), so P goes from S's accumulators to P·V without shared
        memory."""
        return tuple((8 * step + 2 * q, 8 * step + 2 * q + 1) for q in range(4))


def swizzle128(row: int, byte: int) -> int:
    """Byte offset of byte ``byte`` (< 128) of row ``row`` of a K-major tile of 128-byte rows in 128-byte-swizzled
    shared memory (the layout wgmma and TMA read with swizzle mode 128 B): 16-byte chunk ``c`` of row ``r`` lies at
    chunk ``c ^ (r % 8)`` (``pf::swizzle128``)."""
    return row * 128 + (((byte >> 4) ^ row) & 7) * 16 + (byte & 15)


@dataclass(frozen=True)
class LdmatrixFragment:
    """How a warp loads its ``mma.m16n8k16`` operand fragment from a staged operand with ``ldmatrix``.

    ``role`` ``a`` (16 rows × 16 k: ``.x4``, four 8×8 matrices) or ``b`` (8 columns × 16 k: ``.x2``; two
    neighbouring 8-column tiles with one ``.x4`` where ``pair`` is 2); ``trans`` where the operand lies
    ``[k][rows]`` (``.trans`` reads the 8×8 matrices transposed).  Each lane gives the address of one row of
    one 8×8 matrix (lanes ``8i..8i+7``: matrix ``i``), chosen so that register ``i`` of the fragment is the
    part PTX's fragment layout assigns to it (A: rows ``g``, ``g + 8`` × k ``0..7``, ``8..15``; B: k ``0..7``,
    ``8..15`` × column ``g``, with ``g = lane / 4``); ``tests/test_kernel_plans.py`` checks that by simulating
    ``ldmatrix`` on the staged array.
    """

    role: str
    trans: bool
    pair: int = 1

    @property
    def registers(self) -> int:
        return 4 if self.role == "a" or self.pair > 1 else 2

    @property
    def instruction(self) -> str:
        return f"pf::ldmatrix_x{self.registers}{'_trans' if self.trans else ''}"

    def address(self, lane: str, tile: str, k: str, stride: int) -> str:
        """C text of the element a lane addresses in the staged array: ``tile`` is the 16-row strip (a) or the
        8-column tile (b, the first of a pair), ``k`` the first k of the step, ``stride`` the array's row pitch."""
        if self.role == "a":
            if self.trans:
                return f"({k} + {lane} % 8 + ({lane} / 16) * 8) * {stride} + {tile} * 16 + (({lane} / 8) % 2) * 8"
            return f"({tile} * 16 + {lane} % 16) * {stride} + {k} + ({lane} / 16) * 8"
        nt = f"({tile} + {lane} / 16)" if self.pair > 1 else tile
        if self.trans:
            return f"({k} + {lane} % 16) * {stride} + {nt} * 8"
        return f"({nt} * 8 + {lane} % 8) * {stride} + {k} + (({lane} / 8) % 2) * 8"


def half_pointer(buffer: str, loop_var: str, half: int) -> str:
    """C text of the half of a two-part ``buffer`` (``half`` elements each) that iteration ``loop_var`` reads
    (``buffer`` itself where ``half`` is 0: one part)."""
    return f"({buffer} + ({loop_var} & 1) * {half})" if half else buffer


@dataclass(frozen=True)
class OperandPlan:
    """Where one staged operand comes from before the product reads it.

    ``source``: ``"kept"`` (a buffer of its loop, copied by cp.async at the first iteration, or at every
    iteration where another dot reads it too), ``"held"`` (another dot's kept tile of the same iteration
    holds it: read in place, at that tile's pitch), ``"registers"`` (computed in a loop's warp fragments,
    :mod:`~polyfuse.emit_cpp.fragments`: never in shared memory), ``"cp.async"`` (raw 16-bit copies, possibly of
    the parts of a tensor split before the kernels: ``parts``), ``"raw"`` (128-bit copies through registers) or
    ``"converted"`` (computed, converted to 16 bits and split where it is f32), or in a loop in warp fragments
    ``"panels"`` (a window of another product's swizzled operand tile of the same iteration, ``holder``'s, staged
    into ``buffer``: its panels from element ``offset`` on, :func:`~polyfuse.emit_cpp.warpgroups.window`).
    """

    staged: Staged
    source: str
    buffer: str | None = None
    parts: tuple[tuple[Staged, int], ...] = ()
    every_iteration: bool = False
    holder: str | None = None
    loop_var: str | None = None
    ahead: bool = False
    """The loop copies the tile ahead of its use (:mod:`~polyfuse.emit_cpp.stream`: before the loop, or during the
    previous iteration): the dot neither copies nor waits."""
    half: int = 0
    """The 16-bit elements of each of the two halves of ``buffer`` where the tile changes with the loop and is
    copied ahead (iteration ``loop_var`` reads half ``loop_var & 1``); 0: one buffer."""
    in_flight: int | None = None
    """The loop refills the tile after its last reader (:mod:`~polyfuse.emit_cpp.stream`): the copy groups that
    may still be in flight when the dot reads it (its ``cp.async.wait_group``); None: not refilled."""
    offset: Expr | None = None
    """``"panels"``: the element offset of the operand's first panel in its holder's tile."""

    @property
    def pointer(self) -> str:
        """C text of where this iteration's operand lies in its kept ``buffer``."""
        assert self.buffer is not None and (self.loop_var is not None or not self.half)
        return half_pointer(self.buffer, self.loop_var or "", self.half)

    @property
    def own_bytes(self) -> int:
        """Shared memory the statement takes for this operand (none where a loop's buffer holds it)."""
        return 0 if self.source in ("kept", "held", "registers", "panels") else self.staged.nbytes


@dataclass(frozen=True)
class DotPlan:
    """The instruction and layouts of one dot (see the module docstring).

    For ``mma.sync``: the operand type ``low``, the operands (``a``, ``b``), the warp tiling (``mtiles``
    strips of 16 rows in ``groups`` groups of ``per`` 8-column tiles), ``kgroups`` warp groups sharing ``k``,
    ``pair`` (2: two ``b`` tiles per ``ldmatrix.x4``), the row ``pitch`` of a result array (None: dense) and
    the accumulator :class:`FragmentLayout`.  For ``wgmma``: ``width``, the columns of ``b`` one warpgroup product
    takes (``wgmma.m64n{width}k16``); ``fold``: each ``width`` columns' products are waited for and folded into
    the statement before the next columns' are issued (their accumulators reused), where a product's
    accumulators all at once would not fit a thread's registers beside the loop's tiles.
    """

    instruction: str
    m: int
    n: int
    k: int
    low: DType | None = None
    a: OperandPlan | None = None
    b: OperandPlan | None = None
    mtiles: int = 0
    groups: int = 0
    per: int = 0
    kgroups: int = 1
    pair: int = 1
    pitch: int | None = None
    fragment: FragmentLayout | None = None
    width: int = 0
    fold: bool = False

    @property
    def units(self) -> int:
        return self.mtiles * self.groups

    def kpart_bytes(self, warp: int) -> int:
        """Shared memory for the partial sums of the warp groups of a split ``k``."""
        return (self.kgroups - 1) * self.units * self.per * 4 * warp * 4 if self.kgroups > 1 else 0

    def describe(self) -> str:
        head = f"{self.m}x{self.n}x{self.k} {self.instruction}"
        if self.instruction == WGMMA:
            assert self.a is not None and self.b is not None
            return "\n".join([f"{head}.m64n{self.width}k16 ({self.low} operands), one per warpgroup of 64 rows and "
                              f"{self.width} columns of b"
                              + (", each folded into the statement before the next (registers)" if self.fold else ""),
                              f"a: {self.a.staged.describe()}; {_source(self.a)}",
                              f"b: {self.b.staged.describe()}; {_source(self.b)}"])
        if self.instruction != MMA_SYNC:
            return head
        assert self.a is not None and self.b is not None
        parts = [f"{head} ({self.low} operands)",
                 f"warps: {self.mtiles} strips of 16 rows x {self.groups} groups of {self.per} 8-column tiles"
                 + (f", k split over {self.kgroups} warp groups" if self.kgroups > 1 else "")
                 + (", b tiles paired (ldmatrix.x4)" if self.pair > 1 else ""),
                 f"a: {self.a.staged.describe()}; {_source(self.a)}",
                 f"b: {self.b.staged.describe()}; {_source(self.b)}"]
        if self.pitch is not None:
            parts.append(f"result rows {self.pitch} floats apart")
        return "\n".join(parts)


def _source(op: OperandPlan) -> str:
    if op.source == "kept":
        copied = ("copied one iteration ahead" if op.half else "copied before the loop" if op.ahead else
                  "copied every iteration" if op.every_iteration else "copied once")
        return f"kept in {op.buffer} ({copied})"
    if op.source == "held":
        return f"read from {op.buffer}, the tile of {op.holder}"
    if op.source == "panels":
        return f"read from the panels of {op.buffer}, the tile of {op.holder}, from element {op.offset} on"
    if op.source == "cp.async" and len(op.parts) == 2:
        return "cp.async of its hi and lo arrays (split before the kernels)"
    return op.source


def dot_pitch(frame: Frame, e: Dot, axes: tuple[str, ...]) -> int | None:
    """The row pitch of a tensor-core dot's result array, or None for a dense array.

    The epilogue writes pairs of f32 from eight rows at once; rows ``pitch ≡ 8 (mod 32)`` words
    apart put each half-warp's pairs in 32 different banks (a pitch of ``n`` would give 8-way
    conflicts when ``n`` is a multiple of 32).
    """
    if mma_type(frame, e) is None:
        return None
    n_axes = tuple(x for x in axes_of(e.b) if x != e.axis)
    if len(n_axes) != 1 or len(axes) < 2 or axes[-1] != n_axes[0] or frame.sizes[axes[-1]] % 2:
        return None
    nn = frame.sizes[axes[-1]]
    return nn + (8 - nn) % 32


def _up(n: int, to: int) -> int:
    return -(-n // to) * to
