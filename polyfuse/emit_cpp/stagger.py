"""Loops that every block runs over the same tiles start at a step of each block's own (CUDA, HIP).

A kernel whose blocks each fold a product over the same operand tiles — every row block of moe_routing's
gate multiplies its rows by the same tiles of ``w``, one hidden step after another — has all its blocks ask
the L2 for the same lines at the same moment, so the few slices holding them serve every SM in turn.  Where
the loop is a commutative fold over its steps, the order of the steps is free: block ``b`` runs step
``(t + b) mod n`` at its ``t``-th iteration, and the blocks' reads spread over all the tiles.

A loop qualifies (:func:`plan`) where its body is tile statements only and each statement either writes a
tensor the loop allocates per iteration, or folds its own element: ``select(v == 0, init, own) ⊕ term`` with
``⊕`` one of ``+``, ``max``, ``min`` (``own``: a load of the element it writes, ``init`` free of the loop's
variable), or a store with a reducer; no statement but those ``own`` loads reads a tensor the loop carries
across iterations (a rolling update, which reads its running statistics, keeps its order), every ``v == 0``
test of the body is a fold's first-iteration test (printed as the first iteration of the rotated loop), and
some tile the body reads moves with the step but not with the block (else there is nothing to spread).  Operand
tiles the loop keeps (:mod:`~polyfuse.emit_cpp.stream`) are copied for the step an iteration runs and alternate
halves by the iteration's number, not the step's.  And the tensors every block
reads must fit in a quarter of the device's L2 (``L2_SHARE``): blocks at different steps then still find them
there, where a weight larger than the L2 read in step by all blocks at once is fetched from memory about once
but read at staggered steps would be fetched once per block.

Exactness: ``max`` and ``min`` folds give the same value in any order; a sum of ``n`` terms is rounded
differently in another order but within the same bound (every term's rounding error is bounded by the same
sum of magnitudes whatever the order), which is the bound the tolerance notes use for sums.  Measured:
``benchmarks/results/2026-11-29_H200_9c2f76e_stagger``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polyfuse.device import DeviceSpec
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.ir.expr import BinOp, Const, Expr, Select, Var
from polyfuse.ir.visit import free_vars
from polyfuse.ir.stmt import Loop, Seq
from polyfuse.tiling.htile import Gather, Slice, TileLoad, TileStore, walk_tile_expr
from polyfuse.tiling.parallel import allocated_at

FOLDS = ("+", "max", "min")
"""Binary operators of a fold whose steps may run in any order."""
REDUCERS = ("sum", "prod", "max", "min")
L2_SHARE = 4
"""The tensors every block reads may take at most ``1 / L2_SHARE`` of the L2 (the rest for the streamed ones)."""


@dataclass(frozen=True)
class Stagger:
    """Loop ``var`` < ``extent`` runs its steps from ``(blockIdx.x mod extent)`` on: ``first`` are its
    first-iteration tests (``var == 0`` as its statements hold them), ``shared`` the tensors every block reads
    at the same step."""

    var: str
    extent: Expr
    first: tuple[Expr, ...]
    shared: tuple[str, ...]

    @property
    def counter(self) -> str:
        """The C variable counting the iterations (the loop's variable is the step an iteration runs)."""
        return f"pf_step_{self.var}"

    def step(self, iteration: str, extent: str, t: str) -> str:
        """C text of the step iteration ``iteration`` runs (``extent``: the loop's trip count as C text, ``t`` its
        integer type)."""
        return f"({iteration} + static_cast<{t}>(blockIdx.x % {extent})) % {extent}"

    def describe(self) -> str:
        return (f"staggered: block b runs step ({self.counter} + b) mod {self.extent} ({', '.join(self.shared)} "
                f"read by every block at the same step; the steps fold commutatively)")


def _is_first(e: Expr, var: str) -> bool:
    """Whether ``e`` is the test ``var == 0``."""
    return (isinstance(e, BinOp) and e.op == "==" and isinstance(e.a, Var) and e.a.name == var
            and isinstance(e.b, Const) and e.b.value == 0)


def _stores(body) -> list[TileStore] | None:
    parts = body.stmts if isinstance(body, Seq) else (body,)
    if not all(isinstance(s, TileStore) for s in parts):
        return None
    return list(parts)


def _index_vars(index) -> set[str]:
    names: set[str] = set()
    for i in index:
        x = i.start if isinstance(i, Slice) else i.index if isinstance(i, Gather) else i
        names |= {n.name for n in walk_tile_expr(x) if isinstance(n, Var)}
    return names


def _nbytes(load: TileLoad) -> int | None:
    """The bytes of the tensor ``load`` reads; None where its shape is symbolic."""
    shape = load.tensor.shape
    if not all(isinstance(d, Const) for d in shape):
        return None
    return math.prod(int(d.value) for d in shape) * max(1, load.tensor.dtype.bits // 8)


def _own_select(x: Expr, s: TileStore, var: str) -> Select | None:
    """``x`` as ``select(var == 0, init, own)`` of statement ``s``, else None."""
    if not (isinstance(x, Select) and _is_first(x.cond, var)):
        return None
    own = x.false_value
    if not (isinstance(own, TileLoad) and own.tensor.name == s.tensor.name and own.index == s.index
            and own.mask is None):
        return None
    if any(isinstance(n, Var) and n.name == var for n in walk_tile_expr(x.true_value)):
        return None
    return x


def plan(loop: Loop, grid: frozenset[str], device: DeviceSpec, options: CodegenOptions) -> Stagger | None:
    """The stagger of ``loop`` (a loop of a block whose grid variables are ``grid``) on ``device``, or None where
    the options say no or it does not qualify (the module docstring)."""
    var = loop.var.name
    if (not options.stagger_loops or not device.l2_bytes
            or (isinstance(loop.extent, Const) and int(loop.extent.value) < 2)):
        return None
    stores = _stores(loop.body)
    if not stores:
        return None
    allocated = set(allocated_at(loop))
    carried = {s.tensor.name for s in stores if s.tensor.name not in allocated}
    first: list[Expr] = []
    shared: dict[str, TileLoad] = {}
    for s in stores:
        exprs = [s.value] + ([s.mask] if s.mask is not None else [])
        owns: list[Expr] = []
        if s.tensor.name in carried:
            if s.mask is not None and var in free_vars(s.mask):
                return None
            if s.reducer is not None:
                if s.reducer not in REDUCERS:
                    return None
            else:
                v = s.value
                if not (isinstance(v, BinOp) and v.op in FOLDS):
                    return None
                own = _own_select(v.a, s, var)
                if own is None:
                    own = _own_select(v.b, s, var)
                if own is None:
                    return None
                owns, first = [own.false_value], [*first, own.cond]
        tests = [n for x in exprs for n in walk_tile_expr(x) if _is_first(n, var)]
        if len(tests) != len(owns):
            return None  # a first-iteration test that is not a fold's
        reads = [n for x in exprs for n in walk_tile_expr(x) if isinstance(n, TileLoad)]
        if any(n.tensor.name in carried and not any(n is o for o in owns) for n in reads):
            return None
        for n in reads:
            names = _index_vars(n.index)
            if var in names and not names & grid:
                shared[n.tensor.name] = n
    if not shared:
        return None
    total = 0
    for n in shared.values():
        nbytes = _nbytes(n)
        if nbytes is None:
            return None
        total += nbytes
    if total * L2_SHARE > device.l2_bytes:
        return None
    return Stagger(var, loop.extent, tuple(first), tuple(sorted(shared)))
