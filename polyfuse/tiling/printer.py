"""Text form of tile programs: one line per tile statement, axes named on every tile.

Meant for reading (``polyfuse show OP --stage tile``) and for golden tests, so each
load, permute, broadcast, reduce and dot prints its axis names.
"""

from __future__ import annotations

from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Select, Var
from polyfuse.ir.printer import expr_to_str
from polyfuse.ir.stmt import Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Broadcast, Dot, Index, Iota, Permute, Reduce, Slice, Squeeze, TileLoad, TileProgram, TileStore,
    walk_tile_expr,
)

_INFIX = {"+", "-", "*", "/", "//", "%", "<", "<=", ">", ">=", "==", "!="}


def _is_scalar(e: Expr) -> bool:
    return not any(isinstance(n, (TileLoad, Iota, Broadcast, Permute, Squeeze, Reduce, Dot))
                   for n in walk_tile_expr(e))


def _index(i: Index) -> str:
    if isinstance(i, Slice):
        start = expr_to_str(i.start)
        return f"{'' if start == '0' else start + ' + '}:{i.size}@{i.axis}"
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
