"""The GPU kernel plan: every decision of the CUDA/HIP code generator, made before any text is written.

:func:`plan_program` walks a :class:`~polyfuse.tiling.gpu.GpuProgram` once per kernel and returns a
:class:`ProgramPlan`; the printer (:mod:`polyfuse.emit_cpp.cuda`) only reads it.  Where each decision is made:

* threads per block: the schedule's ``warps`` (grid stage), else the options', else the device's default;
  a map kernel gets the options' ``map_threads``;
* f32 inputs split into bf16 parts before the kernels: :mod:`polyfuse.emit_cpp.presplit`;
* per loop (:class:`LoopPlan`): rolling accumulators in registers (:mod:`~polyfuse.emit_cpp.registers`),
  small temporaries resident in shared memory (:mod:`~polyfuse.emit_cpp.resident`), operand tiles the loop
  keeps (:mod:`~polyfuse.emit_cpp.stream`);
* per sequence of statements: row groups (:mod:`~polyfuse.emit_cpp.rows`);
* per statement (:class:`StmtPlan`): whether it is computed in its tensor-core dot's epilogue (and then in
  registers), which nodes get arrays of their own, and a :class:`~polyfuse.emit_cpp.dotplan.DotPlan` for
  every dot (:mod:`~polyfuse.emit_cpp.dotplan`);
* shared memory: the kernel's temporaries (rows padded so that row-wise accesses spread over the banks), the
  loops' buffers and each statement's scratch, allocated as a stack; the peak is checked against the
  :class:`~polyfuse.device.DeviceSpec` before printing — where kept tiles would exceed it, the kernel is
  planned again without them — and decides ``__launch_bounds__`` (the options' ``min_blocks``).

``str(plan)`` is what ``polyfuse show OP --stage plan`` prints.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from polyfuse.device import DeviceSpec
from polyfuse.emit_cpp import fold as fold_
from polyfuse.emit_cpp import (
    fragments, groups, onchip, presplit, registers, resident, rows, stagger, stream, streaming,
)
from polyfuse.emit_cpp.cfamily import (
    CHEAP_CALLS, COMPUTE_TYPES, SIZEOF, STORAGE_TYPES, align16, materializations, reduce_lanes, static_numel,
    walk_unmaterialized, worth_hoisting,
)
from polyfuse.emit_cpp.dotplan import (
    BLOCK_REDUCE, FMA, M16N8, MMA_SYNC, PER_OUTPUT, SWIZZLE_ALIGN, DotPlan, Frame, OperandPlan, Staged, dot_pitch,
    few_outputs, k_groups, mma_type, presplit_parts, raw_staging, staging, warp_tiling,
)
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.emit_cpp.target import Target, entry_name
from polyfuse.errors import InternalError, UnsupportedPattern
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import Loop, Seq, Stmt, Tensor
from polyfuse.ir.visit import substitute
from polyfuse.tiling.gpu import GpuProgram, lower_for_gpu
from polyfuse.tiling.grid import MAP, GridNest
from polyfuse.tiling.htile import (
    Dot, Reduce, Slice, TileLoad, TileProgram, TileStore, axes_of, axis_sizes, depends_on, tile_children,
    walk_tile_expr, walk_tile_stmts,
)
from polyfuse.tiling.parallel import unit_loop


@dataclass(frozen=True)
class SharedTemporary:
    """A temporary of the kernel in shared memory: ``bytes`` of ``ctype`` from byte ``offset``; rows of
    dimension ``padded`` are ``pitch`` elements apart (None: dense)."""

    name: str
    ctype: str
    nbytes: int
    offset: int
    padded: int | None = None
    pitch: int | None = None
    groups: groups.WarpGroups | None = None
    """Allocated inside a loop run by warp groups: one copy of ``nbytes`` per group."""


@dataclass(frozen=True)
class StmtPlan:
    """How one tile statement is computed.

    ``in_place``: in the epilogue of its one tensor-core dot (``dot``), into the registers ``register`` (its
    loop's accumulator) if given, else written to memory element by element; ``materialize``: the nodes that get
    arrays of their own, in order; ``dots``: the plan of each materialized dot; ``row_values``: the parts of
    an in-place value read once per fragment row; ``scratch``: shared-memory bytes the statement takes, from
    byte ``at`` (its arrays and staging, in the order they are made; freed after the statement).
    """

    block: str
    in_place: bool
    register: str | None
    dot: DotPlan | None
    materialize: tuple[Expr, ...]
    dots: Mapping[Expr, DotPlan]
    row_values: tuple[Expr, ...]
    scratch: int
    at: int = 0

    @property
    def in_registers(self) -> bool:
        return self.register is not None


@dataclass(frozen=True)
class LoopPlan:
    """What one loop keeps across its iterations: register accumulators (by block; ``stored``: those its
    statements use, written back after the loop), resident temporaries, kept operand tiles."""

    var: str
    accumulators: Mapping[str, registers.Accumulator]
    stored: tuple[str, ...]
    resident: tuple[resident.Resident, ...]
    streams: stream.StreamPlan | None
    offsets: Mapping[str, int] = field(default_factory=dict)
    """Byte offset of each of the loop's shared buffers (resident copies, kept tiles, staging), by name."""
    fragments: fragments.FragmentLoop | None = None
    """The loop runs in warp fragments (then its statements have no plans of their own)."""
    stagger: stagger.Stagger | None = None
    """Each block starts the loop at a step of its own (:mod:`~polyfuse.emit_cpp.stagger`)."""
    group: groups.WarpGroups | None = None
    """The loop runs on groups of the block's warps (:mod:`~polyfuse.emit_cpp.groups`; then it keeps nothing
    itself: its body's loops do)."""


@dataclass(frozen=True)
class KernelPlan:
    """One kernel: its kind, threads, grid, shared memory (temporaries and peak) and the plans of its
    loops, sequences and statements (keyed by the identity of the tile program's nodes)."""

    name: str
    nest: GridNest
    threads: int
    warp: int
    shared: tuple[SharedTemporary, ...] = ()
    peak: int = 0
    min_blocks: int | None = None
    blocks_per_sm: int | None = None
    keeps_tiles: bool = True
    heavy_first: str | None = None
    """The grid loop whose later iterations do more work (a loop of the body runs longer), decoded slowest and
    from its last value, so that the blocks with the most work start first and the light ones fill the tail."""
    loops: Mapping[int, LoopPlan] = field(default_factory=dict)
    seqs: Mapping[int, tuple[Stmt | rows.RowGroup, ...]] = field(default_factory=dict)
    stmts: Mapping[int, StmtPlan] = field(default_factory=dict)
    rows: onchip.RowsOnChip | str = ""
    """The kernel's rows kept on chip (:mod:`~polyfuse.emit_cpp.onchip`), else why they stay in memory."""
    fold: fold_.CombineFold | None = None
    """A split-k combine this kernel runs after its body, in its last block of each row (:mod:`~polyfuse.emit_cpp.
    fold`); ``folded`` is that combine's plan (for this kernel's threads, its shared memory from byte 0)."""
    folded: KernelPlan | None = None
    unfolded: str = ""
    """Of a split-k combine launched on its own: why it is not folded into the kernel before it."""
    not_ahead: str = ""
    """Where its loops do not copy their tiles ahead although the options' ``stream_ahead`` is on: why
    (:func:`_why_not_ahead`)."""
    not_refilled: str = ""
    """Where they copy them when each iteration needs them although the options' ``refill_tiles`` is on: why
    (:func:`_why_not_refilled`)."""
    streamed: frozenset[str] = frozenset()
    """The tensors its rows on chip read once, loaded with the cache-streaming hint
    (:mod:`~polyfuse.emit_cpp.streaming`)."""
    replanned: str = ""
    """Where it was planned with an option of the program's turned off (its shared memory would not fit a block
    otherwise): which, and why; printed in the plan and above the kernel in its source, whose options line is the
    program's."""

    def describe(self) -> str:
        return "\n".join(_describe_kernel(self))


@dataclass(frozen=True)
class ProgramPlan:
    """The plan of every kernel of a program, the inputs split before them, and what it was planned for;
    ``fast_exp``: f32 ``exp`` may be the approximate one (the options ask for it and every output is a 16-bit
    float, whose rounding its error stays below)."""

    device: DeviceSpec
    options: CodegenOptions
    presplit: Mapping[str, tuple[Tensor, Tensor]]
    kernels: tuple[KernelPlan, ...]
    fast_exp: bool = False

    def __str__(self) -> str:
        lines = [f"device: {self.device.describe()}", f"options: {self.options.describe()}",
                 f"f32 exp: {'approximate (16-bit outputs)' if self.fast_exp else 'accurate'}"]
        for name, (hi, lo) in self.presplit.items():
            lines.append(f"split kernel: {name} into bf16 {hi.name} + {lo.name} before the kernels")
        for k in self.kernels:
            lines.append("")
            lines += _describe_kernel(k)
        return "\n".join(lines) + "\n"


def gpu_plan(program: TileProgram, target: Target) -> tuple[GpuProgram, ProgramPlan]:
    """The GPU stages of ``program`` (:func:`~polyfuse.tiling.gpu.lower_for_gpu`) and the plan of its kernels
    for ``target``'s device and options."""
    if target.device is None:
        raise InternalError(f"a GPU plan needs a device; target {target.backend!r} has none")
    gpu = lower_for_gpu(program)
    tensor_cores = target.device.mma_sync and target.options.tensor_cores
    return gpu, plan_program(gpu, entry_name(program.name), target.device, target.options, tensor_cores)


def plan_program(gpu: GpuProgram, entry: str, device: DeviceSpec, options: CodegenOptions,
                 tensor_cores: bool) -> ProgramPlan:
    """The plan of every kernel of ``gpu`` (kernels named ``{entry}_k{n}``) for ``device``."""
    tensors = {t.name: t for t in gpu.program.tensors}
    shared_names = frozenset(n for nest in gpu.nests for n in nest.shared)
    ranges = {r.name: r for r in gpu.program.ranges}

    wgmma = tensor_cores and device.wgmma and options.warpgroup_products

    def threads_of(nest: GridNest, options: CodegenOptions) -> int:
        if nest.kind == MAP:
            return options.map_threads
        warps = nest.warps or options.warps or onchip.warps_for(onchip.body_stores(nest.body), device, options)
        if warps is None:
            default = Frame({}, device.default_warps * device.warp_size, device.warp_size, tensor_cores, options,
                            tensors, shared_names, {}, tuple(lp.var for lp in nest.chain if unit_loop(lp)), wgmma,
                            registers_per_sm=device.registers_per_sm, ranges=ranges)
            warps = next((w for lp in walk_tile_stmts(nest.body) if isinstance(lp, Loop)
                          if (w := fragments.warps_for(default, lp)) is not None), device.default_warps)
        return warps * device.warp_size

    def frame_of(nest: GridNest, options: CodegenOptions = options) -> Frame:
        grid = {lp.var.name: int(lp.extent.value) for lp in nest.chain if isinstance(lp.extent, Const)}
        return Frame({}, threads_of(nest, options), device.warp_size, tensor_cores, options, tensors, shared_names,
                     {}, tuple(lp.var for lp in nest.chain if unit_loop(lp)), wgmma,
                     registers_per_sm=device.registers_per_sm, ranges=ranges, grid=grid,
                     tma=wgmma and device.tma and options.tma)

    split = presplit.plan(gpu.nests, frame_of)
    params = [p.name for p in gpu.program.params]
    kernels: list[KernelPlan] = []
    at_top = dataclasses.replace(options, prefetch=False)
    in_turn = dataclasses.replace(options, overlap_products=False)
    for k, nest in enumerate(gpu.nests):
        frame = dataclasses.replace(frame_of(nest), presplit=split)
        if not nest.combines:
            plan = _plan_kernel(nest, f"{entry}_k{k}", frame, device)
            if plan.peak > device.shared_per_block and any(lp.fragments is not None and lp.fragments.deferred
                                                           for lp in plan.loops.values()):
                # A product issued one iteration late keeps a third stage of operand tiles: not where they do not
                # fit (the products then issued in turn).
                plan = dataclasses.replace(
                    _plan_kernel(nest, f"{entry}_k{k}", dataclasses.replace(frame_of(nest, in_turn), presplit=split),
                                 device),
                    replanned=f"overlap_products=off (three stages of operand tiles, for a product overlapping "
                              f"the next iteration, would take {plan.peak} bytes of shared memory)")
            if plan.peak > device.shared_per_block and options.prefetch:
                # Loops in warp fragments copying each iteration's tiles at its top: one buffer per tile, not two
                # (and no producer warpgroup: the threads planned again).  MLA decode's key and value tiles where
                # the values are not panels of the keys (share_tiles off).
                peak = plan.peak
                plan = dataclasses.replace(
                    _plan_kernel(nest, f"{entry}_k{k}", dataclasses.replace(frame_of(nest, at_top), presplit=split),
                                 device),
                    replanned=f"prefetch=off (operand tiles copied a stage ahead would take {peak} bytes of shared "
                              f"memory; each iteration's are copied at its top, with no producer warpgroup)")
            kernels.append(_streaming(_refuse_oversized(plan, device), params, options))
            continue
        partial = kernels[-1]
        folded = _fold(partial, nest, f"{entry}_k{k}", dict(tensors), shared_names, frame, device)
        if isinstance(folded, KernelPlan):
            kernels[-1] = folded
        else:
            kernels.append(dataclasses.replace(
                _streaming(_refuse_oversized(_plan_kernel(nest, f"{entry}_k{k}", frame, device), device), params,
                           options),
                unfolded=folded))
    outputs = gpu.program.outputs
    fast_exp = options.fast_exp and bool(outputs) and all(t.dtype.is_float and t.dtype.bits == 16 for t in outputs)
    return ProgramPlan(device, options, split, tuple(kernels), fast_exp)


def _streaming(plan: KernelPlan, params: list[str], options: CodegenOptions) -> KernelPlan:
    """``plan`` with the tensors its kernel reads once (:func:`~polyfuse.emit_cpp.streaming.streamed`)."""
    if not options.streaming_loads:
        return plan
    return dataclasses.replace(plan, streamed=streaming.streamed(plan.nest.chain, params, plan.rows))


def _fold(partial: KernelPlan, combine: GridNest, name: str, tensors: dict[str, Tensor], shared: frozenset[str],
          frame: Frame, device: DeviceSpec) -> KernelPlan | str:
    """``partial`` running the split-k ``combine`` after its body (:mod:`~polyfuse.emit_cpp.fold`), or why not."""
    if not frame.options.fold_combine:
        return "CodegenOptions.fold_combine is off"
    if partial.fold is not None:
        return f"kernel {partial.name} already runs a folded combine"
    fold = fold_.plan_fold(partial.nest, combine, partial.name, tensors, shared)
    if isinstance(fold, str):
        return fold
    refused = fold_.refuse_for_plan(partial)
    if refused:
        return refused
    serial = fold_.serial_blocks(fold)
    if serial is None or serial > frame.options.fold_serial:
        return (f"the last block of a row would run {serial if serial is not None else 'a size-dependent number of'} "
                f"blocks of the combine one after another (CodegenOptions.fold_serial is "
                f"{frame.options.fold_serial}): their own launch runs them in parallel")
    try:
        plan = _refuse_oversized(_plan_kernel(combine, name, dataclasses.replace(frame, threads=partial.threads),
                                              device), device)
    except UnsupportedPattern as err:
        return f"the combine does not fit a block of the partial kernel's {partial.threads} threads: {err}"
    peak = max(partial.peak, plan.peak)
    fold = _staged(fold, partial, combine, plan, tensors, shared, frame, device, peak)
    if fold.staged:
        peak = max(peak, fold.staged[-1].end)
    resident_blocks = min(partial.blocks_per_sm or device.blocks_per_sm(peak), device.blocks_per_sm(peak))
    asked = partial.min_blocks
    if asked is not None and resident_blocks < asked:
        asked = resident_blocks if resident_blocks > 1 else None
    return dataclasses.replace(partial, peak=peak, blocks_per_sm=resident_blocks, min_blocks=asked, fold=fold,
                               folded=plan)


def _staged(fold: fold_.CombineFold, partial: KernelPlan, combine: GridNest, plan: KernelPlan,
            tensors: dict[str, Tensor], shared: frozenset[str], frame: Frame, device: DeviceSpec,
            peak: int) -> fold_.CombineFold:
    """``fold`` with the row's partials copied into shared memory after the combine's own (:func:`fold_.stage`),
    where the options ask for it and the copies let as many blocks of the kernel run on an SM; else with why not."""
    if not frame.options.stage_partials:
        return dataclasses.replace(fold, unstaged="CodegenOptions.stage_partials is off")
    staged = fold_.stage(fold, partial.nest, combine, tensors, shared, plan.peak)
    if isinstance(staged, str):
        return dataclasses.replace(fold, unstaged=staged)
    needed = staged[-1].end
    if needed > device.shared_per_block:
        return dataclasses.replace(fold, unstaged=(
            f"copied, the partials would take {needed} bytes of shared memory, more than a block may have"))
    if device.resident_blocks(max(peak, needed), partial.threads) < device.resident_blocks(peak, partial.threads):
        return dataclasses.replace(fold, unstaged=(
            f"copied, the partials would take the kernel's shared memory to {needed} bytes, and fewer of its blocks "
            f"would run on an SM"))
    return dataclasses.replace(fold, staged=staged, copy_async=device.cp_async)


def _plan_kernel(nest: GridNest, name: str, frame: Frame, device: DeviceSpec) -> KernelPlan:
    """A kernel's plan; planned again without tiles copied ahead where their second halves would let fewer of
    its blocks run at once (:func:`_why_not_ahead`), then without tiles refilled where their buffers would
    (:func:`_why_not_refilled`), and without kept tiles where they would take more shared memory than a block
    may have (the caller refuses one that still does: :func:`_refuse_oversized`)."""
    if nest.kind == MAP:
        return KernelPlan(name, nest, frame.threads, frame.warp)

    def planned(**off: bool) -> KernelPlan:
        options = dataclasses.replace(frame.options, **off)
        return _Planner(nest, name, dataclasses.replace(frame, options=options), True, device).run()

    plan = _Planner(nest, name, frame, True, device).run()
    not_ahead = _why_not_ahead(plan, nest, device)
    if not_ahead:
        plan = dataclasses.replace(planned(stream_ahead=False), not_ahead=not_ahead)
    plain = functools.cache(lambda: planned(stream_ahead=False, refill_tiles=False))
    not_refilled = _why_not_refilled(plan, nest, device, plain)
    if not_refilled:
        plan = dataclasses.replace(plain(), not_ahead=not_ahead, not_refilled=not_refilled)
    if plan.peak > device.shared_per_block:
        plan = _Planner(nest, name, frame, False, device).run()
    if plan.peak > device.shared_per_block:
        return plan  # (refused by the caller, unless planned otherwise)
    resident_blocks = device.blocks_per_sm(plan.peak)
    min_blocks = frame.options.min_blocks
    # A loop in warp fragments holds its tiles in registers: no more blocks than those fit (asking
    # __launch_bounds__ for more would make ptxas spill them).
    held = max((lp.fragments.registers for lp in plan.loops.values() if lp.fragments is not None), default=0)
    if held:
        resident_blocks = min(resident_blocks, max(1, device.registers_per_sm // (frame.threads * held)))
    if isinstance(plan.rows, onchip.RowsOnChip) and plan.rows.blocks_per_sm == 1:
        # the row tiles take the registers of the one block per SM the plan budgeted for (onchip.plan)
        resident_blocks = 1
    asked = resident_blocks if min_blocks and 1 < resident_blocks <= min_blocks else None
    if any(lp.fragments is not None and lp.fragments.producer for lp in plan.loops.values()):
        paired = _paired(nest, name, frame, device, plan)
        if paired is not None:
            return paired
        # warpgroups that trade registers (setmaxnreg): ptxas gives the computing code the registers they take
        # where the launch bounds name the blocks per SM the trade was computed for
        resident_blocks, asked = 1, 1
    return dataclasses.replace(plan, min_blocks=asked, blocks_per_sm=resident_blocks, heavy_first=_heavy_first(nest))


PAIRED_BLOCKS = 2
"""Blocks per SM of a kernel with a producer warpgroup where two fit (:func:`_paired`)."""


def _paired(nest: GridNest, name: str, frame: Frame, device: DeviceSpec, plan: KernelPlan) -> KernelPlan | None:
    """``plan``'s kernel planned for two blocks per SM, where its loop has a producer warpgroup, two of its blocks
    fit an SM (shared memory, threads) and each thread's tiles fit the registers two blocks leave it; else None.

    One block of a producer warpgroup and its computing warpgroups waits, on its own SM, wherever its warps all
    wait: on its first copies, on its epilogue's stores, on the softmax between its products.  Two blocks on one
    SM fill each other's waits: each block's warps trade the half of the register file its launch took
    (``Frame.blocks``: 232 registers for each computing thread of a 64-row tile beside its producer's 24), and the
    loop's tiles (:attr:`~polyfuse.emit_cpp.fragments.FragmentLoop.tiles`, plus the overhead of addresses and
    fragments) must fit what a computing thread gets, so that ptxas need not spill them."""
    if frame.blocks != 1:
        return None
    pair = dataclasses.replace(frame, blocks=PAIRED_BLOCKS)
    if device.resident_blocks(plan.peak, frame.threads) < PAIRED_BLOCKS:
        return None
    try:
        paired = _plan_kernel(nest, name, pair, device)
    except UnsupportedPattern:
        return None
    loops = [lp.fragments for lp in paired.loops.values() if lp.fragments is not None]
    if (device.resident_blocks(paired.peak, frame.threads) < PAIRED_BLOCKS
            or any(f.tiles + fragments.REGISTER_OVERHEAD > f.computing_registers for f in loops)):
        return None
    return dataclasses.replace(paired, min_blocks=PAIRED_BLOCKS, blocks_per_sm=PAIRED_BLOCKS)


def _refuse_oversized(plan: KernelPlan, device: DeviceSpec) -> KernelPlan:
    """``plan``, or UnsupportedPattern where it needs more shared memory than a block may have."""
    if plan.peak <= device.shared_per_block:
        return plan
    largest = max(plan.stmts.values(), key=lambda p: p.at + p.scratch, default=None)
    where = (f"; the most at block {largest.block!r} ({largest.scratch} bytes of its own after "
             f"{largest.at} bytes of temporaries and loop buffers)") if largest is not None else ""
    raise UnsupportedPattern(f"kernel {plan.name} needs {plan.peak} bytes of shared memory (tiles and their "
                             f"temporaries{where}); a block may use {device.shared_per_block} on {device.arch}. "
                             f"Use smaller tiles in the schedule")


def _why_not_ahead(plan: KernelPlan, nest: GridNest, device: DeviceSpec) -> str:
    """Why the tiles ``plan`` copies one iteration ahead leave no room for all of its blocks at once (one wave of
    resident blocks); empty where they do, or where it copies none ahead.

    Copying ahead overlaps a block's next copies with its computing, but the second halves of the tiles take
    shared memory: where the grid has more blocks than the SMs hold with them, fewer blocks stream at once, which
    costs more than the overlap gains (decode attention at 32768 keys and in batches measured slower; at 1024 and
    4096 keys, a grid of one wave, faster: benchmarks/results has both).  A grid whose size is a parameter counts
    as too large."""
    if not any(lp.streams is not None and lp.streams.ahead for lp in plan.loops.values()):
        return ""
    blocks = _grid_blocks(nest)
    if blocks is None:
        return "its grid's size is a parameter (copies ahead only where all blocks fit at once)"
    resident = device.blocks_per_sm(plan.peak)
    if blocks <= device.sms * resident:
        return ""
    return (f"with their second halves, its {plan.peak} bytes of shared memory would let {resident} blocks per SM "
            f"run at once, too few for its {blocks} blocks on {device.sms} SMs")


def _why_not_refilled(plan: KernelPlan, nest: GridNest, device: DeviceSpec,
                      plain: Callable[[], KernelPlan]) -> str:
    """Why the tiles ``plan`` refills after their last readers (one buffer per tile: more shared memory than the
    tiles of one statement at a time) would let fewer of its blocks run at once than ``plain`` (copied when
    each iteration needs them) where not all of them fit at once; empty where they do not, or where it refills
    none."""
    if not any(lp.streams is not None and lp.streams.refill for lp in plan.loops.values()):
        return ""
    resident, blocks = device.blocks_per_sm(plan.peak), _grid_blocks(nest)
    if blocks is not None and blocks <= device.sms * resident:
        return ""
    base = device.blocks_per_sm(plain().peak)
    if resident >= base:
        return ""
    return (f"with one buffer per tile, its {plan.peak} bytes of shared memory would let {resident} blocks per SM "
            f"run at once ({base} without), and not all its blocks")


def _grid_blocks(nest: GridNest) -> int | None:
    """The number of blocks of ``nest``'s grid; None where its size is a parameter."""
    if not all(isinstance(lp.extent, Const) for lp in nest.chain):
        return None
    return math.prod(int(lp.extent.value) for lp in nest.chain)


def _heavy_first(nest: GridNest) -> str | None:
    """The grid loop along which the blocks' work grows: one that the extent of a loop of the body depends on
    and that is longer at the grid loop's last value than at its first (causal attention's key loop, cut
    where the mask hides the rest: ``i_0 // 2 + 1`` tiles for query tile ``i_0``), with the other grid loops
    at 0.  None where there is none or the extents are not constants at those points."""
    chain = {lp.var.name: lp for lp in nest.chain if not unit_loop(lp)}
    for body_loop in (x for x in walk_tile_stmts(nest.body) if isinstance(x, Loop)):
        used = {v.name for v in walk_tile_expr(body_loop.extent) if isinstance(v, Var)} & set(chain)
        for name in sorted(used):
            last = chain[name].extent
            if not isinstance(last, Const):
                continue
            at = {n: Const(0, lp.var.dtype) for n, lp in chain.items()}
            first = simplify(substitute(body_loop.extent, at))
            at[name] = Const(int(last.value) - 1, chain[name].var.dtype)
            final = simplify(substitute(body_loop.extent, at))
            if isinstance(first, Const) and isinstance(final, Const) and final.value > first.value:
                return name
    return None


class _Planner:
    """One walk over a block kernel's body, in the order the printer emits it, recording every decision and
    the shared memory each takes (a stack: a statement's scratch is freed after it, a loop's buffers after
    the loop)."""

    def __init__(self, nest: GridNest, name: str, frame: Frame, keep_tiles: bool, device: DeviceSpec):
        self.nest, self.name, self.frame, self.keep_tiles, self.device = nest, name, frame, keep_tiles, device
        self.scratch = self.peak = 0
        self.shared_names = set(frame.shared_names)
        self.loops: dict[int, LoopPlan] = {}
        self.seqs: dict[int, tuple[Stmt | rows.RowGroup, ...]] = {}
        self.stmts: dict[int, StmtPlan] = {}
        self.accumulators: dict[str, registers.Accumulator] = {}
        self.streams: stream.StreamPlan | None = None
        """The tiles the loop being planned keeps (only a loop of statements keeps any: no nesting)."""
        self.counter = 0
        self.block = ""
        """The block of the statement being planned (whose dots' operands a loop may keep)."""
        self.units: dict[int, tuple[Loop, tuple[TileStore, ...]]] = {}
        """The loops in warp fragments, with their epilogues (:func:`~polyfuse.emit_cpp.fragments.units`)."""
        self.groups = groups.plan(nest.body, frame.threads, device)
        """The loops run by warp groups (:mod:`~polyfuse.emit_cpp.groups`), by identity."""

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"pf_{hint}{self.counter}"

    def take(self, nbytes: int, align: int = 16) -> int:
        """The offset of the next ``nbytes`` of scratch, ``align``-byte aligned (taken)."""
        offset = -(-self.scratch // align) * align
        self.scratch = offset + align16(nbytes)
        self.peak = max(self.peak, self.scratch)
        return offset

    def here(self, sizes: Mapping[str, int]) -> Frame:
        return dataclasses.replace(self.frame, sizes=dict(sizes), shared_names=frozenset(self.shared_names))

    def run(self) -> KernelPlan:
        shared = []
        self.units = fragments.units(self.frame, self.nest.body)
        in_registers = set(fragments.registers_only(self.frame, self.nest.body))
        stores = onchip.body_stores(self.nest.body)
        rows_on_chip = self.rows_on_chip(stores, lambda nbytes: 0)
        if isinstance(rows_on_chip, onchip.RowsOnChip):
            in_registers |= rows_on_chip.kept
        per_group = groups.copies(self.nest.body, self.groups)
        for t in self.nest.shared:
            if t in in_registers:
                continue  # a tile of a loop in warp fragments, or a row on chip, that only registers hold
            tensor = self.frame.tensors[t]
            size = static_numel(tensor)
            if size is None:
                raise UnsupportedPattern(f"temporary {t!r} lives in shared memory per block but its shape "
                                         f"{list(map(str, tensor.shape))} is not static; give it a constant shape")
            dims = [int(d.value) for d in tensor.shape]
            inner = max((d for d, n in enumerate(dims) if n > 1), default=0)
            ctype = STORAGE_TYPES[tensor.dtype.name]
            padded = pitch = None
            if inner > 0 and dims[inner] % 32 == 0 and size > dims[inner]:
                # Rows 8 words apart in the banks: the row reductions and the tensor-core epilogues that touch
                # several rows at once hit different banks.  (Trailing axes of size 1 are indexed by 0, so the
                # last axis longer than 1 gets the padding.)
                padded, pitch = inner, dims[inner] + 8
                size = size // dims[inner] * pitch
            g = per_group.get(t)
            nbytes = size * SIZEOF[ctype]
            shared.append(SharedTemporary(t, ctype, nbytes, self.scratch, padded, pitch, g))
            self.take(nbytes if g is None else groups.copy_bytes(nbytes, g))
        if isinstance(rows_on_chip, onchip.RowsOnChip):
            rows_on_chip = self.rows_on_chip(stores, self.take)
        else:
            self.stmt(self.nest.body)
        return KernelPlan(self.name, self.nest, self.frame.threads, self.frame.warp, tuple(shared), self.peak,
                          keeps_tiles=self.keep_tiles, loops=self.loops, seqs=self.seqs, stmts=self.stmts,
                          rows=rows_on_chip)

    def rows_on_chip(self, stores: list[TileStore] | None, take: Callable[[int], int]) -> onchip.RowsOnChip | str:
        f = self.frame
        return onchip.plan(stores, f.threads, f.warp, frozenset(self.nest.shared), self.device, f.options, take,
                           f.ranges)

    # ------------------------------------------------------------ statements
    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            frame = self.here({})
            after = {id(x) for unit in self.units.values() for x in unit[1]}  # (planned with their loop)
            parts = tuple(rows.split(frame, rows.reorder(frame, [x for x in s.stmts if id(x) not in after])))
            self.seqs[id(s)] = parts
            for part in parts:
                if not isinstance(part, rows.RowGroup):
                    self.stmt(part)
        elif isinstance(s, Loop):
            self.loop(s)
        elif isinstance(s, TileStore):
            self.store(s)
        else:
            raise InternalError(f"GPU planner: unknown statement {type(s).__name__}")

    def loop(self, s: Loop) -> None:
        frame = self.here({})
        if id(s) in self.groups:
            self.group_loop(s, self.groups[id(s)])
            return
        if id(s) in self.units:
            self.fragment_loop(frame, s, self.units[id(s)][1])
            return
        accumulators = registers.plan(frame, s, self.fresh) if frame.tensor_cores else {}
        outer, self.accumulators = self.accumulators, accumulators
        kept_at = self.scratch
        kept = resident.plan(frame, s, {acc.store.tensor.name for acc in accumulators.values()}, self.fresh)
        offsets = {}
        for r in kept:
            offsets[r.name] = self.scratch
            self.take(r.nbytes)
        added = {r.tensor for r in kept} - self.shared_names
        self.shared_names |= added
        streams = None
        if frame.tensor_cores and self.streams is None and self.keep_tiles:
            streams = stream.plan(self.here({}), s, self.fresh, frame.options.stream_ahead,
                                  frame.options.refill_tiles)
        for tile in streams.kept if streams is not None else ():
            offsets[tile.buffer] = self.scratch
            self.take(tile.nbytes)
        staggered = stagger.plan(s, frozenset(lp.var.name for lp in self.nest.chain), self.device, frame.options)
        if streams is not None and staggered is not None:
            streams = dataclasses.replace(streams, stagger=staggered)
        outer_streams, self.streams = self.streams, streams
        first = len(self.stmts)
        self.stmt(s.body)
        self.streams = outer_streams
        self.shared_names -= added
        self.scratch = kept_at
        self.accumulators = outer
        used = {p.block for p in list(self.stmts.values())[first:] if p.in_registers}
        stored = tuple(b for b in accumulators if b in used)
        self.loops[id(s)] = LoopPlan(s.var.name, accumulators, stored, tuple(kept), streams, offsets,
                                     stagger=staggered)

    def group_loop(self, s: Loop, g: groups.WarpGroups) -> None:
        """A loop run by warp groups: its body planned for one group's threads (each thread's share of the
        register file unchanged: ``blocks`` counts the groups), the shared memory the body takes once per
        group."""
        block = self.frame
        self.frame = dataclasses.replace(block, threads=g.threads,
                                         blocks=block.blocks * (block.threads // g.threads))
        mark, peak = self.scratch, self.peak
        self.peak = mark
        self.stmt(s.body)
        stride = -(-(self.peak - mark) // groups.ALIGN) * groups.ALIGN
        self.frame, self.scratch, self.peak = block, mark, max(peak, mark + g.groups * stride)
        self.loops[id(s)] = LoopPlan(s.var.name, {}, (), (), None, group=dataclasses.replace(g, stride=stride))

    def fragment_loop(self, frame: Frame, s: Loop, after: tuple[TileStore, ...]) -> None:
        """A loop in warp fragments with its epilogue ``after``: its kept tiles and its products' staging
        buffers, for the whole loop.  On a device with warpgroup products, planned first with operands staged
        swizzled; where a product cannot be a warpgroup product, planned again with ``mma.sync``'s layouts."""
        mark, peak = self.scratch, self.peak
        for swizzle in (True, False) if frame.wgmma else (False,):
            here = dataclasses.replace(frame, swizzle=swizzle)
            align = SWIZZLE_ALIGN if swizzle else 16
            streams = stream.plan(here, s, self.fresh) if self.keep_tiles else None
            offsets: dict[str, int] = {}
            for tile in streams.kept if streams is not None else ():
                offsets[tile.buffer] = self.take(tile.nbytes, align)
            self.streams = streams

            def operand(block: str, at: Frame, op: Staged, low: DType) -> OperandPlan:
                self.block = block
                return self.operand(at, op, low)

            plan = fragments.plan(here, s, after, fragments.in_memory(here, self.nest.body, s, after), operand,
                                  self.fresh)
            self.streams = None
            for name, nbytes in plan.buffers:
                offsets[name] = self.take(nbytes, align)
            if plan.barriers is not None:
                offsets[plan.barriers] = self.take(plan.barrier_bytes)
            self.scratch = mark
            if plan.warpgroups or not swizzle:
                break
            self.peak = peak
        self.loops[id(s)] = LoopPlan(s.var.name, {}, (), (), streams, offsets, plan)

    def store(self, s: TileStore) -> None:
        frame = self.here(axis_sizes(s))
        mark = self.scratch
        self.block = s.block
        plan = dataclasses.replace(self.in_place(frame, s) or self.elementwise(frame, s), at=mark)
        self.take(plan.scratch)
        self.scratch = mark
        self.stmts[id(s)] = plan

    def elementwise(self, frame: Frame, s: TileStore, done: tuple[Expr, ...] = (),
                    dots: Mapping[Expr, DotPlan] | None = None) -> StmtPlan:
        """A statement whose reductions and dots get arrays of their own (after ``done``, already made)."""
        order = list(done)
        hoist = _hoisting(None)
        for e in [s.value] + ([s.mask] if s.mask is not None else []):
            order += materializations(e, order, hoist)
        if any(isinstance(n, TileLoad) and n.tensor.name == s.tensor.name and n.index != s.index
               for n in walk_unmaterialized(s.value, set(order))):
            order.append(s.value)
        plans = dict(dots or {})
        scratch = 0
        for e in order:
            nbytes, dot = self.materialized(frame, e)
            scratch += -(-nbytes // 16) * 16
            if dot is not None:
                plans[e] = dot
        return StmtPlan(s.block, False, None, None, tuple(order), plans, (), scratch)

    def materialized(self, frame: Frame, e: Expr) -> tuple[int, DotPlan | None]:
        """Shared memory of ``e``'s array and of what computing it takes, and its dot plan if a dot."""
        axes = axes_of(e)
        size = math.prod(frame.sizes[a] for a in axes)
        ct = COMPUTE_TYPES[e.dtype.name]
        if isinstance(e, Dot):
            dot = self.dot(frame, e, axes, split_k=True)
            rows_ = size // frame.sizes[axes[-1]] if dot.pitch else 1
            array = (rows_ * dot.pitch if dot.pitch else size) * SIZEOF[ct]
            return align16(array) + self.dot_scratch(frame, e, dot), dot
        if isinstance(e, Reduce):
            ctype = "int" if e.op == "or" else ct  # (an "or" accumulates in an int)
            return align16(size * SIZEOF[ct]) + _block_reduce_scratch(frame, frame.sizes[e.axis], size, ctype), None
        return align16(size * SIZEOF[ct]), None

    def dot_scratch(self, frame: Frame, e: Dot, dot: DotPlan) -> int:
        """Shared memory the computation of dot ``e`` takes (its result array aside)."""
        if dot.instruction == MMA_SYNC:
            assert dot.a is not None and dot.b is not None
            return align16(dot.a.own_bytes) + align16(dot.b.own_bytes) + align16(dot.kpart_bytes(frame.warp))
        if dot.instruction == BLOCK_REDUCE:
            size = math.prod(frame.sizes[a] for a in axes_of(e))
            ct = COMPUTE_TYPES[e.dtype.name]
            return align16(size * SIZEOF[ct]) + _block_reduce_scratch(frame, frame.sizes[e.axis], size, ct)
        if dot.instruction == FMA:
            size = 8 if COMPUTE_TYPES[e.dtype.name] == "double" else 4
            return align16(dot.m * dot.k * size) + align16(dot.k * dot.n * size)
        return 0

    def dot(self, frame: Frame, e: Dot, axes: tuple[str, ...], split_k: bool, in_place: bool = False) -> DotPlan:
        k = e.axis
        m_axes = tuple(x for x in axes_of(e.a) if x != k)
        n_axes = tuple(x for x in axes_of(e.b) if x != k and x not in m_axes)
        batch = tuple(x for x in axes_of(e.b) if x != k and x in m_axes)
        mm = math.prod(frame.sizes[x] for x in m_axes)
        nn = math.prod(frame.sizes[x] for x in n_axes)
        kk = frame.sizes[k]
        low = mma_type(frame, e)
        if low is None:
            instruction = PER_OUTPUT if batch else BLOCK_REDUCE if few_outputs(frame, e) else FMA
            return DotPlan(instruction, mm, nn, kk)
        a, b = staging(frame, e)
        ops = (self.operand(frame, a, low), self.operand(frame, b, low))
        mtiles, groups, per = warp_tiling(frame, a.rows_pad, b.rows_pad)
        kgroups = k_groups(frame, mtiles, b.rows_pad // 8, a.kp // 16) if split_k else 1
        if kgroups > 1:
            per = frame.options.split_k_tiles
            groups = b.rows_pad // 8 // per
        ntiles = b.rows_pad // 8
        split = ops[0].staged.split or ops[1].staged.split
        pair = 2 if frame.options.paired_b and per % 2 == 0 and ntiles % 2 == 0 and split else 1
        pitch = None if in_place else dot_pitch(frame, e, axes)
        return DotPlan(MMA_SYNC, mm, nn, kk, low, ops[0], ops[1], mtiles, groups, per, kgroups, pair, pitch, M16N8)

    def operand(self, frame: Frame, op: Staged, low: DType) -> OperandPlan:
        """Where a tensor-core operand comes from: its loop's kept tiles, cp.async copies (of the operand or
        of the parts of a tensor split before the kernels), 128-bit copies, or conversion."""
        if self.streams is not None:
            found = self.streams.source(self.block, op)
            if found is not None:
                return found
        halves = presplit_parts(frame, op)
        if halves is not None:
            parts = [Staged(h, op.rows, op.rows_pad, op.rows_axes, op.trans, op.stride, False, op.size, op.k, op.kk,
                            op.kp) for h in halves]
            if all(raw_staging(part, low) is not None for part in parts):
                return OperandPlan(op, "cp.async", parts=((parts[0], 0), (parts[1], op.size)))
        raw = not op.split and raw_staging(op, low) is not None
        if raw and frame.options.async_staging:
            return OperandPlan(op, "cp.async", parts=((op, 0),))
        return OperandPlan(op, "raw" if raw else "converted")

    def in_place(self, frame: Frame, s: TileStore) -> StmtPlan | None:
        """The plan of ``s`` computed in the epilogue of its tensor-core dot, if it can be (see
        :meth:`~polyfuse.emit_cpp.cuda.CudaEmitter.dot_in_place`); a statement that cannot after all, its
        value's operands already materialized, is planned element by element after them."""
        dots = [n for n in walk_tile_expr(s.value) if isinstance(n, Dot)]
        acc = self.accumulators.get(s.block)
        in_registers = acc is not None and acc.store == s
        shared = s.tensor.name in self.shared_names
        axes = tuple(i.axis for i in s.index if isinstance(i, Slice))
        if (len(dots) != 1 or s.mask is not None or s.reducer is not None
                or not (shared or in_registers) or set(axes) != set(axes_of(dots[0]))
                or mma_type(frame, dots[0]) is None or not _elementwise_path(s.value, dots[0])):
            return None
        e = dots[0]
        own = {n for n in walk_tile_expr(s.value) if isinstance(n, TileLoad) and n.tensor.name == s.tensor.name}
        n_axes = staging(frame, e)[1].rows_axes
        if any(isinstance(n, TileLoad) and n.tensor.name == s.tensor.name and n.index != s.index
               for n in walk_unmaterialized(s.value, {e})) or any(
                isinstance(n, TileLoad) and n.tensor.name == s.tensor.name and n.index != s.index
                for n in walk_tile_expr(e.acc)):
            return None
        first = materializations(s.value, {e}, _hoisting((e, own, n_axes)))
        if in_registers and any(n in own for m in first for n in walk_tile_expr(m)):
            in_registers = False  # a hoisted operand reads the accumulator: it must stay in memory
            if not shared:
                return self.elementwise(frame, s, tuple(first), {})
        scratch = 0
        plans: dict[Expr, DotPlan] = {}
        for m in first:
            nbytes, dot = self.materialized(frame, m)
            scratch += nbytes
            if dot is not None:
                plans[m] = dot
        dot = self.dot(frame, e, axes, split_k=not in_registers, in_place=True)
        scratch += self.dot_scratch(frame, e, dot)
        values = tuple(_row_values(s.value, e, own, n_axes))
        register = self.accumulators[s.block].name if in_registers else None
        return StmtPlan(s.block, True, register, dot, tuple(first), plans, values, scratch)


def _block_reduce_scratch(frame: Frame, length: int, outputs: int, ctype: str) -> int:
    """Shared memory of a block reduction of ``outputs`` outputs over ``length`` elements accumulated in ``ctype``:
    one partial per warp, when an output needs more lanes than a warp has."""
    if reduce_lanes(frame.threads, outputs, length) <= frame.warp:
        return 0
    return align16(frame.warps * SIZEOF[ctype])


def _hoisting(per_row: tuple[Expr, set, tuple[str, ...]] | None) -> Callable[[Expr], bool]:
    """Whether a broadcast's operand is worth an array of its own on a GPU: only costly ones (a pass through
    shared memory and a barrier).  A math function or a division is computed once per element of its own
    axes; index arithmetic, comparisons and selects are cheaper to recompute than to share, and so is integer
    arithmetic of loop variables alone.  In a dot's epilogue (``per_row``), a value the same along the dot's
    columns is computed once per fragment row instead (:func:`_row_values`)."""
    def hoist(e: Expr) -> bool:
        if per_row is not None and _per_row(e, *per_row):
            return False
        return worth_hoisting(e) and any(
            (isinstance(n, Call) and n.fn not in CHEAP_CALLS)
            or (isinstance(n, BinOp) and n.op in ("/", "//", "%", "pow") and (n.dtype.is_float or axes_of(n)))
            for n in walk_tile_expr(e))
    return hoist


def _row_values(value: Expr, dot: Expr, own: set, n_axes: tuple[str, ...]) -> list[Expr]:
    """The largest parts of a dot epilogue's ``value`` that are the same along the dot's columns
    (``n_axes``): the repair factors and statistics of a rolling update, read once per row of the
    thread's fragment instead of once per element.  Not the dot, the accumulator's own elements,
    reductions, or integer division (whose divisor a select may guard)."""
    found: list[Expr] = []

    def visit(x: Expr) -> None:
        if isinstance(x, (Var, Const, Reduce)) or x == dot or x in own or x in found:
            return
        if _per_row(x, dot, own, n_axes):
            if any(isinstance(n, (TileLoad, Var)) for n in walk_tile_expr(x)):
                found.append(x)  # (a constant stays in the text: the compiler folds it)
            return
        for c in tile_children(x):
            visit(c)

    visit(value)
    return found


def _per_row(x: Expr, dot: Expr, own: set, n_axes: tuple[str, ...]) -> bool:
    """Whether a dot epilogue computes ``x`` once per fragment row: it is the same along the dot's
    columns and holds no dot, accumulator element, reduction or integer division."""
    if any(depends_on(x, a) for a in n_axes):
        return False
    for n in walk_tile_expr(x):
        if n == dot or n in own or isinstance(n, (Reduce, Dot)):
            return False
        if isinstance(n, BinOp) and n.op in ("//", "%", "/") and n.dtype.is_int:
            return False
    return True


def _elementwise_path(root: Expr, target: Expr) -> bool:
    """Whether ``target`` is reached from ``root`` through elementwise nodes only (no reduction)."""
    if root is target or root == target:
        return True
    if isinstance(root, (Reduce, Dot)):
        return False
    return any(_elementwise_path(c, target) for c in tile_children(root))


def _describe_kernel(k: KernelPlan) -> list[str]:
    nest = k.nest
    grid = " x ".join(f"{lp.var.name} < {lp.extent}" for lp in nest.chain) or "one block"
    if nest.kind == MAP:
        return [f"kernel {k.name} (map): one element per thread, {k.threads} threads per block"]
    lines = [f"kernel {k.name} (block): grid {grid}; {k.threads} threads ({k.threads // k.warp} warps of {k.warp})"]
    if k.heavy_first is not None:
        lines.append(f"  blocks: {k.heavy_first} decoded slowest, from its last value (the most work first)")
    bounds = f", __launch_bounds__ asks for {k.min_blocks} blocks per SM" if k.min_blocks else ""
    held = "" if not any(lp.fragments for lp in k.loops.values()) else " and registers"
    lines.append(f"  shared memory: {k.peak} bytes; {k.blocks_per_sm} blocks per SM by shared memory{held}{bounds}"
                 + ("" if k.keeps_tiles else "; loops keep no tiles (they would not fit)"))
    if k.streamed:
        lines.append(f"  read once, loaded evict-first: {', '.join(sorted(k.streamed))}")
    for t in k.shared:
        pad = f", rows padded to {t.pitch}" if t.pitch else ""
        copies = f", one copy per warp group of loop {t.groups.var}" if t.groups is not None else ""
        lines.append(f"    {t.name}: {t.nbytes} bytes of {t.ctype} at {t.offset}{pad}{copies}")
    if k.unfolded:
        lines.append(f"  split-k combine of the kernel before, launched on its own: {k.unfolded}")
    if k.not_ahead:
        lines.append(f"  tiles not copied ahead: {k.not_ahead}")
    if k.not_refilled:
        lines.append(f"  tiles copied when each iteration needs them, not refilled: {k.not_refilled}")
    if k.replanned:
        lines.append(f"  planned with {k.replanned}")
    if isinstance(k.rows, onchip.RowsOnChip):
        lines += [f"  {t}" for t in k.rows.describe()]
    else:
        lines.append(f"  rows in memory: {k.rows}")
        _describe_stmt(k, nest.body, lines, "  ")
    if k.fold is not None and k.folded is not None:
        lines.append(f"  {k.fold.describe()}")
        lines += [f"    {t}" for t in _describe_kernel(k.folded)[1:]]
    return lines


def _describe_stmt(k: KernelPlan, s: Stmt, lines: list[str], indent: str) -> None:
    if isinstance(s, Seq):
        for part in k.seqs.get(id(s), s.stmts):
            if isinstance(part, rows.RowGroup):
                lines.append(f"{indent}{part.describe()}")
            else:
                _describe_stmt(k, part, lines, indent)
    elif isinstance(s, Loop):
        lp = k.loops[id(s)]
        lines.append(f"{indent}loop {lp.var} < {s.extent}:")
        if lp.group is not None:
            lines.append(f"{indent}  {lp.group.describe()}")
        if lp.fragments is not None:
            lines += [f"{indent}  {t}" for t in lp.fragments.describe(lp.offsets)]
            for text in lp.streams.describe(lp.offsets) if lp.streams is not None else ():
                lines.append(f"{indent}  kept: {text}")
            after = {e.block for e in lp.fragments.epilogue}
            for block, st in lp.fragments.stmts.items():
                where = f"rows {st.row}" + (f", columns {st.col}" if st.col else " (a row vector)")
                into = "to memory after the loop" if block in after else "in registers"
                lines.append(f"{indent}  {block}: {into} ({where})")
                if st.dot is not None:
                    lines += [f"{indent}    dot: {t}" for t in st.dot.describe().splitlines()]
            return
        if lp.stagger is not None:
            lines.append(f"{indent}  {lp.stagger.describe()}")
        for block in lp.stored:
            lines.append(f"{indent}  registers: {lp.accumulators[block].describe()}")
        for r in lp.resident:
            lines.append(f"{indent}  resident: {r.tensor} in shared memory {r.name} ({r.nbytes} bytes at "
                         f"{lp.offsets[r.name]})")
        for text in lp.streams.describe(lp.offsets) if lp.streams is not None else ():
            lines.append(f"{indent}  kept: {text}")
        _describe_stmt(k, s.body, lines, indent + "  ")
    elif isinstance(s, TileStore):
        p = k.stmts[id(s)]
        how = ("in the epilogue of its dot, " + ("in registers" if p.in_registers else "written in place")
               if p.in_place else "element by element")
        lines.append(f"{indent}{s.block}: {how}; {p.scratch} bytes of scratch at {p.at}")
        if p.row_values:
            lines.append(f"{indent}  per fragment row: {len(p.row_values)} value(s)")
        for e in p.materialize:
            kind = "dot" if isinstance(e, Dot) else "reduce" if isinstance(e, Reduce) else "value"
            lines.append(f"{indent}  array for a {kind} over ({', '.join(axes_of(e))})")
            if e in p.dots:
                lines += [f"{indent}    {t}" for t in p.dots[e].describe().splitlines()]
        if p.dot is not None:
            lines += [f"{indent}  dot: {t}" for t in p.dot.describe().splitlines()]
