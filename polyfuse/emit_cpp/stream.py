"""Streaming the tiles of a rolling loop into shared memory with ``cp.async`` (CUDA, sm_80+).

A tensor-core dot stages its operands in shared memory before every product
(:mod:`polyfuse.emit_cpp.mma`).  Inside a loop that rolls over tiles (attention's key/value tiles,
a GEMM's k tiles) the operands that are plain 16-bit tiles of an input tensor get buffers of their
own instead of per-statement scratch, and are copied by ``cp.async`` ahead of their use:

* an operand that changes with the loop (the key tile at ``j``) has ``STREAM_STAGES`` buffers; the
  copy of tile ``j + 1`` is issued while tile ``j`` is used — right after the barrier that publishes
  tile ``j`` with two stages (double buffering), after the statement that uses tile ``j`` with one
  (its single buffer is free again) — so the load overlaps the rest of the iteration;
* an operand that does not change with the loop (the query tile) is copied once, at the first
  iteration, and stays.

The copies of one operand form one ``cp.async`` group per iteration (empty when there is no next
tile), committed in the same order every iteration, so before using operand ``p`` (in the order the
loop body uses them) a thread waits until at most ``(N - 1 - p_last) + p_first`` groups are in flight:
those committed after it, N being the number of streamed operands and ``p_first..p_last`` the
operands of that dot.  The first iteration waits for everything.  Every statement ends with a
barrier, so a buffer is never overwritten while a thread still reads it.

The copy of tile ``j + 1`` evaluates the operand's indices with the loop variable shadowed by
``j + 1`` in a nested C scope, so masks and offsets are exactly those of the next iteration.
Only loops whose body is a sequence of statements (no inner loop) stream, and only operands that
read an input tensor (no statement of the kernel writes it).

Without prefetching (``STREAM_STAGES`` 0, the default) a loop still keeps some tiles in buffers of its
own: an operand that does not change with the loop is copied once, and a tile that
holds an operand of a later dot of the same iteration — same tensor and offsets, that operand's extents
within the tile's and neither padded nor masked — serves that dot too, which reads it in place (with
the tile's row pitch) instead of copying it again.  MLA's value tile is the first Dv columns of its key
tile.  The other operands are staged per statement (:mod:`polyfuse.emit_cpp.mma`); every wait is for
all copies in flight.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import Const, Expr, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import INPUT, Loop, Seq
from polyfuse.ir.visit import substitute
from polyfuse.tiling.htile import Dot, Slice, TileLoad, TileStore, axis_sizes, walk_tile_expr

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter
    from polyfuse.emit_cpp.mma import Staged

STREAM_STAGES = 0
"""Buffers per streamed operand that changes with the loop: 2 is double buffering (the next tile's
copy overlaps the current tile's product), 1 overlaps it with the statements after the product only,
0 streams nothing (the default, measured).  On the H200 streaming was slower in every case measured,
because its buffers cost blocks per SM and the block-wide barriers of the statements already let the
other resident blocks hide the loads (ms, stages 2 / 1 / 0): attn_global decode B=32 H=64 Skv=4096
2.09 / 1.30 / 1.28; causal prefill S=4096 3.60 / 3.65 / 3.16 (with register accumulators 3.27 / 3.23 /
2.81); global prefill 1.91 / 1.89 / 1.83; MLA decode 0.60 / – / 0.43; GQA prefill 6.96 / – / 5.66.  It
stays, tested on the GPU, for kernels that keep few blocks per SM (``CudaEmitter.stream_stages``)."""
KEEP_INVARIANT = True
"""With ``STREAM_STAGES`` 0: copy operands that do not change with the loop once, into buffers of their own.
Measured on the H200 with ``SHARE_TILES`` (ms, both on / both off): causal prefill 2.55 / 2.60, global prefill
1.42 / 1.46, GQA prefill 4.89 / 4.99, causal decode 0.157 / 0.170, GQA decode 0.070 / 0.091, MLA decode B=32
0.671 / 0.825; attn_global decode B=32 1.08 / 1.08."""
SHARE_TILES = True
"""With ``STREAM_STAGES`` 0: let a dot read another dot's tile of the same iteration where it holds its operand.
Measured on the H200 (MLA decode, ms): both on 0.206, without ``KEEP_INVARIANT`` 0.215, without this 0.236,
neither 0.245."""
STREAM_SHARED_BUDGET = 232448
"""The most shared memory (bytes) a kernel may take because of its stream buffers: past it the kernel
is emitted with fewer stages, then without streaming (the CUDA emitter's ``nest_kernel``)."""


@dataclass(frozen=True)
class Operand:
    """A streamable operand: its staging, its 16-bit type, whether it changes with the loop, and the
    tile axis sizes of its statement."""

    op: Staged
    low: DType
    varies: bool
    sizes: dict[str, int]
    load: TileLoad
    masked: bool


@dataclass(frozen=True)
class Stream:
    """One streamed operand and its buffer (``stages`` × ``op.size`` 16-bit elements)."""

    operand: Operand
    buffer: str
    stages: int

    @property
    def size(self) -> int:
        return self.operand.op.size

    @property
    def varies(self) -> bool:
        return self.operand.varies


@dataclass
class StreamLoop:
    """The streams of the loop being emitted and the bookkeeping of their groups."""

    loop: Loop
    streams: dict[tuple[str, object], Stream]
    stages: int = 0
    """Buffers of the varying streams; 0: no prefetch (each copied when its dot comes, waited for at once)."""
    held: dict[tuple[str, object], tuple[str, object]] = field(default_factory=dict)
    """Operands read from another stream's tile: operand → the stream holding it."""
    order: list[tuple[str, object]] = field(default_factory=list)
    """Varying streams in the order the body uses them (their positions p)."""
    waits: list[tuple[int, list[tuple[str, object]]]] = field(default_factory=list)
    """(line holding the placeholder, streams the dot uses) for each wait."""
    using: list[tuple[str, object]] = field(default_factory=list)
    """Streams the dot being emitted uses."""
    later: list[tuple[tuple[str, object], str]] = field(default_factory=list)
    """Copies of the next tile to issue after the current statement (one stage): (stream, buffer)."""


def streamed_operands(em: CudaEmitter, loop: Loop) -> dict[tuple[str, object], Operand]:
    """The operands of ``loop``'s tensor-core dots that can stream, by (block, operand)."""
    from polyfuse.emit_cpp.mma import mma_type, raw_staging, staging

    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    if not all(isinstance(s, TileStore) for s in body):
        return {}
    found: dict[tuple[str, object], Operand | None] = {}
    saved = getattr(em, "sizes", {})
    for s in body:
        em.sizes = axis_sizes(s)
        for e in walk_tile_expr(s.value):
            low = mma_type(em, e) if isinstance(e, Dot) else None
            if low is None:
                continue
            for op in staging(em, e):
                raw = None if op.split else raw_staging(em, op, low)
                if raw is None or raw[0].tensor.role != INPUT:
                    continue
                key = (s.block, op.x)
                # An operand used twice in one statement stages as before (one copy per use).
                found[key] = None if key in found else Operand(op, low, _mentions(raw, loop.var.name), em.sizes,
                                                                raw[0], bool(raw[1]))
    em.sizes = saved
    return {k: v for k, v in found.items() if v is not None}


def _mentions(raw, name: str) -> bool:
    load, conditions = raw
    return any(isinstance(n, Var) and n.name == name for x in (load, *conditions) for n in walk_tile_expr(x))


def open_streams(em: CudaEmitter, loop: Loop, stages: int | None) -> StreamLoop | None:
    """Allocate the buffers of ``loop``'s streamed operands (before the loop), or None if none stream
    (``stages`` None streams none; 0 keeps the tiles of ``KEEP_INVARIANT`` and ``SHARE_TILES`` only)."""
    if stages is None:
        return None
    operands = streamed_operands(em, loop)
    held = _held(em, operands) if stages == 0 and SHARE_TILES else {}
    streams = {}
    for key, operand in operands.items():
        if key in held:
            continue
        if stages == 0 and key not in held.values() and (operand.varies or not KEEP_INVARIANT):
            continue  # staged per statement as without streams
        name = em.fresh("stream")
        buffers = max(stages, 1) if operand.varies else 1
        em.shared_array("uint16_t", name, operand.op.size * 2 * buffers)
        streams[key] = Stream(operand, name, buffers)
    if not streams:
        return None
    return StreamLoop(loop, streams, stages, held)


def _held(em: CudaEmitter, operands: dict[tuple[str, object], Operand]) -> dict[tuple[str, object], tuple[str, object]]:
    """Operands (by key) whose values an earlier statement's operand tile holds, with that operand's key."""
    unit = {name: Const(0, v.dtype) for name, v in em.unit_vars.items()}
    keys = list(operands)
    held: dict[tuple[str, object], tuple[str, object]] = {}
    for n, later in enumerate(keys):
        for earlier in keys[:n]:
            if earlier not in held and earlier[0] != later[0] and _holds(operands[earlier], operands[later], unit):
                held[later] = earlier
                break
    return held


def _holds(tile: Operand, x: Operand, unit: dict[str, Expr]) -> bool:
    """Whether ``tile``'s staged tile holds operand ``x`` at the same places: the same tensor, scalar indices
    and slice starts, ``x``'s slices no longer than the tile's, two slices each (rows, then the contiguous
    last dimension: both lie ``[row][column]``), and ``x`` neither masked nor padded."""
    a, b = tile.load, x.load
    if a.tensor.name != b.tensor.name or tile.masked or x.masked or len(a.index) != len(b.index):
        return False
    if x.op.kk != x.op.kp or x.op.rows != x.op.rows_pad:
        return False
    if sum(isinstance(i, Slice) for i in a.index) != 2 or not isinstance(a.index[-1], Slice):
        return False
    for i, j in zip(a.index, b.index, strict=True):
        if isinstance(i, Slice) != isinstance(j, Slice):
            return False
        first, second = (i.start, j.start) if isinstance(i, Slice) else (i, j)
        if str(simplify(substitute(first, unit))) != str(simplify(substitute(second, unit))):
            return False
        if isinstance(i, Slice) and j.size > i.size:
            return False
    return True


def close_streams(em: CudaEmitter, state: StreamLoop) -> None:
    """After the loop: settle the wait counts and drain the (empty) groups still committed."""
    n = len(state.order)
    for at, used in state.waits:
        positions = [state.order.index(k) for k in used if k in state.order]
        pending = (n - 1 - max(positions)) + min(positions)
        em.lines[at] = em.lines[at].replace("PF_PENDING", str(pending))
    em.line("pf::cp_async_wait<0>();")


def consume(em: CudaEmitter, op: Staged, arr: str) -> Staged | None:
    """Point ``arr`` at ``op``'s streamed buffer for this iteration (issuing the first copy at the first
    iteration, or every copy without prefetch) and return how ``op`` lies there, or None if ``op`` does
    not stream."""
    state = em.streaming
    if state is None:
        return None
    key = (em.block, op.x)
    if key in state.held:
        # Another dot's tile of this iteration holds op: read it there, rows at that tile's pitch.
        holder = state.streams[state.held[key]]
        em.line(f"uint16_t* {arr} = {holder.buffer};  // holds this operand (copied for {state.held[key][0]})")
        return dataclasses.replace(op, stride=holder.operand.op.stride)
    stream = state.streams.get(key)
    if stream is None:
        return None
    from polyfuse.emit_cpp.mma import copy_async

    j = state.loop.var.name
    every = stream.varies and state.stages == 0
    if not every:
        em.open(f"if ({j} == 0)")
    copy_async(em, op, stream.operand.low, stream.buffer)
    em.line("pf::cp_async_commit();")
    if not every:
        em.close()
    if stream.stages == 2:
        em.line(f"uint16_t* {arr} = {stream.buffer} + ({j} & 1) * {stream.size};")
    else:
        em.line(f"uint16_t* {arr} = {stream.buffer};")
    if stream.varies and key not in state.order:
        state.order.append(key)
    state.using.append(key)
    return op


def publish(em: CudaEmitter, waited: bool = False) -> None:
    """The barrier before a dot reads its staged operands: first wait for the streamed ones (unless the
    dot has just ``waited`` for all copies), then (two stages) issue the copies of their next tiles."""
    state = em.streaming
    if state is None or not state.using:
        em.barrier()
        return
    j = state.loop.var.name
    used = list(state.using)
    state.using.clear()
    if state.stages == 0:
        if not waited:
            # Copied at every iteration: wait now; copied once: wait at the first iteration only.
            every = any(state.streams[k].varies for k in used)
            if not every:
                em.open(f"if ({j} == 0)")
            em.line("pf::cp_async_wait<0>();")
            if not every:
                em.close()
        em.barrier()
        return
    em.open(f"if ({j} == 0)")
    em.line("pf::cp_async_wait<0>();")
    em.close()
    if any(state.streams[k].varies for k in used):
        # Later iterations wait for this dot's tiles only (the loaded-once ones arrived at the first).
        em.open("else")
        state.waits.append((len(em.lines), used))
        em.line("pf::cp_async_wait<PF_PENDING>();")
        em.close()
    em.barrier()
    for key in used:
        stream = state.streams[key]
        if not stream.varies:
            continue
        if stream.stages == 2:
            next_tile(em, state, key, f"{stream.buffer} + (({j} + 1) & 1) * {stream.size}")
        else:
            state.later.append((key, stream.buffer))


def after_statement(em: CudaEmitter) -> None:
    """Issue the one-stage copies of the next tiles, whose buffers the finished statement freed."""
    state = em.streaming
    if state is None:
        return
    for key, buffer in state.later:
        next_tile(em, state, key, buffer)
    state.later.clear()


def next_tile(em: CudaEmitter, state: StreamLoop, key, buffer: str) -> None:
    """Issue the copy of ``key``'s tile for the next iteration into ``buffer`` (one group, maybe empty)."""
    from polyfuse.emit_cpp.mma import copy_async

    lp = state.loop
    j = lp.var.name
    operand = state.streams[key].operand
    saved, em.sizes = getattr(em, "sizes", {}), operand.sizes
    em.open(f"if ({j} + 1 < {em.scalar(lp.extent, {})})")
    em.line(f"const {em.widths.loop} pf_next = {j} + 1;")
    em.line(f"uint16_t* const pf_dst = {buffer};")
    em.open("")
    em.line(f"const {em.widths.loop} {j} = pf_next;  // the next iteration's indices")
    copy_async(em, operand.op, operand.low, "pf_dst")
    em.close()
    em.close()
    em.line("pf::cp_async_commit();")
    em.sizes = saved
