"""Default schedules of the catalog: a few lines each, in Neptune's style.

``default_schedule(name, mode, program)`` returns the :class:`Schedule` after the
operator's steps.  Attention prefill becomes one fused nest per query tile with a
rolling loop over key tiles (FlashAttention); attention decode becomes split-k
partial nests plus combines (FlashDecoding); the other operators fuse their
reduction chains into a single pass where a repair exists — for ``variance``,
``inertia`` and ``layernorm_stats`` a state repair with auxiliary accumulators
(:mod:`~polyfuse.transforms.auxiliary`).  Every schedule ends by compacting the
temporaries to what one iteration uses (no S×S score matrix remains in fused
attention).

GPU targets (``target="cuda"`` or ``"hip"``) get the same fusions with GPU-sized tiles, for a
:class:`~polyfuse.device.DeviceSpec` (the backend's preset unless a device is given) and a
:class:`GpuTuning` (the tile sizes and split targets): 32×64 query/key tiles for prefill (one thread
block per query tile); for decode one block per (batch, group of query heads sharing a kv head, key
split), rolling over tiles of the split, then a combine kernel (:func:`_attention_decode_gpu`, sizes
from :func:`gpu_decode_tiling`); and for the other operators a rolling loop over tiles of
``row_tile`` elements instead of single elements, with the elementwise consumers of
the fused results moved into the same per-row loop (one block per row, one pass over memory for
the statistics and one for the output).  Operators with a GEMM get plans of their own (``_with_gpu``):
``quant_gemm`` and ``moe_routing`` one thread block per output tile, the GEMM a product of tiles rolled over
k tiles (``gemm_tile``, ``gate_tile``); ``performer`` its four fusions over tiles of keys and of
features (``performer_tile``), the key side split-k over (batch, head, key split) blocks like decode
(:func:`gpu_performer_tiling`); ``inertia``, whose chain cannot roll over tiles, split-k over tiles of
points.  Where no repair exists (``quant_gemm_fp8``) the fusion step raises ``NoRepairFound`` with the
failing condition, and nothing is mis-compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import functools
from dataclasses import dataclass

from polyfuse.device import DeviceSpec, for_backend
from polyfuse.emit_cpp import Target, gpu_plan
from polyfuse.emit_cpp.dotplan import WARP_TILE_COLUMNS
from polyfuse.emit_cpp.onchip import RowsOnChip
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.emit_cpp.plan import PAIRED_BLOCKS, ProgramPlan
from polyfuse.errors import IllegalTransform, PolyfuseError, UnsupportedPattern
from polyfuse.ir.stmt import Loop, Program, Seq, Stmt, Tensor
from polyfuse.ir.visit import loads
from polyfuse.tiling.grid import MAP
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.tiling import to_tiles
from polyfuse.tiling.skip import skip_masked_tiles
from polyfuse.transforms.hoist_divisor import divided_sums
from polyfuse.transforms.schedule import LoopRef, Schedule

PREFILL_TILE = (16, 16)
"""Query rows × key columns per tile of fused prefill attention."""
DECODE_SPLITS = 4
"""Key splits of fused decode attention (the partial nests run in parallel)."""
GPU_TARGETS = ("cuda", "hip")

_Plan = Callable[[Schedule], None]
_GpuPlan = Callable[..., None]
"""A GPU plan of its own (``_with_gpu``): ``plan(sch, device=..., tuning=...)``."""


def _attention_prefill(sch: Schedule, tile: tuple[int, int] = PREFILL_TILE) -> None:
    _, _, i, j, _ = sch.get_loops("qk")
    i0, j0, _, _ = sch.tile([i, j], list(tile))
    sch.reverse_compute_at("score", j0)
    for block in ("row_max", "row_sum", "pv"):
        sch.rolling_update(block, j0)
    sch.reverse_compute_at("out", i0)


def _attention_decode(sch: Schedule, split: list[int | None] | None = None) -> None:
    j = sch.loop("qk", "j")
    j0, _ = sch.split(j, split or [DECODE_SPLITS, None])
    sch.reverse_compute_at("score", j0)
    for block in ("row_sum", "pv"):
        sch.split_k_update(block, j0)


@dataclass(frozen=True)
class DecodeTiling:
    """How fused decode attention is cut into thread blocks on a GPU (see :func:`gpu_decode_tiling`).

    ``heads`` query heads sharing one kv head (a divisor of the group Hq/Hkv) are the rows of every tile;
    a block reduces ``split`` keys (a multiple of ``tile``) in steps of ``tile`` keys.  ``splits == 1``
    needs no combine: the block rolls over all the keys.  The combine gives a block to each ``columns``
    output columns of a head group (where they divide dv).
    """

    heads: int
    tile: int
    split: int
    columns: int = GpuTuning.combine_columns
    """Output columns (dv) per thread block of the combine kernel (see :func:`_spread_combine`)."""
    efficiency: float = dataclasses.field(default=1.0, compare=False)
    """The busy fraction of the partial blocks' last wave on the device it was chosen for (:func:`wave_splits`;
    1.0: whole waves, or not computed)."""
    value_columns: int = 0
    """Where nonzero, the heads of a block are the rows of warpgroups and each block computes this many value
    columns (dv) of its heads, the scores recomputed per value tile (:func:`_attention_decode_warpgroups`)."""
    warps: int = 0
    """Warps per thread block of the partial and combine kernels (0: the code generator's default)."""
    warp_splits: int = 0
    """Where nonzero, a block's ``split`` keys are split again among this many warps (groups of the block's warps,
    :mod:`~polyfuse.emit_cpp.groups`), each rolling over its own steps of ``tile`` keys; the block combines the
    warps' partial results (:func:`warp_split_decode_tiling`)."""

    def splits(self, keys: int) -> int:
        return -(-keys // self.split)


def gpu_decode_tiling(batch: int, q_heads: int, kv_heads: int, keys: int, qk_dim: int, *,
                      value_dim: int | None = None, device: DeviceSpec | None = None,
                      tuning: GpuTuning | None = None) -> DecodeTiling:
    """The GPU decode tiling of one attention instance on ``device`` (default: the CUDA preset) with the
    choices of ``tuning`` (default: :class:`GpuTuning`'s).

    1. heads per block: the largest divisor of the group ``q_heads // kv_heads`` up to ``decode_heads``
       (a divisor, so that a block's heads share one kv head: 8 for attn_gqa, 2 for attn_softcap, 16 of
       MLA's 128, 1 for MHA);
    2. tile: ``decode_tile`` keys, halved (down to 16) while the f16 key tile exceeds ``decode_tile_bytes``,
       while the key tile and the query rows exceed the device's shared memory per block, and while the
       keys do not span two tiles (small test sizes);
    3. split: the (batch, kv head, head group) units in parallel are multiplied by the fewest splits that
       give ``decode_blocks_per_sm`` blocks per SM, or ``decode_waves`` waves of the blocks that reside at
       once if fewer (estimated from the shared memory of the key tile and the query rows, with the device's
       reserve per block: two blocks per SM for MLA on sm_90a); never more splits than tiles, nor splits of
       fewer than ``decode_min_split`` keys — ``decode_short_split`` where those would leave the grid with fewer
       blocks than SMs (small batches of short caches: idle SMs cost more than more partial results).  Where
       the keys are whole tiles, the splits divide the tiles (an uneven last split is masked, and its
       kernel is another: MLA B=32 with 3 splits measured 1.51 ms against 0.41 with 4); the keys are shared
       evenly and the split rounded up to whole tiles.  A split of many tiles rolls over them inside its
       block, so its partial results (one per split, written and read again by the combine) stay few: at
       MLA's B=1 H=128 Skv=32768, 32 splits of 1024 keys instead of 256 of 128 (pv partials of 8 MB, not
       67 MB); for B=32 H=64 Skv=4096 the 2048 units need no split at all;
    4. waves: where another count, up to twice that one and within the bounds above, fills the last wave of
       resident partial blocks (``DeviceSpec.resident_blocks``: by shared memory and threads) by
       ``decode_wave_gain`` percentage points better, the count nearest it among the best
       (:func:`wave_splits`); the busy fraction is kept in :attr:`DecodeTiling.efficiency`;
    5. warps (decided before the waves, which count threads): ``tuning.warps`` where set, else
       ``decode_warps``, or more where the value product's output (the padded rows × ``value_dim``) needs more
       warps for one warp tile of at most ``WARP_TILE_COLUMNS`` columns each (so that its accumulators stay in
       registers: MLA's 512 value columns take 8 warps), never more than the device's default;
    6. warp splits: where a block's query rows are at most ``decode_warp_split_heads`` heads (its tensor-core
       tiles nearly all padding: warps sharing a tile share little work), the block's keys are split again among
       its warps instead (:func:`warp_split_decode_tiling`), where that leaves each warp at most
       ``decode_warp_steps`` steps (short loops, whose shared tiles' copies never reach a steady state).

    Before these rules, :func:`warpgroup_decode_tiling` (with ``value_dim``, the value columns).
    """
    device = device or for_backend("cuda")
    t = tuning or GpuTuning()
    rows = warpgroup_decode_tiling(batch, q_heads, kv_heads, keys, qk_dim, value_dim, device, t)
    if rows is not None:
        return rows
    group = q_heads // kv_heads
    heads = max(d for d in range(1, min(group, t.decode_heads) + 1) if group % d == 0)
    rows = -(-heads // 16) * 16  # the query rows of a tile, padded as the tensor-core product pads them
    row_bytes = (qk_dim + 8) * 2  # one f16 row of q or k, padded
    tile = t.decode_tile
    while tile > 16 and (tile * row_bytes > t.decode_tile_bytes or (tile + rows) * row_bytes > device.shared_per_block):
        tile //= 2
    tile = _fit(tile, keys)
    units = batch * kv_heads * (group // heads)
    resident = max(1, device.blocks_per_sm((tile + rows) * row_bytes))
    blocks = min(t.decode_blocks_per_sm * device.sms, device.sms * resident * t.decode_waves)
    tiles = -(-keys // tile)
    longest = max(1, min(tiles, keys // t.decode_min_split))
    if units * longest < device.sms:
        longest = max(longest, min(tiles, keys // t.decode_short_split))
    splits = max(1, min(-(-blocks // units), longest))
    if keys % tile == 0:
        splits = max(d for d in range(1, splits + 1) if tiles % d == 0)
    warps = t.warps or max(t.decode_warps, min(rows // 16 * -(-(value_dim or qk_dim) // WARP_TILE_COLUMNS),
                                               device.default_warps))
    threads = warps * device.warp_size
    wave = device.sms * device.resident_blocks((tile + rows) * row_bytes, threads)
    allowed = [s for s in range(1, min(longest, 2 * splits) + 1) if keys % tile or tiles % s == 0]
    splits = wave_splits(units, splits, allowed, wave, t.decode_wave_gain)
    split = -(-keys // splits)
    shared = DecodeTiling(heads, tile, -(-split // tile) * tile, t.combine_columns,
                          wave_efficiency(units * splits, wave), warps=warps)
    if heads <= t.decode_warp_split_heads:
        return warp_split_decode_tiling(units, heads, rows, keys, qk_dim, value_dim or qk_dim, device, t) or shared
    return shared


def warp_split_decode_tiling(units: int, heads: int, rows: int, keys: int, qk_dim: int, value_dim: int,
                             device: DeviceSpec, t: GpuTuning) -> DecodeTiling | None:
    """Decode whose blocks split their keys again among ``t.decode_warp_splits`` warps (``t.warps`` where set), or
    None where fewer than two warps' tiles fit a block's shared memory or the keys do not give each warp two
    steps of ``t.decode_warp_tile`` keys.

    Each warp keeps its own query rows (``rows``, padded as the tensor-core product pads them), two stages of
    key and value tiles and its scores' two 16-bit halves: the warps, halved until that fits the device's shared
    memory per block.  The (batch, kv head, head group) ``units`` are multiplied by the fewest splits that fill
    the SMs with the blocks resident at once (by that shared memory), never so many that a warp rolls over fewer
    than two steps; where the keys are whole steps of the block's warps, the splits divide them.  None too where
    a warp would then roll over more than ``t.decode_warp_steps`` steps."""
    warps, tile = t.warps or t.decode_warp_splits, _fit(t.decode_warp_tile, keys)
    if warps < 2:
        return None
    per_warp = (rows * (qk_dim + 8) + 2 * tile * (qk_dim + 8) + 2 * tile * (value_dim + 8)) * 2 + rows * (tile + 8) * 4
    while warps > 1 and warps * per_warp > device.shared_per_block:
        warps //= 2
    chunk = warps * tile
    chunks = -(-keys // chunk)
    if warps < 2 or chunks < 2:
        return None
    wave = device.sms * max(1, device.blocks_per_sm(warps * per_warp))
    splits = max(1, min(-(-wave // units), chunks // 2))
    if keys % chunk == 0:
        splits = max(d for d in range(1, splits + 1) if chunks % d == 0)
    steps = -(-chunks // splits)
    if steps > t.decode_warp_steps:
        return None
    return DecodeTiling(heads, tile, steps * chunk, t.combine_columns, wave_efficiency(units * splits, wave),
                        warps=warps, warp_splits=warps)


WARPGROUP_ROWS = 64
"""Rows of one warpgroup product (``wgmma.m64nNk16``): the query heads of a block of warpgroup-row decode."""
PANEL = 64
"""Columns of one 128-byte swizzled panel of 16-bit operands: the qk and value dims, and the keys of a step, of
warpgroup-row decode are whole panels."""


def warpgroup_decode_tiling(batch: int, q_heads: int, kv_heads: int, keys: int, qk_dim: int,
                            value_dim: int | None, device: DeviceSpec, t: GpuTuning) -> DecodeTiling | None:
    """Decode with the query heads of a kv head as the rows of warpgroup products, or None where it does not
    apply: on a device with ``wgmma``, where the heads of a kv head fill whole warpgroups of 64 rows (MLA's 128
    heads sharing one latent cache) and the qk dim, the value dim and the keys are whole 64-column panels.

    A block takes 64 heads and ``decode_warpgroup_values`` value columns (all where the value is narrower;
    each value tile recomputes the scores of its keys), rolling over steps of 64 keys; the keys are split
    (split-k, a combine after) into the fewest splits that divide the steps and give ``decode_warpgroup_fill``
    percent of the SMs a block each (else the most that leave each split two steps).  Taken only where the
    (batch, kv head, head group, value tile) units number at least ``decode_warpgroup_units``: fewer need many
    splits, whose partial results and recomputed scores cost more than blocks of ``decode_heads`` rows on
    ``mma.sync``."""
    group = q_heads // kv_heads
    if (not device.wgmma or value_dim is None or group % WARPGROUP_ROWS or qk_dim % PANEL or value_dim % PANEL
            or keys % PANEL):
        return None
    columns = t.decode_warpgroup_values if value_dim % t.decode_warpgroup_values == 0 else value_dim
    units = batch * kv_heads * (group // WARPGROUP_ROWS) * (value_dim // columns)
    if units < t.decode_warpgroup_units:
        return None
    tiles = keys // PANEL
    fill = -(-device.sms * t.decode_warpgroup_fill // 100)
    # (a split of one step would have no loop to keep the warpgroups' tiles in: at least two per split)
    counts = [s for s in range(1, tiles + 1) if tiles % s == 0 and (s == 1 or tiles // s >= 2)]
    splits = min((s for s in counts if units * s >= fill), default=counts[-1])
    return DecodeTiling(WARPGROUP_ROWS, PANEL, keys // splits, t.combine_columns,
                        wave_efficiency(units * splits, device.sms), columns)


def wave_efficiency(blocks: int, wave: int) -> float:
    """The busy fraction of ``ceil(blocks / wave)`` waves of ``wave`` resident blocks (1: whole waves)."""
    return blocks / (-(-blocks // wave) * wave)


def wave_splits(units: int, current: int, allowed: Sequence[int], wave: int, gain: float) -> int:
    """Split count by wave efficiency: ``current`` unless an ``allowed`` count fills the waves of ``wave``
    resident blocks (``units`` blocks per split) better by at least ``gain``; then, of the counts within
    ``gain / 2`` of the best, the one nearest ``current`` (the fewer on a tie: less combine traffic).

    ``current`` comes from the rules measured on the GPU (blocks per SM, waves, fewest keys per split), so it
    stays wherever no count in reach fills the last wave clearly better (``gain``, in percentage points)."""
    if not allowed:
        return current
    efficiency = {s: 100 * wave_efficiency(units * s, wave) for s in {*allowed, current}}
    best = max(efficiency.values())
    if best < efficiency[current] + gain:
        return current
    near = [s for s in allowed if efficiency[s] >= best - gain / 2]
    return min(near, key=lambda s: (abs(s - current), s))


def _attention_decode_gpu(sch: Schedule, tiling: DecodeTiling | None = None, *, device: DeviceSpec | None = None,
                          tuning: GpuTuning | None = None) -> None:
    """Decode attention with the query heads of one kv head as the rows of each tile (FlashDecoding).

    Loops of ``qk`` (``b, h, i, j, d``) after the steps, outermost first: ``b, i``, the head groups
    ``h_0`` (``h`` split by ``[None, heads]``: group ``h_0`` reads kv head ``h_0 // (Hq/Hkv/heads)``), the
    split ``j_0``, the rolling step ``j_1``, the heads of the block ``h_1``, the keys of the step ``j_2``,
    ``d`` (``split(j, [None, steps, tile])``; a loop that would have one iteration is left out).  The grid
    is (b, i, head group, split): ``split_k_update`` makes each split's partial results (pv's with the
    split before dv, so that a block's rows are contiguous) and the combine, then ``rolling_update`` rolls
    the partials over the steps of a split, one tile of ``heads × tile`` scores at a time; ``out`` joins
    the combine.  With one split there is no combine: the block rolls over all the keys.  ``tiling``
    overrides :func:`gpu_decode_tiling` (of ``device`` and ``tuning``).
    """
    q, kv = sch.program.tensor("q"), _kv_tensor(sch.program)
    batch, q_heads, _, qk_dim = (int(x.value) for x in q.shape)
    kv_heads, keys = int(kv.shape[1].value), int(kv.shape[2].value)
    value_dim = int(sch.program.tensor("pv").shape[-1].value)
    t = tiling or gpu_decode_tiling(batch, q_heads, kv_heads, keys, qk_dim, value_dim=value_dim, device=device,
                                    tuning=tuning)
    if (q_heads // kv_heads) % t.heads or t.split % t.tile or (t.value_columns and value_dim % t.value_columns):
        raise PolyfuseError(f"decode tiling {t}: the heads per block must divide the {q_heads // kv_heads} query "
                            f"heads of a kv head, the tile the split, and the value columns the {value_dim} of pv")
    if t.value_columns:
        _attention_decode_warpgroups(sch, t, keys)
        return
    _, h, i, j, _ = sch.get_loops("qk")
    if t.heads == 1:
        grid, rows = [h], []
    elif t.heads == q_heads:
        grid, rows = [], [h]
    else:
        group, row = sch.split(h, [None, t.heads])
        grid, rows = [group], [row]
    split = _keys_in_steps(sch, j, [i, *grid], rows, t, keys)
    sch.reverse_compute_at("out", (grid or [i])[-1])
    if split is not None:
        _spread_combine(sch, (grid or [i])[-1], t.columns)
    if t.warps:
        _ask_warps(sch, t.warps)


def _keys_in_steps(sch: Schedule, j: LoopRef, outer: list[LoopRef], rows: list[LoopRef], t: DecodeTiling,
                   keys: int) -> LoopRef | None:
    """``qk``'s key loop ``j`` split into ``t.splits(keys)`` splits of steps of ``t.tile`` keys (a loop of one
    iteration left out), ordered ``outer``, split, step, ``rows``, the keys of a step; split-k over the splits
    (the partials and their combine) and rolling over the steps.  Returns the split loop (None: one split)."""
    if t.warp_splits:
        return _keys_in_warp_steps(sch, j, outer, rows, t, keys)
    splits, steps = t.splits(keys), t.split // t.tile
    split = step = None
    if splits == 1:
        step, keys_in_tile = sch.split(j, [None, t.tile])
    elif steps == 1:
        split, keys_in_tile = sch.split(j, [None, t.tile])
    else:
        split, step, keys_in_tile = sch.split(j, [None, steps, t.tile])
    sch.reorder([x for x in (*outer, split, step, *rows, keys_in_tile) if x is not None])
    if split is not None:
        sch.reverse_compute_at("score", split)
        sch.split_k_update("row_sum", split)
        # The split before dv: a block's partial pv rows, updated at every step, are contiguous.
        sch.split_k_update("pv", split, factor_axis=len(sch.program.tensor("pv").shape) - 1)
    if step is not None:
        sch.reverse_compute_at("score", step)
        for block in ("row_max", "row_sum", "pv") if split is None else ("row_max_rf", "row_sum_rf", "pv_rf"):
            sch.rolling_update(block, step)
    return split


def _keys_in_warp_steps(sch: Schedule, j: LoopRef, outer: list[LoopRef], rows: list[LoopRef], t: DecodeTiling,
                        keys: int) -> LoopRef | None:
    """``qk``'s key loop ``j`` split into ``t.splits(keys)`` splits, each split among ``t.warp_splits`` warps, each
    warp's keys in steps of ``t.tile`` (a loop of one iteration left out): split-k over the splits, split-k again
    over the warps (bound to the block's warp groups), rolling over each warp's steps.  Returns the split loop
    (None: one split)."""
    splits, warps = t.splits(keys), t.warp_splits
    steps = t.split // (warps * t.tile)
    factors = [None if splits > 1 else warps, *([warps] if splits > 1 else []), *([steps] if steps > 1 else []),
               t.tile]
    loops = list(sch.split(j, factors))
    split = loops.pop(0) if splits > 1 else None
    warp, keys_in_tile = loops[0], loops[-1]
    step = loops[1] if steps > 1 else None
    sch.reorder([x for x in (*outer, split, warp, step, *rows, keys_in_tile) if x is not None])
    names = ("row_max", "row_sum", "pv")
    for level in (split, warp):
        if level is None:
            continue
        level = sch.loop("qk", level.name)
        sch.reverse_compute_at("score", level)
        sch.split_k_update(names[1], level)
        sch.split_k_update(names[2], level, factor_axis=len(sch.program.tensor(names[2]).shape) - 1)
        names = tuple(f"{n}_rf" for n in names)
    if step is not None:
        step = sch.loop("qk", step.name)
        sch.reverse_compute_at("score", step)
        for block in names:
            sch.rolling_update(block, step)
    sch.bind(sch.loop("qk", warp.name), "threadIdx.y")
    return split


def _attention_decode_warpgroups(sch: Schedule, t: DecodeTiling, keys: int) -> None:
    """Decode attention with ``t.heads`` query heads as the rows of a block and ``t.value_columns`` value columns
    per block (:func:`warpgroup_decode_tiling`).

    ``pv``'s heads and value columns are split (``h_0``, ``dv_0``), the value tiles brought outside the heads
    of a block, ``out`` computed at ``dv_0`` and every producer of ``pv`` recomputed there (each value tile
    recomputes its scores: the grid is (b, i, head group, value tile)); then the keys of ``qk`` in splits of
    steps as in :func:`_attention_decode_gpu` (:func:`_keys_in_steps`)."""
    _, h, i, dv, _ = sch.get_loops("pv")
    group, heads = sch.split(h, [None, t.heads])
    value_tile, _ = sch.split(dv, [None, t.value_columns])
    sch.reorder([i, group, value_tile, heads])
    sch.reverse_compute_at("out", value_tile)
    order = [b.name for b in sch.program.blocks()]
    for block in reversed(order[:order.index("pv")]):
        sch.recompute_at(block, sch.loop("pv", value_tile.name))
    *_, rows, j, _ = sch.get_loops("qk")
    _keys_in_steps(sch, j, [], [rows], t, keys)


def _spread_combine(sch: Schedule, anchor: LoopRef, columns: int) -> None:
    """Give the split-k combine one thread block per ``columns`` output columns (dv) as well.

    Without this the combine kernel's grid is the partial kernel's without the split: at MLA's B=1 H=128,
    8 blocks for 8 MB of partial sums.  ``out``'s dv loop (its last) is split, the outer part moved right
    under ``anchor`` (the combine's last grid loop) and ``pv``'s combine computed at it; ``row_sum`` and
    ``row_max`` (a few numbers per row) are recomputed at every column block, so that the outer loop's
    iterations share nothing and join the grid.
    """
    loops = sch.get_loops("out")
    below = loops[[lp.name for lp in loops].index(anchor.name) + 1:]
    extent = _extent(sch, below[-1])
    if extent is None or extent <= columns or extent % columns:
        return
    outer, inner = sch.split(below[-1], [None, columns])
    if len(below) > 1:
        sch.reorder([outer, *below[:-1], inner])
    sch.compute_at("pv", outer)
    for block in ("row_sum", "row_max"):
        sch.recompute_at(block, outer)


def _kv_tensor(program: Program) -> Tensor:
    """The key cache ``qk`` reads besides ``q`` (``k``, or MLA's ``kv``)."""
    return next(ld.tensor for ld in loads(program.block("qk").store.value) if ld.tensor.name in ("k", "kv"))


def _rolling(consumers: tuple[str, ...], producer: str, loop: str) -> _Plan:
    """Roll each consumer reduction into the producer's loop ``loop``."""
    def plan(sch: Schedule) -> None:
        for c in consumers:
            sch.rolling_update(c, sch.loop(producer, loop))
    plan.rolling = (consumers, producer, loop)  # type: ignore[attr-defined]
    return plan


def _gpu_rolling(sch: Schedule, consumers: tuple[str, ...], producer: str, loop: str, row_tile: int) -> None:
    """The rolling plan over tiles of ``row_tile`` elements, consumers moved into the row loop."""
    ref = sch.loop(producer, loop)
    extent = _extent(sch, ref)
    if any(len(sch.get_loops(c)) > len(sch.get_loops(producer)) for c in consumers):
        # A consumer with axes of its own (quant_gemm's columns) would turn each step into a
        # tile of those axes times the step: keep the element-wise rolling loop instead.
        raise PolyfuseError(f"row tiling does not apply: a consumer of {producer!r} has more loops than it")
    if extent is not None and extent >= 32:
        ref, _ = sch.split(ref, [None, _fit(row_tile, extent)])
    for c in consumers:
        sch.rolling_update(c, ref)
    from polyfuse.transforms.tree import loops_of

    if len(sch.get_loops(producer)) < 2:
        return
    row = sch.get_loops(producer)[0]
    for block in [b.name for b in sch.program.blocks()]:
        loops = loops_of(sch.program, block)
        if loops and loops[0] is loops_of(sch.program, producer)[0]:
            continue
        try:
            sch.reverse_compute_at(block, row)
        except PolyfuseError:
            continue


def _fit(tile: int, extent: int | None) -> int:
    """``tile``, shrunk (to a power of two, at least 16) so that ``extent`` spans at least two tiles."""
    while extent is not None and tile > 16 and 2 * tile > extent:
        tile //= 2
    return tile


def _extent(sch: Schedule, ref) -> int | None:
    from polyfuse.ir.expr import Const
    from polyfuse.transforms.tree import loops_of

    for lp in loops_of(sch.program, ref.block):
        if lp.var.name == ref.name and isinstance(lp.extent, Const):
            return int(lp.extent.value)
    return None


def _performer(sch: Schedule) -> None:
    # Neptune App. C: the key-side sums roll over rows with the global key max,
    # the query-side sums roll over features with the per-row query max.
    for c in ("s_ksum", "s_context"):
        sch.rolling_update(c, sch.loop("s_kmax", "i"))
    for c in ("s_denom", "s_numer"):
        sch.rolling_update(c, sch.loop("s_qmax", "f"))


def _quant_gemm_gpu(sch: Schedule, *, device: DeviceSpec, tuning: GpuTuning) -> None:
    """One thread block per (row tile, column tile) of C, rolling over k tiles (RedFuser §3.4 on a GEMM tiling).

    Every block recomputes the amax of its rows (``recompute_at``: each column tile needs them) over the
    same k tiles as its product, so the A tile it loads feeds both; the product of the scaled A tile and the
    W tile is repaired with ``h = t·r/r'`` once per k tile.  C accumulates in a per-block buffer written
    back once, after the last k tile.
    """
    rows, cols, step = tuning.gemm_tile
    write_back = sch.cache_write("s_gemm", "shared")
    i, n, _ = sch.get_loops("s_gemm")
    _, n0, _, _ = sch.tile([i, n], [_fit(rows, _extent(sch, i)), _fit(cols, _extent(sch, n))])
    sch.recompute_at("s_amax", n0)
    _, _, row, k = sch.get_loops("s_amax")
    k0, k1 = sch.split(k, [None, _fit(step, _extent(sch, k))], names=["k_0", "k_1"])
    sch.reorder([k0, row, k1])
    sch.rolling_update("s_gemm", k0)
    sch.reverse_compute_at(write_back, n0)


def _moe_routing_gpu(sch: Schedule, *, device: DeviceSpec, tuning: GpuTuning) -> None:
    """One thread block per tile of token rows: the gate product ``z = x·w`` as a product of tiles per step
    over the hidden dimension (partials added into z), then the softmax statistics, the top-k and the
    probabilities in the same block, from z, which never leaves it (E is small: the block holds every
    expert).  With the whole row of z at hand the max and the exp-sum are two passes over it in the block,
    so they need no repair."""
    rows, step = tuning.gate_tile
    s, e, h = sch.get_loops("s_gate")
    s0, s1 = sch.split(s, [None, _fit(rows, _extent(sch, s))])
    h0, h1 = sch.split(h, [None, _fit(step, _extent(sch, h))])
    sch.reorder([h0, s1, e, h1])
    partial = sch.rfactor(h0)
    sch.reverse_compute_at("s_gate", sch.loop(partial, h0.name))
    sch.compute_inline("s_exp")
    for block in ("s_max", "s_sum", "s_rank", "s_topv", "s_topi", "s_probs"):
        sch.reverse_compute_at(block, s0)


def _inertia_gpu(sch: Schedule, *, device: DeviceSpec, tuning: GpuTuning) -> None:
    """Split-k over tiles of ``row_tile`` points: each split reduces the mass, the centre and the inertia
    state of its tile (the inertia about the split's own centre), and the combines repair them to the
    row's (``c``: t·M/M'; the inertia: the auxiliary sums re-centre it).  The rolling plan cannot tile
    here: ``s_inertia`` would roll over tiles of a centre that exists only per tile."""
    n = sch.loop("s_mass", "n")
    n0, _ = sch.split(n, [None, _fit(tuning.row_tile, _extent(sch, n))])
    for block in ("s_center", "s_inertia"):
        sch.split_k_update(block, n0)


@dataclass(frozen=True)
class PerformerTiling:
    """How performer's key side is cut into thread blocks on a GPU (see :func:`gpu_performer_tiling`).

    A block reduces ``split`` key rows of one head (a multiple of ``keys``) in steps of ``keys`` rows.
    ``splits == 1`` needs no combine: the block rolls over all the rows.
    """

    keys: int
    split: int

    def splits(self, length: int) -> int:
        return -(-length // self.split)


def gpu_performer_tiling(batch: int, heads: int, length: int, *, device: DeviceSpec | None = None,
                         tuning: GpuTuning | None = None) -> PerformerTiling:
    """The GPU tiling of performer's key side on ``device`` (default: the CUDA preset) with the choices of
    ``tuning`` (default: :class:`GpuTuning`'s).

    1. keys per step: ``performer_tile[0]``, halved (down to 16) while the rows do not span two steps;
    2. split: the (batch, head) units are multiplied by the fewest splits that give ``performer_blocks_per_sm``
       blocks per SM (never more splits than steps, nor splits of fewer than ``performer_min_split`` rows);
       the rows are shared evenly and the split rounded up to whole steps.  At B=1 H=8 L=4096 on sm_90a:
       16 splits of 256 rows (4 steps of 64), 128 blocks; small test sizes get one split.
    """
    device = device or for_backend("cuda")
    t = tuning or GpuTuning()
    keys = _fit(t.performer_tile[0], length)
    splits = max(1, min(-(-(t.performer_blocks_per_sm * device.sms) // (batch * heads)), -(-length // keys),
                        length // t.performer_min_split))
    split = -(-length // splits)
    return PerformerTiling(keys, -(-split // keys) * keys)


def _performer_gpu(sch: Schedule, tiling: PerformerTiling | None = None, *, device: DeviceSpec | None = None,
                   tuning: GpuTuning | None = None) -> None:
    """The fusions of :func:`_performer` over tiles (``performer_tile``), their GEMMs as products of tiles.

    Keys, split-k like decode attention (:func:`_attention_decode_gpu`): the rows ``i`` of ``s_kmax`` are
    split by ``[None, split]`` and the split's rows by ``[None, keys]`` (a split loop ``i_0``, a rolling step
    loop ``i_1_0`` inside it, the rows of a step ``i_1_1``), so the grid is (b, h, split).
    ``split_k_update`` makes each split's partial max, Σ k' and k'ᵀ·v (``*_rf``) and the combines, repaired
    with ``exp(kmax_rf - kmax)``; ``rolling_update`` rolls the partials over the steps of the split, repaired
    alike, and each step computes its tile of k·Pᵀ and ‖k‖² (``compute_at``).  With one split there is no
    combine: the block rolls over all the rows of its head (the step loop is ``i_0``); with one step per
    split there is no step loop.  ``tiling`` overrides :func:`gpu_performer_tiling` (of ``device`` and ``tuning``).

    Queries: one block per tile of query rows rolls over tiles of features, like attention prefill: a tile
    of q·Pᵀ per step, the row max, and q'·(k'ᵀv) and q'·Σk' repaired alike.
    """
    tuning = tuning or GpuTuning()
    _, rows, features = tuning.performer_tile
    batch, heads, length, _ = (int(x.value) for x in sch.program.tensor("k").shape)
    t = tiling or gpu_performer_tiling(batch, heads, length, device=device, tuning=tuning)
    if t.split % t.keys:
        raise PolyfuseError(f"performer tiling {t}: the keys per step must divide the split")
    i = sch.loop("s_kmax", "i")
    if t.splits(length) == 1:
        step, _ = sch.split(i, [None, t.keys])
        for block in ("s_ksum", "s_context"):
            sch.rolling_update(block, step)
    else:
        split, rows_of_split = sch.split(i, [None, t.split])
        # k·Pᵀ under the split first: once the first split_k_update moves kmax's combine out of the split,
        # kdash is what places s_context under it (a consumer of a max is not cut into splits of its own).
        sch.compute_at("s_kdash", split)
        for block in ("s_ksum", "s_context"):
            # The split after (b, h): a block's partial rows, updated at every step, are contiguous.
            sch.split_k_update(block, split, factor_axis=2)
        # s_kmax is the combine now: the loops of the split are s_kmax_rf's.
        if t.split == t.keys:
            step = sch.loop("s_kmax_rf", split.name)
        else:
            step, _ = sch.split(sch.loop("s_kmax_rf", rows_of_split.name), [None, t.keys])
            for block in ("s_ksum_rf", "s_context_rf"):
                sch.rolling_update(block, step)
    sch.compute_at("s_kdash", step)
    sch.compute_at("s_ksq", step)
    _, _, qi, qf = sch.get_loops("s_qmax")
    q_rows, q_features, _, _ = sch.tile([qi, qf], [_fit(rows, _extent(sch, qi)), _fit(features, _extent(sch, qf))])
    for block in ("s_denom", "s_numer"):
        sch.rolling_update(block, q_features)
    sch.compute_at("s_qdash", q_features)
    sch.compute_at("s_qsq", q_rows)
    sch.reverse_compute_at("s_out", q_rows)


def _with_gpu(plan: _Plan, gpu: _GpuPlan) -> _Plan:
    """``plan``, with a plan of its own for GPU targets (used instead of the row tiling of ``_gpu_rolling``)."""
    plan.gpu = gpu  # type: ignore[attr-defined]
    return plan


_PLANS: dict[tuple[str, str], _Plan] = {
    ("softmax_sum", "default"): _rolling(("s_sum",), "s_max", "j"),
    ("softmax", "default"): _rolling(("s_sum",), "s_max", "j"),
    ("logsumexp", "default"): _rolling(("s_sum",), "s_max", "j"),
    ("l2norm_stable", "default"): _rolling(("s_ssq",), "s_amax", "j"),
    ("rmsnorm_amax", "default"): _rolling(("s_amax",), "s_ssq", "j"),
    ("sum_sum", "default"): _rolling(("s_scaled_dot",), "s_sumsq", "j"),
    ("variance", "default"): _rolling(("s_var",), "s_mean", "j"),
    ("inertia", "default"): _with_gpu(_rolling(("s_center", "s_inertia"), "s_mass", "n"), _inertia_gpu),
    ("layernorm_stats", "default"): _rolling(("s_var",), "s_mean", "j"),
    ("moe_routing", "default"): _with_gpu(_rolling(("s_sum",), "s_max", "j"), _moe_routing_gpu),
    ("quant_gemm", "default"): _with_gpu(_rolling(("s_gemm",), "s_amax", "k"), _quant_gemm_gpu),
    ("quant_gemm_fp8", "default"): _with_gpu(_rolling(("s_gemm",), "s_amax", "k"), _quant_gemm_gpu),
    ("performer", "default"): _with_gpu(_performer, _performer_gpu),
}
for _name in ("attn_global", "attn_causal", "attn_alibi", "attn_gqa", "attn_softcap", "attn_window",
              "attn_norm_inside"):
    _PLANS[(_name, "prefill")] = _attention_prefill
    _PLANS[(_name, "decode")] = _attention_decode
_PLANS[("attn_mla_decode", "decode")] = _attention_decode


def has_default_schedule(name: str, mode: str) -> bool:
    return (name, mode) in _PLANS


def _gpu_plan(sch: Schedule, plan: _Plan, device: DeviceSpec, tuning: GpuTuning) -> None:
    if plan in (_attention_prefill, _attention_decode) and tuning.hoist_divisors:
        _hoist_divisors(sch)
    if plan is _attention_prefill:
        _attention_prefill(sch, _prefill_tile(sch, device, tuning))
    elif plan is _attention_decode:
        _attention_decode_gpu(sch, device=device, tuning=tuning)
    elif hasattr(plan, "gpu"):
        plan.gpu(sch, device=device, tuning=tuning)
    elif hasattr(plan, "rolling"):
        _gpu_rolling(sch, *plan.rolling, tuning.row_tile)  # type: ignore[attr-defined]
    else:
        plan(sch)


def _hoist_divisors(sch: Schedule) -> None:
    """Every sum of ``sch``'s program that divides its terms by a value invariant along it divides once after
    it, where :func:`~polyfuse.transforms.hoist_divisor.hoist_divisor` proves that exact; the others keep
    their form (the rolling update repairs it)."""
    for block in divided_sums(sch.program):
        try:
            sch.hoist_divisor(block)
        except IllegalTransform:
            continue


def _prefill_tile(sch: Schedule, device: DeviceSpec, tuning: GpuTuning) -> tuple[int, int]:
    """Query rows × key columns per block of fused prefill attention on ``device`` (see :class:`GpuTuning`)."""
    _, _, i, j, _ = sch.get_loops("qk")
    rows, keys = tuning.prefill_tile
    keys = tuning.prefill_wgmma_keys if device.wgmma else keys
    rows = _fit(rows, _extent(sch, i))
    if device.mma_sync:
        rows = max(rows, min(tuning.prefill_tile[0], tuning.prefill_min_rows))
    if device.wgmma:
        rows = _prefill_rows(sch, device, tuning, rows)
    return rows, _fit(keys, _extent(sch, j))


def _prefill_rows(sch: Schedule, device: DeviceSpec, tuning: GpuTuning, rows: int) -> int:
    """Query rows per block of prefill attention on a device with warpgroup products: the wider tile of
    ``tuning.prefill_wgmma_rows`` for the program's value head where its waves of whole-SM blocks, times its
    rows, less ``tuning.prefill_wgmma_rows_gain``, undercut ``rows``'s (see there); else ``rows``.  A batch
    that is a size parameter (one kernel for every batch) counts as 1: the fewest blocks, where the waves of
    the two tiles differ most (a larger batch runs more waves, which the per-row gain decides)."""
    dv = _extent(sch, sch.get_loops("pv")[3])
    extent = _extent(sch, sch.get_loops("qk")[2])
    if dv is None or _wave_rows(sch, device, rows) is None:
        return rows
    wide = next((r for widest, r in tuning.prefill_wgmma_rows if dv <= widest), None)
    if wide is None or extent < 2 * wide:
        return rows
    cost = functools.partial(_wave_rows, sch, device)
    return wide if cost(wide) * 100 < cost(rows) * (100 + tuning.prefill_wgmma_rows_gain) else rows


def _wave_rows(sch: Schedule, device: DeviceSpec, rows: int, per_sm: int = 1) -> int | None:
    """The cost the prefill tile rules compare: the waves of blocks of ``rows`` query rows, ``per_sm`` of them on
    each of the device's SMs at once, times the rows an SM computes in a wave; None where the heads or the
    queries are size parameters.  A batch that is a size parameter counts as 1."""
    b, h, i, _, _ = sch.get_loops("qk")
    batch, heads, extent = (_extent(sch, lp) for lp in (b, h, i))
    if heads is None or extent is None:
        return None
    blocks = (1 if batch is None else batch) * heads * -(-extent // rows)
    return -(-blocks // (device.sms * per_sm)) * rows * per_sm


def _ask_warps(sch: Schedule, warps: int) -> None:
    """Ask every kernel of the schedule for ``warps`` warps per block.

    Each top-level loop becomes one kernel (or, split-k, a partial and a combine kernel that both start
    with it), and the grid stage reads the annotation from a kernel's grid loops, outermost first: so the
    top-level loops are the ones annotated; one that already asks for as many (decode's tiling, from the same
    tuning) is left as it is.
    """
    from polyfuse.transforms.tree import blocks_under

    for stmt in _top_level(sch.program.body):
        if isinstance(stmt, Loop) and (blocks := blocks_under(stmt)) and ("warps", warps) not in stmt.annotations:
            sch.warps(LoopRef(blocks[0].name, stmt.var.name), warps)


def _top_level(stmt: Stmt) -> list[Stmt]:
    return [x for c in stmt.stmts for x in _top_level(c)] if isinstance(stmt, Seq) else [stmt]


def default_schedule(name: str, mode: str, program: Program, target: str = "cpp", *,
                     device: DeviceSpec | None = None, tuning: GpuTuning | None = None,
                     options: CodegenOptions | None = None) -> Schedule:
    """The operator's fused schedule applied to ``program`` (its plain program at some sizes).

    ``target`` (``cpp``, ``cuda``, ``hip``) picks the plan and its tile sizes (see the module docstring).
    GPU targets schedule for ``device`` (default: the backend's preset, :func:`~polyfuse.device.for_backend`;
    pass the device a kernel will run on, :meth:`~polyfuse.runtime.loaders.Loader.device_spec`) with the
    choices of ``tuning`` (default: :class:`GpuTuning`'s); the host target reads neither.  The tuning's tiles
    are sized for ``tuning.shared_bytes`` of shared memory per block; on a device with less (gfx90a's 64 KB),
    the schedule is planned for the device and its tiles halved (:meth:`GpuTuning.smaller`) until every
    kernel fits.  A row operator's rows stay on chip, not rolled over chunks, where the code generator with
    ``options`` (default: :class:`~polyfuse.emit_cpp.options.CodegenOptions`'s; build with the same) keeps
    every row in registers (:mod:`~polyfuse.emit_cpp.onchip`); ``rows_on_chip=False`` always rolls.
    """
    plan = _PLANS.get((name, mode))
    if plan is None:
        raise PolyfuseError(f"operator {name!r} has no default schedule for mode {mode!r}")
    if target not in GPU_TARGETS:
        sch = Schedule(program)
        plan(sch)
        sch.compact_buffers()
        return sch
    device = device or for_backend(target)
    tuning = tuning or GpuTuning()
    while True:
        sch = _gpu_schedule(program, plan, device, tuning, target, options)
        if device.shared_per_block >= tuning.shared_bytes or _fits(sch, target, device):
            return sch
        smaller = tuning.smaller()
        if smaller == tuning:
            return sch  # (building it says which kernel does not fit, and by how much)
        tuning = smaller


def _rows_on_chip(program: Program, plan: _Plan, backend: str, device: DeviceSpec,
                  options: CodegenOptions) -> Schedule | None:
    """The rolling plan's fusion without rolling (every block moved into the producer's row loop), where the
    code generator keeps every kernel's rows on chip (:mod:`~polyfuse.emit_cpp.onchip`); None where a row does
    not fit (then the rows roll over chunks)."""
    if not options.rows_on_chip or hasattr(plan, "gpu") or not hasattr(plan, "rolling"):
        return None
    _, producer, _ = plan.rolling  # type: ignore[attr-defined]
    sch = Schedule(program)
    row = sch.get_loops(producer)[0]
    for block in [b.name for b in program.blocks() if b.name != producer]:
        try:
            sch.reverse_compute_at(block, row)
        except PolyfuseError:
            return None
    sch.compact_buffers()
    try:
        _, planned = gpu_plan(skip_masked_tiles(to_tiles(sch.program)), Target(backend, device, options))
    except PolyfuseError:
        return None
    if all(k.nest.kind == MAP or isinstance(k.rows, RowsOnChip) for k in planned.kernels):
        return sch
    return None


def _gpu_schedule(program: Program, plan: _Plan, device: DeviceSpec, tuning: GpuTuning,
                  backend: str = "cuda", options: CodegenOptions | None = None) -> Schedule:
    on_chip = _rows_on_chip(program, plan, backend, device, options or CodegenOptions())
    if on_chip is not None:
        if tuning.warps is not None:
            _ask_warps(on_chip, tuning.warps)
        return on_chip
    sch = Schedule(program)
    try:
        _gpu_plan(sch, plan, device, tuning)
    except PolyfuseError:
        # The GPU tiling does not apply to this program (e.g. chained consumers that cannot
        # roll over tiles): fall back to the element-wise plan, which fuses the same way.
        if plan in (_attention_prefill, _attention_decode) or hasattr(plan, "gpu"):
            raise
        sch = Schedule(program)
        plan(sch)
    if tuning.warps is not None:
        _ask_warps(sch, tuning.warps)
    sch.compact_buffers()
    if plan is _attention_prefill and device.wgmma:
        paired = _paired_prefill(program, plan, device, tuning, backend, options)
        if paired is not None and _late_count(paired[1]) >= _late_products(sch, backend, device, options):
            return paired[0]
    if plan is _attention_prefill and device.wgmma and tuning.prefill_wgmma_rows:
        narrower = dataclasses.replace(tuning, prefill_wgmma_rows=())
        if _prefill_tile(Schedule(program), device, tuning) == _prefill_tile(Schedule(program), device, narrower):
            return sch
        narrow = _gpu_schedule(program, plan, device, narrower, backend, options)
        if _late_products(narrow, backend, device, options) > _late_products(sch, backend, device, options):
            # The wider tile's registers cannot keep a product in flight across the softmax that the narrower
            # one keeps (the divide-inside form's reciprocal rows): that overlap is worth more than the tile
            # (benchmarks/results/2026-11-28_H200_77ade3a_rows192).
            return narrow
    return sch


def _paired_prefill(program: Program, plan: _Plan, device: DeviceSpec, tuning: GpuTuning, backend: str,
                    options: CodegenOptions | None) -> tuple[Schedule, ProgramPlan] | None:
    """Prefill attention in tiles of ``tuning.prefill_pair_rows`` query rows, two blocks per SM, where the code
    generator plans two such blocks per SM (:func:`~polyfuse.emit_cpp.plan.gpu_plan`) and their waves undercut the
    wider tile :func:`_prefill_tile` chose: ``ceil(blocks / (2 · SMs))`` waves of two tiles per SM, less
    ``prefill_pair_gain`` percent, against that tile's waves of one (less ``prefill_wgmma_rows_gain`` where it is
    the widest); with its kernel plan, else None.  (The caller also refuses a pair that issues fewer products one
    iteration late than the tile it would replace, as it refuses the wider tile.)"""
    pair = tuning.prefill_pair_rows
    if pair is None:
        return None
    paired = dataclasses.replace(tuning, prefill_tile=(pair, tuning.prefill_tile[1]), prefill_wgmma_rows=(),
                                 prefill_pair_rows=None)
    sch = Schedule(program)
    rows = _prefill_tile(sch, device, tuning)[0]
    if rows <= pair or _prefill_tile(sch, device, paired)[0] != pair:
        return None
    pairs, alone = _wave_rows(sch, device, pair, PAIRED_BLOCKS), _wave_rows(sch, device, rows)
    if pairs is None or alone is None:
        return None
    gain = tuning.prefill_wgmma_rows_gain if rows > tuning.prefill_tile[0] else 0
    if pairs * (100 - tuning.prefill_pair_gain) >= alone * (100 - gain):
        return None
    candidate = _gpu_schedule(program, plan, device, paired, backend, options)
    planned = _planned(candidate, backend, device, options)
    producers = [k for k in planned.kernels if any(lp.fragments is not None and lp.fragments.producer
                                                   for lp in k.loops.values())]
    if not producers or any(k.blocks_per_sm < PAIRED_BLOCKS for k in producers):
        return None
    return candidate, planned


def _planned(sch: Schedule, backend: str, device: DeviceSpec, options: CodegenOptions | None) -> ProgramPlan:
    """The code generator's plan of ``sch``'s kernels (not printed)."""
    return gpu_plan(skip_masked_tiles(to_tiles(sch.program)), Target(backend, device, options or CodegenOptions()))[1]


def _late_products(sch: Schedule, backend: str, device: DeviceSpec, options: CodegenOptions | None) -> int:
    """How many fragment loops of ``sch``'s kernels issue a product one iteration late (planned, not printed)."""
    return _late_count(_planned(sch, backend, device, options))


def _late_count(planned: ProgramPlan) -> int:
    """How many fragment loops of ``planned``'s kernels issue a product one iteration late."""
    return sum(lp.fragments is not None and lp.fragments.deferred is not None
               for k in planned.kernels for lp in k.loops.values())


def _fits(sch: Schedule, backend: str, device: DeviceSpec) -> bool:
    """Whether every kernel of ``sch`` fits in ``device``'s shared memory per block (planned, not printed)."""
    try:
        gpu_plan(skip_masked_tiles(to_tiles(sch.program)), Target(backend, device))
    except UnsupportedPattern:
        return False
    return True
