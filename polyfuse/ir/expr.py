"""Expression nodes of the loop-scalar IR.

Every node is a frozen dataclass; equality is structural.  Operands of a binary
operation always have the same dtype: the operator overloads and helper
functions below insert explicit :class:`Cast` nodes, so the IR never relies on
implicit conversions.  Comparisons ``<, <=, >, >=`` build expressions; use
:func:`eq` / :func:`ne` for ``==`` / ``!=`` because ``==`` is structural equality.
"""

from __future__ import annotations

import math

import numpy as np
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.errors import IRError
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType

if TYPE_CHECKING:
    from polyfuse.ir.stmt import Tensor

ARITH_OPS = ("+", "-", "*", "/", "//", "%", "max", "min", "pow")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("and", "or")
BIN_OPS = ARITH_OPS + COMPARE_OPS + LOGIC_OPS
FLOAT_FUNCS = ("exp", "log", "sqrt", "tanh", "abs", "neg", "floor", "ceil", "exp2", "log2", "sigmoid")
CALL_FUNCS = FLOAT_FUNCS + ("not",)


class Expr:
    """Base class of expression nodes; carries the operator overloads."""

    __slots__ = ()

    @property
    def dtype(self) -> DType:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def __add__(self, other: ExprLike) -> Expr:
        return binop("+", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binop("+", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binop("-", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binop("-", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binop("*", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binop("*", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binop("/", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binop("/", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return binop("//", self, other)

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        return binop("//", other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return binop("%", self, other)

    def __rmod__(self, other: ExprLike) -> Expr:
        return binop("%", other, self)

    def __pow__(self, other: ExprLike) -> Expr:
        return binop("pow", self, other)

    def __rpow__(self, other: ExprLike) -> Expr:
        return binop("pow", other, self)

    def __neg__(self) -> Expr:
        return call("neg", self)

    def __abs__(self) -> Expr:
        return call("abs", self)

    def __lt__(self, other: ExprLike) -> Expr:
        return binop("<", self, other)

    def __le__(self, other: ExprLike) -> Expr:
        return binop("<=", self, other)

    def __gt__(self, other: ExprLike) -> Expr:
        return binop(">", self, other)

    def __ge__(self, other: ExprLike) -> Expr:
        return binop(">=", self, other)

    def __and__(self, other: ExprLike) -> Expr:
        return binop("and", self, other)

    def __or__(self, other: ExprLike) -> Expr:
        return binop("or", self, other)

    def __invert__(self) -> Expr:
        return call("not", self)

    def __bool__(self) -> bool:
        raise IRError(
            f"the truth value of the expression {self} is unknown while building; "
            "use select(cond, a, b) instead of Python's if/and/or"
        )

    def astype(self, dtype: DType | str) -> Expr:
        return cast(dtype, self)

    def __str__(self) -> str:
        from polyfuse.ir.printer import expr_to_str

        return expr_to_str(self)


ExprLike = Expr | int | float | bool


@dataclass(frozen=True, eq=True, repr=False)
class Var(Expr):
    """A loop variable, block iteration variable or size parameter (all integers)."""

    name: str
    type: DType = dt.i32

    @property
    def dtype(self) -> DType:
        return self.type

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


@dataclass(frozen=True, eq=True, repr=False)
class Const(Expr):
    """A literal of a given dtype."""

    value: float | int | bool
    type: DType

    @property
    def dtype(self) -> DType:
        return self.type

    def __repr__(self) -> str:
        return f"Const({self.value!r}, {self.type})"


@dataclass(frozen=True, eq=True, repr=False)
class Load(Expr):
    """Read of ``tensor[indices]``."""

    tensor: Tensor
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    def __repr__(self) -> str:
        return f"Load({self.tensor.name}, {self.indices!r})"


@dataclass(frozen=True, eq=True, repr=False)
class BinOp(Expr):
    """A binary operation; operands share one dtype (see module docstring)."""

    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:
        if self.op in COMPARE_OPS or self.op in LOGIC_OPS:
            return dt.bool_
        return self.a.dtype

    def __repr__(self) -> str:
        return f"BinOp({self.op!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, eq=True, repr=False)
class Call(Expr):
    """A math function (``exp``, ``log``, ``sqrt``, ``tanh``, ``abs``, ``neg``, ``not`` …)."""

    fn: str
    args: tuple[Expr, ...]

    @property
    def dtype(self) -> DType:
        return self.args[0].dtype

    def __repr__(self) -> str:
        return f"Call({self.fn!r}, {self.args!r})"


@dataclass(frozen=True, eq=True, repr=False)
class Select(Expr):
    """``cond ? true_value : false_value``; both values share one dtype."""

    cond: Expr
    true_value: Expr
    false_value: Expr

    @property
    def dtype(self) -> DType:
        return self.true_value.dtype

    def __repr__(self) -> str:
        return f"Select({self.cond!r}, {self.true_value!r}, {self.false_value!r})"


@dataclass(frozen=True, eq=True, repr=False)
class Cast(Expr):
    """Conversion to ``type`` with that type's rounding (round to nearest even)."""

    type: DType
    value: Expr

    @property
    def dtype(self) -> DType:
        return self.type

    def __repr__(self) -> str:
        return f"Cast({self.type}, {self.value!r})"


# ---------------------------------------------------------------- constructors

def const(value: ExprLike, dtype: DType | str | None = None) -> Expr:
    """Wrap a Python number as a :class:`Const` (or return an Expr, cast if asked)."""
    if isinstance(value, Expr):
        return value if dtype is None else cast(dtype, value)
    if dtype is not None:
        d = dt.dtype(dtype)
    elif isinstance(value, bool):
        d = dt.bool_
    elif isinstance(value, int):
        d = dt.i32
    elif isinstance(value, float):
        d = dt.f32
    else:
        raise IRError(f"cannot use {value!r} of type {type(value).__name__} as an expression")
    if d.is_float:
        # keep the value the dtype can hold, so every backend sees the same constant
        value = float(np.asarray(float(value), dtype=d.numpy).astype(np.float64))
    elif d.is_int:
        if isinstance(value, float) and not value.is_integer():
            raise IRError(f"constant {value!r} is not an integer but dtype {d} was asked for")
        value = int(value)
    else:
        value = bool(value)
    return Const(value, d)


def cast(dtype: DType | str, value: ExprLike) -> Expr:
    """Convert ``value`` to ``dtype``; constants are converted in place."""
    d = dt.dtype(dtype)
    if not isinstance(value, Expr):
        return const(value, d)
    if value.dtype == d:
        return value
    if isinstance(value, Const) and not (d.bits < 32 and d.is_float):
        return const(value.value, d)
    return Cast(d, value)


def _unify(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    """Bring two operands to one dtype; Python numbers take the other side's dtype."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        raise IRError(f"an operation on two Python numbers ({a!r}, {b!r}) is not an expression")
    if not isinstance(a, Expr):
        return _literal_for(a, b.dtype), b  # type: ignore[union-attr]
    if not isinstance(b, Expr):
        return a, _literal_for(b, a.dtype)
    if a.dtype == b.dtype:
        return a, b
    target = dt.promote(a.dtype, b.dtype)
    return cast(target, a), cast(target, b)


def _literal_for(value: int | float | bool, other: DType) -> Expr:
    if isinstance(value, float) and not other.is_float:
        return Const(float(value), dt.f32)
    if other.is_bool and not isinstance(value, bool):
        return const(value)
    return const(value, other)


def binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """Build a binary operation with dtype unification."""
    if op not in BIN_OPS:
        raise IRError(f"unknown binary operator {op!r}; known: {', '.join(BIN_OPS)}")
    x, y = _unify(a, b)
    if x.dtype != y.dtype:  # e.g. an f16 Expr with a float literal
        target = dt.promote(x.dtype, y.dtype)
        x, y = cast(target, x), cast(target, y)
    if op in LOGIC_OPS and not x.dtype.is_bool:
        raise IRError(f"operator {op!r} needs boolean operands, got {x.dtype}: {x}")
    if op == "/" and not x.dtype.is_float:
        raise IRError(f"'/' on integers ({x} / {y}) is ambiguous; use '//' for floor division")
    return BinOp(op, x, y)


def call(fn: str, *args: ExprLike) -> Expr:
    """Build a math function call; float functions of integers compute in f32."""
    if fn not in CALL_FUNCS:
        raise IRError(f"unknown function {fn!r}; known: {', '.join(CALL_FUNCS)}")
    if len(args) != 1:
        raise IRError(f"function {fn!r} takes one argument, got {len(args)}")
    x = const(args[0]) if not isinstance(args[0], Expr) else args[0]
    if fn == "not":
        if not x.dtype.is_bool:
            raise IRError(f"'not' needs a boolean operand, got {x.dtype}: {x}")
    elif fn in ("abs", "neg"):
        pass
    elif not x.dtype.is_float:
        x = cast(dt.f32, x)
    return Call(fn, (x,))


def select(cond: ExprLike, true_value: ExprLike, false_value: ExprLike) -> Expr:
    """``cond ? true_value : false_value`` with the two values unified."""
    c = const(cond) if not isinstance(cond, Expr) else cond
    if not c.dtype.is_bool:
        raise IRError(f"select needs a boolean condition, got {c.dtype}: {c}")
    if not isinstance(true_value, Expr) and not isinstance(false_value, Expr):
        true_value = const(true_value)
    t, f = _unify(true_value, false_value)
    return Select(c, t, f)


def eq(a: ExprLike, b: ExprLike) -> Expr:
    """``a == b`` as an expression (``==`` on nodes is structural equality)."""
    return binop("==", a, b)


def ne(a: ExprLike, b: ExprLike) -> Expr:
    """``a != b`` as an expression."""
    return binop("!=", a, b)


def conjuncts(cond: Expr) -> list[Expr]:
    """The operands of a chain of ``and`` (``a & b & c`` -> ``[a, b, c]``); other nodes stand alone."""
    if isinstance(cond, BinOp) and cond.op == "and":
        return conjuncts(cond.a) + conjuncts(cond.b)
    return [cond]


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return binop("max", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return binop("min", a, b)


def exp(x: ExprLike) -> Expr:
    return call("exp", x)


def log(x: ExprLike) -> Expr:
    return call("log", x)


def sqrt(x: ExprLike) -> Expr:
    return call("sqrt", x)


def tanh(x: ExprLike) -> Expr:
    return call("tanh", x)


def sigmoid(x: ExprLike) -> Expr:
    return call("sigmoid", x)


def floor(x: ExprLike) -> Expr:
    return call("floor", x)


def ceil(x: ExprLike) -> Expr:
    return call("ceil", x)


def exp2(x: ExprLike) -> Expr:
    return call("exp2", x)


def log2(x: ExprLike) -> Expr:
    return call("log2", x)


def power(x: ExprLike, y: ExprLike) -> Expr:
    return binop("pow", x, y)


def logical_and(a: ExprLike, b: ExprLike) -> Expr:
    return binop("and", a, b)


def logical_or(a: ExprLike, b: ExprLike) -> Expr:
    return binop("or", a, b)


def logical_not(a: ExprLike) -> Expr:
    return call("not", a)


INF = math.inf
