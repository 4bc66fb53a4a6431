"""Decode with the query heads of a kv head as the rows of warpgroup products (MLA decode on sm_90a).

The schedule rule (:func:`~polyfuse.ops.schedules.warpgroup_decode_tiling`), and the three code-generator
mechanisms it needs: a warpgroup product folded into its statement one chunk of columns at a time where its
accumulators would not fit a thread's registers (``DotPlan.fold``), the value operand read from the panels of the
key tile (``"panels"``), and registers kept in memory that start at the rolling update's initial value instead of
being read before the loop.  Host runs check the schedules against NumPy on every input variant; the GPU test
runs the kernel the H100 runs.
"""

from __future__ import annotations

import re
import shutil

import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import DecodeTiling, default_schedule, gpu_decode_tiling
from polyfuse.pipeline import build, stages
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu

MLA = "attn_mla_decode"
ANY_UNITS = GpuTuning(decode_warpgroup_units=1)
"""Warpgroup rows wherever they apply (the default asks for 16 units: batch 4 of MLA's 128 heads)."""


def _schedule(tuning: GpuTuning | None = None, device=None, **sizes: int):
    op = ops.get(MLA)
    sizes = op.sizes("decode", {**op.presets["decode"], **sizes})
    return op, sizes, default_schedule(MLA, "decode", op.program("decode", **sizes), target="cuda", device=device,
                                       tuning=tuning)


def _matches_numpy(op, sizes, kernel, seed: int) -> None:
    """``kernel`` equals NumPy within the operator's tolerance on every input variant at both magnitudes."""
    tolerance = op.tolerance("decode", sizes)
    for magnitude in op.magnitudes:
        for variant in ("random", "leading_zeros", "special", "ties"):
            inputs = op.inputs(seed, "decode", sizes, magnitude, variant)
            reference = op.reference(inputs, "decode", sizes)
            got = kernel.run(inputs)
            result = ops.compare({k: got[k] for k in reference}, reference, tolerance)
            assert result.ok, f"{variant} at {magnitude:g}: {result.line()}"


def _plan(sch, target=CUDA) -> str:
    return stages(sch, target).dump("plan")


def test_the_rule_takes_warpgroup_rows_where_the_heads_fill_them_and_enough_blocks_come_of_it():
    # MLA at B=32: 64 heads x 256 value columns per block, 128 blocks, no split; B=8: 32 units, 4 splits of
    # 1024 keys (128 blocks); B=1: 4 units, the mma.sync rule; sm_80: no wgmma; GQA (8 heads per kv head) and
    # ragged caches never.
    t = gpu_decode_tiling(32, 128, 1, 4096, 576, value_dim=512)
    assert (t.heads, t.tile, t.split, t.value_columns) == (64, 64, 4096, 256)
    t = gpu_decode_tiling(8, 128, 1, 4096, 576, value_dim=512)
    assert (t.value_columns, t.splits(4096)) == (256, 4)
    assert gpu_decode_tiling(1, 128, 1, 4096, 576, value_dim=512).value_columns == 0
    assert gpu_decode_tiling(32, 128, 1, 4096, 576, value_dim=512, device=PRESETS["sm_80"]).value_columns == 0
    assert gpu_decode_tiling(32, 64, 8, 4096, 128, value_dim=128).value_columns == 0
    assert gpu_decode_tiling(32, 128, 1, 4000, 576, value_dim=512).value_columns == 0
    # a narrow value is one tile; a short cache keeps two steps per split
    t = gpu_decode_tiling(2, 64, 1, 256, 128, value_dim=128, tuning=ANY_UNITS)
    assert (t.value_columns, t.splits(256), t.split // t.tile) == (128, 2, 2)
    assert gpu_decode_tiling(32, 128, 1, 4096, 576, value_dim=512).splits(4096) == 1


def test_the_kernel_plans_as_warpgroup_products_with_values_read_from_the_key_tile():
    # The partial loop: Q·Kᵀ from the kept query tile and the key stage, P·V from registers and the panels of the
    # key stage at 256·dv_0 (no copy of V: Q, two key stages and the barriers fit 227 KB beside a producer
    # warpgroup), P·V folded into O 64 columns at a time (128 registers of O, 32 of a chunk).
    _, _, sch = _schedule(B=32, Skv=4096)
    plan = _plan(sch)
    assert "grid b < 32 x i < 1 x h_0 < 2 x dv_0 < 2;" in plan
    assert "warps 4-7 copy the operand tiles into 2 stages" in plan
    assert re.search(r"read from the panels of pf_fb\d+, the tile of score, from element", plan)
    # P·V accumulates into O's registers (its 64 x 256 f32 accumulators would not fit beside O's): whole, no chunks
    assert "pv's product accumulates into pv's registers" in plan
    assert "64x256x64 wgmma.m64n128k16 (f16 operands), one per warpgroup of 64 rows and 128 columns of b\n" in plan
    assert "shared memory: 221216 bytes" in plan
    # accumulated from zero, it is issued 64 columns at a time, each chunk folded into O before the next
    apart = _plan(sch, CUDA.with_options(accumulate_products=False))
    assert "64x256x64 wgmma.m64n64k16 (f16 operands), one per warpgroup of 64 rows and 64 columns of b, each " \
           "folded into the statement before the next (registers)" in apart


def test_split_partials_start_at_the_rolling_updates_initial_value():
    # With splits the loop's registers are written back to the partial tensors, but its first iteration reads
    # only the rolling update's constant: they are not read before the loop.
    _, _, sch = _schedule(B=8, Skv=4096)
    plan = _plan(sch)
    assert "x ax1_0 < 4;" in plan
    assert re.search(r"registers: pv_rf in pf_fr_pv_rf_\d+\[32\]\[4\] \(written back after\)", plan)
    assert "read before" not in plan


def test_without_shared_tiles_the_values_are_copied_and_the_loop_copies_at_the_top_of_each_iteration():
    # V copied on its own: with two stages of K and V the loop would not fit, so it is planned again with each
    # iteration's tiles copied at its top (one buffer each).
    _, _, sch = _schedule(B=32, Skv=4096)
    plan = _plan(sch, CUDA.with_options(share_tiles=False))
    assert "read from the panels" not in plan
    assert "operands copied at the top of each iteration" in plan
    assert "shared memory: 180224 bytes" in plan
    # the plan and the source say so (the source's options line is the program's, prefetch=on)
    assert re.search(r"planned with prefetch=off \(operand tiles copied a stage ahead would take \d+ bytes", plan)
    source = stages(sch, CUDA.with_options(share_tiles=False)).source.text
    assert re.search(r"// polyfuse_attn_mla_decode_k\d: planned with prefetch=off", source)


@pytest.mark.nvcc
@pytest.mark.parametrize("sizes", [{"B": 32, "Skv": 4096}, {"B": 8, "Skv": 1024}])
def test_warpgroup_decode_compiles_for_sm90a(sizes):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    _, _, sch = _schedule(**sizes)
    source = stages(sch, CUDA).source
    assert re.search(r"pf::wgmma_m64n(64|128)k16_f16_rs<1, 0>", source.text)
    compile_gpu(source.text, f"mla_wg_{sizes['B']}", "cuda", source.target.arch,
                options=CompileOptions(werror=True), compile_only=True)


@pytest.mark.parametrize("sizes", [
    {"B": 2, "H": 64, "Skv": 256, "Dv": 512, "Drope": 64},   # two value tiles, 2 splits of 2 steps
    {"B": 1, "H": 128, "Skv": 512, "Dv": 256, "Drope": 64},  # two head groups, one value tile
])
def test_warpgroup_decode_schedules_match_numpy_on_the_host(sizes):
    op, sizes, sch = _schedule(ANY_UNITS, **sizes)
    assert "recompute_at(block='qk'" in sch.trace.python()  # (the scores per value tile: warpgroup rows taken)
    _matches_numpy(op, sizes, build(sch, "cpp"), seed=5)


def test_an_explicit_tiling_with_value_columns_is_honoured():
    from polyfuse.ops.schedules import _attention_decode_gpu
    from polyfuse.transforms import Schedule

    op = ops.get(MLA)
    sizes = op.sizes("decode", {"B": 1, "H": 64, "Skv": 256, "Dv": 128, "Drope": 64})
    sch = Schedule(op.program("decode", **sizes))
    _attention_decode_gpu(sch, DecodeTiling(64, 64, 256, value_columns=64))
    plan = _plan(sch)
    assert "dv_0 < 2" in plan


@pytest.mark.gpu
def test_warpgroup_decode_matches_numpy_on_the_gpu():
    from polyfuse.runtime.loaders import loader

    try:
        device = loader("cuda").device_spec()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no CUDA device: {e}")
    if not device.wgmma:
        pytest.skip("needs a device with wgmma (sm_90a)")
    op, sizes, sch = _schedule(device=device, B=8, Skv=512)
    kernel = build(sch, "cuda")
    assert "wgmma" in kernel.kernel_source.text
    _matches_numpy(op, sizes, kernel, seed=7)
