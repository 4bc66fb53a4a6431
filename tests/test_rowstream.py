"""Rows streamed through a block (:mod:`polyfuse.emit_cpp.rowstream`): which row kernels on chip take several rows
per block and why the others do not, the grid sized from the DeviceSpec, warning-free CUDA for sm_90a, and, on a
GPU (marked ``gpu``), that streamed kernels match the one-row-per-block kernels and NumPy on every input variant."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CodegenOptions, Target, emit_planned, gpu_plan, onchip, rowstream
from polyfuse.errors import BackendUnavailable
from polyfuse.ir.expr import BinOp, Const
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu import evaluate
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles
from polyfuse.tiling.skip import skip_masked_tiles

REDUCING = ("softmax_sum", "logsumexp", "l2norm_stable", "sum_sum", "variance")
"""Row operators whose outputs are all one value per row."""
WRITING = ("softmax", "rmsnorm_amax", "layernorm_stats")
"""Row operators that also write a row."""
SWEEP = (1024, 4096, 8192)
ONE_ROW = CodegenOptions(stream_rows=False)
H100 = PRESETS["sm_90a"]


def _rows_of(name: str, rows: int, length: int) -> dict[str, int]:
    return {"B": rows, "L": length} if name == "variance" else {"N": rows, "M": length}


def _plan(name: str, options: CodegenOptions | None = None, device=H100, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes("default"), **sizes}
    sch = default_schedule(name, "default", op.program("default", **sizes), target="cuda", options=options)
    target = Target("cuda", device, options or CodegenOptions())
    gpu, plan = gpu_plan(skip_masked_tiles(to_tiles(sch.program)), target)
    return gpu, plan, target


@pytest.mark.parametrize("name", REDUCING)
@pytest.mark.parametrize("length", SWEEP)
def test_reducing_rows_stream_at_the_sweep_sizes(name, length):
    # 4096 rows of 1024-8192 f32: the grid is the blocks that reside at once (132 SMs x the blocks per SM the
    # registers of the row tiles and of the next row allow), asked of __launch_bounds__.
    gpu, plan, target = _plan(name, **_rows_of(name, 4096, length))
    (kernel,) = plan.kernels
    rows = kernel.rows
    assert isinstance(rows, onchip.RowsOnChip)
    stream = rows.stream
    assert isinstance(stream, rowstream.RowStream), stream
    loaded = sum(rows.slots * rows.vec for t in rows.tiles if t.loaded)
    assert stream.registers == rows.registers + loaded
    per_thread = stream.registers + onchip.RESERVED_REGISTERS
    assert stream.blocks_per_sm == min(H100.registers_per_sm // (per_thread * kernel.threads),
                                       H100.threads_per_sm // kernel.threads, H100.max_blocks_per_sm)
    assert stream.grid == H100.sms * stream.blocks_per_sm
    assert stream.next_bytes == length * 4 * len([t for t in rows.tiles if t.loaded])
    assert kernel.min_blocks == (stream.blocks_per_sm if stream.blocks_per_sm > 1 else None)
    assert "rows streamed: every output is one value per row" in str(plan)
    source = emit_planned(gpu, plan, target)
    (launch,) = source.launches
    assert evaluate(launch.blocks, {}) == min(4096, stream.grid)  # (sizes fixed: the rows are a constant)
    text = source.text
    assert "for (int64_t pf_row = blockIdx.x; pf_row < pf_rows; pf_row += gridDim.x)" in text
    assert text.index("_next[pf_k * ") < text.index("// block reduction")  # the next row issued before reducing


def test_a_grid_of_a_size_parameter_takes_the_smaller_at_launch():
    from polyfuse.pipeline import stages

    # The generic kernel (the benchmark's) takes the rows as a size parameter: min(N, grid) blocks at launch.
    op = ops.get("logsumexp")
    sch = default_schedule("logsumexp", "default", op.generic_program("default", "cuda", M=4096), target="cuda")
    source = stages(sch, Target("cuda", H100)).source
    (launch,) = source.launches
    assert isinstance(launch.blocks, BinOp) and launch.blocks.op == "min" and isinstance(launch.blocks.b, Const)
    grid = int(launch.blocks.b.value)
    assert grid % H100.sms == 0
    assert evaluate(launch.blocks, {"N": 4096}) == min(4096, grid) and evaluate(launch.blocks, {"N": 7}) == 7
    assert "const int64_t pf_rows = (N);" in source.text


def test_the_next_row_is_loaded_before_the_current_one_is_reduced():
    gpu, plan, target = _plan("softmax_sum", **_rows_of("softmax_sum", 4096, 4096))
    body = emit_planned(gpu, plan, target).text.split("pf_row += gridDim.x)")[1]
    take = body.index("pf_row1[pf_k * 4 + pf_v] = pf_row1_next[pf_k * 4 + pf_v];")
    prefetch = body.index("if (pf_row + gridDim.x < pf_rows)")
    reduce = body.index("// block reduction: s_max")
    assert take < prefetch < reduce
    assert "pf_next_i) * (4096) + pf_j0" in body[prefetch:reduce]  # the following row's address
    assert body.count("__syncthreads();") == 4  # zeroing, two block reductions, the partials' reuse


@pytest.mark.parametrize("name", WRITING)
def test_kernels_that_write_a_row_keep_one_row_per_block(name):
    gpu, plan, target = _plan(name, **_rows_of(name, 4096, 4096))
    rows = plan.kernels[0].rows
    assert isinstance(rows, onchip.RowsOnChip)
    assert rows.stream == "the kernel writes a row (its stores keep memory busy while the next blocks load)"
    assert "pf_rows" not in emit_planned(gpu, plan, target).text


@pytest.mark.parametrize("name", REDUCING)
def test_rows_on_one_block_per_sm_are_not_streamed(name):
    # Rows of 32768 f32 take the registers (and shared memory) of one block per SM: no room for a next row.
    _, plan, _ = _plan(name, **_rows_of(name, 4096, 32768))
    rows = plan.kernels[0].rows
    assert isinstance(rows, onchip.RowsOnChip) and rows.blocks_per_sm == 1
    assert rows.stream == "the row tiles take the registers of one block per SM: none are left for a next row"


@pytest.mark.parametrize("name", REDUCING)
def test_the_option_turns_it_off_and_leaves_the_one_row_kernel(name):
    sizes = _rows_of(name, 4096, 4096)
    gpu, plan, target = _plan(name, ONE_ROW, **sizes)
    (kernel,) = plan.kernels
    assert kernel.rows.stream == "off (CodegenOptions.stream_rows)"
    text = emit_planned(gpu, plan, target).text
    assert "pf_rows" not in text and "int64_t pf_bid = blockIdx.x;" in text
    (launch,) = emit_planned(gpu, plan, target).launches
    assert not (isinstance(launch.blocks, BinOp) and launch.blocks.op == "min")


def test_the_grid_follows_the_device():
    small = dataclasses.replace(H100, sms=7, registers_per_sm=32768)
    _, plan, _ = _plan("logsumexp", device=small, **_rows_of("logsumexp", 4096, 4096))
    stream = plan.kernels[0].rows.stream
    assert isinstance(stream, rowstream.RowStream)
    per_thread = stream.registers + onchip.RESERVED_REGISTERS
    assert stream.blocks_per_sm == 32768 // (per_thread * 256) and stream.grid == 7 * stream.blocks_per_sm


@pytest.mark.nvcc
@pytest.mark.parametrize("name", REDUCING)
@pytest.mark.parametrize("length", [1, 7, 42, 4100, 8192])
def test_streamed_rows_compile_warning_free(name, length):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    gpu, plan, target = _plan(name, **_rows_of(name, 3, length))
    assert rowstream.of(plan.kernels[0]) is not None
    source = emit_planned(gpu, plan, target)
    compile_gpu(source.text, f"{name}_{length}_streamed", "cuda", "sm_90a", options=CompileOptions(werror=True),
                compile_only=True)


# ------------------------------------------------------------------------------------------------ on a GPU

GPU_CASES = [(1, 4096), (5, 7), (1031, 4100), (257, 1)]
"""(rows, length): one row, prime row counts, a prime count above the H100's grid with a ragged length."""


@pytest.mark.gpu
@pytest.mark.parametrize("name", REDUCING)
@pytest.mark.parametrize(("rows", "length"), GPU_CASES)
def test_streamed_rows_match_one_row_per_block_and_numpy(name, rows, length):
    from polyfuse.pipeline import build
    from polyfuse.runtime.loaders import loader

    op = ops.get(name)
    sizes = {**op.sizes("default"), **_rows_of(name, rows, length)}
    static = {k: v for k, v in sizes.items() if k in op.static_sizes("default", sizes, "cuda")}
    program = op.generic_program("default", "cuda", **static)  # (the benchmark's kernel: the rows a parameter)
    try:
        device = loader("cuda").device_spec()
    except BackendUnavailable as err:
        pytest.skip(str(err))
    # the device's grid, and a grid of one SM's blocks (many rows per block, the next row's loads at every step)
    streamed = [Target("cuda", device), Target("cuda", dataclasses.replace(device, sms=1))]
    kernels = [build(default_schedule(name, "default", program, target="cuda"), t, sizes=sizes, werror=True)
               for t in streamed]
    one_row = build(default_schedule(name, "default", program, target="cuda", options=ONE_ROW),
                    Target("cuda", device, ONE_ROW), sizes=sizes, werror=True)
    for k in kernels:
        assert "pf_row += gridDim.x" in k.kernel_source.text
    assert "pf_rows" not in one_row.kernel_source.text
    tol = op.tolerance("default", sizes)
    for variant in VARIANTS:
        for magnitude in op.magnitudes:
            inputs = op.inputs(1, "default", sizes, magnitude, variant=variant)
            expected = one_row.run(inputs)
            result = ops.compare(expected, op.reference(inputs, "default", sizes), tol)
            assert result.ok, f"one row per block, {variant} magnitude {magnitude:g}: {result.line()}"
            for k in kernels:
                got = k.run(inputs)
                result = ops.compare(got, op.reference(inputs, "default", sizes), tol)
                assert result.ok, f"{variant} magnitude {magnitude:g}: {result.line()} worst {result.worst}"
                for out in got:  # each row reduced by the same steps in the same order: the same bits
                    np.testing.assert_array_equal(np.asarray(got[out]), np.asarray(expected[out]),
                                                  err_msg=f"{variant} magnitude {magnitude:g}, output {out}")
