"""The one boundary between IR expressions and sympy.

Everything that turns an IR :class:`~polyfuse.ir.expr.Expr` into a sympy
expression, or a sympy expression back into IR, lives here, so the rest of the
compiler never sees sympy's classes and the modelling decisions below are made
once:

* Loads and variables become symbols, recorded in a :class:`SymbolTable` (the
  table also accepts whole sub-expressions, which is how the repair solver
  abstracts the ``c`` of ``g(r, c)``).  Float loads are real symbols, integer
  variables (loop, iteration and size variables, all ``>= 0`` in the IR) are
  non-negative integers.
* Arithmetic is modelled over the reals whatever the node's dtype.
* A cast to f32 or f64, or any cast that cannot lose information (fp8 -> f16,
  int -> float), is transparent.  Why that is exact enough: every operation of
  the program rounds to its working type anyway, and the repair is itself
  evaluated in f32, so a rounding to f32 is the same unit error as one more
  ``+``.  A cast that *narrows* to f16, bf16 or fp8e4m3 is different: it is a
  deliberate quantisation whose error is orders of magnitude larger and which
  cannot be undone, so it becomes the uninterpreted, real-valued function
  ``round_f16`` / ``round_bf16`` / ``round_fp8e4m3`` (float -> int casts become
  ``to_i32`` / ``to_i64``).  Nothing can be solved through them.
* Integer values stay below 2**24, so int -> f32 is exact for them.

The way back (:func:`from_sympy`) produces plain IR: ``exp``, ``log``,
``sqrt``, small integer powers as multiplications, quotients as one division,
``max``/``min``, ``select``; floating arithmetic in a target dtype (f32).
:func:`evaluate` computes a sympy expression on NumPy arrays, for checking
symbolic identities on random points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import sympy
from sympy.core.function import AppliedUndef

from polyfuse.errors import PolyfuseError
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var, binop, call, cast, const, select

__all__ = [
    "ROUNDING", "TRUNCATION", "SymbolTable", "SymbolicError", "abbreviate", "default_assumptions", "evaluate",
    "from_sympy", "is_rounding", "rounded_dtype", "to_sympy",
]

Number = int | float | bool
_SMALL = 4096
"""Rational coefficients p/q with p, q up to this stay a division by q (a size, a count)."""


class SymbolicError(PolyfuseError):
    """An expression has no counterpart on the other side of the IR/sympy boundary."""


ROUNDING: dict[str, type[AppliedUndef]] = {
    d.name: sympy.Function(f"round_{d.name}", real=True) for d in (dt.f16, dt.bf16, dt.fp8e4m3)
}
TRUNCATION: dict[str, type[AppliedUndef]] = {
    d.name: sympy.Function(f"to_{d.name}", integer=True) for d in (dt.i32, dt.i64)
}
_ROUNDING_NAMES = {f.__name__: name for name, f in ROUNDING.items()}
_TRUNCATION_NAMES = {f.__name__: name for name, f in TRUNCATION.items()}


def abbreviate(e: object, limit: int = 100) -> str:
    """``str(e)``, or its two ends around an ellipsis when longer than ``limit`` characters: a refusal quotes
    the expression it is about, and a page of sympy output hides the reason."""
    text = str(e)
    if len(text) <= limit:
        return text
    keep = (limit - 24) // 2
    return f"{text[:keep]} … {text[-keep:]} ({len(text)} characters)"


def is_rounding(e: sympy.Basic) -> bool:
    """True for an application of one of the narrowing-rounding functions."""
    return isinstance(e, AppliedUndef) and e.func.__name__ in _ROUNDING_NAMES


def rounded_dtype(e: sympy.Basic) -> str:
    """The dtype name a rounding or truncation application stands for (``fp8e4m3``, ``i32`` …)."""
    name = e.func.__name__
    return _ROUNDING_NAMES.get(name) or _TRUNCATION_NAMES[name]


class SymbolTable:
    """IR sub-expressions <-> sympy symbols.

    Loads and variables are entered on first sight, named after their tensor or
    variable (``x``, then ``x_1`` for a second index tuple of ``x``).  A caller may
    :meth:`bind` any sub-expression first; conversion then stops there and uses
    the symbol, which is how the repair solver abstracts ``c``.
    """

    def __init__(self, *, reserved: Iterable[str] = (), assume: Mapping[Expr, Mapping[str, bool]] | None = None):
        self._by_expr: dict[Expr, sympy.Symbol] = {}
        self._by_symbol: dict[sympy.Symbol, Expr] = {}
        self._names: set[str] = set(reserved)
        self._assume = dict(assume or {})

    def fresh_name(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        return name

    def bind(self, e: Expr, base: str, **assumptions: bool) -> sympy.Symbol:
        """The symbol for ``e``, created (with a fresh name from ``base``) if needed."""
        found = self._by_expr.get(e)
        if found is not None:
            return found
        merged = {**assumptions, **self._assume.get(e, {})}
        sym = sympy.Symbol(self.fresh_name(base), **merged)
        self._names.add(sym.name)
        self._by_expr[e] = sym
        self._by_symbol[sym] = e
        return sym

    def force(self, e: Expr, sym: sympy.Symbol) -> None:
        """Make ``e`` convert to the existing symbol ``sym`` (two IR values known to be one)."""
        self._by_expr[e] = sym
        self._by_symbol.setdefault(sym, e)
        self._names.add(sym.name)

    def lookup(self, e: Expr) -> sympy.Symbol | None:
        return self._by_expr.get(e)

    def leaf(self, sym: sympy.Symbol) -> Expr:
        return self._by_symbol[sym]

    @property
    def mapping(self) -> dict[sympy.Symbol, Expr]:
        """Symbol -> the IR expression it stands for."""
        return dict(self._by_symbol)

    def symbol_for_leaf(self, e: Load | Var) -> sympy.Symbol:
        base = e.tensor.name if isinstance(e, Load) else e.name
        return self.bind(e, base, **default_assumptions(e.dtype))


def default_assumptions(d: DType) -> dict[str, bool]:
    """What the IR guarantees about a value of dtype ``d`` (floats: real; ints: >= 0 integers)."""
    if d.is_float:
        return {"real": True}
    if d.is_int:
        return {"integer": True, "nonnegative": True}
    return {}


# ------------------------------------------------------------------ IR -> sympy

def to_sympy(e: Expr, table: SymbolTable | None = None) -> tuple[sympy.Basic, SymbolTable]:
    """Convert ``e``; returns the sympy expression and the table of its symbols."""
    table = SymbolTable() if table is None else table
    try:
        return _to_sympy(e, table), table
    except (ValueError, TypeError, ArithmeticError) as err:  # sympy refusing a value (log(-1) = I·pi in a Min …)
        raise SymbolicError(f"cannot express {e} in sympy's real arithmetic: {err}") from None


_RELATIONS = {"<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge, "==": sympy.Eq, "!=": sympy.Ne}


def _to_sympy(e: Expr, table: SymbolTable) -> sympy.Basic:
    bound = table.lookup(e)
    if bound is not None:
        return bound
    if isinstance(e, (Load, Var)):
        return table.symbol_for_leaf(e)
    if isinstance(e, Const):
        return _number(e)
    if isinstance(e, BinOp):
        return _binop(e.op, _to_sympy(e.a, table), _to_sympy(e.b, table), e)
    if isinstance(e, Call):
        return _call(e.fn, _to_sympy(e.args[0], table), e)
    if isinstance(e, Select):
        cond = _to_sympy(e.cond, table)
        return sympy.Piecewise((_to_sympy(e.true_value, table), cond), (_to_sympy(e.false_value, table), True))
    if isinstance(e, Cast):
        return _cast(e.type, e.value.dtype, _to_sympy(e.value, table))
    raise SymbolicError(f"cannot express {type(e).__name__} node {e} in sympy")


def _number(c: Const) -> sympy.Basic:
    """An exact sympy number for a constant, holding the value its dtype actually stores."""
    d, v = c.dtype, c.value
    if d.is_bool:
        return sympy.true if v else sympy.false
    if d.is_int:
        return sympy.Integer(int(v))
    if math.isnan(v):
        raise SymbolicError(f"constant {c} is NaN, which has no symbolic meaning")
    if math.isinf(v):
        return sympy.oo if v > 0 else -sympy.oo
    stored = np.asarray(v, dtype=d.numpy)
    if float(stored).is_integer():
        return sympy.Integer(int(float(stored)))
    # f32: the shortest decimal that rounds to the stored f32 reads well (1e-05) and
    # converts back to the same f32; narrower types keep their exact stored value.
    text = str(np.float32(stored)) if d == dt.f32 else repr(float(stored))
    return sympy.Rational(text)


def _binop(op: str, a: sympy.Basic, b: sympy.Basic, e: Expr) -> sympy.Basic:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    if op == "//":
        return sympy.floor(a / b)
    if op == "%":
        return sympy.Mod(a, b)
    if op == "max":
        return sympy.Max(a, b)
    if op == "min":
        return sympy.Min(a, b)
    if op == "pow":
        return a**b
    if op in _RELATIONS:
        return _RELATIONS[op](a, b)
    if op == "and":
        return sympy.And(a, b)
    if op == "or":
        return sympy.Or(a, b)
    raise SymbolicError(f"operator {op!r} of {e} has no sympy counterpart")


def _call(fn: str, x: sympy.Basic, e: Expr) -> sympy.Basic:
    simple = {"exp": sympy.exp, "log": sympy.log, "sqrt": sympy.sqrt, "tanh": sympy.tanh, "abs": sympy.Abs,
              "floor": sympy.floor, "ceil": sympy.ceiling, "not": sympy.Not}
    if fn in simple:
        return simple[fn](x)
    if fn == "neg":
        return -x
    if fn == "exp2":
        return sympy.Integer(2) ** x
    if fn == "log2":
        return sympy.log(x, 2)
    if fn == "sigmoid":
        return 1 / (1 + sympy.exp(-x))
    raise SymbolicError(f"function {fn!r} in {e} has no sympy counterpart")


def _exact_cast(src: DType, to: DType) -> bool:
    """Casts treated as exact: to f32/f64 (see the module docstring) and fp8 -> f16/bf16."""
    return to.bits >= 32 or (src == dt.fp8e4m3 and to in (dt.f16, dt.bf16))


def _cast(to: DType, src: DType, x: sympy.Basic) -> sympy.Basic:
    if to == src:
        return x
    if src.is_bool and not to.is_bool:
        return sympy.Piecewise((1, x), (0, True))
    if to.is_bool:
        return sympy.Ne(x, 0)
    if to.is_float:
        return x if src.is_int or _exact_cast(src, to) else ROUNDING[to.name](x)
    return x if src.is_int else TRUNCATION[to.name](x)


# ------------------------------------------------------------------ sympy -> IR

def from_sympy(s: sympy.Basic, mapping: Mapping[sympy.Symbol, Expr], dtype: DType | str = dt.f32, *,
               outer: sympy.Symbol | None = None) -> Expr:
    """Build IR for ``s``; ``mapping`` gives each free symbol's IR expression.

    Floating arithmetic happens in ``dtype``: float leaves of another dtype are
    cast to it, numbers become constants of it.  An all-integer expression stays
    integer and a condition stays boolean.  A product with the symbol ``outer`` as
    a factor multiplies the other factors first and ``outer`` last: a repair
    ``h = t·r/r'`` becomes ``(r/r')·t``, whose factor reads only the producers
    (one value per row of a tile, computed once) and never divides ``t`` itself.
    """
    out = _FromSympy(mapping, dt.dtype(dtype), outer).convert(s)
    return out if isinstance(out, Expr) else const(out, dtype if not isinstance(out, bool) else dt.bool_)


class _FromSympy:
    def __init__(self, mapping: Mapping[sympy.Symbol, Expr], dtype: DType, outer: sympy.Symbol | None = None):
        self.mapping, self.dtype, self.outer = mapping, dtype, outer

    def fail(self, s: sympy.Basic, why: str) -> SymbolicError:
        return SymbolicError(f"cannot turn the sympy expression {s} into IR: {why}")

    def expr(self, v: Expr | Number) -> Expr:
        """A Python number as a constant of the target dtype (booleans stay boolean)."""
        if isinstance(v, Expr):
            return v
        return const(v, dt.bool_ if isinstance(v, bool) else self.dtype)

    def floating(self, v: Expr | Number) -> Expr:
        e = self.expr(v)
        return cast(self.dtype, e) if e.dtype.is_int else e

    def convert(self, s: sympy.Basic) -> Expr | Number:
        if isinstance(s, sympy.logic.boolalg.BooleanAtom):
            return bool(s)
        if isinstance(s, AppliedUndef):
            return self.undefined(s)
        if isinstance(s, sympy.Symbol):
            return self.symbol(s)
        if getattr(s, "is_number", False):
            return self.number(s)
        method = getattr(self, "do_" + type(s).__name__, None)
        if method is not None:
            return method(s)
        if isinstance(s, sympy.core.relational.Relational):
            return self.relation(s)
        raise self.fail(s, f"{type(s).__name__} is not supported")

    def symbol(self, s: sympy.Symbol) -> Expr:
        if s not in self.mapping:
            known = ", ".join(sorted(str(k) for k in self.mapping)) or "(none)"
            raise self.fail(s, f"symbol {s} has no IR expression; mapped symbols: {known}")
        e = self.mapping[s]
        return cast(self.dtype, e) if e.dtype.is_float and e.dtype != self.dtype else e

    def number(self, s: sympy.Basic) -> Number:
        if s.is_Integer:
            return int(s)
        if s in (sympy.oo, -sympy.oo):
            return math.inf if s == sympy.oo else -math.inf
        if s.is_Rational:
            return float(s)  # correctly rounded: 1/100000 -> 1e-05
        value = complex(s.evalf(30))
        if value.imag != 0 or math.isnan(value.real):
            raise self.fail(s, "it is not a real number")
        return value.real

    def undefined(self, s: AppliedUndef) -> Expr:
        name = s.func.__name__
        arg = self.convert(s.args[0])
        if name in _ROUNDING_NAMES:
            narrow = dt.dtype(_ROUNDING_NAMES[name])
            return cast(self.dtype, Cast(narrow, self.floating(arg)))
        if name in _TRUNCATION_NAMES:
            return cast(_TRUNCATION_NAMES[name], self.expr(arg))
        raise self.fail(s, f"unknown function {name}")

    # -- arithmetic ---------------------------------------------------------
    def do_Add(self, s: sympy.Add) -> Expr | Number:
        # sympy distributes a number over a sum (2·(a − b) is 2·a − 2·b); in floating point that is worse:
        # 2·a − 2·b rounds at |2·a| and |2·b| where 2·(a − b) rounds at |a − b| — a repair's rescale
        # exp(2·m_old − 2·m) of values near 1e4 would lose 1e-3 of its argument.  A common factor c >= 1 of
        # a floating sum is taken out again (|a − b| <= |c·(a − b)|: nothing overflows that did not).
        factored = self.factored(s, lambda c, _rest: c > 1)
        if factored is not None:
            return factored
        numbers = [a for a in s.args if a.is_number]
        terms = [a for a in s.as_ordered_terms() if not a.is_number]
        plus = [a for a in terms if not a.could_extract_minus_sign()]
        minus = [-a for a in terms if a.could_extract_minus_sign()]
        out: Expr | Number = self.convert(plus[0]) if plus else call("neg", self.expr(self.convert(minus.pop(0))))
        for a in plus[1:]:
            out = binop("+", out, self.convert(a))
        for a in minus:
            out = binop("-", out, self.convert(a))
        total = self.number(sympy.Add(*numbers)) if numbers else 0
        if total > 0:
            out = binop("+", out, total)
        elif total < 0:
            out = binop("-", out, -total)
        return out

    def do_Mul(self, s: sympy.Mul) -> Expr | Number:
        if self.outer is not None and self.outer in sympy.Mul.make_args(s):
            factor = self.floating(self.expr(self.convert(s / self.outer)))
            return binop("*", factor, self.floating(self.symbol(self.outer)))
        coeff, rest = s.as_coeff_Mul()
        factors = [f for f in sympy.Mul.make_args(rest) if not f.is_number]
        coeff = coeff * sympy.Mul(*[f for f in sympy.Mul.make_args(rest) if f.is_number])
        if not coeff.is_extended_real:
            raise self.fail(s, f"its coefficient {coeff} is not a real number")
        negative = bool(coeff < 0)
        coeff = -coeff if negative else coeff
        num: list[Expr | Number] = [] if coeff == 1 else [self.number(coeff)]
        den: list[Expr | Number] = []
        if coeff.is_Rational and not coeff.is_Integer and coeff.p <= _SMALL and coeff.q <= _SMALL:
            # x/40 stays a division by 40, as a program writes it (0.025·x rounds differently)
            num, den = ([] if coeff.p == 1 else [int(coeff.p)]), [int(coeff.q)]
        ups: list[tuple[sympy.Basic, sympy.Basic]] = []
        downs: list[tuple[sympy.Basic, sympy.Basic]] = []
        for f in factors:
            base, exp_ = f.as_base_exp()
            if exp_.is_number and exp_.is_negative:
                sig = self.sigmoid_of(base) if exp_ == -1 else None
                if sig is not None:
                    num.append(sig)
                else:
                    downs.append((base, -exp_))
            else:
                ups.append((base, exp_))
        ratios: list[Expr | Number] = []
        # a^e / b^e is computed as (a/b)^e: the quotient of two large (or tiny) powers
        # overflows (or underflows) long before the power of their ratio does.
        for base, exp_ in downs:
            match = next((k for k, (b, e) in enumerate(ups) if e == exp_ and exp_.is_number), None)
            if match is None:
                den.append(self.power(base, exp_))
                continue
            top, _ = ups.pop(match)
            ratio = binop("/", self.floating(self.convert(top)), self.floating(self.convert(base)))
            ratios.append(self.power_of(ratio, exp_))
        for base, exp_ in ups:
            num.append(self.convert(sympy.Pow(base, exp_)) if exp_ != 1 else self.convert(base))
        num.extend(ratios)
        out: Expr | Number = num[0] if num else 1.0
        for v in num[1:]:
            out = binop("*", out, v)
        if den:
            d = self.floating(den[0])
            for v in den[1:]:
                d = binop("*", d, v)
            out = binop("/", self.floating(out), d)
        return call("neg", self.expr(out)) if negative else out

    def do_Pow(self, s: sympy.Pow) -> Expr | Number:
        base, exp_ = s.as_base_exp()
        if exp_.is_number and exp_.is_negative:
            sig = self.sigmoid_of(base) if exp_ == -1 else None
            return sig if sig is not None else binop("/", 1.0, self.floating(self.power(base, -exp_)))
        return self.power(base, exp_)

    def power(self, base: sympy.Basic, exp_: sympy.Basic) -> Expr | Number:
        """``base ** exp_`` for exp_ > 0: small integers as products, halves through sqrt."""
        if exp_ == 1:
            return self.convert(base)
        if base == 2 and not exp_.is_number:
            return call("exp2", self.exponent(exp_))
        if exp_.is_Integer and (int(exp_) == 2 or (int(exp_) <= 4 and base.is_Symbol)):
            b = self.convert(base)
            out = b
            for _ in range(int(exp_) - 1):
                out = binop("*", out, b)
            return out
        if exp_.is_Rational and exp_.q == 2 and exp_.p <= 3:
            root = call("sqrt", self.floating(self.convert(base)))
            return root if exp_.p == 1 else binop("*", self.convert(base), root)
        return binop("pow", self.floating(self.convert(base)), self.number(exp_) if exp_.is_number
                     else self.floating(self.convert(exp_)))

    def power_of(self, value: Expr, exp_: sympy.Basic) -> Expr:
        """``value ** exp_`` for an IR value and a positive number exponent."""
        if exp_ == 1:
            return value
        if exp_ == 2:
            return binop("*", value, value)
        if exp_ == sympy.Rational(1, 2):
            return call("sqrt", value)
        return binop("pow", value, self.number(exp_))

    def sigmoid_of(self, base: sympy.Basic) -> Expr | None:
        """``1 / (1 + exp(y))`` is ``sigmoid(-y)``."""
        if isinstance(base, sympy.Add) and len(base.args) == 2 and sympy.S.One in base.args:
            other = base.args[0] if base.args[1] == 1 else base.args[1]
            if isinstance(other, sympy.exp):
                return call("sigmoid", self.floating(self.convert(-other.args[0])))
        return None

    # -- functions ------------------------------------------------------------
    def unary(self, fn: str, s: sympy.Basic) -> Expr:
        return call(fn, self.floating(self.convert(s.args[0])))

    def do_exp(self, s: sympy.Basic) -> Expr:
        return call("exp", self.exponent(s.args[0]))

    def exponent(self, arg: sympy.Basic) -> Expr:
        """An exponential's argument, with a common factor ``c`` below 1 of a difference taken out too (one of
        ``c >= 1`` :meth:`do_Add` takes out anywhere): a repair's rescale ``exp(0.3·(m_old − m))`` printed as
        ``exp(0.3·m_old − 0.3·m)`` rounds at ``|0.3·m|``.  ``c·(a − b)`` overflows only where ``a − b`` does, to
        ±inf of the sign of ``c·a − c·b``, whose magnitude is then at least ``c·MAX >= 2^28`` (for
        ``c >= 2^-100``), where the exponential is inf or 0 either way; a sum of two terms cannot make a NaN
        that ``c·a − c·b`` does not."""
        if isinstance(arg, sympy.Add):
            factored = self.factored(arg, lambda c, rest: sympy.Rational(1, 2 ** 100) <= c < 1 and len(rest.args) == 2)
            if factored is not None:
                return factored
        return self.floating(self.convert(arg))

    def factored(self, s: sympy.Add, accept: Callable[[sympy.Rational, sympy.Add], bool]) -> Expr | None:
        """``c·(s / c)`` with ``c`` the common positive rational factor of ``s``'s terms, where ``s / c`` is a
        floating sum and ``accept(c, s / c)``; else None."""
        content, rest = s.primitive()
        if not (isinstance(rest, sympy.Add) and accept(content, rest)):
            return None
        inner = self.convert(rest)
        return binop("*", self.number(content), inner) if isinstance(inner, Expr) and inner.dtype.is_float else None

    def do_log(self, s: sympy.Basic) -> Expr:
        return self.unary("log", s)

    def do_tanh(self, s: sympy.Basic) -> Expr:
        return self.unary("tanh", s)

    def do_Abs(self, s: sympy.Basic) -> Expr:
        return call("abs", self.expr(self.convert(s.args[0])))

    def do_ceiling(self, s: sympy.Basic) -> Expr:
        return self.unary("ceil", s)

    def do_floor(self, s: sympy.Basic) -> Expr:
        num, den = s.args[0].as_numer_denom()
        if den != 1:
            a, b = self.convert(num), self.convert(den)
            if all(isinstance(v, int) or (isinstance(v, Expr) and v.dtype.is_int) for v in (a, b)) and (
                    isinstance(a, Expr) or isinstance(b, Expr)):
                return binop("//", a, b)
        arg = self.expr(self.convert(s.args[0]))
        return arg if arg.dtype.is_int else call("floor", arg)

    def do_Mod(self, s: sympy.Basic) -> Expr:
        return binop("%", self.expr(self.convert(s.args[0])), self.convert(s.args[1]))

    def extremum(self, op: str, s: sympy.Basic) -> Expr:
        args = sorted((self.convert(a) for a in s.args), key=lambda v: not isinstance(v, Expr))
        out = self.expr(args[0])
        for v in args[1:]:
            out = binop(op, out, v)
        return out

    def do_Max(self, s: sympy.Basic) -> Expr:
        return self.extremum("max", s)

    def do_Min(self, s: sympy.Basic) -> Expr:
        return self.extremum("min", s)

    def do_Piecewise(self, s: sympy.Piecewise) -> Expr | Number:
        *pairs, (last, cond) = s.args
        if cond != sympy.true:
            raise self.fail(s, "its last case is not 'otherwise', so some inputs have no value")
        out = self.convert(last)
        for value, c in reversed(pairs):
            v = self.convert(value)
            if not isinstance(v, Expr) and not isinstance(out, Expr):
                v = self.expr(v)
            out = select(self.expr(self.convert(c)), v, out)
        return out

    # -- logic ----------------------------------------------------------------
    def relation(self, s: sympy.core.relational.Relational) -> Expr:
        ops = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}
        if s.rel_op not in ops:
            raise self.fail(s, f"relation {s.rel_op} is not supported")
        return binop(ops[s.rel_op], self.expr(self.convert(s.lhs)), self.convert(s.rhs))

    def logic(self, op: str, s: sympy.Basic) -> Expr:
        args = [self.expr(self.convert(a)) for a in s.args]
        out = args[0]
        for a in args[1:]:
            out = binop(op, out, a)
        return out

    def do_And(self, s: sympy.Basic) -> Expr:
        return self.logic("and", s)

    def do_Or(self, s: sympy.Basic) -> Expr:
        return self.logic("or", s)

    def do_Not(self, s: sympy.Basic) -> Expr:
        return call("not", self.expr(self.convert(s.args[0])))


# ------------------------------------------------------------------ sympy -> numbers

_NP_UNARY = {sympy.exp: np.exp, sympy.log: np.log, sympy.tanh: np.tanh, sympy.Abs: np.abs, sympy.floor: np.floor,
             sympy.ceiling: np.ceil}
_NP_RELATION = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
                "!=": np.not_equal}


def evaluate(s: sympy.Basic, values: Mapping[sympy.Symbol, np.ndarray]) -> np.ndarray:
    """``s`` evaluated elementwise in float64 on NumPy arrays (one per free symbol).

    Used to check symbolic identities on random points.  Rounding functions round
    for real (through ml_dtypes), so a rounded value is checked as the program
    computes it.  Cheaper than ``sympy.lambdify``, whose first call imports a
    large namespace.
    """
    def ev(e: sympy.Basic) -> np.ndarray:
        if e in values:
            return np.asarray(values[e])
        if isinstance(e, sympy.logic.boolalg.BooleanAtom):
            return np.asarray(bool(e))
        if isinstance(e, AppliedUndef):
            name = e.func.__name__
            if name in _ROUNDING_NAMES:
                narrow = dt.dtype(_ROUNDING_NAMES[name]).numpy
                return ev(e.args[0]).astype(np.float64).astype(narrow).astype(np.float64)
            if name in _TRUNCATION_NAMES:
                return np.trunc(ev(e.args[0]))
        elif getattr(e, "is_number", False):
            try:
                value = complex(float(e)) if e in (sympy.oo, -sympy.oo) else complex(e.evalf(20))
            except TypeError:  # zoo, nan
                return np.asarray(np.nan)
            return np.asarray(value.real if value.imag == 0 else np.nan)
        elif isinstance(e, sympy.Add):
            return sum((ev(a) for a in e.args[1:]), ev(e.args[0]))
        elif isinstance(e, sympy.Mul):
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = out * ev(a)
            return out
        elif isinstance(e, sympy.Pow):
            return np.power(ev(e.base).astype(np.float64), ev(e.exp))
        elif type(e) in _NP_UNARY:
            return _NP_UNARY[type(e)](ev(e.args[0]))
        elif isinstance(e, (sympy.Max, sympy.Min)):
            combine = np.maximum if isinstance(e, sympy.Max) else np.minimum
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = combine(out, ev(a))
            return out
        elif isinstance(e, sympy.Mod):
            return np.mod(ev(e.args[0]), ev(e.args[1]))
        elif isinstance(e, sympy.Piecewise):
            out = np.asarray(np.nan)
            for value, cond in reversed(e.args):
                out = np.where(ev(cond), ev(value), out)
            return out
        elif isinstance(e, sympy.core.relational.Relational) and e.rel_op in _NP_RELATION:
            return _NP_RELATION[e.rel_op](ev(e.lhs), ev(e.rhs))
        elif isinstance(e, (sympy.And, sympy.Or)):
            combine = np.logical_and if isinstance(e, sympy.And) else np.logical_or
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = combine(out, ev(a))
            return out
        elif isinstance(e, sympy.Not):
            return np.logical_not(ev(e.args[0]))
        raise SymbolicError(f"cannot evaluate {e} numerically: {type(e).__name__} is not supported")

    with np.errstate(all="ignore"):
        return np.asarray(ev(s))
