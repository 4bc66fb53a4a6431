"""Printing a loop in warp fragments (:mod:`polyfuse.emit_cpp.fragments` plans it): the registers, the copies of
its operand tiles (in step with a block barrier, or by a producer warpgroup through mbarriers), each statement
on the thread's fragment elements, its products (``mma.sync`` with ldmatrix, or warpgroup ``wgmma``), and the
epilogue from the registers.  Nothing here decides: every choice is in the :class:`~.fragments.FragmentLoop`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.emit_cpp import tma
from polyfuse.emit_cpp.cfamily import _REDUCE_INIT, axis_var
from polyfuse.emit_cpp.dotplan import LOW, M16N8, PANEL, WGMMA, LdmatrixFragment, OperandPlan
from polyfuse.emit_cpp.fragments import STRIP, FragmentLoop, FragmentStmt, Held, SharedValue, StagedStore, _body
from polyfuse.emit_cpp.warpgroups import PRODUCER_REGISTERS, PRODUCER_WARPS, WARPGROUP_ROWS, WARPGROUP_WARPS
from polyfuse.emit_cpp.fragment_values import is_zero, reductions
from polyfuse.emit_cpp.staging import copy_async, stage_elements, stage_raw, stage_vector
from polyfuse.emit_cpp.stream import consume
from polyfuse.emit_cpp.vector import CHUNK_TYPES, VECTOR_BYTES
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import Expr
from polyfuse.ir.stmt import Loop
from polyfuse.tiling.htile import Dot, Slice, TileLoad, TileStore, axes_of, axis_sizes, walk_tile_expr

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter


def emit(em: CudaEmitter, loop: Loop, fl: FragmentLoop, offsets: Mapping[str, int],
         kept: tuple[tuple[str, int], ...]) -> None:
    """``loop`` and its epilogue as ``fl`` says; ``kept``: the loop's kept tiles (buffer, bytes), declared here."""
    body = _body(loop)
    assert body is not None
    held = {h.name: h for h in fl.held}
    em.line(f"// loop {loop.var.name} in warp fragments: each warp holds {STRIP} whole rows of every tile")
    em.open("")
    em.line(f"const int pf_warp = pf_tid / {em.warp}, pf_lane = pf_tid % {em.warp};")
    for name, nbytes in (*kept, *fl.buffers):
        em.shared_array("uint16_t", name, nbytes, offsets[name], fl.align)
    if fl.producer:
        assert fl.barriers is not None
        em.shared_array("uint64_t", fl.barriers, fl.barrier_bytes, offsets[fl.barriers])
        _specialised(em, loop, fl, body, held)
    else:
        _in_step(em, loop, fl, body, held)
    em.close()
    em.barrier()


def _in_step(em: CudaEmitter, loop: Loop, fl: FragmentLoop, body: tuple[TileStore, ...],
             held: Mapping[str, Held]) -> None:
    """Every warp copies and computes: the copies of an iteration published by a block barrier."""
    _load_held(em, fl)
    copies = any(st.dot is not None and any(op.source in ("kept", "cp.async") for op in (st.dot.a, st.dot.b)
                                              if op is not None) for st in fl.stmts.values())
    var, t = loop.var.name, em.widths.loop
    extent = em.scalar(loop.extent, {})
    if fl.prefetch:
        em.open(f"if ({extent} > 0)")  # the first iteration's copies
        em.line(f"const {t} {var} = 0;")
        _issue(em, fl, body, "first", var)
        em.close()
        em.line("pf::cp_async_commit();")
    em.open(em.loop_header(loop))
    if fl.prefetch:
        # This iteration's tiles have landed; after the barrier every warp is past the previous iteration's
        # products, so the other buffer is free for the next iteration's copies.
        em.line("pf::cp_async_wait<0>();")
        if fl.warpgroups:
            em.line("pf::fence_async_shared();  // (the copies, visible to the warpgroup products)")
        em.barrier()
        arrays = _issue(em, fl, body, "read", var)
        em.open(f"if ({var} + 1 < {extent})")
        em.line(f"const {t} pf_next = {var} + 1;")
        em.open("")
        em.line(f"const {t} {var} = pf_next;  // the next iteration's tiles")
        _issue(em, fl, body, "next", var)
        em.close()
        em.close()
        em.line("pf::cp_async_commit();")
        waits: dict[str, int | None] = {b: None for b in fl.stmts}
    else:
        em.barrier()  # the previous iteration's products have read the buffers this one refills
        arrays, single = _issue_each(em, fl, body)
        waits = dict(single)
    _iteration(em, fl, body, held, arrays, waits)
    em.close()
    if copies:
        em.line("pf::cp_async_wait<0>();")
    _finish(em, fl, held)


def _specialised(em: CudaEmitter, loop: Loop, fl: FragmentLoop, body: tuple[TileStore, ...],
                 held: Mapping[str, Held]) -> None:
    """Warp specialisation: the last warpgroup copies iteration ``j``'s operand tiles into stage ``j % S`` (``S``
    stages) once the computing warps have released it (``empty``), each of its threads arriving on ``full`` when
    its copies land; the computing warps wait for ``full``, compute, and arrive on ``empty`` (with a product
    issued one iteration late, for the previous iteration's stage: its ``b`` was read until then).  The producer
    gives registers back and the others take them (``setmaxnreg``: the computing warps hold every tile in
    registers).  The mbarriers are set up first, so that the producer's first copies are under way while the
    computing warps copy the tiles copied once (the query tile) and meet at a named barrier of their own.
    mbarrier phases: stage ``s`` completes phase ``j / S`` at iteration ``j``, so ``full`` is waited with parity
    ``(j / S) & 1`` and ``empty`` (for the iteration ``S`` before) with the other one."""
    bars, var = fl.barriers, loop.var.name
    computing = -(-fl.rows // STRIP) * em.warp
    producers = PRODUCER_WARPS * em.warp
    extent = em.scalar(loop.extent, {})
    stages = fl.stages
    if fl.boxes:  # (the maps' first use waits for no fetch: they come while the kept tiles are copied)
        em.open(f"if (pf_tid == {computing})")
        for m in tma.kernel_maps(fl.boxes.values()):
            em.line(f"pf::tma_prefetch(&{m.name});")
        em.close()
    em.open("if (pf_tid == 0)")
    for stage in range(stages):
        if fl.boxes:
            em.line(f"pf::mbarrier_init(&{bars}[{stage}], 1);  // full: the bulk copies' bytes, announced once")
        else:
            em.line(f"pf::mbarrier_init(&{bars}[{stage}], {producers});  // full: one arrival per copying thread")
        em.line(f"pf::mbarrier_init(&{bars}[{stages + stage}], {computing});  // empty: every computing thread")
    em.close()
    em.barrier()
    em.open(f"if (pf_tid >= {computing})")
    em.line(f"pf::setmaxnreg_dec<{PRODUCER_REGISTERS}>();")
    if fl.boxes:
        em.line("// one thread issues the bulk tensor copies")
        em.open(f"if (pf_tid == {computing})")
    em.open(em.loop_header(loop))
    em.line(f"if ({var} >= {stages}) pf::mbarrier_wait(&{bars}[{stages} + ({_stage_of(fl, var)})], "
            f"({_phase(fl, var)}) ^ 1);")
    if fl.boxes:
        _bulk(em, fl, body, var)
    else:
        with em.threads_as(f"pf_tid - {computing}", producers):
            _issue(em, fl, body, "next", var)
        em.line(f"pf::cp_async_arrive(&{bars}[{_stage_of(fl, var)}]);")
    em.close()
    if fl.boxes:
        em.close()
    else:
        em.line("pf::cp_async_wait<0>();")
    em.close()
    em.open("else")
    em.line(f"pf::setmaxnreg_inc<{fl.computing_registers}>();")
    if any(op.source == "kept" for _st, _role, op, _low in _memory_operands(em, fl, body)):
        em.line("// the kept tiles, copied by the computing warps while the producer's first copies are under way")
        em.open(f"if ({extent} > 0)")
        em.line(f"[[maybe_unused]] const {em.widths.loop} {var} = 0;")
        with em.threads_as("pf_tid", computing):
            _issue(em, fl, body, "kept", var)
        em.close()
        em.line("pf::cp_async_commit();")
        em.line("pf::cp_async_wait<0>();")
        em.line("pf::fence_async_shared();")
        em.line(f"pf::named_sync({_computing_barrier(fl)}, {computing});  // (every computing warp's part of them)")
    _load_held(em, fl)
    late = _Late.declare(em, fl, body) if fl.deferred is not None else None
    turns = _Turns(fl.turns) if fl.turns else None
    if turns is not None:
        em.line(f"const int pf_wg = pf_warp / {WARPGROUP_WARPS};")

    def consume(first: bool = False) -> None:
        em.line(f"pf::mbarrier_wait(&{bars}[{_stage_of(fl, var)}], {_phase(fl, var)});")
        if not fl.boxes:  # (bulk copies write through the async proxy the products read by)
            em.line("pf::fence_async_shared();  // (the producer's copies, visible to the warpgroup products)")
        arrays = _issue(em, fl, body, "read", var)
        _iteration(em, fl, body, held, arrays, {b: None for b in fl.stmts}, late, var, first, turns)

    if late is None:
        em.open(em.loop_header(loop))
        consume()
        em.line(f"pf::mbarrier_arrive(&{bars}[{stages} + ({_stage_of(fl, var)})]);")
        em.close()
    else:
        # The first iteration on its own (no product of an earlier one), so that every later one issues, waits for
        # and folds the previous one's unconditionally (ptxas then sees every wgmma retired on every path).
        em.open(f"if ({extent} > 0)")
        em.line(f"const {em.widths.loop} {var} = 0;")
        consume(first=True)
        em.close()
        em.open(f"for ({em.widths.loop} {var} = 1; {var} < {extent}; ++{var})")
        consume()
        em.line(f"pf::mbarrier_arrive(&{bars}[{stages} + ({_stage_of(fl, f'({var} - 1)')})]);  // (read until now)")
        em.close()
        # The last iteration's late product and its statement.
        em.open(f"if ({extent} > 0)")
        em.line(f"const {em.widths.loop} pf_prev = {extent} - 1;")
        late.accumulators(em, fl, rows=False)
        if turns is not None:
            turns.wait(em)
        late.issue(em, fl, body, "pf_prev")
        if turns is not None:
            turns.give(em, last=True)
        em.line("pf::wgmma_wait<0>();")
        late.hold(em, fragments=False)
        late.fold(em, fl, held, var)
        em.close()
    _finish(em, fl, held)
    em.close()


def _bulk(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...], var: str) -> None:
    """One thread's bulk tensor copies of the iteration ``var`` names into its stage, their bytes announced on the
    stage's ``full`` mbarrier first (:attr:`FragmentLoop.boxes`)."""
    stage = _stage_of(fl, var)
    copies = [(fl.boxes[(st.block, role)], _buffer(fl, st.buffers[role], var))
              for st, role, _op, _low in _memory_operands(em, fl, body) if (st.block, role) in fl.boxes]
    em.line(f"pf::mbarrier_expect_tx(&{fl.barriers}[{stage}], {sum(box.nbytes for box, _ in copies)});")
    for box, arr in copies:
        coords = [f"static_cast<int>({em.scalar(c, {})})" for c in box.coords]
        for p in range(box.panels):
            first = coords[0] if not p else f"{coords[0]} + {p * PANEL}"
            dst = arr if not p else f"{arr} + {p * box.panel_elements}"
            em.line(f"pf::tma_load_{len(coords)}d({dst}, &{box.map.name}, {', '.join([first, *coords[1:]])}, "
                    f"&{fl.barriers}[{stage}]);")


def _stage_of(fl: FragmentLoop, var: str) -> str:
    """C text of the stage of the iteration ``var`` names."""
    return f"{var} & 1" if fl.stages == 2 else f"{var} % {fl.stages}"


def _phase(fl: FragmentLoop, var: str) -> str:
    """C text of the parity of the phase its stage completes at the iteration ``var`` names."""
    return f"({var} >> 1) & 1" if fl.stages == 2 else f"({var} / {fl.stages}) & 1"


@dataclass(frozen=True)
class _Turns:
    """The computing warpgroups issuing their products in turns (:attr:`FragmentLoop.turns`): warpgroup ``w``
    (``pf_wg``) waits at named barrier ``1 + w`` until warpgroup ``w − 1`` has issued its, and gives warpgroup
    ``w + 1`` its turn there once its own are issued.  Every warpgroup takes as many turns; the first warpgroup's
    first turn is its own and the last one gives no turn after its last, so every barrier's waits and gifts pair
    up: 256 threads each, the waiting warpgroup and the giving one."""

    count: int

    def wait(self, em: CudaEmitter, first: bool = False) -> None:
        """Wait for the warpgroup's turn (``first``: the first warpgroup's first turn is its own)."""
        em.line(f"{'if (pf_wg > 0) ' if first else ''}pf::turn_wait(1 + pf_wg, {2 * WARPGROUP_WARPS * em.warp});"
                "  // (this warpgroup's turn to issue)")

    def give(self, em: CudaEmitter, last: bool = False) -> None:
        """Give the next warpgroup its turn (``last``: the last warpgroup's last gives none)."""
        em.line(f"{f'if (pf_wg < {self.count - 1}) ' if last else ''}pf::turn_give(1 + (pf_wg + 1) % {self.count}, "
                f"{2 * WARPGROUP_WARPS * em.warp});")


@dataclass(frozen=True)
class _Late:
    """The registers of a product issued one iteration late (:class:`~.fragments.Deferred`): its A fragments
    (``fragments``), its accumulators (``acc``, per iteration), and each row part of its statement's value as the
    iteration computes it (``rows``) and as the next one reads it (``carried``).  Where the statement
    :attr:`~FragmentStmt.accumulates` (``into``), ``acc`` is the statement's own registers: each iteration writes
    the product's start there at its end (after the previous product is retired), the next one issues the
    product into them, and nothing is carried or folded."""

    stmt: TileStore
    fragments: str
    acc: str
    rows: tuple[str, ...]
    carried: tuple[str, ...]
    into: bool = False

    @staticmethod
    def declare(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...]) -> _Late:
        """Name the registers, declaring those that outlive an iteration."""
        assert fl.deferred is not None
        s = next(x for x in body if x.block == fl.deferred.block)
        st = fl.stmts[s.block]
        assert st.dot is not None and st.dot.a is not None and st.value is not None
        parts = () if st.accumulates else st.row_parts[st.value]
        acc = next(h.register for h in fl.held if h.name == s.tensor.name) if st.accumulates else em.fresh("late_fc")
        late = _Late(s, em.fresh("late_fa"), acc, tuple(em.fresh("late_row") for _ in parts),
                     tuple(em.fresh("late_kept") for _ in parts), st.accumulates)
        em.line(f"// {s.block}'s product issued one iteration late: its A fragments and row values kept until then")
        if late.into:
            em.line(f"// {s.block}'s product accumulates into its registers ({acc})")
        em.line(f"uint32_t {late.fragments}[{st.dot.a.staged.kp // 16}][4];")
        for name, x in zip(late.carried, parts, strict=True):
            em.line(f"{em.ctype(x.dtype)} {name}[2];")
        return late

    def accumulators(self, em: CudaEmitter, fl: FragmentLoop, rows: bool = True, product: bool = True) -> None:
        """Declare the product's accumulators (zero-based; ``product``) and (``rows``) the iteration's row values."""
        st = fl.stmts[self.stmt.block]
        assert st.dot is not None and st.dot.b is not None
        if product and not self.into:
            em.line(f"float {self.acc}[{st.dot.b.staged.rows_pad // 8}][4] = {{}};")
        for name, x in zip(self.rows, self.parts(fl), strict=True) if rows else ():
            em.line(f"{em.ctype(x.dtype)} {name}[2];")

    def parts(self, fl: FragmentLoop) -> tuple[Expr, ...]:
        """The row parts of the statement's value that the next iteration reads (none where it accumulates)."""
        st = fl.stmts[self.stmt.block]
        assert st.value is not None
        return () if self.into else st.row_parts[st.value]

    def hold(self, em: CudaEmitter, fragments: bool = True) -> None:
        """After the wait that retires the product: its accumulators (and A fragments) held there
        (``pf::wgmma_hold``), so that the compiler moves no read of them, or write of the next fragments, above it."""
        em.line(f"pf::wgmma_hold({self.acc});")
        if fragments:
            em.line(f"pf::wgmma_hold({self.fragments});")

    def issue(self, em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...], prev: str) -> None:
        """Issue the product of the iteration ``prev`` names (its ``b`` in that iteration's stage) into the
        accumulators, committed, not waited for."""
        st = fl.stmts[self.stmt.block]
        assert st.dot is not None and st.dot.b is not None
        sizes = em.sizes  # (printed inside another statement, whose sizes _issue must not replace)
        arrays = _issue(em, fl, body, "read", prev)
        em.sizes = sizes
        _warpgroup_issue(em, st, self.acc, None, arrays[(st.block, "b")],
                         range(st.dot.b.staged.rows_pad // st.dot.width), self.fragments, wait=False)

    def rows_here(self, em: CudaEmitter, fl: FragmentLoop, env: dict[str, str]) -> None:
        """At the statement's own place: its row parts of this iteration, into ``rows``."""
        st = fl.stmts[self.stmt.block]
        if not self.rows:
            return
        em.line(f"// {self.stmt.block}: its row values, for its statement at the end of the next iteration")
        _rows(em, st.row, fl.rows)
        for name, x in zip(self.rows, self.parts(fl), strict=True):
            em.line(f"{name}[pf_h] = {em.scalar(x, env)};")
        em.close()

    def keep(self, em: CudaEmitter, fl: FragmentLoop, env: dict[str, str]) -> None:
        """At the end of the iteration: its row values and A fragments kept for the next one."""
        st = fl.stmts[self.stmt.block]
        assert st.dot is not None and st.dot.a is not None
        e = next(n for n in walk_tile_expr(st.value) if isinstance(n, Dot))
        em.line(f"// {self.stmt.block}: this iteration's A fragments and row values, for the next one")
        for name, kept in zip(self.rows, self.carried, strict=True):
            em.line(f"{kept}[0] = {name}[0]; {kept}[1] = {name}[1];")
        _register_a_steps(em, fl, st, e, env, self.fragments)

    def start(self, em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], env: dict[str, str]) -> None:
        """Where the statement accumulates, at the end of the iteration (the previous product retired): this
        iteration's start of the product, into the statement's registers, for the next iteration to issue into."""
        st = fl.stmts[self.stmt.block]
        assert st.elementwise is not None
        em.line(f"// {self.stmt.block}: this iteration's start of its product, in its registers")
        _elements(em, fl, held, self.stmt, st, st.elementwise, env)

    def fold(self, em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], var: str) -> None:
        """The statement of the iteration ``pf_prev`` names from the product's accumulators (waited for) and
        its kept row values (its loop variable that iteration's); nothing where the product accumulated into the
        statement's registers."""
        st = fl.stmts[self.stmt.block]
        assert st.value is not None
        if self.into:
            return
        em.line(f"// {self.stmt.block} of the previous iteration")
        em.open("")
        em.line(f"[[maybe_unused]] const {em.widths.loop} {var} = pf_prev;")
        added = [x for x in st.row_parts[st.value] if x not in em.overrides]
        for x, kept in zip(st.row_parts[st.value], self.carried, strict=True):
            em.overrides.setdefault(x, f"{kept}[pf_h]")
        try:
            _statement(em, fl, held, self.stmt, {}, None, accumulators=self.acc)
        finally:
            for x in added:
                em.overrides.pop(x, None)
        em.close()


def _load_held(em: CudaEmitter, fl: FragmentLoop) -> None:
    """Declare the registers that outlive an iteration, reading those the loop keeps in memory (where its
    first iteration reads what memory holds)."""
    for h in fl.held:
        if not h.per_iteration:
            em.line(h.declaration())
        if h.loaded:
            _each(em, fl.rows, h, lambda h, env: em.line(
                f"{h.element} = {em.from_storage(em.access(em.tensors[h.name], h.index, env), dt.f32)};"))


def _iteration(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...], held: Mapping[str, Held],
               arrays: Mapping[tuple[str, str], str], waits: Mapping[str, int | None], late: _Late | None = None,
               var: str = "", first: bool = False, turns: _Turns | None = None) -> None:
    """One iteration's statements on the registers (``arrays``: the operands in shared memory).  With a product
    issued one iteration late (``late``; ``var`` the loop variable): the previous iteration's (unless ``first``)
    issued after the product it follows and its statement at the end, then this iteration's A fragments and row
    values kept for the next; with ``turns``, the products of the iteration issued in the warpgroup's turn."""
    for h in fl.held:
        if h.per_iteration:
            em.line(h.declaration())
    if late is not None:
        late.accumulators(em, fl, product=not first)
    prev = f"const {em.widths.loop} pf_prev = {var} - 1;"
    earlier = late is not None and not first  # (a product of the previous iteration to issue and fold)

    def issue_late(acc: str) -> None:
        assert late is not None
        em.open("")
        em.line(prev)
        late.issue(em, fl, body, "pf_prev")
        em.close()
        if turns is not None:
            turns.give(em)
        em.line("pf::wgmma_wait<1>();  // (this iteration's product; the late one stays in flight)")
        em.line(f"pf::wgmma_hold({acc});")

    def give_first(acc: str) -> None:
        assert turns is not None
        turns.give(em)
        em.line("pf::wgmma_wait<0>();")

    shared: list[Expr] = []
    try:
        for s in body:
            for v in fl.row_values:
                if v.before == s.block:
                    _shared_value(em, fl, held, v)
                    shared += v.nodes
            if late is not None and s is late.stmt:
                _at(em, held, s, lambda env: late.rows_here(em, fl, env))
                continue
            after = late is not None and fl.deferred is not None and s.block == fl.deferred.after
            if after and turns is not None:
                turns.wait(em, first=first)
            then = (issue_late if earlier else give_first if turns is not None else None) if after else None
            _statement(em, fl, held, s, arrays, waits.get(s.block), then=then)
        if late is not None and earlier:
            em.open("")
            if not late.into:
                em.line(prev)
            em.line("pf::wgmma_wait<0>();")
            late.hold(em)
            late.fold(em, fl, held, var)
            em.close()
        if late is not None:
            if late.into:
                _at(em, held, late.stmt, lambda env: late.start(em, fl, held, env))
            _at(em, held, late.stmt, lambda env: late.keep(em, fl, env))
    finally:
        for node in shared:
            em.overrides.pop(node, None)


def _at(em: CudaEmitter, held: Mapping[str, Held], s: TileStore, body: Callable[[dict[str, str]], None]) -> None:
    """``body(env)`` in a scope of statement ``s``: its axes' sizes and variables, its reads of held tensors from
    their registers."""
    em.sizes = axis_sizes(s)
    em.materialized = {}
    env = {a: axis_var(a) for a in em.sizes}
    em.open("")
    added = _load_overrides(em, held, [s.value, *([s.mask] if s.mask is not None else [])], env)
    try:
        body(env)
    finally:
        for node in added:
            em.overrides.pop(node, None)
    em.close()


def _computing_barrier(fl: FragmentLoop) -> int:
    """The named barrier of the computing warps alone (after the turns' barriers ``1 .. turns``)."""
    return fl.turns + 1


def _finish(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held]) -> None:
    """The epilogue's statements from the registers, and the tensors the loop keeps in memory written back."""
    if fl.staged:
        em.line(f"pf::named_sync({_computing_barrier(fl)}, {-(-fl.rows // STRIP) * em.warp});  // (every computing "
                "warp is done with the operand buffers: the staged stores reuse them)")
    for s in fl.epilogue:
        _statement(em, fl, held, s, {}, None)
    for h in fl.held:
        if h.memory:
            _each(em, fl.rows, h, lambda h, env: em.line(
                f"{em.access(em.tensors[h.name], h.index, env)} = {em.to_storage(h.element, dt.f32)};"),
                  writer=True)


def _each(em: CudaEmitter, rows: int, h: Held, body: Callable[[Held, dict[str, str]], None],
          writer: bool = False) -> None:
    """``body(h, env)`` for every element of ``h`` the thread holds (``writer``: real rows only, and one lane per
    row of a row vector)."""
    index_axes = {d: i.axis for d, i in enumerate(h.index) if isinstance(i, Slice)}
    _rows(em, index_axes[h.row_dim], rows)
    if writer and rows % STRIP:
        em.open(f"if (pf_m < {rows})")
    if h.col_dim is not None:
        _cols(em, index_axes[h.col_dim], h.cols)
        body(h, {index_axes[h.row_dim]: axis_var(index_axes[h.row_dim]),
                 index_axes[h.col_dim]: axis_var(index_axes[h.col_dim])})
        em.close()
        em.close()
    else:
        em.open("if (pf_lane % 4 == 0)" if writer else "")
        body(h, {index_axes[h.row_dim]: axis_var(index_axes[h.row_dim])})
        em.close()
    if writer and rows % STRIP:
        em.close()
    em.close()


def _rows(em: CudaEmitter, axis: str, rows: int) -> None:
    """Open the loop over the thread's two rows (``pf_h``; ``pf_m`` the row), binding ``axis`` to the row.  Past
    ``rows`` (the last strip's padding) the axis is the last row: those registers compute a copy of it, read
    nothing out of bounds and are never written back."""
    em.line("#pragma unroll")
    em.open("for (int pf_h = 0; pf_h < 2; ++pf_h)")
    em.line(f"const int pf_m = pf_warp * {STRIP} + {M16N8.row('pf_lane', 'pf_h')};")
    row = "pf_m" if rows % STRIP == 0 else f"(pf_m < {rows} ? pf_m : {rows - 1})"
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(axis)} = {row};")


def _cols(em: CudaEmitter, axis: str, size: int, first: int = 0) -> None:
    """Open the loops over the thread's columns of a ``size``-wide tile (``pf_nb``, ``pf_j``; register ``pf_q``),
    binding ``axis`` to the column (``first``: of the ``size`` columns from 8-column tile ``first`` on)."""
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = {first}; pf_nb < {first + size // 8}; ++pf_nb)")
    em.line("#pragma unroll")
    em.open("for (int pf_j = 0; pf_j < 2; ++pf_j)")
    em.line("[[maybe_unused]] const int pf_q = pf_h * 2 + pf_j;")
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(axis)} = pf_nb * 8 + {M16N8.col('pf_lane', 'pf_j')};")


def _buffer(fl: FragmentLoop, name: str, var: str) -> str:
    """C text of a staging buffer's part for the iteration ``var`` names (with prefetch, one per stage)."""
    if not fl.prefetch:
        return name
    part = dict(fl.buffers)[name] // 2 // fl.stages  # 16-bit elements of one stage
    return f"({name} + ({_stage_of(fl, var)}) * {part})"


def _issue(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...], mode: str, var: str
           ) -> dict[tuple[str, str], str]:
    """With prefetch: the copies of the iteration whose loop variable ``var`` is in scope (``first``: before the
    loop, kept tiles too; ``next``: the next iteration's; ``kept``: the kept tiles only) or (``read``) only the
    arrays this iteration's products read.  Returns each memory operand's array by (block, role)."""
    arrays: dict[tuple[str, str], str] = {}
    for st, role, op, low in _memory_operands(em, fl, body):
        if op.source == "panels":
            arrays[(st.block, role)] = _panels(em, op, _buffer(fl, op.buffer or "", var))
            continue
        if op.source == "kept":
            assert op.buffer is not None
            arrays[(st.block, role)] = op.buffer
            if mode in ("first", "kept"):
                copy_async(em, op.staged, low, op.buffer)
            continue
        arr = _buffer(fl, st.buffers[role], var)
        arrays[(st.block, role)] = arr
        if mode in ("first", "next"):
            _stage(em, op, low, arr)
    return arrays


def _memory_operands(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...]):
    """(statement plan, role, operand plan, 16-bit type) of every product operand that comes from memory, in
    order, with the emitter's axis sizes set to its statement's."""
    for s in body:
        st = fl.stmts[s.block]
        if st.dot is None:
            continue
        em.sizes = axis_sizes(s)
        low = st.dot.low
        assert low is not None
        for role, op in (("a", st.dot.a), ("b", st.dot.b)):
            assert op is not None
            if op.source != "registers":
                yield st, role, op, low


def _panels(em: CudaEmitter, op: OperandPlan, tile: str) -> str:
    """C text of where an operand read from the panels of another's ``tile`` starts (:attr:`OperandPlan.offset`)."""
    assert op.offset is not None
    return f"({tile} + {em.scalar(op.offset, {})})"


def _stage(em: CudaEmitter, op: OperandPlan, low: DType, arr: str) -> None:
    """Copy or convert operand ``op`` into ``arr`` (cp.async where raw, else through registers)."""
    if op.source == "cp.async":
        for part, offset in op.parts:
            copy_async(em, part, low, f"({arr} + {offset})" if offset else arr)
    elif not (op.source == "raw" and stage_raw(em, op.staged, low, arr)) and not stage_vector(
            em, op.staged, LOW[low.name], arr):
        stage_elements(em, op.staged, LOW[low.name], arr)


def _issue_each(em: CudaEmitter, fl: FragmentLoop, body: tuple[TileStore, ...]
                ) -> tuple[dict[tuple[str, str], str], dict[str, int]]:
    """Without prefetch: stage every memory operand of the iteration's products, in order, at its top (the
    cp.async copies of each product one group).  Returns each operand's array by (block, role), and by block
    the number of copy groups committed at every iteration after the product's own: what its wait may leave in
    flight (a tile kept from the first iteration commits only then, so it is not counted: waiting for fewer is
    safe)."""
    arrays: dict[tuple[str, str], str] = {}
    groups: list[tuple[str, int]] = []
    for block, operands in itertools.groupby(_memory_operands(em, fl, body), key=lambda x: x[0].block):
        count, own_async = 0, False
        for st, role, op, low in operands:
            if op.source == "panels":
                arr = _panels(em, op, op.buffer or "")  # (copied, and waited for, with its holder's tile)
            elif op.source in ("kept", "held"):
                arr = em.fresh(f"t{role}")
                consume(em, op, low, arr)  # (a kept tile commits its own group)
                count += int(op.source == "kept" and op.every_iteration)
            else:
                arr = st.buffers[role]
                _stage(em, op, low, arr)
                own_async = own_async or op.source == "cp.async"
            arrays[(block, role)] = arr
        if own_async:
            em.line("pf::cp_async_commit();")
            count += 1
        groups.append((block, count))
    waits: dict[str, int] = {}
    later = 0
    for block, count in reversed(groups):
        waits[block] = later
        later += count
    return arrays, waits


def _statement(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], s: TileStore,
               arrays: Mapping[tuple[str, str], str], wait: int | None, then: Callable[[str], None] | None = None,
               accumulators: str | None = None) -> None:
    """Statement ``s`` on the thread's fragment elements: into its registers, or (the epilogue) into memory
    for the real rows.  ``wait``: copy groups its product may leave in flight before its barrier (None: the
    iteration's copies have been waited for); ``then``: printed after its warpgroup product is committed,
    instead of the wait for it; ``accumulators``: its product's, already issued and waited for."""
    st = fl.stmts[s.block]
    em.sizes = axis_sizes(s)
    em.materialized = {}
    em.line(f"// {s.block}")
    em.open("")
    env = {a: axis_var(a) for a in em.sizes}
    added: list[Expr] = []

    def override(node: Expr, text: str) -> None:
        em.overrides[node] = text
        added.append(node)

    value_expr = st.value if st.value is not None else s.value
    exprs = [value_expr, *([s.mask] if s.mask is not None else [])]
    added += _load_overrides(em, held, exprs, env)
    try:
        for r in reductions(exprs):
            # The thread's columns in fl.chains independent partials (column tiles in turn), combined in a tree,
            # then the four lanes of the row by shuffles: short dependency chains.  (A reduction's order is
            # free: max and min are exact, f32 sums are within the tolerance's term for any order.)
            name, ct = em.fresh("fr"), em.reduce_type(r)
            em.line(f"{ct} {name}[2];")
            _rows(em, st.row, fl.rows)
            for x in st.row_parts[r.tile]:
                part = em.fresh("row")
                em.line(f"[[maybe_unused]] const {em.ctype(x.dtype)} {part} = {em.scalar(x, env)};")
                override(x, part)
            acc = em.fresh("acc")
            chains = min(fl.chains, 2 * (em.sizes[r.axis] // 8))
            em.line(f"{ct} {acc}[{chains}];")
            em.line("#pragma unroll")
            em.line(f"for (int pf_c = 0; pf_c < {chains}; ++pf_c) {acc}[pf_c] = {_REDUCE_INIT[r.op]};")
            _cols(em, r.axis, em.sizes[r.axis])
            at = f"{acc}[(pf_nb * 2 + pf_j) % {chains}]"
            em.line(f"{at} = {em.combine(r.op, at, em.scalar(r.tile, env), ct)};")
            em.close()
            em.close()
            step = chains // 2
            while step:
                em.line("#pragma unroll")
                em.line(f"for (int pf_c = 0; pf_c < {step}; ++pf_c) "
                        f"{acc}[pf_c] = {em.combine(r.op, f'{acc}[pf_c]', f'{acc}[pf_c + {step}]', ct)};")
                step //= 2
            em.line(f"{ct} {acc}_row = {acc}[0];")
            em.shuffle_combine(r.op, f"{acc}_row", ct, 4)  # the four lanes of the row
            em.line(f"{name}[pf_h] = {em.reduce_result(r, f'{acc}_row')};")
            em.close()
            override(r, f"{name}[pf_h]")
        if st.dot is None:
            _all_elements(em, fl, held, s, st, value_expr, env)
            if (plan := fl.staged.get(s.block)) is not None:
                _copy_out(em, fl, s, st, plan, env)
        elif st.accumulates:
            # The product's start into the statement's registers, then the product accumulating into them.
            assert isinstance(value_expr, Dot) and st.elementwise is not None
            em.line(f"// {s.block}'s product accumulates into its registers, its start written there first")
            _elements(em, fl, held, s, st, st.elementwise, env)
            _product(em, fl, st, value_expr, env, arrays, wait, then, into=held[s.tensor.name].register)
        else:
            e = next(n for n in walk_tile_expr(value_expr) if isinstance(n, Dot))
            acc = accumulators or _product(em, fl, st, e, env, arrays, wait, then)
            added_to = None if is_zero(e.acc) else em.scalar(e.acc, env)  # (acc from +0)
            # A folded product: each chunk's products, then the statement at its columns (reading them from the
            # chunk's accumulators), before the next chunk's products reuse those.
            chunks: list[int | None] = ([*range(st.dot.b.staged.rows_pad // st.dot.width)]
                                        if st.dot.fold and st.dot.b is not None else [None])
            for c in chunks:
                cols = None
                if c is not None:
                    _chunk(em, st, acc, arrays, c)
                    cols = (c * st.dot.width // 8, st.dot.width)
                total = f"{acc}[pf_nb{f' - {cols[0]}' if cols and cols[0] else ''}][pf_q]"
                override(e, total if added_to is None else em.rounded(f"({added_to} + {total})", e.dtype))
                _all_elements(em, fl, held, s, st, value_expr, env, cols)
    finally:
        for node in added:
            em.overrides.pop(node, None)
    em.close()


def _all_elements(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], s: TileStore, st: FragmentStmt,
                  value_expr: Expr, env: dict[str, str], cols: tuple[int, int] | None = None) -> None:
    """The elementwise pass of statement ``s`` (``cols``: only the columns of tiles ``first ..`` of ``size``
    columns), without its masks where no element of this iteration's tile is masked (the main part of a causal or
    windowed loop, a tile away from a ragged edge)."""
    if st.unmasked is not None:
        em.open(f"if ({em.scalar(st.unmasked[0], {})})")
        _elements(em, fl, held, s, st, st.unmasked[1], env, cols)
        em.close()
        em.open("else")
    _elements(em, fl, held, s, st, value_expr, env, cols)
    if st.unmasked is not None:
        em.close()


def _elements(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], s: TileStore, st: FragmentStmt,
              value_expr: Expr, env: dict[str, str], cols: tuple[int, int] | None = None) -> None:
    """The elementwise pass of statement ``s``: ``value_expr`` at every element the thread holds (``cols``: of
    the column tiles ``first ..`` of ``size`` columns), into its registers or (the epilogue) into memory for the
    real rows."""
    target = held.get(s.tensor.name)
    _rows(em, st.row, fl.rows)
    if target is None and fl.rows % STRIP:
        em.open(f"if (pf_m < {fl.rows})")  # (the padding rows' registers are copies of the last row)
    parts: list[Expr] = []
    inverses: list[Expr] = []
    if st.col is not None:
        for x in st.row_parts[value_expr]:
            name = em.fresh("row")
            em.line(f"[[maybe_unused]] const {em.ctype(x.dtype)} {name} = {em.scalar(x, env)};")
            if x not in em.overrides:
                em.overrides[x] = name
                parts.append(x)
        for d in fl.divisions:  # (an epilogue's division by a value of the row, by its reciprocal)
            if d.chosen and d.block == s.block and d.divisor not in em.inverses:
                reg = em.fresh("rcp")
                em.line(f"const float {reg} = pf::rcp_rz({em.scalar(d.divisor, env)});")
                em.inverses[d.divisor] = reg
                inverses.append(d.divisor)
        _cols(em, st.col, *((cols[1], cols[0]) if cols else (em.sizes[st.col],)))
    if target is not None:
        value = em.convert(em.scalar(value_expr, env), value_expr.dtype, dt.f32)
        if s.mask is not None:
            value = f"({em.scalar(s.mask, env)}) ? {value} : {target.element}"
        em.line(f"{target.element} = {value};")
    elif (plan := fl.staged.get(s.block)) is not None:
        value = em.to_storage(em.stored_value(s, env), s.tensor.dtype)  # (an epilogue's value_expr is s.value)
        assert st.col is not None
        at = f"reinterpret_cast<{em.stype(s.tensor.dtype)}*>({plan.buffer})[pf_m * {plan.pitch} + {axis_var(st.col)}]"
        em.line(f"if ({em.scalar(s.mask, env)}) {at} = {value};" if s.mask is not None else f"{at} = {value};")
    else:
        em.assign(s, env)
    if st.col is not None:
        em.close()
        em.close()
    if target is None and fl.rows % STRIP:
        em.close()
    em.close()
    for x in parts:  # (their variables are out of scope now)
        del em.overrides[x]
    for d in inverses:
        del em.inverses[d]


def _copy_out(em: CudaEmitter, fl: FragmentLoop, s: TileStore, st: FragmentStmt, plan: StagedStore,
              env: dict[str, str]) -> None:
    """The warp's rows of staged statement ``s`` copied from shared memory to ``s``'s tensor, 16 bytes per lane
    (:func:`~polyfuse.emit_cpp.fragments.staged_store`): the real rows, where the mask holds."""
    assert st.col is not None
    chunks = em.sizes[st.col] // plan.vec
    piece = CHUNK_TYPES[VECTOR_BYTES]
    em.line("__syncwarp();  // (the warp's rows are staged)")
    em.line("#pragma unroll")
    em.open(f"for (int pf_v = pf_lane; pf_v < {STRIP * chunks}; pf_v += {em.warp})")
    em.line(f"const int pf_m = pf_warp * {STRIP} + pf_v / {chunks};")
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(st.row)} = pf_m;")
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(st.col)} = pf_v % {chunks} * {plan.vec};")
    tests = [f"pf_m < {fl.rows}"] if fl.rows % STRIP else []
    if s.mask is not None:
        tests.append(f"({em.scalar(s.mask, env)})")
    stype = em.stype(s.tensor.dtype)
    src = (f"*reinterpret_cast<const {piece}*>(reinterpret_cast<const {stype}*>({plan.buffer}) + pf_m * {plan.pitch}"
           f" + {axis_var(st.col)})")
    copy = f"*reinterpret_cast<{piece}*>(&{em.access(s.tensor, s.index, env)}) = {src};"
    em.line(f"if ({' && '.join(tests)}) {copy}" if tests else copy)
    em.close()


def _shared_value(em: CudaEmitter, fl: FragmentLoop, held: Mapping[str, Held], v: SharedValue) -> None:
    """Compute shared value ``v`` into its registers; statements read it from there (an override)."""
    if any(r.register == v.register for r in fl.reciprocals):
        em.line(f"// the reciprocal of a divisor, once per row (the plan's range fact): {v.register}")
    else:
        em.line(f"// computed once for the statements that use it: {v.register}")
    em.line(f"float {v.register}{f'[{v.cols // 8}][4]' if v.col is not None else '[2]'};")
    node = v.nodes[0]
    env = {a: axis_var(a) for a in axes_of(node)}
    added = _load_overrides(em, held, [node], env)
    try:
        _rows(em, v.row, fl.rows)
        if v.col is not None:
            _cols(em, v.col, v.cols)
        element = f"{v.register}[pf_nb][pf_q]" if v.col is not None else f"{v.register}[pf_h]"
        em.line(f"{element} = {em.convert(em.scalar(node, env), node.dtype, dt.f32)};")
        if v.col is not None:
            em.close()
            em.close()
        em.close()
    finally:
        for node in added:
            em.overrides.pop(node, None)
    for n in v.nodes:
        em.overrides[n] = element


def _load_overrides(em: CudaEmitter, held: Mapping[str, Held], exprs: list[Expr], env: dict[str, str]) -> list[Expr]:
    """Make every load of a held tensor in ``exprs`` read its register (masked loads: under the mask, else
    ``other``); returns the nodes overridden."""
    added: list[Expr] = []
    for x in exprs:
        for n in walk_tile_expr(x):
            if isinstance(n, TileLoad) and n.tensor.name in held and n not in em.overrides:
                element = held[n.tensor.name].element
                if n.mask is not None:
                    other = em.literal(n.other.value if n.other is not None else 0, n.tensor.dtype)
                    element = f"({em.scalar(n.mask, env)} ? {element} : {other})"
                em.overrides[n] = element
                added.append(n)
    return added


def _product(em: CudaEmitter, fl: FragmentLoop, st: FragmentStmt, e: Dot, env: dict[str, str],
             arrays: Mapping[tuple[str, str], str], wait: int | None, then: Callable[[str], None] | None = None,
             into: str | None = None) -> str:
    """The accumulators of the statement's product (zero-based, ``float name[ntiles][4]``; ``into``: the
    statement's registers, where it :attr:`~FragmentStmt.accumulates`); returns the name.  ``then``: a warpgroup
    product's, printed after its commit instead of the wait (:func:`_warpgroup_issue`)."""
    plan = st.dot
    assert plan is not None and plan.a is not None and plan.b is not None and plan.low is not None
    low = LOW[plan.low.name]
    a, b = plan.a.staged, plan.b.staged
    ntiles = (plan.width if plan.fold else b.rows_pad) // 8
    if into is not None:  # (the statement's registers, which hold the product's start)
        acc = into
    else:
        acc = em.fresh("fc")
        em.line(f"float {acc}[{ntiles}][4]{'' if plan.fold else ' = {}'};")
    split = a.split
    if not st.a_registers:
        sa = arrays[(st.block, "a")]
    sb = arrays[(st.block, "b")]
    if wait is not None:
        em.line(f"pf::cp_async_wait<{wait}>();")
        if plan.instruction == WGMMA:
            em.line("pf::fence_async_shared();")
        em.barrier()
    if plan.instruction == WGMMA:
        _warpgroup_product(em, fl, st, e, env, acc, None if st.a_registers else sa, sb, then)
        return acc
    em.line("#pragma unroll")
    em.open(f"for (int pf_ks = 0; pf_ks < {a.kp // 16}; ++pf_ks)")
    if st.a_registers:
        em.line("uint32_t pf_fa[4];")
        if split:
            em.line("uint32_t pf_fa_lo[4];")
        _register_a(em, fl, st, e, env, "pf_fa", "pf_fa_lo" if split else None)
    else:
        fa = LdmatrixFragment("a", a.trans)
        at = fa.address("pf_lane", "pf_warp", "pf_ks * 16", a.stride)
        for name, offset in (("pf_fa", ""), ("pf_fa_lo", f"{a.size} + ")) if split else (("pf_fa", ""),):
            em.line(f"uint32_t {name}[4];")
            em.line(f"{fa.instruction}({name}, &{sa}[{offset}{at}]);")
    fb = LdmatrixFragment("b", b.trans, plan.pair)
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {ntiles}; pf_nb += {plan.pair})")
    at = fb.address("pf_lane", "pf_nb", "pf_ks * 16", b.stride)
    parts = (("pf_fb", ""), ("pf_fb_lo", f"{b.size} + ")) if b.split else (("pf_fb", ""),)
    for name, offset in parts:
        em.line(f"uint32_t {name}[{fb.registers}];")
        em.line(f"{fb.instruction}({name}, &{sb}[{offset}{at}]);")
        for j in range(plan.pair if plan.pair > 1 else 0):  # (one ldmatrix.x4: two tiles' fragments)
            em.line(f"const uint32_t {name}_{j}[2] = {{{name}[{2 * j}], {name}[{2 * j + 1}]}};")
    products = [("pf_fa", "pf_fb"), *((("pf_fa_lo", "pf_fb"),) if split else ()),
                *((("pf_fa", "pf_fb_lo"),) if b.split else ())]
    for fa_name, fb_name in products:
        for j in range(plan.pair):
            operand = f"{fb_name}" if plan.pair == 1 else f"{fb_name}_{j}"
            em.line(f"pf::mma_{low}({acc}[pf_nb{f' + {j}' if j else ''}], {fa_name}, {operand});")
    em.close()
    em.close()
    return acc


def _register_a(em: CudaEmitter, fl: FragmentLoop, st: FragmentStmt, e: Dot, env: dict[str, str], fa: str,
                fa_lo: str | None) -> None:
    """The A fragment of k step ``pf_ks`` of a product whose ``a`` is computed from registers, into the four
    registers ``fa`` (and the lo parts into ``fa_lo`` where split).

    a's values of the step (two 8-column tiles of the registers' columns) are computed here, so that only one
    step's are live, then packed in pairs: registers 0-3 are (row g, k 2t..), (g + 8, 2t..), (g, 2t + 8..),
    (g + 8, 2t + 8..), the accumulator layout of tiles 2·step and 2·step + 1 (per warp, the same for
    ``mma.sync`` and for the four warps of a warpgroup product)."""
    plan = st.dot
    assert plan is not None and plan.a is not None and plan.low is not None
    low = LOW[plan.low.name]
    a = plan.a.staged
    values = em.fresh("fa")
    em.line(f"float {values}[2][4];  // a = {a.rows}x{a.kk} from registers, k {16} columns of this step")
    _rows(em, st.row, fl.rows)
    em.line("#pragma unroll")
    em.open("for (int pf_t = 0; pf_t < 2; ++pf_t)")
    em.line("#pragma unroll")
    em.open("for (int pf_j = 0; pf_j < 2; ++pf_j)")
    em.line("[[maybe_unused]] const int pf_nb = 2 * pf_ks + pf_t, pf_q = pf_h * 2 + pf_j;")
    em.line(f"[[maybe_unused]] const {em.widths.tile} {axis_var(e.axis)} = pf_nb * 8 + "
            f"{M16N8.col('pf_lane', 'pf_j')};")
    em.line(f"{values}[pf_t][pf_q] = {em.convert(em.scalar(e.a, env), e.a.dtype, dt.f32)};")
    em.close()
    em.close()
    em.close()
    for r, (nb, q) in enumerate(((0, 0), (0, 2), (1, 0), (1, 2))):
        pair = [f"{values}[{nb}][{q + j}]" for j in (0, 1)]
        em.line(f"{fa}[{r}] = pf::pack_{low}({pair[0]}, {pair[1]});")
        if fa_lo is not None:
            rest = [f"pf::split_rest({p}, pf::round_{low}({p}))" for p in pair]
            em.line(f"{fa_lo}[{r}] = pf::pack_{low}({rest[0]}, {rest[1]});")


def _register_a_steps(em: CudaEmitter, fl: FragmentLoop, st: FragmentStmt, e: Dot, env: dict[str, str],
                      fragments: str) -> None:
    """Every k step's A fragment of a warpgroup product whose ``a`` is computed from registers, into
    ``fragments[steps][4]`` (all of them before the product: a wgmma reads its register operands asynchronously)."""
    assert st.dot is not None and st.dot.a is not None
    em.line("#pragma unroll")
    em.open(f"for (int pf_ks = 0; pf_ks < {st.dot.a.staged.kp // 16}; ++pf_ks)")
    _register_a(em, fl, st, e, env, f"{fragments}[pf_ks]", None)
    em.close()


def _warpgroup_product(em: CudaEmitter, fl: FragmentLoop, st: FragmentStmt, e: Dot, env: dict[str, str],
                       acc: str, sa: str | None, sb: str, then: Callable[[str], None] | None = None) -> None:
    """The statement's product as warpgroup products into ``acc``: warpgroup ``pf_warp / 4`` multiplies its 64
    rows of ``a`` (from swizzled ``sa``, or from registers where ``sa`` is None) by each chunk ``c`` of ``W``
    columns of ``b`` (swizzled ``sb``; ``W`` the plan's width) into tiles ``(W / 8)·c ..`` of ``acc``, one
    ``wgmma.m64nWk16`` per chunk and k step.  A chunk of an N-major ``b`` spans ``W / 64`` panels, the
    descriptor's leading byte offset apart.

    A wgmma reads its register operands asynchronously: every A fragment is computed before the fence that
    precedes the first product, and the accumulators are read after the wait for all of them.  A folded product
    (:attr:`DotPlan.fold`) only gets its A fragments here: its statement issues it chunk by chunk
    (:func:`_chunk`)."""
    plan = st.dot
    assert plan is not None and plan.a is not None and plan.b is not None and plan.low is not None
    a, b = plan.a.staged, plan.b.staged
    steps = a.kp // 16
    if sa is None:
        em.line(f"uint32_t pf_fa[{steps}][4];  // every k step's A fragment, before the fence")
        _register_a_steps(em, fl, st, e, env, "pf_fa")
    if not plan.fold:
        _warpgroup_issue(em, st, acc, sa, sb, range(b.rows_pad // plan.width), then=then)


def _chunk(em: CudaEmitter, st: FragmentStmt, acc: str, arrays: Mapping[tuple[str, str], str], c: int) -> None:
    """Chunk ``c`` of a folded warpgroup product (:attr:`DotPlan.fold`): its ``width`` columns into ``acc``."""
    _warpgroup_issue(em, st, acc, None if st.a_registers else arrays[(st.block, "a")], arrays[(st.block, "b")],
                     range(c, c + 1))


def _warpgroup_issue(em: CudaEmitter, st: FragmentStmt, acc: str, sa: str | None, sb: str, chunks: range,
                     fa: str = "pf_fa", wait: bool = True, then: Callable[[str], None] | None = None) -> None:
    """The warpgroup products of ``chunks`` of ``b`` (from tile ``(W / 8)·(c − first)`` of ``acc``; ``a`` from
    ``sa``, else the A fragments ``fa``), every k step, committed, and the wait for them (``then``: printed
    instead; ``wait`` off: none).  The first k step starts from zero, unless the statement
    :attr:`~FragmentStmt.accumulates` (``acc`` its registers, holding the product's start)."""
    plan = st.dot
    assert plan is not None and plan.a is not None and plan.b is not None and plan.low is not None
    a, b = plan.a.staged, plan.b.staged
    steps = a.kp // 16
    width = plan.width
    name = f"pf::wgmma_m64n{width}k16_{LOW[plan.low.name]}"
    accumulate = "true" if st.accumulates else "pf_ks > 0"
    # Each operand's descriptor is built once; a k step or chunk adds its byte offset to the start address field
    # (pf::wgmma_desc_plus): one integer add per product instead of rebuilding every field.
    size = plan.low.bits // 8
    panels = width // PANEL
    da = em.fresh("da")
    if sa is not None:
        em.line(f"const uint64_t {da} = pf::wgmma_desc_k128({sa} + pf::warp_uniform(pf_warp / 4) * "
                f"{WARPGROUP_ROWS * PANEL});")
    db = em.fresh("db")
    lbo = f", {b.outer_pad * PANEL * size}" if b.trans and panels > 1 else ""
    em.line(f"const uint64_t {db} = pf::wgmma_desc_k128({sb}{lbo});")
    em.line("pf::wgmma_fence();")
    em.line("#pragma unroll")
    em.open(f"for (int pf_ks = 0; pf_ks < {steps}; ++pf_ks)")
    # Byte offsets (k steps of 16 columns: 32 bytes along a K-major panel's rows, 16 rows of an N-major one).
    k_major = "(pf_ks / 4) * {panel} + (pf_ks % 4) * " + str(16 * size)
    desc_a = f"pf::wgmma_desc_plus({da}, {k_major.format(panel=a.outer_pad * PANEL * size)})"
    for c in chunks:
        if b.trans:
            at = f"{c * panels * b.outer_pad * PANEL * size} + pf_ks * {16 * PANEL * size}"
        else:
            at = k_major.format(panel=b.outer_pad * PANEL * size) + (f" + {c * width * PANEL * size}" if c else "")
        desc_b = f"pf::wgmma_desc_plus({db}, {at})"
        template = f"<{int(b.trans)}, {c - chunks.start}>"
        if sa is None:
            em.line(f"{name}_rs{template}({acc}, {fa}[pf_ks], {desc_b}, {accumulate});")
        else:
            em.line(f"{name}{template}({acc}, {desc_a}, {desc_b}, {accumulate});")
    em.close()
    em.line("pf::wgmma_commit();")
    if then is not None:
        then(acc)
    elif wait:
        em.line("pf::wgmma_wait<0>();")
