"""The IR <-> sympy boundary: modelling of casts and constants, clean IR on the way back,
and round trips that evaluate equal under the NumPy interpreter."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import sympy

from polyfuse.ir import (
    INF, BinOp, Call, Cast, Const, Expr, ProgramBuilder, Select, Var, cast, exp, f16, f32, interpret, log, maximum,
    minimum, power, select, sigmoid, sqrt, tanh,
)
from polyfuse.ir.dtypes import fp8e4m3
from polyfuse.ir.expr import call
from polyfuse.ir.stmt import Tensor
from polyfuse.ir.visit import walk_expr
from polyfuse.symbolic import ROUNDING, SymbolicError, SymbolTable, evaluate, from_sympy, to_sympy

N = Var("N")
X = Tensor("x", (N, N), f32)
Y = Tensor("y", (N,), f32)
H = Tensor("h", (N,), f16)
i, j = Var("i"), Var("j")


def ops(e: Expr) -> set[str]:
    """Operators and functions used in an IR expression."""
    out: set[str] = set()
    for n in walk_expr(e):
        if isinstance(n, BinOp):
            out.add(n.op)
        elif isinstance(n, Call):
            out.add(n.fn)
        elif isinstance(n, Select):
            out.add("select")
    return out


# ------------------------------------------------------------------ IR -> sympy

def test_loads_and_vars_become_named_symbols_with_a_mapping() -> None:
    s, table = to_sympy(X[i, j] + X[i, 0] * Y[i] + cast(f32, j))
    names = {str(sym): leaf for sym, leaf in table.mapping.items()}
    assert names["x"] == X[i, j] and names["x_1"] == X[i, 0] and names["y"] == Y[i] and names["j"] == j
    x = table.lookup(X[i, j])
    assert x is not None and x.is_real
    jj = table.lookup(j)
    assert jj is not None and jj.is_integer and jj.is_nonnegative  # IR integer variables are >= 0
    assert s.free_symbols == set(table.mapping)


def test_functions_map_to_sympy() -> None:
    s, table = to_sympy(exp(Y[i]) + log(Y[i]) + sqrt(Y[i]) + tanh(Y[i]) + abs(Y[i]) - Y[i]
                        + maximum(Y[i], 1.0) + minimum(Y[i], 2.0) + sigmoid(Y[i]) + power(Y[i], 3.0))
    y = table.lookup(Y[i])
    expected = (sympy.exp(y) + sympy.log(y) + sympy.sqrt(y) + sympy.tanh(y) + sympy.Abs(y) - y + sympy.Max(y, 1)
                + sympy.Min(y, 2) + 1 / (1 + sympy.exp(-y)) + y**3)
    assert sympy.simplify(s - expected) == 0


def test_select_becomes_piecewise_and_comparisons_relations() -> None:
    s, table = to_sympy(select(j > i, -INF, X[i, j]))
    x, ii, jj = (table.lookup(e) for e in (X[i, j], i, j))
    assert s == sympy.Piecewise((-sympy.oo, jj > ii), (x, True))


def test_constants_are_exact_in_their_dtype() -> None:
    s, _ = to_sympy(Y[i] * 1e-5 + 448.0)
    assert sympy.Rational(1, 100000) in s.atoms(sympy.Rational) and sympy.Integer(448) in s.atoms(sympy.Integer)
    s16, _ = to_sympy(cast(f16, 0.1))  # the f16 constant holds 0.0999755859375, not 0.1
    assert s16 == sympy.Rational(float(np.float16(0.1)))


def test_widening_and_f32_casts_are_transparent() -> None:
    s, table = to_sympy(cast(f32, H[i]) * cast(f32, i))
    assert s == table.lookup(H[i]) * table.lookup(i)


@pytest.mark.parametrize("narrow", [f16, fp8e4m3])
def test_narrowing_cast_becomes_rounding_function(narrow) -> None:
    s, table = to_sympy(cast(f32, cast(narrow, Y[i] * 448.0)))
    assert s == ROUNDING[narrow.name](448 * table.lookup(Y[i]))
    assert str(s).startswith(f"round_{narrow.name}(")


def test_fp8_to_f16_is_exact() -> None:
    fp8 = Tensor("q", (N,), fp8e4m3)
    s, table = to_sympy(cast(f16, fp8[i]))
    assert s == table.lookup(fp8[i])


def test_a_bound_subexpression_is_abstracted() -> None:
    table = SymbolTable()
    mask = select(j > i, -INF, X[i, j])
    c = table.bind(mask, "c", real=True)
    s, _ = to_sympy(exp(mask - Y[i]), table)
    assert s == sympy.exp(c - table.lookup(Y[i]))


def test_nan_constant_is_refused_by_name() -> None:
    with pytest.raises(SymbolicError, match="NaN"):
        to_sympy(Y[i] + float("nan"))


# ------------------------------------------------------------------ sympy -> IR

def test_back_conversion_is_clean_ir() -> None:
    t, m, m2 = sympy.symbols("t m m'", real=True)
    acc, old, new = Tensor("acc", (N,), f32), Tensor("m0", (N,), f32), Tensor("m1", (N,), f32)
    mapping = {t: acc[i], m: old[i], m2: new[i]}
    e = from_sympy(t * m**2 / m2**2, mapping)
    assert "pow" not in ops(e) and "/" in ops(e)  # squares as products
    # m²/m'² as (m/m')²: the quotient of two squares overflows f32 from |m| ~ 1e19 on
    assert str(e) == "acc[i] * (m0[i] / m1[i] * (m0[i] / m1[i]))"
    assert str(from_sympy(t * sympy.exp(m - m2), mapping)) == "acc[i] * exp(m0[i] - m1[i])"
    assert ops(from_sympy(sympy.sqrt(m) / sympy.sqrt(m2), mapping)) == {"sqrt", "/"}
    assert ops(from_sympy(1 / (1 + sympy.exp(-m)), mapping)) == {"sigmoid"}
    assert ops(from_sympy(sympy.Max(m, 1) + sympy.Min(m2, 0), mapping)) == {"max", "min", "+"}
    assert ops(from_sympy(sympy.Piecewise((m, m > m2), (m2, True)), mapping)) == {"select", ">"}
    assert ops(from_sympy(m**sympy.Rational(7, 3), mapping)) == {"pow"}


def test_outer_symbol_multiplies_last() -> None:
    # A repair h = t·r/r' with t kept outermost: the factor r/r' reads the producers only (one value per
    # row of a tile), and t is never divided; without it sympy's order pairs t with the denominator.
    t, r, r2 = sympy.symbols("t r r'", real=True)
    acc, old, new = Tensor("acc", (N,), f32), Tensor("m0", (N,), f32), Tensor("m1", (N,), f32)
    mapping = {t: acc[i], r: old[i], r2: new[i]}
    assert str(from_sympy(t * r / r2, mapping, outer=t)) == "m0[i] / m1[i] * acc[i]"
    assert str(from_sympy(-2 * t * sympy.exp(r - r2), mapping, outer=t)) == "-(2.0 * exp(m0[i] - m1[i])) * acc[i]"
    assert str(from_sympy(t + r, mapping, outer=t)) == str(from_sympy(t + r, mapping))  # not a product


def test_a_common_factor_of_a_floating_sum_is_taken_out_again() -> None:
    # sympy turns 2·(m − m') into 2·m − 2·m', which rounds at |2·m| instead of at |m − m'|: a repair's rescale
    # exp(2·(m_old − m)) of values near 1e4 would lose 1e-3 of its argument.  A factor c >= 1 comes out again;
    # one below 1 stays distributed (m − m' could overflow where m/2 − m'/2 does not); integers are left alone.
    m, m2 = sympy.symbols("m m'", real=True)
    old, new = Tensor("m0", (N,), f32), Tensor("m1", (N,), f32)
    mapping = {m: old[i], m2: new[i]}
    assert str(from_sympy(sympy.exp(2 * (m - m2)), mapping)) == "exp(2.0 * (m0[i] - m1[i]))"
    assert str(from_sympy(sympy.Rational(3, 2) * (m - m2) + 3, mapping)) == "1.5 * (m0[i] - m1[i] + 2.0)"
    assert str(from_sympy((m - m2) / 2, mapping)) == "m0[i] / 2.0 - m1[i] / 2.0"
    s, table = to_sympy(i * 2 + j * 4)
    assert "*" in str(from_sympy(s, table.mapping)) and "(" not in str(from_sympy(s, table.mapping))


def test_an_exponential_takes_a_factor_below_one_out_of_a_difference() -> None:
    # exp(0.3·m − 0.3·m') rounds at |0.3·m|; exp(0.3·(m − m')) at |m − m'|, and where m − m' overflows the
    # exponential is inf or 0 either way (|0.3·(m − m')| >= 0.3·MAX).  Only a difference of two terms (three
    # could make a NaN by two overflows of opposite signs), only inside exp / exp2.
    m, m2, d = sympy.symbols("m m' d", real=True)
    old, new, other = Tensor("m0", (N,), f32), Tensor("m1", (N,), f32), Tensor("d", (N,), f32)
    mapping = {m: old[i], m2: new[i], d: other[i]}
    tenth = sympy.Rational(3, 10)
    assert str(from_sympy(sympy.exp(tenth * (m - m2)), mapping)) == "exp(0.30000001192092896 * (m0[i] - m1[i]))"
    assert str(from_sympy(2 ** (tenth * (m - m2)), mapping)) == "exp2(0.30000001192092896 * (m0[i] - m1[i]))"
    assert "(m0[i] - m1[i])" not in str(from_sympy(sympy.exp(tenth * (m - m2 + d)), mapping))
    assert "(m0[i] - m1[i])" not in str(from_sympy(tenth * (m - m2), mapping))


def test_back_conversion_casts_leaves_to_the_target_dtype() -> None:
    h = sympy.Symbol("h", real=True)
    e = from_sympy(2 * h, {h: H[i]}, f32)
    assert e.dtype == f32 and Cast(f32, H[i]) in list(walk_expr(e))


def test_rational_constants_come_back_correctly_rounded() -> None:
    y = sympy.Symbol("y", real=True)
    e = from_sympy(y + sympy.Rational(1, 100000), {y: Y[i]})
    assert isinstance(e, BinOp) and isinstance(e.b, Const) and e.b.value == float(np.float32(1e-5))


def test_rounding_function_comes_back_as_casts() -> None:
    y = sympy.Symbol("y", real=True)
    e = from_sympy(ROUNDING["fp8e4m3"](y), {y: Y[i]})
    assert e == Cast(f32, Cast(fp8e4m3, Y[i]))


@pytest.mark.parametrize("expr, why", [
    (sympy.Symbol("z", real=True), "symbol z has no IR expression"),
    (sympy.sin(sympy.Symbol("y", real=True)), "sin is not supported"),
    (sympy.Piecewise((1, sympy.Symbol("y", real=True) > 0)), "last case is not 'otherwise'"),
    (sympy.I * sympy.Symbol("y", real=True), "not a real number"),
])
def test_non_convertible_sympy_is_refused_naming_the_expression(expr: sympy.Expr, why: str) -> None:
    with pytest.raises(SymbolicError, match=why) as err:
        from_sympy(expr, {sympy.Symbol("y", real=True): Y[i]})
    assert str(expr) in str(err.value)


def test_integer_index_expressions_stay_integer() -> None:
    for e in (i // 2 + j % 3, (i + j) // 4, (i + 1) * 4 - j):
        s, table = to_sympy(e)
        back = from_sympy(s, table.mapping)
        assert back.dtype == i.dtype and "cast" not in str(back), str(back)
        for a, b in ((0, 0), (5, 7), (11, 2)):
            env = {table.lookup(i): np.asarray(a), table.lookup(j): np.asarray(b)}
            assert int(evaluate(s, env)) == eval(str(e), {}, {"i": a, "j": b})


def test_evaluate_matches_numpy_and_rounds_for_real() -> None:
    y, z = sympy.symbols("y z", real=True)
    values = {y: np.array([-1.5, 0.3, 2.0]), z: np.array([0.5, 0.1, 3.0])}
    got = evaluate(sympy.Piecewise((sympy.exp(y - z), y > 0), (sympy.Max(y, -1) / z, True)), values)
    expected = np.where(values[y] > 0, np.exp(values[y] - values[z]), np.maximum(values[y], -1) / values[z])
    np.testing.assert_allclose(got, expected, rtol=1e-15)
    rounded = evaluate(ROUNDING["fp8e4m3"](448 * y / 3), values)
    np.testing.assert_array_equal(rounded, (448 * values[y] / 3).astype(fp8e4m3.numpy).astype(np.float64))


# ------------------------------------------------------------------ round trips

Builder = Callable[[Expr, Expr, Var], Expr]

ROUND_TRIPS: dict[str, Builder] = {
    "softmax term": lambda x, y, k: exp(x - y) * 0.5,
    "rms": lambda x, y, k: x / sqrt(y * y / 4.0 + 1e-5),
    "max/min": lambda x, y, k: maximum(x, y) - minimum(x, 0.0) * 3.0,
    "mask": lambda x, y, k: select(k > 1, -INF, x) + y,
    "tanh/sigmoid": lambda x, y, k: tanh(x) * 50.0 + sigmoid(y),
    "cube": lambda x, y, k: power(abs(x) + 1.0, 3.0) / (y * y + 1.0),
    "log2/exp2": lambda x, y, k: call("log2", abs(y) + 1.0) + call("exp2", x),
    "index": lambda x, y, k: cast(f32, k) * x - cast(f32, k + 1) * y,
    "fp8 rounding": lambda x, y, k: cast(f32, cast(fp8e4m3, x * 448.0 / (abs(y) + 1.0))) * y,
    "neg": lambda x, y, k: -(x - y) * -(x + y),
}


def _run(build: Builder, convert: bool, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    p = ProgramBuilder("round_trip")
    x, y = p.input("x", (len(xs),), "f32"), p.input("y", (len(xs),), "f32")
    out = p.output("out", (len(xs),), "f32")
    with p.nest("s", k=len(xs)) as (k,):
        value = build(x[k], y[k], k)
        if convert:
            s, table = to_sympy(value)
            value = from_sympy(s, table.mapping, f32)
        out[k] = value
    return interpret(p.build(), {"x": xs, "y": ys})["out"]


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_round_trip_evaluates_equal(name: str) -> None:
    rng = np.random.default_rng(1)
    xs, ys = rng.uniform(-3, 3, 16).astype(np.float32), rng.uniform(-3, 3, 16).astype(np.float32)
    direct = _run(ROUND_TRIPS[name], False, xs, ys)
    again = _run(ROUND_TRIPS[name], True, xs, ys)
    np.testing.assert_allclose(again, direct, rtol=2e-6, atol=1e-6)
