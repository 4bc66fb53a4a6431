"""Epilogue tiles written through shared memory (:func:`~polyfuse.emit_cpp.fragments.staged_store`) and the kept
tiles copied while the producer's first copies are under way.

A loop with a producer warpgroup (attention prefill on sm_90a) writes its output tile after a named barrier of the
computing warps into the shared memory of its operand buffers, each warp its own 16 rows, and copies them out in
16-byte pieces; its query tile is copied by the computing warps alone after the mbarriers are set up, so that the
producer's first key and value tiles are already on their way.  The plan says which statements are staged; the GPU
tests run them against the stores from registers, bit for bit, on every input variant and magnitude, at ragged
sizes, and against NumPy.
"""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest
from kernel_pairs import assert_same_bits_and_numpy

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA, CodegenOptions, Target
from polyfuse.errors import BackendUnavailable
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build, stages
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu

HOPPER = PRESETS["sm_90a"]
STAGED = re.compile(r"after the loop, from registers: out \(through (pf_fb\d+)'s shared memory, rows of (\d+), then "
                    r"(\d+) elements per copy\)")


def _stages(name: str, target: Target = CUDA, device=HOPPER, mode: str = "prefill", **sizes: int):
    op = ops.get(name)
    sizes = {**op.presets[mode], **sizes}
    sch = default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=device)
    return stages(sch, dataclasses.replace(target, device=device))


@pytest.mark.parametrize(("name", "sizes", "pitch"), [
    ("attn_global", {}, 72), ("attn_causal", {}, 136), ("attn_gqa", {}, 136),
    ("attn_global", {"Sq": 300, "Skv": 300}, 72)])
def test_prefill_stages_its_output_through_an_operand_buffer(name, sizes, pitch):
    # The plan names the buffer and the row pitch (the columns and 16 bytes of padding); the source waits at the
    # computing warps' named barrier before the epilogue, writes each element into shared memory and copies each
    # warp's rows out in 16-byte pieces: no element of out is stored from a register.
    st = _stages(name, **sizes)
    plan, text = st.dump("plan"), st.source.text
    found = STAGED.search(plan)
    assert found and int(found.group(2)) == pitch and found.group(3) == "8", plan
    epilogue = text.split("// out\n", 1)[1]
    assert re.search(r"pf::named_sync\(\d+, \d+\);  // \(every computing warp is done", text.split("// out\n")[-2])
    assert f"reinterpret_cast<uint16_t*>({found.group(1)})[pf_m * {pitch} + x_ax1] = " in epilogue
    assert "*reinterpret_cast<uint4*>(&out[" in epilogue
    assert not re.search(r"^\s*(if \(.*\) )?out\[", epilogue, re.M)


def test_ragged_rows_are_guarded_in_the_copy():
    # 300 query rows: the last tile's rows past the sequence are neither staged nor copied (the statement's mask).
    text = _stages("attn_global", Sq=300, Skv=300).source.text.split("// out\n", 1)[1]
    copy = text.split("__syncwarp();", 1)[1]
    assert re.search(r"if \(\(\(\(\(i_0 \* \(\d+\)\) \+ x_ax0\) < \(300\)\)\)\) \*reinterpret_cast<uint4\*>", copy)


def test_off_by_option_and_without_a_producer():
    # Off: the plan stages nothing and the elements are stored from the registers, as on sm_80 (no producer
    # warpgroup, no barrier that frees the operand buffers).
    off = _stages("attn_causal", CUDA.with_options(staged_stores=False))
    sm80 = _stages("attn_causal", device=PRESETS["sm_80"])
    for st in (off, sm80):
        assert not STAGED.search(st.dump("plan"))
        assert "pf::named_sync" not in st.source.text.split("// out\n")[-1]
        assert re.search(r"^\s*out\[", st.source.text.split("// out\n")[-1], re.M)
    assert "staged_stores=on" in _stages("attn_causal").source.text and CodegenOptions().staged_stores


def test_kept_tile_is_copied_after_the_barriers_are_set_up():
    # The mbarriers first and the block's barrier, then the producer issues its copies while the computing warps
    # copy the query tile and meet at their own named barrier before the first product.
    text = _stages("attn_causal").source.text
    setup, rest = text.split("__syncthreads();", 1)
    assert "pf::mbarrier_init" in setup and "pf::cp_async16" not in setup
    producer, computing = rest.split("pf::setmaxnreg_inc", 1)
    assert "pf::tma_load_" in producer and "pf::cp_async16" not in producer
    kept = computing.split("pf::wgmma_fence();", 1)[0]
    assert kept.index("pf::cp_async16(&pf_keep") < kept.index("pf::cp_async_wait<0>();") < kept.index(
        "pf::named_sync(3, 256);")


@pytest.mark.nvcc
@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_global", {"Sq": 300, "Skv": 300}), ("attn_causal", {"Sq": 130, "Skv": 130}), ("attn_gqa", {})])
def test_staged_sources_compile_for_sm_90a(name, sizes):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    st = _stages(name, **sizes)
    assert STAGED.search(st.dump("plan"))
    compile_gpu(st.source.text, f"staged_{name}", "cuda", "sm_90a", options=CompileOptions(werror=True),
                compile_only=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_global", {"Sq": 300, "Skv": 300, "D": 64, "Dv": 64}),
    ("attn_global", {"B": 2, "Sq": 200, "Skv": 333, "D": 64, "Dv": 64}),
    ("attn_causal", {"Sq": 257, "Skv": 257, "D": 128, "Dv": 128}),
    ("attn_gqa", {"B": 2, "Sq": 130, "Skv": 250, "D": 128, "Dv": 128}),
    ("attn_window", {"Sq": 200, "Skv": 200, "D": 128, "Dv": 128, "W": 50}),
    ("attn_softcap", {"Sq": 129, "Skv": 129, "D": 64, "Dv": 64})])
def test_staged_stores_match_stores_from_registers_bit_for_bit(name, sizes):
    # The same values through shared memory: the same bits on every input variant and magnitude (ragged query
    # tiles, two batches, grouped heads whose next head's rows lie right after the edge), and NumPy within the
    # tolerance.
    op = ops.get(name)
    sizes = {**op.sizes("prefill"), **sizes}
    kernels = []
    for on in (True, False):
        try:
            kernels.append(build(default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda"),
                                 "cuda", sizes=sizes, werror=True, codegen=CodegenOptions(staged_stores=on)))
        except BackendUnavailable as err:
            pytest.skip(str(err))
    staged, direct = kernels
    if not staged.kernel_source.target.device.wgmma:
        pytest.skip(f"the producer warpgroup needs sm_90a; the device is {staged.kernel_source.target.arch}")
    marker = "(the warp's rows are staged)"
    assert marker in staged.kernel_source.text and marker not in direct.kernel_source.text
    assert_same_bits_and_numpy(op, "prefill", sizes, staged, direct, seed=12)
