"""recompute_at: a producer placed under a consumer's loop with one copy per iteration that needs it.

Expected IR after the step (the producer's tensor widened by the replicating loops, the readers indexing
their copy), results bitwise equal to the original program (every copy computes the same values in the
same order), halos of a stencil, trace replay, the refusals, and the naive fusion that rolls a GEMM
into the recomputed producer's k loop while keeping its column tile.
"""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.errors import IllegalTransform
from polyfuse.ir import Program, ProgramBuilder, Var, interpret, maximum, reduce
from polyfuse.ir.expr import Const
from polyfuse.ir.printer import program_from_source
from polyfuse.transforms import Schedule
from polyfuse.transforms.tree import loops_of


def quant_gemm(M: int = 128, K: int = 96, N: int = 128) -> Program:
    return ops.get("quant_gemm").program("default", M=M, K=K, N=N)


def tiled(program: Program, tile: int = 64) -> tuple[Schedule, object]:
    """s_gemm tiled over (i, n); returns the schedule and the column-tile loop n_0."""
    sch = Schedule(program)
    i, n, _ = sch.get_loops("s_gemm")
    _, n0, _, _ = sch.tile([i, n], [tile, tile])
    return sch, n0


def inputs_of(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.uniform(-1.0, 1.0, tuple(int(d.value) for d in t.shape)).astype(t.dtype.numpy)  # type: ignore[attr-defined]
            for t in program.inputs}


def assert_bitwise(before: Program, after: Program) -> None:
    inputs = inputs_of(before)
    want, got = interpret(before, inputs), interpret(after, inputs)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name!r}")


def stencil(n: int = 18) -> Program:
    """``y = 2x``; ``z[i] = y[i] + y[i + 1]``: each tile of z reads one element past its own y."""
    p = ProgramBuilder("stencil")
    x = p.input("x", (n,), "f32")
    y = p.temp("y", (n,), "f32")
    z = p.output("z", (n - 1,), "f32")
    with p.nest("s_y", i=n) as (i,):
        y[i] = x[i] * 2.0
    with p.nest("s_z", i=n - 1) as (i,):
        z[i] = y[i] + y[i + 1]
    return p.build()


# ------------------------------------------------------------------ the step

def test_amax_gets_one_copy_per_column_tile():
    before = quant_gemm()
    sch, n0 = tiled(before)
    sch.recompute_at("s_amax", n0)
    p = sch.program
    assert [int(d.value) for d in p.tensor("amax").shape] == [2, 128]  # type: ignore[attr-defined]
    amax = p.block("s_amax")
    assert [iv.var.name for iv in amax.iters] == ["n_0", "i", "k"]
    assert [lp.var.name for lp in loops_of(p, "s_amax")] == ["i_0", "n_0", "ax0", "ax1"]
    assert amax.bindings[0] == Var("n_0") and amax.where is None
    (read,) = [ld for ld in _loads(p.block("s_gemm")) if ld.tensor.name == "amax"]
    assert str(read.indices[0]) == "n // 64"
    assert program_from_source(str(p)) == p
    assert_bitwise(before, p)


def test_without_overlap_it_is_compute_at():
    program = quant_gemm()
    sch = Schedule(program)
    i, _, _ = sch.get_loops("s_gemm")
    i0, _ = sch.split(i, [None, 32])
    plain = Schedule(sch.program)
    sch.recompute_at("s_amax", i0)
    plain.compute_at("s_amax", plain.loop("s_gemm", "i_0"))
    assert sch.program == plain.program


def test_stencil_copies_hold_their_halo():
    before = stencil()
    sch = Schedule(before)
    (i,) = sch.get_loops("s_z")
    i0, _ = sch.split(i, [None, 4])
    with pytest.raises(IllegalTransform, match="placement does not recompute"):
        sch.compute_at("s_y", i0)
    sch.recompute_at("s_y", i0)
    y = sch.program.block("s_y")
    assert str(y.where) == "(i_0 * 4 <= i) & (i < i_0 * 4 + 5)"
    assert_bitwise(before, sch.program)
    sch.compact_buffers()
    assert [int(d.value) for d in sch.program.tensor("y").shape] == [1, 5]  # type: ignore[attr-defined]
    assert_bitwise(before, sch.program)


def test_trace_replays():
    sch, n0 = tiled(quant_gemm())
    sch.recompute_at("s_amax", n0)
    assert "sch.recompute_at(block='s_amax', loop=sch.loop(\"s_gemm\", \"n_0\"))" in sch.trace.python()
    again = Schedule(sch.original).replay(sch.trace)
    assert again.program == sch.program


def test_symbolic_sizes():
    p = ProgramBuilder("rowscale")
    M, N, K = p.size("M"), p.size("N"), p.size("K")
    a = p.input("a", (M, K), "f32")
    w = p.input("w", (K, N), "f32")
    amax = p.temp("amax", (M,), "f32")
    c = p.output("c", (M, N), "f32")
    with p.nest("s_amax", i=M, k=reduce(K)) as (i, k):
        amax[i] = maximum(amax[i], abs(a[i, k]))
    with p.nest("s_gemm", i=M, n=N, k=reduce(K)) as (i, n, k):
        c[i, n] = c[i, n] + a[i, k] / amax[i] * w[k, n]
    before = p.build()
    sch, n0 = tiled(before, 16)
    sch.recompute_at("s_amax", n0)
    assert not isinstance(sch.program.tensor("amax").shape[0], Const)
    sizes = {"M": 40, "N": 36, "K": 20}
    assert_bitwise(before.bind(**sizes), sch.program.bind(**sizes))


# ------------------------------------------------------------------ refusals

def test_refuses_a_reader_outside_the_loop():
    p = ProgramBuilder("two_readers")
    a = p.input("a", (8, 4), "f32")
    amax = p.temp("amax", (8,), "f32")
    y = p.output("y", (8, 4), "f32")
    z = p.output("z", (8,), "f32")
    with p.nest("s_amax", i=8, k=reduce(4)) as (i, k):
        amax[i] = maximum(amax[i], abs(a[i, k]))
    with p.nest("s_scale", i=8, k=4) as (i, k):
        y[i, k] = a[i, k] / amax[i]
    with p.nest("s_copy", i=8) as (i,):
        z[i] = amax[i]
    sch = Schedule(p.build())
    k = sch.loop("s_scale", "k")
    k0, _ = sch.split(k, [None, 2])
    sch.reorder([k0, sch.loop("s_scale", "i")])
    with pytest.raises(IllegalTransform, match=r"s_copy also read 'amax' outside loop 'k_0'"):
        sch.recompute_at("s_amax", k0)


def test_refuses_an_output():
    p = ProgramBuilder("output_max")
    a = p.input("a", (8, 4), "f32")
    amax = p.output("amax", (8,), "f32")
    y = p.output("y", (8, 4), "f32")
    with p.nest("s_amax", i=8, k=reduce(4)) as (i, k):
        amax[i] = maximum(amax[i], abs(a[i, k]))
    with p.nest("s_scale", i=8, k=4) as (i, k):
        y[i, k] = a[i, k] / amax[i]
    sch = Schedule(p.build())
    with pytest.raises(IllegalTransform, match="writes output tensor 'amax'; only a temporary"):
        sch.recompute_at("s_amax", sch.loop("s_scale", "k"))


def test_refuses_a_second_writer_and_a_placed_block():
    sch, n0 = tiled(quant_gemm())
    sch.decompose_reduction("s_amax", sch.loop("s_amax", "k"))
    with pytest.raises(IllegalTransform, match=r"'amax' is also written by s_amax_init"):
        sch.recompute_at("s_amax", n0)
    sch, n0 = tiled(quant_gemm())
    sch.recompute_at("s_amax", n0)
    with pytest.raises(IllegalTransform, match="'s_amax' is already under loop 'n_0'"):
        sch.recompute_at("s_amax", sch.loop("s_gemm", "n_0"))


# ------------------------------------------------------------------ rolling into the recomputed producer

def test_rolling_keeps_the_column_tile_of_the_consumer():
    """After recompute_at the GEMM rolls into amax's k tiles: its column iteration keeps ``n_0·64 + n_1``
    (n_0 encloses the rolling loop) instead of a loop over all N columns in every column tile."""
    op = ops.get("quant_gemm")
    sizes = {"M": 128, "K": 96, "N": 128}
    sch, n0 = tiled(op.program("default", **sizes))
    sch.recompute_at("s_amax", n0)
    _, _, row, k = sch.get_loops("s_amax")
    k0, k1 = sch.split(k, [None, 32], names=["k_0", "k_1"])
    sch.reorder([k0, row, k1])
    sch.rolling_update("s_gemm", k0)
    p = sch.program
    local = p.block("s_gemm_rf")
    assert str(local.binding_of("n")) == "n_0 * 64 + n_1"
    assert [lp.var.name for lp in loops_of(p, "s_gemm_rf")] == ["i_0", "n_0", "k_0", "n_1", "ax0", "k_1"]
    inputs = op.inputs(0, "default", sizes, 1.0)
    result = ops.compare(interpret(p, inputs), op.reference(inputs, "default", sizes), op.tolerance("default", sizes))
    assert result.ok, result.line()


def _loads(block):
    from polyfuse.ir.visit import loads

    return loads(block.store.value)


def _value_columns_per_tile(sizes: dict[str, int]) -> tuple[object, dict[str, int], Schedule]:
    """MLA decode with its value columns cut into tiles: the score chain recomputed per tile of ``pv``'s ``dv``
    (16 heads and 32 value columns per tile), then split-k over the keys and a rolling loop inside each split."""
    op = ops.get("attn_mla_decode")
    sizes = op.sizes("decode", sizes)
    sch = Schedule(op.program("decode", **sizes))
    _, h, i, dv, _ = sch.get_loops("pv")
    h0, h1 = sch.split(h, [None, 16])
    dv0, _ = sch.split(dv, [None, 32])
    sch.reorder([i, h0, dv0, h1])
    sch.reverse_compute_at("out", dv0)
    for block in ("row_sum", "p_exp", "row_max", "score", "qk"):
        sch.recompute_at(block, sch.loop("pv", "dv_0"))
    *_, rows, keys, _ = sch.get_loops("qk")
    split, step, tile = sch.split(keys, [None, 2, 64])
    sch.reorder([split, step, rows, tile])
    sch.reverse_compute_at("score", split)
    sch.split_k_update("row_sum", split)
    sch.split_k_update("pv", split, factor_axis=3)
    sch.reverse_compute_at("score", step)
    for block in ("row_max_rf", "row_sum_rf", "pv_rf"):
        sch.rolling_update(block, step)
    sch.compact_buffers()
    return op, sizes, sch


def test_a_consumer_of_producers_recomputed_per_tile_of_its_loop_fuses():
    # pv reads the copies of its producers at ``dv // 32`` (the tile of its value column): in loop variables
    # ``(32·dv_0 + ax1) // 32``, which the numerics fold to ``dv_0`` over the consumer's loop ranges, so row_max
    # is the running max of the very scores the term exponentiates and split-k and rolling both prove their
    # repairs.  The fused program (interpreted and as host C++) matches NumPy on every input variant; on the GPU
    # the value-column tiles are a grid loop of the partial kernel.
    from polyfuse.emit_cpp import CUDA, gpu_plan
    from polyfuse.pipeline import build
    from polyfuse.tiling import to_tiles

    op, sizes, sch = _value_columns_per_tile({"B": 2, "Skv": 300, "H": 32, "Dv": 64, "Drope": 16})
    assert "split_k_update(block='pv'" in sch.trace.python()
    kernel = build(sch, "cpp")
    tolerance = op.tolerance("decode", sizes)
    for magnitude in op.magnitudes:
        for variant in ("random", "leading_zeros", "special", "ties"):
            inputs = op.inputs(3, "decode", sizes, magnitude, variant)
            reference = op.reference(inputs, "decode", sizes)
            for got in (interpret(sch.program, inputs), kernel.run(inputs)):
                result = ops.compare({k: got[k] for k in reference}, reference, tolerance)
                assert result.ok, f"{variant} at {magnitude:g}: {result.line()}"
    plan = str(gpu_plan(to_tiles(sch.program), CUDA)[1])
    assert any(line.startswith("kernel") and "dv_0 < 2" in line for line in plan.splitlines())


def test_folding_floor_divisions_needs_the_consumers_ranges():
    # (32·d + x) // 32 is d only where 0 <= x < 32: without ranges, or with a wider x, the index stays.
    from polyfuse.ir import dtypes as dt
    from polyfuse.ir.expr import BinOp, Load
    from polyfuse.ir.stmt import Tensor
    from polyfuse.transforms.numerics import in_loops

    t = Tensor("p", (Const(4, dt.i32),), dt.f32)
    d, x = Var("d", dt.i32), Var("x", dt.i32)
    index = BinOp("//", BinOp("+", BinOp("*", d, Const(32, dt.i32)), x), Const(32, dt.i32))
    load = Load(t, (index,))
    assert in_loops((), load, {"d": 4, "x": 32}) == Load(t, (d,))
    assert in_loops((), load, {"d": 4, "x": 33}) != Load(t, (d,))
    assert in_loops((), load) != Load(t, (d,))
