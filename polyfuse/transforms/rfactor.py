"""rfactor: privatize a reduction into partial results and a combine (Neptune §4.3, TVM's ``rfactor``).

A loop that binds part of a block's reduction becomes a spatial dimension of a new temporary: the block
``<block>_rf`` reduces the remaining reduce loops into ``<tensor>_rf``, one partial result per iteration of
that loop (Neptune's local nest), and the original block becomes the combine of the partial results with
the original init (Neptune's global nest).  Iterations of the rfactored loop no longer depend on each other.

Preconditions (checked first):
  1. the block is a reduction ``X[idx] = X[idx] ⊕ g`` whose store indices use only spatial iterations, one
     element per spatial instance, and ``g`` does not read ``X``;
  2. its reducer is known to be associative and commutative: sum, prod, max or min (the partial results
     combine in a different order);
  3. the loop binds a reduce iteration of the block and no spatial one, and no other loop binds both;
  4. the rf block's instances are the points of the loops binding the reduction whose reduce values are
     iterations of the block: its ``where`` says so (``j_0 * 16 + j_1 < 40`` after ``split(j, [None, 16])``
     of 40; nothing when the split divides).  When it reduces over inner loops, each partial result with
     an instance must have its first one (reduce iterations 0), where its init runs — refused otherwise;
  5. no other block inside the combine's placement (see below) reads or writes ``X`` or writes what the
     init reads: the partial values of ``X`` disappear and its final value appears later.

Before / after (``rfactor(block="s_max", loop="j0")`` after ``split(j, [None, 4])``, M = 8)::

    for i in range(N):                           for i in range(N):
        for j0 in range(2):                          for j0 in range(2):
            for j1 in range(4):                          for j1 in range(4):
                s_max[i, j = j0*4 + j1]                      s_max_rf[i, j0, j1]:   (init -inf)
                                                                 xmax_rf[i, j0] = max(xmax_rf[i, j0],
                                                                                      inp[i, j0*4 + j1])
                                                     for j0 in range(2):
                                                         s_max[i, j0 (reduce)]:  (original init)
                                                             xmax[i] = max(xmax[i], xmax_rf[i, j0])

``<block>_rf`` takes the block's place and loops: its iterations are the spatial ones, the loop's variable
(spatial, the new dimension of ``X_rf`` at ``factor_axis``, last by default) and one reduce iteration per
other loop binding the reduction.  When no such loop is left it is a plain map ``X_rf[idx, r] = g``.  The
combine runs in a new nest right after the outermost loop that holds nothing but this nest (or, if that is
further in, after the outermost loop binding the reduction): copies of the loops in between that bind
spatial iterations, then the rfactored loop.  The rf block's instances are new, so legality holds by
construction (preconditions 3-5); the rest of the program is checked to keep its dependences.

A partial result with no element (``split(j, [4, None])`` of 5: ``j_0 = 3`` covers 6, 7) is never written, so
the combine must not use it: it gets a ``where`` saying which partials exist (``j_0 * 2 < 5``), or, where
that would exclude the first instance its init runs at, takes the reducer's identity for the missing ones
(``select(cond, X_rf[...], identity)``).
"""

from __future__ import annotations

from collections.abc import Collection

from polyfuse import deps
from polyfuse.deps.domains import missing_init_origins, param_names, prune_where
from polyfuse.deps.islconv import aff_text, build_map, dim_env, param_env
from polyfuse.errors import IllegalTransform, InternalError, IRError
from polyfuse.ir.expr import BinOp, Expr, Load, Var, conjuncts, select
from polyfuse.ir.stmt import (
    REDUCE, SPATIAL, TEMP, Block, IterVar, Loop, Program, Reducer, Stmt, Store, Tensor, builtin_reducer,
)
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import free_vars, loads, map_expr, seq, substitute
from polyfuse.transforms.tree import binding_loop_vars, block_path, blocks_under, find_loop, map_blocks, replace_node

_ASSOCIATIVE_COMMUTATIVE = {"+": "sum", "*": "prod", "max": "max", "min": "min"}


def rfactor(program: Program, *, block: str, loop: str, factor_axis: int | None = None,
            redirect: Collection[str] = ()) -> tuple[Program, str]:
    """Privatize ``block``'s reduction over loop ``loop``; returns the program and the rf block's name.

    ``redirect`` names blocks under the loop that read the reduction's result and
    should read their own split's partial result instead (Neptune's REPLACETENSORREADS,
    used by split-k update): each must have an iteration bound to ``loop`` itself,
    which indexes the partials.  Their reads then change meaning on purpose; the
    caller (split-k update) repairs the difference.
    """
    what = f"rfactor of block {block!r} at loop {loop!r}"
    path, b = block_path(program, block)
    lp = find_loop(program, block, loop)
    loops = [s for s in path if isinstance(s, Loop)]
    term = _check_reduction(program, b, what)
    spatial_vars = binding_loop_vars(b, reduce=False)
    reduce_vars = binding_loop_vars(b, reduce=True)
    if loop not in reduce_vars:
        binds = "spatial iterations only" if loop in spatial_vars else "no iteration"
        raise IllegalTransform(f"{what}: loop {loop!r} binds {binds} of {block!r}, not a reduce iteration; "
                               f"rfactor a loop that binds {', '.join(iv.var.name for iv in b.reduce_iters)}")
    mixed = [s.var.name for s in loops if s.var.name in reduce_vars and s.var.name in spatial_vars]
    if mixed:
        raise IllegalTransform(f"{what}: loop {mixed[0]!r} binds spatial iterations of {block!r} as well as "
                               "reduce ones; rfactor before fusing them")
    red_loops = [s for s in loops if s.var.name in reduce_vars]
    _check_forward(b, what)
    anchor = _anchor(loops, b, red_loops[0])
    _check_no_other_access(b, anchor, what, set(redirect))
    ndim = b.store.tensor.ndim
    axis = ndim if factor_axis is None else factor_axis
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis <= ndim:
        raise IllegalTransform(f"{what}: factor_axis must be an integer in 0..{ndim}, got {factor_axis!r}")

    rf_name = _fresh(f"{block}_rf", {x.name for x in program.blocks()})
    x = b.store.tensor
    shape = list(x.shape)
    shape.insert(axis, lp.extent)
    x_rf = Tensor(_fresh(f"{x.name}_rf", {t.name for t in program.tensors}), tuple(shape), x.dtype, TEMP)
    params = param_names(program)
    rf_block = _rf_block(b, term, lp, red_loops, x_rf, axis, rf_name, params, what)
    combine = _combine_block(b, lp, x_rf, axis, rf_block, params)
    nest: Stmt = Loop(Var(loop), lp.extent, combine)
    for s in reversed(loops[_position(loops, anchor):]):
        if s.var.name in spatial_vars:
            nest = Loop(s.var, s.extent, nest, s.kind, s.thread, s.annotations)
    body = replace_node(program.body, anchor, seq(replace_node(anchor, b, rf_block), nest))
    for name in redirect:
        body = map_blocks(body, lambda r, name=name: (read_partials(r, x, x_rf, axis, loop, what)
                                                      if r.name == name else r))
    k = program.tensors.index(x)
    new = program.replace(body=body, tensors=program.tensors[:k] + (x_rf,) + program.tensors[k:])
    validate(new)
    _verify_rest(program, new, block, what)
    return new, rf_name


def _check_reduction(program: Program, b: Block, what: str) -> Expr:
    """Precondition 1 and 2; returns the term ``g``."""
    r = b.reducer
    if r is None:
        raise IllegalTransform(f"{what}: block {b.name!r} is not a reduction")
    if not _associative_commutative(r):
        raise IllegalTransform(f"{what}: the reducer {r.name!r} of {b.name!r} is not one of sum, prod, max, min "
                               "(the only reducers known to be associative and commutative); rfactor regroups the "
                               "reduction, which is correct only for those")
    term = b.reduce_term()
    x = b.store.tensor
    if term is None:
        raise IllegalTransform(f"{what}: the store of {b.name!r} is not {x.name}[...] = {r.name}({x.name}[...], term)")
    spatial = {iv.var.name for iv in b.spatial_iters}
    in_store = set().union(*(free_vars(i) for i in b.store.indices))
    if in_store - spatial:
        raise IllegalTransform(f"{what}: block {b.name!r} stores at indices that use reduce iteration(s) "
                               f"{', '.join(sorted(in_store - spatial))}")
    if any(ld.tensor.name == x.name for ld in loads(term)):
        raise IllegalTransform(f"{what}: the term of {b.name!r} reads the reduced tensor {x.name!r} itself")
    params = tuple(p.name for p in program.params)
    names = [iv.var.name for iv in b.spatial_iters]
    env = dim_env(names, params)
    store = build_map(params, names, [aff_text(i, env, what=what) for i in b.store.indices],
                      [f"0 <= _a{k} < {aff_text(iv.extent, param_env(params), what=what)}"
                       for k, iv in enumerate(b.spatial_iters)])
    if not store.is_injective():
        raise IllegalTransform(f"{what}: two spatial instances of {b.name!r} store to the same element of "
                               f"{x.name!r}, so it is not one reduction per element")
    return term


def _associative_commutative(r: Reducer) -> bool:
    """``r`` is ``lhs op rhs`` (either order) for a builtin op, with that op's identity."""
    c = r.combine
    if not isinstance(c, BinOp) or c.op not in _ASSOCIATIVE_COMMUTATIVE or {c.a, c.b} != {r.lhs, r.rhs}:
        return False
    return r.identity == builtin_reducer(_ASSOCIATIVE_COMMUTATIVE[c.op], r.dtype).identity


def _check_forward(b: Block, what: str) -> None:
    """The reduction must run forward: its init happens at reduce index 0, which must be the first
    update the loops execute, or regrouping the updates changes what the program computes."""
    from polyfuse.ir.affine import linear_form

    for iv, bnd in zip(b.iters, b.bindings, strict=True):
        if not iv.is_reduce:
            continue
        backwards = sorted(str(k) for k, c in linear_form(bnd).items() if k != 1 and c < 0)
        if backwards:
            raise IllegalTransform(f"{what}: loop(s) {', '.join(backwards)} run the reduction of {b.name!r} "
                                   f"backwards ({iv.var.name} = {bnd}); its init, at {iv.var.name} = 0, would not "
                                   "come first, and regrouping would change the result")


def _anchor(loops: list[Loop], b: Block, outer_reduce: Loop) -> Loop:
    """The loop after which the combine nest goes: see the module docstring."""
    alone = [s for s in loops if [x.name for x in blocks_under(s)] == [b.name]]
    if alone and _position(loops, alone[0]) < _position(loops, outer_reduce):
        return alone[0]
    return outer_reduce


def _position(loops: list[Loop], loop: Loop) -> int:
    """Index of ``loop`` in ``loops`` by identity (equal loop nests elsewhere are other places)."""
    return next(k for k, s in enumerate(loops) if s is loop)


def read_partials(reader: Block, x: Tensor, x_rf: Tensor, axis: int, loop: str, what: str) -> Block:
    """``reader`` with its loads of ``x`` replaced by loads of its split's partials in ``x_rf``."""
    split = [iv.var for iv, bnd in zip(reader.iters, reader.bindings, strict=True)
             if isinstance(bnd, Var) and bnd.name == loop]
    if not split:
        raise IllegalTransform(f"{what}: block {reader.name!r} reads {x.name!r} but has no iteration bound to loop "
                               f"{loop!r} to say which split's partial result it needs")
    if reader.init is not None and any(ld.tensor == x for ld in loads(reader.init)):
        raise IllegalTransform(f"{what}: the init of block {reader.name!r} reads {x.name!r}; it cannot be redirected")

    def swap(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor == x:
            idx = list(e.indices)
            idx.insert(axis, split[0])
            return Load(x_rf, tuple(idx))
        return None

    st = reader.store
    return reader.replace(store=Store(st.tensor, st.indices, map_expr(st.value, swap)))


def _check_no_other_access(b: Block, anchor: Loop, what: str, redirected: set[str]) -> None:
    """Precondition 5 (blocks being redirected to the partial results excepted)."""
    x = b.store.tensor.name
    init_reads = {ld.tensor.name for ld in loads(b.init)} if b.init is not None else set()
    for other in blocks_under(anchor):
        if other.name == b.name or other.name in redirected:
            continue
        touched = {ld.tensor.name for e in (other.store.value, other.init) if e is not None for ld in loads(e)}
        if x in touched or other.store.tensor.name == x:
            raise IllegalTransform(f"{what}: block {other.name!r} accesses {x!r} inside loop {anchor.var.name!r}, "
                                   f"where {b.name!r} is being reduced; after rfactor {x!r} only has its final value "
                                   f"after that loop")
        if other.store.tensor.name in init_reads:
            raise IllegalTransform(f"{what}: block {other.name!r} writes {other.store.tensor.name!r} inside loop "
                                   f"{anchor.var.name!r}, and the init of {b.name!r} reads it; the combine would "
                                   "read it later")


def _fresh(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    k = 1
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def _rf_block(b: Block, term: Expr, lp: Loop, red_loops: list[Loop], x_rf: Tensor, axis: int, name: str,
              params: tuple[str, ...], what: str) -> Block:
    """``X_rf[idx, r] = X_rf[idx, r] ⊕ g`` over the other loops binding the reduction (precondition 4)."""
    taken = {iv.var.name for iv in b.spatial_iters} | set(params)
    iter_of: dict[str, str] = {}
    for s in red_loops:
        iter_of[s.var.name] = _fresh(s.var.name, taken)
        taken.add(iter_of[s.var.name])
    as_iters = {loop: Var(it) for loop, it in iter_of.items()}
    values = {iv.var.name: substitute(bnd, as_iters) for iv, bnd in zip(b.iters, b.bindings, strict=True)
              if iv.is_reduce}
    g = substitute(term, values)
    idx = list(b.store.indices)
    idx.insert(axis, Var(iter_of[lp.var.name]))
    acc = Load(x_rf, tuple(idx))
    spatial = [(iv, bnd) for iv, bnd in zip(b.iters, b.bindings, strict=True) if not iv.is_reduce]
    iters = [iv for iv, _ in spatial] + [IterVar(Var(iter_of[lp.var.name]), lp.extent, SPATIAL)]
    bindings = [bnd for _, bnd in spatial] + [Var(lp.var.name)]
    rest = [s for s in red_loops if s is not lp]
    r = b.reducer
    assert r is not None
    if rest:
        iters += [IterVar(Var(iter_of[s.var.name]), s.extent, REDUCE) for s in rest]
        bindings += [Var(s.var.name) for s in rest]
        out = Block(name, tuple(iters), tuple(bindings), Store(x_rf, tuple(idx), r.apply(acc, g)), r, r.identity)
    else:
        out = Block(name, tuple(iters), tuple(bindings), Store(x_rf, tuple(idx), g))
    # Its instances: the loop points whose reduce values are iterations of ``b``.
    conds: list[Expr] = []
    for iv in b.reduce_iters:
        conds += [values[iv.var.name] >= 0, values[iv.var.name] < iv.extent]
    if b.where is not None:
        conds += conjuncts(substitute(b.where, values))
    out = out.replace(where=prune_where(out, conds, params))
    missing = missing_init_origins(out, params)
    if not missing.is_empty():
        raise IllegalTransform(
            f"{what}: the partial results of {name!r} are not all reduced from their loops' first point "
            f"({', '.join(f'{s.var.name} = 0' for s in rest)}), e.g. those of {missing.sample_point()}, where "
            f"its init would run (its instances: {out.where}); split so that the inner loops start every "
            "partial, or rfactor an outer loop")
    return out


def _combine_block(b: Block, lp: Loop, x_rf: Tensor, axis: int, rf: Block, params: tuple[str, ...]) -> Block:
    """``X[idx] = X[idx] ⊕ X_rf[idx, r]`` over ``r`` (reduce), with the original init (see the module docstring)."""
    r = b.reducer
    assert r is not None
    spatial = [(iv, bnd) for iv, bnd in zip(b.iters, b.bindings, strict=True) if not iv.is_reduce]
    it = _fresh(lp.var.name, {iv.var.name for iv, _ in spatial})
    idx = list(b.store.indices)
    idx.insert(axis, Var(it))
    acc = Load(b.store.tensor, b.store.indices)
    partial: Expr = Load(x_rf, tuple(idx))
    iters = tuple(iv for iv, _ in spatial) + (IterVar(Var(it), lp.extent, REDUCE),)
    bindings = tuple(bnd for _, bnd in spatial) + (Var(lp.var.name),)
    out = Block(b.name, iters, bindings, Store(b.store.tensor, b.store.indices, r.apply(acc, partial)), r, b.init)
    # The partial results that exist: the rf block's points (with its inner reduce iterations at 0, where the
    # first instance of each partial is), in the combine's names.
    split_iter = next(iv.var for iv, bnd in zip(rf.iters, rf.bindings, strict=True)
                      if not iv.is_reduce and bnd == Var(lp.var.name))
    exists = rf.origin_where() if rf.is_reduction else rf.where
    if exists is None:
        return out
    found = prune_where(out, conjuncts(substitute(exists, {split_iter: Var(it)})), params)
    if found is None:
        return out
    guarded = out.replace(where=found)
    if b.init is None or missing_init_origins(guarded, params).is_empty():
        return guarded
    term = select(found, partial, r.identity)
    return out.replace(store=Store(b.store.tensor, b.store.indices, r.apply(acc, term)))


def _verify_rest(before: Program, after: Program, block: str, what: str) -> None:
    """Every block but ``block`` keeps its instances: their dependences must hold in ``after``."""
    try:
        schedule = deps.instance_schedule(after, deps.domains(after))
    except IRError as err:
        raise InternalError(f"{what} built a malformed program: {err}") from err
    # Only accesses of the reduced tensor (and of what its init reads) can be affected: the rf
    # block takes the block's place and loads, and the combine nest sits right after the anchor.
    b = before.block(block)
    touched = {b.store.tensor.name} | ({ld.tensor.name for ld in loads(b.init)} if b.init is not None else set())
    old = deps.analyze(before, tensors=touched)
    broken = [v for d in old.all if block not in (d.source, d.sink) and (v := deps.violation(d, schedule))]
    if broken:
        report = "\n".join(f"  {v}" for v in broken)
        raise IllegalTransform(f"{what} violates {len(broken)} dependence(s) of {before.name!r}:\n{report}")
