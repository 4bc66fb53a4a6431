"""GPU decode attention with the query heads of one kv head as the rows of each tile.

The plan (``_attention_decode_gpu``) gives one thread block per (batch, head group, key split),
rolls over tiles of the split inside the block and combines the splits afterwards.  Checked here:
the tiling rule, the structure of the fused program and of the CUDA kernels (grid, heads per block,
tensor-core products), and the fused program against NumPy on the loop and tile interpreters and
the host C++ backend, at sizes that exercise every path: several steps per split, a ragged last
split, one split (no combine), an odd number of heads per group.  The ``gpu`` tests run the same
cases on an NVIDIA GPU.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA, emit
from polyfuse.errors import PolyfuseError
from polyfuse.ir import interpret
from polyfuse.ir.affine import fold_div_mod
from polyfuse.ir.expr import Var
from polyfuse.ops import schedules
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import DecodeTiling, default_schedule, gpu_decode_tiling
from polyfuse.tiling import interpret as interpret_tiles
from polyfuse.tiling import to_tiles
from polyfuse.transforms.compact import compaction
from polyfuse.transforms.schedule import Schedule


def _scheduled(name: str, tiling: DecodeTiling | None, **sizes: int) -> tuple[ops.Operator, dict, Schedule]:
    op = ops.get(name)
    sizes = {**op.sizes("decode"), **sizes}
    program = op.program("decode", **sizes)
    if tiling is None:
        return op, sizes, default_schedule(name, "decode", program, target="cuda")
    sch = Schedule(program)
    schedules._attention_decode_gpu(sch, tiling)
    sch.compact_buffers()
    return op, sizes, sch


def _check(op: ops.Operator, sizes: dict, run) -> None:
    for magnitude in op.magnitudes:
        inputs = op.inputs(0, "decode", sizes, magnitude)
        result = ops.compare(run(inputs), op.reference(inputs, "decode", sizes), op.tolerance("decode", sizes))
        assert result.ok, f"magnitude {magnitude:g}: {result.line()} worst {result.worst}"


# ------------------------------------------------------------------ the tiling rule

@pytest.mark.parametrize(("name", "preset", "expected", "splits"), [
    # MLA: 8 warps, one warp tile of 64 of the 576 columns each (the rule's cap; the value's 512 need 8 too)
    ("attn_mla_decode", "decode", DecodeTiling(16, 64, 1024, warps=8), 32),
    ("attn_mla_decode", "decode_b32", DecodeTiling(16, 64, 2048, warps=8), 2),  # two waves of two blocks per SM
    ("attn_gqa", "decode", DecodeTiling(8, 128, 1024, warps=4), 32),
    ("attn_softcap", "decode", DecodeTiling(2, 128, 1024, warps=4), 32),
    ("attn_causal", "decode", DecodeTiling(1, 128, 1024, warps=4), 32),
    ("attn_global", "decode_b32", DecodeTiling(1, 128, 4096, warps=4), 1),
])
def test_tiling_rule_at_the_bench_presets(name, preset, expected, splits):
    sizes = ops.get(name).presets[preset]
    if name == "attn_mla_decode":
        args = (sizes["B"], sizes["H"], 1, sizes["Skv"], sizes["Dv"] + sizes["Drope"])
    else:
        args = (sizes["B"], sizes["Hq"], sizes["Hkv"], sizes["Skv"], sizes["D"])
    tiling = gpu_decode_tiling(*args)
    assert tiling == expected
    assert tiling.splits(sizes["Skv"]) == splits


def test_tiling_rule_follows_the_tuning_and_the_device():
    small = dataclasses.replace(PRESETS["sm_90a"], sms=16)
    tuning = GpuTuning(decode_heads=32, decode_waves=4)  # 8 blocks per SM of 16: 128 blocks
    tiling = gpu_decode_tiling(1, 128, 1, 32768, 576, device=small, tuning=tuning)
    assert (tiling.heads, tiling.tile) == (32, 64)
    assert tiling.splits(32768) == 32  # 4 head groups × 32 splits = 128 blocks
    half = dataclasses.replace(tuning, decode_blocks_per_sm=4)
    assert gpu_decode_tiling(1, 128, 1, 32768, 576, device=small, tuning=half).splits(32768) == 16
    assert gpu_decode_tiling(1, 24, 8, 4096, 128, tuning=tuning).heads == 3  # a divisor of the group of 3
    long_splits = GpuTuning(decode_min_split=4096, decode_short_split=4096)
    assert gpu_decode_tiling(1, 128, 1, 32768, 576, tuning=long_splits).splits(32768) == 8
    assert gpu_decode_tiling(1, 128, 1, 32768, 576, tuning=GpuTuning(combine_columns=64)).columns == 64


def test_decode_warps_cover_the_value_product_with_one_warp_tile_each():
    # 1 or 16 query rows (one 16-row strip) of 128 value columns: two warp tiles, so the tuning's 4 warps.
    assert gpu_decode_tiling(1, 16, 16, 32768, 64, value_dim=64).warps == 4
    assert gpu_decode_tiling(1, 64, 4, 4096, 128, value_dim=128).warps == 4
    # MLA's 512 value columns need 8 warp tiles of 64 (else its accumulators leave registers); never more than
    # the device's default of 8, nor fewer than the tuning asks.
    assert gpu_decode_tiling(1, 16, 1, 32768, 576, value_dim=512).warps == 8
    assert gpu_decode_tiling(1, 32, 1, 32768, 128, value_dim=1024).warps == 8
    # (blocks whose warps share the tiles: one-row decode at 4096 keys would split its keys among warps)
    shared = {"decode_warp_splits": 1}
    assert gpu_decode_tiling(1, 16, 16, 4096, 64, value_dim=64, tuning=GpuTuning(decode_warps=8, **shared)).warps == 8
    assert gpu_decode_tiling(1, 16, 16, 4096, 64, value_dim=512, tuning=GpuTuning(warps=2, **shared)).warps == 2
    # The schedule asks every kernel (partials and combine) for those warps.
    op = ops.get("attn_global")
    sizes = {**op.sizes("decode"), "Skv": 4096}
    sch = default_schedule("attn_global", "decode", op.program("decode", **sizes), target="cuda")
    assert [launch.threads for launch in emit(to_tiles(sch.program), TWO_LAUNCHES).launches] == [128, 128]


def test_splits_divide_the_tiles_and_aim_at_two_waves_of_resident_blocks():
    # MLA's partial block (64 keys x 584 and 16 query rows of 584, f16) leaves room for two blocks per SM:
    # at B=32 the 256 head groups get 2 splits (2 waves of 264), not the 4 that 8 blocks per SM ask for.
    # A split count that does not divide the tiles is lowered to one that does (no masked last split).
    assert gpu_decode_tiling(32, 128, 1, 4096, 576).splits(4096) == 2
    four_waves = GpuTuning(decode_waves=4)
    assert gpu_decode_tiling(32, 128, 1, 4096, 576, tuning=four_waves).splits(4096) == 4
    fewer_blocks = GpuTuning(decode_waves=4, decode_blocks_per_sm=5)  # 660 blocks: 3 splits of the 256 groups
    assert gpu_decode_tiling(32, 128, 1, 4096, 576, tuning=fewer_blocks).splits(4096) == 2  # 3 does not divide 64
    tiling = gpu_decode_tiling(1, 32, 32, 40 * 128, 128)  # 40 tiles: 32 splits would not divide them
    assert tiling.splits(40 * 128) == 5 and tiling.split == 8 * 128


def test_a_tiling_that_splits_a_group_across_kv_heads_is_refused():
    op = ops.get("attn_gqa")
    sch = Schedule(op.program("decode", Hq=8, Hkv=2))
    with pytest.raises(PolyfuseError, match="must divide the 4 query heads"):
        schedules._attention_decode_gpu(sch, DecodeTiling(3, 16, 16))


# ------------------------------------------------------------------ structure

def test_grouped_plan_structure_gqa():
    """8 query heads on 2 kv heads, 2 heads per block: grid (b, i, 4 head groups, 3 splits)."""
    op, sizes, sch = _scheduled("attn_gqa", DecodeTiling(2, 16, 32), Hq=8, Hkv=2, Skv=80)
    trace = sch.trace.python()
    assert 'sch.split(loop=sch.loop("qk", "h"), factors=[None, 2])' in trace
    assert 'sch.split(loop=sch.loop("qk", "j"), factors=[None, 2, 16])' in trace
    assert "sch.rolling_update(block='pv_rf'" in trace
    # The kv head of head group h_0 is h_0 // 2 (two groups per kv head) in the tile program.
    tiles = str(to_tiles(sch.program))
    assert "load(k[b, h_0 // 2, 32 * j_0 + 16 * j_1 + :16@j_2, :16@d]" in tiles
    assert "load(q[b, 2 * h_0 + :2@h_1, i, :16@d])" in tiles
    # pv's partials keep the split before dv: [b, heads, i, split, dv] per head group.
    assert sch.program.tensor("pv_rf").shape[-2:] == (sch.program.tensor("row_max_rf").shape[-1],
                                                     sch.program.tensor("pv").shape[-1])
    source = emit(to_tiles(sch.program), TWO_LAUNCHES)
    partial, combine = source.launches
    assert _blocks(partial) == sizes["B"] * 4 * 3 and _blocks(combine) == sizes["B"] * 4
    (folded,) = emit(to_tiles(sch.program), CUDA).launches  # the last block of each row combines
    assert _blocks(folded) == _blocks(partial)


def test_combine_spread_over_column_blocks():
    """The combine gets a block per 8 of dv's 16 columns: pv's combine computed at the column block, the row
    statistics recomputed there, so that the column loop joins the combine's grid."""
    _, sizes, sch = _scheduled("attn_gqa", DecodeTiling(2, 16, 32, 8), Hq=8, Hkv=2, Skv=80)
    trace = sch.trace.python()
    assert 'sch.split(loop=sch.loop("out", "ax1"), factors=[None, 8])' in trace
    assert "sch.compute_at(block='pv', loop=sch.loop(\"out\", \"ax1_0\"))" in trace
    assert "sch.recompute_at(block='row_max', loop=sch.loop(\"out\", \"ax1_0\"))" in trace
    partial, combine = emit(to_tiles(sch.program), TWO_LAUNCHES).launches
    assert _blocks(partial) == sizes["B"] * 4 * 3 and _blocks(combine) == sizes["B"] * 4 * 2
    # Folded, the last block of a row runs the two column blocks one after the other.
    text = emit(to_tiles(sch.program), CUDA).text
    assert "for (int ax1_0 = 0; ax1_0 < (2); ++ax1_0)" in text


def test_combine_columns_that_do_not_divide_dv_keep_one_block_per_group():
    _, sizes, sch = _scheduled("attn_gqa", DecodeTiling(2, 16, 32, 6), Hq=8, Hkv=2, Skv=80)
    assert "recompute_at" not in sch.trace.python()
    _, combine = emit(to_tiles(sch.program), TWO_LAUNCHES).launches
    assert _blocks(combine) == sizes["B"] * 4


@pytest.mark.parametrize(("name", "groups", "splits", "steps", "products", "dv"), [
    # MLA: 8 groups of 16 heads × 32 splits of 1024 keys in 16 steps of 64; dv 512
    ("attn_mla_decode", 8, 32, 16, ("16x64x576", "16x512x64"), 512),
    # GQA: one group of 8 heads per kv head × 32 splits of 1024 keys in 8 steps of 128; dv 128
    ("attn_gqa", 8, 32, 8, ("8x128x128", "8x128x128"), 128),
])
def test_grouped_plan_structure_at_the_bench_preset(name, groups, splits, steps, products, dv):
    op = ops.get(name)
    sch = default_schedule(name, "decode", op.program("decode", **op.presets["decode"]), target="cuda")
    source = emit(to_tiles(sch.program), TWO_LAUNCHES)
    partial, combine = source.launches
    assert _blocks(partial) == groups * splits
    # The combine's grid: head groups × blocks of combine_columns output columns.
    assert _blocks(combine) == groups * (dv // GpuTuning().combine_columns)
    assert partial.shared <= 227 * 1024
    assert f"for (int j_1 = 0; j_1 < ({steps}); ++j_1)" in source.text
    scores, values = products
    assert re.search(rf"tensor cores: {scores} .*b as \[n\]\[k\]", source.text)  # heads × keys × d
    assert re.search(rf"tensor cores: {values} .*b as \[k\]\[n\]", source.text)  # heads × dv × keys


TWO_LAUNCHES = CUDA.with_options(fold_combine=False)
"""The partial and combine kernels launched one after the other (the fallback of the folded combine)."""


def _blocks(launch) -> int:
    from polyfuse.ir.expr import Const
    from polyfuse.ir.simplify import simplify

    blocks = simplify(launch.blocks)
    assert isinstance(blocks, Const), blocks
    return int(blocks.value)


# ------------------------------------------------------------------ against NumPy

CASES = [
    ("attn_gqa", None, {}),                                                 # catalog test sizes, default rule
    ("attn_gqa", DecodeTiling(2, 16, 32), {"Hq": 8, "Hkv": 2, "Skv": 80}),  # 2 steps per split, last split ragged
    ("attn_gqa", DecodeTiling(3, 16, 32), {"Hq": 6, "Hkv": 2, "Skv": 70}),  # 3 heads per block, group of 3
    ("attn_softcap", DecodeTiling(2, 16, 32), {"Skv": 80}),
    ("attn_mla_decode", DecodeTiling(2, 16, 32), {"Skv": 80}),              # 2 groups of 2 heads, one kv head
    ("attn_mla_decode", DecodeTiling(4, 16, 112), {"Skv": 100}),            # one split: no combine
    ("attn_causal", DecodeTiling(1, 16, 48), {"Skv": 100}),                 # MHA: one head per block
    ("attn_norm_inside", DecodeTiling(1, 16, 32), {"Skv": 80}),             # two producers of pv
    ("attn_mla_decode", DecodeTiling(2, 16, 32, 8), {"Skv": 80}),           # combine: 7 blocks of 8 columns
    ("attn_norm_inside", DecodeTiling(1, 16, 32, 4), {"Skv": 80}),          # combine: 4 blocks of 4 columns
    ("attn_gqa", DecodeTiling(2, 16, 32, 8), {"Hq": 8, "Hkv": 2, "Skv": 80}),  # 2 column blocks
    ("attn_mla_decode", DecodeTiling(2, 16, 32), {"Skv": 64}),              # no ragged tile: v read from k's tile
]
IDS = [f"{n}-{'default' if t is None else f'{t.heads}x{t.tile}x{t.split}x{t.columns}'}" for n, t, _ in CASES]


@pytest.mark.parametrize(("name", "tiling", "sizes"), CASES, ids=IDS)
def test_grouped_plan_matches_numpy_on_the_interpreters(name, tiling, sizes):
    op, sizes, sch = _scheduled(name, tiling, **sizes)
    tiles = to_tiles(sch.program)
    _check(op, sizes, lambda inputs: interpret(sch.program, inputs))
    _check(op, sizes, lambda inputs: interpret_tiles(tiles, inputs))


@pytest.mark.parametrize(("name", "tiling", "sizes"), [CASES[i] for i in (2, 4, 5, 8, 9)],
                         ids=[IDS[i] for i in (2, 4, 5, 8, 9)])
def test_grouped_plan_matches_numpy_on_the_host(name, tiling, sizes):
    from polyfuse.pipeline import build

    op, sizes, sch = _scheduled(name, tiling, **sizes)
    kernel = build(sch, "cpp", sizes=sizes, werror=True)
    _check(op, sizes, kernel.run)


@pytest.mark.gpu
@pytest.mark.parametrize("fold", [True, False], ids=["folded", "two-launches"])
@pytest.mark.parametrize(("name", "tiling", "sizes"), CASES, ids=IDS)
def test_grouped_plan_matches_numpy_on_the_gpu(name, tiling, sizes, fold):
    from polyfuse.emit_cpp.options import CodegenOptions
    from polyfuse.errors import BackendUnavailable
    from polyfuse.pipeline import build

    op, sizes, sch = _scheduled(name, tiling, **sizes)
    try:
        kernel = build(sch, "cuda", sizes=sizes, werror=True, codegen=CodegenOptions(fold_combine=fold))
    except BackendUnavailable as err:
        pytest.skip(str(err))
    _check(op, sizes, kernel.run)


# ------------------------------------------------------------------ the index rewrites the plan relies on

def test_fold_div_mod_folds_a_head_group_into_its_kv_head():
    h = Var("h_0") * 2 + Var("h_1")
    assert str(fold_div_mod(h // 4, {"h_1": 2})) == "h_0 // 2"
    assert fold_div_mod(h // 4, {"h_1": 3}) == h // 4  # h_1 = 2 would carry into h_0: not folded
    assert str(fold_div_mod((Var("h_0") * 4 + Var("h_1")) // 4, {"h_1": 4})) == "h_0"


def test_simplest_floor_is_the_same_function():
    import operator
    import random

    from polyfuse.ir.expr import Const
    from polyfuse.transforms.compact import _from_form, _simplest_floor, _with_mods

    ops_ = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv}

    def value(e, env):
        if isinstance(e, Const):
            return int(e.value)
        if isinstance(e, Var):
            return env[e.name]
        return ops_[e.op](value(e.a, env), value(e.b, env))

    rng = random.Random(0)
    x, y = Var("x"), Var("y")
    for _ in range(200):
        atom = (x * rng.randint(1, 50) + y * rng.randint(-50, -1) + rng.randint(-50, 50)) // rng.randint(2, 40)
        rewritten = _from_form(_simplest_floor(atom))
        for _ in range(10):
            env = {"x": rng.randint(-100, 100), "y": rng.randint(-100, 100)}
            assert value(rewritten, env) == value(atom, env), (atom, rewritten, env)
    j = Var("j")
    assert str(_from_form(_simplest_floor((j * 15 + 15) // 16))) == "j - j // 16"
    assert str(_with_mods(j * -15 + (j * 15 + 15) // 16 * 16)) == "j % 16"


def test_compaction_of_a_nested_split_indexes_by_modulo():
    """ISL writes the offset of a key inside its step as pieces and ``⌊(15j + 15)/16⌋``; the compacted
    score tile is still indexed ``j % 16``."""
    op = ops.get("attn_causal")
    sch = Schedule(op.program("decode", Skv=72))
    schedules._attention_decode_gpu(sch, DecodeTiling(1, 16, 32))
    report = compaction(sch.program)
    shapes = {c.tensor: c.new_shape for c in report.compacted}
    assert [int(x.value) for x in shapes["qk"]] == [1, 1, 1, 16]
    text = str(report.program)
    assert "qk[0, 0, i, j % 16]" in text and "score[0, 0, i, j % 16]" in text


@pytest.mark.parametrize(("args", "split", "splits"), [
    ((1, 16, 16, 4096, 64), 256, 16),  # 16 heads x 4 splits of 1024 = 64 blocks < 132 SMs: splits of 256
    ((1, 16, 16, 1024, 64), 256, 4),
    ((1, 64, 8, 4096, 128), 256, 16),  # GQA: 8 head groups
    ((1, 16, 16, 32768, 64), 1024, 32),  # 512 blocks: the 1024-key splits stand
    ((1, 128, 1, 32768, 576), 1024, 32),  # MLA: 8 head groups x 32 = 256 blocks
    ((32, 64, 64, 4096, 128), 4096, 1),  # 2048 blocks without splitting
])
def test_short_splits_only_where_the_grid_would_leave_sms_idle(args, split, splits):
    # Splits shorter than decode_min_split (down to decode_short_split keys) where the longer ones would give the
    # grid fewer blocks than the device has SMs (132 on sm_90a); elsewhere the combine's traffic keeps them long.
    tiling = gpu_decode_tiling(*args)
    assert (tiling.split, tiling.splits(args[3])) == (split, splits)
