"""The NumPy interpreter executes programs exactly by their sequential semantics."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ir_programs import prefix_sum, softmax_sum, softmax_sum_split
from polyfuse.errors import IRError, PolyfuseError, UnboundSize
from polyfuse.ir import ProgramBuilder, cast, const, interpret, make_reducer, maximum, reduce
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import Var
from polyfuse.ir.stmt import INPUT, OUTPUT, Block, IterVar, Loop, Program, Store, Tensor
from polyfuse.ir.validate import validate


def test_figure_1a_by_hand():
    x = np.array([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]], dtype=np.float32)
    out = interpret(softmax_sum(), {"inp": x})["xsum"]
    expected = [sum(np.exp([-3.0, -2.0, -1.0, 0.0])), 4.0]
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_row_max_reduction_by_hand():
    p = ProgramBuilder("rowmax")
    x = p.input("x", (2, 3), "f32")
    y = p.output("y", (2,), "f32")
    with p.nest("m", i=2, j=reduce(3)) as (i, j):
        y[i] = maximum(y[i], x[i, j])
    x_val = np.array([[1, 5, 2], [-1, -3, -2]], dtype=np.float32)
    assert interpret(p.build(), {"x": x_val})["y"].tolist() == [5.0, -1.0]


def test_custom_reducer_runs_in_loop_order_from_init():
    # a deliberately non-associative combiner shows the accumulation order: ((10/2 + 1)/2 + 2)/2 + 3
    p = ProgramBuilder("order")
    x = p.input("x", (1, 3), "f32")
    y = p.output("y", (1,), "f32")
    halve = make_reducer("halve_add", lambda a, b: a * 0.5 + b, identity=0.0, dtype="f32")
    with p.nest("r", reducer=halve, init=10.0, i=1, j=reduce(3)) as (i, j):
        y[i] = halve.apply(y[i], x[i, j])
    out = interpret(p.build(), {"x": np.array([[1, 2, 3]], dtype=np.float32)})["y"]
    assert out.tolist() == [((10 / 2 + 1) / 2 + 2) / 2 + 3]


def test_f16_accumulator_rounds_every_step():
    # 2048 + 1 is not representable in f16 and rounds back to 2048 (ties to even)
    p = ProgramBuilder("f16sum")
    x = p.input("x", (3,), "f16")
    y16 = p.output("y16", (1,), "f16")
    y32 = p.output("y32", (1,), "f32")
    with p.nest("s16", o=1, j=reduce(3)) as (o, j):
        y16[o] = y16[o] + x[j]
    with p.nest("s32", o=1, j=reduce(3)) as (o, j):
        y32[o] = y32[o] + cast("f32", x[j])
    out = interpret(p.build(), {"x": np.array([2048, 1, 1], dtype=np.float16)})
    assert out["y16"].tolist() == [2048.0] and out["y32"].tolist() == [2050.0]


def test_fp8_and_bf16_casts_round_like_the_formats():
    p = ProgramBuilder("casts")
    x = p.input("x", (5,), "f32")
    y8 = p.output("y8", (5,), "f32")
    yb = p.output("yb", (5,), "f32")
    with p.nest("q8", i=5) as (i,):
        y8[i] = cast("f32", cast("fp8e4m3", x[i]))
    with p.nest("qb", i=5) as (i,):
        yb[i] = cast("f32", cast("bf16", x[i]))
    vals = np.array([0.3, -1.7, 100.0, 1e-3, 3.14159], dtype=np.float32)
    out = interpret(p.build(), {"x": vals})
    assert out["y8"].tolist() == vals.astype(ml_dtypes.float8_e4m3fn).astype(np.float32).tolist()
    assert out["y8"][0] == 0.3125
    assert out["yb"].tolist() == vals.astype(ml_dtypes.bfloat16).astype(np.float32).tolist()


def test_split_loops_with_guard_equal_the_plain_program():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 6)).astype(np.float32)
    plain = interpret(softmax_sum(), {"inp": x})["xsum"]
    split = interpret(softmax_sum_split(10, 6, 4), {"inp": x})["xsum"]
    np.testing.assert_array_equal(plain, split)


def test_dependent_iterations_run_in_order():
    x = np.arange(1, 10, dtype=np.float32)
    np.testing.assert_array_equal(interpret(prefix_sum(9), {"x": x})["y"], np.cumsum(x))


def test_sizes_from_inputs_and_explicit():
    x = np.ones((3, 5), dtype=np.float32)
    assert interpret(softmax_sum(), {"inp": x})["xsum"].tolist() == [5.0] * 3
    assert interpret(softmax_sum(), {"inp": x}, sizes={"N": 3})["xsum"].shape == (3,)
    with pytest.raises(IRError, match="size N is 4, but input 'inp' has 3"):
        interpret(softmax_sum(), {"inp": x}, sizes={"N": 4})


def test_input_errors_name_the_tensor():
    prog = softmax_sum()
    with pytest.raises(IRError, match="input 'inp' has dtype float64, the program declares f32"):
        interpret(prog, {"inp": np.ones((2, 2))})
    with pytest.raises(IRError, match="needs input"):
        interpret(prog, {})
    with pytest.raises(IRError, match="no input named other"):
        interpret(prog, {"inp": np.ones((2, 2), np.float32), "other": np.ones(1)})
    with pytest.raises(IRError, match="input 'inp' has shape"):
        interpret(softmax_sum(False, 2, 4), {"inp": np.ones((2, 3), np.float32)})


def test_unbound_size_is_reported():
    p = ProgramBuilder("unbound")
    n = p.size("N")
    y = p.output("y", (n,), "f32")
    with p.nest("fill", i=n) as (i,):
        y[i] = const(1.0)
    with pytest.raises(UnboundSize, match="no value for size"):
        interpret(p.build(), {})


def test_out_of_bounds_access_names_block_and_tensor():
    """A program assembled by hand (no builder, so no bounds proof) is still refused when it runs."""
    x = Tensor("x", (const(4),), dt.f32, INPUT)
    y = Tensor("y", (const(4),), dt.f32, OUTPUT)
    i, t = Var("i"), Var("t")
    shift = Block("shift", (IterVar(i, const(4)),), (t,), Store(y, (i,), x[i + 1]))
    program = validate(Program("oob", (), (x, y), Loop(t, const(4), shift)))
    with pytest.raises(PolyfuseError, match="block 'shift' reads tensor 'x' out of bounds"):
        interpret(program, {"x": np.zeros(4, np.float32)})


def test_reading_unwritten_temporaries_shows_as_nan():
    p = ProgramBuilder("unwritten")
    x = p.input("x", (4,), "f32")
    t = p.temp("t", (4,), "f32")
    y = p.output("y", (4,), "f32")
    with p.nest("half", i=2) as (i,):
        t[i] = x[i]
    with p.nest("copy", i=4) as (i,):
        y[i] = t[i]
    out = interpret(p.build(), {"x": np.ones(4, np.float32)})["y"]
    assert out[:2].tolist() == [1.0, 1.0] and np.isnan(out[2:]).all()
