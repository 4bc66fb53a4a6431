"""Two blocks with a producer warpgroup per SM (:func:`~polyfuse.emit_cpp.plan._paired`) and the prefill rule that
takes them (:func:`~polyfuse.ops.schedules._paired_prefill`).

Where two blocks of a kernel with a producer warpgroup fit an SM (shared memory, threads) and each computing
thread's tiles fit the registers half the file leaves it, the kernel is planned for two: ``__launch_bounds__``
names two blocks and the warps trade registers within each block's half (24 for the producer, 232 for a 64-row
tile's computing warpgroup).  Prefill attention of 64-wide heads takes 64-row tiles two per SM where their waves
undercut the wider tile's (the sequences of up to 2048 queries of the bench's 16 heads); the 128-wide heads'
buffers do not fit twice.  The GPU test runs the paired kernel against one 128-row block per SM, bit for bit, on
every input variant and magnitude, and against NumPy.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from kernel_pairs import assert_same_bits_and_numpy

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA
from polyfuse.errors import BackendUnavailable, PolyfuseError
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build, stages
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu

HOPPER = PRESETS["sm_90a"]
UNPAIRED = GpuTuning(prefill_pair_rows=None)


def _stages(name: str, tuning: GpuTuning | None = None, device=HOPPER, **sizes: int):
    op = ops.get(name)
    sizes = {**op.presets["prefill"], **sizes}
    sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=device,
                           tuning=tuning)
    return stages(sch, dataclasses.replace(CUDA, device=device))


def _kernel(st):
    (kernel,) = st.plan.kernels
    return kernel


@pytest.mark.parametrize("name", ["attn_global", "attn_norm_inside"])
def test_short_prefill_of_narrow_heads_runs_two_64_row_blocks_per_sm(name):
    st = _stages(name, Sq=2048, Skv=2048)
    kernel = _kernel(st)
    assert kernel.threads == 256 and kernel.blocks_per_sm == 2 and kernel.min_blocks == 2
    assert [lp.extent.value for lp in kernel.nest.chain][-1] == 2048 // 64
    assert 2 * (kernel.peak + HOPPER.shared_reserved) <= HOPPER.shared_per_sm
    text = st.source.text
    assert "__launch_bounds__(256, 2)" in text
    # each block trades within its half of the register file: 128 threads x 24 + 128 x 232 = 256 x 128
    assert "pf::setmaxnreg_dec<24>();" in text and "pf::setmaxnreg_inc<232>();" in text
    assert "2 blocks per SM by shared memory and registers, __launch_bounds__ asks for 2" in st.dump("plan")


def test_the_wave_rule_keeps_wider_tiles_where_they_undercut_the_pair():
    # From 4096 queries (16 heads) the 192-row tile's waves are cheaper: one block per SM, as before.
    kernel = _kernel(_stages("attn_global", Sq=4096, Skv=4096))
    assert kernel.threads == 512 and kernel.blocks_per_sm == 1
    assert "__launch_bounds__(512, 1)" in _stages("attn_global", Sq=4096, Skv=4096).source.text


@pytest.mark.parametrize("name", ["attn_causal", "attn_gqa"])
def test_wide_heads_keep_one_block_per_sm(name):
    # 128-wide heads: the 64-row tile's key and value buffers do not fit an SM twice, so the rule keeps the
    # 128-row tile; a 64-row tile asked for runs alone on its SM with the registers of the whole file.
    assert _kernel(_stages(name, Sq=2048, Skv=2048)).threads == 384
    narrow = _stages(name, GpuTuning(prefill_tile=(64, 64), prefill_wgmma_rows=(), prefill_pair_rows=None),
                     Sq=2048, Skv=2048)
    kernel = _kernel(narrow)
    assert kernel.threads == 256 and kernel.blocks_per_sm == 1
    assert 2 * (kernel.peak + HOPPER.shared_reserved) > HOPPER.shared_per_sm
    assert "__launch_bounds__(256, 1)" in narrow.source.text and "pf::setmaxnreg_inc<256>();" in narrow.source.text


def test_no_pair_without_a_producer_or_when_switched_off():
    # Switched off: one block of 128 rows per SM.  sm_80 has no producer warpgroup (its fragment loop's blocks
    # per SM follow from shared memory and the options' min_blocks, as before).
    off = _stages("attn_global", UNPAIRED, Sq=2048, Skv=2048)
    assert _kernel(off).threads == 384 and "__launch_bounds__(384, 1)" in off.source.text
    assert "pf::setmaxnreg_inc<240>();" in off.source.text
    assert "setmaxnreg" not in _stages("attn_global", device=PRESETS["sm_80"], Sq=2048, Skv=2048).source.text
    with pytest.raises(PolyfuseError, match="prefill_pair_rows"):
        GpuTuning(prefill_pair_rows=0)


@pytest.mark.nvcc
@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_global", {"Sq": 2048, "Skv": 2048}), ("attn_norm_inside", {"Sq": 300, "Skv": 300}),
    ("attn_softcap", {"Sq": 1000, "Skv": 1000, "D": 64, "Dv": 64})])
def test_paired_sources_compile_for_sm_90a(name, sizes):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    st = _stages(name, **sizes)
    assert _kernel(st).blocks_per_sm == 2, name
    compile_gpu(st.source.text, f"paired_{name}", "cuda", "sm_90a", options=CompileOptions(werror=True),
                compile_only=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_global", {"Sq": 300, "Skv": 300, "D": 64, "Dv": 64}),
    ("attn_global", {"B": 2, "Sq": 260, "Skv": 333, "D": 64, "Dv": 64}),
    ("attn_norm_inside", {"Sq": 1000, "Skv": 1000, "D": 64, "Dv": 64}),
    ("attn_softcap", {"Sq": 300, "Skv": 300, "D": 64, "Dv": 64}),
    ("attn_causal", {"Sq": 257, "Skv": 257, "Hq": 4, "Hkv": 4, "D": 64, "Dv": 64})])
def test_paired_blocks_match_one_block_per_sm_bit_for_bit(name, sizes):
    # Two 64-row blocks per SM compute each row as one 128-row block does: the same bits on every input variant
    # and magnitude (ragged query tiles, two batches, the divide-inside form, a causal mask), NumPy within the
    # tolerance.  (Sequences of at least 256 queries: shorter ones are cut into 64-row tiles either way, and a
    # 64-row tile pairs wherever it fits.)
    op = ops.get(name)
    sizes = {**op.sizes("prefill"), **sizes}
    kernels = []
    for tuning in (GpuTuning(), UNPAIRED):
        try:
            sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", tuning=tuning)
            kernels.append(build(sch, "cuda", sizes=sizes, werror=True))
        except BackendUnavailable as err:
            pytest.skip(str(err))
    paired, alone = kernels
    if not paired.kernel_source.target.device.wgmma:
        pytest.skip(f"the producer warpgroup needs sm_90a; the device is {paired.kernel_source.target.arch}")
    assert "__launch_bounds__(256, 2)" in paired.kernel_source.text
    assert "__launch_bounds__(256, 2)" not in alone.kernel_source.text
    assert_same_bits_and_numpy(op, "prefill", sizes, paired, alone, seed=15)


def test_the_pair_keeps_the_late_product_of_the_tile_it_replaces():
    # The divide-inside form, unhoisted, keeps its late P·V in 64-row blocks two per SM (232 registers per
    # computing thread), so the pair replaces its 128-row tile; a pair that lost it would be refused, as the
    # 192-row tile is (tests/test_tiling_pad.py).
    from polyfuse.ops.schedules import _late_products
    from polyfuse.tiling import to_tiles

    op = ops.get("attn_norm_inside")
    sizes = {**op.presets["prefill"], "Sq": 3072, "Skv": 3072}
    sch = default_schedule("attn_norm_inside", "prefill", op.program("prefill", **sizes), target="cuda",
                           device=HOPPER, tuning=GpuTuning(hoist_divisors=False))
    assert next(t for t in to_tiles(sch.program).tensors if t.name == "score").shape[2].value == 64
    assert _late_products(sch, "cuda", HOPPER, None) == 1
