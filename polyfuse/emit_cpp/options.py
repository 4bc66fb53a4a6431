"""The code generator's choices, in one frozen object passed down explicitly.

Every choice the GPU code generator makes that is not forced by the program or the device is a field of
:class:`CodegenOptions`: which optimisations run, how many warps a block has, how far loops unroll.  The
defaults are the choices measured fastest on the GPU machine (the measurements are in
``benchmarks/results/``); a test or an autotuner sets another value by passing other options in the
:class:`~polyfuse.emit_cpp.target.Target`, never by changing a module.  The options are printed at the top
of every generated source, so they are part of the kernel cache's key (which hashes the source).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from polyfuse.errors import PolyfuseError

WARPGROUP_WIDTHS = (64, 128)
"""Columns of ``b`` per warpgroup product that ``pf::wgmma_m64nNk16_*`` provides (``polyfuse_gpu.h``)."""


@dataclass(frozen=True)
class CodegenOptions:
    """Options of the GPU code generator (the host backend ignores them).

    ``fast_exp``: f32 ``exp`` as ``pf::exp_fast`` (``__expf``'s ``ex2.approx`` of ``x·log2 e``, results under
    2^-126 flushed to 0) in CUDA programs whose outputs are all 16-bit floats (its error,
    at most ``2 + 1.173·|x|`` ulp, stays below such an output's rounding; HIP keeps the accurate one).
    ``warps``: warps of a block kernel where the schedule does not say (``warps`` annotation of a grid
    loop); None takes the device's default.  ``map_threads``: threads of the blocks of a map kernel and of a
    presplit kernel.
    ``min_blocks``: a block kernel whose shared memory lets at most this many blocks reside on an SM asks
    ``__launch_bounds__`` for registers that let them all reside (None asks nothing).
    ``element_unroll``: unroll factor of the loops over a thread's elements.  ``unroll_reduce``: a reduction
    with one thread per output over at most this many steps is unrolled.
    ``tensor_cores``: dots on tensor cores where the device has them (``mma.sync``).
    ``row_groups``: runs of row statements in one pass (:mod:`~polyfuse.emit_cpp.rows`).
    ``register_accumulators``: rolling dot accumulators in registers across their loop
    (:mod:`~polyfuse.emit_cpp.registers`).  ``resident``/``resident_elements``: small temporaries a loop
    updates in place kept in shared memory across it (:mod:`~polyfuse.emit_cpp.resident`).
    ``presplit``: f32 inputs that several blocks multiply split once into bf16 parts by a kernel of their
    own (:mod:`~polyfuse.emit_cpp.presplit`).  ``async_staging``: raw 16-bit operands staged by
    ``cp.async``.  ``keep_invariant``: a loop's operand tiles that do not change with it copied once;
    ``share_tiles``: a dot reads another dot's tile of the same iteration where it holds its operand
    (:mod:`~polyfuse.emit_cpp.stream`; in a loop of warpgroup products, also where the operand is whole
    swizzled panels of that tile: MLA's value columns of its key tile).  ``paired_b``: split-operand dots load
    two ``b`` tiles per ``ldmatrix.x4``.  ``split_k``/``split_k_tiles``/``split_k_steps``: a tensor-core dot with
    few output tiles and a long ``k`` splits ``k`` among its warps (:func:`~polyfuse.emit_cpp.dotplan.k_groups`).
    ``stage_group``: elements a thread converts and stores together when staging an operand without
    vector reads.
    ``fragment_loops``: a loop of chained tensor-core products whose tiles have at least ``fragment_min_rows``
    rows keeps its tiles in warp fragments (:mod:`~polyfuse.emit_cpp.fragments`).  ``round_operands``: an f32
    operand computed in registers (attention's P) is rounded once to the product's 16-bit type, as
    FlashAttention, cuDNN and FlexAttention do (the error term is in the operators' tolerance notes); off: split
    hi + lo and multiplied twice (about 22 significant bits instead of 11).  ``prefetch``: such a loop copies
    the next iteration's operand tiles while it computes this one (two buffers each).  ``reduce_chains``: such a
    loop's thread reduces its columns of a row into this many independent partials (a power of two), combined
    in a tree: shorter dependency chains.  ``warpgroup_products``: where the device has ``wgmma`` (sm_90a), such a
    loop's products run as warpgroup products on operands staged in 128-byte-swizzled shared memory, each
    warpgroup's four warps owning 64 whole rows (the same per-warp fragments), where every product's shape allows;
    ``warpgroup_width`` (64 or 128) is the most columns of ``b`` one warpgroup product takes (a wider one reads
    its ``a`` once for more columns: less shared-memory traffic per multiply-add); a product whose accumulators
    would not fit a thread's registers beside the loop's tiles is issued a narrower chunk at a time, each folded
    into its statement before the next (:attr:`~polyfuse.emit_cpp.dotplan.DotPlan.fold`).
    ``reciprocal_operands``: there, a product operand ``x / d`` rounded once to 16 bits, ``d`` a row value of
    proven range (a softmax denominator, in ``[1, n]``), is ``x · (1/d)`` with ``1/d`` once per row
    (:mod:`~polyfuse.emit_cpp.reciprocal`: relative ``2^-23 + 2^-48`` before the rounding, in the tolerance
    notes); off: an IEEE division per element.
    ``reciprocal_constants``: an f32 division ``x / c`` by a constant ``c`` with ``|c| > 1`` that is not a power
    of two is ``x · fl(1/c)`` (:func:`~polyfuse.emit_cpp.reciprocal.reciprocal_constant`: one rounding more, a
    relative ``2^-23 + 2^-48`` instead of ``2^-24``, in the tolerance notes of the operators that divide so; no
    overflow, since ``|fl(1/c)| <= 1``); a power of two divides exactly either way; off: an IEEE division.
    ``reciprocal_rows``: in a kernel whose rows stay on chip, an f32 division of every element by a value of
    the row is ``x · rcp_rz(d)``, ``1/d`` rounded toward zero once per row, where its finite non-zero values are
    proven to lie within ``[2^-126, 2^126]`` in magnitude, or, unproven, in each row where ``d`` passes that
    test at run time (the other rows divide) (:func:`~polyfuse.emit_cpp.reciprocal.row_divisions`: a relative
    ``2^-23 + 2^-24`` instead of ``2^-24``, in the tolerance notes; no overflow the division does not have);
    the same for the statements after a loop in warp fragments (attention's ``out = pv / row_sum``), where proven
    only; off: an IEEE division per element.
    ``producer_warp``: there, a warp of its own copies the loop's operand tiles into two stages whose completion
    and release mbarriers track (warp specialisation): the warps that compute never wait at a block barrier.
    ``tma``: there, on a device with bulk tensor copies (sm_90a), one thread of that warpgroup brings each tile
    by ``cp.async.bulk.tensor`` into its swizzled panels, completing on the stage's mbarrier, where every tile it
    copies is a raw tile of an input (:mod:`~polyfuse.emit_cpp.tma`; a ragged edge is zero-filled by the copy
    engine); off: cp.async by all its threads.
    ``overlap_products``: there, the product whose ``a`` the loop computes (attention's P·V) is issued one
    iteration late, right after the next iteration's first product, so that it runs during the statements between
    them (the softmax), where its accumulators fit the registers and a third stage of tiles fits shared memory
    (:class:`~polyfuse.emit_cpp.fragments.Deferred`); off: each product waited for where it is issued.
    ``accumulate_products``: a warpgroup product that the loop adds to a rolling update's rescaled accumulator,
    guarded where the row's running maximum is −∞ (attention's ``O·h + P·V``), accumulates straight into the
    accumulator's registers, the guard moved onto its ``a`` (:func:`~polyfuse.emit_cpp.fragment_values.accumulated`:
    equal where ``b``'s inputs are declared finite): its own accumulators are saved (64 registers per thread at
    128-wide heads), so that the product can also be issued one iteration late there; off: accumulated from zero
    and added.
    ``warpgroup_turns``: there, with two or more computing warpgroups, each issues its products (this iteration's
    first and the previous one's late product) only in its turn, after the warpgroup before it, at named barriers
    (FlashAttention-3's scheduler barrier): one warpgroup's softmax then runs while the other's products occupy
    the tensor cores, instead of both competing for them at once.
    ``rows_on_chip``: a block kernel whose body works on one row keeps the row in registers, loaded once, its
    reductions from registers, at most ``row_registers`` 32-bit registers per thread for the row tiles
    (the tiles over the budget in shared memory, one block per SM: :mod:`~polyfuse.emit_cpp.onchip`); the
    default GPU schedules then do not roll such rows over chunks.
    ``fold_combine``: a split-k combine runs in its partial kernel's launch, by the last block of each row
    (:mod:`~polyfuse.emit_cpp.fold`), where that is legal and that block runs at most ``fold_serial`` blocks of
    the combine one after another (more run in parallel in a launch of their own: a long serial combine costs
    more than the launch it saves, as MLA decode's does; benchmarks/results has the measurements); off: its
    own launch after the partial kernel.
    ``stage_partials``: there, the last block copies its row's partials into shared memory at once before it
    combines them (one round trip to the L2 instead of one per statement and column block), where they are
    contiguous per row and fit without fewer blocks per SM (:func:`~polyfuse.emit_cpp.fold.stage`); values are
    unchanged.
    ``stream_ahead``: a loop outside warp fragments that keeps its products' operand tiles in shared memory keeps
    every operand that changes with it, in two halves, and copies the next iteration's while it computes this one
    (the invariant tiles and the first iteration's before the loop: :mod:`~polyfuse.emit_cpp.stream`); off: each
    iteration's tiles are copied when its products need them, and waited for at once.
    ``refill_tiles``: where copying ahead is off or its second halves would not fit, such a loop keeps every
    operand that changes with it in one buffer, copied before the loop and refilled with the next iteration's
    tile right after its last reader (decode's value tile arrives while the scores are computed, the next key
    tile during the softmax and the second product); planned only where the buffers let as many blocks run at
    once as copying per statement, or all of them; off: copied when the products need them.
    ``streaming_loads``: a row kernel that keeps its rows in the registers of two or more blocks per SM and writes
    values per row (a reduction) loads the rows it reads once (each element at most once over the launch, proven
    by ISL) with the cache-streaming hint, evicted first from L1 and L2 (:mod:`~polyfuse.emit_cpp.streaming`);
    values are unchanged.
    ``staged_stores``: a loop with a producer warpgroup writes each tile of rows that its epilogue stores to memory
    (attention's ``out``) into the shared memory of its operand buffers, free once every computing warp is done
    with them, and each warp then copies its rows out in 16-byte pieces: whole lines per instruction instead of
    two-byte stores spread over eight rows (:func:`~polyfuse.emit_cpp.fragments.staged_store`); off: each element
    stored from its register.  Values are unchanged.
    ``stagger_loops``: a block's loop that folds its steps commutatively over tiles every block reads at the same
    step (a weight) starts each block at a step of its own, so that the blocks do not all ask the L2 for the same
    lines at once (:mod:`~polyfuse.emit_cpp.stagger`); max and min folds are unchanged, sums are rounded in
    another order within the same bound.
    """

    fast_exp: bool = True
    warps: int | None = None
    map_threads: int = 256
    min_blocks: int | None = 3
    element_unroll: int = 4
    unroll_reduce: int = 16
    tensor_cores: bool = True
    row_groups: bool = True
    register_accumulators: bool = True
    resident: bool = True
    resident_elements: int = 1024
    presplit: bool = True
    async_staging: bool = True
    keep_invariant: bool = True
    share_tiles: bool = True
    paired_b: bool = True
    split_k: bool = True
    split_k_tiles: int = 2
    split_k_steps: int = 16
    stage_group: int = 4
    fragment_loops: bool = True
    fragment_min_rows: int = 32
    round_operands: bool = True
    reciprocal_operands: bool = True
    reciprocal_constants: bool = True
    reciprocal_rows: bool = True
    prefetch: bool = True
    reduce_chains: int = 4
    warpgroup_products: bool = True
    warpgroup_width: int = 128
    producer_warp: bool = True
    tma: bool = True
    overlap_products: bool = True
    accumulate_products: bool = True
    warpgroup_turns: bool = True
    rows_on_chip: bool = True
    row_registers: int = 64
    fold_combine: bool = True
    fold_serial: int = 2
    stage_partials: bool = True
    stream_ahead: bool = True
    refill_tiles: bool = True
    streaming_loads: bool = True
    staged_stores: bool = True
    stagger_loops: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise PolyfuseError(f"CodegenOptions.{f.name} must be a positive integer, got {value!r}")
        if self.reduce_chains & (self.reduce_chains - 1):
            raise PolyfuseError(f"CodegenOptions.reduce_chains must be a power of two, got {self.reduce_chains}")
        if self.warps is not None and self.warps > 32:
            raise PolyfuseError(f"CodegenOptions.warps is {self.warps}; a block has at most 32 warps (1024 threads)")
        if self.warpgroup_width not in WARPGROUP_WIDTHS:
            raise PolyfuseError(f"CodegenOptions.warpgroup_width is {self.warpgroup_width}; the warpgroup products "
                                f"polyfuse emits take {' or '.join(map(str, WARPGROUP_WIDTHS))} columns")

    def describe(self) -> str:
        """``name=value`` for every option, in field order (printed in the source header)."""
        return " ".join(f"{f.name}={_text(getattr(self, f.name))}" for f in dataclasses.fields(self))


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "auto" if value is None else str(value)
