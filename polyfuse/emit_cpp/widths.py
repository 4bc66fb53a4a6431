"""Index widths: 32-bit index arithmetic where constant extents prove it fits, 64-bit elsewhere.

A loop counter, a tile-axis counter or an index expression such as ``4096*j_0 + x`` in a 32-bit
``int`` overflows (undefined behaviour, in practice a wrapped index) once a value passes
``2^31 - 1``.  64-bit arithmetic is always right but slower on GPUs, so the emitters ask this
module once per tile program and print what it decided:

* ``loop``: the type of program loop counters, grid indices and every integer index expression
  (slice starts, indices, masks, loop extents).  32-bit only if interval arithmetic over the
  constant loop extents and tile sizes bounds every such expression, every intermediate value
  included, within ``[-2^31, 2^31 - 1]``.  A size parameter can be anything, so a program with one
  is 64-bit, unless the emitter gives a ``size_limit``: then each size parameter ranges over
  ``[0, size_limit]``, and the kernel's launch refuses larger values (``IndexWidths.size_limit``,
  checked by the runtime).  The GPU emitters do (a generic kernel whose grid is the rows then indexes
  as the kernel of fixed sizes does); the host emitter does not.
* ``tile``: the type of counters over the elements of one tile (tile axes, element loops,
  offsets in a tile's local array): 32-bit unless a tile has ``2^31`` elements or more.

Offsets into tensors are 64-bit either way (``CFamilyEmitter.offset``).  Counters inside a
thread block's shared-memory tiles (tensor-core fragments, staged operands, lanes) are bounded
by the shared memory and stay ``int``.  Integer *data* (loads of i32 tensors and what is computed
from them) keeps its own dtype: the widths are only about indices.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import BinOp, Cast, Const, Expr, Select, Var
from polyfuse.ir.stmt import Loop, Stmt
from polyfuse.tiling.htile import (
    Broadcast, Dot, Iota, Permute, Reduce, Slice, Squeeze, TileLoad, TileProgram, TileStore, axis_sizes, tile_children,
    walk_tile_expr, walk_tile_stmts,
)
from polyfuse.tiling.htile import tile_expr_str

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
NARROW, WIDE = "int", "int64_t"

Interval = tuple[int, int] | None
"""Inclusive bounds of an integer value; None: unbounded (a size parameter, or data)."""


@dataclass(frozen=True)
class IndexWidths:
    """The C types of a tile program's index quantities (see the module docstring) and why.

    ``reason`` names what needs 64 bits (a size parameter, an extent, an expression of a block),
    or says that every index is proven to fit in 32 bits.  ``size_limit`` is the largest value of a size
    parameter that the 32-bit proof assumed (the launch must refuse larger ones); None if it assumed none.
    """

    loop: str
    tile: str
    reason: str
    size_limit: int | None = None

    def index_dtype(self, d: dt.DType) -> dt.DType:
        """The dtype index arithmetic of IR dtype ``d`` is computed in: i64 where the loop width is 64-bit."""
        return dt.i64 if self.loop == WIDE else d


def index_widths(program: TileProgram, size_limit: int | None = None) -> IndexWidths:
    """The index widths of ``program``: 32-bit where constant extents, and size parameters of at most
    ``size_limit`` (where given), prove every value fits."""
    stores = [s for s in walk_tile_stmts(program.body) if isinstance(s, TileStore)]
    tile_elements = max((math.prod(axis_sizes(s).values()) for s in stores), default=1)
    tile = WIDE if tile_elements > INT32_MAX else NARROW
    names = ", ".join(p.name for p in program.params)
    if program.params and size_limit is None:
        return IndexWidths(WIDE, tile, f"size parameter(s) {names}: a symbolic size can be anything")
    ranges: dict[str, Interval] = {p.name: (0, size_limit) for p in program.params if size_limit is not None}
    found = _loop_ranges(program.body, ranges)
    if found is None:
        for s in stores:
            found = _store_overflow(s, ranges)
            if found is not None:
                break
    if found is not None:
        return IndexWidths(WIDE, tile, found if not program.params else f"{found} (size parameter(s) {names} "
                                                                           f"up to {size_limit})")
    if program.params:
        return IndexWidths(NARROW, tile, f"every loop extent, tile size and index expression is below 2^31 with "
                                         f"size parameter(s) {names} up to {size_limit}", size_limit)
    return IndexWidths(NARROW, tile, "every loop extent, tile size and index expression is below 2^31")


def is_index(e: Expr) -> bool:
    """Whether ``e`` is integer index arithmetic: an integer value of loop variables, sizes, tile axes
    and constants only (no loaded data, no reduction)."""
    return e.dtype.is_int and _index_only(e)


@functools.lru_cache(maxsize=4096)
def _index_only(e: Expr) -> bool:
    if isinstance(e, (TileLoad, Reduce, Dot)):
        return False
    return all(_index_only(c) for c in tile_children(e))


def _loop_ranges(body: Stmt, ranges: dict[str, Interval]) -> str | None:
    """Record every loop variable's range in ``ranges`` (a name used by several loops: the widest), outer
    loops first; a reason if an extent does not fit in 32 bits."""
    for s in walk_tile_stmts(body):
        if not isinstance(s, Loop):
            continue
        extent = _interval(s.extent, ranges)
        if not _fits(extent):
            return f"loop {s.var.name}: extent {tile_expr_str(s.extent)} may reach 2^31"
        assert extent is not None
        before = ranges.get(s.var.name, (0, 0))
        ranges[s.var.name] = None if before is None else (0, max(before[1], extent[1] - 1, 0))
    return None


def _store_overflow(s: TileStore, ranges: dict[str, Interval]) -> str | None:
    """A reason if an index expression of ``s`` (or an intermediate value of one) may leave 32 bits."""
    sizes = axis_sizes(s)
    roots = [s.value] + ([s.mask] if s.mask is not None else [])
    indices = list(s.index) + [i for root in roots for e in walk_tile_expr(root) if isinstance(e, TileLoad)
                               for i in e.index]
    for i in indices:
        if isinstance(i, Slice) and not _fits(_add(_interval(i.start, ranges), (0, sizes[i.axis] - 1))):
            return f"block {s.block!r}: index {tile_expr_str(i.start)} + tile axis {i.axis} may reach 2^31"
    roots += [i for i in s.index if not isinstance(i, Slice)]
    for root in roots:
        for e in walk_tile_expr(root):
            if is_index(e) and not _fits(_interval(e, ranges)):
                return f"block {s.block!r}: index expression {tile_expr_str(e)} may reach 2^31"
    return None


def _fits(x: Interval) -> bool:
    return x is not None and INT32_MIN <= x[0] and x[1] <= INT32_MAX


def _add(a: Interval, b: Interval) -> Interval:
    return None if a is None or b is None else (a[0] + b[0], a[1] + b[1])


def _interval(e: Expr, ranges: dict[str, Interval]) -> Interval:
    """Bounds of the integer index expression ``e`` with loop variables in ``ranges``; None where unbounded
    (or where an intermediate value does not fit in 32 bits)."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value))
    if isinstance(e, Var):
        return ranges.get(e.name)
    if isinstance(e, Iota):
        return (0, e.size - 1)
    if isinstance(e, (Broadcast, Permute, Squeeze)):
        return _interval(e.tile, ranges)
    if isinstance(e, Cast):
        return _interval(e.value, ranges) if e.value.dtype.is_int else None
    if isinstance(e, Select):
        t, f = _interval(e.true_value, ranges), _interval(e.false_value, ranges)
        return None if t is None or f is None else (min(t[0], f[0]), max(t[1], f[1]))
    if not isinstance(e, BinOp) or not e.dtype.is_int:
        return None
    a, b = _interval(e.a, ranges), _interval(e.b, ranges)
    if a is None or b is None or not (_fits(a) and _fits(b)):
        return None
    if e.op == "+":
        return _add(a, b)
    if e.op == "-":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "*":
        corners = [x * y for x in a for y in b]
        return (min(corners), max(corners))
    if e.op in ("max", "min"):
        pick = max if e.op == "max" else min
        return (pick(a[0], b[0]), pick(a[1], b[1]))
    if e.op in ("//", "%") and b[0] > 0:
        if e.op == "%":
            return (0, b[1] - 1)
        corners = [x // y for x in a for y in b]
        return (min(corners), max(corners))
    return None
