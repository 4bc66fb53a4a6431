"""Tiles a rolling loop keeps in shared memory buffers of its own, copied with ``cp.async`` (CUDA, sm_80+).

A tensor-core dot stages its operands in shared memory before every product (:mod:`polyfuse.emit_cpp.mma`).
Inside a loop that rolls over tiles (attention's key/value tiles, a GEMM's k tiles), some operands that are
plain 16-bit tiles of an input tensor get a buffer of the loop instead of per-statement scratch:

* an operand that does not change with the loop (the query tile) is copied once, at the first iteration,
  and stays (the options' ``keep_invariant``);
* a tile that holds an operand of a later dot of the same iteration — same tensor and offsets, that
  operand's extents within the tile's and neither padded nor masked — serves that dot too, which reads it
  in place (with the tile's row pitch) instead of copying it again (``share_tiles``): MLA's value tile is
  the first Dv columns of its key tile.  Such a holder that changes with the loop is copied at every
  iteration.

Each copy is one ``cp.async`` group, waited for (all copies in flight) before the barrier that publishes the
dot's operands.  Only loops whose body is a sequence of statements (no inner loop) keep tiles, and only
operands that read an input tensor (no statement of the kernel writes it).

Copied that way, an iteration's tiles arrive while the block waits: nothing else is in flight (decode
attention streams its key and value tiles through such a loop, bound by memory).  With ``ahead`` (the
options' ``stream_ahead``) **every** operand that changes with the loop is kept, in a buffer of two halves,
and copied one iteration ahead: the tiles of the first iteration (and the invariant ones) before the loop,
those of iteration ``t + 1`` into half ``(t + 1) & 1`` at the top of iteration ``t`` — after the barrier that
publishes iteration ``t``'s tiles, past which no thread still reads the other half (:func:`top`).  The dots
then neither copy nor wait.

:func:`plan` decides which (the kernel plan records a :class:`StreamPlan` per loop and an ``OperandPlan`` per
operand); :func:`prologue`, :func:`top`, :func:`consume`, :func:`publish` and :func:`drain` print the copies
and waits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.dotplan import (
    DotPlan, Frame, OperandPlan, Staged, half_pointer, mma_type, raw_staging, staging,
)
from polyfuse.emit_cpp.staging import copy_async
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import Const, Expr, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import INPUT, Loop, Seq
from polyfuse.ir.visit import substitute
from polyfuse.tiling.htile import Dot, Index, Slice, TileLoad, TileStore, axis_sizes, walk_tile_expr

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

Key = tuple[str, Expr]
"""An operand of a loop's dots: (block of its statement, the operand expression)."""


@dataclass(frozen=True)
class Operand:
    """A keepable operand: its staging, its 16-bit type, whether it changes with the loop, its load and
    whether that is masked."""

    op: Staged
    low: DType
    varies: bool
    load: TileLoad
    masked: bool
    sizes: tuple[tuple[str, int], ...]
    """The axis sizes of the statement whose dot reads it (the copy loops are printed with them)."""


@dataclass(frozen=True)
class KeptTile:
    """One operand kept in ``buffer`` (``op.size`` 16-bit elements) across its loop."""

    key: Key
    operand: Operand
    buffer: str
    ahead: bool = False
    """Copied one iteration ahead, into the half of a two-part buffer that the iteration does not read."""

    @property
    def half(self) -> int:
        """16-bit elements of one half of the buffer (0: one buffer, not copied ahead)."""
        return self.operand.op.size if self.ahead else 0

    @property
    def nbytes(self) -> int:
        return self.operand.op.size * 2 * (2 if self.ahead else 1)


@dataclass(frozen=True)
class StreamPlan:
    """The kept tiles of one loop (in allocation order) and the operands read from another's tile."""

    loop_var: str
    kept: tuple[KeptTile, ...]
    held: tuple[tuple[Key, Key], ...]
    ahead: bool = False
    """The varying tiles are copied one iteration ahead, the invariant ones before the loop (:func:`top`)."""
    first: str | None = None
    """The block of the loop body's first statement (with ``ahead``: a dot there reading only tiles copied ahead
    needs no barrier of its own, :func:`publish`)."""

    def source(self, block: str, op: Staged) -> OperandPlan | None:
        """Where ``op`` (of a dot of statement ``block``) comes from, if the loop keeps it."""
        key = (block, op.x)
        tiles = {t.key: t for t in self.kept}
        holder = dict(self.held).get(key)
        if holder is not None:
            tile = tiles[holder]
            return OperandPlan(dataclasses.replace(op, stride=tile.operand.op.stride), "held", tile.buffer,
                               holder=holder[0], loop_var=self.loop_var, ahead=self.ahead, half=tile.half)
        tile = tiles.get(key)
        if tile is None:
            return None
        return OperandPlan(op, "kept", tile.buffer, every_iteration=tile.operand.varies, loop_var=self.loop_var,
                           ahead=self.ahead, half=tile.half)

    def describe(self, offsets: Mapping[str, int]) -> list[str]:
        """One line per kept tile (with its byte ``offsets`` in shared memory) and per operand read from one."""
        def copied(t: KeptTile) -> str:
            if t.ahead:
                return "two halves, the next iteration's copied during this one"
            if not t.operand.varies:
                return "copied before the loop" if self.ahead else "copied once"
            return "copied every iteration"

        out = [f"{t.key[0]}: operand tile {t.operand.load.tensor.name} kept in {t.buffer} ({t.nbytes} bytes at "
               f"{offsets[t.buffer]}, {copied(t)})" for t in self.kept]
        out += [f"{k[0]}: operand read from the tile {h[0]} keeps" for k, h in self.held]
        return out


def plan(frame: Frame, loop: Loop, fresh: Callable[[str], str], ahead: bool = False) -> StreamPlan | None:
    """The tiles ``loop`` keeps, or None if it keeps none; ``ahead``: every varying operand too, copied one
    iteration ahead (where the loop has one)."""
    o = frame.options
    if not (o.keep_invariant or o.share_tiles or ahead):
        return None
    operands = _operands(frame, loop)
    held = _held(frame, operands) if o.share_tiles else {}
    ahead = ahead and o.async_staging and any(x.varies for x in operands.values())
    kept = []
    for key, operand in operands.items():
        if key in held:
            continue
        keep = key in held.values() or (ahead if operand.varies else o.keep_invariant)
        if not keep:
            continue  # staged per statement
        kept.append(KeptTile(key, operand, fresh("keep"), ahead and operand.varies))
    if not kept:
        return None
    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    return StreamPlan(loop.var.name, tuple(kept), tuple(held.items()), ahead,
                      body[0].block if ahead and isinstance(body[0], TileStore) else None)


def _operands(frame: Frame, loop: Loop) -> dict[Key, Operand]:
    """The operands of ``loop``'s tensor-core dots that could be kept, by (block, operand)."""
    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    if not all(isinstance(s, TileStore) for s in body):
        return {}
    found: dict[Key, Operand | None] = {}
    for s in body:
        here = frame.at(axis_sizes(s))
        for e in walk_tile_expr(s.value):
            low = mma_type(here, e) if isinstance(e, Dot) else None
            if low is None:
                continue
            for op in staging(here, e):
                raw = None if op.split else raw_staging(op, low)
                if raw is None or raw[0].tensor.role != INPUT:
                    continue
                key = (s.block, op.x)
                # An operand used twice in one statement stages as before (one copy per use).
                found[key] = None if key in found else Operand(op, low, _mentions(raw, loop.var.name), raw[0],
                                                                bool(raw[1]), tuple(axis_sizes(s).items()))
    return {k: v for k, v in found.items() if v is not None}


def _mentions(raw, name: str) -> bool:
    load, conditions = raw
    return any(isinstance(n, Var) and n.name == name for x in (load, *conditions) for n in walk_tile_expr(x))


def _held(frame: Frame, operands: dict[Key, Operand]) -> dict[Key, Key]:
    """Operands (by key) whose values an earlier statement's operand tile holds, with that operand's key."""
    unit = {v.name: Const(0, v.dtype) for v in frame.unit_vars}
    keys = list(operands)
    held: dict[Key, Key] = {}
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
    return all(same_start(i, j, unit) and not (isinstance(i, Slice) and j.size > i.size)
               for i, j in zip(a.index, b.index, strict=True))


def same_start(i: Index, j: Index, unit: Mapping[str, Expr]) -> bool:
    """Whether two index entries of loads of one tensor start at the same place: equal scalars, or slices with
    equal starts (the kernel's loops that run once, ``unit``, at 0)."""
    if isinstance(i, Slice) != isinstance(j, Slice):
        return False
    first, second = (i.start, j.start) if isinstance(i, Slice) else (i, j)
    return str(simplify(substitute(first, unit))) == str(simplify(substitute(second, unit)))


def prologue(em: CudaEmitter, sp: StreamPlan, loop: Loop) -> None:
    """Before a loop whose tiles are copied ahead: the first iteration's tiles and the invariant ones, one group."""
    if not sp.ahead:
        return
    em.open(f"if ({em.scalar(loop.extent, {})} > 0)")
    em.line(f"[[maybe_unused]] const {em.widths.loop} {sp.loop_var} = 0;")
    _copy(em, list(sp.kept), lambda t: t.buffer)
    em.close()
    em.line("pf::cp_async_commit();")


def top(em: CudaEmitter, sp: StreamPlan, loop: Loop) -> None:
    """At the top of an iteration of a loop whose tiles are copied ahead: wait for this iteration's tiles,
    publish them (every thread is then past the previous iteration's reads of the other halves) and copy the
    next iteration's into those halves."""
    if not sp.ahead:
        return
    var, t = sp.loop_var, em.widths.loop
    em.line("pf::cp_async_wait<0>();  // this iteration's tiles (copied during the previous one)")
    em.barrier()
    em.open(f"if ({var} + 1 < {em.scalar(loop.extent, {})})")
    em.line(f"const {t} pf_next = {var} + 1;")
    em.open("")
    em.line(f"const {t} {var} = pf_next;  // the next iteration's tiles")
    _copy(em, [x for x in sp.kept if x.ahead], lambda x: half_pointer(x.buffer, var, x.half))
    em.close()
    em.close()
    em.line("pf::cp_async_commit();")
    em.published = sp.first


def _copy(em: CudaEmitter, tiles: list[KeptTile], buffer: Callable[[KeptTile], str]) -> None:
    """Copy each of ``tiles`` into ``buffer(tile)``, with its statement's axis sizes."""
    saved = em.sizes
    for tile in tiles:
        em.sizes = dict(tile.operand.sizes)
        copy_async(em, tile.operand.op, tile.operand.low, buffer(tile))
    em.sizes = saved


def consume(em: CudaEmitter, source: OperandPlan, low: DType, arr: str) -> None:
    """Point ``arr`` at a kept operand's buffer, copying it there first where this iteration must (not where
    its loop copies its tiles ahead: :func:`top`)."""
    if source.source == "held":
        em.line(f"uint16_t* {arr} = {source.pointer};  // holds this operand (copied for {source.holder})")
        return
    if source.ahead:
        em.line(f"uint16_t* {arr} = {source.pointer};  // copied ahead")
        return
    if not source.every_iteration:
        em.open(f"if ({source.loop_var} == 0)")
    copy_async(em, source.staged, low, source.buffer)
    em.line("pf::cp_async_commit();")
    if not source.every_iteration:
        em.close()
    em.line(f"uint16_t* {arr} = {source.buffer};")


def publish(em: CudaEmitter, dot: DotPlan, waited: bool = False) -> None:
    """The barrier before a dot reads its staged operands, after waiting for the kept ones (unless the dot
    has just ``waited`` for all copies): at every iteration if one is copied at every iteration, else at
    the first."""
    operands = [op for op in (dot.a, dot.b) if op is not None]
    first, em.published = em.published == em.block, None
    if first and all(op.source in ("kept", "held") and op.ahead for op in operands):
        return  # the barrier at the top of the iteration published them, and nothing ran since
    kept = [op for op in operands if op.source == "kept" and not op.ahead]
    if kept and not waited:
        every = any(op.every_iteration for op in kept)
        if not every:
            em.open(f"if ({kept[0].loop_var} == 0)")
        em.line("pf::cp_async_wait<0>();")
        if not every:
            em.close()
    em.barrier()


def drain(em: CudaEmitter) -> None:
    """After a loop that keeps tiles: no copy may still be in flight."""
    em.line("pf::cp_async_wait<0>();")
