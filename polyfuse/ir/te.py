"""The tensor-expression layer: define outputs as functions of indices.

Neptune's attention (paper App. A, Fig. 12) reads almost as there::

    q = placeholder((B, H, S, D), "f16", name="q")
    ...
    p = batch_matmul(q, k, trans_b=True, out_dtype="f32", name="p")
    j = reduce_axis(S, name="j")
    m = compute((B, H, S), lambda b, h, i: max(p(b, h, i, j), axis=j), name="m")
    ...
    program = create_program([out], name="attention")

Each ``compute`` becomes one block (and one tensor) named after it; its
iteration variables are named after the lambda's parameters.  A reduction
(``sum``/``max``/``min``/``prod``/a :func:`comm_reducer`) must be the whole body.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import itertools
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence

from polyfuse.errors import IRError
from polyfuse.ir import dtypes as dt
from polyfuse.ir.builder import make_load
from polyfuse.ir.expr import Expr, ExprLike, Load, Var, cast, const, select
from polyfuse.ir.stmt import (
    INPUT, OUTPUT, REDUCE, SPATIAL, Block, IterVar, Loop, Program, Reducer, Stmt, Store, Tensor, builtin_reducer,
)
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import free_vars, replace_tensor, seq

_counter = itertools.count()
_reading: contextvars.ContextVar[list | None] = contextvars.ContextVar("polyfuse_te_reads", default=None)


def size_var(name: str) -> Var:
    """A named size parameter."""
    return Var(name)


@dataclass(frozen=True, eq=False)
class ReduceAxis:
    """A reduction variable ``0 <= var < extent``."""

    var: Var
    extent: Expr

    def __add__(self, o): return self.var + o  # noqa: E704
    def __radd__(self, o): return o + self.var  # noqa: E704
    def __sub__(self, o): return self.var - o  # noqa: E704
    def __rsub__(self, o): return o - self.var  # noqa: E704
    def __mul__(self, o): return self.var * o  # noqa: E704
    def __rmul__(self, o): return o * self.var  # noqa: E704
    def __lt__(self, o): return self.var < o  # noqa: E704
    def __le__(self, o): return self.var <= o  # noqa: E704
    def __gt__(self, o): return self.var > o  # noqa: E704
    def __ge__(self, o): return self.var >= o  # noqa: E704


def reduce_axis(dom: ExprLike | tuple[ExprLike, ExprLike], name: str) -> ReduceAxis:
    """A reduction axis over ``range(extent)`` (``(0, extent)`` accepted as in TVM)."""
    if isinstance(dom, tuple):
        lo, hi = dom
        if not (isinstance(lo, int) and lo == 0):
            raise IRError(f"reduce_axis {name!r}: lower bound must be 0 (got {lo})")
        dom = hi
    return ReduceAxis(Var(name), const(dom) if isinstance(dom, int) else dom)  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False)
class _Reduction:
    reducer_name: str | Reducer
    term: Expr
    axes: tuple[ReduceAxis, ...]

    def _refuse(self, *_: object) -> Expr:
        raise IRError("a reduction must be the whole body of compute(), not part of an expression; "
                      "compute it into its own tensor first")


for _dunder in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "pow", "rpow",
                "lt", "le", "gt", "ge", "neg"):
    setattr(_Reduction, f"__{_dunder}__", _Reduction._refuse)


def _axes(axis) -> tuple[ReduceAxis, ...]:
    items = axis if isinstance(axis, (list, tuple)) else (axis,)
    if not items or not all(isinstance(a, ReduceAxis) for a in items):
        raise IRError(f"a reduction needs reduce_axis(...) axes, got {axis!r}")
    return tuple(items)


def _term(x: ExprLike) -> Expr:
    return _unwrap(x)


def sum(expr: ExprLike, axis) -> _Reduction:  # noqa: A001 - mirrors TVM's te.sum
    return _Reduction("sum", _term(expr), _axes(axis))


def max(expr: ExprLike, axis) -> _Reduction:  # noqa: A001
    return _Reduction("max", _term(expr), _axes(axis))


def min(expr: ExprLike, axis) -> _Reduction:  # noqa: A001
    return _Reduction("min", _term(expr), _axes(axis))


def prod(expr: ExprLike, axis) -> _Reduction:
    return _Reduction("prod", _term(expr), _axes(axis))


def comm_reducer(reducer: Reducer) -> Callable[..., _Reduction]:
    """Turn a custom :class:`Reducer` (see ``make_reducer``) into a reduction function."""
    def apply(expr: ExprLike, axis) -> _Reduction:
        return _Reduction(reducer, _term(expr), _axes(axis))
    return apply


def if_then_else(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    return select(_unwrap(cond), _unwrap(a), _unwrap(b))


def _unwrap(x):
    if isinstance(x, ReduceAxis):
        return x.var
    if isinstance(x, _Reduction):
        raise IRError("a reduction must be the whole body of compute(), not part of an expression")
    return x


@dataclass(eq=False)
class TensorHandle:
    """A tensor of the TE layer: call it with indices to read it."""

    tensor: Tensor
    block: Block | None = None
    reads: tuple[TensorHandle, ...] = ()
    order: int = field(default_factory=lambda: next(_counter))

    @property
    def shape(self) -> tuple[Expr, ...]:
        return self.tensor.shape

    @property
    def dtype(self) -> dt.DType:
        return self.tensor.dtype

    @property
    def name(self) -> str:
        return self.tensor.name

    def __call__(self, *indices: ExprLike) -> Load:
        seen = _reading.get()
        if seen is not None:
            seen.append(self)
        return make_load(self.tensor, tuple(_unwrap(i) for i in indices))

    def __getitem__(self, indices) -> Load:
        return self(*(indices if isinstance(indices, tuple) else (indices,)))

    def astype(self, dtype: dt.DType | str, name: str | None = None) -> TensorHandle:
        return compute(self.shape, lambda *ax: cast(dtype, self(*ax)), name=name or f"{self.name}_{dtype}")


def placeholder(shape: Sequence[ExprLike], dtype: dt.DType | str, name: str, *,
                sign: str | None = None, finite: bool = False) -> TensorHandle:
    """A program input (``sign``, ``finite`` as in :meth:`~polyfuse.ir.builder.ProgramBuilder.input`)."""
    return TensorHandle(Tensor(name, _shape(shape, name), dt.dtype(dtype), INPUT, sign=sign, finite=finite))


def _shape(shape: Sequence[ExprLike], name: str) -> tuple[Expr, ...]:
    out = []
    for d, x in enumerate(shape):
        if isinstance(x, bool) or not isinstance(x, (int, Expr)):
            raise IRError(f"tensor {name!r}: shape dimension {d} is {x!r}, not an integer or size")
        out.append(const(x) if isinstance(x, int) else x)
    return tuple(out)


def _param_names(fcompute: Callable, ndim: int, name: str, given: Sequence[str] | None) -> list[str]:
    if given is not None:
        if len(given) != ndim:
            raise IRError(f"compute {name!r}: {len(given)} index names for {ndim} dimensions")
        return list(given)
    params = list(inspect.signature(fcompute).parameters.values())
    if len(params) == 1 and params[0].kind == inspect.Parameter.VAR_POSITIONAL:
        return [f"ax{k}" for k in range(ndim)]
    if len(params) != ndim or any(p.kind != inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        raise IRError(f"compute {name!r}: the function takes {len(params)} indices, the shape has {ndim} dimensions")
    return [p.name for p in params]


def compute(shape: Sequence[ExprLike], fcompute: Callable[..., ExprLike | _Reduction], name: str,
            dtype: dt.DType | str | None = None, index_names: Sequence[str] | None = None) -> TensorHandle:
    """A new tensor whose element at the lambda's indices is the lambda's value.

    Index (iteration variable) names are the lambda's parameter names, ``ax0, ax1, …`` for
    ``*ax``, or ``index_names``.
    """
    dims = _shape(shape, name)
    names = _param_names(fcompute, len(dims), name, index_names)
    vars_ = [Var(n) for n in names]
    reads: list[TensorHandle] = []
    token = _reading.set(reads)
    try:
        body = fcompute(*vars_)
    finally:
        _reading.reset(token)
    iters = [IterVar(v, d, SPATIAL) for v, d in zip(vars_, dims, strict=True)]
    reducer: Reducer | None = None
    if isinstance(body, _Reduction):
        clash = {a.var.name for a in body.axes} & set(names)
        if clash:
            raise IRError(f"compute {name!r}: reduce axis {sorted(clash)[0]!r} has the name of an index")
        iters += [IterVar(a.var, a.extent, REDUCE) for a in body.axes]
        term = body.term
        out_dtype = dt.dtype(dtype) if dtype is not None else term.dtype
        reducer = body.reducer_name if isinstance(body.reducer_name, Reducer) else \
            builtin_reducer(body.reducer_name, out_dtype)
        out = Tensor(name, dims, out_dtype)
        acc = Load(out, tuple(vars_))
        value = reducer.apply(acc, cast(out_dtype, term))
        blk = Block(name, tuple(iters), tuple(iv.var for iv in iters), Store(out, tuple(vars_), value),
                    reducer, reducer.identity)
    else:
        value = _unwrap(body)
        if not isinstance(value, Expr):
            value = const(value, dtype or "f32")
        out_dtype = dt.dtype(dtype) if dtype is not None else value.dtype
        out = Tensor(name, dims, out_dtype)
        blk = Block(name, tuple(iters), tuple(iv.var for iv in iters),
                    Store(out, tuple(vars_), cast(out_dtype, value)))
    uniq = tuple(dict.fromkeys(reads))
    return TensorHandle(out, blk, uniq)


def batch_matmul(a: TensorHandle, b: TensorHandle, *, trans_b: bool = False, out_dtype: dt.DType | str | None = None,
                 name: str = "batch_matmul") -> TensorHandle:
    """``a[..., i, k] · b[..., k, j]`` (or ``b[..., j, k]`` with ``trans_b``) over equal batch dims."""
    if a.tensor.ndim != b.tensor.ndim or a.tensor.ndim < 2:
        raise IRError(f"batch_matmul {name!r}: operands {a.name!r} and {b.name!r} need equal rank >= 2")
    kdim = a.shape[-1]
    n = b.shape[-2] if trans_b else b.shape[-1]
    od = dt.dtype(out_dtype) if out_dtype is not None else a.dtype
    k = reduce_axis(kdim, name="k")

    def body(*ax):
        *batch, i, j = ax
        bv = b(*batch, j, k) if trans_b else b(*batch, k, j)
        return sum(cast(od, a(*batch, i, k)) * cast(od, bv), axis=k)

    index_names = [f"b{d}" for d in range(a.tensor.ndim - 2)] + ["i", "j"]
    return compute((*a.shape[:-1], n), body, name=name, dtype=od, index_names=index_names)


def create_program(outputs: Sequence[TensorHandle], name: str, *, inputs: Sequence[TensorHandle] | None = None,
                   params: Sequence[Var] | None = None) -> Program:
    """The Program computing ``outputs``: one loop nest per compute, in definition order.

    Inputs are the placeholders reached (in ``inputs`` order if given, else definition
    order); size parameters are the variables in tensor shapes unless ``params`` is given.
    Every access is proven in bounds for all sizes, as by ``ProgramBuilder.build``.
    """
    from polyfuse.deps.bounds import require_in_bounds  # ISL; deps builds on the IR, so imported late

    reached: dict[int, TensorHandle] = {}
    stack = list(outputs)
    while stack:
        h = stack.pop()
        if id(h) not in reached:
            reached[id(h)] = h
            stack.extend(h.reads)
    handles = sorted(reached.values(), key=lambda h: h.order)
    placeholders = [h for h in handles if h.block is None]
    bad = [h.name for h in outputs if h.block is None]
    if bad:
        raise IRError(f"program {name!r}: output {bad[0]!r} is a placeholder, not a computed tensor")
    if inputs is not None:
        unknown = [h.name for h in placeholders if all(h is not x for x in inputs)]
        if unknown:
            raise IRError(f"program {name!r} reads {', '.join(unknown)}, which is not among the given inputs")
        placeholders = list(inputs)
    computed = [h for h in handles if h.block is not None]
    tensors = [h.tensor for h in placeholders] + [h.tensor for h in computed]
    if params is None:
        names = dict.fromkeys(v for t in tensors for d in t.shape for v in sorted(free_vars(d)))
        params = [Var(v) for v in names]
    body = seq(*(_nest(h.block) for h in computed))  # type: ignore[arg-type]
    prog = Program(name, tuple(params), tuple(tensors), body)
    for h in outputs:
        prog = replace_tensor(prog, h.tensor, dataclasses.replace(h.tensor, role=OUTPUT))
    return require_in_bounds(validate(prog))


def _nest(block: Block) -> Stmt:
    """The perfect loop nest binding ``block`` by identity."""
    stmt: Stmt = block
    for iv in reversed(block.iters):
        stmt = Loop(Var(iv.var.name), iv.extent, stmt)
    return stmt
