"""A product issued one iteration late (:class:`~polyfuse.emit_cpp.fragments.Deferred`): attention prefill's P·V
of iteration ``j − 1`` issued right after ``j``'s Q·Kᵀ, so the tensor cores multiply during ``j``'s softmax.

The plan decides where it applies (a producer warpgroup, the accumulators and A fragments fitting the registers,
a third stage of tiles fitting shared memory, the statement reading only its own tensor, its product and row
values); the source carries the product across the iteration and its statement to the end of the next one.  The
GPU test (tests/test_gpu.py) runs it against the products issued in turn, bit for bit, and NumPy.
"""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA, Target
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import stages
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.emit_cpp.fragment_values import accumulated
from polyfuse.tiling.htile import TileStore, walk_tile_stmts

LATE = "issued one iteration late"
ACCUMULATES = "pv's product accumulates into pv's registers"
HOPPER = PRESETS["sm_90a"]


def _stages(name: str, target: Target = CUDA, device=HOPPER, rows: tuple = (), **sizes: int):
    op = ops.get(name)
    sizes = {**op.presets["prefill"], **sizes}
    # attn_norm_inside in its divide-inside form (the default GPU schedule hoists the division: attn_global's loop);
    # 128 query rows, two computing warpgroups (the bench sizes of 64-wide heads take 192 by the wave rule: below;
    # shorter sequences of them two blocks of 64 rows per SM: tests/test_paired_blocks.py)
    tuning = GpuTuning(hoist_divisors=name != "attn_norm_inside", prefill_wgmma_rows=rows, prefill_pair_rows=None)
    sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=device,
                           tuning=tuning)
    return stages(sch, dataclasses.replace(target, device=device))


@pytest.mark.parametrize("name", ["attn_global", "attn_norm_inside"])
def test_heads_64_wide_issue_pv_one_iteration_late_with_three_stages(name):
    # d = 64: P·V's 64 x 64 accumulators (32 registers) and P's A fragments (32) fit beside the tiles: the plan
    # says so, the producer copies into three stages, and P·V is issued after the next Q·Kᵀ's commit with the
    # wait for Q·Kᵀ alone (wgmma_wait<1>), its statement at the end of the iteration and after the loop.
    st = _stages(name)
    plan, text = st.dump("plan"), st.source.text
    assert LATE in plan and "into 3 stages" in plan
    assert "pf::wgmma_wait<1>();" in text
    assert re.search(r"pf::mbarrier_wait\(&pf_bar\d+\[3 \+ \(j_0 % 3\)\], \(\(j_0 / 3\) & 1\) \^ 1\);", text)
    assert "const int pf_prev = (32) - 1;" in text  # the last iteration's product, after the loop
    # the product of the previous iteration reads the value tile of its stage
    assert re.search(r"const uint64_t (pf_db\d+) = pf::wgmma_desc_k128\(\(pf_fb\d+ \+ \(pf_prev % 3\) \* \d+\)\);"
                     r"(?s:.*?)_rs<1, 0>\(pf_late_fc\d+, pf_late_fa\d+\[pf_ks\], pf::wgmma_desc_plus\(\1, ", text)


def test_every_iteration_computes_the_whole_score_tile():
    # The first iteration printed on its own and the loop's later ones each compute every statement over the same
    # columns as the loop with its products in turn (issuing P·V inside Q·Kᵀ's statement keeps Q·Kᵀ's 128 columns:
    # a P·V of 64 columns must not leak its sizes into the score's epilogue).
    late = _stages("attn_global").source.text
    in_turn = _stages("attn_global", CUDA.with_options(overlap_products=False)).source.text
    assert in_turn.count("pf_nb < 16;") > 0
    assert late.count("pf_nb < 16;") == 2 * in_turn.count("pf_nb < 16;")


def test_heads_128_wide_accumulate_into_o_and_issue_pv_late():
    # d = 128: P·V's own 64 accumulators + 32 A fragments more per thread would spill (ptxas: 32-340 bytes at 240
    # registers on the catalog's d128 kernels); accumulated straight into O's registers (O rescaled at the end of
    # the iteration before, the -inf guard on P) it keeps only its A fragments: issued late, three stages.
    for name in ("attn_causal", "attn_gqa", "attn_softcap"):
        st = _stages(name)
        plan, text = st.dump("plan"), st.source.text
        assert LATE in plan and "into 3 stages" in plan and ACCUMULATES in plan, name
        assert "pf::wgmma_wait<1>" in text and "pf_late_fc" not in text
        assert re.search(r"_rs<1, 0>\(pf_fr_pv_\d+, pf_late_fa\d+\[pf_ks\], .*, true\);", text)
        # with products accumulated from zero, it stays in turn (two stages)
        apart = _stages(name, CUDA.with_options(accumulate_products=False))
        assert LATE not in apart.dump("plan") and ACCUMULATES not in apart.dump("plan")
        assert "into 2 stages" in apart.dump("plan")


def test_heads_64_wide_keep_accumulators_of_their_own_where_late_fits():
    # d = 64: the late product fits with accumulators of its own, whose one add after the wait measured faster
    # than a rescaling pass before every issue: planned apart.
    st = _stages("attn_global")
    assert LATE in st.dump("plan") and ACCUMULATES not in st.dump("plan") and "pf_late_fc" in st.source.text


def test_three_warpgroups_of_64_wide_heads_accumulate_into_o_and_issue_pv_late():
    # 192 query rows (three computing warpgroups of 160 registers): P·V accumulates into O's registers (its -inf
    # guard moved onto the running max, so neither P nor the product selects per element) and is issued late.
    st = _stages("attn_global", rows=GpuTuning().prefill_wgmma_rows)
    plan, text = st.dump("plan"), st.source.text
    assert "12 warps of 16 whole rows (192 real)" in plan
    assert LATE in plan and ACCUMULATES in plan and "the guard on the running max" in plan
    assert re.search(r"_rs<1, 0>\(pf_fr_pv_\d+, pf_late_fa\d+\[pf_ks\], .*, true\);", text)


def test_no_late_product_where_the_loop_runs_at_most_twice():
    # 256 keys in 128-key tiles (and a causal loop of at most two tiles): nothing to overlap; the product
    # accumulates into O in turn (ptxas serialised late ones there: C7511).
    for name, sizes in (("attn_global", {"Sq": 256, "Skv": 256}), ("attn_causal", {"Sq": 256, "Skv": 256})):
        st = _stages(name, B=1, Hq=2, Hkv=2, **sizes)
        plan = st.dump("plan")
        assert LATE not in plan and ACCUMULATES in plan, name
        assert re.search(r"_rs<1, 0>\(pf_fr_pv_\d+, pf_fa\[pf_ks\], .*, true\);", st.source.text)
    assert LATE in _stages("attn_global", B=1, Hq=2, Hkv=2, Sq=256, Skv=384).dump("plan")


def test_accumulated_only_over_finite_inputs():
    # O·h + select(m = -inf, 0, P·V) is P·V accumulated from O·h with the guard on P only where 0·v = 0: V's
    # input declared finite.
    st = _stages("attn_causal")
    pv = next(s for s in walk_tile_stmts(st.gpu.program.body) if isinstance(s, TileStore) and s.block == "pv")
    assert accumulated(pv, pv.value, "ax0", lambda name: True) is not None
    assert accumulated(pv, pv.value, "ax0", lambda name: name != "v") is None
    assert accumulated(pv, pv.value, "ax1", lambda name: True) is None  # (the guard is not a condition of ax1)


def test_off_by_option_and_where_a_third_stage_does_not_fit_shared_memory():
    st = _stages("attn_global", CUDA.with_options(overlap_products=False))
    assert LATE not in st.dump("plan") and "into 2 stages" in st.dump("plan")
    # Q (16 KB) + two stages of K and V (64 KB) fit 100 KB, three (96 KB) do not: planned with the products in turn.
    small = dataclasses.replace(HOPPER, shared_per_block=100_000, shared_per_sm=101_024)
    st = _stages("attn_global", device=small)
    assert LATE not in st.dump("plan") and "into 2 stages" in st.dump("plan")
    assert re.search(r"planned with overlap_products=off \(three stages .* would take \d+ bytes", st.dump("plan"))
    assert "// polyfuse_attn_global_k0: planned with overlap_products=off" in st.source.text
    assert "planned with" not in _stages("attn_global").source.text


def test_not_where_the_product_is_a_statement_of_its_own():
    # A ragged key length keeps P·V as a tile of its own (pv_rf, per iteration) that pv then reads: the product's
    # statement is not the one that folds it, so nothing is deferred.
    st = _stages("attn_global", Sq=130, Skv=190, Hq=2, Hkv=2)
    assert "in warp fragments" in st.dump("plan") and LATE not in st.dump("plan")


def test_sm_80_sources_do_not_change():
    # Only the producer-warpgroup loop (sm_90a) defers: sm_80's source is the same with the option on or off.
    sm80 = PRESETS["sm_80"]
    on = _stages("attn_global", device=sm80).source.text
    off = _stages("attn_global", CUDA.with_options(overlap_products=False), device=sm80).source.text
    strip = re.compile(r"overlap_products=o(n|ff) ")
    assert strip.sub("", on) == strip.sub("", off)


@pytest.mark.nvcc
@pytest.mark.parametrize(("name", "sizes"), [
    ("attn_global", {}), ("attn_causal", {"Hq": 16, "Hkv": 16, "D": 64, "Dv": 64}),
    ("attn_window", {"D": 64, "Dv": 64}), ("attn_softcap", {"D": 64, "Dv": 64})])
def test_sources_with_a_late_product_compile_for_sm_90a(name, sizes):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    st = _stages(name, **sizes)
    assert LATE in st.dump("plan") and TURNS in st.dump("plan"), name
    compile_gpu(st.source.text, f"late_{name}", "cuda", "sm_90a", options=CompileOptions(werror=True),
                compile_only=True)


TURNS = "issue their products in turns"


def test_two_warpgroups_with_a_late_product_issue_in_turns():
    # 128 query rows = two computing warpgroups: each waits for its turn before Q·Kᵀ (the first warpgroup's first
    # turn is its own) and gives the other its turn once Q·Kᵀ and the late P·V are issued (the last warpgroup's
    # last turn gives none): per barrier, waits and gifts pair up over any number of iterations.
    st = _stages("attn_global")
    plan, text = st.dump("plan"), st.source.text
    assert "the 2 computing warpgroups " + TURNS in plan
    kernel = text.split("setmaxnreg_inc", 1)[1]
    waits = re.findall(r"(if \(pf_wg > 0\) )?pf::turn_wait\(1 \+ pf_wg, 256\);", kernel)
    gives = re.findall(r"(if \(pf_wg < 1\) )?pf::turn_give\(1 \+ \(pf_wg \+ 1\) % 2, 256\);", kernel)
    # first iteration, the loop's, after the loop
    assert waits == ["if (pf_wg > 0) ", "", ""] and gives == ["", "", "if (pf_wg < 1) "]
    # the turn covers the issue only: given before the wait for the products
    loop = kernel.split("for (int j_0 = 1;", 1)[1]
    assert loop.index("pf::turn_give") < loop.index("pf::wgmma_wait<1>();")
    assert loop.index("pf::turn_wait") < loop.index("pf::wgmma_fence();")


def test_no_turns_without_a_late_product_or_by_option():
    for st in (_stages("attn_global", CUDA.with_options(warpgroup_turns=False)),
               _stages("attn_global", CUDA.with_options(overlap_products=False)),
               _stages("attn_causal", CUDA.with_options(accumulate_products=False))):
        assert TURNS not in st.dump("plan") and "pf::turn_" not in st.source.text
    # one computing warpgroup (64 query rows: a late product, no one to take turns with)
    one = _stages("attn_global", B=1, Hq=2, Hkv=2, Sq=128, Skv=384)
    assert "4 warps of 16 whole rows" in one.dump("plan") and LATE in one.dump("plan")
    assert TURNS not in one.dump("plan") and "pf::turn_" not in one.source.text


def test_option_is_printed_in_the_source():
    assert "overlap_products=on" in _stages("attn_global").source.text
    assert CodegenOptions().overlap_products
