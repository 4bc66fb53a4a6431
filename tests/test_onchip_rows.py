"""Rows kept on chip (:mod:`polyfuse.emit_cpp.onchip`): which row kernels keep their rows in registers and
which roll over chunks (and why), that their CUDA compiles warning-free for sm_90a, and, on a GPU (marked
``gpu``), that they and the rolling kernels match NumPy on every input variant (NaN where the rolling kernels
have it)."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CodegenOptions, Target, emit_planned, gpu_plan, onchip
from polyfuse.errors import BackendUnavailable
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles
from polyfuse.tiling.skip import skip_masked_tiles

ROW_OPS = ("softmax", "softmax_sum", "logsumexp", "rmsnorm_amax", "layernorm_stats", "variance", "sum_sum",
           "l2norm_stable")
ROLLING = CodegenOptions(rows_on_chip=False)
H100 = PRESETS["sm_90a"]


def _rows_of(name: str, rows: int, length: int) -> dict[str, int]:
    """Sizes of ``rows`` rows of ``length`` elements (variance names them B and L)."""
    return {"B": rows, "L": length} if name == "variance" else {"N": rows, "M": length}


def _bench_sizes(name: str) -> dict[str, int]:
    return dict(ops.get(name).presets["default"])


def _plan(name: str, options: CodegenOptions | None = None, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes("default"), **sizes}
    sch = default_schedule(name, "default", op.program("default", **sizes), target="cuda", options=options)
    target = Target("cuda", H100, options or CodegenOptions())
    gpu, plan = gpu_plan(skip_masked_tiles(to_tiles(sch.program)), target)
    return gpu, plan, target


def _row_length(name: str, sizes: dict[str, int]) -> int:
    program = ops.get(name).program("default", **sizes)
    return int(program.inputs[0].shape[-1].value)


@pytest.mark.parametrize("name", ROW_OPS)
def test_bench_rows_stay_on_chip(name):
    # At the bench sizes (rows of 4096 or 8192 f32) every row fits the register budget: one kernel, the row
    # loaded once, no rolling loop, each reduction from registers.
    sizes = _bench_sizes(name)
    _, plan, _ = _plan(name, **sizes)
    (kernel,) = plan.kernels
    rows = kernel.rows
    assert isinstance(rows, onchip.RowsOnChip), rows
    assert rows.length == _row_length(name, sizes)
    assert rows.vec == 4 and kernel.threads == 256 and rows.slots * rows.vec * 256 == rows.length
    assert rows.registers <= rows.budget == 64
    assert not kernel.loops  # no rolling loop
    assert "rows on chip" in str(plan)


def test_softmax_keeps_its_exponentials_in_registers_and_shares_them():
    gpu, plan, target = _plan("softmax", **_bench_sizes("softmax"))
    rows = plan.kernels[0].rows
    assert isinstance(rows, onchip.RowsOnChip)
    assert rows.kept == frozenset({"xexp"})
    assert "xexp" not in {t.name for t in plan.kernels[0].shared}  # no shared memory for it
    text = emit_planned(gpu, plan, target).text
    assert text.count("exp(") == 1  # s_norm reads s_exp's registers instead of computing exp again
    assert text.count("__syncthreads();") == 3  # zeroing + one per block reduction (was 13-17 per row)


def test_nested_reductions_are_combined_by_level():
    # sum_sum's scale reads the sum of squares inside the second sum: two levels, two block reductions.
    _, plan, _ = _plan("sum_sum", **_bench_sizes("sum_sum"))
    rows = plan.kernels[0].rows
    combines = [s for s in rows.steps if isinstance(s, onchip.Combine)]
    assert [c.items for c in combines] == [(("s_scaled_dot", 0),), (("s_scaled_dot", 1),)]


def test_short_rows_take_one_warp_without_barriers():
    gpu, plan, target = _plan("softmax", N=3, M=40)
    (kernel,) = plan.kernels
    assert kernel.threads == 32 and isinstance(kernel.rows, onchip.RowsOnChip)
    assert "__syncthreads" not in emit_planned(gpu, plan, target).text.split("// rows on chip")[1]


@pytest.mark.parametrize(("length", "vec"), [(1, 1), (7, 1), (42, 2), (4100, 4)])
def test_ragged_rows_pick_a_vector_width_that_divides_them(length, vec):
    _, plan, _ = _plan("softmax", N=3, M=length)
    rows = plan.kernels[0].rows
    assert isinstance(rows, onchip.RowsOnChip) and rows.vec == vec and rows.length == length


def test_long_rows_roll_over_chunks():
    # 40000 f32 at 256 threads: 157 registers per thread for the row: over the budget, so the schedule rolls.
    _, plan, _ = _plan("softmax", N=2, M=40000)
    (kernel,) = plan.kernels
    assert kernel.loops  # the rolling loop
    assert "rows in memory: the kernel's body has a loop" in str(plan)


def test_the_refusal_names_the_budget():
    # 4 registers per thread and 16 KB of shared memory per block: neither holds the two 32 KB row tiles, at
    # 256 threads nor at 1024.
    op = ops.get("rmsnorm_amax")
    sch = default_schedule("rmsnorm_amax", "default", op.program("default", N=4, M=8192), target="cuda")
    small = dataclasses.replace(H100, shared_per_block=16384)
    target = Target("cuda", small, CodegenOptions(row_registers=4))
    _, plan = gpu_plan(skip_masked_tiles(to_tiles(sch.program)), target)
    reason = plan.kernels[0].rows
    assert isinstance(reason, str)
    assert "64 registers per thread" in reason and "budget of 4" in reason
    assert "65536 bytes of shared memory, over the 12288" in reason


def test_the_option_turns_it_off():
    _, plan, _ = _plan("softmax", ROLLING, **_bench_sizes("softmax"))
    (kernel,) = plan.kernels
    assert kernel.loops and kernel.rows == "off (CodegenOptions.rows_on_chip)"


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ROW_OPS)
@pytest.mark.parametrize("length", [1, 7, 42, 4100, 8192])
def test_on_chip_rows_compile_warning_free(name, length):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    gpu, plan, target = _plan(name, **_rows_of(name, 3, length))
    assert isinstance(plan.kernels[0].rows, onchip.RowsOnChip)
    source = emit_planned(gpu, plan, target)
    compile_gpu(source.text, f"{name}_{length}", "cuda", "sm_90a", options=CompileOptions(werror=True),
                compile_only=True)


_CASES = [(name, length) for length in (1, 7, 42, 4100, 8192, 16411, 20000, 30000, 32768) for name in ROW_OPS]


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "length"), _CASES)
def test_on_chip_rows_match_rolling_and_numpy(name, length):
    # Rows up to 8192 in registers at two blocks per SM; longer ones (16411 a prime) at one block of 1024 threads
    # per SM, the tiles over its registers in shared memory (tests/test_onchip_long_rows.py plans them).
    from polyfuse.pipeline import build

    op = ops.get(name)
    sizes = {**op.sizes("default"), **_rows_of(name, 5, length)}
    program = op.program("default", **sizes)
    try:
        on_chip = build(default_schedule(name, "default", program, target="cuda"), "cuda", sizes=sizes, werror=True)
        rolling = build(default_schedule(name, "default", program, target="cuda", options=ROLLING), "cuda",
                        sizes=sizes, werror=True, codegen=ROLLING)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    assert "// rows on chip" in on_chip.kernel_source.text
    assert ("one block per SM" in on_chip.kernel_source.text) == (length > 8192)
    assert "// rows on chip" not in rolling.kernel_source.text
    tol = op.tolerance("default", sizes)
    for variant in VARIANTS:
        for magnitude in op.magnitudes:
            inputs = op.inputs(1, "default", sizes, magnitude, variant=variant)
            a, b = on_chip.run(inputs), rolling.run(inputs)
            ref = op.reference(inputs, "default", sizes)
            # Each kernel within the tolerance of the reference (the two may differ by twice it: a layernorm
            # variance of 7 elements near the offset 1e4 did, both within it).
            for kernel, got in (("on chip", a), ("rolling", b)):
                result = ops.compare(got, ref, tol)
                assert result.ok, f"{kernel}, {variant} magnitude {magnitude:g}: {result.line()} worst {result.worst}"
            for out in a:  # NaN and inf where the rolling kernel has them
                np.testing.assert_array_equal(np.isnan(np.asarray(a[out], dtype=np.float64)),
                                              np.isnan(np.asarray(b[out], dtype=np.float64)))
