"""The split-k combine folded into its partial kernel's launch (:mod:`polyfuse.emit_cpp.fold`).

Checked here: the plan folds the combine of every split decode of the catalog (one launch, ticket counters
zeroed at allocation) and says why where it does not (the option off, a combine reading other rows' partials
or writing what the partial reads, no splits, a producer warpgroup); every decode kernel of the catalog, at its
test sizes (split) and bench presets, compiles for sm_90a with ``-Werror``, folded and as two launches; the
split rule by wave efficiency; the row's partials copied into shared memory before the combine (cp.async, or
through registers; element by element where a row is not whole 16-byte pieces) and why not where they are not.
The ``gpu`` tests run the folded kernel against the two launches and NumPy on random and edge inputs at ragged key
counts, twice in a row, and against the fold reading its partials from memory (the same bits), and read the
counters back: all zero.
"""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA, HIP, emit
from polyfuse.emit_cpp.fold import plan_fold, refuse_for_plan
from polyfuse.emit_cpp.plan import gpu_plan
from polyfuse.ir.expr import Const, Var
from polyfuse.ir.stmt import Seq
from polyfuse.ops import schedules
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import DecodeTiling, default_schedule, gpu_decode_tiling, wave_efficiency, wave_splits
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.tiling import to_tiles
from polyfuse.tiling.gpu import lower_for_gpu
from polyfuse.tiling.htile import TileLoad, TileStore, map_tile_expr, walk_tile_stmts
from polyfuse.transforms.schedule import Schedule

DECODE = [n for n in ops.names() if "decode" in ops.get(n).modes]
ANY_SPLIT = GpuTuning(decode_min_split=1)
"""Splits of any length: the catalog's test sizes (Skv = 40) get three splits of 16 keys."""
TWO_LAUNCHES = CUDA.with_options(fold_combine=False)
ANY_FOLD = CUDA.with_options(fold_serial=64)  # the mechanism wherever legal, whatever the rule's threshold
WERROR = CompileOptions(werror=True)


def _tiles(name: str, tuning: GpuTuning | None = None, target: str = "cuda", **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes("decode"), **sizes}
    return to_tiles(default_schedule(name, "decode", op.program("decode", **sizes), target=target,
                                     tuning=tuning).program)


def _tiled(name: str, tiling: DecodeTiling, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes("decode"), **sizes}
    sch = Schedule(op.program("decode", **sizes))
    schedules._attention_decode_gpu(sch, tiling)
    sch.compact_buffers()
    return op, sizes, sch


# ------------------------------------------------------------------ the plan

@pytest.mark.parametrize("name", DECODE)
def test_every_split_decode_of_the_catalog_folds_its_combine(name):
    tiles = _tiles(name, ANY_SPLIT)
    _, plan = gpu_plan(tiles, CUDA)
    (kernel,) = plan.kernels
    assert kernel.fold is not None and kernel.folded is not None
    assert [a.var.name for a in kernel.fold.splits] == ["j_0"] and kernel.fold.split_count == Const(3, kernel.fold.
                                                                                                      split_count.dtype)
    assert "split-k combine folded in: the last of the j_0 < 3 blocks of each row" in str(plan)
    source = emit(tiles, CUDA)
    (launch,) = source.launches
    assert launch.shared == kernel.peak == max(kernel.peak, kernel.folded.peak)
    assert source.zeroed == ("pf_tickets_k0",)
    ticket = next(a for a in source.args if a.name == "pf_tickets_k0")
    assert ticket.role == "temp" and str(ticket.dtype) == "i32"
    assert "atomicAdd(&pf_tickets_k0[" in source.text and "__syncthreads_or(" in source.text
    assert "pf_tickets_k0[" in source.text.split("__syncthreads_or(")[1]  # reset by the last block


def test_the_fold_names_rows_splits_and_column_blocks():
    # 8 query heads on 2 kv heads, 2 per block: rows (b, i, head group), 3 splits, combine in 2 column blocks.
    _, sizes, sch = _tiled("attn_gqa", DecodeTiling(2, 16, 32, 8), Hq=8, Hkv=2, Skv=80)
    _, plan = gpu_plan(to_tiles(sch.program), CUDA)
    (kernel,) = plan.kernels
    fold = kernel.fold
    assert [a.var.name for a in fold.rows] == ["b", "i", "h_0"] and [str(a) for a in fold.splits] == ["j_0 < 3"]
    assert [str(a) for a in fold.serial] == ["ax1_0 < 2"]
    assert fold.counter.shape[0] == Const(sizes["B"] * 4, fold.counter.shape[0].dtype)
    assert kernel.folded.threads == kernel.threads  # the combine is planned for the partial's block


def test_the_option_off_keeps_two_launches_and_says_why():
    tiles = _tiles("attn_causal", ANY_SPLIT)
    _, plan = gpu_plan(tiles, TWO_LAUNCHES)
    partial, combine = plan.kernels
    assert partial.fold is None and combine.unfolded == "CodegenOptions.fold_combine is off"
    assert "launched on its own: CodegenOptions.fold_combine is off" in str(plan)
    source = emit(tiles, TWO_LAUNCHES)
    assert len(source.launches) == 2 and source.zeroed == () and "atomicAdd" not in source.text


def test_hip_folds_too():
    source = emit(_tiles("attn_gqa", ANY_SPLIT, target="hip"), HIP)
    assert len(source.launches) == 1 and "atomicAdd(&pf_tickets_k0[" in source.text


def _nests(name: str = "attn_gqa"):
    gpu = lower_for_gpu(_tiles(name, ANY_SPLIT))
    tensors = {t.name: t for t in gpu.program.tensors}
    shared = frozenset(n for nest in gpu.nests for n in nest.shared)
    partial, combine = gpu.nests
    return partial, combine, tensors, shared


def _rewrite_loads(body, tensor: str, fn):
    def expr(e):
        return map_tile_expr(e, lambda n: fn(n) if isinstance(n, TileLoad) and n.tensor.name == tensor else None)

    def walk(s):
        if isinstance(s, Seq):
            return Seq(tuple(walk(c) for c in s.stmts))
        if isinstance(s, TileStore):
            return dataclasses.replace(s, value=expr(s.value))
        return s.replace(body=walk(s.body))

    return walk(body)


def test_a_combine_that_reads_other_rows_partials_is_refused():
    partial, combine, tensors, shared = _nests()
    h = Var("h_0", partial.chain[2].var.dtype)

    def first_group(load):  # every row's combine reads head group 0's maxima
        return dataclasses.replace(load, index=tuple(Const(0, h.dtype) if i == h else i for i in load.index))

    bad = dataclasses.replace(combine, body=_rewrite_loads(combine.body, "row_max_rf", first_group))
    reason = plan_fold(partial, bad, "polyfuse_attn_gqa_k0", tensors, shared)
    assert isinstance(reason, str)
    assert reason.startswith("the combine reads row_max_rf[") and "not indexed by the row's h_0" in reason
    assert not isinstance(plan_fold(partial, combine, "polyfuse_attn_gqa_k0", tensors, shared), str)


def test_a_combine_that_writes_what_the_partial_reads_is_refused():
    partial, combine, tensors, shared = _nests()
    store = next(s for s in walk_tile_stmts(partial.body) if isinstance(s, TileStore) and s.tensor.name == "pv_rf")
    bad = dataclasses.replace(combine, body=Seq((combine.body, store)))
    reason = plan_fold(partial, bad, "polyfuse_attn_gqa_k0", tensors, shared)
    assert isinstance(reason, str) and reason.startswith("the combine writes pv_rf, which the partial kernel accesses")


def test_a_combine_over_the_same_grid_has_no_splits_to_wait_for():
    partial, combine, tensors, shared = _nests()
    same = dataclasses.replace(combine, chain=partial.chain)
    reason = plan_fold(partial, same, "polyfuse_attn_gqa_k0", tensors, shared)
    assert reason == "the partial kernel has no grid loop beyond the combine's (no splits to wait for)"


def test_a_partial_with_a_producer_warpgroup_is_refused():
    op = ops.get("attn_causal")
    sizes = op.presets["prefill"]
    tiles = to_tiles(default_schedule("attn_causal", "prefill", op.program("prefill", **sizes), target="cuda").program)
    _, plan = gpu_plan(tiles, CUDA)
    assert "setmaxnreg" in refuse_for_plan(plan.kernels[0])
    _, decode = gpu_plan(_tiles("attn_causal", ANY_SPLIT), TWO_LAUNCHES)
    assert refuse_for_plan(decode.kernels[0]) == ""


def test_split_k_programs_beyond_attention_fold():
    # performer's key side is split-k like decode (its own schedule): its combine folds as well.
    op = ops.get("performer")
    sizes = op.presets[next(iter(op.presets))]
    program = op.program(op.modes[0], **sizes)
    tiles = to_tiles(default_schedule("performer", op.modes[0], program, target="cuda").program)
    _, plan = gpu_plan(tiles, CUDA)
    assert any(k.fold is not None for k in plan.kernels), str(plan)


# ------------------------------------------------------------------ the row's partials staged in shared memory

def test_the_row_partials_are_copied_into_shared_memory_at_once():
    tiles = _tiles("attn_global", ANY_SPLIT)
    _, plan = gpu_plan(tiles, CUDA)
    (kernel,) = plan.kernels
    staged = kernel.fold.staged
    assert [p.tensor.name for p in staged] == ["pv_rf", "row_max_rf", "row_sum_rf"] and kernel.fold.copy_async
    assert all(p.offset % 16 == 0 and p.offset >= kernel.folded.peak for p in staged)
    assert kernel.peak >= staged[-1].offset + staged[-1].nbytes
    assert "the row's partials copied into shared memory first: pv_rf[b, i, h, 0, 0, 0, :, :]" in str(plan)
    text = emit(tiles, CUDA).text
    combine = text.split("__syncthreads_or(")[1]
    # pv_rf's rows are whole 16-byte pieces (3 splits x 16 columns of f32), the statistics' are 12 bytes
    assert combine.count("pf::cp_async16(&pf_to[pf_g], &pf_from[pf_g], true);") == 1
    assert combine.count("pf_to[pf_g] = pf_from[pf_g];") == 2
    assert combine.index("pf::cp_async_wait<0>();") < combine.index("// row group: row_max")
    # every read of the partials after the copies is of the shared copies
    reads = combine.split("pf::cp_async_wait<0>();")[1]
    assert "pf_staged_pv_rf[" in reads and not re.search(r"(?<!\w)(pv_rf|row_max_rf|row_sum_rf)\[", reads)


def test_without_cp_async_the_copies_go_through_registers():
    source = emit(_tiles("attn_global", ANY_SPLIT, target="hip"), HIP)
    combine = source.text.split("__syncthreads_or(")[1]
    assert "pf_to[pf_g] = pf_from[pf_g];" in combine and "cp_async" not in combine


def test_rows_of_odd_bytes_are_copied_element_by_element():
    # inertia's split-k partials: three floats per row (12 bytes) and a 3x3 centre (36 bytes)
    op = ops.get("inertia")
    sizes = op.sizes("default")
    tiles = to_tiles(default_schedule("inertia", "default", op.program("default", **sizes), target="cuda").program)
    _, plan = gpu_plan(tiles, CUDA)
    (kernel,) = [k for k in plan.kernels if k.fold is not None]
    assert {p.nbytes % 16 for p in kernel.fold.staged} != {0}
    combine = emit(tiles, CUDA).text.split("__syncthreads_or(")[1]
    assert "const float* pf_from = reinterpret_cast<const float*>(&center_rf[" in combine
    assert "pf_to[pf_g] = pf_from[pf_g];" in combine


def test_the_option_off_and_oversized_partials_read_from_memory_and_say_why():
    tiles = _tiles("attn_global", ANY_SPLIT)
    off = CUDA.with_options(stage_partials=False)
    _, plan = gpu_plan(tiles, off)
    assert plan.kernels[0].fold.staged == () and "its partials read from memory: CodegenOptions.stage_partials is off" \
        in str(plan)
    assert "pf_staged" not in emit(tiles, off).text
    # grouped heads at the bench size: 8 query heads x 32 splits x 128 columns of f32 per row (131 KB) would leave
    # one block per SM where four run
    op = ops.get("attn_gqa")
    big = _tiles("attn_gqa", **op.presets["decode"])
    (kernel,) = gpu_plan(big, ANY_FOLD)[1].kernels
    assert kernel.fold is not None and kernel.fold.staged == ()
    assert kernel.fold.unstaged.startswith("copied, the partials would take the kernel's shared memory to")


# ------------------------------------------------------------------ the runtime

def test_the_tickets_are_zeroed_once_when_allocated(tmp_path):
    from polyfuse.runtime.gpu import GpuKernel
    from tests.test_emit_gpu import RecordingLoader

    class Copies(RecordingLoader):
        def __init__(self):
            super().__init__()
            self.copies = []

        def to_device(self, pointer, host, nbytes):
            self.copies.append((pointer, bytes(np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * nbytes)
                                                                       .from_address(host)))))

    source = emit(_tiles("attn_causal", ANY_SPLIT), CUDA)
    image = tmp_path / "k.cubin"
    image.write_bytes(b"")
    loader = Copies()
    kernel = GpuKernel(source, image, loader)
    op = ops.get("attn_causal")
    inputs = op.inputs(0, "decode", op.sizes("decode"), 1.0)
    kernel.run(inputs)
    kernel.run(inputs)
    rows = 2 * 2  # (b, i, h)
    zeroed = [c for c in loader.copies if c[1] == bytes(4 * rows)]
    assert len(zeroed) == 1  # at the first call's allocation only: launches leave the counters at 0
    assert len(loader.launches) == 2  # one launch per call


# ------------------------------------------------------------------ the split rule by waves

def test_wave_splits_keep_the_count_unless_another_fills_the_waves_clearly_better():
    assert wave_efficiency(132, 132) == 1.0 and wave_efficiency(133, 132) == pytest.approx(133 / 264)
    # 8 units on 104 slots: 16 splits (128 blocks) fill 62% of two waves, 32 splits (256) 82% of three.
    assert wave_splits(8, 16, [1, 2, 4, 8, 16, 32], 104, 15) == 32
    assert wave_splits(8, 16, [1, 2, 4, 8, 16, 32], 104, 25) == 16  # not 25 points better: kept
    assert wave_splits(8, 16, [1, 2, 4, 8, 16], 104, 15) == 16  # nothing better in reach
    # Ties go to the count nearest the rules' one, then to the fewer splits.
    assert wave_splits(10, 5, [1, 2, 3, 4, 5, 6], 20, 10) == 4


def test_the_decode_rule_records_its_wave_efficiency_and_follows_the_device():
    small = dataclasses.replace(PRESETS["sm_90a"], sms=100)
    tiling = gpu_decode_tiling(1, 32, 32, 32768, 128, device=small)
    assert 0 < tiling.efficiency <= 1
    assert tiling.efficiency == pytest.approx(wave_efficiency(32 * tiling.splits(32768),
                                                              100 * small.resident_blocks(
                                                                  (128 + 16) * (128 + 8) * 2, 256)))
    # The bench presets on sm_90a already fill their waves as well as any count in reach: the numbers stay.
    for gain in (15, 100):
        assert gpu_decode_tiling(32, 128, 1, 4096, 576, tuning=GpuTuning(decode_wave_gain=gain)).splits(4096) == 2


# ------------------------------------------------------------------ compile checks

def _compile(source, label: str) -> None:
    from polyfuse.runtime.gpu_compiler import compile_gpu

    compile_gpu(source.text, label, "cuda", source.target.arch, options=WERROR, compile_only=True)


SIZES = [(n, "test") for n in DECODE] + [(n, p) for n in DECODE for p in ops.get(n).presets if p.startswith("decode")]


@pytest.mark.nvcc
@pytest.mark.parametrize(("name", "preset"), SIZES)
def test_decode_kernels_compile_for_sm90a(name, preset):
    # Test sizes split into three (ANY_SPLIT), so that they fold; the bench presets as the default rule cuts them.
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    op = ops.get(name)
    if preset == "test":
        tiles = _tiles(name, ANY_SPLIT)
        _compile(emit(tiles, TWO_LAUNCHES), f"decode_two_{name}")
    else:
        tiles = _tiles(name, **op.presets[preset])
    source = emit(tiles, ANY_FOLD)
    assert len(source.launches) == 1
    _compile(source, f"decode_{name}_{preset}")
    if preset != "test":
        # the default rule folds where the last block runs at most fold_serial combine blocks of its row
        plan = str(gpu_plan(tiles, CUDA)[1])
        if len(emit(tiles, TWO_LAUNCHES).launches) == 2:  # (a split: a combine to fold)
            assert ("split-k combine folded in" in plan) == (len(emit(tiles, CUDA).launches) == 1)
            assert "split-k combine folded in" in plan or "CodegenOptions.fold_serial is 2" in plan


UNIT_GRID = [("attn_global", {"B": 1, "Hq": 1, "Hkv": 1, "Skv": 4096, "D": 64, "Dv": 64}),
             ("attn_mla_decode", {"B": 1, "H": 16, "Skv": 1024, "Dv": 64, "Drope": 16})]
"""Decode whose grid loops above the split all run once (one batch row, every head in one block)."""


@pytest.mark.parametrize(("name", "sizes"), UNIT_GRID)
def test_the_split_is_the_grid_where_every_loop_above_it_runs_once(name, sizes):
    # The split-k partials and their combine are two nests even where the loops above the split (b, i, and h or
    # none) all run once: the splits are the partial kernel's grid, not a serial loop of a single block.
    op = ops.get(name)
    sizes = op.sizes("decode", sizes)
    tiles = to_tiles(default_schedule(name, "decode", op.program("decode", **sizes), target="cuda").program)
    nests = lower_for_gpu(tiles).nests
    assert len(nests) == 2
    assert any(lp.var.name == "j_0" and lp.extent != Const(1, lp.extent.dtype) for lp in nests[0].chain)
    assert len(emit(tiles, CUDA).launches) == 2
    if shutil.which("nvcc") is not None:
        _compile(emit(tiles, CUDA), f"unit_grid_{name}")


# ------------------------------------------------------------------ on the GPU

GPU_CASES = [
    ("attn_gqa", DecodeTiling(2, 16, 32), {"Hq": 8, "Hkv": 2, "Skv": 80}),   # ragged last split
    ("attn_window", DecodeTiling(1, 16, 16), {"Skv": 40}),                  # W = 24: the first split all masked
    ("attn_causal", DecodeTiling(1, 16, 16), {"Skv": 97}),                  # prime: 7 splits, the last of 1 key
    ("attn_global", DecodeTiling(1, 16, 16), {"Skv": 40}),
    ("attn_mla_decode", DecodeTiling(2, 16, 32, 8), {"Skv": 131}),          # prime; 7 column blocks in a row
    ("attn_norm_inside", DecodeTiling(1, 16, 32, 4), {"Skv": 40}),          # two producers of pv
    ("attn_softcap", DecodeTiling(2, 16, 16), {"Skv": 53}),
    ("attn_alibi", DecodeTiling(1, 16, 16), {"Skv": 40}),
]
GPU_IDS = [f"{n}-skv{s['Skv']}" for n, _, s in GPU_CASES]
VARIANTS = ("random", "leading_zeros", "zero_rows", "ties", "monotone", "special")


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "tiling", "sizes"), GPU_CASES, ids=GPU_IDS)
def test_folded_decode_matches_two_launches_and_numpy_twice_in_a_row(name, tiling, sizes):
    op, sizes, sch = _tiled(name, tiling, **sizes)
    _folded_against_two_launches(op, "decode", sizes, sch, tiling.splits(sizes["Skv"]))


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "sizes"), UNIT_GRID)
def test_decode_split_over_a_grid_of_splits_matches_numpy(name, sizes):
    # The programs of the test above, run: partials over a grid of splits, then the combine, against NumPy on
    # every magnitude and input variant.
    from polyfuse.errors import BackendUnavailable
    from polyfuse.pipeline import build

    op = ops.get(name)
    sizes = op.sizes("decode", sizes)
    try:
        kernel = build(default_schedule(name, "decode", op.program("decode", **sizes), target="cuda"), "cuda",
                       sizes=sizes, werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    assert len(kernel.kernel_source.launches) == 2
    tolerance = op.tolerance("decode", sizes)
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(11, "decode", sizes, magnitude, variant)
            result = ops.compare(kernel.run(inputs), op.reference(inputs, "decode", sizes), tolerance)
            assert result.ok, f"{variant} at {magnitude:g}: {result.line()} worst {result.worst}"


@pytest.mark.gpu
def test_folded_performer_matches_two_launches_and_numpy_twice_in_a_row():
    # performer's key side in 4 splits of 2 steps of 16 keys (L = 100: the last split holds 4 keys)
    op = ops.get("performer")
    sizes = op.sizes("default", {"L": 100, "D": 16, "F": 40})
    sch = Schedule(op.program("default", **sizes))
    schedules._performer_gpu(sch, schedules.PerformerTiling(16, 32))
    sch.compact_buffers()
    _folded_against_two_launches(op, "default", sizes, sch, 4)


def _folded_against_two_launches(op, mode: str, sizes: dict, sch: Schedule, splits: int) -> None:
    """The folded kernel against NumPy and the two launches on every magnitude and input variant, launched twice
    per input (the second launch must give the same bits: the counters were reset), counters read back at 0."""
    from polyfuse.emit_cpp.options import CodegenOptions
    from polyfuse.errors import BackendUnavailable
    from polyfuse.pipeline import build

    try:
        folded = build(sch, "cuda", sizes=sizes, werror=True, codegen=CodegenOptions(fold_combine=True, fold_serial=64))
        unstaged = build(sch, "cuda", sizes=sizes, werror=True,
                         codegen=CodegenOptions(fold_combine=True, fold_serial=64, stage_partials=False))
        two = build(sch, "cuda", sizes=sizes, werror=True, codegen=CodegenOptions(fold_combine=False))
    except BackendUnavailable as err:
        pytest.skip(str(err))
    combined = len(two.kernel_source.launches) > 1
    assert len(two.kernel_source.launches) - len(folded.kernel_source.launches) == (1 if combined else 0)
    tolerance = op.tolerance(mode, sizes)
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(3, mode, sizes, magnitude, variant)
            reference = op.reference(inputs, mode, sizes)
            first, second, third = folded.run(inputs), folded.run(inputs), unstaged.run(inputs)
            for key, value in first.items():
                assert np.array_equal(value, second[key], equal_nan=True), f"{variant}: a second launch differs"
                # the staged copies are what the reads from memory return: the same bits
                assert np.array_equal(value, third[key], equal_nan=True), f"{variant}: staged partials differ"
            where = f"{variant} at magnitude {magnitude:g}"
            result = ops.compare(first, reference, tolerance)
            assert result.ok, f"{where}: {result.line()} worst {result.worst}"
            result = ops.compare(first, {k: np.asarray(v, np.float64) for k, v in two.run(inputs).items()}, tolerance)
            assert result.ok, f"{where}: folded against two launches {result.line()} worst {result.worst}"
    if combined:
        name = folded.kernel_source.zeroed[0]
        tickets = folded.read_scratch(name)
        assert tickets.dtype == np.int32 and tickets.size > 0 and not tickets.any()  # every launch left them at 0
