"""Statement nodes, tensors, reducers and the :class:`Program` of the loop-scalar IR.

A *block* is the unit of computation: a named statement with its own iteration
variables (spatial or reduce) and exactly one store.  Loops only *bind* a
block's iteration variables to affine expressions of the enclosing loop
variables, so a block instance keeps its identity however its loops are later
split, reordered or fused.  A block executes at a loop point iff the bound
values lie inside its iteration domain; this guard is implied, never stored.

The iteration domain is the box of the iteration extents intersected with the
block's predicate ``where`` when it has one: a conjunction (``&``) of
comparisons (``<, <=, >, >=, eq``) of quasi-affine integer expressions of its
iteration variables and the sizes.  Instances where it is false do not exist.
It is what a box cannot say, e.g. the partial results of a reduction over
``j = j0*16 + j1 < 40`` after ``rfactor`` over ``j0`` (``where j0*16 + j1 < 40``).

A reduction block carries its :class:`Reducer` and an ``init`` value: before the
first update (all reduce iterations at 0) the output element is set to ``init``.
A reduction whose ``init`` is None accumulates into the element's current value
(its init was split off into a block of its own by ``decompose_reduction``).
With a ``where``, every spatial point that has an instance must have its first
one (all reduce iterations 0, where ``where`` holds), or its init would never
run; :func:`~polyfuse.ir.validate.validate` checks this.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Iterator

from polyfuse.errors import IRError
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Const, Expr, Load, Var, binop, const

SPATIAL = "spatial"
REDUCE = "reduce"

INPUT = "input"
OUTPUT = "output"
TEMP = "temp"
SIGNS = ("nonnegative", "positive")
ROLES = (INPUT, OUTPUT, TEMP)

GLOBAL = "global"
SHARED = "shared"
LOCAL = "local"
SCOPES = (GLOBAL, SHARED, LOCAL)

SERIAL = "serial"
PARALLEL = "parallel"
UNROLLED = "unrolled"
VECTORIZED = "vectorized"
BOUND = "bound"
LOOP_KINDS = (SERIAL, PARALLEL, UNROLLED, VECTORIZED, BOUND)
THREAD_TAGS = tuple(f"{k}.{a}" for k in ("blockIdx", "threadIdx") for a in "xyz")
WARP_GROUPS = "threadIdx.y"
"""The thread tag of a loop whose iterations run on groups of whole warps of a thread block (a GPU kernel's
block spreads every other statement over all its threads itself): iteration ``y`` runs on group ``y % groups``,
its statements planned for the threads of one group, with shared memory of the group's own."""
WARPS = "warps"
"""Loop annotation ``("warps", n)``: the GPU kernel whose grid holds the loop runs ``n`` warps per block."""


@dataclass(frozen=True)
class Tensor:
    """A named buffer: shape (expressions of size parameters), dtype, role and memory scope.

    ``sign`` ("nonnegative" or "positive") and ``finite`` (no ±inf or NaN) are what the caller
    promises about every value of an input — masses, counts, data without masks.  The repair
    solver may rely on them (a running sum of masses is 0 only while every mass so far is 0; a
    running max of finite data is finite from its first element on); the interpreters and the
    host kernels check them and refuse inputs that break them.
    """

    name: str
    shape: tuple[Expr, ...]
    dtype: DType
    role: str = TEMP
    scope: str = GLOBAL
    sign: str | None = None
    finite: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise IRError(f"tensor name {self.name!r} is not a Python identifier")
        if self.role not in ROLES:
            raise IRError(f"tensor {self.name!r}: role {self.role!r} is not one of {ROLES}")
        if self.scope not in SCOPES:
            raise IRError(f"tensor {self.name!r}: scope {self.scope!r} is not one of {SCOPES}")
        if self.sign is not None and (self.sign not in SIGNS or self.role != INPUT):
            raise IRError(f"tensor {self.name!r}: sign={self.sign!r}; an input may declare sign='nonnegative' or "
                          "sign='positive', other tensors get their signs from the program")
        if self.finite and self.role != INPUT:
            raise IRError(f"tensor {self.name!r}: finite=True is a promise about an input's values; "
                          f"{self.name!r} is a {self.role}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices: object) -> Load:
        from polyfuse.ir.builder import make_load

        return make_load(self, indices)

    def __call__(self, *indices: object) -> Load:
        from polyfuse.ir.builder import make_load

        return make_load(self, indices)

    def __setitem__(self, indices: object, value: object) -> None:
        from polyfuse.ir.builder import record_store

        record_store(self, indices, value)


@dataclass(frozen=True)
class Reducer:
    """An associative (and commutative) combiner with its identity.

    ``combine`` is an expression of the two variables ``lhs`` (the accumulator)
    and ``rhs`` (the new term).
    """

    name: str
    lhs: Var
    rhs: Var
    combine: Expr
    identity: Const

    @property
    def dtype(self) -> DType:
        return self.identity.dtype

    def apply(self, acc: Expr, term: Expr) -> Expr:
        """``acc ⊕ term`` as an expression."""
        from polyfuse.ir.visit import substitute

        return substitute(self.combine, {self.lhs: acc, self.rhs: term})

    def match(self, value: Expr, acc: Expr) -> Expr | None:
        """If ``value`` is ``acc ⊕ term`` (either operand order for builtins), return ``term``."""
        if self.name in BUILTIN_REDUCERS and isinstance(value, BinOp) and value.op == self.combine.op:  # type: ignore[attr-defined]
            if value.a == acc:
                return value.b
            if value.b == acc:
                return value.a
            return None
        from polyfuse.ir.visit import match_pattern

        bound = match_pattern(self.combine, value, fixed={self.lhs: acc}, wildcards=(self.rhs,))
        return None if bound is None else bound[self.rhs]


_BUILTIN_OPS = {"sum": "+", "prod": "*", "max": "max", "min": "min"}
BUILTIN_REDUCERS = tuple(_BUILTIN_OPS)


def builtin_reducer(name: str, dtype: DType | str) -> Reducer:
    """The reducer ``sum``, ``prod``, ``max`` or ``min`` over ``dtype``."""
    d = dt.dtype(dtype)
    if name not in _BUILTIN_OPS:
        raise IRError(f"unknown reducer {name!r}; builtin reducers: {', '.join(BUILTIN_REDUCERS)}")
    identity = {"sum": 0, "prod": 1, "max": dt.lowest(d), "min": dt.highest(d)}[name]
    lhs, rhs = Var("lhs", d), Var("rhs", d)
    return Reducer(name, lhs, rhs, binop(_BUILTIN_OPS[name], lhs, rhs), const(identity, d))


def reducer_for_op(op: str, dtype: DType) -> Reducer | None:
    """The builtin reducer whose combiner is the binary operator ``op``, if any."""
    for name, o in _BUILTIN_OPS.items():
        if o == op:
            return builtin_reducer(name, dtype)
    return None


@dataclass(frozen=True)
class IterVar:
    """A block iteration variable: ``0 <= var < extent``, spatial or reduce."""

    var: Var
    extent: Expr
    kind: str = SPATIAL

    @property
    def is_reduce(self) -> bool:
        return self.kind == REDUCE


@dataclass(frozen=True)
class Store:
    """``tensor[indices] = value`` (indices and value in the block's iteration variables)."""

    tensor: Tensor
    indices: tuple[Expr, ...]
    value: Expr


class Stmt:
    """Base class of statements."""

    __slots__ = ()

    def __str__(self) -> str:
        from polyfuse.ir.printer import stmt_to_str

        return stmt_to_str(self)


@dataclass(frozen=True)
class Block(Stmt):
    """A named computation with one store; see the module docstring."""

    name: str
    iters: tuple[IterVar, ...]
    bindings: tuple[Expr, ...]
    store: Store
    reducer: Reducer | None = None
    init: Expr | None = None
    where: Expr | None = None

    @property
    def is_reduction(self) -> bool:
        return self.reducer is not None

    @property
    def spatial_iters(self) -> tuple[IterVar, ...]:
        return tuple(iv for iv in self.iters if not iv.is_reduce)

    @property
    def reduce_iters(self) -> tuple[IterVar, ...]:
        return tuple(iv for iv in self.iters if iv.is_reduce)

    def binding_of(self, name: str) -> Expr:
        for iv, b in zip(self.iters, self.bindings, strict=True):
            if iv.var.name == name:
                return b
        raise IRError(f"block {self.name!r} has no iteration variable {name!r}")

    def reduce_term(self) -> Expr | None:
        """The term ``g`` of ``X = X ⊕ g``, or None if the store is not in that form."""
        if self.reducer is None:
            return None
        acc = Load(self.store.tensor, self.store.indices)
        return self.reducer.match(self.store.value, acc)

    def origin_where(self) -> Expr | None:
        """``where`` with every reduce iteration at 0, simplified (None when nothing is left).

        A condition on the spatial iterations: the points whose first reduce instance
        exists.  For a reduction with an init (validated), exactly the points that have
        an instance at all, so it is the domain of an init or of a per-element block.
        """
        if self.where is None:
            return None
        from polyfuse.ir.simplify import simplify_condition
        from polyfuse.ir.visit import substitute

        zero = {iv.var.name: Const(0, iv.var.dtype) for iv in self.reduce_iters}
        return simplify_condition(substitute(self.where, zero))

    def replace(self, **changes: object) -> Block:
        return _replace(self, changes)


@dataclass(frozen=True)
class Loop(Stmt):
    """``for var in range(extent)``; ``kind`` says how it runs, ``thread`` its GPU binding."""

    var: Var
    extent: Expr
    body: Stmt
    kind: str = SERIAL
    thread: str | None = None
    annotations: tuple[tuple[str, object], ...] = ()

    def replace(self, **changes: object) -> Loop:
        return _replace(self, changes)


@dataclass(frozen=True)
class Seq(Stmt):
    """Statements executed in order."""

    stmts: tuple[Stmt, ...]

    def replace(self, **changes: object) -> Seq:
        return _replace(self, changes)


@dataclass(frozen=True)
class Program:
    """A whole program: name, size parameters, tensors (inputs, outputs, temps) and body."""

    name: str
    params: tuple[Var, ...]
    tensors: tuple[Tensor, ...]
    body: Stmt

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role == INPUT)

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role == OUTPUT)

    @property
    def temps(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role == TEMP)

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        known = ", ".join(t.name for t in self.tensors)
        raise IRError(f"program {self.name!r} has no tensor {name!r}; tensors: {known}")

    def blocks(self) -> list[Block]:
        """Blocks in program (execution-text) order."""
        return [s for s in walk_stmts(self.body) if isinstance(s, Block)]

    def block(self, name: str) -> Block:
        for b in self.blocks():
            if b.name == name:
                return b
        known = ", ".join(b.name for b in self.blocks())
        raise IRError(f"program {self.name!r} has no block {name!r}; blocks: {known}")

    def replace(self, **changes: object) -> Program:
        return _replace(self, changes)

    def bind(self, **sizes: int) -> Program:
        """Specialise size parameters to integers (unknown names are an error)."""
        from polyfuse.ir.visit import bind_sizes

        return bind_sizes(self, sizes)

    def __str__(self) -> str:
        from polyfuse.ir.printer import print_program

        return print_program(self)


def _replace(node, changes: dict):
    """``dataclasses.replace`` that returns ``node`` itself when nothing changes."""
    if all(getattr(node, k) is v or getattr(node, k) == v for k, v in changes.items()):
        return node
    return replace(node, **changes)


def walk_stmts(stmt: Stmt) -> Iterator[Stmt]:
    """Pre-order traversal of a statement tree."""
    yield stmt
    if isinstance(stmt, Loop):
        yield from walk_stmts(stmt.body)
    elif isinstance(stmt, Seq):
        for s in stmt.stmts:
            yield from walk_stmts(s)
