"""The error-bound interpreter: its values are the interpreter's, and its bounds bound the error.

"Exact" here is exact rational arithmetic (``fractions``) where that is cheap, else the same program in
float64 with its own bound: an f32 result and its f64 twin are both within their bounds of the exact value,
so ``|v32 - v64| <= E32 + E64``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ir_programs import softmax_sum
from polyfuse.ir import (
    INF, ProgramBuilder, eq, exp, interpret, log, maximum, minimum, reduce, select, sqrt, tanh,
)
from polyfuse.ir.errorbound import UNDERFLOW, UNIT_ROUNDOFF, interpret_with_bounds
from polyfuse.transforms import Schedule

U32 = UNIT_ROUNDOFF["f32"]


def _row_program(dtype: str, m: int, term, reducer: str = "sum", init=None, name: str = "row"):
    """``out[0] = ⊕_j term(x[0, j])`` over ``x[1, m]``."""
    p = ProgramBuilder(name)
    x = p.input("x", (1, m), dtype)
    out = p.output("out", (1,), dtype)
    kw = {} if init is None else {"init": init}
    with p.nest("s", i=1, j=reduce(m), **kw) as (i, j):
        t = term(x[i, j])
        out[i] = {"sum": lambda a: a + t, "max": lambda a: maximum(a, t), "min": lambda a: minimum(a, t),
                  "prod": lambda a: a * t}[reducer](out[i])
    return p.build()


def _map_program(dtype: str, n: int, fn):
    """``y[0, j] = fn(x[0, j])`` elementwise."""
    p = ProgramBuilder("map")
    x = p.input("x", (1, n), dtype)
    y = p.output("y", (1, n), dtype)
    with p.nest("s", i=1, j=n) as (i, j):
        y[i, j] = fn(x[i, j])
    return p.build()


def _bounded(program, **inputs):
    return interpret_with_bounds(program, inputs)


# ------------------------------------------------------------------ the values are the interpreter's

@pytest.mark.parametrize("fused", [False, True])
def test_values_are_bit_identical_to_the_interpreter(fused):
    program = softmax_sum(symbolic=False, n=3, m=7)
    if fused:
        sch = Schedule(program)
        sch.rolling_update("s_sum", sch.loop("s_max", "j"))
        program = sch.program
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    x[1, :3] = 0.0
    want = interpret(program, {"inp": x}, return_temps=True)
    got = interpret_with_bounds(program, {"inp": x}, return_temps=True)
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k][0], v)
        assert got[k][1].shape == v.shape and got[k][1].dtype == np.float64


# ------------------------------------------------------------------ sums, exactly

def test_sum_bound_holds_and_is_about_n_u_sum_abs():
    n = 500
    x = np.random.default_rng(1).standard_normal((1, n)).astype(np.float32)
    (v,), (e,) = _bounded(_row_program("f32", n, lambda t: t), x=x)["out"]
    exact = sum(Fraction(float(t)) for t in x[0])
    assert abs(Fraction(float(v)) - exact) <= Fraction(float(e))
    assert e <= n * U32 * float(np.abs(x).sum()) + n * UNDERFLOW["f32"]
    assert e >= U32 * float(np.abs(x).sum())  # at least one rounding of each partial sum's size


def test_cancellation_gives_a_bound_large_next_to_the_result():
    x = np.array([[1e8, 1.0, -1e8]], np.float32)
    (v,), (e,) = _bounded(_row_program("f32", 3, lambda t: t), x=x)["out"]
    assert v == 0.0  # 1e8 + 1 rounds to 1e8 in f32: the 1 is lost
    assert e >= 1.0 >= abs(v - 1.0) - 1e-12  # the bound covers the exact 1


def test_exact_operations_have_no_error():
    x = np.array([[3.0, -1.5, 7.25, 7.25]], np.float32)
    for reducer in ("max", "min"):
        (_,), (e,) = _bounded(_row_program("f32", 4, lambda t: abs(-t), reducer), x=x)["out"]
        assert e == 0.0


# ------------------------------------------------------------------ against exact rationals and f64

TERMS = {
    "exp": lambda t: exp(t), "exp_diff": lambda t: exp(t - 3.0), "log": lambda t: log(abs(t) + 0.5),
    "sqrt": lambda t: sqrt(abs(t) + 1e-3), "tanh": lambda t: tanh(t * 3.0), "div": lambda t: 1.0 / (abs(t) + 0.25),
    "square": lambda t: t ** 2, "cube": lambda t: t ** 3, "inverse": lambda t: (abs(t) + 0.5) ** -1,
    "mixed": lambda t: exp(-(t * t)) / (1.0 + abs(t)),
}


@pytest.mark.parametrize("name", sorted(TERMS))
def test_f32_results_are_within_bounds_of_their_f64_twin(name):
    x64 = np.random.default_rng(2).standard_normal((1, 64)) * 2
    x32 = x64.astype(np.float32)
    for reducer in ("sum", "prod", "max"):
        (v32,), (e32,) = _bounded(_row_program("f32", 64, TERMS[name], reducer), x=x32)["out"]
        (v64,), (e64,) = _bounded(_row_program("f64", 64, TERMS[name], reducer), x=x32.astype(np.float64))["out"]
        assert np.isfinite(e32) and abs(float(v32) - float(v64)) <= e32 + e64, (name, reducer, v32, v64, e32)


_LEAF = st.sampled_from(["x", "x", "c"])
_UNARY = st.sampled_from(["exp", "log", "sqrt", "tanh", "abs", "neg", "square"])
_BINARY = st.sampled_from(["+", "-", "*", "/", "max", "min"])


@st.composite
def _expressions(draw, depth: int = 3):
    if depth == 0 or draw(st.booleans()):
        leaf = draw(_LEAF)
        return "x" if leaf == "x" else draw(st.sampled_from([0.5, 3.0, -2.0, 0.1]))
    if draw(st.booleans()):
        return (draw(_UNARY), draw(_expressions(depth - 1)))
    return (draw(_BINARY), draw(_expressions(depth - 1)), draw(_expressions(depth - 1)))


def _build(tree, x):
    if tree == "x":
        return x
    if isinstance(tree, float):
        return x * 0.0 + tree
    if len(tree) == 2:
        a = _build(tree[1], x)
        return {"exp": exp, "log": log, "sqrt": sqrt, "tanh": tanh, "abs": abs, "neg": lambda v: -v,
                "square": lambda v: v * v}[tree[0]](a)
    a, b = _build(tree[1], x), _build(tree[2], x)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
            "max": lambda: maximum(a, b), "min": lambda: minimum(a, b)}[tree[0]]()


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_expressions(), seed=st.integers(0, 3))
def test_random_expressions_are_within_bounds_of_their_f64_twin(tree, seed):
    x64 = np.random.default_rng(seed).standard_normal((1, 16)) * 3
    x32 = x64.astype(np.float32)
    v32, e32 = _bounded(_map_program("f32", 16, lambda t: _build(tree, t)), x=x32)["y"]
    v64, e64 = _bounded(_map_program("f64", 16, lambda t: _build(tree, t)), x=x32.astype(np.float64))["y"]
    both = np.isfinite(v32) & np.isfinite(v64)
    with np.errstate(invalid="ignore"):
        ok = np.abs(v32.astype(np.float64) - v64) <= e32 + e64
    assert np.all(ok | ~both | np.isinf(e32)), (tree, v32[~ok], v64[~ok], e32[~ok])
    # an f32 result that overflowed where the f64 one is finite carries an infinite bound
    assert np.all(np.isinf(e32) | ~(np.isfinite(v64) & ~np.isfinite(v32)))


# ------------------------------------------------------------------ singular operations and guards

LOST = np.array([[1.0, 2.0 ** -25, -1.0]], np.float32)
"""Sums to 0 in f32 (1 + 2^-25 rounds to 1), to 2^-25 exactly."""


def _of_sum(finish, term=lambda t: t):
    """``y = finish(s)`` with ``s = Σ_j term(x[0, j])`` over ``x[1, 3]`` (f32)."""
    p = ProgramBuilder("of_sum")
    x = p.input("x", (1, 3), "f32")
    s = p.temp("s", (1,), "f32")
    y = p.output("y", (1,), "f32")
    with p.nest("s_sum", i=1, j=reduce(3)) as (i, j):
        s[i] = s[i] + term(x[i, j])
    with p.nest("s_finish", i=1) as (i,):
        y[i] = finish(s[i])
    return p.build()


def test_the_bound_of_a_sum_covers_a_lost_term():
    (v,), (e,) = _bounded(_of_sum(lambda s: s), x=LOST)["y"]
    assert v == 0.0 and e >= 2.0 ** -25


def test_a_value_minus_itself_is_exactly_zero():
    # the same error on both sides (a fuzzer find: Σ (r - r) over a running product looked inaccurate)
    (v,), (e,) = _bounded(_of_sum(lambda s: s - s), x=LOST)["y"]
    assert v == 0.0 and e == 0.0


def test_division_by_a_value_that_may_be_zero_is_unbounded():
    (v,), (e,) = _bounded(_of_sum(lambda s: 1.0 / (s + 2.0 ** -30)), x=LOST)["y"]
    assert v == 2.0 ** 30 and np.isinf(e)  # the exact value is 1 / (2^-25 + 2^-30)


def test_log_of_a_value_that_may_be_non_positive_is_unbounded():
    (_,), (e,) = _bounded(_of_sum(lambda s: log(s + 2.0 ** -30)), x=LOST)["y"]
    assert np.isinf(e)


def test_a_select_on_an_uncertain_condition_covers_the_other_branch():
    guard = lambda s: select(eq(s, 0.0), 5.0 + s, 7.0 + s)  # noqa: E731
    (v,), (e,) = _bounded(_of_sum(guard), x=LOST)["y"]
    assert v == 5.0 and e >= 2.0  # the exact value is 7 + 2^-25
    (v,), (e,) = _bounded(_of_sum(guard, term=lambda t: t * 0.0), x=LOST)["y"]
    assert v == 5.0 and e <= 8 * U32  # 0·x is exactly 0: the condition is certain


def test_a_surrogate_is_a_choice_the_exact_program_makes_too():
    # select(s == 0, τ, s): the reference point a repair rescales from (fuzz seed 237000: a rolled chain over a max
    # of squares that underflowed to 0). s is 0 here though its exact value is 2^-25: the bound is the chosen
    # branch's (τ is exact), where a guard of the same shape with another constant covers the other branch.
    tiny = float(np.finfo(np.float32).tiny)
    (v,), (e,) = _bounded(_of_sum(lambda s: 1.0 / select(eq(s, 0.0), tiny, s)), x=LOST)["y"]
    assert v == 1.0 / tiny and e <= 2 * U32 / tiny
    (_,), (e,) = _bounded(_of_sum(lambda s: 1.0 / select(eq(s, 0.0), 2 * tiny, s)), x=LOST)["y"]
    assert np.isinf(e)


def test_an_input_equal_to_a_short_binary_threshold_is_a_certain_comparison():
    # 0.5 is what it says; 0.1 stands for a rounded real, so an input equal to it may be on either side
    x = np.array([[0.5, 0.1]], np.float64)
    program = _map_program("f64", 2, lambda t: select(t > 0.5, t - 7.0, 0.0) + select(t > 0.1, t - 3.0, 0.0))
    values, bounds = _bounded(program, x=x)["y"]
    assert values[0].tolist() == [0.5 - 3.0, 0.0]
    assert bounds[0, 0] <= 4 * UNIT_ROUNDOFF["f64"] * 3.0  # the 0.5 comparison certain (the 0.1 one true by far)
    assert bounds[0, 1] >= 2.9  # at 0.1 the other branch, 0.1 - 3, is covered


# ------------------------------------------------------------------ non-finite values

def test_infinite_identities_are_exact_and_overflow_is_not():
    x = np.array([[-INF, 1.0, 2.0]], np.float32)
    (v,), (e,) = _bounded(_row_program("f32", 3, lambda t: t, "max"), x=x)["out"]
    assert (v, e) == (2.0, 0.0)
    (v,), (e,) = _bounded(_row_program("f32", 3, lambda t: exp(t - 5.0)), x=x)["out"]  # exp(-inf) = 0 exactly
    assert np.isfinite(e) and e < 1e-5
    big = np.array([[100.0, 1.0, 2.0]], np.float32)
    (v,), (e,) = _bounded(_row_program("f32", 3, lambda t: exp(t)), x=big)["out"]
    assert np.isinf(v) and np.isinf(e)  # e^100 is finite: the f32 overflow is an error
    (v,), (e,) = _bounded(_row_program("f64", 3, lambda t: exp(t)), x=big.astype(np.float64))["out"]
    assert np.isfinite(v) and np.isfinite(e)


def test_minus_infinity_minus_an_inexact_value_is_exact():
    # r = max(x) - -inf stays exact where x's bound is finite: the fused softmax's first rescale
    x = np.array([[0.1, 0.2, 0.3]], np.float32)
    (v,), (e,) = _bounded(_row_program("f32", 3, lambda t: exp(-INF - (t + 0.7))), x=x)["out"]
    assert v == 0.0 and e == 0.0


def test_an_uninitialised_read_is_unbounded():
    p = ProgramBuilder("uninit")
    x = p.input("x", (1, 2), "f32")
    t = p.temp("t", (1, 2), "f32")
    y = p.output("y", (1, 2), "f32")
    with p.nest("fill", i=1, j=1) as (i, j):
        t[i, j] = x[i, j]
    with p.nest("read", i=1, j=2) as (i, j):
        y[i, j] = t[i, j] + 1.0
    v, e = _bounded(p.build(), x=np.ones((1, 2), np.float32))["y"]
    assert v[0, 0] == 2.0 and e[0, 0] < 1e-6 and np.isnan(v[0, 1]) and np.isinf(e[0, 1])


# ------------------------------------------------------------------ generated cascades, plain and fused

def _twin(program, dtype: str):
    from fuzz_run import load_program

    return load_program(str(program).replace('"f32"', f'"{dtype}"').replace('"f64"', f'"{dtype}"'))


@settings(max_examples=30, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_cascades_in_f32_are_within_bounds_of_their_f64_twin(data, seed):
    """The fuzzer's programs, plain and scheduled, in f32 and in f64 on the same (f32) inputs (and the values
    are the interpreter's)."""
    from fuzz_cascades import HypothesisDraw, cascade, inputs
    from fuzz_schedules import replay, schedule

    draw = HypothesisDraw(data)
    c = cascade(draw)
    steps = schedule(draw, c).steps
    values, sizes = inputs(draw, c, seed)
    f32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in values.items()}  # (gather indices stay)
    f64 = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in f32.items()}
    for program in (c.program, replay(c.program, steps).sch.program):
        single, double = _twin(program, "f32"), _twin(program, "f64")
        got32 = interpret_with_bounds(single, f32, sizes)
        plain = interpret(single, f32, sizes)
        for name, v in plain.items():
            np.testing.assert_array_equal(got32[name][0], v)
        got64 = interpret_with_bounds(double, f64, sizes)
        for name, (v32, e32) in got32.items():
            v64, e64 = got64[name]
            both = np.isfinite(v32) & np.isfinite(v64)
            with np.errstate(invalid="ignore"):
                ok = ~both | (np.abs(v32.astype(np.float64) - v64) <= e32 + e64) | np.isinf(e32)
            assert np.all(ok), (name, v32[~ok], v64[~ok], e32[~ok], e64[~ok])
            overflow = np.isfinite(v64) & ~np.isfinite(v32)
            assert np.all(np.isinf(e32[overflow])), (name, v32[overflow], v64[overflow])
