"""The loop primitives (split, reorder, fuse, tile, annotate, bind) and the Schedule trace.

Every positive test checks the IR after the step and runs it against the original on random inputs:
loop primitives keep each reduction's accumulation order, so results must be bitwise equal.  Every
negative test checks that the message names the block, the loop and (where one is broken) the dependence.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ir_programs import prefix_sum, softmax_sum, softmax_sum_split
from polyfuse.errors import IllegalTransform
from polyfuse.ir import Program, ProgramBuilder, Var, interpret
from polyfuse.ir.printer import program_from_source
from polyfuse.transforms import LoopRef, Schedule, Trace
from polyfuse.transforms.tree import loops_of


def random_inputs(program: Program, seed: int = 0, **sizes: int) -> dict[str, np.ndarray]:
    """Standard-normal inputs of the program's input shapes (sizes bound by ``sizes``)."""
    rng = np.random.default_rng(seed)
    bound = program.bind(**sizes) if sizes else program
    out = {}
    for t in bound.inputs:
        shape = tuple(int(d.value) for d in t.shape)  # type: ignore[attr-defined]
        out[t.name] = rng.standard_normal(shape).astype(t.dtype.numpy)
    return out


def assert_same_results(before: Program, after: Program, seeds: int = 3, **sizes: int) -> None:
    """Bitwise equal outputs (NaN where NaN) on several random inputs."""
    for seed in range(seeds):
        inputs = random_inputs(before, seed, **sizes)
        want, got = interpret(before, inputs), interpret(after, inputs)
        assert want.keys() == got.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name!r}, seed {seed}")


def loop_names(program: Program, block: str) -> list[str]:
    return [r.name for r in Schedule(program).get_loops(block)]


def wavefront(n: int = 5, m: int = 6) -> Program:
    """``y[i+1, j] = y[i, j+1] + x[i+1, j]``: a dependence of distance (1, -1), so ``i`` and ``j`` cannot swap."""
    p = ProgramBuilder("wavefront")
    x = p.input("x", (n, m), "f32")
    y = p.output("y", (n, m), "f32")
    with p.nest("row0", j=m) as (j,):
        y[0, j] = x[0, j]
    with p.nest("last_col", i=n - 1) as (i,):
        y[i + 1, m - 1] = x[i + 1, m - 1]
    with p.nest("sweep", i=n - 1, j=m - 1) as (i, j):
        y[i + 1, j] = y[i, j + 1] + x[i + 1, j]
    return p.build()


# ------------------------------------------------------------------ split

def test_split_divisible_binds_outer_times_factor_plus_inner():
    p = softmax_sum(symbolic=False, n=3, m=8)
    sch = Schedule(p)
    j0, j1 = sch.split(sch.loop("s_max", "j"), [2, 4])
    assert (j0, j1) == (LoopRef("s_max", "j_0"), LoopRef("s_max", "j_1"))
    loops = loops_of(sch.program, "s_max")
    assert [(lp.var.name, lp.extent.value) for lp in loops] == [("i", 3), ("j_0", 2), ("j_1", 4)]
    assert sch.program.block("s_max").binding_of("j") == Var("j_0") * 4 + Var("j_1")
    assert "j=reduce(8, j_0 * 4 + j_1)" in str(sch.program)
    assert_same_results(p, sch.program)


def test_split_non_divisible_is_guarded_by_the_domain():
    p = softmax_sum(symbolic=False, n=10, m=6)
    sch = Schedule(p)
    sch.split(sch.loop("s_exp", "i"), [None, 4])
    outer, inner = loops_of(sch.program, "s_exp")[:2]
    assert (outer.extent.value, inner.extent.value) == (3, 4)  # 12 points for 10 rows
    assert "i=spatial(10, i_0 * 4 + i_1)" in str(sch.program)
    assert_same_results(p, sch.program)


def test_split_symbolic_extent_infers_the_outer_factor():
    p = softmax_sum()
    sch = Schedule(p)
    sch.split(sch.loop("s_sum", "j"), [None, 4])
    outer = loops_of(sch.program, "s_sum")[1]
    assert str(outer.extent) == "(M + 3) // 4"
    assert 'p.loop("j_0", (M + 3) // 4)' in str(sch.program)
    for m in (4, 7, 9):
        assert_same_results(p, sch.program, seeds=1, N=2, M=m)


def test_split_three_ways_keeps_the_order():
    p = prefix_sum(n=13)
    sch = Schedule(p)
    sch.split(sch.loop("scan", "t"), [None, 2, 3])
    assert loop_names(sch.program, "scan") == ["t_0", "t_1", "t_2"]
    assert_same_results(p, sch.program)


@pytest.mark.parametrize("factors, message", [
    ([None, None], "at most one factor may be None"),
    ([0, 4], "factors must be positive integers or None"),
    ([2, 3], "factors [2, 3] cover 6 iterations, the loop has 8"),
    ([4], "give at least two factors"),
])
def test_split_bad_factors_are_refused_naming_loop_and_block(factors, message):
    sch = Schedule(softmax_sum(symbolic=False, n=3, m=8))
    with pytest.raises(IllegalTransform) as err:
        sch.split(sch.loop("s_max", "j"), factors)
    assert "split of loop 'j' (block 's_max')" in str(err.value)
    assert message in str(err.value)
    assert len(sch.trace) == 0


def test_split_symbolic_extent_needs_the_outer_factor_inferred():
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform, match=r"split of loop 'j' \(block 's_max'\).*symbolic.*outermost"):
        sch.split(sch.loop("s_max", "j"), [4, None])


def test_split_of_a_loop_the_block_is_not_in():
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform, match="block 's_max' is not inside a loop named 'k'; its loops: i, j"):
        sch.loop("s_max", "k")


# ------------------------------------------------------------------ reorder

def test_reorder_interchanges_a_map():
    p = softmax_sum(symbolic=False, n=3, m=5)
    sch = Schedule(p)
    sch.reorder([sch.loop("s_exp", "j"), sch.loop("s_exp", "i")])
    assert loop_names(sch.program, "s_exp") == ["j", "i"]
    assert 'p.loop("j", 5) as j:\n        with p.loop("i", 3)' in str(sch.program)
    assert_same_results(p, sch.program)


def test_reorder_interchanges_a_reduction_keeping_each_rows_order():
    p = softmax_sum(symbolic=False, n=4, m=6)
    sch = Schedule(p)
    sch.reorder([sch.loop("s_sum", "j"), sch.loop("s_sum", "i")])
    assert loop_names(sch.program, "s_sum") == ["j", "i"]
    assert_same_results(p, sch.program)


def test_reorder_three_loops_after_split():
    p = softmax_sum(symbolic=False, n=4, m=8)
    sch = Schedule(p)
    j0, j1 = sch.split(sch.loop("s_exp", "j"), [None, 4])
    sch.reorder([j1, sch.loop("s_exp", "i"), j0])
    assert loop_names(sch.program, "s_exp") == ["j_1", "i", "j_0"]
    assert_same_results(p, sch.program)


def test_reorder_against_a_dependence_is_refused_with_a_witness():
    p = wavefront()
    sch = Schedule(p)
    with pytest.raises(IllegalTransform) as err:
        sch.reorder([sch.loop("sweep", "j"), sch.loop("sweep", "i")])
    text = str(err.value)
    assert "reorder of loops ['j', 'i'] (block 'sweep') violates" in text
    assert "flow sweep -> sweep on y" in text
    assert "witness (first violating pair): { sweep[i = 0, j = 1] -> sweep[i' = 1, j' = 0] }" in text
    assert sch.program is p and len(sch.trace) == 0


def test_reorder_of_a_nest_that_is_not_perfect():
    sch = Schedule(softmax_sum_split())
    with pytest.raises(IllegalTransform, match=r"block 's_exp'\).*loop 'i1' has more than loop 'j'.*perfect"):
        sch.reorder([sch.loop("s_exp", "j"), sch.loop("s_exp", "i1")])


def test_reorder_names_unknown_and_repeated_loops():
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform, match="not found: k"):
        sch.reorder([LoopRef("s_max", "k"), sch.loop("s_max", "i")])
    with pytest.raises(IllegalTransform, match="a loop is named twice"):
        sch.reorder([sch.loop("s_max", "i"), sch.loop("s_max", "i")])


# ------------------------------------------------------------------ fuse

def test_fuse_two_loops_into_their_product():
    p = softmax_sum(symbolic=False, n=3, m=5)
    sch = Schedule(p)
    fused = sch.fuse([sch.loop("s_exp", "i"), sch.loop("s_exp", "j")])
    assert fused == LoopRef("s_exp", "i_j")
    (lp,) = loops_of(sch.program, "s_exp")
    assert lp.extent.value == 15
    assert "i=spatial(3, i_j // 5), j=spatial(5, i_j % 5)" in str(sch.program)
    assert_same_results(p, sch.program)


def test_fuse_a_reduction_keeps_its_order():
    p = softmax_sum(symbolic=False, n=3, m=5)
    sch = Schedule(p)
    sch.fuse([sch.loop("s_sum", "i"), sch.loop("s_sum", "j")], name="ij")
    assert loop_names(sch.program, "s_sum") == ["ij"]
    assert_same_results(p, sch.program)


def test_fuse_refusals_name_the_loops():
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform, match=r"fuse of loops \['i', 'j'\] \(block 's_exp'\).*'i' has symbolic"):
        sch.fuse([sch.loop("s_exp", "i"), sch.loop("s_exp", "j")])
    sch = Schedule(softmax_sum_split())
    with pytest.raises(IllegalTransform, match="loop 'i1' has more than loop 'j'"):
        sch.fuse([sch.loop("s_exp", "i1"), sch.loop("s_exp", "j")])
    with pytest.raises(IllegalTransform, match="must be consecutive"):
        sch.fuse([sch.loop("s_exp", "i0"), sch.loop("s_exp", "j")])


def test_split_and_fuse_may_reuse_the_names_of_the_loops_they_replace():
    p = softmax_sum(symbolic=False, n=3, m=6)
    sch = Schedule(p)
    assert [r.name for r in sch.split(sch.loop("s_sum", "j"), [None, 2], names=["j", "k"])] == ["j", "k"]
    assert sch.fuse([sch.loop("s_max", "i"), sch.loop("s_max", "j")], name="j") == LoopRef("s_max", "j")
    assert loop_names(sch.program, "s_sum") == ["i", "j", "k"] and loop_names(sch.program, "s_max") == ["j"]
    assert_same_results(p, sch.program)


@pytest.mark.parametrize("names, message", [
    (["a b", "c"], "a loop name must be an identifier, got 'a b'"),
    ([1, 2], "a loop name must be an identifier, got 1"),
    (["i", "k"], "'i' already names a size or a loop around block 's_max'"),
    ("jk", "sch.split: names must be a list, got 'jk'"),
])
def test_split_refuses_bad_loop_names(names, message):
    sch = Schedule(softmax_sum(symbolic=False, n=3, m=6))
    with pytest.raises(IllegalTransform, match=re.escape(message)):
        sch.split(sch.loop("s_max", "j"), [None, 2], names=names)


def test_fuse_refuses_a_name_that_is_not_an_identifier_or_a_size():
    sch = Schedule(softmax_sum(sizes=("N", 4)))
    with pytest.raises(IllegalTransform, match=r"fuse of loops \['j', 'k'\].*'N' already names a size"):
        sch.fuse(sch.split(sch.loop("s_max", "j"), [2, 2], names=["j", "k"]), name="N")
    sch = Schedule(softmax_sum(symbolic=False))
    with pytest.raises(IllegalTransform, match="a loop name must be an identifier, got 3"):
        sch.fuse([sch.loop("s_max", "i"), sch.loop("s_max", "j")], name=3)


@pytest.mark.parametrize("call, message", [
    (lambda sch: sch.split(sch.loop("s_max", "j"), None), "sch.split: factors must be a list, got None"),
    (lambda sch: sch.split("j", [None, 2]), "sch.split: loop must be given as loop handles"),
    (lambda sch: sch.reorder("ij"), "sch.reorder: loops must be a list, got 'ij'"),
    (lambda sch: sch.tile([sch.loop("s_max", "i")], 2), "sch.tile: sizes must be a list, got 2"),
    (lambda sch: sch.fuse(["i", "j"]), "sch.fuse: name at least one loop, as loop handles"),
    (lambda sch: sch.compute_at("s_exp", "i"), "sch.compute_at: loop must be given as loop handles"),
    (lambda sch: sch.rolling_update("s_sum", "j"), "sch.rolling_update: loop must be given as loop handles"),
])
def test_arguments_of_the_wrong_kind_are_refused_naming_the_primitive(call, message):
    sch = Schedule(softmax_sum(symbolic=False))
    with pytest.raises(IllegalTransform, match=re.escape(message)):
        call(sch)


# ------------------------------------------------------------------ tile

def test_tile_two_loops():
    p = softmax_sum(symbolic=False, n=6, m=10)
    sch = Schedule(p)
    new = sch.tile([sch.loop("s_exp", "i"), sch.loop("s_exp", "j")], [4, 4])
    assert [r.name for r in new] == ["i_0", "j_0", "i_1", "j_1"]
    assert [(lp.var.name, lp.extent.value) for lp in loops_of(sch.program, "s_exp")] == [
        ("i_0", 2), ("j_0", 3), ("i_1", 4), ("j_1", 4)]
    assert_same_results(p, sch.program)


def test_tile_of_a_reduction_moves_the_reduce_tile_loop_out():
    p = softmax_sum(symbolic=False, n=4, m=8)
    sch = Schedule(p)
    sch.tile([sch.loop("s_max", "i"), sch.loop("s_max", "j")], [2, 4])
    assert loop_names(sch.program, "s_max") == ["i_0", "j_0", "i_1", "j_1"]
    assert_same_results(p, sch.program)


def test_tile_against_a_dependence_is_refused():
    sch = Schedule(wavefront())
    with pytest.raises(IllegalTransform, match=r"(?s)reorder of loops .*block 'sweep'.*flow sweep -> sweep on y"):
        sch.tile([sch.loop("sweep", "i"), sch.loop("sweep", "j")], [2, 2])


# ------------------------------------------------------------------ annotate / bind

def test_parallel_vectorize_unroll_mark_the_loop():
    p = softmax_sum(symbolic=False, n=3, m=4)
    sch = Schedule(p)
    sch.parallel(sch.loop("s_exp", "i"))
    sch.vectorize(sch.loop("s_exp", "j"))
    sch.unroll(sch.loop("s_sum", "j"))  # unrolling a reduce loop keeps the order: always legal
    assert [lp.kind for lp in loops_of(sch.program, "s_exp")] == ["parallel", "vectorized"]
    assert loops_of(sch.program, "s_sum")[1].kind == "unrolled"
    assert 'p.loop("j", 4, kind="unrolled")' in str(sch.program)
    assert program_from_source(str(sch.program)) == sch.program
    assert_same_results(p, sch.program)


def test_bind_spatial_loops_to_gpu_indices():
    p = softmax_sum(symbolic=False, n=3, m=4)
    sch = Schedule(p)
    sch.bind(sch.loop("s_max", "i"), "blockIdx.x")
    sch.bind(sch.loop("s_exp", "j"), "threadIdx.x")
    assert (loops_of(sch.program, "s_max")[0].kind, loops_of(sch.program, "s_max")[0].thread) == ("bound", "blockIdx.x")
    assert 'p.loop("i", 3, thread="blockIdx.x")' in str(sch.program)
    assert_same_results(p, sch.program)


def test_bind_a_reduce_loop_is_refused_naming_the_carried_dependence():
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform) as err:
        sch.bind(sch.loop("s_sum", "j"), "threadIdx.x")
    text = str(err.value)
    assert "bind loop 'j' (block 's_sum') to threadIdx.x" in text
    assert "loop 'j' carries a dependence" in text
    assert re.search(r"(flow|anti|output) s_sum -> s_sum on xsum \(reduction\)", text)
    assert "witness" in text
    assert len(sch.trace) == 0


def test_parallel_scan_is_refused():
    sch = Schedule(prefix_sum())
    with pytest.raises(IllegalTransform, match=r"(?s)annotate loop 't' \(block 'scan'\) as parallel.*scan -> scan"):
        sch.parallel(sch.loop("scan", "t"))


def test_bind_and_annotate_argument_errors():
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform, match="thread tag must be one of blockIdx.x"):
        sch.bind(sch.loop("s_exp", "i"), "warp.x")
    with pytest.raises(IllegalTransform, match="kind must be one of unrolled, vectorized, parallel"):
        sch.annotate(sch.loop("s_exp", "i"), "bound")


# ------------------------------------------------------------------ trace

def _scheduled() -> Schedule:
    sch = Schedule(softmax_sum(symbolic=False, n=6, m=8))
    i0, i1 = sch.split(sch.loop("s_max", "i"), [None, 2])
    sch.reorder([i1, i0])
    sch.fuse([sch.loop("s_exp", "i"), sch.loop("s_exp", "j")], name="ij")
    sch.tile([sch.loop("s_sum", "i"), sch.loop("s_sum", "j")], [2, 4])
    sch.unroll(sch.loop("s_sum", "j_1"))
    sch.bind(sch.loop("s_exp", "ij"), "blockIdx.x")
    sch.rfactor(sch.loop("s_max", "j"))  # max regroups exactly, so the results stay bitwise equal
    sch.decompose_reduction("s_sum", sch.loop("s_sum", "j_0"))
    return sch


def test_trace_prints_as_python_that_replays_to_the_same_program():
    sch = _scheduled()
    text = sch.trace.python()
    assert text.splitlines()[0] == 'sch.split(loop=sch.loop("s_max", "i"), factors=[None, 2])'
    assert 'sch.rfactor(loop=sch.loop("s_max", "j"))' in text
    again = Schedule(sch.original).exec_python(text)
    assert again.program == sch.program
    assert again.trace.python() == text
    assert_same_results(sch.original, again.program)


def test_trace_json_replays_to_the_same_program():
    sch = _scheduled()
    data = sch.trace.to_json()
    again = Schedule(sch.original).replay(data)
    assert again.program == sch.program
    assert Trace.from_json(data).python() == sch.trace.python()
    assert again.trace.to_json() == data


def test_replay_refuses_an_unknown_primitive():
    bad = '[{"primitive": "_apply", "args": {}}]'
    with pytest.raises(IllegalTransform, match="unknown primitive '_apply'"):
        Schedule(softmax_sum()).replay(bad)


def test_failed_step_leaves_program_and_trace_unchanged():
    sch = Schedule(softmax_sum(symbolic=False, n=3, m=4))
    sch.split(sch.loop("s_max", "j"), [2, 2])
    program, steps = sch.program, sch.trace.python()
    with pytest.raises(IllegalTransform):
        sch.bind(sch.loop("s_max", "j_1"), "threadIdx.x")
    assert sch.program is program and sch.trace.python() == steps


def test_printed_scheduled_program_round_trips():
    sch = _scheduled()
    assert program_from_source(str(sch.program)) == sch.program

