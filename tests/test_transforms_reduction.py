"""decompose_reduction and rfactor (privatization): IR after the step, results against the original, refusals.

decompose_reduction keeps every accumulation order, so results are bitwise equal.  rfactor regroups a
reduction: exact for max/min and integer sums, and within the f32 rounding bound of two differently ordered
sums otherwise (each of n terms is off by at most ``(n - 1)·u·Σ|t|``, so they differ by at most twice that).
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

from ir_programs import softmax_sum, softmax_sum_split
from polyfuse import deps, ops
from polyfuse.errors import IllegalTransform
from polyfuse.ir import (
    INF, Program, ProgramBuilder, Var, exp, interpret, make_reducer, maximum, reduce, spatial,
)
from polyfuse.ir.printer import program_from_source
from polyfuse.ir.stmt import REDUCE, SPATIAL
from polyfuse.transforms import LoopRef, Schedule
from polyfuse.transforms.decompose import decompose_reduction
from polyfuse.transforms.rfactor import rfactor
from polyfuse.transforms.tree import loops_of

U32 = 2.0 ** -24


def logits(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal values for every input (sizes must be bound)."""
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(tuple(int(d.value) for d in t.shape)).astype(t.dtype.numpy)  # type: ignore[attr-defined]
            for t in program.inputs}


def assert_bitwise(before: Program, after: Program, inputs: dict[str, np.ndarray]) -> None:
    want, got = interpret(before, inputs), interpret(after, inputs)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name!r}")


def assert_regrouped_sum(before: Program, after: Program, inputs: dict[str, np.ndarray], terms: int) -> None:
    """Outputs of positive-term f32 sums regrouped: within 2·(n - 1)·u relative."""
    want, got = interpret(before, inputs), interpret(after, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2 * (terms - 1) * U32, atol=0, err_msg=name)


def round_trips(program: Program) -> bool:
    return program_from_source(str(program)) == program


def biased_rowsum(n: int = 4, m: int = 6) -> Program:
    """``out[i] = bias[i] + Σ_j x[i, j]`` with the bias as the reduction's init (an init that loads)."""
    p = ProgramBuilder("biased_rowsum")
    x = p.input("x", (n, m), "f32")
    bias = p.input("bias", (n,), "f32")
    out = p.output("out", (n,), "f32")
    with p.nest("acc", i=n, j=reduce(m), init=bias[Var("i")]) as (i, j):
        out[i] = out[i] + x[i, j]
    return p.build()


# ------------------------------------------------------------------ decompose_reduction

def test_decompose_at_the_outer_loop_gives_an_init_nest_before_it():
    p = softmax_sum()
    q, name = decompose_reduction(p, block="s_sum", loop="i")
    assert name == "s_sum_init"
    assert [b.name for b in q.blocks()] == ["s_max", "s_exp", "s_sum_init", "s_sum"]
    assert q.block("s_sum").init is None and q.block("s_sum").reducer == p.block("s_sum").reducer
    text = str(q)
    assert ('    with p.nest("s_sum_init", i=N) as (i,):\n        xsum[i] = 0.0\n'
            '    with p.nest("s_sum", i=N, j=reduce(M), init=NO_INIT) as (i, j):') in text
    assert round_trips(q)
    x = logits(p.bind(N=3, M=7))
    assert_bitwise(p, q, x)


def test_decompose_at_the_reduce_loop_puts_the_init_inside_the_row_loop():
    p = softmax_sum(symbolic=False, n=3, m=5)
    q, _ = decompose_reduction(p, block="s_max", loop="j")
    (i_loop,) = [s for s in loops_of(q, "s_max_init")]
    assert loops_of(q, "s_max")[0] is i_loop  # one row loop: init, then the reduce loop
    assert "xmax[i] = -INF" in str(q)
    assert round_trips(q)
    assert_bitwise(p, q, logits(p))


def test_decompose_after_split_copies_only_spatial_loops():
    p = softmax_sum_split()  # i = i0*4 + i1, guarded to 10 rows
    q, _ = decompose_reduction(p, block="s_max", loop="i1")
    assert [lp.var.name for lp in loops_of(q, "s_max_init")] == ["i0", "i1"]
    assert "with p.block(\"s_max_init\", i=spatial(10, i0 * 4 + i1)) as (i,):" in str(q)
    assert round_trips(q)
    assert_bitwise(p, q, logits(p))


def test_decompose_keeps_an_init_that_loads():
    p = biased_rowsum()
    q, _ = decompose_reduction(p, block="acc", loop="j")
    init = q.block("acc_init")
    assert init.store.value == p.block("acc").init
    assert [iv.kind for iv in init.iters] == [SPATIAL]
    assert_bitwise(p, q, logits(p))


def test_decomposed_program_has_the_init_flowing_into_the_first_update():
    q, _ = decompose_reduction(softmax_sum(), block="s_sum", loop="i")
    (flow,) = deps.analyze(q).between("s_sum_init", "s_sum", "flow")
    expected = isl.Map("[N, M] -> { s_sum_init[i] -> s_sum[i, 0] : 0 <= i < N and M > 0 }")
    assert flow.relation.is_equal(expected), flow.relation


def test_decomposed_blocks_can_be_scheduled_further():
    p = softmax_sum(symbolic=False, n=4, m=8)
    sch = Schedule(p)
    sch.decompose_reduction("s_sum", sch.loop("s_sum", "i"))
    sch.parallel(sch.loop("s_sum_init", "i"))
    sch.split(sch.loop("s_sum", "j"), [None, 4])
    sch.reorder([sch.loop("s_sum", "j_0"), sch.loop("s_sum", "i")])
    sch.bind(sch.loop("s_sum", "i"), "threadIdx.x")
    assert_bitwise(p, sch.program, logits(p))
    with pytest.raises(IllegalTransform, match="loop 'j_0' carries a dependence"):
        sch.bind(sch.loop("s_sum", "j_0"), "blockIdx.x")


def test_decompose_refuses_a_block_without_a_reduction():
    with pytest.raises(IllegalTransform, match="decompose_reduction of block 's_exp' at loop 'i': .*not a reduction"):
        decompose_reduction(softmax_sum(), block="s_exp", loop="i")


def test_decompose_twice_is_refused():
    q, _ = decompose_reduction(softmax_sum(), block="s_sum", loop="i")
    with pytest.raises(IllegalTransform, match="block 's_sum' has no init .*decomposed already"):
        decompose_reduction(q, block="s_sum", loop="j")


def test_decompose_inside_a_reduce_loop_is_refused():
    sch = Schedule(softmax_sum(symbolic=False, n=3, m=8))
    sch.split(sch.loop("s_max", "j"), [None, 4])
    with pytest.raises(IllegalTransform) as err:
        sch.decompose_reduction("s_max", sch.loop("s_max", "j_1"))
    assert ("decompose_reduction of block 's_max' at loop 'j_1': loop 'j_0' is outside 'j_1' and binds a reduce "
            "iteration of 's_max'") in str(err.value)
    assert "decompose at loop 'j_0' or further out" in str(err.value)
    assert len(sch.trace) == 1


def test_decompose_at_a_fused_spatial_and_reduce_loop_is_refused():
    sch = Schedule(softmax_sum(symbolic=False, n=3, m=4))
    sch.fuse([sch.loop("s_max", "i"), sch.loop("s_max", "j")])
    with pytest.raises(IllegalTransform, match="loop 'i_j' binds both spatial and reduce iterations of 's_max'"):
        sch.decompose_reduction("s_max", sch.loop("s_max", "i_j"))


def _prefixed(between: str) -> Program:
    """``out`` first written by ``prev``; inside the row loop ``between`` touches it before the reduction."""
    p = ProgramBuilder("prefixed")
    x = p.input("x", (3, 4), "f32")
    out = p.output("out", (3,), "f32")
    seen = p.output("seen", (3,), "f32")
    with p.nest("prev", i=3) as (i,):
        out[i] = x[i, 0] * 2.0
    with p.loop("i", 3) as i:
        with p.block("between", i=spatial(3, i)) as (ii,):
            if between == "reads":
                seen[ii] = out[ii]
            else:
                seen[ii] = x[ii, 1]
        if between == "writes":
            with p.block("overwrite", i=spatial(3, i)) as (ii,):
                out[ii] = x[ii, 1]
        with p.loop("j", 4) as j:
            with p.block("acc", i=spatial(3, i), j=reduce(4, j)) as (ii, jj):
                out[ii] = out[ii] + x[ii, jj]
    return p.build()


def test_decompose_refuses_when_another_block_would_read_the_init():
    p = _prefixed("reads")
    with pytest.raises(IllegalTransform) as err:
        decompose_reduction(p, block="acc", loop="i")
    assert "the init would be read by something other than the first update" in str(err.value)
    assert "flow acc_init -> between on out" in str(err.value)
    q, _ = decompose_reduction(p, block="acc", loop="j")  # right before the reduce loop it is fine
    assert_bitwise(p, q, logits(p))


def test_decompose_refuses_when_another_block_writes_between_init_and_update():
    p = _prefixed("writes")
    with pytest.raises(IllegalTransform) as err:
        decompose_reduction(p, block="acc", loop="i")
    assert "the first update of 'acc' would not read its init" in str(err.value)
    assert "flow overwrite -> acc on out" in str(err.value)


def test_decompose_refuses_an_init_reading_what_the_loop_writes():
    p = ProgramBuilder("late_bias")
    x = p.input("x", (3, 4), "f32")
    t = p.temp("t", (3,), "f32")
    out = p.output("out", (3,), "f32")
    with p.loop("i", 3) as i:
        with p.block("make_t", i=spatial(3, i)) as (ii,):
            t[ii] = x[ii, 0] * 3.0
        with p.loop("j", 4) as j:
            with p.block("acc", i=spatial(3, i), j=reduce(4, j), init=t[Var("i")]) as (ii, jj):
                out[ii] = out[ii] + x[ii, jj]
    prog = p.build()
    with pytest.raises(IllegalTransform, match="the init of 'acc' reads tensor 't', which block 'make_t' writes "
                                               "inside loop 'i'"):
        decompose_reduction(prog, block="acc", loop="i")
    q, _ = decompose_reduction(prog, block="acc", loop="j")
    assert_bitwise(prog, q, logits(prog))


def test_facade_decompose_checks_that_the_loop_encloses_the_block():
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform, match="decompose_reduction: .*does not enclose block 's_sum'"):
        sch.decompose_reduction("s_sum", sch.loop("s_max", "j"))
    with pytest.raises(IllegalTransform, match="no block 'nope'"):
        sch.decompose_reduction("nope", sch.loop("s_max", "j"))


# ------------------------------------------------------------------ rfactor

def test_rfactor_outer_split_loop_gives_local_and_global_nests():
    p = softmax_sum(symbolic=False, n=3, m=8)
    sch = Schedule(p)
    j0, _ = sch.split(sch.loop("s_max", "j"), [None, 4])
    assert sch.rfactor(j0) == "s_max_rf"
    q = sch.program
    assert [b.name for b in q.blocks()] == ["s_max_rf", "s_max", "s_exp", "s_sum"]
    rf, combine = q.block("s_max_rf"), q.block("s_max")
    assert [(iv.var.name, iv.kind) for iv in rf.iters] == [("i", SPATIAL), ("j_0", SPATIAL), ("j_1", REDUCE)]
    assert [(iv.var.name, iv.kind) for iv in combine.iters] == [("i", SPATIAL), ("j_0", REDUCE)]
    assert q.tensor("xmax_rf").shape == (q.tensor("inp").shape[0], loops_of(q, "s_max_rf")[1].extent)
    text = str(q)
    assert ('    with p.nest("s_max_rf", i=3, j_0=2, j_1=reduce(4)) as (i, j_0, j_1):\n'
            '        xmax_rf[i, j_0] = maximum(xmax_rf[i, j_0], inp[i, j_0 * 4 + j_1])\n'
            '    with p.nest("s_max", i=3, j_0=reduce(2)) as (i, j_0):\n'
            '        xmax[i] = maximum(xmax[i], xmax_rf[i, j_0])\n') in text
    assert round_trips(q)
    assert_bitwise(p, q, logits(p))
    sch.parallel(sch.loop("s_max_rf", "j_0"))  # the partial results are independent now


def test_rfactor_inner_split_loop_with_leading_factor_axis():
    p = softmax_sum(symbolic=False, n=3, m=8)
    sch = Schedule(p)
    _, j1 = sch.split(sch.loop("s_max", "j"), [None, 4])
    sch.rfactor(j1, factor_axis=0)
    q = sch.program
    assert tuple(d.value for d in q.tensor("xmax_rf").shape) == (4, 3)
    assert "xmax_rf[j_1, i] = maximum(xmax_rf[j_1, i], inp[i, j_0 * 4 + j_1])" in str(q)
    assert round_trips(q)
    assert_bitwise(p, q, logits(p))
    sch.bind(sch.loop("s_max_rf", "j_1"), "threadIdx.x")


def test_rfactor_of_the_whole_reduce_loop_is_a_map_and_a_combine():
    p = softmax_sum()
    q, name = rfactor(p, block="s_sum", loop="j")
    rf = q.block(name)
    assert rf.reducer is None and rf.init is None and str(rf.store.value) == "xexp[i, j]"
    assert q.tensor("xsum_rf").shape == (Var("N"), Var("M"))
    assert round_trips(q)
    bound = p.bind(N=3, M=9)
    assert_bitwise(p, q, logits(bound))  # one term per partial result: the combine adds in the same order


def test_rfactor_sum_regroups_within_rounding():
    m = 64
    p = softmax_sum(symbolic=False, n=5, m=m)
    sch = Schedule(p)
    j0, _ = sch.split(sch.loop("s_sum", "j"), [8, None])
    sch.rfactor(j0)
    for seed in range(3):
        assert_regrouped_sum(p, sch.program, logits(p, seed), m)


def test_rfactor_figure_3_softmax_sum_both_reductions():
    op = ops.get("softmax_sum")
    sizes = {"N": 4, "M": 8}
    p = op.program(**sizes)
    sch = Schedule(p)
    outer = {}
    for block in ("s_max", "s_sum"):
        outer[block], _ = sch.split(sch.loop(block, "j"), [None, 2])
        sch.rfactor(outer[block])
    q = sch.program
    assert [b.name for b in q.blocks()] == ["s_max_rf", "s_max", "s_exp", "s_sum_rf", "s_sum"]
    assert str(q.block("s_max").store.value) == "maximum(xmax[i], xmax_rf[i, j_0])"
    assert str(q.block("s_sum").store.value) == f"xsum[i] + xsum_rf[i, {outer['s_sum'].name}]"
    assert [iv.kind for iv in q.block("s_sum_rf").iters] == [SPATIAL, SPATIAL, REDUCE]
    for seed in range(3):
        inputs = op.inputs(seed, sizes=sizes)
        assert_regrouped_sum(p, q, inputs, sizes["M"])
        got = interpret(q, inputs)
        assert ops.compare(got, op.reference(inputs, "default", sizes), op.tolerance("default", sizes)).ok
    assert_regrouped_sum(p, q, op.inputs(0, sizes=sizes, magnitude=1e4), sizes["M"])  # max subtraction keeps it finite


def test_rfactor_softmax_epilogue():
    op = ops.get("softmax")
    sizes = {"N": 3, "M": 12}
    p = op.program(**sizes)
    sch = Schedule(p)
    j0, _ = sch.split(sch.loop("s_max", "j"), [3, None])
    sch.rfactor(j0)
    j0, _ = sch.split(sch.loop("s_sum", "j"), [None, 4])
    sch.rfactor(j0)
    inputs = op.inputs(1, sizes=sizes)
    want, got = interpret(p, inputs)["y"], interpret(sch.program, inputs)["y"]
    np.testing.assert_allclose(got, want, rtol=2 * 11 * U32 + 2 * U32, atol=0)


def test_rfactor_max_with_infinities_is_exact():
    p = softmax_sum(symbolic=False, n=4, m=6)
    sch = Schedule(p)
    j0, _ = sch.split(sch.loop("s_max", "j"), [None, 3])
    sch.rfactor(j0)
    x = np.array([[-INF] * 6,
                  [1.0, INF, -2.0, 0.5, -INF, 3.0],
                  [-INF, -INF, -INF, -1.0, -INF, -INF],
                  [2.0, -INF, 0.0, -INF, INF, INF]], dtype=np.float32)
    want = interpret(p, {"inp": x}, return_temps=True)
    got = interpret(sch.program, {"inp": x}, return_temps=True)
    np.testing.assert_array_equal(got["xmax"], want["xmax"])
    assert got["xmax"].tolist() == [-INF, INF, -1.0, INF]
    np.testing.assert_array_equal(got["xsum"], want["xsum"])  # NaN rows stay NaN rows


def test_rfactor_integer_sum_is_bitwise():
    p = ProgramBuilder("isum")
    x = p.input("x", (3, 12), "i32")
    y = p.output("y", (3,), "i32")
    with p.nest("s", i=3, j=reduce(12), init=7) as (i, j):
        y[i] = y[i] + x[i, j] * x[i, j]
    prog = p.build()
    sch = Schedule(prog)
    j0, _ = sch.split(sch.loop("s", "j"), [None, 4])
    sch.rfactor(j0)
    assert str(sch.program.block("s").init) == "7"
    assert str(sch.program.block("s_rf").init) == "0"
    xs = np.random.default_rng(0).integers(-1000, 1000, size=(3, 12)).astype(np.int32)
    assert_bitwise(prog, sch.program, {"x": xs})


def test_rfactor_of_a_decomposed_reduction_keeps_the_init_block():
    p = softmax_sum(symbolic=False, n=3, m=8)
    sch = Schedule(p)
    sch.decompose_reduction("s_max", sch.loop("s_max", "i"))
    j0, _ = sch.split(sch.loop("s_max", "j"), [None, 2])
    sch.rfactor(j0)
    q = sch.program
    assert q.block("s_max").init is None and q.block("s_max_rf").init is not None
    assert [b.name for b in q.blocks()][:3] == ["s_max_init", "s_max_rf", "s_max"]
    assert round_trips(q)
    assert_bitwise(p, q, logits(p))


def test_rfactor_inside_a_fused_row_loop_places_the_combine_right_after_the_reduction():
    p = softmax_sum_split()  # s_exp and s_sum share the j loop under i1
    q, _ = rfactor(p, block="s_max", loop="j")
    assert [lp.var.name for lp in loops_of(q, "s_max")] == ["i0", "i1", "j"]
    assert loops_of(q, "s_max")[1] is loops_of(q, "s_exp")[1]  # still inside the shared row loop
    assert_bitwise(p, q, logits(p))
    r, _ = rfactor(p, block="s_sum", loop="j")
    assert [b.name for b in r.blocks()] == ["s_max", "s_exp", "s_sum_rf", "s_sum"]
    assert_bitwise(p, r, logits(p))


def test_rfactor_twice_gets_fresh_names():
    p = softmax_sum(symbolic=False, n=2, m=16)
    sch = Schedule(p)
    j0, _ = sch.split(sch.loop("s_max", "j"), [None, 4])
    sch.rfactor(j0)
    k0, _ = sch.split(sch.loop("s_max", "j_0"), [2, 2])
    assert sch.rfactor(k0) == "s_max_rf_1"
    assert {"xmax_rf", "xmax_rf_1"} <= {t.name for t in sch.program.tensors}
    assert_bitwise(p, sch.program, logits(p))


def test_rfactor_accepts_a_custom_reducer_that_is_a_builtin():
    p = ProgramBuilder("custom")
    x = p.input("x", (2, 6), "f32")
    y = p.output("y", (2,), "f32")
    mx = make_reducer("mymax", lambda a, b: maximum(b, a), identity=-INF, dtype="f32")
    with p.nest("s", reducer=mx, i=2, j=reduce(6)) as (i, j):
        y[i] = mx.apply(y[i], x[i, j])
    prog = p.build()
    q, _ = rfactor(prog, block="s", loop="j")
    assert_bitwise(prog, q, logits(prog))


def test_rfactor_refuses_a_custom_reducer():
    p = ProgramBuilder("absmax")
    x = p.input("x", (2, 6), "f32")
    y = p.output("y", (2,), "f32")
    am = make_reducer("absmax", lambda a, b: maximum(a, abs(b)), identity=0.0, dtype="f32")
    with p.nest("s", reducer=am, i=2, j=reduce(6)) as (i, j):
        y[i] = am.apply(y[i], x[i, j])
    with pytest.raises(IllegalTransform, match="rfactor of block 's' at loop 'j': the reducer 'absmax' of 's' is not "
                                               "one of sum, prod, max, min"):
        rfactor(p.build(), block="s", loop="j")


def test_rfactor_refuses_a_spatial_loop():
    with pytest.raises(IllegalTransform, match="rfactor of block 's_max' at loop 'i': loop 'i' binds spatial "
                                               "iterations only of 's_max', not a reduce iteration"):
        rfactor(softmax_sum(), block="s_max", loop="i")


def test_rfactor_refuses_a_map():
    with pytest.raises(IllegalTransform, match="block 's_exp' is not a reduction"):
        rfactor(softmax_sum(), block="s_exp", loop="j")


def test_rfactor_refuses_a_loop_binding_spatial_and_reduce_iterations():
    sch = Schedule(softmax_sum(symbolic=False, n=3, m=4))
    fused = sch.fuse([sch.loop("s_sum", "i"), sch.loop("s_sum", "j")])
    with pytest.raises(IllegalTransform, match="loop 'i_j' binds spatial iterations of 's_sum' as well as reduce"):
        sch.rfactor(fused)


@pytest.mark.parametrize("symbolic", [False, True])
def test_rfactor_of_a_split_that_does_not_divide_gives_the_partials_a_predicate(symbolic):
    sch = Schedule(softmax_sum(symbolic=symbolic, n=2, m=10))
    j0, _ = sch.split(sch.loop("s_sum", "j"), [None, 4])
    sch.rfactor(j0)
    q = sch.program
    assert str(q.block("s_sum_rf").where) == f"j_0 * 4 + j_1 < {'M' if symbolic else 10}"
    assert q.block("s_sum").where is None  # every partial result has an element
    assert round_trips(q)
    bound = softmax_sum(symbolic=False, n=2, m=10)
    assert_regrouped_sum(bound, q, logits(bound), terms=10)


def test_rfactor_refuses_partials_that_do_not_start_at_their_first_point():
    """Over j = 4·j0 + j1 - 1, the partial j0 = 0 holds j = 0..2 at j1 = 1..3: its init (at j1 = 0, which is
    j = -1, not an iteration) would never run, which no predicate can fix."""
    p = ProgramBuilder("offset")
    x = p.input("x", (2, 11), "f32")
    y = p.output("y", (2,), "f32")
    with p.loop("i", 2) as i:
        with p.loop("j0", 3) as j0:
            with p.loop("j1", 4) as j1:
                with p.block("s", i=spatial(2, i), j=reduce(11, j0 * 4 + j1 - 1)) as (ii, jj):
                    y[ii] = y[ii] + x[ii, jj]
    with pytest.raises(IllegalTransform, match=r"rfactor of block 's' at loop 'j0': the partial results of 's_rf' "
                                               r"are not all reduced from their loops' first point \(j1 = 0\), "
                                               r"e.g. those of \{ s_rf\[\d, 0\] \}"):
        rfactor(p.build(), block="s", loop="j0")


def test_rfactor_refuses_when_another_block_reads_the_partial_value():
    p = ProgramBuilder("peek")
    x = p.input("x", (2, 4), "f32")
    m = p.temp("m", (2,), "f32")
    y = p.output("y", (2, 4), "f32")
    with p.loop("i", 2) as i:
        with p.loop("j", 4) as j:
            with p.block("run_max", i=spatial(2, i), j=reduce(4, j)) as (ii, jj):
                m[ii] = maximum(m[ii], x[ii, jj])
            with p.block("peek", i=spatial(2, i), j=spatial(4, j)) as (ii, jj):
                y[ii, jj] = exp(x[ii, jj] - m[ii])
    with pytest.raises(IllegalTransform, match="block 'peek' accesses 'm' inside loop 'j', where 'run_max' is being "
                                               "reduced"):
        rfactor(p.build(), block="run_max", loop="j")


def test_rfactor_argument_errors():
    with pytest.raises(IllegalTransform, match="factor_axis must be an integer in 0..1, got 2"):
        rfactor(softmax_sum(), block="s_sum", loop="j", factor_axis=2)
    sch = Schedule(softmax_sum())
    with pytest.raises(IllegalTransform, match="rfactor: .*does not enclose block 's_sum'"):
        sch.rfactor(sch.loop("s_max", "j"), block="s_sum")
    with pytest.raises(IllegalTransform, match="block 's_sum' is not inside a loop named 'k'"):
        sch.rfactor(LoopRef("s_sum", "k"))
    assert len(sch.trace) == 0


def test_rfactor_and_decompose_trace_replay():
    p = softmax_sum(symbolic=False, n=2, m=8)
    sch = Schedule(p)
    j0, _ = sch.split(sch.loop("s_sum", "j"), [None, 4])
    sch.rfactor(j0, factor_axis=0)
    sch.decompose_reduction("s_sum_rf", sch.loop("s_sum_rf", "j_0"))
    assert Schedule(p).replay(sch.trace.to_json()).program == sch.program
    assert Schedule(p).exec_python(sch.trace.python()).program == sch.program
    assert 'sch.rfactor(loop=sch.loop("s_sum", "j_0"), factor_axis=0)' in sch.trace.python()
