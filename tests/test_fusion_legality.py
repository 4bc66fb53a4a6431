"""The ordinary schedule primitives around the reduction fusions: a misuse is refused with a
PolyfuseError naming the block and loop (issue 20, classes 6 and 7), and the legal neighbour of
each misuse still fuses and computes what the plain program does."""

from __future__ import annotations

import numpy as np
import pytest

from ir_programs import softmax_sum, two_pass_variance
from polyfuse.errors import IllegalTransform
from polyfuse.ir import Program, ProgramBuilder, exp, interpret, maximum, reduce, spatial
from polyfuse.transforms import Schedule


def rows(program: Program, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = [3, 8] if sizes is None else [sizes["N"], sizes["M"]]
    return {t.name: rng.standard_normal(shape).astype(np.float32) for t in program.inputs}


def assert_same_sum(before: Program, after: Program, sizes: dict[str, int] | None = None) -> None:
    """The fused sum is the plain one up to f32 regrouping of 8 terms (Σ exp(x - max) <= 8)."""
    inputs = rows(before, sizes=sizes)
    want = interpret(before, inputs, sizes)["xsum"]
    got = interpret(after, inputs, sizes)["xsum"]
    np.testing.assert_allclose(got, want, rtol=2 * 8 * 2.0 ** -24 * 4)


def plain() -> Program:
    return softmax_sum(symbolic=False, n=3, m=8)


# ------------------------------------------------------------------ split_k_update: which loop splits

@pytest.mark.parametrize("inner", [1, 2])
def test_split_k_over_the_inner_loop_of_a_split_is_refused_naming_the_outer_loop(inner):
    sch = Schedule(plain())
    _, j1 = sch.split(sch.loop("s_max", "j"), [None, inner])
    with pytest.raises(IllegalTransform) as err:
        sch.split_k_update("s_sum", j1)
    msg = str(err.value)
    assert "'s_max'" in msg and "'j_1'" in msg and "use the outermost loop binding the reduction, 'j_0'" in msg


def test_split_k_over_the_outer_loop_of_a_split_fuses_and_agrees():
    sch = Schedule(plain())
    j0, _ = sch.split(sch.loop("s_max", "j"), [None, 2])
    sch.split_k_update("s_sum", j0)
    assert_same_sum(plain(), sch.program)


def test_split_k_over_an_unsplit_loop_is_refused_saying_to_split_it():
    sch = Schedule(plain())
    with pytest.raises(IllegalTransform) as err:
        sch.split_k_update("s_sum", sch.loop("s_max", "j"))
    msg = str(err.value)
    assert "'s_max'" in msg and "no loop inside loop 'j'" in msg and "[n_splits, None]" in msg


def test_split_k_over_the_partials_of_a_whole_loop_rfactor_is_refused():
    """rfactor over the whole reduce loop makes s_max a combine over one partial per element: the consumer
    would be cut into single updates too (found by the property test; an AttributeError before)."""
    sch = Schedule(plain())
    sch.rfactor(sch.loop("s_max", "j"))
    with pytest.raises(IllegalTransform, match=r"no loop inside loop 'j' binds the reduction of block 's_sum'"):
        sch.split_k_update("s_sum", sch.loop("s_max", "j"))


# ------------------------------------------------------------------ rolling_update: which loop rolls

def test_rolling_over_a_fused_row_and_reduce_loop_is_refused():
    sch = Schedule(plain())
    fused = sch.fuse([sch.loop("s_max", "i"), sch.loop("s_max", "j")])
    with pytest.raises(IllegalTransform) as err:
        sch.rolling_update("s_sum", fused)
    msg = str(err.value)
    assert f"loop {fused.name!r}" in msg and "element xmax[1] of block 's_max'" in msg
    assert "in iteration 8" in msg and "spatial iteration(s) of 's_max' (i = i_j // 8)" in msg
    assert "binds only the reduction" in msg


def test_rolling_over_a_loop_whose_first_iterations_skip_the_reduction_is_refused():
    """``j = j' - 2`` over 8 iterations: the reduction starts in iteration 2, where the saved previous max
    would be uninitialised (the fused sums were NaN)."""
    p = ProgramBuilder("late_start")
    x = p.input("x", (3, 6), "f32")
    xmax = p.temp("xmax", (3,), "f32")
    xsum = p.output("xsum", (3,), "f32")
    with p.loop("i", 3) as li, p.loop("j", 8) as lj:
        with p.block("s_max", i=spatial(3, li), j=reduce(6, lj - 2)) as (i, j):
            xmax[i] = maximum(xmax[i], x[i, j])
    with p.nest("s_sum", i=3, j=reduce(6)) as (i, j):
        xsum[i] = xsum[i] + exp(x[i, j] - xmax[i])
    sch = Schedule(p.build())
    with pytest.raises(IllegalTransform) as err:
        sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    msg = str(err.value)
    assert "element xmax[0] of block 's_max' starts (its init, s_max[i = 0, j = 0]) in iteration 2 of loop 'j'" in msg
    assert "first iterations hold no instance" in msg


def test_rolling_over_the_reduce_loop_alone_fuses_and_agrees():
    sch = Schedule(plain())
    sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    assert_same_sum(plain(), sch.program)


def test_rolling_over_the_inner_loop_of_a_split_is_refused():
    sch = Schedule(plain())
    _, j1 = sch.split(sch.loop("s_max", "j"), [None, 2])
    with pytest.raises(IllegalTransform, match=r"loop 'j_0', outside loop 'j_1', also binds the reduction of block "
                                               r"'s_max'.*'j_0'"):
        sch.rolling_update("s_sum", j1)


# ------------------------------------------------------------------ reductions run backwards

def test_the_reversed_plain_program_reduces_only_element_zero():
    """What the refusals below protect: each init, at j = 0, runs last, so the plain program's sum is
    exp(x[i, 0] - x[i, 0]) = 1 — the fused programs gave NaN."""
    program = softmax_sum(symbolic=False, n=3, m=8, layout="reversed")
    np.testing.assert_array_equal(interpret(program, rows(program))["xsum"], np.ones(3, np.float32))


@pytest.mark.parametrize("how", ["roll", "roll tiles", "split-k"])
def test_fusing_reductions_that_run_backwards_is_refused(how):
    sch = Schedule(softmax_sum(symbolic=False, n=3, m=8, layout="reversed"))
    j = sch.loop("s_max", "j")
    with pytest.raises(IllegalTransform) as err:
        if how == "roll":
            sch.rolling_update("s_sum", j)
        elif how == "roll tiles":
            sch.rolling_update("s_sum", sch.split(j, [None, 2])[0])
        else:
            sch.split_k_update("s_sum", sch.split(j, [2, None])[0])
    msg = str(err.value)
    assert "block 's_max' backwards" in msg and "s_max[i = 0, j = 7] runs before the init" in msg


def test_reversed_program_with_symbolic_sizes_is_refused_with_a_witness_naming_the_sizes():
    sch = Schedule(softmax_sum(symbolic=True, layout="reversed"))
    with pytest.raises(IllegalTransform, match=r"backwards .* \(with N = 1, M = 2\)"):
        sch.rolling_update("s_sum", sch.loop("s_max", "j"))


# ------------------------------------------------------------------ after compact_buffers

@pytest.mark.parametrize("fusion", ["rolling_update", "split_k_update"])
def test_fusing_through_a_compacted_map_is_refused_naming_it(fusion):
    """compact_buffers leaves ``xexp[0, j]`` (one row per iteration of i): the map between the producer and
    the consumer is no longer one expression per element of xexp, so it cannot be inlined (it crashed)."""
    sch = Schedule(plain())
    sch.compute_at("s_exp", sch.loop("s_sum", "i"))
    sch.compute_at("s_max", sch.loop("s_exp", "i"))
    sch.compact_buffers()
    assert "xexp[0, j] = exp(inp[i, j] - xmax[0])" in str(sch.program)
    with pytest.raises(IllegalTransform) as err:
        if fusion == "rolling_update":
            sch.rolling_update("s_sum", sch.loop("s_max", "ax0"))
        else:
            sch.split_k_update("s_sum", sch.split(sch.loop("s_max", "ax0"), [2, None])[0])
    msg = str(err.value)
    assert "block 's_sum' reads a producer reduction through map block 's_exp'" in msg
    assert "xexp[0, j]" in msg and "run compact_buffers after the reduction fusions" in msg


# ------------------------------------------------------------------ symbolic sizes

@pytest.mark.parametrize("how", ["roll", "roll tiles", "split-k"])
@pytest.mark.parametrize("length", [7, 8])
def test_state_repair_with_symbolic_sizes_fuses_and_agrees(how, length):
    """The auxiliary terms read the size L (an InternalError "uses L" before)."""
    sch = Schedule(two_pass_variance())
    j = sch.loop("s_mean", "j")
    if how == "roll":
        sch.rolling_update("s_var", j)
    elif how == "roll tiles":
        sch.rolling_update("s_var", sch.split(j, [None, 3])[0])
    else:
        sch.split_k_update("s_var", sch.split(j, [None, 2])[0])
    sizes = {"B": 3, "L": length}
    inputs = {"x": np.random.default_rng(0).standard_normal((3, length)).astype(np.float32)}
    want = interpret(two_pass_variance(), inputs, sizes)["var"]
    # f32 regrouping of L terms of magnitude <= max x² / L, and the mean's rounding inside them.
    np.testing.assert_allclose(interpret(sch.program, inputs, sizes)["var"], want, rtol=1e-5, atol=1e-6)
