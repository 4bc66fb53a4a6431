"""The choices of the GPU schedules of the catalog, in one object an autotuner can vary.

:func:`~polyfuse.ops.schedules.default_schedule` takes a :class:`GpuTuning` for GPU targets beside the
:class:`~polyfuse.device.DeviceSpec`: the device says what the GPU has (SMs, shared memory per SM and per
block), the tuning what the schedule makes of it (tile sizes, heads per block, blocks per SM the split rules
aim at, warps per block).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from polyfuse.device import PRESETS
from polyfuse.errors import PolyfuseError


@dataclass(frozen=True)
class GpuTuning:
    """The choices of the GPU schedules, as opposed to the facts of the device (SMs, shared memory: the
    :class:`~polyfuse.device.DeviceSpec`): tile sizes, heads per block, what the split rules aim at.

    One object, so that an autotuner can vary them per operator and device and pass them to
    :func:`~polyfuse.ops.schedules.default_schedule`; the defaults are the choices measured best on the H200
    (the figures kept below).  ``warps``, where set, asks every kernel of a GPU plan for that many warps per
    block (a ``warps`` annotation of each top-level loop, :meth:`~polyfuse.transforms.schedule.Schedule.warps`);
    without it the code generator's default applies.
    """

    prefill_tile: tuple[int, int] = (128, 64)
    """Query rows × key columns per thread block of fused prefill attention on GPUs: 16 rows per warp of the
    warp-fragment loop (:mod:`polyfuse.emit_cpp.fragments`), 8 warps.  (Before that loop existed, with every
    tile in shared memory, 32×64 was the best measured on the H200.)"""
    prefill_wgmma_keys: int = 128
    """Key columns per thread block of fused prefill attention where the device has warpgroup products (sm_90a):
    the loop's two products as ``wgmma`` with a producer warpgroup (:mod:`polyfuse.emit_cpp.fragments`); the
    longer key tile halves the iterations each block waits on (with the producer warpgroup, faster than 64 for
    every prefill operator measured on the H100; the divide-inside form is fastest with 64 keys and no producer:
    benchmarks/results/2026-11-27_H100_501f5e6)."""
    prefill_wgmma_rows: tuple[tuple[int, int], ...] = ((64, 192),)
    """Wider query tiles of fused prefill attention where the device has warpgroup products, by the value head's
    width: ``(widest dv, rows)`` pairs, the first that admits the program's dv is a candidate against
    ``prefill_tile``'s rows.  192 rows are three computing warpgroups beside the producer, 160 registers each,
    which hold a 64-wide value head's accumulators with the next score tile and the late P·V's operands
    (FlashAttention-3's choice for these heads); a 128-wide head needs two warpgroups of 240.  Taken by the wave
    rule of ``prefill_wgmma_rows_gain``, and only where the sequence spans two such tiles."""
    prefill_wgmma_rows_gain: int = 16
    """Percent by which the wider tile of ``prefill_wgmma_rows`` computes a row faster where both tiles fill
    whole waves.  Each prefill block takes a whole SM (the producer's and the computing warpgroups' registers),
    so a grid runs in ``ceil(blocks / SMs)`` waves of one tile's time: the wider tile is taken where its waves ×
    rows, less this gain, are fewer than the narrower's.  Measured on the H200 (attn_global, 16 heads, same
    process, benchmarks/results/2026-11-29_H200_9c3f45d_values): 192 rows against 128 take 16.7–18% less time
    per wave-row at S = 3072, 4096 and 8192 (1.20×, 1.08×, 1.086× faster in all); at 1024 and 2048 (one and two
    waves of either tile) the rule keeps 128."""
    prefill_pair_rows: int | None = 64
    """Query rows per block of fused prefill attention where two blocks share each SM, on devices with warpgroup
    products: one computing warpgroup beside its producer, whose waits (first copies, softmax, epilogue) the other
    block fills.  Taken where the code generator plans two such blocks per SM (their shared memory and registers
    fit: the 64-wide heads, not the 128-wide ones with 128-key tiles) and the wave rule of ``prefill_pair_gain``
    prefers them to the wider tile chosen otherwise; None: never."""
    prefill_pair_gain: int = 4
    """Percent by which two blocks of ``prefill_pair_rows`` per SM compute a row faster than the tile the other
    rules chose, where both fill the same waves.  Measured on the H200 (attn_global, 16 heads, d64, same process,
    benchmarks/results/2026-11-29_H200_06ae72e_paired): against one block of 128 rows per SM, 1.05× faster at
    S = 1024, 1.12× at 2048 (norm_inside 1.11×), 0.99× at 4096, where the 192-row tile is 1.08× faster than
    128; a gain of 4 takes the pair at 1024 and 2048 and the 192 rows from 4096 on."""
    prefill_min_rows: int = 32
    """Fewest query rows per block of prefill attention on tensor-core GPUs where the sequence is short (a ragged
    last tile is masked): a loop in warp fragments needs two warps of 16 rows (the code generator's
    ``fragment_min_rows``); fewer would fall back to tiles in shared memory."""
    hoist_divisors: bool = True
    """Attention's divide-inside form, ``Σ_j (exp(P − m)/ℓ)·v``, divides once after the sum on GPUs
    (:meth:`~polyfuse.transforms.schedule.Schedule.hoist_divisor`, where its floating-point conditions are
    proven): the fused loop is then the plain form's, one product per score fewer and no repair that waits on
    the step's ℓ.  The host target keeps the divide-inside repair (OPERATORS.md's two-producer example)."""
    decode_heads: int = 16
    """Most query heads per thread block of fused decode attention on GPUs (the M of its tile products).

    The query heads that share a kv head form the rows of the block's tile, so the block reads each key
    and value once for all of them.  16 fills one m16n8k16 tensor-core row tile.  With MLA's qk dim 576 and
    64-key tiles the generated partial kernel needs about 110 KB of shared memory with 16 heads and 150 KB
    with 32; with 64 heads the combine kernel (64 rows of 512 partial sums) exceeds the 227 KB limit."""
    decode_tile: int = 128
    """Keys per step of the rolling loop inside one split (the N of the score product, the K of the value
    product), before the shared-memory budget below shrinks it.  Measured on the H200 (attn_global decode
    B=32 H=64 Skv=4096, ms): 64 1.59, 128 1.27, 256 1.52; 2 splits of 2048 keys instead of none 1.33.
    MLA decode B=32 with 16 warps instead of 8: 0.643 against 0.670 ms (left at 8)."""
    decode_warps: int = 4
    """Fewest warps per thread block of the mma.sync decode kernels (the split partials and their combine; the
    warpgroup-row schedule keeps the code generator's): more only where the value product's output needs them
    for one warp tile each (:func:`~polyfuse.ops.schedules.gpu_decode_tiling`).  A decode block's score tile
    has one to sixteen rows, so its products, reductions and element loops give few warps work each, while
    every barrier of its loop waits for all of them.  Measured on the H200 against 8 warps (one process each, same
    inputs, two runs: benchmarks/results/2026-11-28_H200_4fa1584_decode_warps): softcap decode 1.38–1.40× faster,
    window 1.09–1.10×, global 1.03–1.05×, norm_inside 1.02–1.03×, causal, ALiBi and global B=32 1.01×, GQA 0.995×;
    MLA (dv 512) 0.47× with 4, its value accumulators no longer in registers — hence the rule's exception."""
    decode_tile_bytes: int = 80 * 1024
    """Shared memory for the f16 key tile (keys × (qk dim + 8 padding) × 2 bytes): the tile halves until it fits
    (MLA, qk dim 576: 64 keys; qk dim 128: 128 keys), and until the key tile and the query rows fit in what one
    block may use (``DeviceSpec.shared_per_block``)."""
    decode_blocks_per_sm: int = 8
    """Thread blocks per SM the split rule aims at for the partial kernel (1056 on the H200's 132 SMs), so that
    enough key tiles stream at once; ``decode_min_split`` bounds the splits from above.  Measured on the
    H200 (partials and combine included): MHA causal B=1 H=32 Skv=32768 0.312 ms with 264 blocks (9 splits),
    0.192 with 1056 (32); MHA global B=1 H=16 0.100 → 0.077; but MLA 0.427 → 1.08 and GQA 0.103 → 0.180 when
    the same target cuts their splits to 256 keys, which the minimum below prevents."""
    decode_waves: int = 2
    """Most waves of resident partial blocks the decode split rule aims at.  Where a block's tiles leave room for
    few blocks per SM (MLA: a 64 × 584 key tile and 16 query rows of 584, two blocks), ``decode_blocks_per_sm``
    would mean many waves of short blocks, each of which pays the query tile, its partial results and their
    combine: MLA decode B=32 measured 0.406 ms with 4 splits, 0.388 with 2 (H200, 2 blocks per SM)."""
    decode_min_split: int = 1024
    """Fewest keys per split when the keys are split (the combine reads one partial result per split: below
    about a thousand keys per block its traffic outweighs the extra parallelism; MLA and GQA, measured above)."""
    decode_short_split: int = 256
    """Fewest keys per split where splits of ``decode_min_split`` keys would give the grid fewer blocks than the
    device has SMs (small batches of short caches): there the idle SMs cost more than the combine's extra partial
    results, while where the longer splits already fill the SMs shorter ones were slower
    (benchmarks/results/2026-11-28_H100_d5d2e1e_splits)."""
    decode_wave_gain: int = 15
    """Percentage points of the last wave's busy fraction by which another split count must beat the one the
    rules above give before the decode split rule takes it (:func:`~polyfuse.ops.schedules.wave_splits`).  Decode
    streams K and V from memory, so a part-filled last wave costs less than its idle fraction: attn_global decode
    B=32 H=64 Skv=4096 fills 78% of its last wave with one split and 89% with two, yet measured 1.27 ms with one
    and 1.33 with two (H200, two launches; see ``decode_tile``); at 10 points the rule would take two."""
    decode_warpgroup_values: int = 256
    """Value columns (dv) per thread block of decode attention where warpgroups take the query heads of a kv head
    as their 64 rows (:func:`~polyfuse.ops.schedules.gpu_decode_tiling`, sm_90a): 64 rows × 256 columns of f32
    are 128 registers per thread beside the score tile; a wider value (MLA's 512) is cut into blocks of this many
    columns, each recomputing the scores of its keys (the code generator folds the value product into its
    statement 64 columns at a time: benchmarks/results/2026-11-28_H100_5894c8f_mla_wgmma)."""
    decode_warpgroup_units: int = 16
    """Fewest (batch, kv head, group of 64 heads, value tile) units for which decode attention takes warpgroup rows;
    below it (batch 1 of MLA: 4 units) the splits that would fill the SMs measured slower than the mma.sync
    schedule's blocks of ``decode_heads`` heads (1.9× at 4096 keys, 1.3× at 32768; measured while those split
    kernels still spilled, benchmarks/results/2026-11-28_H100_5894c8f_mla_wgmma), batch 4 (16 units) 1.19× faster
    than it."""
    decode_warpgroup_fill: int = 90
    """Percent of the SMs the fewest key splits of warpgroup-row decode must give a block each (one block per SM:
    the key tiles, Q and the value tile take most of its shared memory)."""
    decode_warp_splits: int = 4
    """Warps among which a decode block splits its keys again where the rule takes it (each warp streaming its own
    tiles of ``decode_warp_tile`` keys, the block combining the warps' partial results after them:
    :func:`~polyfuse.ops.schedules.warp_split_decode_tiling`); 1: never, the block's warps share every tile.
    Measured on the H200 against shared tiles (one process, same inputs:
    benchmarks/results/2026-11-29_H200_29385d8_warp_groups): one- and two-row decode B=1 at 1024 keys
    1.10–1.22×, 64-wide heads at 4096 keys 1.03–1.11× (each warp two steps); where each warp rolls over more
    steps, 0.97–1.01× (128-wide heads at 4096 keys: eight steps), 0.97–1.02× at 32768 keys, 0.96–0.98× at batch
    32, and blocks of eight rows (GQA) 0.85–1.01×: the bounds below."""
    decode_warp_tile: int = 32
    """Keys per step of each warp of warp-split decode (16: within 3% of 32 either way, measured as above)."""
    decode_warp_steps: int = 2
    """Warp splits are taken only where each warp rolls over at most this many steps."""
    decode_warp_split_heads: int = 2
    """Warp splits are taken only where a block's query rows are at most this many heads."""
    combine_columns: int = 32
    """Output columns (dv) per thread block of the split-k combine of decode attention on GPUs (the combine's grid
    is otherwise one block per head group: 8 blocks at MLA's B=1 H=128).  Measured on the H200 (ms, columns 16 /
    32 / 64 / 128 / one block per group): MLA decode 0.270 / 0.275 / 0.281 / 0.296 / 0.387; GQA decode – / 0.081 /
    0.084 / – / 0.089; causal decode – / 0.189 / 0.190 / – / 0.192."""
    row_tile: int = 4096
    """Elements per step of the rolling loop of the row reductions on GPUs (the schedule halves it until
    the row spans two steps).  Measured on the H200 (rmsnorm_amax 4096×8192 f32): 1024 0.127 ms, 2048 0.104,
    4096 0.086; softmax 4096×4096: 1024 0.055, 2048 0.048."""
    gemm_tile: tuple[int, int, int] = (64, 128, 64)
    """Rows × columns of C per thread block of quant_gemm on GPUs, and the k elements per step of its rolling
    loop.  Measured on the H200 (M = K = N = 4096, f32 operands on tensor cores as bf16 hi + lo): 64×64×32 7.94 ms,
    64×64×64 6.09, 128×64×32 8.83, 64×128×32 7.84, 128×128×32 8.46; with C in registers and 128-bit staging
    (session 4): 64×64×64 4.51, 64×128×64 4.38, 64×64×128 4.93, 128×64×64 5.22, 128×128×64 8.31, 64×128×32 6.96;
    with W split once before the kernel (session 6): 64×128×64 2.93, 128×128×32 3.61, 64×128×32 4.97, 64×256×64
    4.03, 128×64×64 4.14."""
    gate_tile: tuple[int, int] = (16, 256)
    """Token rows per thread block of moe_routing on GPUs (every expert column: E is small), and the hidden
    elements per step of the gate product.  Measured on the H200 (S = HD = 4096, E = 64): 32×64 0.265 ms,
    64×64 0.371, 32×128 0.253, 16×64 0.233, 16×128 0.214 (256 blocks: more of the H200's 132 SMs busy); with
    128-bit staging of the f32 operands (session 4): 16×128 0.144, 16×256 0.129, 16×512 0.202, 32×128 0.147,
    32×256 0.143, 8×128 0.163."""
    performer_tile: tuple[int, int, int] = (64, 64, 64)
    """performer on GPUs: key rows per step of the key-side rolling loop (a step's tile of k·Pᵀ, 64×256 f32 = 64 KB
    at F = 256, is all of it that lives in a block), query rows per block and features per step of the query side.
    Measured on the H200 (B = 1, H = 8, L = 4096) when the key side was one block per head (8 blocks on 132 SMs;
    2.33 ms against PyTorch eager's 0.57): 32/64/64 3.22 ms, 64/64/64 2.34, 32/128/64 3.32, 32/64/128 3.28.
    The key side is now split over many blocks (:func:`~polyfuse.ops.schedules.gpu_performer_tiling`), not yet
    measured."""
    performer_blocks_per_sm: int = 1
    """Thread blocks per SM the split rule aims at for performer's key side.  At F = 256 a block's shared memory
    (the step's k·Pᵀ tile and the staging of its k'ᵀv product, about 223 KB with 64 keys per step) leaves room
    for one block per SM."""
    performer_min_split: int = 256
    """Fewest keys per split of performer's key side: the combine reads each split's partial k'ᵀv (F×D floats: at
    F = 256, D = 64 half as many bytes as the k and v rows of a 256-key split), so shorter splits add more
    combine traffic than they add parallelism."""
    warps: int | None = None
    """Warps per thread block of every kernel of a GPU plan; None: the code generator's default."""
    shared_bytes: int = PRESETS["sm_90a"].shared_per_block
    """Shared memory per block the tiles above are sized for (sm_90a's 227 KB); on a device with less,
    :func:`~polyfuse.ops.schedules.default_schedule` halves them until the kernels fit (:meth:`smaller`)."""

    def smaller(self) -> GpuTuning:
        """Every tile of the GPU schedules halved: tiles not below 16 (a tensor-core tile), heads per block not
        below 1, the key tile's bytes not below 4 KB, row steps not below 256; the same tuning where nothing
        can shrink any more."""
        def half(n: int, floor: int = 16) -> int:
            return max(floor, n // 2) if n > floor else n

        return dataclasses.replace(
            self, prefill_tile=tuple(half(n) for n in self.prefill_tile), prefill_wgmma_rows=(),
            decode_heads=half(self.decode_heads, 1),
            decode_tile=half(self.decode_tile), decode_tile_bytes=half(self.decode_tile_bytes, 4096),
            row_tile=half(self.row_tile, 256), gemm_tile=tuple(half(n) for n in self.gemm_tile),
            gate_tile=tuple(half(n) for n in self.gate_tile),
            performer_tile=tuple(half(n) for n in self.performer_tile))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, default = getattr(self, f.name), f.default
            if value is None and f.name in ("warps", "prefill_pair_rows"):
                continue
            if type(default) is bool:
                if type(value) is not bool:
                    raise PolyfuseError(f"GpuTuning.{f.name} = {value!r}: must be True or False (default {default!r})")
                continue
            if f.name == "prefill_wgmma_rows":
                if not (isinstance(value, tuple) and all(
                        isinstance(p, tuple) and len(p) == 2 and all(type(n) is int and n > 0 for n in p)
                        and p[1] % 64 == 0 for p in value)):
                    raise PolyfuseError(f"GpuTuning.prefill_wgmma_rows = {value!r}: must be a tuple of (widest value "
                                        "head, query rows) pairs of positive integers, the rows whole warpgroups of "
                                        f"64 (default {default!r}; () for prefill_tile's rows everywhere)")
                continue
            numbers = value if isinstance(value, tuple) else (value,)
            width = len(default) if isinstance(default, tuple) else 1
            if len(numbers) != width or not all(type(n) is int and n > 0 for n in numbers):
                what = f"a tuple of {width} positive integers" if width > 1 else "a positive integer"
                raise PolyfuseError(f"GpuTuning.{f.name} = {value!r}: must be {what} (default {default!r})")
