"""Empty reductions: a reduction over zero elements is its ``init``, also when a loop runs zero times.

A reduction block writes its init at its first reduce instance (``first`` in the interpreters, the
select on the first tile in :mod:`polyfuse.tiling.translate`).  When a size is 0 at run time the
loop over the reduced axis runs zero times, so there is no first instance and the output would keep
whatever it held (NaN in the interpreters, which prefill).  The program means ``init ⊕ (nothing)``:
an empty sum is its init (0 by default), an empty max its identity ``-inf``.

:func:`init_empty_reductions` makes that explicit, once, for every consumer of loop programs
(:func:`polyfuse.ir.interpret` and :func:`polyfuse.tiling.to_tiles`, hence every backend).  After
each loop ``L`` that may run zero times it adds, for every reduction block ``B`` inside ``L`` whose
reduce bindings use ``L``'s variable and whose spatial bindings do not, a spatial block that
stores ``B``'s init (as at its first reduce instance) on ``B``'s spatial domain (its spatial box
and ``origin_where``) under the condition ``extent(L) <= 0``::

    for i in range(N):                         for i in range(N):
        for j in range(M):                         for j in range(M):
            s_sum: xsum[i] = xsum[i] + x[i, j]         s_sum: xsum[i] = xsum[i] + x[i, j]
                                                   s_sum_empty_j (where M <= 0): xsum[i] = 0.0

Loops inside ``L`` are kept where they bind a spatial iteration of such a block (they enumerate its
outputs) and dropped otherwise.  A block whose spatial bindings use ``L``'s variable has no spatial
points while ``L`` runs zero times, and is left alone; so is a block inside ``L`` that ``L`` does not
bind at all (``L`` merely repeats it).
"""

from __future__ import annotations

from polyfuse.ir.expr import BinOp, Const, Expr, logical_and
from polyfuse.ir.simplify import simplify_condition
from polyfuse.ir.stmt import Block, Loop, Program, Seq, Stmt, Store
from polyfuse.ir.visit import free_vars, seq, substitute


def init_empty_reductions(program: Program) -> Program:
    """``program`` with the init of every reduction that a zero-trip loop would skip (module docstring)."""
    body = _rewrite(program.body)
    return program if body == program.body else program.replace(body=body)


def _rewrite(s: Stmt) -> Stmt:
    if isinstance(s, Seq):
        stmts = tuple(_rewrite(c) for c in s.stmts)
        return s if stmts == s.stmts else seq(*stmts)
    if not isinstance(s, Loop):
        return s
    body = _rewrite(s.body)
    loop = s if body == s.body else s.replace(body=body)
    if isinstance(s.extent, Const) and int(s.extent.value) >= 1:
        return loop
    empty = _inits(s.body, s.var.name)
    if empty is None:
        return loop
    return seq(loop, _guarded(empty, simplify_condition(BinOp("<=", s.extent, Const(0, s.extent.dtype)))))


def _inits(s: Stmt, var: str) -> Stmt | None:
    """The init blocks of the reductions in ``s`` that loop ``var`` reduces over, inside the loops of ``s``
    that enumerate their spatial points (others dropped); None if there are none."""
    if isinstance(s, Seq):
        kept = [x for x in (_inits(c, var) for c in s.stmts) if x is not None]
        return seq(*kept) if kept else None
    if isinstance(s, Loop):
        inner = _inits(s.body, var)
        if inner is None:
            return None
        if s.var.name in _spatial_vars(inner):
            return Loop(s.var, s.extent, inner)
        return inner
    if not isinstance(s, Block) or s.reducer is None or s.init is None:
        return None
    reduce_vars = set().union(*(free_vars(b) for iv, b in zip(s.iters, s.bindings, strict=True) if iv.is_reduce))
    spatial = [(iv, b) for iv, b in zip(s.iters, s.bindings, strict=True) if not iv.is_reduce]
    spatial_vars = set().union(set(), *(free_vars(b) for _, b in spatial))
    if var not in reduce_vars or var in spatial_vars:
        return None
    at_origin = substitute(s.init, {iv.var.name: Const(0, iv.var.dtype) for iv in s.reduce_iters})
    return Block(f"{s.name}_empty_{var}", tuple(iv for iv, _ in spatial), tuple(b for _, b in spatial),
                 Store(s.store.tensor, s.store.indices, at_origin), where=s.origin_where())


def _spatial_vars(s: Stmt) -> set[str]:
    """The loop variables the spatial bindings of the blocks in ``s`` use."""
    if isinstance(s, Seq):
        return set().union(*(_spatial_vars(c) for c in s.stmts))
    if isinstance(s, Loop):
        return _spatial_vars(s.body)
    assert isinstance(s, Block)
    return set().union(set(), *(free_vars(b) for b in s.bindings))


def _guarded(s: Stmt, cond: Expr | None) -> Stmt:
    """``s`` with ``cond`` (a loop's zero-trip condition; None: always) added to every block's ``where``."""
    if cond is None:
        return s
    if isinstance(s, Seq):
        return seq(*(_guarded(c, cond) for c in s.stmts))
    if isinstance(s, Loop):
        return s.replace(body=_guarded(s.body, cond))
    assert isinstance(s, Block)
    return s.replace(where=cond if s.where is None else logical_and(s.where, cond))
