"""Fused catalog operators run on an NVIDIA GPU, through each CUDA loader, against NumPy.

Marked ``gpu``: skipped where no CUDA GPU is visible (CI).  Each loader (pycuda, cuda-python)
is a parameter and skips where it is not installed.  PyTorch tensors, where PyTorch is
installed, are used in place (zero-copy) and the outputs come back as tensors.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from kernel_pairs import assert_same_bits_and_numpy

from polyfuse import ops
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.errors import BackendUnavailable, LaunchError
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule, has_default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.pipeline import build

pytestmark = pytest.mark.gpu

FUSED = [(n, m) for n in ops.names() for m in ops.get(n).modes if has_default_schedule(n, m) and n != "quant_gemm_fp8"]


def _kernel(name: str, mode: str, loader: str | None = None, codegen: CodegenOptions | None = None,
            tuning: GpuTuning | None = None, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes(mode), **sizes}
    try:
        kernel = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", tuning=tuning), "cuda",
                       sizes=sizes, loader=loader, werror=True, codegen=codegen)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    return op, sizes, kernel


DIVIDE_INSIDE = GpuTuning(hoist_divisors=False)
"""attn_norm_inside's own GPU kernels: its divide-inside form kept (the default GPU schedules hoist the division
out of the sum, which makes its kernels attn_global's)."""


def _own(name: str) -> GpuTuning | None:
    return DIVIDE_INSIDE if name == "attn_norm_inside" else None


def _every_input(op, seed: int, sizes):
    """``(magnitude, variant, inputs)`` of prefill for every magnitude of ``op`` and every input variant."""
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            yield magnitude, variant, op.inputs(seed, "prefill", sizes, magnitude, variant)


@pytest.mark.parametrize(("name", "mode"), FUSED)
def test_operator_matches_numpy(name, mode):
    op, sizes, kernel = _kernel(name, mode)
    for magnitude in op.magnitudes:
        inputs = op.inputs(0, mode, sizes, magnitude)
        result = ops.compare(kernel.run(inputs), op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
        assert result.ok, f"magnitude {magnitude:g}: {result.line()} worst {result.worst}"


@pytest.mark.parametrize("loader", ["pycuda", "cuda-python"])
@pytest.mark.parametrize(("name", "sizes", "split"), [
    ("quant_gemm", {"M": 128, "K": 96, "N": 128}, "W"), ("moe_routing", {"S": 64, "HD": 512}, "w"),
    ("quant_gemm", {"M": 40, "K": 72, "N": 48}, None)])
def test_presplit_operands_match_numpy(loader, name, sizes, split):
    # An f32 input read by several blocks is split into bf16 hi + lo by a first kernel, into scratch the
    # runtime allocates; the results are those of per-tile conversion (the same parts), within tolerance.
    # A masked tile (K = 72 in k tiles of 32) is not a plain load: that W is converted per tile.
    op, sizes, kernel = _kernel(name, "default", loader=loader, **sizes)
    first = kernel.kernel_source.launches[0].kernel
    assert first.endswith(f"_split_{split}") if split else "_split_" not in first
    for magnitude in op.magnitudes:
        inputs = op.inputs(3, "default", sizes, magnitude)
        result = ops.compare(kernel.run(inputs), op.reference(inputs, "default", sizes), op.tolerance("default", sizes))
        assert result.ok, f"magnitude {magnitude:g}: {result.line()} worst {result.worst}"


@pytest.mark.parametrize(("name", "mode", "sizes"), [
    ("attn_mla_decode", "decode", {"H": 16, "Skv": 4096, "Dv": 64, "Drope": 16}),
    ("attn_causal", "prefill", {"Sq": 128, "Skv": 128}), ("attn_gqa", "decode", {"Hq": 32, "Hkv": 2, "Skv": 256}),
    ("quant_gemm", "default", {"M": 128, "K": 192, "N": 128}), ("softmax", "default", {}),
    # one query row (a warp per row, each lane playing four of the block's threads) and two
    ("attn_global", "decode", {"B": 1, "Skv": 4096, "D": 64, "Dv": 64}), ("attn_causal", "decode", {"Skv": 1024}),
    ("attn_softcap", "decode", {"Skv": 2048})])
def test_row_groups_give_the_same_bits(name, mode, sizes):
    # A run of row statements computed in one pass (polyfuse.emit_cpp.rows) evaluates the same expressions
    # in the same order as the statement-by-statement code: the outputs are bit for bit those without it,
    # and match NumPy, on every input variant.  (Sizes without padding: a masked statement is not part of a
    # row group.)  (attention's key loop in warp fragments has no row statements: the shared-memory path is
    # compared)
    op, sizes, grouped = _kernel(name, mode, codegen=CodegenOptions(fragment_loops=False), **sizes)
    _, _, plain = _kernel(name, mode, codegen=CodegenOptions(row_groups=False, fragment_loops=False), **sizes)
    assert ("// row group:" in grouped.kernel_source.text) == (name != "softmax")
    assert "// row group:" not in plain.kernel_source.text
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(4, mode, sizes, magnitude, variant)
            a, b = grouped.run(inputs), plain.run(inputs)
            for key in a:
                assert np.array_equal(a[key], b[key], equal_nan=True), f"{key} at magnitude {magnitude:g}, {variant}"
            result = ops.compare(a, op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
            assert result.ok, f"magnitude {magnitude:g}, {variant}: {result.line()} worst {result.worst}"


_MLA_576 = {"H": 16, "Skv": 2048, "Dv": 512, "Drope": 64}


@pytest.mark.parametrize(("name", "sizes", "tuning"), [
    ("attn_causal", {"Sq": 128, "Skv": 128}, None),
    ("attn_causal", {"Sq": 40, "Skv": 40}, GpuTuning(prefill_min_rows=40)),
    ("attn_alibi", {"Sq": 100, "Skv": 100}, None), ("attn_norm_inside", {"Sq": 96, "Skv": 160}, DIVIDE_INSIDE),
    ("attn_softcap", {}, None)])
def test_fragment_loops_match_numpy_and_the_shared_memory_path(name, sizes, tuning):
    # The key loop in warp fragments (emit_cpp/fragments.py), P rounded once (default) or split hi + lo, against
    # NumPy at every magnitude and every input variant; split, it also matches the shared-memory path within
    # the f32 terms of the tolerance; without prefetch it gives the same bits.  The 40-row tile has a ragged last
    # strip (3 warps, 8 padding rows).
    op, sizes, once = _kernel(name, "prefill", tuning=tuning, **sizes)
    _, _, split = _kernel(name, "prefill", codegen=CodegenOptions(round_operands=False), tuning=tuning, **sizes)
    _, _, shared = _kernel(name, "prefill", codegen=CodegenOptions(fragment_loops=False), tuning=tuning, **sizes)
    _, _, unpiped = _kernel(name, "prefill", codegen=CodegenOptions(prefetch=False), tuning=tuning, **sizes)
    assert "in warp fragments" in once.kernel_source.text and "pf_fa_lo" in split.kernel_source.text
    assert "in warp fragments" not in shared.kernel_source.text
    tolerance = op.tolerance("prefill", sizes)
    for magnitude, variant, inputs in _every_input(op, 6, sizes):
        reference = op.reference(inputs, "prefill", sizes)
        a, b, c = once.run(inputs), split.run(inputs), shared.run(inputs)
        for key, value in unpiped.run(inputs).items():  # (copies at each iteration's top: the same sums)
            assert np.array_equal(value, a[key], equal_nan=True), f"{variant}: prefetch changed {key}"
        for got in (a, b):
            result = ops.compare(got, reference, tolerance)
            assert result.ok, f"{variant} at magnitude {magnitude:g}: {result.line()} worst {result.worst}"
        result = ops.compare(b, c, tolerance)
        assert result.ok, f"{variant} at magnitude {magnitude:g}: split against shared {result.line()}"


@pytest.mark.parametrize(("name", "sizes", "options", "tuning"), [
    ("attn_causal", {"Sq": 200, "Skv": 200, "D": 128, "Dv": 128}, None, None),
    ("attn_causal", {"Sq": 130, "Skv": 130, "D": 64, "Dv": 64}, CodegenOptions(prefetch=False), None),
    ("attn_causal", {"Sq": 130, "Skv": 130, "D": 64, "Dv": 64}, CodegenOptions(async_staging=False), None),
    ("attn_global", {"Sq": 130, "Skv": 190, "D": 64, "Dv": 128}, None, None),
    ("attn_gqa", {"Sq": 150, "Skv": 150, "D": 128, "Dv": 64}, None, None),
    ("attn_alibi", {"Sq": 140, "Skv": 140, "D": 64, "Dv": 64}, None, None),
    ("attn_softcap", {"Sq": 130, "Skv": 150, "D": 64, "Dv": 64}, None, None),
    ("attn_window", {"Sq": 200, "Skv": 200, "D": 64, "Dv": 64, "W": 70}, None, None),
    ("attn_norm_inside", {"Sq": 130, "Skv": 160, "D": 64, "Dv": 64}, None, DIVIDE_INSIDE),
    ("attn_causal", {"Sq": 130, "Skv": 130, "D": 64, "Dv": 64}, CodegenOptions(producer_warp=False), None),
    ("attn_causal", {"Sq": 300, "Skv": 300, "D": 128, "Dv": 128}, None, GpuTuning(prefill_min_rows=128)),
    ("attn_gqa", {"Sq": 200, "Skv": 260, "D": 64, "Dv": 64}, None, GpuTuning(prefill_min_rows=128))])
def test_warpgroup_products_match_numpy_and_mma_sync(name, sizes, options, tuning):
    # Heads 64 or 128 wide on sm_90a: the loop in warp fragments multiplies with wgmma (swizzled operand panels,
    # P from registers): against NumPy at every magnitude and input variant, and against the same loop on
    # mma.sync within the tolerance (both round P once; the products sum in another order).  Ragged sizes,
    # masks, both staging variants and the loop without its producer warpgroup included; two warpgroups of
    # 64 rows where the tuning asks for 128-row tiles.
    op, sizes, wg = _kernel(name, "prefill", codegen=options, tuning=tuning, **sizes)
    if not wg.kernel_source.target.device.wgmma:
        pytest.skip(f"wgmma needs sm_90a; the device is {wg.kernel_source.target.arch}")
    base = options or CodegenOptions()
    _, _, sync = _kernel(name, "prefill", codegen=dataclasses.replace(base, warpgroup_products=False), tuning=tuning,
                         **sizes)
    assert re.search(r"pf::wgmma_m64n(64|128)k16_f16_rs<1, 0>", wg.kernel_source.text)
    assert "wgmma" not in sync.kernel_source.text.split("__global__", 1)[1]
    tolerance = op.tolerance("prefill", sizes)
    for magnitude, variant, inputs in _every_input(op, 7, sizes):
        reference = op.reference(inputs, "prefill", sizes)
        a, b = wg.run(inputs), sync.run(inputs)
        for got, which in ((a, "wgmma"), (b, "mma.sync")):
            result = ops.compare(got, reference, tolerance)
            assert result.ok, f"{which} {variant} at {magnitude:g}: {result.line()} worst {result.worst}"
        result = ops.compare(a, b, tolerance)
        assert result.ok, f"{variant} at magnitude {magnitude:g}: wgmma against mma.sync {result.line()}"


@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_global", {"Sq": 256, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_global", {"Sq": 128, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_norm_inside", {"Sq": 256, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_causal", {"Sq": 384, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_window", {"Sq": 384, "Skv": 384, "D": 64, "Dv": 64, "W": 150}),
    ("attn_alibi", {"Sq": 384, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_softcap", {"Sq": 384, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_gqa", {"Sq": 384, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_causal", {"Sq": 512, "Skv": 512, "D": 128, "Dv": 128}),
    ("attn_window", {"Sq": 512, "Skv": 512, "D": 128, "Dv": 128, "W": 200}),
    ("attn_alibi", {"Sq": 256, "Skv": 384, "D": 128, "Dv": 128}),
    ("attn_gqa", {"Sq": 384, "Skv": 384, "D": 128, "Dv": 128})])
def test_products_issued_late_match_products_in_turn_bit_for_bit(name, sizes):
    # P·V issued one iteration late (during the next iteration's softmax, three stages of tiles) multiplies and
    # folds the same values in the same order as P·V waited for where it is issued: the same bits, on every
    # input variant and magnitude; and NumPy within the tolerance.  Loops of three or more iterations (the plan
    # issues nothing late in shorter ones), causal and windowed loops whose length varies by query tile, one and two
    # computing warpgroups, heads 64 wide (P·V apart) and 128 wide (accumulated into O).
    op, sizes, late = _kernel(name, "prefill", tuning=_own(name), **sizes)
    if not late.kernel_source.target.device.wgmma:
        pytest.skip(f"wgmma needs sm_90a; the device is {late.kernel_source.target.arch}")
    # The warpgroups issuing in turns (the default with two of them) only order the issues: the same bits again.
    # Compared with the products in turn accumulated as the late one is (into O's registers at 128-wide heads,
    # apart at 64-wide ones): the order of the f32 additions is then the same.
    into = "pv's product accumulates into its registers" in late.kernel_source.text
    _, _, in_turn = _kernel(name, "prefill", codegen=CodegenOptions(overlap_products=False, accumulate_products=into),
                            tuning=_own(name), **sizes)
    _, _, free = _kernel(name, "prefill", codegen=CodegenOptions(warpgroup_turns=False), tuning=_own(name), **sizes)
    assert "issued one iteration late" in late.kernel_source.text
    assert "issued one iteration late" not in in_turn.kernel_source.text
    assert "pf::turn_wait" not in free.kernel_source.text  # (the others take turns where they have two warpgroups)
    tolerance = op.tolerance("prefill", sizes)
    for magnitude, variant, inputs in _every_input(op, 8, sizes):
        a, b, c = late.run(inputs), in_turn.run(inputs), free.run(inputs)
        for out in a:
            assert np.array_equal(np.asarray(a[out]), np.asarray(b[out]), equal_nan=True), (variant, magnitude)
            assert np.array_equal(np.asarray(c[out]), np.asarray(b[out]), equal_nan=True), (variant, magnitude)
        result = ops.compare(a, op.reference(inputs, "prefill", sizes), tolerance)
        assert result.ok, f"{variant} at {magnitude:g}: {result.line()} worst {result.worst}"


@pytest.mark.parametrize("loader", ["cuda-python", "pycuda"])
@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_global", {"Sq": 256, "Skv": 384, "D": 64, "Dv": 64}),
    ("attn_global", {"Sq": 300, "Skv": 300, "D": 64, "Dv": 64}),
    ("attn_norm_inside", {"B": 2, "Sq": 200, "Skv": 333, "D": 64, "Dv": 64}),
    ("attn_causal", {"Sq": 384, "Skv": 384, "D": 128, "Dv": 128}),
    ("attn_window", {"Sq": 257, "Skv": 257, "D": 128, "Dv": 128, "W": 100}),
    ("attn_gqa", {"B": 2, "Sq": 130, "Skv": 250, "D": 128, "Dv": 128}),
    ("attn_softcap", {"Sq": 129, "Skv": 129, "D": 128, "Dv": 128})])
def test_bulk_tensor_copies_match_cp_async_bit_for_bit(loader, name, sizes):
    # The producer warpgroup's tiles brought by bulk tensor copies (one thread, tensor maps encoded at launch,
    # passed by value through either loader) land where its threads' cp.async puts them, ragged edges
    # zero-filled (sequence lengths that are not multiples of the key tile, a last tile of one key, two batches
    # and grouped heads, whose next head's rows lie right after the edge): the same bits on every input variant and
    # magnitude, and NumPy within the tolerance.
    op, sizes, bulk, threads = _bulk_and_threads(name, "prefill", loader, sizes)
    assert_same_bits_and_numpy(op, "prefill", sizes, bulk, threads, seed=10)


def test_bulk_tensor_copies_of_mla_decode_match_cp_async_bit_for_bit():
    # MLA decode at its batch-32 preset (the only sizes whose split takes a producer warpgroup): nine 64-column
    # panels of each 576-wide key tile, the value operand a window of them.  Random inputs (its NumPy reference at
    # this size is checked by gpu_check).
    preset = ops.get("attn_mla_decode").presets["decode_b32"]
    op, sizes, bulk, threads = _bulk_and_threads("attn_mla_decode", "decode", "cuda-python", preset)
    inputs = op.inputs(11, "decode", sizes)
    a, b = bulk.run(inputs), threads.run(inputs)
    for out in a:
        assert np.array_equal(np.asarray(a[out]), np.asarray(b[out]), equal_nan=True)


def _bulk_and_threads(name: str, mode: str, loader: str, sizes: dict):
    """``name``'s kernel with its producer's tiles by bulk tensor copies, and with cp.async by its threads."""
    op, sizes, bulk = _kernel(name, mode, loader=loader, **sizes)
    if not bulk.kernel_source.target.device.tma:
        pytest.skip(f"bulk tensor copies need sm_90a; the device is {bulk.kernel_source.target.arch}")
    _, _, threads = _kernel(name, mode, loader=loader, codegen=CodegenOptions(tma=False), **sizes)
    assert bulk.kernel_source.maps and "pf::tma_load_" in bulk.kernel_source.text
    assert not threads.kernel_source.maps and "pf::tma_load_" not in threads.kernel_source.text
    return op, sizes, bulk, threads


@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_causal", {"Sq": 256, "Skv": 256, "D": 128, "Dv": 128}),
    ("attn_window", {"Sq": 256, "Skv": 256, "D": 128, "Dv": 128, "W": 24}),
    ("attn_alibi", {"Sq": 256, "Skv": 384, "D": 128, "Dv": 128}),
    ("attn_softcap", {"Sq": 256, "Skv": 256, "D": 128, "Dv": 128}),
    ("attn_gqa", {"Sq": 128, "Skv": 128, "D": 128, "Dv": 128}),
    ("attn_window", {"Sq": 512, "Skv": 512, "D": 128, "Dv": 128, "W": 24}),
    ("attn_global", {"Sq": 256, "Skv": 256, "D": 64, "Dv": 64}),
    ("attn_norm_inside", {"Sq": 256, "Skv": 256, "D": 64, "Dv": 64})])
def test_products_accumulated_into_their_registers_match_numpy(name, sizes):
    # P·V accumulated straight into O's registers (rescaled first; the -inf guard on P, V declared finite) against
    # P·V into accumulators of its own added to O: both NumPy within the tolerance on every input variant and
    # magnitude (the order of the f32 additions differs, so not the same bits), and against each other; in turn
    # (loops of at most two tiles) and issued late (the larger ones).  The window of 24 keys leaves rows whose
    # first key tiles are all masked: the guard is taken.
    op, sizes, into = _kernel(name, "prefill", tuning=_own(name), **sizes)
    if not into.kernel_source.target.device.wgmma:
        pytest.skip(f"wgmma needs sm_90a; the device is {into.kernel_source.target.arch}")
    _, _, apart = _kernel(name, "prefill", codegen=CodegenOptions(accumulate_products=False), tuning=_own(name),
                          **sizes)
    assert "pv's product accumulates into its registers" in into.kernel_source.text
    assert "accumulates into" not in apart.kernel_source.text
    tolerance = op.tolerance("prefill", sizes)
    for magnitude, variant, inputs in _every_input(op, 9, sizes):
        a, b = into.run(inputs), apart.run(inputs)
        reference = op.reference(inputs, "prefill", sizes)
        for got, which in ((a, "into O"), (b, "apart")):
            result = ops.compare(got, reference, tolerance)
            assert result.ok, f"{which} {variant} at {magnitude:g}: {result.line()} worst {result.worst}"
        result = ops.compare(a, b, tolerance)
        assert result.ok, f"{variant} at {magnitude:g}: into O against apart {result.line()}"


@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_causal", {"Sq": 200, "Skv": 200, "D": 128, "Dv": 128}), ("attn_global", {"Sq": 130, "Skv": 190, "D": 64,
                                                                                     "Dv": 128}),
    ("attn_gqa", {"Sq": 150, "Skv": 150, "D": 128, "Dv": 128})])
def test_warpgroup_widths_match(name, sizes):
    # One 128-column warpgroup product (Q·Kᵀ over a 128-key tile; P·V over 128 value columns, an N-major b of two
    # panels) against two of 64 columns: the same multiply-adds in the same order per element, so the same bits;
    # and NumPy at every magnitude on edge inputs.
    op, sizes, wide = _kernel(name, "prefill", **sizes)
    if not wide.kernel_source.target.device.wgmma:
        pytest.skip(f"wgmma needs sm_90a; the device is {wide.kernel_source.target.arch}")
    _, _, narrow = _kernel(name, "prefill", codegen=CodegenOptions(warpgroup_width=64), **sizes)
    assert "pf::wgmma_m64n128k16_f16" in wide.kernel_source.text
    assert "m64n128k16" not in narrow.kernel_source.text
    tolerance = op.tolerance("prefill", sizes)
    for magnitude in op.magnitudes:
        for variant in ("random", "leading_zeros", "special"):
            inputs = op.inputs(5, "prefill", sizes, magnitude, variant)
            a, b = wide.run(inputs), narrow.run(inputs)
            for out in a:
                assert np.array_equal(np.asarray(a[out]), np.asarray(b[out]), equal_nan=True), (variant, magnitude, out)
            result = ops.compare(a, op.reference(inputs, "prefill", sizes), tolerance)
            assert result.ok, f"{variant} at {magnitude:g}: {result.line()} worst {result.worst}"


_NO_KEPT_TILES = CodegenOptions(keep_invariant=False, share_tiles=False, stream_ahead=False, refill_tiles=False)
_AT_ONCE = CodegenOptions(stream_ahead=False, refill_tiles=False)
_AHEAD = "the next iteration's tiles"
_REFILLED = "into the buffer"
_REFILL = CodegenOptions(stream_ahead=False)


@pytest.mark.parametrize(("off_options", "marker", "name", "mode", "sizes"), [
    (_NO_KEPT_TILES, "pf_keep", "attn_causal", "prefill", {"Sq": 128, "Skv": 128}),
    (_NO_KEPT_TILES, "pf_keep", "attn_mla_decode", "decode", _MLA_576),
    (CodegenOptions(resident=False), "in shared memory across the loop", "attn_mla_decode", "decode", _MLA_576),
    (CodegenOptions(resident=False), "in shared memory across the loop", "attn_gqa", "decode",
     {"Hq": 32, "Hkv": 2, "Skv": 4096}),
    (CodegenOptions(split_k=False), "pf_kg", "attn_mla_decode", "decode", _MLA_576),
    (_AT_ONCE, _AHEAD, "attn_mla_decode", "decode", _MLA_576),
    (_AT_ONCE, _AHEAD, "attn_mla_decode", "decode", {}),
    (_AT_ONCE, _AHEAD, "attn_global", "decode", {"B": 1, "Skv": 3001, "D": 64, "Dv": 64}),
    (_AT_ONCE, _AHEAD, "attn_gqa", "decode", {"Hq": 32, "Hkv": 2, "Skv": 4096}),
    ((_REFILL, _AT_ONCE), _REFILLED, "attn_mla_decode", "decode", _MLA_576),
    ((_REFILL, _AT_ONCE), _REFILLED, "attn_global", "decode", {"B": 1, "Skv": 3001, "D": 64, "Dv": 64}),
    ((_REFILL, _AT_ONCE), _REFILLED, "attn_causal", "decode", {"B": 2, "Skv": 1000}),
    ((_REFILL, _AT_ONCE), _REFILLED, "attn_gqa", "decode", {"Hq": 32, "Hkv": 2, "Skv": 4096})])
def test_staging_variants_match(off_options, marker, name, mode, sizes):
    # Tiles a loop keeps (copied once, or read from another dot's tile, or copied one iteration ahead, or
    # refilled after their last reader) and statistics kept in shared memory across the loop compute the same
    # expressions in the same order: the outputs are bit for bit those without them.  A k split among warp
    # groups (MLA's score, k = 576) sums in another order: it matches NumPy and the unsplit kernel within the
    # catalog tolerance.  A pair of options is (on, off); one is off, against the defaults.
    on_options, off_options = off_options if isinstance(off_options, tuple) else (None, off_options)
    op, sizes, on = _kernel(name, mode, codegen=on_options, **sizes)
    _, _, off = _kernel(name, mode, codegen=off_options, **sizes)
    assert marker in on.kernel_source.text and marker not in off.kernel_source.text
    for magnitude in op.magnitudes:
        inputs = op.inputs(5, mode, sizes, magnitude)
        a, b = on.run(inputs), off.run(inputs)
        for key in a:
            if not off_options.split_k:
                result = ops.compare({key: a[key]}, {key: b[key]}, op.tolerance(mode, sizes))
                assert result.ok, f"{key} at magnitude {magnitude:g}: {result.line()}"
            else:
                assert np.array_equal(a[key], b[key], equal_nan=True), f"{key} at magnitude {magnitude:g}"
        result = ops.compare(a, op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
        assert result.ok, f"magnitude {magnitude:g}: {result.line()} worst {result.worst}"


@pytest.mark.parametrize("loader", ["pycuda", "cuda-python"])
@pytest.mark.parametrize(("name", "mode"), [("attn_causal", "prefill"), ("attn_causal", "decode"),
                                           ("softmax", "default")])
def test_each_loader(loader, name, mode):
    op, sizes, kernel = _kernel(name, mode, loader=loader)
    assert kernel.loader.name == loader
    inputs = op.inputs(1, mode, sizes, 1.0)
    result = ops.compare(kernel.run(inputs), op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
    assert result.ok, result.line()


def test_torch_tensors_are_used_in_place():
    torch = pytest.importorskip("torch")
    op, sizes, kernel = _kernel("softmax", "default")
    inputs = op.inputs(0, "default", sizes, 1.0)
    x = torch.from_numpy(inputs["inp"]).cuda()
    y = torch.empty_like(x)
    returned = kernel(x, y)
    assert returned is y
    torch.cuda.synchronize()
    expected = op.reference(inputs, "default", sizes)["y"]
    assert np.allclose(y.cpu().numpy(), expected, rtol=1e-5, atol=1e-30)
    fresh = kernel(x)
    assert isinstance(fresh, torch.Tensor) and fresh.device == x.device
    with pytest.raises(LaunchError, match="'inp' is a PyTorch tensor on cpu"):
        kernel(x.cpu())
    with pytest.raises(LaunchError, match="'inp' is not contiguous"):
        kernel(torch.cat([x, x], dim=1)[:, ::2])
