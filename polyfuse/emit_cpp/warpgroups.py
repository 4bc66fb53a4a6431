"""Plan decisions of loops in warp fragments that run on warpgroup products (sm_90a).

Whether a product of a loop in warp fragments (:mod:`~polyfuse.emit_cpp.fragments`) is a warpgroup product
(``wgmma``: four warps own 64 rows), how many columns of ``b`` one takes, whether its accumulators fit a thread's
registers or it is folded into its statement a chunk of columns at a time, which operand is a window of whole
panels of another product's tile (MLA's value columns of its key tile), and the registers the computing warps
take beside a producer warpgroup (``setmaxnreg``).  The printing is :mod:`~polyfuse.emit_cpp.fragment_emit`'s.
"""

from __future__ import annotations

import dataclasses

from polyfuse.emit_cpp.stream import same_start
from polyfuse.emit_cpp.dotplan import M16N8, PANEL, WGMMA, DotPlan, Frame, OperandPlan, Staged, raw_staging
from polyfuse.emit_cpp.fragment_values import constant
from polyfuse.emit_cpp.options import WARPGROUP_WIDTHS
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Const
from polyfuse.ir.simplify import simplify
from polyfuse.symbolic import to_sympy
from polyfuse.tiling.htile import Slice

WARPGROUP_WARPS = 4
"""Warps of a warpgroup (the unit a ``wgmma`` and ``setmaxnreg`` take)."""
WARPGROUP_ROWS = WARPGROUP_WARPS * M16N8.rows
"""Rows of a warpgroup product (``wgmma.m64nNk16``): its four warps' strips."""
PRODUCER_WARPS = WARPGROUP_WARPS
"""The producer is a warpgroup: ``setmaxnreg`` gives registers back per warpgroup."""
PRODUCER_REGISTERS = 24
"""Registers a producer thread keeps (``setmaxnreg.dec``): addresses and counters of its copies."""
SUBPARTITIONS = 4
"""An SM's sub-partitions, each with a quarter of its registers: each warp lives in one, so a block of ``4·n``
warps has ``registers / (4·32·n)`` registers per thread unless warpgroups trade them (``setmaxnreg``)."""
THREAD_REGISTERS = 255
"""The most registers one thread may use (PTX's limit; ``setmaxnreg`` may give a warpgroup up to 256)."""


def accumulators(dot: DotPlan) -> int:
    """Registers per thread of a product's accumulators live at once: each output tile's four (a folded
    warpgroup product: one chunk's, ``width / 2``)."""
    return dot.width // 2 if dot.fold else dot.per * 4


def folded(dot: DotPlan, room: int) -> DotPlan:
    """``dot`` issued chunk by chunk where it is a warpgroup product whose accumulators exceed ``room`` registers
    per thread: the widest chunk (of its width and narrower ones) whose accumulators fit, each chunk waited for and
    folded into the statement before the next is issued (:attr:`DotPlan.fold`).  The chunks' products are no
    longer in flight together, but accumulators that spilled would cost far more (MLA decode: 64 query heads x 256
    value columns of f32 in registers, 128 per thread, beside the 128 of one product).  Where no chunk fits, the
    product stays whole."""
    if dot.instruction != WGMMA or dot.b is None or accumulators(dot) <= room:
        return dot
    fits = [w for w in WARPGROUP_WIDTHS if w <= dot.width and w // 2 <= room and dot.b.staged.rows_pad % w == 0]
    return dataclasses.replace(dot, width=max(fits), fold=True) if fits else dot


def computing_registers(frame: Frame, rows: int) -> int:
    """The registers per thread of a loop's computing warps beside a producer warpgroup: a sub-partition holds
    one producer warp (``PRODUCER_REGISTERS``) and ``rows / 64`` computing ones (at most 256, in steps of 8) of
    each of the ``frame.blocks`` blocks on the SM: a block's warps trade within the registers its launch took."""
    per = -(-rows // M16N8.rows) // PRODUCER_WARPS
    lanes = frame.registers_per_sm // SUBPARTITIONS // 32 // frame.blocks
    return min(256, (lanes - PRODUCER_REGISTERS) // per // 8 * 8)


def warpgroup_product(frame: Frame, rows: int, a: OperandPlan, b: OperandPlan) -> bool:
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


def width(frame: Frame, b: Staged) -> int:
    """The columns of ``b`` one warpgroup product takes: the widest of the options' ``warpgroup_width`` and
    narrower ones that divides ``b``'s padded rows (whole 64-column panels, :func:`warpgroup_product`)."""
    return max(w for w in WARPGROUP_WIDTHS if w <= frame.options.warpgroup_width and b.rows_pad % w == 0)


def window(frame: Frame, tile: OperandPlan, low: DType, x: OperandPlan, x_low: DType, buffer: str,
            holder: str) -> OperandPlan | None:
    """``x`` read from the panels of ``tile`` (staged into ``buffer`` at every iteration for ``holder``'s
    product), if ``tile`` holds it: both copied raw and unmasked, swizzled into 64-column panels of the same
    rows (``[outer_pad][64]`` each), from the same tensor at the same scalar indices and outer slice, ``tile``
    covering the whole last dimension and ``x``'s columns starting a whole number of panels into it (MLA's value
    tile, columns ``256·dv_0 ..`` of the key tile's ``kv[..., 0:576]``).  Then ``x`` needs no copy of its own:
    the panels it reads are those of ``tile``, ``(start / 64)·outer_pad·64`` elements on."""
    a, b = tile.staged, x.staged
    if not (frame.swizzle and frame.options.share_tiles and tile.source == x.source == "cp.async"
            and len(tile.parts) == len(x.parts) == 1 and low == x_low and a.swizzled and b.swizzled
            and a.outer_pad == b.outer_pad and b.inner == (b.rows if b.trans else b.kk)):
        return None
    found, mine = raw_staging(a, low), raw_staging(b, low)
    if found is None or mine is None or found[1] or mine[1]:
        return None
    t, v = found[0], mine[0]
    if t.tensor.name != v.tensor.name or len(t.index) != len(v.index):
        return None
    last, here = t.index[-1], v.index[-1]
    start, extent = constant(last.start) if isinstance(last, Slice) else None, constant(t.tensor.shape[-1])
    if not (isinstance(here, Slice) and start is not None and start.value == 0 and extent is not None
            and last.size == extent.value):
        return None
    unit = {u.name: Const(0, u.dtype) for u in frame.unit_vars}
    if not all(same_start(i, j, unit) and not (isinstance(i, Slice) and i.size != j.size)
               for i, j in zip(t.index[:-1], v.index[:-1], strict=True)):
        return None
    if not (to_sympy(here.start)[0] / PANEL).is_integer:
        return None
    panels = simplify(BinOp("//", here.start, Const(PANEL, here.start.dtype)))
    offset = simplify(BinOp("*", panels, Const(a.outer_pad * PANEL, here.start.dtype)))
    return OperandPlan(b, "panels", buffer, holder=holder, offset=offset)

