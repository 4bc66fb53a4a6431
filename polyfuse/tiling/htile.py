"""HTile IR: tile expressions and tile statements (Neptune §5).

A tile value spans named axes — the loop variables of the tileable nest it came
from.  Names are authoritative; the order of a value's axes is derived from its
node (a load lists its slices in tensor-dimension order, a ``Permute`` states its
order) and :func:`axes_of` computes it.  Elementwise operations reuse the IR's
scalar nodes (``BinOp``, ``Call``, ``Select``, ``Cast``) over tile operands; the
translator makes their non-scalar operands agree on axis names *and* order
(explicit ``Permute``/``Broadcast``), so NumPy-style broadcasting by position is
then broadcasting by name.

Scalar ``Loop``/``Seq`` of :mod:`polyfuse.ir.stmt` stay around tile statements:
grid- or thread-bound loops, rolling (annotated) loops and sequences.

The text form (:func:`tile_expr_str`, :func:`print_tile_program`) is at the end,
next to the nodes whose ``str()`` it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.errors import InternalError
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var
from polyfuse.ir.printer import expr_to_str
from polyfuse.ir.stmt import OUTPUT, Loop, Seq, Stmt, Tensor
from polyfuse.ir.visit import children, with_children

if TYPE_CHECKING:
    from polyfuse.transforms.ranges import ValueRange

REDUCE_OPS = ("sum", "prod", "max", "min", "or")


@dataclass(frozen=True)
class Slice:
    """``start + 0 .. start + size - 1`` along tile axis ``axis`` in one tensor dimension."""

    start: Expr
    size: int
    axis: str


@dataclass(frozen=True)
class Gather:
    """A data-dependent index: in each lane, the value of the integer tile ``index`` (a load of the index
    tensor over some of the nest's axes).  ``text`` is the index as the program wrote it (``target[i]``),
    for the run-time bounds check every backend prints (:func:`polyfuse.ir.gather.gather_error`)."""

    index: Expr
    text: str


Index = Expr | Slice | Gather
"""One dimension of a tile access: a scalar index (no tile axis), a :class:`Slice` or a :class:`Gather`."""


class TileExpr(Expr):
    """Base of tile-valued expression nodes (they are IR expressions, so IR ops can hold them)."""

    __slots__ = ()

    def __str__(self) -> str:
        return tile_expr_str(self)


@dataclass(frozen=True, eq=True, repr=False)
class TileLoad(TileExpr):
    """``tensor[index]`` as a tile; lanes where ``mask`` is false read ``other`` (nothing is accessed)."""

    tensor: Tensor
    index: tuple[Index, ...]
    mask: Expr | None = None
    other: Const | None = None

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype


@dataclass(frozen=True, eq=True, repr=False)
class Iota(TileExpr):
    """The values ``0 .. size-1`` of tile axis ``axis`` (a loop variable used as data)."""

    axis: str
    size: int

    @property
    def dtype(self) -> DType:
        return dt.i32


@dataclass(frozen=True, eq=True, repr=False)
class Broadcast(TileExpr):
    """``tile`` re-expressed over ``axes`` (name, size): the axes it lacks are new and repeat it."""

    tile: Expr
    axes: tuple[tuple[str, int], ...]

    @property
    def dtype(self) -> DType:
        return self.tile.dtype


@dataclass(frozen=True, eq=True, repr=False)
class Permute(TileExpr):
    """``tile`` with its axes reordered to ``order`` (names; the same set)."""

    tile: Expr
    order: tuple[str, ...]

    @property
    def dtype(self) -> DType:
        return self.tile.dtype


@dataclass(frozen=True, eq=True, repr=False)
class Squeeze(TileExpr):
    """``tile`` without its axis ``axis`` of size 1."""

    tile: Expr
    axis: str

    @property
    def dtype(self) -> DType:
        return self.tile.dtype


@dataclass(frozen=True, eq=True, repr=False)
class Reduce(TileExpr):
    """``op`` over axis ``axis`` of ``tile`` (``sum``, ``prod``, ``max``, ``min``, or ``or`` of booleans)."""

    op: str
    tile: Expr
    axis: str

    @property
    def dtype(self) -> DType:
        return dt.bool_ if self.op == "or" else self.tile.dtype


@dataclass(frozen=True, eq=True, repr=False)
class Dot(TileExpr):
    """``acc + Σ_axis a·b``.

    ``a`` is ``[batch.., m.., axis]``, ``b`` ``[batch.., axis, n..]`` and ``acc`` ``[batch.., m.., n..]``:
    the GEMM shape a code generator maps to tensor cores.
    """

    a: Expr
    b: Expr
    acc: Expr
    axis: str

    @property
    def dtype(self) -> DType:
        return self.acc.dtype


class TileStmt(Stmt):
    """Base of tile statements."""

    __slots__ = ()

    def __str__(self) -> str:
        return tile_stmt_str(self)


@dataclass(frozen=True)
class TileStore(TileStmt):
    """``tensor[index] = value`` where ``mask`` holds; ``block`` names the IR block it implements.

    With a ``reducer`` (``sum``, ``prod``, ``max``, ``min``) the store combines into the
    destination instead: ``tensor[index] = tensor[index] ⊕ value``.
    """

    block: str
    tensor: Tensor
    index: tuple[Index, ...]
    value: Expr
    mask: Expr | None = None
    reducer: str | None = None


@dataclass(frozen=True)
class TileProgram:
    """A translated program: the loop program's name, sizes and tensors with a tile body."""

    name: str
    params: tuple[Var, ...]
    tensors: tuple[Tensor, ...]
    body: Stmt
    ranges: tuple[ValueRange, ...] = ()
    """Range facts the loop program proves about its tensors' values (:mod:`polyfuse.transforms.ranges`): the
    tile passes keep every value, so the code generator may rely on them."""

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role == OUTPUT)

    def __str__(self) -> str:
        return print_tile_program(self)


def axis_sizes(s: TileStore) -> dict[str, int]:
    """The size of every tile axis named in a statement (slices, iotas, broadcasts)."""
    return expr_axis_sizes([s.value] + ([s.mask] if s.mask is not None else []), s.index, f"block {s.block!r}")


def expr_axis_sizes(exprs: list[Expr], index: tuple[Index, ...] = (),
                    where: str = "a tile expression") -> dict[str, int]:
    """The size of every tile axis named in ``exprs`` and the slices of ``index``; InternalError if
    one name has two sizes (``where`` says where)."""
    sizes: dict[str, int] = {}

    def note(axis: str, size: int) -> None:
        if sizes.setdefault(axis, size) != size:
            raise InternalError(f"{where}: tile axis {axis!r} has sizes {sizes[axis]} and {size}")

    for i in index:
        if isinstance(i, Slice):
            note(i.axis, i.size)
    for e in exprs:
        for n in walk_tile_expr(e):
            if isinstance(n, TileLoad):
                for i in n.index:
                    if isinstance(i, Slice):
                        note(i.axis, i.size)
            elif isinstance(n, Iota):
                note(n.axis, n.size)
            elif isinstance(n, Broadcast):
                for a, size in n.axes:
                    note(a, size)
            elif isinstance(n, Squeeze):
                note(n.axis, 1)
    return sizes


def slice_axes(index: tuple[Index, ...]) -> tuple[str, ...]:
    """The tile axes of an access, in tensor-dimension order (a gather's axes where it stands, unless a
    slice before it has them)."""
    out: list[str] = []
    for i in index:
        new = (i.axis,) if isinstance(i, Slice) else axes_of(i.index) if isinstance(i, Gather) else ()
        out += [a for a in new if a not in out]
    return tuple(out)


def has_gathers(program: TileProgram) -> bool:
    """Whether some load of ``program`` gathers."""
    return any(isinstance(n, TileLoad) and gathers(n.index)
               for s in walk_tile_stmts(program.body) if isinstance(s, TileStore)
               for e in (s.value, s.mask) if e is not None for n in walk_tile_expr(e))


def gathers(index: tuple[Index, ...]) -> tuple[tuple[int, Gather], ...]:
    """The gathered dimensions of an access and their gathers."""
    return tuple((d, i) for d, i in enumerate(index) if isinstance(i, Gather))


def axes_of(e: Expr) -> tuple[str, ...]:
    """The axis names of a tile value, in its order (``()`` for a scalar)."""
    if isinstance(e, (Var, Const)):
        return ()
    if isinstance(e, TileLoad):
        return slice_axes(e.index)
    if isinstance(e, Iota):
        return (e.axis,)
    if isinstance(e, Broadcast):
        return tuple(name for name, _ in e.axes)
    if isinstance(e, Permute):
        return e.order
    if isinstance(e, (Squeeze, Reduce)):
        return tuple(a for a in axes_of(e.tile) if a != e.axis)
    if isinstance(e, Dot):
        a = [x for x in axes_of(e.a) if x != e.axis]
        return tuple(a + [x for x in axes_of(e.b) if x != e.axis and x not in a])
    if isinstance(e, (BinOp, Call, Select, Cast)):
        found = max((axes_of(c) for c in children(e)), key=len)
        return found
    if isinstance(e, Load):
        raise InternalError(f"scalar load {e} left in a tile expression")
    raise InternalError(f"axes_of: unknown node {type(e).__name__}")


def tile_children(e: Expr) -> tuple[Expr, ...]:
    """Operands of a tile or scalar node (used by walkers)."""
    if isinstance(e, TileLoad):
        return tuple(i.index if isinstance(i, Gather) else i for i in e.index if not isinstance(i, Slice)) + tuple(
            i.start for i in e.index if isinstance(i, Slice)) + ((e.mask,) if e.mask is not None else ())
    if isinstance(e, (Broadcast, Permute, Squeeze, Reduce)):
        return (e.tile,)
    if isinstance(e, Dot):
        return (e.a, e.b, e.acc)
    if isinstance(e, (BinOp, Call, Select, Cast)):
        return children(e)
    return ()


def walk_tile_expr(e: Expr):
    """Pre-order traversal of a tile expression."""
    yield e
    for c in tile_children(e):
        yield from walk_tile_expr(c)


def walk_tile_stmts(s: Stmt):
    """Pre-order traversal of a tile program body."""
    yield s
    if isinstance(s, Loop):
        yield from walk_tile_stmts(s.body)
    elif isinstance(s, Seq):
        for c in s.stmts:
            yield from walk_tile_stmts(c)


def tensors_read(s: TileStore) -> set[str]:
    """The tensors statement ``s`` reads: in its value, its mask and its index."""
    exprs = [s.value] + ([s.mask] if s.mask is not None else [])
    exprs += [i.start if isinstance(i, Slice) else i for i in s.index]
    return {n.tensor.name for x in exprs for n in walk_tile_expr(x) if isinstance(n, TileLoad)}


def depends_on(e: Expr, axis: str) -> bool:
    """Whether the value of ``e`` varies along tile axis ``axis``."""
    if isinstance(e, Iota):
        return e.axis == axis
    if isinstance(e, TileLoad):
        if any(isinstance(i, Slice) and i.axis == axis for i in e.index):
            return True
        if any(depends_on(g.index, axis) for _, g in gathers(e.index)):
            return True
        return e.mask is not None and depends_on(e.mask, axis)
    if isinstance(e, Broadcast):
        return depends_on(e.tile, axis)
    if isinstance(e, Reduce) and e.axis == axis:
        return False
    return any(depends_on(c, axis) for c in tile_children(e))


def map_tile_expr(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """``e`` with every node for which ``fn`` returns an expression replaced (pre-order), rebuilt bottom-up."""
    got = fn(e)
    if got is not None:
        return got
    if isinstance(e, TileLoad):
        mask = None if e.mask is None else map_tile_expr(e.mask, fn)
        index = tuple(Gather(map_tile_expr(i.index, fn), i.text) if isinstance(i, Gather) else i for i in e.index)
        if mask is e.mask and index == e.index:
            return e
        return dataclasses.replace(e, mask=mask, index=index)
    if isinstance(e, (Broadcast, Permute, Squeeze, Reduce)):
        tile = map_tile_expr(e.tile, fn)
        return e if tile is e.tile else dataclasses.replace(e, tile=tile)
    if isinstance(e, Dot):
        a, b, acc = (map_tile_expr(x, fn) for x in (e.a, e.b, e.acc))
        return dataclasses.replace(e, a=a, b=b, acc=acc)
    kids = children(e)
    if not kids:
        return e
    return with_children(e, tuple(map_tile_expr(c, fn) for c in kids))


def constant_condition(e: Expr | None) -> bool | None:
    """The value of a condition that is a constant (possibly broadcast over some axes), else None."""
    while isinstance(e, Broadcast):
        e = e.tile
    return bool(e.value) if isinstance(e, Const) and e.dtype == dt.bool_ else None


def fold_constant_selects(e: Expr) -> Expr:
    """``e`` with each select on a constant condition replaced by the branch taken, broadcast back to the
    select's axes (left as it is where they cannot be named)."""
    def fn(x: Expr) -> Expr | None:
        if not isinstance(x, Select) or (cond := constant_condition(x.cond)) is None:
            return None
        return broadcast_like(fold_constant_selects(x.true_value if cond else x.false_value), x)

    return map_tile_expr(e, fn)


def broadcast_like(part: Expr, whole: Expr) -> Expr | None:
    """``part`` (a value ``whole`` reduces to once a condition is decided) over ``whole``'s axes: as it is where it
    has them, broadcast where it lacks some, None where they cannot be named."""
    want = axes_of(whole)
    if axes_of(part) == want:
        return part
    sizes = expr_axis_sizes([whole])
    if set(axes_of(part)) <= set(want) and all(a in sizes for a in want):
        return Broadcast(part, tuple((a, sizes[a]) for a in want))
    return None


# ------------------------------------------------------------------ text form
# One line per tile statement, axes named on every tile: meant for reading
# (``polyfuse show OP --stage tile``) and for golden tests.  It is the ``str()`` of the
# nodes above, so it lives next to them.

_INFIX = {"+", "-", "*", "/", "//", "%", "<", "<=", ">", ">=", "==", "!="}


def _is_scalar(e: Expr) -> bool:
    return not any(isinstance(n, (TileLoad, Iota, Broadcast, Permute, Squeeze, Reduce, Dot))
                   for n in walk_tile_expr(e))


def _index(i: Index) -> str:
    if isinstance(i, Slice):
        start = expr_to_str(i.start)
        return f"{'' if start == '0' else start + ' + '}:{i.size}@{i.axis}"
    if isinstance(i, Gather):
        return f"gather({tile_expr_str(i.index)})"
    return expr_to_str(i)


def _access(tensor: str, index: tuple[Index, ...]) -> str:
    return f"{tensor}[{', '.join(_index(i) for i in index)}]"


def tile_expr_str(e: Expr) -> str:
    """One-line text of a tile expression."""
    if isinstance(e, (Var, Const)) or (_is_scalar(e) and not isinstance(e, (BinOp, Call, Select, Cast))):
        return expr_to_str(e)
    if isinstance(e, TileLoad):
        other = e.other if e.other is not None else Const(0, e.dtype)
        mask = "" if e.mask is None else f", mask={tile_expr_str(e.mask)}, other={expr_to_str(other)}"
        return f"load({_access(e.tensor.name, e.index)}{mask})"
    if isinstance(e, Iota):
        return f"iota({e.axis}:{e.size})"
    if isinstance(e, Broadcast):
        axes = ", ".join(f"{a}:{n}" for a, n in e.axes)
        return f"broadcast({tile_expr_str(e.tile)}, [{axes}])"
    if isinstance(e, Permute):
        return f"permute({tile_expr_str(e.tile)}, [{', '.join(e.order)}])"
    if isinstance(e, Squeeze):
        return f"squeeze({tile_expr_str(e.tile)}, {e.axis})"
    if isinstance(e, Reduce):
        return f"reduce_{e.op}({tile_expr_str(e.tile)}, {e.axis})"
    if isinstance(e, Dot):
        return f"dot({tile_expr_str(e.a)}, {tile_expr_str(e.b)}, acc={tile_expr_str(e.acc)}, over={e.axis})"
    if isinstance(e, BinOp):
        a, b = tile_expr_str(e.a), tile_expr_str(e.b)
        return f"({a} {e.op} {b})" if e.op in _INFIX else f"{e.op}({a}, {b})"
    if isinstance(e, Call):
        return f"{e.fn}({tile_expr_str(e.args[0])})"
    if isinstance(e, Select):
        return f"select({tile_expr_str(e.cond)}, {tile_expr_str(e.true_value)}, {tile_expr_str(e.false_value)})"
    if isinstance(e, Cast):
        return f'cast("{e.type}", {tile_expr_str(e.value)})'
    raise TypeError(f"cannot print {type(e).__name__}")


def _lines(s: Stmt, indent: int, out: list[str]) -> None:
    pad = "    " * indent
    if isinstance(s, Seq):
        for c in s.stmts:
            _lines(c, indent, out)
    elif isinstance(s, Loop):
        extra = "" if s.kind == "serial" else f"  # {s.kind}"
        extra += f"  # {s.thread}" if s.thread else ""
        extra += "".join(f"  # {k}={v}" for k, v in s.annotations)
        out.append(f"{pad}for {s.var.name} in range({expr_to_str(s.extent)}):{extra}")
        _lines(s.body, indent + 1, out)
    elif isinstance(s, TileStore):
        mask = "" if s.mask is None else f", mask={tile_expr_str(s.mask)}"
        red = "" if s.reducer is None else f", reducer={s.reducer}"
        out.append(f"{pad}{s.block}: store({_access(s.tensor.name, s.index)}, "
                   f"{tile_expr_str(s.value)}{mask}{red})")
    else:
        raise TypeError(f"cannot print {type(s).__name__}")


def tile_stmt_str(s: Stmt) -> str:
    """Text of a tile statement and the loops and sequences around it, one line per statement."""
    out: list[str] = []
    _lines(s, 0, out)
    return "\n".join(out)


def print_tile_program(p: TileProgram) -> str:
    """The program header (tensors) and its tile body."""
    head = [f"# tile program {p.name}"]
    for t in p.tensors:
        shape = ", ".join(expr_to_str(d) for d in t.shape)
        head.append(f"# {t.role} {t.name}[{shape}] {t.dtype}")
    return "\n".join(head + [tile_stmt_str(p.body)])
