"""Loops run by groups of a block's warps (a loop bound to ``threadIdx.y``, :mod:`polyfuse.emit_cpp.groups`) and
the decode tiling that uses them (a block's keys split again among its warps,
:func:`~polyfuse.ops.schedules.warp_split_decode_tiling`).

Checked here: the plan runs the bound loop on warp groups, its temporaries and its body's shared memory one copy
per group, its barriers the group's (``__syncwarp`` for one warp, a named barrier for several), one block
barrier after it; a binding to another thread index and a group loop inside another are refused with the loop
named; the host backend runs the bound loop serially (the same program) and the differential check runs it
backwards too (a GPU runs its iterations in no order); every decode of the catalog split
again among warps equals the plain program (interpreter, host C++) on random and edge inputs at ragged key
counts, and compiles for sm_90a with ``-Werror`` (and for HIP, one wavefront per group).  The ``gpu`` tests run
the warp-split kernels against NumPy and against the catalog's default kernel on every input variant and
magnitude, twice in a row, with groups of one warp and of several.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.differential import check_schedule
from polyfuse.emit_cpp import CUDA, HIP, emit
from polyfuse.emit_cpp.plan import gpu_plan
from polyfuse.errors import PolyfuseError, UnsupportedPattern
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule, gpu_decode_tiling
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.tiling import to_tiles
from polyfuse.transforms.schedule import Schedule
from polyfuse.transforms.tree import loops_of

DECODE = [n for n in ops.names() if "decode" in ops.get(n).modes and n != "attn_mla_decode"]
"""The mma.sync decodes (MLA decode at the catalog's sizes is warpgroup-row decode: no warp split)."""
FORCED = {"decode_warp_steps": 1 << 20, "decode_warp_split_heads": 64}
"""The warp split wherever it fits (the rule's bounds lifted)."""
WARP_SPLIT = GpuTuning(decode_warp_splits=8, decode_warp_tile=16, decode_min_split=1, **FORCED)
VARIANTS = ("random", "leading_zeros", "zero_rows", "ties", "monotone", "special")
WERROR = CompileOptions(werror=True)
RAGGED = (257, 512)
"""Key counts (of 8 warps × 16 keys): a prime (a ragged last split, its last warp part of one key) and whole steps."""


def _schedule(name: str, skv: int, tuning: GpuTuning = WARP_SPLIT, target: str = "cuda"):
    op = ops.get(name)
    sizes = op.sizes("decode", {"Skv": skv})
    return op, sizes, default_schedule(name, "decode", op.program("decode", **sizes), target=target, tuning=tuning)


def _group_loops(plan):
    return [lp for k in plan.kernels for lp in k.loops.values() if lp.group is not None]


# ------------------------------------------------------------------ the tiling rule

def test_the_rule_splits_short_one_row_splits_among_warps_that_fit_and_fill_the_sms():
    # one-row blocks (B = 1, 4096 keys of 64-wide heads): four warps of two steps of 32 keys
    t = gpu_decode_tiling(1, 16, 16, 4096, 64, value_dim=64)
    assert (t.warp_splits, t.warps, t.tile, t.split) == (4, 4, 32, 256) and t.efficiency > 0.9
    assert gpu_decode_tiling(1, 32, 32, 1024, 128, value_dim=128).warp_splits == 4
    # more steps per warp (32768 keys; 128-wide heads at 4096), eight-row blocks (GQA), no split (batch 32): the
    # warps share the tiles
    assert gpu_decode_tiling(1, 16, 16, 32768, 64, value_dim=64).warp_splits == 0
    assert gpu_decode_tiling(1, 32, 32, 4096, 128, value_dim=128).warp_splits == 0
    assert gpu_decode_tiling(1, 64, 8, 4096, 128, value_dim=128).warp_splits == 0
    assert gpu_decode_tiling(32, 64, 64, 4096, 128, value_dim=128).warp_splits == 0
    assert gpu_decode_tiling(1, 16, 16, 4096, 64, value_dim=64, tuning=GpuTuning(decode_warp_splits=1)).warp_splits == 0
    # forced: eight warps at 64-wide heads; at 128-wide heads eight warps' tiles would not fit a block, four do
    forced = gpu_decode_tiling(1, 16, 16, 32768, 64, value_dim=64, tuning=GpuTuning(decode_warp_splits=8, **FORCED))
    assert (forced.warp_splits, forced.warps) == (8, 8) and 16 * forced.splits(32768) <= 132
    wide = gpu_decode_tiling(32, 64, 64, 4096, 128, value_dim=128, tuning=GpuTuning(decode_warp_splits=8, **FORCED))
    assert wide.warp_splits == wide.warps == 4
    # too few keys for two steps of the block's warps: the shared tiles
    assert gpu_decode_tiling(1, 1, 1, 32, 64, value_dim=64, tuning=WARP_SPLIT).warp_splits == 0


# ------------------------------------------------------------------ the plan and the source

def test_a_warp_split_decode_runs_its_warp_loop_on_groups_of_one_warp():
    _, _, sch = _schedule("attn_global", 256)
    tiles = to_tiles(sch.program)
    _, plan = gpu_plan(tiles, CUDA)
    (loop,) = _group_loops(plan)
    (kernel,) = plan.kernels
    assert (loop.group.groups, loop.group.threads, kernel.threads) == (8, 32, 256) and loop.group.stride % 128 == 0
    per_group = [t for t in kernel.shared if t.groups is not None]
    assert {t.name for t in per_group} >= {"score"}  # allocated per step of a warp: one copy per group
    var = loop.group.var
    assert "run by 8 groups of one warp" in str(plan) and f"one copy per warp group of loop {var}" in str(plan)
    text = emit(tiles, CUDA).text
    body = text[text.index("const int pf_group = pf_tid / 32;"):]
    inside = body[:body.index("__syncthreads();")]
    assert "__syncthreads" not in inside and "pf::syncwarp();" in inside  # the warps never wait for each other
    assert f"const int {var} = pf_group;" in inside and f"pf_group * {loop.group.stride}" in inside
    assert re.search(r"reinterpret_cast<float\*>\(pf_smem \+ \d+ \+ \(pf_tid / 32\) \* \d+\)", text)


def _bound(name: str, warps: int, extent: int, thread: str = "threadIdx.y") -> Schedule:
    """``name``'s decode (two splits of ``extent`` parts of two steps of 16 keys) with its keys split again into
    ``extent`` parts, that loop bound to ``thread``, the kernel asking for ``warps`` warps."""
    op = ops.get(name)
    sch = Schedule(op.program("decode", **op.sizes("decode", {"Skv": 64 * extent})))
    _, h, i, j, _ = sch.get_loops("qk")
    split, part, step, keys = sch.split(j, [None, extent, 2, 16])
    sch.reorder([i, h, split, part, step, keys])
    sch.reverse_compute_at("score", split)
    sch.split_k_update("row_sum", split)
    sch.split_k_update("pv", split, factor_axis=3)
    part = sch.loop("qk", part.name)
    sch.reverse_compute_at("score", part)
    sch.split_k_update("row_sum_rf", part)
    sch.split_k_update("pv_rf", part, factor_axis=4)
    step = sch.loop("qk", step.name)
    sch.reverse_compute_at("score", step)
    for block in ("row_max_rf_rf", "row_sum_rf_rf", "pv_rf_rf"):
        sch.rolling_update(block, step)
    sch.bind(sch.loop("qk", part.name), thread)
    sch.compact_buffers()
    sch.warps(sch.loop("qk", split.name), warps)
    return sch


def test_groups_of_several_warps_meet_at_named_barriers():
    tiles = to_tiles(_bound("attn_global", 8, 2).program)
    _, plan = gpu_plan(tiles, CUDA)
    (loop,) = _group_loops(plan)
    assert (loop.group.groups, loop.group.threads) == (2, 128)
    text = emit(tiles, CUDA).text
    assert "pf::named_sync(1 + pf_group, 128);" in text and "const int j_1 = pf_group;" in text


def test_more_iterations_than_groups_loop_over_the_groups_iterations():
    tiles = to_tiles(_bound("attn_global", 2, 8).program)
    text = emit(tiles, CUDA).text
    assert "for (int j_1 = pf_group; j_1 < 8; j_1 += 2)" in text


def test_hip_groups_are_one_wavefront_each():
    tiles = to_tiles(_bound("attn_global", 4, 2).program)
    _, plan = gpu_plan(tiles, HIP)
    (loop,) = _group_loops(plan)
    assert (loop.group.groups, loop.group.threads) == (2, 64)  # two wavefronts idle at the block barrier after it
    text = emit(tiles, HIP).text
    assert "named_sync" not in text and "for (int j_1 = pf_group; j_1 < 2; j_1 += 2)" in text


def test_a_binding_to_another_thread_index_is_refused_with_the_loop_named():
    with pytest.raises(UnsupportedPattern, match=r"loop 'j_1' is bound to threadIdx.x .* bind a loop to threadIdx.y"):
        gpu_plan(to_tiles(_bound("attn_global", 8, 2, "threadIdx.x").program), CUDA)


def test_a_group_loop_inside_another_is_refused():
    sch = _bound("attn_global", 8, 2)
    sch.bind(sch.loop("qk", "j_3"), "threadIdx.y")  # the keys of a step: independent iterations
    with pytest.raises(PolyfuseError, match=r"loop 'j_3' is bound to threadIdx.y inside loop 'j_1'"):
        gpu_plan(to_tiles(sch.program), CUDA)


# ------------------------------------------------------------------ the same program

@pytest.mark.parametrize("name", DECODE)
def test_warp_split_decode_equals_the_plain_program(name):
    # (the host backend runs the bound loop serially: checked on one operator, the one with masked parts)
    op, sizes, sch = _schedule(name, RAGGED[0])
    assert any(lp.thread == "threadIdx.y" for lp in loops_of(sch.program, "qk"))
    inputs = [{k: np.asarray(a) for k, a in op.inputs(0, "decode", sizes, m, v).items()}
              for m in op.magnitudes for v in ("random", "leading_zeros", "ties", "special")]
    report = check_schedule(op.program("decode", **sizes), sch.program, inputs, sizes=[None] * len(inputs),
                            backends=("fused", "cpp") if name == "attn_window" else ("fused",))
    assert not report.wrong, "\n".join(f.line() for f in report.wrong)


def test_the_oracle_runs_bound_loops_backwards():
    # A recurrence bound by hand (Schedule.bind refuses it: the loop carries a dependence): a GPU would run its
    # iterations in no order; the differential check runs them backwards and finds it.
    from polyfuse.ir import ProgramBuilder, spatial

    def recurrence(thread: str | None):
        p = ProgramBuilder("recurrence")
        x = p.input("x", (8,), "f32")
        y = p.output("y", (9,), "f32")
        with p.nest("first", i=1) as (i,):
            y[i] = x[i]
        with p.loop("j", 8, **({"kind": "bound", "thread": thread} if thread else {})) as j:
            with p.block("step", j=spatial(8, j)) as (jj,):
                y[jj + 1] = y[jj] * 0.5 + x[jj]
        return p.build()

    inputs = [{"x": np.arange(1, 9, dtype=np.float32)}]
    report = check_schedule(recurrence(None), recurrence("threadIdx.y"), inputs, backends=())
    assert [f.stage for f in report.wrong] == ["bound loops reversed"]
    assert not check_schedule(recurrence(None), recurrence(None), inputs, backends=()).findings


@pytest.mark.nvcc
@pytest.mark.parametrize("name", DECODE)
def test_warp_split_decode_compiles_for_sm90a(name):
    from polyfuse.runtime.gpu_compiler import compile_gpu

    for skv in RAGGED:
        _, _, sch = _schedule(name, skv)
        source = emit(to_tiles(sch.program), CUDA)
        compile_gpu(source.text, f"{name}_warps_{skv}", "cuda", source.target.arch, options=WERROR, compile_only=True)
    for multi in (_bound("attn_global", 8, 2), _bound("attn_global", 2, 8)):
        source = emit(to_tiles(multi.program), CUDA)
        compile_gpu(source.text, "attn_global_groups", "cuda", source.target.arch, options=WERROR, compile_only=True)


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc")
def test_warp_groups_compile_for_hip():
    from polyfuse.runtime.gpu_compiler import compile_gpu

    source = emit(to_tiles(_bound("attn_global", 4, 2).program), HIP)
    compile_gpu(source.text, "attn_global_groups_hip", "hip", source.target.arch, compile_only=True)


# ------------------------------------------------------------------ on the GPU

GPU_SPLITS = [(name, skv) for name in DECODE for skv in RAGGED]


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "skv"), GPU_SPLITS)
def test_warp_split_decode_matches_numpy_and_the_default_kernel(name, skv):
    op, sizes, sch = _schedule(name, skv)
    _, _, default = _schedule(name, skv, GpuTuning(decode_min_split=1))
    _against(op, sizes, sch, default)


@pytest.mark.gpu
@pytest.mark.parametrize(("warps", "extent"), [(8, 2), (2, 8), (8, 8)])
def test_warp_groups_of_several_warps_and_more_iterations_than_groups_match_numpy(warps, extent):
    op = ops.get("attn_window")  # a window: whole splits and warps' parts masked
    sizes = op.sizes("decode", {"Skv": 64 * extent})
    default = default_schedule("attn_window", "decode", op.program("decode", **sizes), target="cuda")
    _against(op, sizes, _bound("attn_window", warps, extent), default)


def _against(op, sizes: dict, sch: Schedule, other: Schedule) -> None:
    """``sch``'s kernel against NumPy and ``other``'s on every magnitude and input variant, launched twice per
    input (the same bits)."""
    from polyfuse.errors import BackendUnavailable
    from polyfuse.pipeline import build

    try:
        kernel = build(sch, "cuda", sizes=sizes, werror=True)
        reference_kernel = build(other, "cuda", sizes=sizes, werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    tolerance = op.tolerance("decode", sizes)
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(5, "decode", sizes, magnitude, variant)
            first, second = kernel.run(inputs), kernel.run(inputs)
            for key, value in first.items():
                assert np.array_equal(value, second[key], equal_nan=True), f"{variant}: a second launch differs"
            where = f"{variant} at magnitude {magnitude:g}"
            result = ops.compare(first, op.reference(inputs, "decode", sizes), tolerance)
            assert result.ok, f"{where}: {result.line()} worst {result.worst}"
            result = ops.compare(first, {k: np.asarray(v, np.float64) for k, v in reference_kernel.run(inputs).items()},
                                 tolerance)
            assert result.ok, f"{where}, against the default kernel: {result.line()} worst {result.worst}"
