"""Reciprocal-multiply of a 16-bit product operand (polyfuse/emit_cpp/reciprocal.py): chosen in the plan where the
divisor's range is proven and P is rounded once, the division kept elsewhere; compile checks for sm_90a; on the
GPU, the rewrite on and off against each other and NumPy."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.emit_cpp import CUDA, CodegenOptions, emit, gpu_plan
from polyfuse.errors import BackendUnavailable
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.pipeline import build
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles



DIVIDE_INSIDE = GpuTuning(hoist_divisors=False)
"""attn_norm_inside's divide-inside form kept on the GPU (the default schedules hoist its division out of the sum,
where no per-score division is left): the form whose P·(1/ℓ) these tests are about."""


def _tiles(name: str, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes("prefill"), **sizes}
    return to_tiles(default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda",
                                     tuning=DIVIDE_INSIDE).program)


def _choices(tiles, target=CUDA):
    _, plan = gpu_plan(tiles, target)
    return [r for k in plan.kernels for lp in k.loops.values() if lp.fragments is not None
            for r in lp.fragments.reciprocals], str(plan)


def test_norm_inside_prefill_multiplies_by_the_reciprocal():
    choices, text = _choices(_tiles("attn_norm_inside", **ops.get("attn_norm_inside").presets["prefill"]))
    (r,) = choices
    assert r.register is not None
    assert r.chosen and r.block == "pv" and r.divisor == "row_sum" and "row_sum in [1, 4096]" in r.reason
    assert "pv: a = x / row_sum as x · pf_rcp" in text
    pv = emit(_tiles("attn_norm_inside", Sq=128, Skv=128), CUDA).text.split("// pv", 1)[1]
    (a_line,) = [line for line in pv.splitlines() if re.search(r"pf_fa\d+\[pf_t\]\[pf_q\] =", line)]
    assert re.search(r"\* pf_rcp\d+\[pf_h\]\);$", a_line) and "/" not in a_line


@pytest.mark.parametrize(("options", "why"), [
    (CodegenOptions(reciprocal_operands=False), "reciprocal_operands is off"),
    (CodegenOptions(round_operands=False), "split hi + lo"),
])
def test_the_division_stays_where_the_options_say(options, why):
    tiles = _tiles("attn_norm_inside", Sq=128, Skv=128)
    (r,) = _choices(tiles, CUDA.with_options(**dataclasses.asdict(options)))[0]
    assert not r.chosen and why in r.reason
    source = emit(tiles, CUDA.with_options(**dataclasses.asdict(options))).text
    assert "pf_rcp" not in source and "/ pf_fr_row_sum_" in source


def test_the_division_stays_without_a_proven_range():
    # The same tile program without its range facts (as if the sum were exp(e − c), c not the max).
    tiles = dataclasses.replace(_tiles("attn_norm_inside", Sq=128, Skv=128), ranges=())
    (r,) = _choices(tiles)[0]
    assert not r.chosen and r.reason == "no proven range of row_sum"
    assert "divided per element (no proven range of row_sum)" in _choices(tiles)[1]


def test_attention_that_divides_after_the_loop_has_no_choice():
    # attn_global divides in the epilogue (out = pv / row_sum): nothing is a divided product operand.
    assert _choices(_tiles("attn_global", Sq=128, Skv=128))[0] == []


@pytest.mark.nvcc
@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(reciprocal_operands=False)])
@pytest.mark.parametrize("sizes", [{"Sq": 130, "Skv": 160, "D": 64, "Dv": 64}, {"Sq": 96, "Skv": 160}])
def test_norm_inside_compiles_for_sm90a(options, sizes):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    source = emit(_tiles("attn_norm_inside", **sizes), CUDA.with_options(**dataclasses.asdict(options)))
    assert ("pf_rcp" in source.text) == options.reciprocal_operands
    compile_gpu(source.text, "reciprocal", "cuda", source.target.arch, options=CompileOptions(werror=True),
                compile_only=True)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [{"Sq": 130, "Skv": 160, "D": 64, "Dv": 64}, {"Sq": 96, "Skv": 200},
                                   {"Sq": 72, "Skv": 200, "D": 64, "Dv": 64}])
def test_reciprocal_on_and_off_match_numpy_on_every_input_variant(sizes):
    # Ragged sizes (Sq, Skv not multiples of the tile), heads of 16 (mma.sync) and 64 (wgmma on sm_90a): both
    # kernels against NumPy within the tolerance (which carries the reciprocal's term), and against each other
    # within it; every input variant at every magnitude.
    op = ops.get("attn_norm_inside")
    sizes = {**op.sizes("prefill"), **sizes}
    kernels = {}
    for on in (True, False):
        options = CodegenOptions(reciprocal_operands=on)
        try:
            kernels[on] = build(default_schedule("attn_norm_inside", "prefill", op.program("prefill", **sizes),
                                                 target="cuda", tuning=DIVIDE_INSIDE),
                                "cuda", sizes=sizes, werror=True, codegen=options)
        except BackendUnavailable as err:
            pytest.skip(str(err))
    assert "pf_rcp" in kernels[True].kernel_source.text and "pf_rcp" not in kernels[False].kernel_source.text
    tolerance = op.tolerance("prefill", sizes)
    differ = 0
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(11, "prefill", sizes, magnitude, variant)
            reference = op.reference(inputs, "prefill", sizes)
            on, off = kernels[True].run(inputs), kernels[False].run(inputs)
            for got, which in ((on, "reciprocal"), (off, "division")):
                result = ops.compare(got, reference, tolerance)
                assert result.ok, f"{which} {variant} at {magnitude:g}: {result.line()} worst {result.worst}"
            result = ops.compare(on, off, tolerance)
            assert result.ok, f"{variant} at {magnitude:g}: reciprocal against division {result.line()}"
            differ += int(not np.array_equal(np.asarray(on["out"]), np.asarray(off["out"]), equal_nan=True))
    print(f"outputs differing in some element: {differ} of {2 * len(VARIANTS)} runs")


# ------------------------------------------------------------ divisions by a constant (reciprocal_constants)

@pytest.mark.parametrize(("c", "inverse"), [
    (50.0, float(np.float32(1) / np.float32(50))), (-3.0, float(np.float32(-1) / np.float32(3))),
    (8192.0, None), (2.0, None), (1.0, None), (0.5, None), (0.3, None), (-1.0, None), (float("inf"), None),
    (float("nan"), None), (2.0 ** 127, None)])
def test_reciprocal_constant_only_above_one_and_not_a_power_of_two(c, inverse):
    # |c| > 1 keeps |fl(1/c)| <= 1 (no overflow the division has not); a power of two divides exactly already;
    # 1/c must be a normal f32 (2^127's is not).
    from polyfuse.emit_cpp.reciprocal import reciprocal_constant
    assert reciprocal_constant(c) == inverse


def test_softcap_multiplies_by_the_caps_reciprocal():
    # attn_softcap's 50·tanh(s/50): s·fl(1/50) on the GPU (0x1.47ae14p-6, the f32 nearest 1/50), the division
    # with the option off; variance's mean divides by L: multiplied by fl(1/40) at L = 40, a division by 8192 (a
    # power of two: exact either way) at L = 8192.
    tiles = _tiles("attn_softcap", Sq=256, Skv=256)
    on = emit(tiles, CUDA).text
    off = emit(tiles, CUDA.with_options(reciprocal_constants=False)).text
    assert "* 0x1.47ae140000000p-6f" in on and "/ 0x1.9000000000000p+5f" not in on
    assert "/ 0x1.9000000000000p+5f" in off and "0x1.47ae14" not in off
    op = ops.get("variance")
    for length, text in ((40, f"* {float(np.float32(1) / np.float32(40)).hex()}f"), (8192, "/ 0x1.0000000000000p+13f")):
        sizes = {**op.sizes("default"), "L": length}
        variance = to_tiles(default_schedule("variance", "default", op.program("default", **sizes),
                                             target="cuda").program)
        assert text in emit(variance, CUDA).text


@pytest.mark.gpu
def test_softcap_with_the_caps_reciprocal_matches_numpy_on_every_input_variant():
    # Ragged sizes; the constant's reciprocal on and off, both against NumPy within the tolerance (which carries
    # the term), every input variant at every magnitude.
    op = ops.get("attn_softcap")
    sizes = {**op.sizes("prefill"), "Sq": 72, "Skv": 200}
    kernels = {}
    for on in (True, False):
        try:
            kernels[on] = build(default_schedule("attn_softcap", "prefill", op.program("prefill", **sizes),
                                                 target="cuda"), "cuda", sizes=sizes, werror=True,
                                codegen=CodegenOptions(reciprocal_constants=on))
        except BackendUnavailable as err:
            pytest.skip(str(err))
    assert "0x1.47ae14" in kernels[True].kernel_source.text and "0x1.47ae14" not in kernels[False].kernel_source.text
    tolerance = op.tolerance("prefill", sizes)
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(13, "prefill", sizes, magnitude, variant)
            reference = op.reference(inputs, "prefill", sizes)
            for on, kernel in kernels.items():
                result = ops.compare(kernel.run(inputs), reference, tolerance)
                assert result.ok, f"reciprocal={on} {variant} at {magnitude:g}: {result.line()} worst {result.worst}"
