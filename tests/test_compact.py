"""compact_buffers: temporaries shrink to what one iteration of their allocation loop touches.

Every compacted program is run against the program it came from: the
interpreter executes sequentially, so one buffer reused by all iterations must
give bitwise the same outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from ir_programs import softmax_sum, softmax_sum_split

import polyfuse.ops as ops
from polyfuse.errors import IllegalTransform
from polyfuse.ir import ProgramBuilder, const, interpret, maximum, reduce, spatial
from polyfuse.ir.expr import Const
from polyfuse.ir.stmt import Loop, Program, walk_stmts
from polyfuse.transforms import Schedule
from polyfuse.transforms.compact import ALLOC, compact_buffers, compaction
from polyfuse.transforms.compute_at import reverse_compute_at
from polyfuse.transforms.rolling_update import rolling_update
from polyfuse.transforms.tile import tile

MODE = "prefill"
TILE = 8


def assert_bitwise_equal(a: Program, b: Program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    want, got = interpret(a, inputs), interpret(b, inputs)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name!r}")
    return got


def shape(p: Program, tensor: str) -> list[int]:
    return [int(d.value) if isinstance(d, Const) else str(d) for d in p.tensor(tensor).shape]


def allocations(p: Program) -> dict[str, str]:
    """Tensor -> name of the loop annotated as its allocation loop."""
    return {v: s.var.name for s in walk_stmts(p.body) if isinstance(s, Loop) for k, v in s.annotations if k == ALLOC}


# ------------------------------------------------------------------ fused attention (the motivating case)

def fused_attention(name: str) -> Program:
    """Tile qk 8×8, score under j_0, rolling updates of the three reductions, out under i_0."""
    p = ops.get(name).program(MODE)
    q, loops = tile(p, block="qk", loops=["i", "j"], sizes=[TILE, TILE])
    i0, j0 = loops[0], loops[1]
    q = reverse_compute_at(q, block="score", loop_block="qk", loop=j0)
    for blk in ["row_max", "row_sum", "pv"]:
        q, _ = rolling_update(q, block=blk, loop_block="qk", loop=j0)
    return reverse_compute_at(q, block="out", loop_block="qk", loop=i0)


@pytest.fixture(scope="module", params=["attn_causal", "attn_global"])
def attention(request):
    fused = fused_attention(request.param)
    return request.param, fused, compaction(fused)


def test_fused_attention_temporaries_become_tiles(attention):
    name, fused, result = attention
    p = result.program
    s = ops.get(name).sizes(MODE)["Sq"]
    assert shape(fused, "qk") == [1, 2, s, s]
    assert shape(p, "qk") == shape(p, "score") == [1, 1, TILE, TILE]
    assert shape(p, "row_sum_rf") == [1, 1, TILE, 1]
    assert shape(p, "pv_rf")[-1] == 1 and shape(fused, "pv_rf")[-1] == s // TILE  # one key tile at a time
    for t in ("row_max", "row_sum", "row_max_prev"):
        assert shape(p, t) == [1, 1, TILE]
    assert shape(p, "pv") == [1, 1, TILE, 16]
    assert not [t.name for t in p.temps if shape(p, t.name)[-2:] == [s, s]]
    assert {t.name: t.shape for t in p.inputs + p.outputs} == {t.name: t.shape for t in fused.inputs + fused.outputs}
    assert allocations(p) == {"qk": "j_0", "score": "j_0", "row_sum_rf": "j_0", "pv_rf": "j_0",
                              "row_max_prev": "j_0", "row_max": "i_0", "row_sum": "i_0", "pv": "i_0"}
    assert not result.skipped
    assert {c.tensor: c.loops for c in result.compacted}["qk"] == ("b", "h", "i_0", "j_0")


def test_fused_attention_indices_are_tile_local(attention):
    p = attention[2].program
    text = str(p)
    assert "qk[b, 0, i % 8, j % 8] = qk[b, 0, i % 8, j % 8] + " in text
    assert "score[b, 0, i % 8, ax1]" in text  # j_0 * 8 + ax1 minus j_0 * 8, read by the per-tile reductions
    assert "pv_rf[b, 0, i % 8, dv, 0]" in text
    assert "out[b, h, i, dv] = cast(\"f16\", pv[b, 0, i % 8, dv] / row_sum[b, 0, i % 8])" in text


@pytest.mark.slow  # ~30 s each: the interpreter cannot run the `i % 8` tile loops as NumPy axes yet
def test_fused_attention_interprets_bitwise_equal_and_within_tolerance(attention):
    name, fused, result = attention
    op = ops.get(name)
    sizes = op.sizes(MODE)
    inputs = op.inputs(seed=1, mode=MODE, sizes=sizes)
    got = assert_bitwise_equal(fused, result.program, inputs)
    check = ops.compare(got, op.reference(inputs, MODE, sizes), op.tolerance(MODE, sizes))
    assert check.ok, check.line()


# ------------------------------------------------------------------ Neptune Fig. 1c and tiled softmax

def test_figure_1c_softmax_keeps_one_row_of_max_and_previous_max():
    fused, _ = rolling_update(softmax_sum(symbolic=False, n=5, m=7), block="s_sum", loop_block="s_max", loop="j")
    result = compaction(fused)
    p = result.program
    assert [str(c) for c in result.compacted] == ["xmax: [5] -> [1] at loop i", "xmax_prev: [5] -> [1] at loop i/j"]
    assert allocations(p) == {"xmax": "i", "xmax_prev": "j"}
    assert "xmax_prev[0] = select(eq(t, 0), -INF, xmax[0])" in str(p)
    assert shape(p, "xsum") == [5]  # outputs never shrink
    inputs = {"inp": np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32) * 4}
    assert_bitwise_equal(fused, p, inputs)


def test_figure_1c_with_symbolic_sizes():
    fused, _ = rolling_update(softmax_sum(), block="s_sum", loop_block="s_max", loop="j")
    p = compact_buffers(fused)
    assert shape(p, "xmax") == shape(p, "xmax_prev") == [1]
    inputs = {"inp": np.random.default_rng(1).standard_normal((3, 9)).astype(np.float32)}
    assert_bitwise_equal(fused, p, inputs)


def test_split_rows_with_a_partial_last_tile():
    p = softmax_sum_split()  # i = i0 * 4 + i1 < 10; s_exp and s_sum share the j loop
    result = compaction(p)
    assert [str(c) for c in result.compacted] == ["xmax: [10] -> [1] at loop i0/i1",
                                                  "xexp: [10, 6] -> [1, 1] at loop i0/i1/j"]
    inputs = {"inp": np.random.default_rng(2).standard_normal((10, 6)).astype(np.float32)}
    assert_bitwise_equal(p, result.program, inputs)


def test_producer_computed_at_a_row_tile_keeps_the_tile_with_modulo_indices():
    sch = Schedule(softmax_sum(symbolic=False, n=10, m=6))
    i0, _ = sch.split(sch.get_loops("s_sum")[0], [None, 4])
    sch.compute_at("s_exp", i0)
    result = compaction(sch.program)
    p = result.program
    assert shape(p, "xexp") == [4, 6]  # 4 rows per tile; the last tile has only 2 (rows 8, 9)
    assert "xexp[i % 4, j]" in str(p)
    assert allocations(p) == {"xexp": "i_0"}
    assert [s.tensor for s in result.skipped] == ["xmax"]
    assert "no loop encloses all the blocks" in result.skipped[0].reason
    inputs = {"inp": np.random.default_rng(3).standard_normal((10, 6)).astype(np.float32)}
    assert_bitwise_equal(sch.program, p, inputs)


def test_compacting_twice_changes_nothing_more():
    fused, _ = rolling_update(softmax_sum(symbolic=False, n=4, m=6), block="s_sum", loop_block="s_max", loop="j")
    once = compact_buffers(fused)
    again = compaction(once)
    assert again.program == once
    assert not again.compacted and {s.tensor for s in again.skipped} == {"xmax", "xmax_prev"}


# ------------------------------------------------------------------ values that flow across iterations

def running_sum(n: int = 3, m: int = 5) -> Program:
    """c[i, j + 1] = c[i, j] + x[i, j] (a prefix sum along j), read in the same (i, j) iteration."""
    p = ProgramBuilder("running_sum")
    x = p.input("x", (n, m), "f32")
    c = p.temp("c", (n, m + 1), "f32")
    y = p.output("y", (n, m), "f32")
    with p.loop("i", n) as i:
        with p.block("zero", i=spatial(n, i)) as (ii,):
            c[ii, 0] = 0.0
        with p.loop("j", m) as j:
            with p.block("scan", i=spatial(n, i), j=spatial(m, j)) as (ii, jj):
                c[ii, jj + 1] = c[ii, jj] + x[ii, jj]
            with p.block("emit", i=spatial(n, i), j=spatial(m, j)) as (ii, jj):
                y[ii, jj] = c[ii, jj + 1] * 2.0
    return p.build()


def test_prefix_sum_keeps_the_scanned_dimension_whole():
    p = running_sum()
    result = compaction(p)
    assert [str(c) for c in result.compacted] == ["c: [3, 6] -> [1, 6] at loop i"]  # not at j: values cross it
    assert "c[0, j + 1] = c[0, j] + x[i, j]" in str(result.program)
    inputs = {"x": np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)}
    assert_bitwise_equal(p, result.program, inputs)


def test_accumulation_across_the_only_loop_is_kept_and_the_report_names_the_flow():
    n = 6
    b = ProgramBuilder("accumulate")
    x = b.input("x", (n,), "f32")
    acc = b.temp("acc", (n,), "f32")
    y = b.output("y", (n,), "f32")
    with b.loop("t", n) as t:
        with b.block("first", k=spatial(1, t)) as (k,):
            acc[k] = x[k]
        with b.block("scan", k=spatial(n - 1, t - 1)) as (k,):
            acc[k + 1] = maximum(acc[k], x[k + 1])
        with b.block("emit", k=spatial(n, t)) as (k,):
            y[k] = acc[k]
    p = b.build()
    result = compaction(p)
    assert result.program == p and not result.compacted
    (skip,) = result.skipped
    assert skip.tensor == "acc"
    assert "accessed in its whole extent at program level" in skip.reason
    assert ("not deeper: flow first -> scan on acc crosses iterations of loop 't' "
            "(e.g. { first[k = 0] -> scan[k' = 0] })") in skip.reason
    inputs = {"x": np.random.default_rng(5).standard_normal(n).astype(np.float32)}
    assert_bitwise_equal(p, result.program, inputs)


def test_a_reduction_accumulated_across_a_loop_is_allocated_outside_it():
    p = ProgramBuilder("row_max_then_scale")
    x = p.input("x", (4, 6), "f32")
    m = p.temp("m", (4,), "f32")
    y = p.output("y", (4,), "f32")
    with p.loop("i", 4) as i:
        with p.loop("j", 6) as j:
            with p.block("rmax", i=spatial(4, i), j=reduce(6, j)) as (ii, jj):
                m[ii] = maximum(m[ii], x[ii, jj])
        with p.block("scale", i=spatial(4, i)) as (ii,):
            y[ii] = m[ii] * 3.0
    prog = p.build()
    result = compaction(prog)
    assert [str(c) for c in result.compacted] == ["m: [4] -> [1] at loop i"]
    inputs = {"x": np.random.default_rng(6).standard_normal((4, 6)).astype(np.float32)}
    assert_bitwise_equal(prog, result.program, inputs)


# ------------------------------------------------------------------ the plain catalog: nothing wrong

@pytest.mark.parametrize("name,mode", [(n, m) for n in ops.names() for m in ops.get(n).modes])
def test_catalog_programs_interpret_bitwise_equal_after_compaction(name, mode):
    op = ops.get(name)
    p = op.program(mode)
    result = compaction(p)
    assert {c.tensor for c in result.compacted} | {s.tensor for s in result.skipped} == {t.name for t in p.temps}
    assert_bitwise_equal(p, result.program, op.inputs(0, mode))


def test_staging_a_compacted_tensor_is_refused():
    """cache_read/cache_write copy outside the top-level statement, where a buffer compact_buffers
    allocated per iteration of a loop does not exist (a fuzzer find: the C++ did not compile)."""
    fused, _ = rolling_update(softmax_sum(symbolic=False, n=5, m=7), block="s_sum", loop_block="s_max", loop="j")
    sch = Schedule(compact_buffers(fused))
    with pytest.raises(IllegalTransform, match="s_max_save, s_sum access"):
        sch.cache_write("s_max", "shared")
    with pytest.raises(IllegalTransform, match="s_max write"):
        sch.cache_read("s_sum", "xmax", "shared")


def test_a_step_that_moves_an_access_out_of_an_allocation_loop_is_refused():
    """decompose_reduction puts the init before the reduce loop; after compact_buffers allocated the
    accumulator per iteration of that loop, the init would write a tensor that does not exist there (a
    fuzzer find: the C++ did not compile)."""
    p = ProgramBuilder("prod")
    x = p.input("x", (3, 1), "f64")
    r = p.temp("r", (3,), "f64")  # never read: compact_buffers allocates it per iteration of j
    out = p.output("out", (3,), "f64")
    with p.nest("s", i=3, j=reduce(1), init=const(1.0, "f64")) as (i, j):
        r[i] = r[i] * x[i, j]
    with p.nest("e", i=3) as (i,):
        out[i] = x[i, 0] + 1.0
    sch = Schedule(p.build())
    sch.compact_buffers()
    before = sch.program
    with pytest.raises(IllegalTransform, match=r"sch.decompose_reduction: after it, block 's_init' accesses 'r' "
                                               r"outside the loop where compact_buffers allocated it"):
        sch.decompose_reduction("s", sch.loop("s", "j"))
    assert sch.program == before
