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

With ``refill`` (the options' ``refill_tiles``, where the second halves would not fit) every varying operand is
kept in **one** buffer: the first iteration's tiles are copied before the loop, each its own ``cp.async`` group,
and a tile is refilled with iteration ``t + 1``'s right after the barrier that ends its last reader of iteration
``t`` (:func:`refill`).  The value tile then arrives while the scores are computed and the next key tile while
the softmax and the second product run, in no more shared memory than one buffer per tile.  A reader waits with
``cp.async.wait_group n`` where ``n`` is the number of groups committed after its tile's (:func:`_in_flight`):
the groups are committed in the same order before the loop as in it (by last reader), and every refill point
commits a group (empty at the last iteration), so ``n`` is the same at every iteration.

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
from polyfuse.emit_cpp.stagger import Stagger
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
    last: str | None = None
    """Refilled (one buffer): the block of the tile's last reader in an iteration, after which the next
    iteration's tile is copied into it."""
    in_flight: int = 0
    """With refills: the copy groups committed after the tile's and before its first reader (that reader's
    ``cp.async.wait_group``; an invariant tile is copied in the first group)."""

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
    refill: bool = False
    """The varying tiles are kept in one buffer each, copied before the loop and refilled after their last
    reader (:func:`refill`); the invariant ones copied before the loop."""
    stagger: Stagger | None = None
    """The loop starts each block at a step of its own (:mod:`~polyfuse.emit_cpp.stagger`): the copies are for the
    step an iteration runs, the halves and the first iteration go by the iteration's number (:attr:`turn`)."""

    @property
    def turn(self) -> str:
        """C text of the iteration's number: the loop's variable, or a staggered loop's counter."""
        return self.stagger.counter if self.stagger is not None else self.loop_var

    @property
    def refilled(self) -> tuple[KeptTile, ...]:
        """The tiles refilled after their last reader, in the order of their copy groups."""
        return tuple(t for t in self.kept if t.last is not None)

    def source(self, block: str, op: Staged) -> OperandPlan | None:
        """Where ``op`` (of a dot of statement ``block``) comes from, if the loop keeps it."""
        key = (block, op.x)
        tiles = {t.key: t for t in self.kept}
        holder = dict(self.held).get(key)
        if holder is not None:
            tile = tiles[holder]
            return OperandPlan(dataclasses.replace(op, stride=tile.operand.op.stride), "held", tile.buffer,
                               holder=holder[0], loop_var=self.turn, ahead=self.ahead, half=tile.half,
                               in_flight=self._in_flight(block))
        tile = tiles.get(key)
        if tile is None:
            return None
        return OperandPlan(op, "kept", tile.buffer, every_iteration=tile.operand.varies, loop_var=self.turn,
                           ahead=self.ahead, half=tile.half, in_flight=self._in_flight(block))

    def _in_flight(self, block: str) -> int | None:
        """With ``refill``: the copy groups that may still be in flight when statement ``block`` reads its tiles
        (the fewest of its tiles' :attr:`KeptTile.in_flight`); None otherwise."""
        if not self.refill:
            return None
        tiles = {t.key: t for t in self.kept}
        mine = [tiles[h] for k, h in self.held if k[0] == block] + [t for t in self.kept if t.key[0] == block]
        return min((t.in_flight for t in mine), default=0)

    def describe(self, offsets: Mapping[str, int]) -> list[str]:
        """One line per kept tile (with its byte ``offsets`` in shared memory) and per operand read from one."""
        def copied(t: KeptTile) -> str:
            if t.ahead:
                return "two halves, the next iteration's copied during this one"
            if t.last is not None:
                return (f"one buffer, the next iteration's copied after {t.last} (its last reader), "
                        f"{t.in_flight} later copy groups in flight at its first reader")
            if not t.operand.varies:
                return "copied before the loop" if self.ahead or self.refill else "copied once"
            return "copied every iteration"

        out = [f"{t.key[0]}: operand tile {t.operand.load.tensor.name} kept in {t.buffer} ({t.nbytes} bytes at "
               f"{offsets[t.buffer]}, {copied(t)})" for t in self.kept]
        out += [f"{k[0]}: operand read from the tile {h[0]} keeps" for k, h in self.held]
        return out


def plan(frame: Frame, loop: Loop, fresh: Callable[[str], str], ahead: bool = False,
         refill: bool = False) -> StreamPlan | None:
    """The tiles ``loop`` keeps, or None if it keeps none; ``ahead``: every varying operand too, copied one
    iteration ahead (where the loop has one); else ``refill``: every varying operand too, in one buffer refilled
    after its last reader."""
    o = frame.options
    if not (o.keep_invariant or o.share_tiles or ahead or refill):
        return None
    operands = _operands(frame, loop)
    held = _held(frame, operands) if o.share_tiles else {}
    streamed = o.async_staging and any(x.varies for x in operands.values())
    ahead = ahead and streamed
    refill = refill and streamed and not ahead
    kept = []
    for key, operand in operands.items():
        if key in held:
            continue
        keep = key in held.values() or (ahead or refill if operand.varies else o.keep_invariant or refill)
        if not keep:
            continue  # staged per statement
        kept.append(KeptTile(key, operand, fresh("keep"), ahead and operand.varies))
    if not kept:
        return None
    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    if refill:
        kept = _refills(kept, dict(held), [s.block for s in body])
    return StreamPlan(loop.var.name, tuple(kept), tuple(held.items()), ahead,
                      body[0].block if ahead and isinstance(body[0], TileStore) else None, refill)


def _refills(kept: list[KeptTile], held: dict[Key, Key], order: list[str]) -> list[KeptTile]:
    """``kept`` with each varying tile's last reader and in-flight count, ordered as their copy groups: by last
    reader (the order of the refills in an iteration), so that the groups before the loop come in that order too.

    A tile refilled at iteration ``t`` has the groups of the tiles refilled later in ``t`` committed after it,
    and those refilled in ``t + 1`` before its first reader: the same count at the first iteration, whose
    groups are committed before the loop in the refill order."""
    rank = {b: n for n, b in enumerate(order)}
    readers: dict[Key, list[int]] = {t.key: [rank[t.key[0]]] for t in kept}
    for reader, holder in held.items():
        readers[holder].append(rank[reader[0]])
    varying = sorted((t for t in kept if t.operand.varies), key=lambda t: (max(readers[t.key]), min(readers[t.key])))

    def later(n: int, t: KeptTile) -> int:
        first = min(readers[t.key])
        return len(varying) - n - 1 + sum(max(readers[u.key]) < first for u in varying)

    out = [dataclasses.replace(t, in_flight=later(0, t)) for t in kept if not t.operand.varies]
    return out + [dataclasses.replace(t, last=order[max(readers[t.key])], in_flight=later(n, t))
                  for n, t in enumerate(varying)]


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
    """Before a loop whose tiles are copied ahead: the first iteration's tiles and the invariant ones, one group;
    before one whose tiles are refilled: the invariant tiles with the first refilled tile's, then each other
    refilled tile's its own group, in the order of the refills."""
    if not (sp.ahead or sp.refill):
        return
    refilled = sp.refilled
    groups = [list(sp.kept)] if sp.ahead else [
        [t for t in sp.kept if t.last is None] + list(refilled[:1]), *([t] for t in refilled[1:])]
    for group in groups:
        em.open(f"if ({em.scalar(loop.extent, {})} > 0)")
        _bind(em, sp, loop, "0", unused=True)
        _copy(em, group, lambda t: t.buffer)
        em.close()
        em.line("pf::cp_async_commit();")


def top(em: CudaEmitter, sp: StreamPlan, loop: Loop) -> None:
    """At the top of an iteration of a loop whose tiles are copied ahead: wait for this iteration's tiles,
    publish them (every thread is then past the previous iteration's reads of the other halves) and copy the
    next iteration's into those halves."""
    if not sp.ahead:
        return
    turn = sp.turn
    em.line("pf::cp_async_wait<0>();  // this iteration's tiles (copied during the previous one)")
    em.barrier()
    _copy_next(em, sp, loop, [x for x in sp.kept if x.ahead], lambda x: half_pointer(x.buffer, turn, x.half),
               "the next iteration's tiles")
    em.published = sp.first


def refill(em: CudaEmitter, sp: StreamPlan, loop: Loop, block: str) -> None:
    """After statement ``block`` (and the barrier that ends it, past which no thread reads its tiles) in a loop
    whose tiles are refilled: the next iteration's copy of each tile ``block`` read last, one group each
    (committed at every iteration, empty at the last, so every reader's wait counts the same groups)."""
    for tile in (x for x in sp.refilled if x.last == block):
        _copy_next(em, sp, loop, [tile], lambda x: x.buffer,
                   f"the next iteration's tile, into the buffer {block} has read")


def _copy_next(em: CudaEmitter, sp: StreamPlan, loop: Loop, tiles: list[KeptTile],
               buffer: Callable[[KeptTile], str], comment: str) -> None:
    """The next iteration's copies of ``tiles`` into ``buffer(tile)`` (none after the last iteration: the loop
    variable shadowed by its next value in a scope of its own), then one commit, made at every iteration."""
    turn, t = sp.turn, em.widths.loop
    em.open(f"if ({turn} + 1 < {em.scalar(loop.extent, {})})")
    em.line(f"const {t} pf_next = {turn} + 1;")
    em.open("")
    _bind(em, sp, loop, "pf_next", comment=comment)
    _copy(em, tiles, buffer)
    em.close()
    em.close()
    em.line("pf::cp_async_commit();")


def _bind(em: CudaEmitter, sp: StreamPlan, loop: Loop, iteration: str, *, unused: bool = False,
          comment: str = "") -> None:
    """Declare the loop's variable (and a staggered loop's counter) as at iteration ``iteration`` (C text), in the
    scope a copy for that iteration is printed in; ``unused``: marked ``[[maybe_unused]]``."""
    t = em.widths.loop
    note = f"  // {comment}" if comment else ""
    if sp.stagger is None:
        em.line(f"{'[[maybe_unused]] ' if unused else ''}const {t} {sp.loop_var} = {iteration};{note}")
        return
    # (a refill's copies read the step only, copies into halves the counter too)
    em.line(f"[[maybe_unused]] const {t} {sp.turn} = {iteration};{note}")
    em.line(f"[[maybe_unused]] const {t} {sp.loop_var} = {sp.stagger.step(sp.turn, em.scalar(loop.extent, {}), t)};")


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
    if source.in_flight is not None:
        em.line(f"uint16_t* {arr} = {source.pointer};  // copied during the previous iteration (or before the loop)")
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
    refilled = [op.in_flight for op in operands if op.source in ("kept", "held") and op.in_flight is not None]
    if refilled and not waited:
        em.line(f"pf::cp_async_wait<{min(refilled)}>();  // this iteration's tiles (later copies may be in flight)")
        em.barrier()
        return
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
