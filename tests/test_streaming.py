"""Streaming loads (:mod:`polyfuse.emit_cpp.streaming`): which kernels load which tensors evict-first, that the
proof of "read once" refuses what is read by several blocks, that the CUDA source uses ``ld.global.cs`` there
and compiles, and (marked ``gpu``) that the hint changes no bit of any output."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CodegenOptions, Target, emit_planned, gpu_plan
from polyfuse.errors import BackendUnavailable
from polyfuse.ir import ProgramBuilder, reduce
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles
from polyfuse.tiling.skip import skip_masked_tiles
from polyfuse.transforms.schedule import Schedule

H100 = PRESETS["sm_90a"]
REDUCTIONS = {"logsumexp": {"inp"}, "softmax_sum": {"inp"}, "l2norm_stable": {"x"}, "sum_sum": {"x1", "x2"},
              "variance": {"x"}}
"""Row kernels whose outputs are values per row, and the inputs they stream."""
ROWS_WRITTEN = ("softmax", "rmsnorm_amax", "layernorm_stats")


def _plan(name: str, mode: str = "default", options: CodegenOptions | None = None, **sizes: int):
    op = ops.get(name)
    sizes = {**op.presets[mode], **sizes}
    sch = default_schedule(name, mode, op.program(mode, **sizes), target="cuda", options=options)
    target = Target("cuda", H100, options or CodegenOptions())
    gpu, plan = gpu_plan(skip_masked_tiles(to_tiles(sch.program)), target)
    return gpu, plan, target


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_row_reductions_stream_their_inputs(name):
    gpu, plan, target = _plan(name)
    (kernel,) = plan.kernels
    assert kernel.streamed == frozenset(REDUCTIONS[name])
    assert "read once, loaded evict-first" in str(plan)
    text = emit_planned(gpu, plan, target).text
    assert text.count("pf::load_once(") == len(REDUCTIONS[name])  # one vector load per row tile (in a loop)
    # the option turns it off
    _, plain, _ = _plan(name, options=CodegenOptions(streaming_loads=False))
    assert plain.kernels[0].streamed == frozenset()


@pytest.mark.parametrize("name", ROWS_WRITTEN)
def test_kernels_writing_their_rows_keep_normal_loads(name):
    _, plan, _ = _plan(name)
    assert all(k.streamed == frozenset() for k in plan.kernels)


@pytest.mark.parametrize("name,mode", [("attn_global", "decode"), ("attn_gqa", "decode"), ("attn_causal", "prefill")])
def test_attention_keeps_normal_loads(name, mode):
    # decode's key and value copies measured slower with the hint; prefill's keys are read by every query block
    _, plan, _ = _plan(name, mode)
    assert all(k.streamed == frozenset() for k in plan.kernels)


def test_rows_taking_a_whole_sm_keep_normal_loads():
    # rows of 32768 f32: one block of 1024 threads per SM (measured slower with the hint)
    _, plan, _ = _plan("logsumexp", M=32768)
    (kernel,) = plan.kernels
    assert kernel.blocks_per_sm == 1 and kernel.streamed == frozenset()


def _weighted_sum():
    p = ProgramBuilder("weighted_sum")
    n = p.size("N")
    x = p.input("x", (n, 1024), "f32")
    w = p.input("w", (1024,), "f32")
    o = p.output("o", (n,), "f32")
    with p.nest("s", i=n, j=reduce(1024)) as (i, j):
        o[i] = o[i] + x[i, j] * w[j]
    return p.build()


def test_a_row_every_block_reads_is_not_streamed():
    # w is read by every row's block: not injective over the grid (a symbolic number of rows); x is
    target = Target("cuda", H100, CodegenOptions())
    gpu, plan = gpu_plan(skip_masked_tiles(to_tiles(Schedule(_weighted_sum()).program)), target)
    (kernel,) = plan.kernels
    assert kernel.streamed == frozenset({"x"})
    text = emit_planned(gpu, plan, target).text
    assert "pf::load_once(reinterpret_cast<const uint4*>(&x[" in text
    assert "pf::load_once(reinterpret_cast<const uint4*>(&w[" not in text


@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_streamed_sources_compile_for_sm90a(name):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    gpu, plan, target = _plan(name, **ops.get(name).sizes("default"))
    source = emit_planned(gpu, plan, target)
    assert "pf::load_once(" in source.text
    compile_gpu(source.text, name, "cuda", "sm_90a", options=CompileOptions(werror=True), compile_only=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_streaming_changes_no_bit(name):
    from polyfuse.pipeline import build

    op = ops.get(name)
    sizes = op.sizes("default")
    program = op.program("default", **sizes)
    plain = CodegenOptions(streaming_loads=False)
    try:
        streamed = build(default_schedule(name, "default", program, target="cuda"), "cuda", sizes=sizes)
        normal = build(default_schedule(name, "default", program, target="cuda", options=plain), "cuda",
                       sizes=sizes, codegen=plain)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    assert "pf::load_once(" in streamed.kernel_source.text
    assert "pf::load_once(" not in normal.kernel_source.text
    for variant in VARIANTS:
        for magnitude in op.magnitudes:
            inputs = op.inputs(1, "default", sizes, magnitude, variant=variant)
            a, b = streamed.run(inputs), normal.run(inputs)
            assert a.keys() == b.keys()
            for out in a:
                assert np.array_equal(a[out], b[out], equal_nan=True), (out, variant, magnitude)
