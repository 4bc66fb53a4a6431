"""The C-family emitter core: tile programs to C-like source, shared by every backend.

A tile statement is lowered in two steps.  First the nodes that need loops of their own —
``Reduce``, ``Dot``, and the non-trivial operand of a ``Broadcast`` (computed once instead of
once per broadcast lane) — are *materialized*: each gets a local array over its own axes,
filled in post-order.  Then the store runs one loop nest over the store's axes and evaluates
the rest of the value element by element.  ``Broadcast``, ``Permute`` and ``Squeeze`` cost
nothing: axes are named, so an element is addressed by binding axis names to loop variables.

Values of f16, bf16 and fp8 are computed in ``float`` and rounded after every operation, as
the tile interpreter rounds every NumPy operation in its node's dtype; memory holds their bits.

Backends subclass :class:`CFamilyEmitter` and override its table of differences (types, the
math function names, the parallel-loop pragma, the entry point and its prologue).  The C types
of counters and index arithmetic come from :mod:`polyfuse.emit_cpp.widths`, decided once per
program (``self.widths``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from polyfuse.emit_cpp.target import GATHER_FAULT, GatherSite
from polyfuse.emit_cpp.widths import index_widths, is_index
from polyfuse.errors import InternalError
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Select, Var
from polyfuse.ir.stmt import Loop, Seq, Stmt, Tensor
from polyfuse.tiling.htile import (
    Broadcast, Dot, Gather, Index, Iota, Permute, Reduce, Slice, Squeeze, TileLoad, TileProgram, TileStore, axes_of,
    axis_sizes, gathers, tile_children,
)

LOW_PRECISION = {"f16": "f16", "bf16": "bf16", "fp8e4m3": "fp8"}
_INFIX = {"+": "+", "-": "-", "*": "*", "/": "/", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==",
          "!=": "!=", "and": "&&", "or": "||"}
_LOGICAL = ("<", "<=", ">", ">=", "==", "!=", "and", "or")
_REDUCE_INIT = {"sum": "0", "prod": "1", "max": "-INFINITY", "min": "INFINITY", "or": "false"}
_REDUCER_OP = {"sum": "+", "prod": "*", "max": "max", "min": "min", "or": "or"}
COMPUTE_TYPES = {"f16": "float", "bf16": "float", "fp8e4m3": "float", "f32": "float", "f64": "double",
                 "i32": "int32_t", "i64": "int64_t", "bool": "bool"}
"""The C type each dtype is computed in (16-bit and fp8 values in float, rounded after every operation)."""
STORAGE_TYPES = {"f16": "uint16_t", "bf16": "uint16_t", "fp8e4m3": "uint8_t", "f32": "float", "f64": "double",
                 "i32": "int32_t", "i64": "int64_t", "bool": "bool"}
"""The C type each dtype is stored as (16-bit and fp8 values as their bits)."""
SIZEOF = {"float": 4, "double": 8, "int32_t": 4, "int64_t": 8, "bool": 1, "int": 4, "uint16_t": 2, "uint8_t": 1}


@dataclass
class _Materialized:
    """A node's values in array ``name`` over ``axes``, row-major; rows ``pitch`` apart if given."""

    name: str
    axes: tuple[str, ...]
    pitch: int | None = None

    def at(self, sizes: dict[str, int], env: dict[str, str]) -> str:
        if self.pitch is None or len(self.axes) < 2:
            return flat(self.axes, sizes, env)
        return f"({flat(self.axes[:-1], sizes, env)} * {self.pitch} + {env[self.axes[-1]]})"


class CFamilyEmitter:
    """Lowers one :class:`TileProgram`; subclasses set the table of differences below."""

    compute_types = COMPUTE_TYPES
    storage_types = STORAGE_TYPES
    math_functions = {"exp": "std::exp", "log": "std::log", "sqrt": "std::sqrt", "tanh": "std::tanh",
                      "floor": "std::floor", "ceil": "std::ceil", "exp2": "std::exp2", "log2": "std::log2",
                      "abs": "std::fabs", "pow": "std::pow"}
    helpers = "pf::"
    restrict = "__restrict__"
    large_array = 16384
    """Local arrays with more elements than this live on the heap (``heap_array``)."""
    size_limit: int | None = None
    """The largest size parameter value index arithmetic may assume (:func:`~polyfuse.emit_cpp.widths.index_widths`;
    the launch refuses larger ones); None: sizes can be anything, a program with size parameters indexes in 64 bits."""

    def __init__(self, program: TileProgram):
        self.program = program
        self.lines: list[str] = []
        self.depth = 0
        self.counter = 0
        self.params = {p.name for p in program.params}
        self.widths = index_widths(program, self.size_limit)
        self.materialized: dict[Expr, _Materialized] = {}  # per store; empty for loop extents before the first
        self.block = ""  # the block of the statement being printed (named by gather faults)
        self.gather_sites: list[GatherSite] = []

    # ------------------------------------------------------------ table of differences (override)
    def parallel_pragma(self, collapse: int) -> str | None:
        return None

    def local_array(self, ctype: str, name: str, size: int, *, zero: bool) -> list[str]:
        if size > self.large_array:
            return self.heap_array(ctype, name, str(size))
        return [f"{ctype} {name}[{size}]{' = {}' if zero else ''};"]

    def heap_array(self, ctype: str, name: str, size: str) -> list[str]:
        raise NotImplementedError

    # ------------------------------------------------------------ output helpers
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def fresh(self, hint: str = "t") -> str:
        self.counter += 1
        return f"pf_{hint}{self.counter}"

    def open(self, header: str) -> None:
        self.line(f"{header} {{" if header else "{")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.line("}")

    def for_axes(self, axes: tuple[str, ...], sizes: dict[str, int]) -> int:
        for a in axes:
            self.open(self.axis_loop(a, sizes[a]))
        return len(axes)

    def axis_loop(self, axis: str, size: int) -> str:
        """The header of a loop over tile axis ``axis`` (its counter in the tile width)."""
        v = axis_var(axis)
        return f"for ({self.widths.tile} {v} = 0; {v} < {size}; ++{v})"

    def close_n(self, n: int) -> None:
        for _ in range(n):
            self.close()

    # ------------------------------------------------------------ types and conversions
    def ctype(self, d: DType) -> str:
        return self.compute_types[d.name]

    def stype(self, d: DType) -> str:
        return self.storage_types[d.name]

    def rounded(self, text: str, d: DType) -> str:
        """``text`` (computed in float) rounded to the low-precision dtype ``d``."""
        low = LOW_PRECISION.get(d.name)
        return f"{self.helpers}round_{low}({text})" if low else text

    def convert(self, text: str, src: DType, dst: DType) -> str:
        if src == dst:
            return text
        if dst.is_bool:
            return f"({text} != 0)"
        if dst.name in LOW_PRECISION:
            return self.rounded(f"static_cast<float>({text})", dst)
        return f"static_cast<{self.ctype(dst)}>({text})"

    def from_storage(self, text: str, d: DType) -> str:
        low = LOW_PRECISION.get(d.name)
        return f"{self.helpers}{low}_to_float({text})" if low else text

    def to_storage(self, text: str, d: DType) -> str:
        low = LOW_PRECISION.get(d.name)
        return f"{self.helpers}float_to_{low}({text})" if low else text

    def literal(self, value: float | int | bool, d: DType) -> str:
        if d.is_bool:
            return "true" if value else "false"
        if d.is_int:
            return f"({int(value)})" if d.bits <= 32 else f"int64_t({int(value)})"
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "(-INFINITY)" if v < 0 else "INFINITY"
        suffix = "" if d == dt.f64 else "f"
        text = f"{v.hex()}{suffix}"
        return f"({text})" if v < 0 else text

    # ------------------------------------------------------------ tensors
    def offset(self, tensor: Tensor, idx: list[str]) -> str:
        """Row-major offset of ``idx`` in ``tensor`` (int64 arithmetic)."""
        if not idx:
            return "0"
        text = f"static_cast<int64_t>({idx[0]})"
        for dim, i in zip(tensor.shape[1:], idx[1:], strict=True):
            text = f"({text} * {self.scalar(dim, {})} + {i})"
        return text

    def access(self, tensor: Tensor, index: tuple[Index, ...], env: dict[str, str]) -> str:
        return f"{tensor.name}[{self.offset(tensor, self.indices(index, env))}]"

    def indices(self, index: tuple[Index, ...], env: dict[str, str]) -> list[str]:
        """C text of each dimension's index of an access under ``env``."""
        idx = []
        for i in index:
            if isinstance(i, Gather):
                idx.append(self.scalar(i.index, env))
            elif isinstance(i, Slice):
                start = self.scalar(i.start, env)
                idx.append(env[i.axis] if start == "(0)" else f"({start} + {env[i.axis]})")
            else:
                idx.append(self.scalar(i, env))
        return idx

    # ------------------------------------------------------------ expressions
    def scalar(self, e: Expr, env: dict[str, str]) -> str:
        """C text of the element of ``e`` at the axis values bound in ``env``."""
        found = self.materialized.get(e) if isinstance(e, (Reduce, Dot, BinOp, Call, Select, Cast)) else None
        if found is not None:
            return f"{found.name}[{found.at(self.sizes, env)}]"
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Const):
            return self.literal(e.value, e.dtype)
        if isinstance(e, TileLoad):
            value = self.from_storage(self.access(e.tensor, e.index, env), e.tensor.dtype)
            other = self.literal(e.other.value if e.other is not None else 0, e.tensor.dtype)
            if gathers(e.index):
                value = f"({self.gather_checks(e, env)} ? {value} : {other})"
            if e.mask is None:
                return value
            return f"({self.scalar(e.mask, env)} ? {value} : {other})"
        if isinstance(e, Iota):
            return env[e.axis]
        if isinstance(e, (Broadcast, Permute)):
            return self.scalar(e.tile, env)
        if isinstance(e, Squeeze):
            return self.scalar(e.tile, {**env, e.axis: "0"})
        if isinstance(e, BinOp):
            d = self.widths.index_dtype(e.a.dtype) if is_index(e) else e.a.dtype
            inverse = self.divisor_inverse(e, d)
            if inverse is not None:
                return self.binop("*", self.scalar(e.a, env), inverse, d)
            return self.binop(e.op, self.scalar(e.a, env), self.scalar(e.b, env), d)
        if isinstance(e, Call):
            return self.call(e.fn, self.scalar(e.args[0], env), e.dtype)
        if isinstance(e, Select):
            return (f"({self.scalar(e.cond, env)} ? {self.scalar(e.true_value, env)} : "
                    f"{self.scalar(e.false_value, env)})")
        if isinstance(e, Cast):
            return self.convert(self.scalar(e.value, env), e.value.dtype, e.type)
        raise InternalError(f"C emitter: unknown expression node {type(e).__name__}")

    def divisor_inverse(self, e: BinOp, d: DType) -> str | None:
        """The text of what to multiply by instead of dividing by ``e``'s divisor, or None: divide (the host
        C++ backend always divides, as the program says)."""
        return None

    def gather_checks(self, e: TileLoad, env: dict[str, str]) -> str:
        """``pf::gathered(index, extent, fault, site)`` for every gathered dimension of ``e``: true when the
        index lies in its dimension; otherwise the first fault is recorded and the load is not made."""
        checks = []
        for d, g in gathers(e.index):
            access = f"{e.tensor.name}[{', '.join(g.text if k == d else '...' for k in range(len(e.index)))}]"
            site = GatherSite(self.block, access, e.tensor.name, d, g.text)
            if site not in self.gather_sites:
                self.gather_sites.append(site)
            extent = self.scalar(e.tensor.shape[d], {})
            checks.append(f"{self.helpers}gathered(static_cast<int64_t>({self.scalar(g.index, env)}), "
                          f"static_cast<int64_t>({extent}), {GATHER_FAULT}, {self.gather_sites.index(site) + 1})")
        return " && ".join(checks)

    def binop(self, op: str, a: str, b: str, d: DType) -> str:
        ct = self.ctype(d)
        if op in ("max", "min"):
            return f"{self.helpers}{op}<{ct}>({a}, {b})"
        if op in ("//", "%"):
            fn = "floordiv" if op == "//" else "mod"
            return self.rounded(f"{self.helpers}{fn}(static_cast<{ct}>({a}), static_cast<{ct}>({b}))", d)
        if op == "pow":
            return self.rounded(f"static_cast<{ct}>({self.math_functions['pow']}({a}, {b}))", d)
        if op not in _INFIX:
            raise InternalError(f"C emitter: unknown binary operator {op!r}")
        text = f"({a} {_INFIX[op]} {b})"
        return text if op in _LOGICAL else self.rounded(text, d)

    def call(self, fn: str, x: str, d: DType) -> str:
        if fn == "neg":
            return f"(-{x})"
        if fn == "not":
            return f"(!{x})"
        if fn == "abs" and not d.is_float:
            return f"std::abs({x})"
        if fn == "sigmoid":
            one = self.literal(1.0, d)
            e = self.rounded(f"{self.math_functions['exp']}(-{x})", d)
            return self.rounded(f"({one} / {self.rounded(f'({one} + {e})', d)})", d)
        if fn not in self.math_functions:
            raise InternalError(f"C emitter: unknown math function {fn!r}")
        return self.rounded(f"{self.math_functions[fn]}({x})", d)

    # ------------------------------------------------------------ statements
    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                self.stmt(c)
        elif isinstance(s, Loop):
            self.loop(s)
        elif isinstance(s, TileStore):
            self.store(s)
        else:
            raise InternalError(f"C emitter: unknown statement {type(s).__name__}")

    def loop(self, s: Loop) -> None:
        self.open(self.loop_header(s))
        self.allocate(s)
        self.stmt(s.body)
        self.close()

    def loop_header(self, s: Loop) -> str:
        v = s.var.name
        return f"for ({self.widths.loop} {v} = 0; {v} < {self.scalar(s.extent, {})}; ++{v})"

    def allocate(self, s: Loop) -> None:
        """Declare the tensors allocated once per iteration of ``s``."""

    def store(self, s: TileStore) -> None:
        self.block = s.block
        self.sizes = axis_sizes(s)
        self.materialized: dict[Expr, _Materialized] = {}
        self.line(f"// {s.block}")
        self.open("")
        exprs = [s.value] + ([s.mask] if s.mask is not None else [])
        for e in exprs:
            self.materialize_within(e)
        axes = tuple(i.axis for i in s.index if isinstance(i, Slice))
        env = {a: axis_var(a) for a in axes}
        if self.reads_other_elements(s):
            self.materialize(s.value)
        n = self.for_axes(axes, self.sizes)
        self.assign(s, env)
        self.close_n(n)
        self.close()
        self.materialized = {}

    def stored_value(self, s: TileStore, env: dict[str, str]) -> str:
        """``s``'s value at the axis values bound in ``env``, converted to its tensor's type."""
        return self.convert(self.scalar(s.value, env), s.value.dtype, s.tensor.dtype)

    def assign(self, s: TileStore, env: dict[str, str]) -> None:
        """The element of ``s`` at the axis values bound in ``env``: ``target = value`` (masked, combined)."""
        value = self.stored_value(s, env)
        target = self.access(s.tensor, s.index, env)
        if s.reducer is not None:
            old = self.from_storage(target, s.tensor.dtype)
            value = self.binop(_REDUCER_OP[s.reducer], old, value, s.tensor.dtype)
        assign = f"{target} = {self.to_storage(value, s.tensor.dtype)};"
        if s.mask is not None:
            self.line(f"if ({self.scalar(s.mask, env)}) {assign}")
        else:
            self.line(assign)

    def reads_other_elements(self, s: TileStore) -> bool:
        """Whether the value reads ``s.tensor`` at elements other than the one each lane writes."""
        for n in walk_unmaterialized(s.value, self.materialized):
            if isinstance(n, TileLoad) and n.tensor.name == s.tensor.name and n.index != s.index:
                return True
        return False

    # ------------------------------------------------------------ materialization
    def materialize_within(self, e: Expr) -> None:
        """Materialize, in post-order, the nodes of ``e`` that need loops of their own."""
        for x in materializations(e, self.materialized, self.worth_hoisting):
            self.materialize(x)

    def worth_hoisting(self, e: Expr) -> bool:
        """Whether to compute a broadcast's operand ``e`` once per element of its own axes."""
        return worth_hoisting(e)

    def materialize(self, e: Expr) -> None:
        axes = axes_of(e)
        name = self.fresh()
        size = math.prod(self.sizes[a] for a in axes)
        for text in self.local_array(self.ctype(e.dtype), name, size, zero=False):
            self.line(text)
        env = {a: axis_var(a) for a in axes}
        if isinstance(e, Dot):
            self.dot(e, name, axes)
        elif isinstance(e, Reduce):
            n = self.for_axes(axes, self.sizes)
            acc = self.fresh("acc")
            ct = self.ctype(e.dtype)
            self.line(f"{ct} {acc} = {_REDUCE_INIT[e.op]};")
            self.open(self.axis_loop(e.axis, self.sizes[e.axis]))
            item = self.scalar(e.tile, {**env, e.axis: axis_var(e.axis)})
            op = _REDUCER_OP[e.op]
            combined = f"{self.helpers}{op}<{ct}>({acc}, {item})" if op in ("max", "min") else (
                f"({acc} || {item})" if op == "or" else f"({acc} {op} {item})")
            self.line(f"{acc} = {combined};")
            self.close()
            self.line(f"{name}[{flat(axes, self.sizes, env)}] = {self.rounded(acc, e.dtype)};")
            self.close_n(n)
        else:
            n = self.for_axes(axes, self.sizes)
            self.line(f"{name}[{flat(axes, self.sizes, env)}] = {self.scalar(e, env)};")
            self.close_n(n)
        self.materialized[e] = _Materialized(name, axes)

    def dot(self, e: Dot, name: str, axes: tuple[str, ...]) -> None:
        """``name = acc + Σ_k a·b``: operands in local arrays, the k-loop outside the b-only axes."""
        ct = self.ctype(e.dtype)
        operands = []
        for x in (e.a, e.b):
            x_axes = axes_of(x)
            arr = self.fresh("op")
            for text in self.local_array(ct, arr, math.prod(self.sizes[a] for a in x_axes), zero=False):
                self.line(text)
            env = {a: axis_var(a) for a in x_axes}
            n = self.for_axes(x_axes, self.sizes)
            self.line(f"{arr}[{flat(x_axes, self.sizes, env)}] = "
                      f"{self.convert(self.scalar(x, env), x.dtype, e.dtype)};")
            self.close_n(n)
            operands.append((arr, x_axes))
        (a_arr, a_axes), (b_arr, b_axes) = operands
        prod = self.fresh("prod")
        for text in self.local_array(ct, prod, math.prod(self.sizes[a] for a in axes), zero=True):
            self.line(text)
        env = {a: axis_var(a) for a in (*axes, e.axis)}
        outer = tuple(a for a in a_axes if a != e.axis)
        inner = tuple(a for a in b_axes if a != e.axis and a not in outer)
        n = self.for_axes((*outer, e.axis, *inner), self.sizes)
        self.line(f"{prod}[{flat(axes, self.sizes, env)}] += {a_arr}[{flat(a_axes, self.sizes, env)}] * "
                  f"{b_arr}[{flat(b_axes, self.sizes, env)}];")
        self.close_n(n)
        n = self.for_axes(axes, self.sizes)
        at = flat(axes, self.sizes, env)
        total = self.rounded(f"({self.scalar(e.acc, env)} + {prod}[{at}])", e.dtype)
        self.line(f"{name}[{at}] = {total};")
        self.close_n(n)


def align16(n: int) -> int:
    """``n`` bytes rounded up to a multiple of 16 (shared-memory arrays start 16-byte aligned: 128-bit accesses)."""
    return -(-n // 16) * 16


def reduce_lanes(threads: int, outputs: int, length: int | None = None) -> int:
    """Lanes per output when a block of ``threads`` shares ``outputs`` reductions: as many as the threads
    allow, a power of two, and (given the ``length`` reduced) no more than the elements rounded up to one."""
    lanes = 1 << (max(1, threads // outputs).bit_length() - 1)
    return lanes if length is None else min(lanes, 1 << max(0, (length - 1).bit_length()))


def axis_var(axis: str) -> str:
    return f"x_{axis}"


def static_numel(t: Tensor) -> int | None:
    """The element count of ``t`` if its shape is constant, else None."""
    if all(isinstance(d, Const) for d in t.shape):
        return math.prod(int(d.value) for d in t.shape)
    return None


def flat(axes: tuple[str, ...], sizes: dict[str, int], env: dict[str, str]) -> str:
    """Row-major offset of the element at ``env`` in an array over ``axes``."""
    if not axes:
        return "0"
    text = env[axes[0]]
    for a in axes[1:]:
        text = f"({text} * {sizes[a]} + {env[a]})"
    return text


CHEAP_CALLS = ("neg", "not", "abs")
"""Math functions cheaper to recompute per element than to compute once and share."""


def worth_hoisting(e: Expr) -> bool:
    """Whether computing ``e`` once per element of its own axes saves work (it is not a leaf)."""
    return isinstance(e, (BinOp, Call, Select, Cast))


def materializations(e: Expr, done, hoist: Callable[[Expr], bool]) -> list[Expr]:
    """The nodes of ``e`` that get arrays of their own, in the post-order they are filled: every ``Reduce``
    and ``Dot``, and the operand of a ``Broadcast`` that ``hoist`` says is worth computing once per element
    of its own axes.  ``done`` holds the nodes already materialized (not visited again); a broadcast met
    twice materializes its operand twice, as its statement evaluates it twice."""
    seen = set(done)
    out: list[Expr] = []

    def visit(x: Expr) -> None:
        if x in seen:
            return
        for c in tile_children(x):
            visit(c)
        if isinstance(x, (Reduce, Dot)):
            out.append(x)
            seen.add(x)
        elif isinstance(x, Broadcast) and hoist(x.tile) and len(axes_of(x.tile)) < len(x.axes):
            out.append(x.tile)
            seen.add(x.tile)

    visit(e)
    return out


def walk_unmaterialized(e: Expr, done):
    """Pre-order nodes of ``e`` that are evaluated element by element (not inside materialized ones)."""
    if e in done:
        return
    yield e
    for c in tile_children(e):
        yield from walk_unmaterialized(c, done)
