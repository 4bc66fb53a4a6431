"""The loop-nest builder: write programs the way the math reads.

Neptune's Figure 1a::

    p = ProgramBuilder("softmax_sum")
    N, M = p.sizes("N", "M")
    inp = p.input("inp", (N, M), "f32")
    xmax, xexp = p.temp("xmax", (N,), "f32"), p.temp("xexp", (N, M), "f32")
    xsum = p.output("xsum", (N,), "f32")
    with p.nest("s_max", i=N, j=reduce(M)) as (i, j):
        xmax[i] = maximum(xmax[i], inp[i, j])
    with p.nest("s_exp", i=N, j=M) as (i, j):
        xexp[i, j] = exp(inp[i, j] - xmax[i])
    with p.nest("s_sum", i=N, j=reduce(M)) as (i, j):
        xsum[i] = xsum[i] + xexp[i, j]
    program = p.build()

``nest`` opens one loop per iteration variable (same names, identity bindings)
around a block.  The general form, which the printer uses for scheduled
programs, opens loops with ``p.loop(...)`` and binds a block's iteration
variables explicitly with ``p.block(name, i=spatial(N, i0 * 4 + i1), ...)``.
A reduction's reducer is inferred from its store (``x[i] = x[i] + t`` is a sum,
``maximum(x[i], t)`` a max …) unless ``reducer=`` is given; ``init`` defaults to
the reducer's identity, and ``init=NO_INIT`` makes a reduction that accumulates
into the tensor's current value (what ``decompose_reduction`` leaves behind).

``p.where(cond)`` inside an open block restricts its instances to those where
``cond`` holds (the block's predicate, see :class:`~polyfuse.ir.stmt.Block`);
several calls conjoin::

    with p.block("s_rf", i=spatial(N, i), j0=spatial(3, j0), j1=reduce(16, j1)) as (i, j0, j1):
        p.where(j0 * 16 + j1 < 40)
        acc[i, j0] = acc[i, j0] + x[i, j0 * 16 + j1]
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Sequence

from polyfuse.errors import IRError, NonAffineIndex
from polyfuse.ir import dtypes as dt
from polyfuse.ir.affine import linear_form
from polyfuse.ir.expr import BinOp, Const, Expr, ExprLike, Load, Select, Var, cast, const
from polyfuse.ir.gather import is_gather_index
from polyfuse.ir.stmt import (
    BOUND, GLOBAL, INPUT, OUTPUT, REDUCE, SERIAL, SPATIAL, TEMP, Block, IterVar, Loop,
    Program, Reducer, Stmt, Store, Tensor, builtin_reducer, reducer_for_op,
)
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import seq

class _NoInit:
    """The type of :data:`NO_INIT`."""

    def __repr__(self) -> str:
        return "NO_INIT"


NO_INIT = _NoInit()
"""``init=NO_INIT``: the reduction has no init and accumulates into the tensor's current value."""

_CURRENT: contextvars.ContextVar[_OpenBlock | None] = contextvars.ContextVar("polyfuse_open_block", default=None)


@dataclass(frozen=True)
class IterSpec:
    """How a block iteration variable is declared: extent, kind, optional binding."""

    extent: ExprLike
    kind: str
    bind: ExprLike | None = None


def spatial(extent: ExprLike, bind: ExprLike | None = None) -> IterSpec:
    """A spatial (map) iteration variable; ``bind`` is its value in enclosing loop variables."""
    return IterSpec(extent, SPATIAL, bind)


def reduce(extent: ExprLike, bind: ExprLike | None = None) -> IterSpec:
    """A reduce iteration variable."""
    return IterSpec(extent, REDUCE, bind)


def make_reducer(name: str, combine: Callable[[Var, Var], ExprLike], *, identity: ExprLike,
                 dtype: dt.DType | str) -> Reducer:
    """A custom reducer ``combine(acc, term)`` with its identity, e.g. a product or a max of |x|."""
    d = dt.dtype(dtype)
    lhs, rhs = Var("lhs", d), Var("rhs", d)
    body = cast(d, combine(lhs, rhs))
    ident = const(identity, d)
    if not isinstance(ident, Const):
        raise IRError(f"reducer {name!r}: identity must be a constant, got {ident}")
    return Reducer(name, lhs, rhs, body, ident)


def _as_index(x: object, tensor: Tensor, d: int, *, gather: bool) -> Expr:
    if isinstance(x, bool) or not isinstance(x, (int, Expr)):
        raise IRError(f"tensor {tensor.name!r}: index {d} is {x!r}, not an integer expression")
    e = const(x) if isinstance(x, int) else x
    if gather and is_gather_index(e):
        return e
    try:
        linear_form(e)
    except NonAffineIndex as err:
        hint = ("; a data-dependent index (a gather) is a bare load of an integer input tensor, "
                "e.g. x[i, target[i]]") if gather else ("; a store's indices must be affine "
                                                        "(a data-dependent store, a scatter, is not supported)")
        raise NonAffineIndex(f"tensor {tensor.name!r}, index {d}: {err}{hint}") from None
    return e


def _indices(tensor: Tensor, idx: object, *, gather: bool) -> tuple[Expr, ...]:
    items = idx if isinstance(idx, tuple) else (idx,)
    if len(items) != tensor.ndim:
        raise IRError(f"tensor {tensor.name!r} has {tensor.ndim} dimensions but is indexed with {len(items)}")
    return tuple(_as_index(x, tensor, d, gather=gather) for d, x in enumerate(items))


def make_load(tensor: Tensor, idx: object) -> Load:
    """``tensor[idx]`` with checked indices: quasi-affine, or a gather index (a load of an integer input,
    see :func:`~polyfuse.ir.affine.is_gather_index`)."""
    return Load(tensor, _indices(tensor, idx, gather=True))


def record_store(tensor: Tensor, idx: object, value: object) -> None:
    """``tensor[idx] = value`` inside an open block (see :meth:`ProgramBuilder.block`)."""
    blk = _CURRENT.get()
    if blk is None:
        raise IRError(f"store to {tensor.name!r} outside of a block; open one with `with p.nest(...)`")
    blk.set_store(tensor, _indices(tensor, idx, gather=False), value)


def _is_update(reducer: Reducer, value: Expr, acc: Load) -> bool:
    """``value`` is ``a ⊕ b`` with the accumulator read inside ``a`` or ``b``: the repaired update of a
    fused reduction (``X = G(h(X, r, r')) ⊕ rest``), which only an explicit ``reducer=`` admits; or a select
    between two such updates (a consumer's ``init`` taken at the last rolling step:
    ``select(last, (update) ⊕ init, update)``), so that every program a fusion prints loads back."""
    from polyfuse.ir.visit import loads, match_pattern

    if isinstance(value, Select):
        return _is_update(reducer, value.true_value, acc) and _is_update(reducer, value.false_value, acc)
    bound = match_pattern(reducer.combine, value, fixed={}, wildcards=(reducer.lhs, reducer.rhs))
    return bound is not None and acc in loads(value)


class _OpenBlock:
    def __init__(self, name: str, iters: tuple[IterVar, ...], reducer: Reducer | str | None,
                 init: ExprLike | _NoInit | None):
        self.name, self.iters, self.reducer, self.init = name, iters, reducer, init
        self.store: Store | None = None
        self.block_reducer: Reducer | None = None
        self.where: Expr | None = None

    def add_where(self, cond: object) -> None:
        if not isinstance(cond, Expr) or not cond.dtype.is_bool:
            raise IRError(f"block {self.name!r}: p.where({cond}) needs a boolean condition of its iteration "
                          "variables, e.g. p.where(j0 * 16 + j1 < 40)")
        self.where = cond if self.where is None else self.where & cond

    def set_store(self, tensor: Tensor, indices: tuple[Expr, ...], value: object) -> None:
        if self.store is not None:
            raise IRError(f"block {self.name!r} already stores to {self.store.tensor.name!r}; a block has one store")
        v = cast(tensor.dtype, value if isinstance(value, Expr) else const(value, tensor.dtype))  # type: ignore[arg-type]
        if not any(iv.is_reduce for iv in self.iters):
            if self.reducer is not None or self.init is not None:
                raise IRError(f"block {self.name!r} has a reducer or init but no reduce iteration variable")
            self.store = Store(tensor, indices, v)
            return
        acc = Load(tensor, indices)
        red = self._reducer(tensor, acc, v)
        if red.match(v, acc) is None and not (self.reducer is not None and _is_update(red, v, acc)):
            raise IRError(
                f"block {self.name!r} has reduce iterations but its store {tensor.name}[...] = {v} is not "
                f"of the form {tensor.name}[...] = {red.name}({tensor.name}[...], term)"
            )
        self.block_reducer = red
        self.store = Store(tensor, indices, v)

    def _reducer(self, tensor: Tensor, acc: Load, v: Expr) -> Reducer:
        if isinstance(self.reducer, Reducer):
            return self.reducer
        if isinstance(self.reducer, str):
            return builtin_reducer(self.reducer, tensor.dtype)
        if isinstance(v, BinOp) and acc in (v.a, v.b):
            found = reducer_for_op(v.op, tensor.dtype)
            if found is not None:
                return found
        red = ", ".join(iv.var.name for iv in self.iters if iv.is_reduce)
        raise IRError(
            f"block {self.name!r} reduces over {red} but its store {tensor.name}[...] = {v} is not "
            f"{tensor.name}[...] ⊕ term for ⊕ in +, *, max, min; write it so, or pass reducer="
        )

    def finish(self, bindings: tuple[Expr, ...]) -> Block:
        if self.store is None:
            raise IRError(f"block {self.name!r} has no store; write `tensor[...] = value` inside it")
        init = None
        if self.block_reducer is not None and self.init is not NO_INIT:
            init = self.block_reducer.identity if self.init is None else cast(self.store.tensor.dtype, self.init)
        return Block(self.name, self.iters, bindings, self.store, self.block_reducer, init, self.where)


class ProgramBuilder:
    """Collects size parameters, tensors and loop nests, and builds a validated Program."""

    def __init__(self, name: str):
        if not name.isidentifier():
            raise IRError(f"program name {name!r} is not a Python identifier")
        self.name = name
        self._params: list[Var] = []
        self._tensors: list[Tensor] = []
        self._stack: list[list[Stmt]] = [[]]

    # ------------------------------------------------------------ declarations
    def size(self, name: str) -> Var:
        """Declare a named size parameter (bound later, or from input shapes)."""
        if any(p.name == name for p in self._params):
            raise IRError(f"size parameter {name!r} declared twice")
        v = Var(name)
        self._params.append(v)
        return v

    def sizes(self, *names: str) -> tuple[Var, ...]:
        return tuple(self.size(n) for n in names)

    def _tensor(self, name: str, shape: Sequence[ExprLike], dtype: dt.DType | str, role: str, scope: str,
                sign: str | None = None, finite: bool = False) -> Tensor:
        if any(t.name == name for t in self._tensors):
            raise IRError(f"tensor {name!r} declared twice in program {self.name!r}")
        dims = []
        for d, x in enumerate(shape):
            if isinstance(x, bool) or not isinstance(x, (int, Expr)):
                raise IRError(f"tensor {name!r}: shape dimension {d} is {x!r}, not an integer or size")
            if isinstance(x, int) and x < 1:
                raise IRError(f"tensor {name!r}: shape dimension {d} is {x}; extents must be positive")
            dims.append(const(x) if isinstance(x, int) else x)
        t = Tensor(name, tuple(dims), dt.dtype(dtype), role, scope, sign, finite)
        self._tensors.append(t)
        return t

    def input(self, name: str, shape: Sequence[ExprLike], dtype: dt.DType | str, *, sign: str | None = None,
              finite: bool = False) -> Tensor:
        """A program input; ``sign="nonnegative"`` or ``"positive"`` and ``finite=True`` promise that of
        its every value (see :class:`~polyfuse.ir.stmt.Tensor`)."""
        return self._tensor(name, shape, dtype, INPUT, GLOBAL, sign, finite)

    def output(self, name: str, shape: Sequence[ExprLike], dtype: dt.DType | str) -> Tensor:
        return self._tensor(name, shape, dtype, OUTPUT, GLOBAL)

    def temp(self, name: str, shape: Sequence[ExprLike], dtype: dt.DType | str, scope: str = GLOBAL) -> Tensor:
        return self._tensor(name, shape, dtype, TEMP, scope)

    # ------------------------------------------------------------ structure
    @contextlib.contextmanager
    def loop(self, name: str, extent: ExprLike, *, kind: str = SERIAL, thread: str | None = None,
             annotations: tuple[tuple[str, object], ...] = ()) -> Iterator[Var]:
        """Open ``for name in range(extent)``; statements opened inside go into its body."""
        var = Var(name)
        if thread is not None and kind == SERIAL:
            kind = BOUND
        self._stack.append([])
        yield var
        body = self._stack.pop()
        if not body:
            raise IRError(f"loop {name!r} has an empty body")
        self._stack[-1].append(Loop(var, const(extent) if isinstance(extent, int) else extent,
                                    seq(*body), kind, thread, tuple(annotations)))

    @contextlib.contextmanager
    def block(self, name: str, *, reducer: Reducer | str | None = None, init: ExprLike | _NoInit | None = None,
              **iters: IterSpec) -> Iterator[tuple[Var, ...]]:
        """Open a block whose iteration variables are bound explicitly (``spatial(N, bind)``)."""
        missing = [k for k, s in iters.items() if not isinstance(s, IterSpec) or s.bind is None]
        if missing:
            raise IRError(f"block {name!r}: iteration variable(s) {', '.join(missing)} need spatial(extent, bind) "
                          "or reduce(extent, bind); use p.nest(...) for implicit loops")
        ivs = self._iter_vars(name, iters)
        bindings = tuple(const(s.bind) if isinstance(s.bind, int) else s.bind for s in iters.values())  # type: ignore[misc]
        with self._open(name, ivs, reducer, init) as (vars_, ob):
            yield vars_
        self._stack[-1].append(ob.finish(bindings))  # type: ignore[arg-type]

    @contextlib.contextmanager
    def nest(self, name: str, *, reducer: Reducer | str | None = None, init: ExprLike | _NoInit | None = None,
             **iters: ExprLike | IterSpec) -> Iterator[tuple[Var, ...]]:
        """Open a perfect loop nest (one loop per iteration variable, same names) around a block."""
        specs = {k: v if isinstance(v, IterSpec) else spatial(v) for k, v in iters.items()}
        bound = [k for k, s in specs.items() if s.bind is not None]
        if bound:
            raise IRError(f"nest {name!r}: {', '.join(bound)} has a binding; nest() binds loops itself, use block()")
        ivs = self._iter_vars(name, specs)
        with self._open(name, ivs, reducer, init) as (vars_, ob):
            yield vars_
        stmt: Stmt = ob.finish(tuple(Var(iv.var.name) for iv in ivs))
        for iv in reversed(ivs):
            stmt = Loop(Var(iv.var.name), iv.extent, stmt)
        self._stack[-1].append(stmt)

    def where(self, cond: Expr) -> None:
        """Restrict the open block's instances to those where ``cond`` holds (conjoined with earlier calls).

        ``cond`` is a comparison (``<, <=, >, >=, eq``) of affine expressions of the block's
        iteration variables and sizes, or several joined with ``&``; checked at ``build()``.
        """
        blk = _CURRENT.get()
        if blk is None:
            raise IRError(f"p.where({cond}) outside of a block; call it inside `with p.block(...)` or `p.nest(...)`")
        blk.add_where(cond)

    def _iter_vars(self, name: str, specs: dict[str, IterSpec]) -> tuple[IterVar, ...]:
        if not specs:
            raise IRError(f"block {name!r} has no iteration variables")
        out = []
        for k, s in specs.items():
            ext = s.extent
            if isinstance(ext, bool) or not isinstance(ext, (int, Expr)):
                raise IRError(f"block {name!r}: extent of {k!r} is {ext!r}, not an integer or size")
            if isinstance(ext, int) and ext < 1:
                raise IRError(f"block {name!r}: extent of {k!r} is {ext}; extents must be positive")
            out.append(IterVar(Var(k), const(ext) if isinstance(ext, int) else ext, s.kind))
        return tuple(out)

    @contextlib.contextmanager
    def _open(self, name: str, ivs: tuple[IterVar, ...], reducer, init):
        if _CURRENT.get() is not None:
            raise IRError(f"block {name!r} is opened inside block {_CURRENT.get().name!r}; blocks do not nest")  # type: ignore[union-attr]
        ob = _OpenBlock(name, ivs, reducer, init)
        token = _CURRENT.set(ob)
        try:
            yield tuple(iv.var for iv in ivs), ob
        finally:
            _CURRENT.reset(token)

    def build(self) -> Program:
        """The validated Program (raises IRError / NonAffineIndex naming what is wrong).

        Every access is proven in bounds for all sizes here (OutOfBounds with a witness
        otherwise), so a wrong index is reported where it is written, not by a kernel.
        """
        from polyfuse.deps.bounds import require_in_bounds  # ISL; deps builds on the IR, so imported late

        if len(self._stack) != 1:
            raise IRError(f"program {self.name!r}: build() called inside an open loop")
        if not self._stack[0]:
            raise IRError(f"program {self.name!r} has no statements")
        program = validate(Program(self.name, tuple(self._params), tuple(self._tensors), seq(*self._stack[0])))
        return require_in_bounds(program)


__all__ = ["NO_INIT", "ProgramBuilder", "spatial", "reduce", "make_reducer", "IterSpec"]
