"""The GPU plans of quant_gemm, moe_routing, inertia and performer: steps, tile programs, kernels, results.

The GEMM plans make the product one of tiles per thread block: grid loops over output tiles, a sequential
rolling loop over k tiles inside, and a ``dot`` of [rows × k-tile]·[k-tile × cols] tiles in its body.
inertia splits its points into tiles reduced in parallel, then combined (split-k); performer rolls over
tiles of keys and of features with its GEMMs as products of tiles, its key side split-k over (batch, head,
key split) blocks, each rolling over the key tiles of its split.
The fused programs agree with NumPy on the loop interpreter, the tile interpreter and the host C++
backend at the test sizes and at sizes with partial tiles; the CUDA kernels are emitted at the bench
presets (launch shape, shared memory) without a GPU.
"""

from __future__ import annotations

import functools

import pytest
import sympy

from polyfuse import ops, tiling
from polyfuse.emit_cpp import CUDA, emit
from polyfuse.tiling.grid import CTA, partition
from polyfuse.errors import BackendUnavailable, NoRepairFound
from polyfuse.ir import interpret
from polyfuse.ir.expr import Const
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import Loop
from polyfuse.ops import schedules
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import PerformerTiling, _fit, default_schedule, gpu_performer_tiling
from polyfuse.pipeline import build
from polyfuse.tiling.htile import Dot, TileStore, axes_of, walk_tile_expr, walk_tile_stmts
from polyfuse.transforms.schedule import Schedule
from polyfuse.transforms.tree import loops_of

GEMM = {"M": 128, "K": 96, "N": 128}
GATE = {"S": 128, "HD": 96, "E": 64, "K": 8}


@functools.cache
def gpu_schedule(name: str, **sizes: int):
    op = ops.get(name)
    return default_schedule(name, "default", op.program("default", **op.sizes("default", sizes)), target="cuda")


def tiles(name: str, **sizes: int):
    return tiling.to_tiles(gpu_schedule(name, **sizes).program)


def stores(tile_program) -> dict[str, TileStore]:
    return {s.block: s for s in walk_tile_stmts(tile_program.body) if isinstance(s, TileStore)}


def the_dot(store: TileStore) -> Dot:
    (dot,) = [e for e in walk_tile_expr(store.value) if isinstance(e, Dot)]
    return dot


def loop_of(tile_program, name: str) -> Loop:
    (lp,) = [s for s in walk_tile_stmts(tile_program.body) if isinstance(s, Loop) and s.var.name == name]
    return lp


def tile_shape(e, sizes: dict[str, int]) -> list[int]:
    return [sizes[a] for a in axes_of(e)]


# ------------------------------------------------------------------ quant_gemm

def test_quant_gemm_plan_recomputes_amax_per_block_and_rolls_over_k_tiles():
    sch = gpu_schedule("quant_gemm", **GEMM)
    assert [s.primitive for s in sch.trace.steps] == [
        "cache_write", "tile", "recompute_at", "split", "reorder", "rolling_update", "reverse_compute_at",
        "compact_buffers"]
    (fusion,) = sch.fusions
    r = fusion.repair
    assert fusion.consumer == "s_gemm" and fusion.producers == ("s_amax",)
    assert sympy.simplify(r.h - r.t * r.old[0] / r.new[0]) == 0
    program = sch.program
    assert [lp.var.name for lp in loops_of(program, "s_gemm_rf")][:3] == ["i_0", "n_0", "k_0"]
    assert [int(d.value) for d in program.tensor("amax").shape] == [1, 64]  # one row tile's amax per block


def test_quant_gemm_tile_program_is_a_dot_of_tiles_inside_the_k_loop():
    tp = tiles("quant_gemm", **GEMM)
    rows, cols, step = GpuTuning().gemm_tile
    step = _fit(step, GEMM["K"])  # the k step shrinks until K spans two of them
    k0 = loop_of(tp, "k_0")
    inside = [s.block for s in walk_tile_stmts(k0) if isinstance(s, TileStore)]
    assert inside == ["s_amax_save", "s_amax", "s_gemm_rf", "s_gemm"]
    dot = the_dot(stores(tp)["s_gemm_rf"])
    sizes = {"ax0": rows, "n_1": cols, "k_1": step}
    assert dot.axis == "k_1"
    assert tile_shape(dot.a, sizes) == [rows, step] and tile_shape(dot.b, sizes) == [step, cols]
    assert int(k0.extent.value) == -(-GEMM["K"] // step)  # type: ignore[attr-defined]


def test_quant_gemm_is_one_cta_kernel_over_the_output_tiles():
    tp = tiles("quant_gemm", **GEMM)
    _, nests = partition(tp)
    ((kind, chain),) = [(n.kind, [lp.var.name for lp in n.chain]) for n in nests]
    assert kind == CTA and chain == ["i_0", "n_0"]
    source = emit(tp, CUDA)
    # W, read by every row block, is split into bf16 hi + lo once, by a kernel launched first
    # (polyfuse.emit_cpp.presplit); the GEMM copies both parts raw.
    split, launch = source.launches
    assert split.kernel == "polyfuse_quant_gemm_split_W" and launch.kernel == "polyfuse_quant_gemm_k0"
    assert launch.threads == 256
    assert "for (int k_0 = 0; k_0 < (3); ++k_0)" in source.text
    assert "W_pf_hi[" in source.text and "W_pf_lo[" in source.text


def test_quant_gemm_preset_launch():
    op = ops.get("quant_gemm")
    source = emit(tiles("quant_gemm", **op.presets["default"]), CUDA)
    _, launch = source.launches
    grid = launch.blocks
    blocks = int(grid.value) if hasattr(grid, "value") else int(grid.a.value) * int(grid.b.value)
    rows, cols, _ = GpuTuning().gemm_tile
    assert blocks == (4096 // rows) * (4096 // cols)
    assert 0 < launch.shared <= 227 * 1024


def test_quant_gemm_fp8_gpu_plan_is_refused():
    with pytest.raises(NoRepairFound, match="round"):
        gpu_schedule("quant_gemm_fp8")


# ------------------------------------------------------------------ moe_routing

def test_moe_plan_tiles_token_rows_with_the_gate_product_inside():
    sch = gpu_schedule("moe_routing", **GATE)
    program = sch.program
    for block in ("s_gate", "s_max", "s_sum", "s_rank", "s_topv", "s_topi", "s_probs"):
        assert loops_of(program, block)[0].var.name == "s_0", block
    rows, step = GpuTuning().gate_tile
    tp = tiles("moe_routing", **GATE)
    h0 = loop_of(tp, "h_0")
    assert [s.block for s in walk_tile_stmts(h0) if isinstance(s, TileStore)] == ["s_gate_rf", "s_gate"]
    dot = the_dot(stores(tp)["s_gate_rf"])
    sizes = {"s_1": rows, "h_1": step, "e": GATE["E"]}
    assert tile_shape(dot.a, sizes) == [rows, step] and tile_shape(dot.b, sizes) == [step, GATE["E"]]
    _, nests = partition(tp)
    assert [(n.kind, [lp.var.name for lp in n.chain]) for n in nests] == [(CTA, ["s_0"])]


def test_moe_preset_launch():
    op = ops.get("moe_routing")
    source = emit(tiles("moe_routing", **op.presets["default"]), CUDA)
    # The gate weights, read by every token block, are split into bf16 hi + lo first; x is not (each
    # block reads its own rows).
    split, launch = source.launches
    assert split.kernel == "polyfuse_moe_routing_split_w"
    assert int(launch.blocks.value) == 4096 // GpuTuning().gate_tile[0]  # type: ignore[attr-defined]
    assert 0 < launch.shared <= 227 * 1024


# ------------------------------------------------------------------ inertia

def test_inertia_plan_splits_k_over_point_tiles():
    sch = gpu_schedule("inertia", B=4, N=3000)
    assert [(f.kind, f.consumer) for f in sch.fusions] == [("split_k_update", "s_center"),
                                                           ("split_k_update", "s_inertia")]
    assert [lp.var.name for lp in loops_of(sch.program, "s_inertia_rf")][:2] == ["b", "n_0"]
    _, nests = partition(tiles("inertia", B=4, N=3000))
    assert [(n.kind, [lp.var.name for lp in n.chain]) for n in nests] == [(CTA, ["b", "n_0"]), (CTA, ["b"])]


# ------------------------------------------------------------------ performer

def test_performer_plan_rolls_key_and_feature_tiles_with_products_of_tiles():
    sizes = {"L": 100, "D": 16, "F": 40}  # one key split: each head's block rolls over all its key tiles
    sch = gpu_schedule("performer", **sizes)
    assert [f.consumer for f in sch.fusions] == ["s_ksum", "s_context", "s_denom", "s_numer"]
    tp = tiles("performer", **sizes)
    found = stores(tp)
    for block in ("s_kdash", "s_context_rf", "s_qdash", "s_numer_rf"):
        assert [e for e in walk_tile_expr(found[block].value) if isinstance(e, Dot)], f"{block} is a product of tiles"
    _, nests = partition(tp)
    assert [(n.kind, [lp.var.name for lp in n.chain]) for n in nests] == [
        (CTA, ["b", "h"]), (CTA, ["b", "h", "i_0_1"])]


SPLIT = {"L": 100, "D": 16, "F": 40}
SPLIT_CUTS = [
    PerformerTiling(16, 32),  # 4 splits of 2 steps; the last split holds 4 keys, its second step none
    PerformerTiling(16, 48),  # 3 splits of 3 steps; the last split holds 4 keys
    PerformerTiling(16, 16),  # one step per split: no step loop
]


def split_schedule(cut: PerformerTiling, **sizes: int) -> Schedule:
    op = ops.get("performer")
    sch = Schedule(op.program("default", **op.sizes("default", sizes)))
    schedules._performer_gpu(sch, cut)
    sch.compact_buffers()
    return sch


def test_performer_tiling_splits_the_keys_over_the_sms():
    assert gpu_performer_tiling(1, 8, 4096) == PerformerTiling(64, 256)   # 16 splits × 8 heads: 128 blocks
    assert gpu_performer_tiling(4, 32, 4096) == PerformerTiling(64, 2048)  # 128 heads: 2 splits
    assert gpu_performer_tiling(8, 32, 4096).splits(4096) == 1             # enough heads: no split
    assert gpu_performer_tiling(1, 8, 1000) == PerformerTiling(64, 384)    # 3 splits of whole steps, last ragged
    assert gpu_performer_tiling(1, 2, 100).splits(100) == 1                # test sizes: no split


def test_performer_bench_launches_split_the_key_side():
    op = ops.get("performer")
    sizes = op.presets["default"]
    sch = gpu_schedule("performer", **sizes)
    assert [(f.kind, f.consumer) for f in sch.fusions] == [
        ("split_k_update", "s_ksum"), ("split_k_update", "s_context"), ("rolling_update", "s_ksum_rf"),
        ("rolling_update", "s_context_rf"), ("rolling_update", "s_denom"), ("rolling_update", "s_numer")]
    source = emit(tiles("performer", **sizes), CUDA)
    heads, splits = sizes["B"] * sizes["H"], gpu_performer_tiling(sizes["B"], sizes["H"], sizes["L"]).splits(sizes["L"])
    assert splits == 16
    assert source.launches[0].kernel == "polyfuse_performer_split_proj"  # the projection, split once
    blocks = [simplify(launch.blocks) for launch in source.launches[1:]]
    # the split partials with their combine folded in (the last block of each head combines), the query tiles
    assert [int(b.value) for b in blocks if isinstance(b, Const)] == [heads * splits, heads * sizes["L"] // 64]
    assert all(0 < launch.shared <= 227 * 1024 for launch in source.launches[1:])
    two = emit(tiles("performer", **sizes), CUDA.with_options(fold_combine=False))
    blocks = [simplify(launch.blocks) for launch in two.launches[1:]]
    # as two launches: the split partials, their combines (one block per head), the query tiles
    assert [int(b.value) for b in blocks if isinstance(b, Const)] == [heads * splits, heads, heads * sizes["L"] // 64]


def test_performer_split_plan_rolls_each_split_over_its_steps():
    sch = split_schedule(SPLIT_CUTS[0], **SPLIT)
    for block in ("s_kdash", "s_ksq", "s_kmax_rf", "s_context_rf_rf", "s_context_rf", "s_ksum_rf"):
        assert [lp.var.name for lp in loops_of(sch.program, block)][:4] == ["b", "h", "i_0", "i_1_0"], block
    assert [int(d.value) for d in sch.program.tensor("kdash").shape] == [1, 1, 16, SPLIT["F"]]  # one step's keys
    assert [int(d.value) for d in sch.program.tensor("context_rf").shape] == [1, 1, 4, SPLIT["F"], SPLIT["D"]]
    tp = tiling.to_tiles(sch.program)
    for block in ("s_kdash", "s_context_rf_rf"):
        assert [e for e in walk_tile_expr(stores(tp)[block].value) if isinstance(e, Dot)], block
    _, nests = partition(tp)
    assert [(n.kind, [lp.var.name for lp in n.chain]) for n in nests] == [
        (CTA, ["b", "h", "i_0"]), (CTA, ["b", "h"]), (CTA, ["b", "h", "i_0_1"])]


@pytest.mark.parametrize("cut", SPLIT_CUTS, ids=[f"{c.keys}x{c.split}" for c in SPLIT_CUTS])
def test_performer_split_plan_agrees_with_numpy(cut):
    op = ops.get("performer")
    full = op.sizes("default", SPLIT)
    sch = split_schedule(cut, **SPLIT)
    tile_program = tiling.to_tiles(sch.program)
    try:
        kernel = build(sch, "cpp", sizes=full, werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    for magnitude in op.magnitudes:
        inputs = op.inputs(0, "default", full, magnitude)
        want, tol = op.reference(inputs, "default", full), op.tolerance("default", full)
        for stage, run in (("tile", lambda x: tiling.interpret(tile_program, x)), ("cpp", kernel.run)):
            result = ops.compare(run(inputs), want, tol)
            assert result.ok, f"{stage} magnitude={magnitude}: {result.line()} {result.worst}"


# ------------------------------------------------------------------ results

# Test sizes (tiles larger than the extents), full 64×64 and 32-row tiles, and partial tiles in every
# dimension (quant_gemm 40×72×48: 16×16 tiles, k tiles of 32; moe 100 rows, 200 hidden).  The loop
# interpreter is slow on the larger ones: it runs at the test sizes only.
CASES = [
    ("quant_gemm", {}), ("quant_gemm", GEMM), ("quant_gemm", {"M": 40, "K": 72, "N": 48}),
    ("moe_routing", {}), ("moe_routing", GATE), ("moe_routing", {"S": 100, "HD": 200, "E": 64, "K": 8}),
    ("inertia", {}), ("inertia", {"B": 3, "N": 3000}),
    ("performer", {}), ("performer", {"L": 100, "D": 16, "F": 40}),
]


@pytest.mark.parametrize(("name", "sizes"), CASES)
def test_gpu_plans_agree_with_numpy(name, sizes):
    op = ops.get(name)
    sch = gpu_schedule(name, **sizes)
    full = op.sizes("default", sizes)
    tile_program = tiling.to_tiles(sch.program)
    try:
        kernel = build(sch, "cpp", sizes=full, werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    for seed in (0, 1) if not sizes else (0,):
        for magnitude in op.magnitudes:
            inputs = op.inputs(seed, "default", full, magnitude)
            want, tol = op.reference(inputs, "default", full), op.tolerance("default", full)
            runs = [("tile", lambda x: tiling.interpret(tile_program, x)), ("cpp", kernel.run)]
            if not sizes:
                runs.append(("interp", lambda x: interpret(sch.program, x)))
            for stage, run in runs:
                result = ops.compare(run(inputs), want, tol)
                assert result.ok, f"{stage} seed={seed} magnitude={magnitude}: {result.line()} {result.worst}"
