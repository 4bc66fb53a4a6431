"""Execute any Program with NumPy, exactly by its sequential semantics.

Statements run in program order and every operation rounds in its node's dtype
(f16, bf16 and fp8 e4m3 through NumPy / ml_dtypes), so a result here is the
result of the program, not of the math it stands for.

Speed comes from running a loop as one NumPy axis instead of a Python loop when
that cannot change the result: every tensor written inside the loop is accessed
(read and written) there only at indices that agree in some dimension on an
expression ``a·v + e`` with ``a != 0`` and ``e`` free of the loop's own inner
loops.  Then distinct iterations touch disjoint elements, so executing the body
statement by statement for all iterations at once equals executing it iteration
by iteration.  Reductions over a loop fail the test and stay sequential, so
their accumulation order is the program's.

Temporaries and outputs start as NaN (floats), so reading an element before it is
written shows up in the result instead of passing silently.  A size may be 0: a reduction
over no elements is its init (:mod:`polyfuse.ir.empty`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from polyfuse.errors import IRError, PolyfuseError, UnboundSize
from polyfuse.ir.affine import fold_div_mod, linear_form, variables
from polyfuse.ir.empty import init_empty_reductions
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var
from polyfuse.ir.gather import gather_error, is_gather_index
from polyfuse.ir.stmt import INPUT, Block, Loop, Program, Seq, Stmt, Tensor, walk_stmts
from polyfuse.ir.visit import loads, substitute

if TYPE_CHECKING:
    from polyfuse.emit_cpp.target import Arg

Value = np.ndarray
_TRUE = np.bool_(True)

NUMPY_BINARY = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "//": np.floor_divide,
    "%": np.mod, "max": np.maximum, "min": np.minimum, "pow": np.power,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal, "and": np.logical_and, "or": np.logical_or,
}
NUMPY_UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs, "neg": np.negative,
    "floor": np.floor, "ceil": np.ceil, "exp2": np.exp2, "log2": np.log2, "not": np.logical_not,
}


def interpret(program: Program, inputs: Mapping[str, np.ndarray], sizes: Mapping[str, int] | None = None,
              *, return_temps: bool = False) -> dict[str, np.ndarray]:
    """Run ``program`` on NumPy ``inputs`` (by tensor name) and return its outputs.

    Size parameters are taken from ``sizes`` and from input shapes whose dimension is
    a bare parameter.  Inputs must have exactly the declared shapes and dtypes.
    """
    bound, buffers = prepare(program, inputs, sizes)
    Runner(bound, buffers).execute()
    return {t.name: buffers[t.name] for t in results(bound, return_temps)}


def prepare(program: Program, inputs: Mapping[str, np.ndarray],
            sizes: Mapping[str, int] | None) -> tuple[Program, dict[str, np.ndarray]]:
    """The program with its sizes bound (and the inits of reductions a size 0 leaves empty), and a buffer
    per tensor: the inputs, NaN-filled (floats) or zero (integers) for the rest."""
    bound = init_empty_reductions(_bind(program, inputs, sizes or {}))
    buffers: dict[str, np.ndarray] = {}
    for t in bound.tensors:
        shape = tuple(_static(d, f"shape of tensor {t.name!r}") for d in t.shape)
        if t.role == INPUT:
            arr = np.asarray(inputs[t.name])
            if arr.dtype != t.dtype.numpy:
                raise IRError(f"input {t.name!r} has dtype {arr.dtype}, the program declares {t.dtype}")
            if arr.shape != shape:
                raise IRError(f"input {t.name!r} has shape {arr.shape}, the program declares {shape}")
            check_promises(t, arr)
            buffers[t.name] = arr
        else:
            fill = np.nan if t.dtype.is_float else 0
            buffers[t.name] = np.full(shape, fill, dtype=t.dtype.numpy)
    return bound, buffers


def results(program: Program, temps: bool = False) -> list[Tensor]:
    """The tensors a run returns: the outputs, and the temporaries with ``temps``."""
    return [t for t in program.tensors if t.role != INPUT and (temps or t.role == "output")]


def check_promises(t: Tensor | Arg, values: np.ndarray) -> None:
    """Refuse values that break what an input declares (``sign``, ``finite``; NaN breaks every sign);
    ``t`` is the program's tensor or a kernel's argument of it."""
    if t.sign is None and not t.finite:
        return
    with np.errstate(invalid="ignore"):
        bad = np.zeros(values.shape, dtype=bool)
        if t.sign is not None:
            bad |= ~(values >= 0) if t.sign == "nonnegative" else ~(values > 0)
        if t.finite:
            bad |= ~np.isfinite(values)
    if np.any(bad):
        where = tuple(int(k) for k in np.argwhere(bad)[0])
        promise = ", ".join(x for x in (f"sign={t.sign!r}" if t.sign else "", "finite=True" if t.finite else "") if x)
        raise IRError(f"input {t.name!r} is declared {promise}, but its element {list(where)} is {values[where]}; "
                      "the fused program relies on the declaration")


def _bind(program: Program, inputs: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> Program:
    names = {t.name for t in program.inputs}
    missing = sorted(names - set(inputs))
    extra = sorted(set(inputs) - names)
    if missing:
        raise IRError(f"program {program.name!r} needs input(s) {', '.join(missing)}")
    if extra:
        raise IRError(f"program {program.name!r} has no input named {', '.join(extra)}; "
                      f"its inputs: {', '.join(sorted(names))}")
    params = {p.name for p in program.params}
    found: dict[str, int] = {k: int(v) for k, v in sizes.items()}
    for t in program.inputs:
        shape = np.shape(inputs[t.name])
        if len(shape) != t.ndim:
            raise IRError(f"input {t.name!r} has {len(shape)} dimensions, the program declares {t.ndim}")
        for d, (decl, got) in enumerate(zip(t.shape, shape, strict=True)):
            if isinstance(decl, Var) and decl.name in params:
                if found.setdefault(decl.name, got) != got:
                    raise IRError(f"size {decl.name} is {found[decl.name]}, but input {t.name!r} "
                                  f"has {got} in dimension {d}")
    unbound = sorted(params - set(found))
    if unbound:
        raise UnboundSize(f"program {program.name!r}: no value for size(s) {', '.join(unbound)}; "
                          "pass sizes= or inputs whose shapes determine them")
    return program.bind(**{k: v for k, v in found.items() if k in params}) if params else program


def _static(e: Expr, what: str) -> int:
    if isinstance(e, Const):
        return int(e.value)
    raise UnboundSize(f"{what}: {e} is not a constant after binding sizes")


class Runner:
    """Runs a bound program over its buffers.

    A subclass may carry something along with every value (the error-bound interpreter carries a bound):
    a store writes what :meth:`stored` returns, through :meth:`store`; node values come from
    :func:`apply`, so they are the same in every subclass.
    """

    def __init__(self, program: Program, buffers: dict[str, np.ndarray]):
        self.program = program
        self.buffers = buffers
        self.vectorized = {id(s) for s in walk_stmts(program.body) if isinstance(s, Loop) and _independent(s)}
        self.ndim = _vector_depth(program.body, self.vectorized)

    def execute(self) -> None:
        with np.errstate(all="ignore"):
            self.run(self.program.body, {}, ())

    # ------------------------------------------------------------ statements
    def run(self, s: Stmt, env: dict[str, Value], axes: tuple[int, ...]) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                self.run(c, env, axes)
        elif isinstance(s, Loop):
            n = _static(s.extent, f"extent of loop {s.var.name!r}")
            if id(s) in self.vectorized:
                axis = len(axes)
                shape = [1] * self.ndim
                shape[axis] = n
                inner = dict(env)
                inner[s.var.name] = np.arange(n, dtype=np.int64).reshape(shape)
                self.run(s.body, inner, axes + (axis,))
            else:
                inner = dict(env)
                for k in range(n):
                    inner[s.var.name] = np.int64(k)
                    self.run(s.body, inner, axes)
        elif isinstance(s, Block):
            self.block(s, env)
        else:
            raise IRError(f"cannot interpret statement {type(s).__name__}")

    def block(self, b: Block, env: dict[str, Value]) -> None:
        ienv: dict[str, Value] = {}
        guard: Value = np.bool_(True)
        for iv, bnd in zip(b.iters, b.bindings, strict=True):
            val = self.expr(bnd, env, b)
            ienv[iv.var.name] = val
            ext = _static(iv.extent, f"block {b.name!r}, extent of {iv.var.name!r}")
            guard = guard & (val >= 0) & (val < ext)
        if b.where is not None:
            guard = guard & self.expr(b.where, ienv, b)
        if not np.any(guard):
            return
        st = b.store
        idx = [self.expr(i, ienv, b) for i in st.indices]
        if b.reducer is not None and b.init is not None:
            first: Value = np.bool_(True)
            for iv in b.reduce_iters:
                first = first & (ienv[iv.var.name] == 0)
            init_mask = guard & first
            if np.any(init_mask):
                self.store(b, st.tensor, idx, self.stored(b.init, ienv, b, guard), init_mask)
        self.store(b, st.tensor, idx, self.stored(st.value, ienv, b, guard), guard)

    def stored(self, e: Expr, env: dict[str, Value], b: Block, guard: Value) -> object:
        """What a store of ``e`` writes (here its value)."""
        return self.expr(e, env, b, guard)

    def store(self, b: Block, t: Tensor, idx: list[Value], value: object, mask: Value) -> None:
        self.write(self.buffers[t.name], b, t, idx, value, mask)  # type: ignore[arg-type]

    def write(self, buf: np.ndarray, b: Block, t: Tensor, idx: list[Value], value: Value, mask: Value) -> None:
        """``buf[idx] = value`` where ``mask`` holds (``buf`` is ``t``'s buffer or one shaped like it)."""
        arrays = np.broadcast_arrays(*idx, value, mask)
        *ix, val, m = arrays
        if m.all():
            self._check_bounds(b, t, ix, None, "writes")
            buf[tuple(ix)] = val.astype(buf.dtype, copy=False)
        else:
            sel = tuple(a[m] for a in ix)
            self._check_bounds(b, t, list(sel), None, "writes")
            buf[sel] = val[m].astype(buf.dtype, copy=False)

    def _check_bounds(self, b: Block, t: Tensor, idx: list[Value], mask: Value | None, verb: str) -> None:
        buf = self.buffers[t.name]
        for d, (i, n) in enumerate(zip(idx, buf.shape, strict=True)):
            bad = (i < 0) | (i >= n)
            if mask is not None:
                bad = bad & mask
            if np.any(bad):
                where = np.asarray(np.broadcast_to(i, np.shape(bad)))[np.asarray(bad)]
                raise PolyfuseError(f"block {b.name!r} {verb} tensor {t.name!r} out of bounds: "
                                    f"index {int(where.flat[0])} in dimension {d} of size {n}")

    # ------------------------------------------------------------ expressions
    def expr(self, e: Expr, env: dict[str, Value], b: Block, guard: Value = _TRUE) -> Value:
        if isinstance(e, Var):
            return self.var(e, env, b)
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=e.dtype.numpy)
        if isinstance(e, Load):
            return np.asarray(self.buffers[e.tensor.name][self.index(e, env, b, guard)])
        if not isinstance(e, OPERATIONS):
            raise IRError(f"block {b.name!r}: cannot interpret {type(e).__name__}")
        return apply(e, [self.expr(x, env, b, guard) for x in operands(e)])

    def var(self, e: Var, env: dict[str, Value], b: Block) -> Value:
        try:
            return env[e.name]
        except KeyError:
            raise IRError(f"block {b.name!r}: variable {e.name!r} has no value here") from None

    def index(self, e: Load, env: dict[str, Value], b: Block, guard: Value) -> tuple[Value, ...]:
        """The indices ``e`` reads where ``guard`` holds (out-of-bounds reads there raise), clipped into
        the buffer elsewhere."""
        buf = self.buffers[e.tensor.name]
        idx = [self.expr(i, env, b, guard) for i in e.indices]
        for d, (i, n) in enumerate(zip(idx, buf.shape, strict=True)):
            bad = ((i < 0) | (i >= n)) & guard
            if is_gather_index(e.indices[d]) and np.any(bad):
                value = int(np.asarray(np.broadcast_to(i, np.shape(bad)))[np.asarray(bad)].flat[0])
                raise gather_error(b.name, str(e), e.tensor.name, d, str(e.indices[d]), value, n)
        self._check_bounds(b, e.tensor, idx, guard, "reads")
        return tuple(np.clip(i, 0, n - 1) for i, n in zip(idx, buf.shape, strict=True))


OPERATIONS = (BinOp, Call, Select, Cast)


def operands(e: BinOp | Call | Select | Cast) -> tuple[Expr, ...]:
    """The operands of an operation node in :func:`apply`'s order."""
    if isinstance(e, BinOp):
        return (e.a, e.b)
    if isinstance(e, Call):
        return e.args[:1]
    if isinstance(e, Select):
        return (e.cond, e.true_value, e.false_value)
    return (e.value,)


def apply(e: BinOp | Call | Select | Cast, args: list[Value]) -> Value:
    """The value of operation node ``e`` from its operands' values, rounded in ``e``'s dtype."""
    if isinstance(e, BinOp):
        out = NUMPY_BINARY[e.op](args[0], args[1])
        return np.asarray(out, dtype=e.dtype.numpy) if out.dtype != e.dtype.numpy else out
    if isinstance(e, Call):
        x = args[0]
        if e.fn == "sigmoid":
            one = np.asarray(1, dtype=x.dtype)
            return np.asarray(one / (one + np.exp(-x)), dtype=x.dtype)
        return np.asarray(NUMPY_UNARY[e.fn](x), dtype=e.dtype.numpy)
    if isinstance(e, Select):
        return np.asarray(np.where(*args), dtype=e.dtype.numpy)
    return np.asarray(args[0]).astype(e.type.numpy)


# ------------------------------------------------------------------ planning

def _independent(loop: Loop) -> bool:
    """True if the loop's iterations touch disjoint elements of everything written inside it."""
    v = loop.var.name
    inner = {s.var.name for s in walk_stmts(loop.body) if isinstance(s, Loop)}
    ranges = {v: _const_or_none(loop.extent)}
    for s in walk_stmts(loop.body):
        if isinstance(s, Loop):
            ext = _const_or_none(s.extent)
            ranges[s.var.name] = None if ext is None or ranges.get(s.var.name, 0) is None else max(
                ext, ranges.get(s.var.name, 0) or 0)
    blocks = [s for s in walk_stmts(loop.body) if isinstance(s, Block)]
    written = {b.store.tensor.name for b in blocks}
    accesses: dict[str, list[tuple[Expr, ...]]] = {name: [] for name in written}
    for b in blocks:
        binding = {iv.var.name: bnd for iv, bnd in zip(b.iters, b.bindings, strict=True)}
        refs = [(b.store.tensor.name, b.store.indices)]
        for expr in (b.store.value, b.init):
            if expr is not None:
                refs += [(ld.tensor.name, ld.indices) for ld in loads(expr)]
        for name, idx in refs:
            if name in accesses:
                accesses[name].append(tuple(fold_div_mod(substitute(i, binding), ranges) for i in idx))
    for idx_list in accesses.values():
        if not any(_separating_dim(idx_list, d, v, inner) for d in range(len(idx_list[0]))):
            return False
    return True


def _const_or_none(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Const) else None


def _separating_dim(idx_list: list[tuple[Expr, ...]], d: int, v: str, inner: set[str]) -> bool:
    try:
        forms = [linear_form(idx[d]) for idx in idx_list]
    except PolyfuseError:
        return False
    first = forms[0]
    if any(f != first for f in forms[1:]):
        return False
    if not first.get(v):
        return False
    atoms_vars = variables({k: c for k, c in first.items() if not isinstance(k, str)})
    plain_vars = {k for k in first if isinstance(k, str)}
    return not ((plain_vars | atoms_vars) & inner) and v not in atoms_vars


def _vector_depth(s: Stmt, vectorized: set[int], depth: int = 0) -> int:
    if isinstance(s, Loop):
        return _vector_depth(s.body, vectorized, depth + (id(s) in vectorized))
    if isinstance(s, Seq):
        return max((_vector_depth(c, vectorized, depth) for c in s.stmts), default=depth)
    return depth
