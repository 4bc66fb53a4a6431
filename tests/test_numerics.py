"""A fused program equals the plain one in floating point, not only in real arithmetic (issue 20).

Each test is one way a repair that is exact in real arithmetic goes wrong in floating point, with the
smallest program that shows it: the repair must come out exact on the inputs that break it, or be
refused with the condition that fails (:mod:`polyfuse.transforms.numerics`).  Fused and plain programs
run in float64 through the interpreter; agreement is to 1e-12 relative (a rolling update reorders a sum
of at most 8 terms and rescales each by factors in [0, 1]: a few roundings of 2^-53 each), and special
values (NaN, ±inf) must be the same.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.errors import IRError, NoRepairFound
from polyfuse.ir import ProgramBuilder, exp, interpret, maximum, minimum, reduce, sqrt
from polyfuse.ir.expr import Expr, call
from polyfuse.ir.stmt import Program
from polyfuse.ops.schedules import default_schedule
from polyfuse.transforms import Schedule

RTOL = 1e-12


def abs_(v: Expr) -> Expr:
    return call("abs", v)


def chain(producer: str, term: Callable[[Expr, Expr], Expr], *, m: int = 3, init: float | None = None,
          producer_term: Callable[[Expr], Expr] | None = None, finite: bool = False,
          sign: str | None = None) -> Program:
    """Two nests over x[1, m]: r0 = ⊕_j p(x) (max, min or sum) and r1 = init + Σ_j term(x, r0)."""
    p = ProgramBuilder("chain")
    x = p.input("x", (2, m), "f64", finite=finite, sign=sign)
    r0 = p.temp("r0", (2,), "f64")
    r1 = p.output("r1", (2,), "f64")
    of = producer_term or (lambda v: v)
    with p.nest("s0", i=2, j=reduce(m)) as (i, j):
        r0[i] = {"max": maximum, "min": minimum, "sum": lambda a, b: a + b}[producer](r0[i], of(x[i, j]))
    kw = {} if init is None else {"init": init}
    with p.nest("s1", i=2, j=reduce(m), **kw) as (i, j):
        r1[i] = r1[i] + term(x[i, j], r0[i])
    return p.build()


def rolled(program: Program, tile: int | None = None) -> Schedule:
    sch = Schedule(program)
    loop = sch.loop("s0", "j")
    if tile is not None:
        loop, _ = sch.split(loop, [None, tile])
    sch.rolling_update("s1", loop)
    return sch


def split_k(program: Program, splits: int = 2) -> Schedule:
    sch = Schedule(program)
    j0, _ = sch.split(sch.loop("s0", "j"), [splits, None])
    sch.split_k_update("s1", j0)
    return sch


def same(got: np.ndarray, ref: np.ndarray) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(ref)), (got, ref)
    finite = np.isfinite(ref)
    assert np.array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)]), (got, ref)
    assert np.all(np.isfinite(got[finite])), (got, ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=RTOL, atol=0)


def check(program: Program, sch: Schedule, rows: list[list[float]]) -> None:
    x = np.array(rows, dtype=np.float64)
    same(interpret(sch.program, {"x": x})["r1"], interpret(program, {"x": x})["r1"])


FUSIONS = {"roll": rolled, "roll over tiles": lambda p: rolled(p, tile=2), "split-k": split_k}


# ------------------------------------------------------------------ class 3: init


@pytest.mark.parametrize("fusion", FUSIONS)
def test_a_consumers_init_is_not_rescaled(fusion):
    """r1 = 1 + Σ exp(x - max x): the init is the plain program's first operand, never repaired."""
    program = chain("max", lambda x, r: exp(x - r), init=1.0)
    sch = FUSIONS[fusion](program)
    check(program, sch, [[0.5, 2.0, -1.0], [3.0, -2.0, 7.0]])


# ------------------------------------------------------------------ classes 1, 2, 5: zeros


@pytest.mark.parametrize("fusion", FUSIONS)
def test_ratio_to_a_running_max_that_starts_at_zero(fusion):
    """Σ (x / max|x|)² with leading zeros: the running max is 0 while the terms are 0/0; the fused
    program uses a surrogate there and equals the plain one, including an all-zero row (NaN in both)."""
    program = chain("max", lambda x, r: (x / r) * (x / r), producer_term=abs_)
    sch = FUSIONS[fusion](program)
    check(program, sch, [[0.0, 0.0, 1.5], [0.0, 0.0, 0.0]])
    check(program, sch, [[0.0, -3.0, 0.0], [2.0, 0.0, 0.0]])
    assert sch.fusions[0].repair.numerics.surrogates


@pytest.mark.parametrize("fusion", FUSIONS)
def test_weighted_mean_over_masses_that_start_at_zero(fusion):
    """Σ w·x / Σ w with masses declared nonnegative: a mass that is still 0 is a zero state."""
    p = ProgramBuilder("centre")
    w = p.input("w", (2, 4), "f64", sign="nonnegative")
    x = p.input("x", (2, 4), "f64")
    mass, c = p.temp("mass", (2,), "f64"), p.output("r1", (2,), "f64")
    with p.nest("s0", i=2, j=reduce(4)) as (i, j):
        mass[i] = mass[i] + w[i, j]
    with p.nest("s1", i=2, j=reduce(4)) as (i, j):
        c[i] = c[i] + w[i, j] * x[i, j] / mass[i]
    program = p.build()
    sch = FUSIONS[fusion](program)
    inputs = {"w": np.array([[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0]]), "x": np.array([[5.0, -1.0, 3.0, 4.0]] * 2)}
    same(interpret(sch.program, inputs)["r1"], interpret(program, inputs)["r1"])


def test_a_declared_sign_is_checked():
    p = ProgramBuilder("signed")
    w = p.input("w", (3,), "f64", sign="nonnegative")
    y = p.output("y", (3,), "f64")
    with p.nest("s", i=3) as (i,):
        y[i] = w[i]
    with pytest.raises(IRError, match=r"input 'w' is declared sign='nonnegative', but its element \[1\] is -2"):
        interpret(p.build(), {"w": np.array([1.0, -2.0, 3.0])})


def test_division_by_a_sum_that_can_cross_zero_is_refused():
    """Σ x / Σ x: a running sum of data of either sign can be 0 (or tiny) mid-row where the final one is
    not; no surrogate makes that exact, and the term is not a polynomial in the sum."""
    with pytest.raises(NoRepairFound, match=r"Q = r0/r0' rescales the accumulator by a factor not provably in "
                                            r"\[0, 1\].*no auxiliary accumulators"):
        rolled(chain("sum", lambda x, r: x / r))


@pytest.mark.parametrize("fusion", FUSIONS)
def test_a_term_that_is_the_sum_itself_is_a_state_repair(fusion):
    """Σ_j (Σ x): h = t·r'/r would divide by a running sum that is 0 after [0, ...]; the state repair
    X + n·(r' - r) has no division and is exact."""
    program = chain("sum", lambda x, r: r, m=2)
    sch = FUSIONS[fusion](program)
    assert sch.fusions[0].repair.state
    check(program, sch, [[0.0, -1000.0], [1.0, 2.0]])


# ------------------------------------------------------------------ class 4: range


def test_a_min_inside_exp_grows_the_accumulator_and_is_refused():
    """Σ exp(x - min exp(x)): h = t·exp(r - r') with r' <= r scales up; the first term underflowed to 0
    is never recovered (418.9 instead of 8928 in float64)."""
    with pytest.raises(NoRepairFound, match=r"not provably in \[0, 1\] over a step"):
        rolled(chain("min", lambda x, r: exp(x - r), m=4, producer_term=exp))


def test_a_max_of_another_tensor_does_not_bound_the_term():
    p = ProgramBuilder("other")
    x, y = p.input("x", (2, 4), "f64"), p.input("y", (2, 4), "f64")
    m, s = p.temp("m", (2,), "f64"), p.output("s", (2,), "f64")
    with p.nest("s0", i=2, j=reduce(4)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s1", i=2, j=reduce(4)) as (i, j):
        s[i] = s[i] + exp(y[i, j] - m[i])
    with pytest.raises(NoRepairFound, match="not bounded by its producers"):
        rolled(p.build())


def test_a_mean_centred_exponential_is_refused():
    """Σ exp(x - mean) near 100 overflows in f32 when fused (intermediates exp(x - partial mean))."""
    with pytest.raises(NoRepairFound, match="not provably in"):
        rolled(chain("sum", lambda x, r: exp(x - r), producer_term=lambda v: v / 3.0))


def test_the_solver_keeps_s_over_m_plus_eps_as_written():
    """x / sqrt(s/M + eps): the repair reads sqrt(s/M + eps) as the program does, not a normal form
    like sqrt(c·s + 1)/sqrt(c) whose c·s overflows long before s/M does."""
    program = chain("sum", lambda x, r: x / sqrt(r / 3.0 + 1e-6), producer_term=lambda v: v * v)
    sch = rolled(program)
    h = sch.fusions[0].repair.h
    assert "r0/3 + 1/1000000" in str(h).replace(" ", "").replace("r0/3+1/1000000", "r0/3 + 1/1000000"), h
    check(program, sch, [[1e30, 2e30, -1e30], [0.0, 0.0, 3.0]])


# ------------------------------------------------------------------ ±inf: masks and data


def test_polynomial_in_a_max_of_data_that_may_hold_minus_inf_is_refused_unless_declared_finite():
    term = lambda x, r: (x - r) * (x - r)  # noqa: E731
    with pytest.raises(NoRepairFound, match="declare the input finite=True"):
        rolled(chain("max", term))
    program = chain("max", term, finite=True)
    check(program, rolled(program), [[1.0, -2.0, 5.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("fusion", FUSIONS)
def test_rows_of_minus_inf_give_what_the_plain_program_gives(fusion):
    """Σ exp(x - max x) over rows that start with -inf, and a row that is all -inf (NaN in both)."""
    program = chain("max", lambda x, r: exp(x - r))
    sch = FUSIONS[fusion](program)
    check(program, sch, [[-np.inf, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    check(program, sch, [[-np.inf, 2.0, np.inf], [np.nan, 0.0, 1.0]])


# ------------------------------------------------------------------ the catalog on zero-prefixed rows


@pytest.mark.parametrize("name", ["l2norm_stable", "quant_gemm", "inertia"])
def test_catalog_ratio_repairs_on_rows_that_start_with_zeros(name):
    """The three operators that returned NaN on rows starting with zeros (issue 20, class 1)."""
    op = ops.get(name)
    mode = op.modes[0]
    program = op.program(mode)
    sch = default_schedule(name, mode, program)
    inputs = op.inputs(0, mode)
    reduced = {"l2norm_stable": "x", "quant_gemm": "A", "inertia": "w"}[name]
    data = inputs[reduced].copy()
    data[..., : data.shape[-1] // 2] = 0
    data[0] = 0
    inputs[reduced] = data
    plain, fused = interpret(program, inputs), interpret(sch.program, inputs)
    for out in plain:
        got, ref = fused[out].astype(np.float64), plain[out].astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(ref)), out
        np.testing.assert_allclose(got[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ class 7: the solver's bounds


@pytest.fixture
def fresh_solver():
    """The repair solver without its cache of answers (a test that changes how it runs sees it run)."""
    from polyfuse.transforms import repair

    repair._solve_cached.cache_clear()
    yield repair
    repair._solve_cached.cache_clear()


def test_the_solver_stops_after_its_time_bound(monkeypatch, fresh_solver):
    monkeypatch.setattr(fresh_solver, "SOLVER_SECONDS", 0.0)
    with pytest.raises(NoRepairFound, match=r"took longer than 0 s and was stopped"):
        rolled(chain("max", lambda x, r: exp(x - r)))


def test_sympy_failures_are_refusals_with_the_reason(monkeypatch, fresh_solver):
    def broken(*args, **kwargs):
        raise ValueError("The argument 'nan' is not comparable")

    monkeypatch.setattr(fresh_solver._Solver, "_prove", broken)
    with pytest.raises(NoRepairFound, match=r"sympy raised ValueError: The argument 'nan' is not comparable"):
        rolled(chain("max", lambda x, r: exp(x - r)))


def test_kernels_check_what_inputs_declare():
    """A host kernel refuses a NumPy input that breaks its declaration, as the interpreter does."""
    from polyfuse import build

    p = ProgramBuilder("declared")
    w = p.input("w", (4,), "f32", sign="nonnegative", finite=True)
    y = p.output("y", (4,), "f32")
    with p.nest("s", i=4) as (i,):
        y[i] = w[i] * 2.0
    kernel = build(p.build(), "cpp", werror=True)
    assert np.array_equal(kernel(np.arange(4, dtype=np.float32)), 2 * np.arange(4, dtype=np.float32))
    with pytest.raises(IRError, match=r"input 'w' is declared sign='nonnegative', finite=True, but its element \[2\]"):
        kernel(np.array([1.0, 2.0, np.inf, 0.0], dtype=np.float32))


@pytest.mark.parametrize("tile", [None, 2])
def test_an_init_survives_an_empty_reduction(tile):
    """With a symbolic size 0 the plain program's result is the init alone; the fused consumer, which takes
    its init at the last step, starts from it where the reduction is empty."""
    from polyfuse.tiling import interpret as interpret_tiles
    from polyfuse.tiling import to_tiles

    p = ProgramBuilder("empty")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N, M), "f64")
    r0, r1 = p.temp("r0", (N,), "f64"), p.output("r1", (N,), "f64")
    with p.nest("s0", i=N, j=reduce(M)) as (i, j):
        r0[i] = maximum(r0[i], x[i, j])
    with p.nest("s1", i=N, j=reduce(M), init=1.0) as (i, j):
        r1[i] = r1[i] + exp(x[i, j] - r0[i])
    program = p.build()
    sch = Schedule(program)
    loop = sch.loop("s0", "j")
    if tile is not None:
        loop, _ = sch.split(loop, [None, tile])
    sch.rolling_update("s1", loop)
    for m in (0, 5):
        inputs = {"x": np.random.default_rng(m).standard_normal((2, m))}
        ref = interpret(program, inputs)["r1"]
        same(interpret(sch.program, inputs)["r1"], ref)
        same(interpret_tiles(to_tiles(sch.program), inputs)["r1"], ref)
