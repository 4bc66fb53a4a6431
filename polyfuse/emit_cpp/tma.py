"""Bulk tensor copies (TMA) of a producer warpgroup's operand tiles: which tiles can take them, as data.

With a producer warpgroup (:mod:`~polyfuse.emit_cpp.fragments`), the operand tiles of each iteration are
copied by its 128 threads, sixteen bytes per ``cp.async``, each thread computing its addresses and predicates.
On a device with the tensor memory accelerator one thread issues a bulk copy per 64-column panel of a tile
instead (``cp.async.bulk.tensor``, its bytes announced on the stage's ``full`` mbarrier), and the copy engine
lays the panel out 128-byte swizzled, exactly as :class:`~polyfuse.emit_cpp.dotplan.Staged` places it for the
warpgroup products (``pf::swizzled_at``: the 16-byte chunks of row ``r`` permuted by ``r % 8``).

A tile takes bulk copies where it is a raw 16-bit input tile, its staged inner axis is the tensor's last
(contiguous) dimension and its outer axis one other dimension, both at offsets free of the tile's axes, every
other dimension a single index, no padding in the staged array, and no condition on an element other than its
own index being inside the tensor (a ragged edge).  The tensor map spans the whole tensor, each dimension its
own extent, with boxes of one along the dimensions the tile does not cover: an element past the end of its
dimension is zero-filled by the copy engine — the value ``cp.async`` gives it — and never read from the next
head's rows.  The runtime encodes the maps at launch (:mod:`polyfuse.runtime.tma`) from the tensors' addresses
and extents; the kernel takes them first, by value (``const __grid_constant__ CUtensorMap``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from polyfuse.emit_cpp.dotplan import PANEL, Frame, Staged, raw_staging
from polyfuse.emit_cpp.target import TensorMapArg
from polyfuse.errors import NonAffineIndex
from polyfuse.ir.affine import linear_form
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Const, Expr, Var
from polyfuse.ir.stmt import INPUT
from polyfuse.tiling.htile import Broadcast, Iota, Slice, TileLoad, depends_on

__all__ = ["MAX_RANK", "SWIZZLE", "TensorBox", "kernel_maps", "tensor_box"]

SWIZZLE = 128
"""Bytes of the swizzle the maps ask for: one 64-column panel of 16-bit values per box row."""
MAX_RANK = 5
"""Dimensions a tensor map may have."""
MAX_BOX = 256
"""Elements a box may span in one dimension."""
PANEL_ALIGN = 1024
"""Bytes a box's destination is aligned to: the swizzle permutes by the address bits of its 8-row atom."""


@dataclass(frozen=True)
class TensorBox:
    """One operand tile brought by bulk copies: ``panels`` boxes of ``map``, box ``p`` at ``coords`` (innermost
    first) with the innermost coordinate ``64·p`` further, landing ``panel_elements`` 16-bit elements apart."""

    map: TensorMapArg
    coords: tuple[Expr, ...]
    panels: int
    panel_elements: int

    @property
    def nbytes(self) -> int:
        """Bytes the tile's copies complete on their mbarrier (a zero-filled element counts as one copied)."""
        return self.panels * math.prod(self.map.box) * 2


def tensor_box(frame: Frame, op: Staged, low: DType) -> TensorBox | str:
    """How bulk copies bring operand ``op`` (staged as 16-bit ``low``), or why they cannot (see the module's
    docstring)."""
    if not op.swizzled:
        return "its staged tile is not in swizzled panels"
    found = raw_staging(op, low)
    if found is None:
        return "it is not a raw 16-bit tile of a tensor"
    load, conditions = found
    tensor = load.tensor
    if tensor.role != INPUT or tensor.name in frame.shared_names or tensor.dtype != low:
        return f"{tensor.name} is not a {low} input of the kernel"
    if len(op.rows_axes) != 1 or op.rows != op.rows_pad or op.kk != op.kp:
        return "its staged tile is padded"
    outer, inner = (op.k, op.rows_axes[0]) if op.trans else (op.rows_axes[0], op.k)
    rank = len(load.index)
    if rank > MAX_RANK:
        return f"{tensor.name} has {rank} dimensions (a tensor map at most {MAX_RANK})"
    slices = {i.axis: (d, i) for d, i in enumerate(load.index) if isinstance(i, Slice)}
    if set(slices) != {outer, inner} or slices[inner][0] != rank - 1:
        return f"the tile is not {tensor.name}'s last dimension by one other"
    if any(depends_on(i.start if isinstance(i, Slice) else i, a) for i in load.index for a in (outer, inner)):
        return "a tile offset depends on the tile's own axes"
    if slices[inner][1].size != op.inner or slices[outer][1].size != op.outer or op.inner % PANEL:
        return "the tile's extents are not its slices' sizes in whole panels"
    if op.outer > MAX_BOX or (op.outer * PANEL * 2) % PANEL_ALIGN:
        return f"{op.outer} rows per panel (a box spans at most {MAX_BOX}, in whole 8-row atoms)"
    for c in _conjuncts(conditions):
        if not _bound(c, load, slices):
            return f"it is copied under a condition ({c}) other than its elements lying inside {tensor.name}"
    if not all(isinstance(x, Const) for x in tensor.shape[1:]) or any(
            math.prod(int(x.value) for x in tensor.shape[d + 1:]) * 2 % 16 for d in range(rank - 1)):
        return f"{tensor.name}'s rows are not a constant multiple of 16 bytes apart"
    box = tuple(PANEL if d == rank - 1 else op.outer if d == slices[outer][0] else 1 for d in reversed(range(rank)))
    coords = tuple((i.start if isinstance(i, Slice) else i) for i in reversed(load.index))
    name = f"pf_map_{tensor.name}_{'x'.join(map(str, box))}"
    return TensorBox(TensorMapArg(name, tensor.name, box, SWIZZLE), coords, op.inner // PANEL, op.outer * PANEL)


def _conjuncts(conditions: Iterable[Expr]) -> list[Expr]:
    """The conditions as scalar index expressions (a tile axis as its variable), split at their ``and``s."""
    out: list[Expr] = []
    for c in conditions:
        c = _scalar(c)
        out.extend(_conjuncts((c.a, c.b)) if isinstance(c, BinOp) and c.op == "and" else [c])
    return out


def _scalar(e: Expr) -> Expr:
    """``e`` with its broadcasts dropped and each tile axis (``Iota``) as its variable."""
    if isinstance(e, Broadcast):
        return _scalar(e.tile)
    if isinstance(e, Iota):
        return Var(e.axis, e.dtype)
    if isinstance(e, BinOp):
        return BinOp(e.op, _scalar(e.a), _scalar(e.b))
    return e


def _bound(c: Expr, load: TileLoad, slices: dict[str, tuple[int, Slice]]) -> bool:
    """Whether ``c`` says that the element's index along a sliced dimension is below that dimension's extent."""
    if not (isinstance(c, BinOp) and c.op == "<"):
        return False
    for axis, (d, s) in slices.items():
        index = BinOp("+", s.start, Var(axis, s.start.dtype))
        try:
            if not linear_form(BinOp("-", c.a, index)) and not linear_form(BinOp("-", c.b, load.tensor.shape[d])):
                return True
        except NonAffineIndex:
            continue
    return False


def kernel_maps(boxes: Iterable[TensorBox]) -> tuple[TensorMapArg, ...]:
    """The distinct maps of ``boxes``, in order (named by tensor and box: one name, one map)."""
    return tuple(dict.fromkeys(b.map for b in boxes))
