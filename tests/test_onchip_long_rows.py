"""Long rows on chip (:mod:`polyfuse.emit_cpp.onchip`): rows over the register budget of two blocks per SM get one
block of the device's most threads per SM, as many row tiles in registers as its budget holds and the rest in
shared memory; rows that fit neither still roll over chunks.  The plan says which rule was chosen and why; the
CUDA compiles warning-free for sm_90a; on a GPU the kernels match the rolling ones and NumPy on every input variant
(``test_on_chip_rows_match_rolling_and_numpy`` of tests/test_onchip_rows.py, at these lengths too)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CodegenOptions, Target, emit_planned, gpu_plan, onchip
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles
from polyfuse.tiling.skip import skip_masked_tiles

ROW_OPS = ("softmax", "softmax_sum", "logsumexp", "rmsnorm_amax", "layernorm_stats", "variance", "sum_sum",
           "l2norm_stable")
IN_SHARED = {"softmax": {"xexp"}, "softmax_sum": {"xexp"}, "logsumexp": {"xexp"}, "rmsnorm_amax": {"y"},
             "sum_sum": {"x2"}, "layernorm_stats": set(), "variance": set(), "l2norm_stable": set()}
"""The row tiles that go to shared memory at rows of 32768 f32: the second tile each thread holds (the input,
or the first row computed from it, fills the 32 registers of the budget)."""
ROLLING = CodegenOptions(rows_on_chip=False)
H100 = PRESETS["sm_90a"]
LONG = (16411, 20000, 30000, 32768)
"""A prime (one element per access), a ragged multiple of four, the ragged and the exact sweep-sized row."""


def _rows_of(name: str, rows: int, length: int) -> dict[str, int]:
    return {"B": rows, "L": length} if name == "variance" else {"N": rows, "M": length}


def _plan(name: str, options: CodegenOptions | None = None, device=H100, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes("default"), **sizes}
    sch = default_schedule(name, "default", op.program("default", **sizes), target="cuda", device=device,
                           options=options)
    target = Target("cuda", device, options or CodegenOptions())
    gpu, plan = gpu_plan(skip_masked_tiles(to_tiles(sch.program)), target)
    return gpu, plan, target


@pytest.mark.parametrize("name", ROW_OPS)
def test_sweep_rows_of_32768_stay_on_chip_one_block_per_sm(name):
    # 4096 rows of 32768 f32 (the sweep's longest): 256 registers per thread at 256 threads, over the budget of
    # 64; at 1024 threads and one block per SM the budget is 64 - 32 = 32 registers: one tile in registers, the
    # next in shared memory (128 KB of the 227 KB), each row read from memory once.
    _, plan, _ = _plan(name, **_rows_of(name, 4096, 32768))
    (kernel,) = plan.kernels
    rows = kernel.rows
    assert isinstance(rows, onchip.RowsOnChip), rows
    assert kernel.threads == 1024 and not kernel.loops
    assert rows.blocks_per_sm == 1 and kernel.blocks_per_sm == 1 and kernel.min_blocks is None
    assert rows.vec == 4 and rows.slots == 8 and rows.registers <= rows.budget == 32
    assert {t.tensor for t in rows.tiles if t.in_shared} == IN_SHARED[name]
    for t in rows.tiles:
        if t.in_shared:
            assert t.shared_at is not None and t.shared_at % 16 == 0
            assert kernel.peak >= t.shared_at + 32768 * 4
    text = str(plan)
    assert "over the register budget of two blocks per SM: one block of 1024 threads per SM" in text
    if IN_SHARED[name]:
        assert "in shared memory: " in text
    # the loaded tiles read from memory once each
    assert sum(t.loaded for t in rows.tiles) == (2 if name == "sum_sum" else 1)


@pytest.mark.parametrize("name", ROW_OPS)
@pytest.mark.parametrize("length", [1024, 4096, 8192])
def test_shorter_sweep_rows_keep_the_register_rule(name, length):
    _, plan, _ = _plan(name, **_rows_of(name, 4096, length))
    rows = plan.kernels[0].rows
    assert isinstance(rows, onchip.RowsOnChip)
    assert rows.blocks_per_sm == 2 and not any(t.in_shared for t in rows.tiles) and rows.budget == 64
    assert plan.kernels[0].threads <= 256


def test_sum_sum_fills_its_shared_row_by_cp_async():
    gpu, plan, target = _plan("sum_sum", **_rows_of("sum_sum", 4, 32768))
    rows = plan.kernels[0].rows
    assert rows.async_copy
    text = emit_planned(gpu, plan, target).text
    assert text.count("pf::cp_async16(") == 1 and "pf::cp_async_wait<0>();" in text
    assert "__launch_bounds__(1024)" in text


def test_without_cp_async_the_shared_row_is_copied_through_registers():
    device = dataclasses.replace(H100, cp_async=False)
    gpu, plan, target = _plan("sum_sum", device=device, **_rows_of("sum_sum", 4, 32768))
    assert not plan.kernels[0].rows.async_copy
    assert "cp_async" not in emit_planned(gpu, plan, target).text


@pytest.mark.parametrize("name", ["softmax", "sum_sum", "variance"])
def test_rows_that_fit_neither_registers_nor_shared_memory_roll(name):
    # 65536 f32: 256 KB per tile, over the 227 KB of shared memory a block may have.
    _, plan, _ = _plan(name, **_rows_of(name, 4, 65536))
    (kernel,) = plan.kernels
    assert kernel.loops and "the kernel's body has a loop" in kernel.rows


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ROW_OPS)
@pytest.mark.parametrize("length", LONG)
def test_long_on_chip_rows_compile_warning_free(name, length):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    gpu, plan, target = _plan(name, **_rows_of(name, 3, length))
    assert isinstance(plan.kernels[0].rows, onchip.RowsOnChip) and plan.kernels[0].rows.blocks_per_sm == 1
    source = emit_planned(gpu, plan, target)
    compile_gpu(source.text, f"{name}_{length}", "cuda", "sm_90a", options=CompileOptions(werror=True),
                compile_only=True)
