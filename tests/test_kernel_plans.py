"""The GPU kernel plan as data: every dot's instruction and layouts, fragment layouts, shared memory, per device.

The CUDA/HIP emitters print a :class:`~polyfuse.emit_cpp.plan.ProgramPlan` decided before any text is written;
these tests check the decisions themselves for every fused catalog operator, on the sm_80 and sm_90a presets
(and gfx90a for HIP), rather than grepping the printed source.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest

from polyfuse import ops
from polyfuse.device import PRESETS, preset
from polyfuse.emit_cpp import CUDA, HIP, Target, emit, gpu_plan, onchip
from polyfuse.emit_cpp.dotplan import (
    BLOCK_REDUCE, FMA, M16N8, MMA_SYNC, PANEL, PER_OUTPUT, WGMMA, DotPlan, LdmatrixFragment,
)
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.emit_cpp.plan import ProgramPlan
from polyfuse.errors import PolyfuseError, UnsupportedPattern
from polyfuse.ir import dtypes as dt
from polyfuse.ops.schedules import default_schedule, has_default_schedule
from polyfuse.tiling import to_tiles

FUSED = [(n, m) for n in ops.names() for m in ops.get(n).modes if has_default_schedule(n, m) and n != "quant_gemm_fp8"]


def _tiles(name: str, mode: str, target: str = "cuda", **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes(mode), **sizes}
    return to_tiles(default_schedule(name, mode, op.program(mode, **sizes), target=target).program)


def _sm80_tiles(name: str, **sizes: int):
    """Prefill tiles of sm_80's schedule (64-key tiles; sm_90a's are 128 keys wide)."""
    op = ops.get(name)
    sizes = {**op.sizes("prefill"), **sizes}
    sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=PRESETS["sm_80"])
    return to_tiles(sch.program)


def _dots(plan: ProgramPlan) -> list[DotPlan]:
    out = []
    for k in plan.kernels:
        for s in k.stmts.values():
            out += list(s.dots.values()) + ([s.dot] if s.dot is not None else [])
        for lp in k.loops.values():
            if lp.fragments is not None:
                out += [st.dot for st in lp.fragments.stmts.values() if st.dot is not None]
    return out


def _fragments(k):
    return [lp.fragments for lp in k.loops.values() if lp.fragments is not None]


def test_the_m16n8_fragment_covers_the_tile_once():
    seen = {M16N8.element(lane, reg) for lane in range(32) for reg in range(4)}
    assert seen == set(itertools.product(range(16), range(8)))
    for lane, reg in itertools.product(range(32), range(4)):
        row = eval(M16N8.row(str(lane), str(reg // 2)).replace("/", "//"))
        col = eval(M16N8.col(str(lane), str(reg % 2)).replace("/", "//"))
        assert (row, col) == M16N8.element(lane, reg)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("name", "mode"), FUSED)
def test_every_dot_plan_is_consistent(name, mode, arch):
    device = PRESETS[arch]
    _, plan = gpu_plan(_tiles(name, mode), Target("cuda", device))
    for k in plan.kernels:
        assert k.peak <= device.shared_per_block
        fragments = _fragments(k)
        # a loop in warp fragments asks for a warp per 16 rows of its tiles (and a producer warpgroup); a short
        # row kept on chip as few warps as hold it (polyfuse.emit_cpp.onchip.warps_for)
        on_chip = onchip.warps_for(onchip.body_stores(k.nest.body), device, CodegenOptions())
        warps = (-(-fragments[0].rows // 16) + 4 * fragments[0].producer if fragments
                 else k.nest.warps or on_chip or device.default_warps)
        assert k.threads == warps * 32 or k.nest.kind == "map"
        if k.nest.kind != "map":
            # by shared memory; a loop in warp fragments also bounds the blocks by its registers
            by_registers = min((65536 // (k.threads * f.registers) for f in fragments), default=None)
            expected = device.blocks_per_sm(k.peak)
            assert k.blocks_per_sm == (expected if by_registers is None else min(expected, max(1, by_registers)))
        if k.min_blocks is not None:
            assert 1 < k.min_blocks == k.blocks_per_sm <= CodegenOptions().min_blocks
    for d in _dots(plan):
        assert d.instruction in (MMA_SYNC, FMA, BLOCK_REDUCE, PER_OUTPUT)  # (wgmma needs wider tiles)
        if d.instruction != MMA_SYNC:
            continue
        assert d.low in (dt.f16, dt.bf16) and d.fragment == M16N8
        a, b = d.a.staged, d.b.staged
        assert (a.rows, b.rows, a.kk) == (d.m, d.n, d.k)
        assert a.rows_pad % 16 == 0 and b.rows_pad % 8 == 0 and a.kp % 16 == 0 and a.kp == b.kp
        assert a.stride == (a.rows_pad if a.trans else a.kp) + 8  # rows 8 elements apart in the banks
        assert d.mtiles * 16 == a.rows_pad and d.groups * d.per * 8 >= b.rows_pad
        assert d.kgroups == 1 or d.units * d.kgroups == 8  # a split k gives every one of the 8 warps a share
        fragment = d.a.source == "registers" or any(d is st.dot for k in plan.kernels for f in _fragments(k)
                                                    for st in f.stmts.values())
        assert d.pair == 1 or (a.split or b.split) or fragment
        for op in (d.a, d.b):
            assert op.source in ("kept", "held", "cp.async", "raw", "converted", "registers")
            if op.source == "cp.async":
                assert not any(part.split for part, _ in op.parts)


def test_causal_prefill_plan():
    # The key loop runs in warp fragments: 8 warps of 16 query rows; S = q·kᵀ from the kept q tile and the
    # cp.async k tile, the masked score, the statistics and O = O·h + P·v in registers (P from the score
    # registers, rounded once), exp(score - max) computed once for P and the row sum, the next iteration's k
    # and v copied during this one, and out written from the registers after the loop: no shared temporaries.
    _, plan = gpu_plan(_tiles("attn_causal", "prefill", Sq=256, Skv=256), CUDA)
    (kernel,) = plan.kernels
    assert kernel.threads == 256 and kernel.shared == ()
    (loop,) = kernel.loops.values()
    f = loop.fragments
    assert f is not None and f.rows == 128 and f.prefetch and f.round_once
    assert [e.block for e in f.epilogue] == ["out"]
    held = {h.name: h for h in f.held}
    assert not held["pv"].memory and not held["pv"].per_iteration and held["score"].per_iteration
    assert held["pv"].cols == 16 and held["score"].cols == 128 and held["row_max"].col_dim is None  # (128 keys: sm_90a)
    qk = f.stmts["score"].dot
    assert qk.instruction == MMA_SYNC and qk.low == dt.f16 and qk.per == 16 and qk.mtiles == 8
    assert qk.a.source == "kept" and not qk.a.every_iteration and qk.b.source == "cp.async"
    pv = f.stmts["pv"]
    assert pv.a_registers and pv.dot.a.source == "registers" and not pv.dot.a.staged.split
    assert len(f.shared) == 2  # exp(score - max) of P and the row sum, exp(max_prev - max) of both updates
    text = str(plan)
    assert "in warp fragments: 8 warps of 16 whole rows (128 real)" in text
    assert "after the loop, from registers: out" in text
    # P split hi + lo on request; without fragment loops the tiles go through shared memory as before
    _, split = gpu_plan(_tiles("attn_causal", "prefill", Sq=256, Skv=256), CUDA.with_options(round_operands=False))
    assert next(iter(split.kernels[0].loops.values())).fragments.stmts["pv"].dot.a.staged.split
    _, old = gpu_plan(_tiles("attn_causal", "prefill", Sq=256, Skv=256), CUDA.with_options(fragment_loops=False))
    assert all(lp.fragments is None for lp in old.kernels[0].loops.values()) and old.kernels[0].threads == 256
    assert "pv: in the epilogue of its dot, in registers" in str(old)


def test_fragment_loops_need_rows_for_two_warps_and_a_chained_product():
    # Decode's few query rows stay spread over all warps by key columns; a GEMM's k loop (one product of memory
    # operands) keeps its register accumulators over all warps.
    for name, mode in (("attn_global", "decode"), ("attn_mla_decode", "decode"), ("quant_gemm", "default")):
        _, plan = gpu_plan(_tiles(name, mode), CUDA)
        assert not any(_fragments(k) for k in plan.kernels), name
    # a ragged last strip: a tile of 40 query rows in 3 warps, the padding rows computed as copies of the last
    # row and never written
    tiles = _ragged_tiles()
    _, plan = gpu_plan(tiles, CUDA)
    (f,) = _fragments(plan.kernels[0])
    assert f.rows == 40 and plan.kernels[0].threads == 96
    text = emit(tiles, CUDA).text
    assert "(pf_m < 40 ? pf_m : 39)" in text and "if (pf_m < 40)" in text


PREFILL = [n for n in ops.names() if "prefill" in ops.get(n).modes and has_default_schedule(n, "prefill")]


@pytest.mark.parametrize("name", PREFILL)
def test_prefill_products_are_warpgroup_products_on_hopper(name):
    # At the bench sizes every attention prefill loop in warp fragments multiplies with wgmma on sm_90a: both
    # products per warpgroup of 64 rows, b (and a memory a) staged in 128-byte-swizzled panels of 64 columns,
    # P from registers rounded once, buffers 1024-byte aligned; on sm_80, or with the option off, mma.sync.
    tiles = _tiles(name, "prefill", **ops.get(name).presets["prefill"])
    _, plan = gpu_plan(tiles, CUDA)
    (f,) = _fragments(plan.kernels[0])
    # (and a producer warpgroup copies K and V: 4 more warps, one block per SM, registers traded by setmaxnreg)
    assert f.warpgroups and f.producer and f.rows % 64 == 0 and plan.kernels[0].threads == (f.rows // 16 + 4) * 32
    # (two computing warpgroups of 240 registers, or three of 160 where 64-wide heads take 192 rows)
    assert plan.kernels[0].min_blocks == plan.kernels[0].blocks_per_sm == 1
    assert f.computing_registers == {128: 240, 192: 160}[f.rows]
    loop = next(lp for lp in plan.kernels[0].loops.values() if lp.fragments is f)
    assert all(offset % 1024 == 0 for offset in loop.offsets.values())
    for st in f.stmts.values():
        if st.dot is None:
            continue
        d = st.dot
        assert d.instruction == WGMMA and d.b.staged.swizzled and d.b.staged.rows_pad % PANEL == 0
        assert d.b.source in ("cp.async", "kept", "raw", "converted")
        if d.a.source == "registers":
            assert not d.a.staged.split
        else:
            assert d.a.staged.swizzled and not d.a.staged.trans and d.a.staged.rows_pad == f.rows
        # the widest product the options allow that divides b's padded rows
        assert d.width == (128 if d.b.staged.rows_pad % 128 == 0 else 64)
    assert re.search(r"wgmma\.m64n(64|128)k16 \(f16 operands\), one per warpgroup", str(plan))
    text = emit(tiles, CUDA).text
    assert re.search(r"pf::wgmma_m64n(64|128)k16_f16_rs<1, 0>", text) and "__align__(1024)" in text
    assert f"pf::setmaxnreg_inc<{f.computing_registers}>()" in text
    # the producer's tiles (K and V) by one thread's bulk tensor copies, a 4-D map of each (B, H, S, D) with
    # boxes of one head; with the option off, cp.async by its 128 threads
    assert {box.map.tensor for box in f.boxes.values()} >= {"k", "v"} and "bulk tensor copies" in str(plan)
    assert all(len(box.map.box) == 4 and box.map.box[0] == 64 for box in f.boxes.values())
    assert "pf::tma_load_4d(" in text and "pf::cp_async_arrive(" not in text
    threads = emit(tiles, CUDA.with_options(tma=False))
    assert not threads.maps and "pf::tma_load" not in threads.text and "pf::cp_async_arrive(" in threads.text
    sm80 = _sm80_tiles(name, **ops.get(name).presets["prefill"])  # (its own schedule's tiles: 64 keys)
    for tiles_of, target in ((sm80, Target("cuda", PRESETS["sm_80"])),
                             (tiles, CUDA.with_options(warpgroup_products=False))):
        _, other = gpu_plan(tiles_of, target)
        assert {d.instruction for d in _dots(other)} == {MMA_SYNC}
        assert all(not d.a.staged.swizzled and not d.b.staged.swizzled for d in _dots(other))
        assert not any(f.producer for f in _fragments(other.kernels[0]))
    _, plain = gpu_plan(tiles, CUDA.with_options(producer_warp=False))
    (f,) = _fragments(plain.kernels[0])
    assert f.warpgroups and not f.producer and plain.kernels[0].threads == f.rows // 16 * 32


def test_warpgroup_products_need_whole_warpgroups_and_panels():
    # the test sizes (D = 16: no 64-column panel) and a ragged 40-row tile stay on mma.sync on sm_90a
    for tiles in (_tiles("attn_causal", "prefill", Sq=256, Skv=256), _ragged_tiles()):
        _, plan = gpu_plan(tiles, CUDA)
        (f,) = _fragments(plan.kernels[0])
        assert not f.warpgroups and {d.instruction for d in _dots(plan)} == {MMA_SYNC}
    # 64-wide panels but 40 rows: no whole warpgroup
    op = ops.get("attn_causal")
    sizes = {**op.sizes("prefill"), "Sq": 40, "Skv": 40, "D": 64, "Dv": 64}
    sch = default_schedule("attn_causal", "prefill", op.program("prefill", **sizes), target="cuda",
                           tuning=GpuTuning(prefill_min_rows=40))
    _, plan = gpu_plan(to_tiles(sch.program), CUDA)
    assert {d.instruction for d in _dots(plan)} == {MMA_SYNC}


def _ragged_tiles():
    """Causal prefill of 40 queries in one tile of 40 rows (not a multiple of a warp's 16)."""
    op = ops.get("attn_causal")
    sizes = {**op.sizes("prefill"), "Sq": 40, "Skv": 40}
    sch = default_schedule("attn_causal", "prefill", op.program("prefill", **sizes), target="cuda",
                           tuning=GpuTuning(prefill_min_rows=40))
    return to_tiles(sch.program)


def test_plans_follow_the_device():
    # The same program on sm_80 and sm_90a: the same dots, other occupancy (164 KB against 228 KB per SM);
    # HIP (gfx90a, wavefronts of 64) has no mma.sync: every dot is an FMA or a reduction, 4 wavefronts a block.
    # (at the bench sizes the loop's products are warpgroup products on sm_90a, mma.sync on sm_80; the tiles of
    # sm_80's schedule, 64 keys, on both)
    tiles = _sm80_tiles("attn_causal", **ops.get("attn_causal").presets["prefill"])
    _, h100 = gpu_plan(tiles, CUDA)
    _, a100 = gpu_plan(tiles, Target("cuda", PRESETS["sm_80"]))
    assert [(d.m, d.n, d.k, d.low) for d in _dots(h100)] == [(d.m, d.n, d.k, d.low) for d in _dots(a100)]
    assert {d.instruction for d in _dots(h100)} == {WGMMA} and {d.instruction for d in _dots(a100)} == {MMA_SYNC}
    # (occupancy on the shared-memory path: in warp fragments the registers bound it on both)
    options = CodegenOptions(fragment_loops=False)
    small = _sm80_tiles("attn_causal", Sq=256, Skv=256)
    _, h100 = gpu_plan(small, Target("cuda", PRESETS["sm_90a"], options))
    _, a100 = gpu_plan(small, Target("cuda", PRESETS["sm_80"], options))
    assert h100.kernels[0].blocks_per_sm == PRESETS["sm_90a"].blocks_per_sm(h100.kernels[0].peak)
    assert a100.kernels[0].blocks_per_sm == PRESETS["sm_80"].blocks_per_sm(a100.kernels[0].peak)
    assert h100.kernels[0].blocks_per_sm > a100.kernels[0].blocks_per_sm
    _, hip = gpu_plan(_tiles("attn_causal", "prefill", "hip"), HIP)
    assert all(d.instruction != MMA_SYNC for d in _dots(hip))
    assert all(k.threads == 256 for k in hip.kernels if k.nest.kind != "map")


def test_a_kernel_past_the_device_shared_memory_is_refused_before_printing():
    small = dataclasses.replace(PRESETS["sm_90a"], shared_per_block=16 * 1024, arch="sm_90a")
    with pytest.raises(UnsupportedPattern, match="a block may use 16384 on sm_90a"):
        emit(_tiles("attn_causal", "prefill", Sq=256, Skv=256), Target("cuda", small))


def test_kept_tiles_are_dropped_where_they_would_not_fit():
    tiles = _tiles("attn_causal", "prefill", Sq=256, Skv=256)
    _, plan = gpu_plan(tiles, CUDA.with_options(fragment_loops=False))
    kernel = plan.kernels[0]
    without = dataclasses.replace(PRESETS["sm_90a"], shared_per_block=kernel.peak - 1)
    _, tight = gpu_plan(tiles, Target("cuda", without, CodegenOptions(fragment_loops=False)))
    assert kernel.keeps_tiles and not tight.kernels[0].keeps_tiles
    assert tight.kernels[0].peak < kernel.peak


def test_warps_come_from_the_schedule_then_the_options_then_the_device():
    from polyfuse.transforms import Schedule

    op = ops.get("softmax")
    program = op.program("default", **op.sizes("default"))
    sch = default_schedule("softmax", "default", program, target="cuda")
    _, plan = gpu_plan(to_tiles(sch.program), CUDA.with_options(warps=4))
    assert {k.threads for k in plan.kernels if k.nest.kind != "map"} == {128}
    sch2 = Schedule(program)
    sch2.replay(sch.trace)
    outer = sch2.get_loops("s_max")[0]
    sch2.warps(outer, 2)
    _, plan = gpu_plan(to_tiles(sch2.program), CUDA.with_options(warps=4))
    assert {k.threads for k in plan.kernels if k.nest.kind != "map"} == {64}
    assert "__launch_bounds__(64)" in emit(to_tiles(sch2.program), CUDA).text


def test_options_are_checked_and_printed():
    with pytest.raises(PolyfuseError, match="warps"):
        CodegenOptions(warps=64)
    with pytest.raises(PolyfuseError, match="element_unroll"):
        CodegenOptions(element_unroll=0)
    with pytest.raises(PolyfuseError, match="reduce_chains must be a power of two"):
        CodegenOptions(reduce_chains=3)
    text = emit(_tiles("softmax", "default"), CUDA.with_options(row_groups=False)).text
    assert "// options: fast_exp=on warps=auto" in text and "row_groups=off" in text
    assert "// device: sm_90a (nvidia, preset): 132 SMs" in text


def test_presets():
    assert preset("sm_90") == PRESETS["sm_90a"]
    assert preset("sm_86").arch == "sm_86" and not preset("sm_86").wgmma and preset("sm_86").mma_sync
    with pytest.raises(PolyfuseError, match="no device preset"):
        preset("gfx1100")


@pytest.mark.parametrize(("name", "mode"), [(n, m) for n, m in FUSED if n != "performer"])
def test_hip_schedules_fit_the_device_at_bench_sizes(name, mode):
    # The catalog's GPU tiles are sized for sm_90a's 227 KB of shared memory per block; for gfx90a's 64 KB the
    # default schedule halves them until every kernel fits (planned, then printed without a refusal).
    op = ops.get(name)
    for key, sizes in op.presets.items():
        if not key.startswith(mode):
            continue
        sch = default_schedule(name, mode, op.program(mode, **sizes), target="hip")
        _, plan = gpu_plan(to_tiles(sch.program), HIP)
        assert all(k.peak <= PRESETS["gfx90a"].shared_per_block for k in plan.kernels)


def test_a_kernel_no_tile_size_fits_is_refused_with_the_reason():
    # performer's key side keeps its F×D feature product (256 × 64 f32) and more per block, whatever the tiles.
    op = ops.get("performer")
    sch = default_schedule("performer", "default", op.program("default", **op.presets["default"]), target="hip")
    with pytest.raises(UnsupportedPattern, match="a block may use 65536 on gfx90a"):
        emit(to_tiles(sch.program), HIP)


def test_the_blocks_with_the_most_work_start_first():
    # Causal prefill's key loop stops where the mask hides the rest (2·i_0 + 2 tiles of 64 keys for query
    # tile i_0 of 128 rows): the query tiles are decoded slowest and from the last, so the longest blocks run
    # first and the short ones fill the tail.  Global attention's blocks all do the same work.
    tiles = _tiles("attn_causal", "prefill", **ops.get("attn_causal").presets["prefill"])
    _, plan = gpu_plan(tiles, CUDA)
    assert plan.kernels[0].heavy_first == "i_0"
    text = emit(tiles, CUDA).text
    assert "const int i_0 = static_cast<int>(((32) - 1) - pf_bid % (32));" in text
    assert text.index("const int h = ") < text.index("const int i_0 = ")
    _, flat = gpu_plan(_tiles("attn_global", "prefill", **ops.get("attn_global").presets["prefill"]), CUDA)
    assert flat.kernels[0].heavy_first is None


def _ldmatrix(frag: LdmatrixFragment, stride: int, tile: int, k: int) -> dict[tuple[int, int], tuple[int, int]]:
    """What ``ldmatrix`` gives each lane: for (lane, register), the offsets in the staged array of its two 16-bit
    halves.  Lanes 8i..8i+7 address the rows of 8×8 matrix i (8 contiguous elements each); without ``.trans``
    lane t receives row t/4, columns 2(t%4) and 2(t%4)+1 of each matrix, with ``.trans`` rows 2(t%4), 2(t%4)+1
    of column t/4 (PTX ISA, ldmatrix)."""
    rows = {lane: eval(frag.address(str(lane), str(tile), str(k), stride).replace("/", "//")) for lane in range(32)}
    out = {}
    for t, i in itertools.product(range(32), range(frag.registers)):
        starts = [rows[8 * i + r] for r in range(8)]
        if frag.trans:
            out[t, i] = (starts[2 * (t % 4)] + t // 4, starts[2 * (t % 4) + 1] + t // 4)
        else:
            out[t, i] = (starts[t // 4] + 2 * (t % 4), starts[t // 4] + 2 * (t % 4) + 1)
    return out


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize(("role", "pair"), [("a", 1), ("b", 1), ("b", 2)])
def test_ldmatrix_addresses_give_the_mma_fragments(role, pair, trans):
    # Each register half must hold the operand element PTX's mma.m16n8k16 fragment layout assigns to it:
    # A (row-major 16×16): register i = rows g + 8(i%2), k 2(t%4) + j + 8(i/2); B (16×8, k × n): register i =
    # k 2(t%4) + j + 8i, column g; a pair of B tiles: registers 2, 3 are the next tile's.  g = lane / 4.
    frag = LdmatrixFragment(role, trans, pair)
    stride, tile, k = 40, 1, 16
    got = _ldmatrix(frag, stride, tile, k)
    for (t, i), halves in got.items():
        g, q = t // 4, t % 4
        for j, offset in enumerate(halves):
            outer, inner = divmod(offset, stride)
            if role == "a":
                row, kk = (inner, outer) if trans else (outer, inner)
                assert (row, kk) == (tile * 16 + g + 8 * (i % 2), k + 2 * q + j + 8 * (i // 2)), (t, i, j)
            else:
                n, kk = (inner, outer) if trans else (outer, inner)
                which, half = (i // 2, i % 2) if pair > 1 else (0, i)
                assert (n, kk) == ((tile + which) * 8 + g, k + 2 * q + j + 8 * half), (t, i, j)


def test_mask_free_condition_holds_only_where_no_element_is_masked():
    # The fast path of a statement in warp fragments is taken where its guard holds: checked against every
    # element of the tile for causal, windowed and ragged conditions, at many loop values.
    from polyfuse.emit_cpp.fragment_values import uniform as _uniform
    from polyfuse.ir.expr import BinOp, Call, Const, Var
    from polyfuse.tiling.htile import Broadcast, Iota

    i32 = dt.i32
    j, i = Var("j_0", i32), Var("i_0", i32)
    row = Broadcast(Iota("r", 16), (("r", 16), ("c", 8)))
    col = Broadcast(Iota("c", 8), (("r", 16), ("c", 8)))

    def lin(k, v, extra):
        return BinOp("+", BinOp("*", Const(k, i32), v), extra)

    causal = BinOp(">", lin(8, j, col), lin(16, i, row))             # key > query: masked
    window = Call("not", (BinOp("<", BinOp("-", lin(16, i, row), lin(8, j, col)), Const(20, i32)),))
    ragged = BinOp("<", lin(8, j, col), Const(37, i32))               # key < 37: live
    both = BinOp("or", causal, window)
    for cond, truth in ((causal, False), (causal, True), (window, False), (ragged, True), (both, False)):
        guard = _uniform(cond, truth, {"r": 16, "c": 8})
        assert guard is not None
        for jv, iv in itertools.product(range(12), range(6)):
            env = {"j_0": jv, "i_0": iv}
            if not _evaluate(guard, env):
                continue
            for r, c in itertools.product(range(16), range(8)):
                assert _evaluate(cond, {**env, "r": r, "c": c}) == truth, (cond, jv, iv, r, c)
    _, plan = gpu_plan(_tiles("attn_causal", "prefill", Sq=512, Skv=512), CUDA)
    (f,) = _fragments(plan.kernels[0])
    assert f.stmts["score"].unmasked is not None and f.stmts["pv"].unmasked is None
    assert "if ((((((128) * j_0) + (127)) + ((-128) * i_0)) <= (0))) {" in emit(  # (128 × 128 tiles on sm_90a)
        _tiles("attn_causal", "prefill", Sq=512, Skv=512), CUDA).text


def _evaluate(e, env):
    """A scalar or tile index expression at integer values (``env``: variables and tile axes by name)."""
    from polyfuse.ir.expr import Call, Const, Var
    from polyfuse.tiling.htile import Broadcast, Iota

    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Iota):
        return env[e.axis]
    if isinstance(e, Broadcast):
        return _evaluate(e.tile, env)
    if isinstance(e, Call) and e.fn == "not":
        return not _evaluate(e.args[0], env)
    a, b = _evaluate(e.a, env), _evaluate(e.b, env)
    return {"+": a + b, "-": a - b, "*": a * b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,
            "and": a and b, "or": a or b}[e.op]
