"""Range facts: bounds on a reduction's running values that the code generator may rely on.

A sum of ``exp(e − m)`` where ``m`` is the max of the same ``e`` over the same elements (softmax's and
attention's denominator) lies in ``[1, n]``, ``n`` the number of elements it reduces.  The proof, in IEEE
arithmetic (exp correctly rounded, any reduction order):

  1. every term is ``exp(e_j − m) <= exp(0) = 1``: ``e_j <= m`` because m is the max of these e_j, and
     rounding is monotone; every term is >= 0;
  2. the element ``j*`` that attains the max has ``e_j* − m = 0`` exactly (m *is* e_j*), so its term is
     ``exp(0) = 1`` exactly; the other terms are >= 0 and a rounded sum of non-negative numbers never falls
     below a partial sum (``fl(a + b) >= a`` for ``b >= 0``: a is representable, rounding is monotone), so the
     sum is >= 1;
  3. each partial sum of k terms is <= k: ``fl(a + b) <= fl(k + 1) = k + 1`` for ``a <= k``, ``b <= 1``, while
     ``k + 1 <= 2^p`` (p the significand bits: 24 in f32) is representable; so the sum is <= n.

Rolled over tiles (:func:`~polyfuse.transforms.rolling_update.rolling_update`), the running sum is repaired
at each step: ``S = select(m_old == m, S_old, exp(m_old − m)·S_old) + rf`` with ``rf`` the step's own sum of
``exp(e_j − m)`` and ``m = max(m_old, max of the step's e_j)``.  By induction over the steps, once a finite
element has been seen: where m did not move, ``S >= S_old >= 1`` (the factor is 1: the select, or
``exp(0) = 1``); where it moved, the new max is one of this step's elements, so ``rf >= 1`` by 2 and
``S >= rf`` (the rescaled part is >= 0); and ``S <= seen`` by 3 (the factor ``exp(m_old − m) <= 1``).

The plain sum (not rolled, no guarded term) is never 0: a finite max is one of the elements, and that
element's term is exactly 1; a max of ±inf or NaN makes the same element's term NaN (``exp(inf − inf)``).

The other values such a sum takes: 0 while every element seen is ``−inf`` (a fully masked row: every term is
``exp(−inf) = 0``, or the guarded term 0 of a fused sum), and NaN where an element is NaN or ``+inf``
(``exp(inf − inf)``).  :class:`ValueRange` says so: its bounds hold for every value that is finite and
non-zero.  With a GPU's approximate exp (``ex2.approx``, a few ulp) the bounds move by a few ulp; what the
code generator derives from them (:mod:`polyfuse.emit_cpp.reciprocal`: ``1/S`` is a normal number) does not
notice.

A fact is found only where it is proven: the max's block and the sum's block (plain), or the max's block and
the rolled sum's local block ``<sum>_rf`` (rolled), reduce over the same points (their iteration domains in
loop variables, compared by ISL), group them into the same reductions (their spatial iterations, and the
rolled loop), read the same elements in ``e`` (each read's access relation, compared by ISL), the max is
complete before the sum reads it (program order, nothing between writes what ``e`` reads), and ``m`` is read
at the sum's own group.  Anything else — ``exp(e − c)`` with c not the max of e, a max over other elements,
a sum with an init — gets no fact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import islpy as isl

from polyfuse.deps.domains import param_names
from polyfuse.deps.islconv import aff_text, build_map, build_set, condition_texts, dim_env
from polyfuse.errors import PolyfuseError
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Load, Select, Var
from polyfuse.ir.stmt import Block, Loop, Program, Seq
from polyfuse.ir.visit import children, loads, substitute

SIGNIFICAND_BITS = {"f32": 24, "f64": 53}
"""Bits of the significand of the float types a sum may be bounded in: counts up to ``2^bits`` are exact."""


@dataclass(frozen=True)
class ValueRange:
    """Every value of tensor ``name`` that is finite and non-zero lies in ``[lo, hi]``; its other values are
    ±0 or NaN (never ±inf), and never ±0 where ``nonzero``.  ``proof`` says why, for the plan and for
    ``explain``."""

    name: str
    lo: float
    hi: float
    proof: str
    nonzero: bool = False


def value_ranges(program: Program) -> tuple[ValueRange, ...]:
    """The range facts of ``program``'s reductions (the module docstring), one per tensor at most."""
    out: list[ValueRange] = []
    writers = _writers(program)
    for block in program.blocks():
        try:
            found = _softmax_denominator(program, block, writers)
        except PolyfuseError:
            found = None  # (an index ISL cannot take: no fact)
        if found is not None:
            out.append(found)
    return tuple(out)


def _writers(program: Program) -> dict[str, list[Block]]:
    found: dict[str, list[Block]] = {}
    for b in program.blocks():
        found.setdefault(b.store.tensor.name, []).append(b)
    return found


def _kind(block: Block) -> str | None:
    from polyfuse.transforms.repair import reducer_kind

    if block.reducer is None:
        return None
    try:
        return reducer_kind(block.reducer)
    except PolyfuseError:
        return None


def _fresh_reduction(block: Block) -> bool:
    """A reduction from its identity (no init of its own)."""
    return block.init is None or block.init == block.reducer.identity  # type: ignore[union-attr]


def _softmax_denominator(program: Program, block: Block, writers: dict[str, list[Block]]) -> ValueRange | None:
    from polyfuse.transforms.fusion_common import _term_operand, unguarded

    if _kind(block) != "sum" or not _fresh_reduction(block) or block.store.tensor.dtype.name not in SIGNIFICAND_BITS:
        return None
    term = block.reduce_term()
    rolled: Loop | None = None
    local = block
    if term is None:  # a repaired (rolled) sum: S = h(S) + rf, rf the step's own sum
        operand = _term_operand(block)
        if not isinstance(operand, Load) or len(writers.get(operand.tensor.name, ())) != 1:
            return None
        local = writers[operand.tensor.name][0]
        if _kind(local) != "sum" or not _fresh_reduction(local) or local.reduce_term() is None:
            return None
        rolled = _rolled_loop(program, block, local)
        if rolled is None:
            return None
        term = local.reduce_term()
    assert term is not None
    guarded = unguarded(term) != term
    term = _expand(program, unguarded(term))
    if not (isinstance(term, Call) and term.fn == "exp" and isinstance(term.args[0], BinOp)
            and term.args[0].op == "-" and isinstance(term.args[0].b, Load)):
        return None
    e, m_load = term.args[0].a, term.args[0].b
    if len(writers.get(m_load.tensor.name, ())) != 1:
        return None
    max_block = writers[m_load.tensor.name][0]
    if _kind(max_block) != "max" or not _fresh_reduction(max_block) or max_block.reduce_term() is None:
        return None
    if rolled is not None and not _rescaled_by_the_max(program, block, m_load, max_block, writers, rolled):
        return None
    if not _same_reduction(program, max_block, local, max_block.reduce_term(), e, m_load, rolled):
        return None
    n = 1
    for iv in max_block.reduce_iters:
        if not isinstance(iv.extent, Const):
            return None
        n *= int(iv.extent.value)
    if n > 2 ** SIGNIFICAND_BITS[block.store.tensor.dtype.name]:
        return None
    form = f"rolled over loop {rolled.var.name} (repaired by exp(m_old − m))" if rolled is not None else "plain"
    proof = (f"{block.store.tensor.name} = Σ exp(e − {m_load.tensor.name}) with {m_load.tensor.name} = max e over the "
             f"same {n} elements ({form}): the max's own term is exp(0) = 1, every term in [0, 1]")
    # Plain and unguarded, the sum is never 0: a finite max is one of the elements, whose term is exactly 1;
    # a max of ±inf or NaN makes that element's term exp(inf − inf) or exp(NaN), NaN.
    nonzero = rolled is None and not guarded and n >= 1
    if nonzero:
        proof += "; never 0 (the max's own term is 1, or NaN where the max is not finite)"
    return ValueRange(block.store.tensor.name, 1.0, float(n), proof, nonzero)


def _rolled_loop(program: Program, block: Block, local: Block) -> Loop | None:
    """The loop a rolled sum ``block`` reduces over (its one reduce iteration's binding), with its step's local
    sum ``local`` inside it, before ``block``."""
    from polyfuse.transforms.tree import loops_of

    if len(block.reduce_iters) != 1:
        return None
    binding = block.binding_of(block.reduce_iters[0].var.name)
    if not isinstance(binding, Var):
        return None
    loop = next((lp for lp in loops_of(program, block.name) if lp.var.name == binding.name), None)
    if loop is None or not any(lp is loop for lp in loops_of(program, local.name)):
        return None
    order = [b.name for b in program.blocks()]
    return loop if order.index(local.name) < order.index(block.name) else None


def _rescaled_by_the_max(program: Program, block: Block, m_load: Load, max_block: Block,
                         writers: dict[str, list[Block]], rolled: Loop) -> bool:
    """Whether the rolled sum's repair is ``exp(m_old − m)·S`` (possibly under ``select(m_old == m, S, …)``),
    ``m`` the max at the sum's own element and ``m_old`` its value before the step: a save
    ``select(t == 0, -inf, m)`` of the same element (t the step of loop ``rolled``) written before the max's
    block."""
    from polyfuse.transforms.fusion_common import _term_operand

    value = block.store.value
    operand = _term_operand(block)
    repair = value.a if isinstance(value, BinOp) and value.b == operand else getattr(value, "b", None)
    own = Load(block.store.tensor, block.store.indices)
    if isinstance(repair, Select) and own in (repair.true_value, repair.false_value):
        repair = repair.false_value if repair.true_value == own else repair.true_value
    if not (isinstance(repair, BinOp) and repair.op == "*" and own in (repair.a, repair.b)):
        return False
    factor = repair.b if repair.a == own else repair.a
    if not (isinstance(factor, Call) and factor.fn == "exp" and isinstance(factor.args[0], BinOp)
            and factor.args[0].op == "-"):
        return False
    old, new = factor.args[0].a, factor.args[0].b
    if not (isinstance(new, Load) and isinstance(old, Load) and new.tensor == m_load.tensor
            and new.indices == block.store.indices and old.indices == block.store.indices):
        return False
    saves = writers.get(old.tensor.name, ())
    if len(saves) != 1:
        return False
    saved = saves[0].store.value
    if not (isinstance(saved, Select) and isinstance(saved.true_value, Const)
            and saved.true_value.value == float("-inf") and isinstance(saved.false_value, Load)
            and saved.false_value.tensor == m_load.tensor and saved.false_value.indices == saves[0].store.indices):
        return False
    first = saved.cond  # the rolled loop's first step: t == 0, t bound to the loop's variable
    if not (isinstance(first, BinOp) and first.op == "==" and isinstance(first.a, Var) and isinstance(first.b, Const)
            and first.b.value == 0 and saves[0].binding_of(first.a.name) == rolled.var):
        return False
    order = [b.name for b in program.blocks()]
    return order.index(saves[0].name) < order.index(max_block.name) < order.index(block.name)


def _same_reduction(program: Program, max_block: Block, local: Block, e_max: Expr, e: Expr, m_load: Load,
                    rolled: Loop | None) -> bool:
    """Whether ``local``'s term ``exp(e − m_load)`` reads, at each of its points, the max ``max_block`` takes
    of ``e_max`` over exactly the points of the same group (one step of ``rolled``, where rolled)."""
    from polyfuse.transforms.fusion_common import _bindings
    from polyfuse.transforms.tree import loops_of

    loops_m, loops_s = loops_of(program, max_block.name), loops_of(program, local.name)
    names = [lp.var.name for lp in loops_s]
    if [lp.var.name for lp in loops_m] != names or [lp.extent for lp in loops_m] != [lp.extent for lp in loops_s]:
        return False
    params = param_names(program)
    env = dim_env(names, params)
    bind_m, bind_s = dict(_bindings(program, max_block)), dict(_bindings(program, local))
    domain_m, domain_s = _domain(max_block, loops_m, bind_m, params, env), _domain(local, loops_s, bind_s, params, env)
    if not domain_m.is_equal(domain_s):
        return False
    domain = domain_s
    # the same groups: points of one running max are those of one sum (of one step, rolled)
    step = [rolled.var] if rolled is not None else []
    group_m = _function(names, [_at(bind_m, iv.var) for iv in max_block.spatial_iters] + step, params, env, domain)
    group_s = _function(names, [_at(bind_s, iv.var) for iv in local.spatial_iters], params, env, domain)
    if not _kernel(group_m).is_equal(_kernel(group_s)):
        return False
    # m is read at the sum's own group: the max's store index at the same point
    if m_load.tensor != max_block.store.tensor or not all(
            _function(names, [_at(bind_s, a)], params, env, domain).is_equal(
                _function(names, [_at(bind_m, b)], params, env, domain))
            for a, b in zip(m_load.indices, max_block.store.indices, strict=True)):
        return False
    if not _same_values(_expand(program, e_max), _expand(program, e), bind_m, bind_s, names, params, env, domain):
        return False
    return _complete_before(program, max_block, local, e)


def at_most_its_max(program: Program, block: Block, arg: Expr) -> bool:
    """Whether ``arg``, read in ``block`` as ``e − m`` with ``m`` the result of a max block, is <= 0 wherever it
    is not NaN: at each of ``block``'s points, ``e`` computes one of the elements the max took for the element
    of m read there (the same operations on the same tensor elements, compared by ISL as images of both
    blocks' points), and the max is complete before ``block`` with nothing between writing what ``e`` reads.

    ``exp(arg)`` is then in [0, 1] or NaN (rounding is monotone, exp(0) = 1)."""
    if not (isinstance(arg, BinOp) and arg.op == "-" and isinstance(arg.b, Load)):
        return False
    m_load = arg.b
    writers = _writers(program).get(m_load.tensor.name, [])
    if len(writers) != 1:
        return False
    max_block = writers[0]
    e_max = max_block.reduce_term()
    if _kind(max_block) != "max" or not _fresh_reduction(max_block) or e_max is None:
        return False
    pairs = _leaves(_expand(program, e_max), _expand(program, arg.a))
    if pairs is None:
        return False
    try:
        seen = _image(program, max_block, [*max_block.store.indices, *(a for a, _ in pairs)])
        read = _image(program, block, [*m_load.indices, *(b for _, b in pairs)])
    except PolyfuseError:
        return False  # (an index ISL cannot take: unproven)
    return read.is_subset(seen) and _complete_before(program, max_block, block, arg.a)


def _leaves(a: Expr, b: Expr) -> list[tuple[Expr, Expr]] | None:
    """The index expressions and variables of ``a`` and ``b`` paired in order, where both apply the same
    operations to loads of the same tensors (None where they do not)."""
    if isinstance(a, Load) or isinstance(b, Load):
        if not (isinstance(a, Load) and isinstance(b, Load) and a.tensor == b.tensor):
            return None
        return list(zip(a.indices, b.indices, strict=True))
    if isinstance(a, Var) or isinstance(b, Var):
        return [(a, b)] if isinstance(a, Var) and isinstance(b, Var) else None
    ca, cb = _children(a), _children(b)
    if type(a) is not type(b) or len(ca) != len(cb) or _shallow(a) != _shallow(b):
        return None
    out: list[tuple[Expr, Expr]] = []
    for x, y in zip(ca, cb, strict=True):
        found = _leaves(x, y)
        if found is None:
            return None
        out += found
    return out


def _image(program: Program, block: Block, exprs: Sequence[Expr]) -> isl.Set:
    """The values the tuple ``exprs`` (in ``block``'s iteration variables) takes over ``block``'s points."""
    from polyfuse.transforms.fusion_common import _bindings
    from polyfuse.transforms.tree import loops_of

    loops = loops_of(program, block.name)
    names = [lp.var.name for lp in loops]
    params = param_names(program)
    env = dim_env(names, params)
    bind = dict(_bindings(program, block))
    domain = _domain(block, loops, bind, params, env)
    return _function(names, [_at(bind, x) for x in exprs], params, env, domain).range()


def _expand(program: Program, e: Expr) -> Expr:
    from polyfuse.transforms.fusion_common import map_definitions
    from polyfuse.transforms.numerics import expand_maps

    return expand_maps({m.tensor: m for m in map_definitions(program)}, e) if program.blocks() else e


def _at(bindings: dict[str, Expr], e: Expr) -> Expr:
    return substitute(e, bindings)


def _domain(block: Block, loops: Sequence[Loop], bindings: dict[str, Expr], params: tuple[str, ...],
            env: dict[str, str]) -> isl.Set:
    """The points of the loops (by name) at which ``block`` runs: loop bounds, its iterations' extents, its
    ``where``."""
    what = f"block {block.name!r}"
    cons = [f"0 <= {env[lp.var.name]} < {aff_text(lp.extent, env, what=what)}" for lp in loops]
    for iv in block.iters:
        cons.append(f"0 <= {aff_text(bindings[iv.var.name], env, what=what)} < {aff_text(iv.extent, env, what=what)}")
    if block.where is not None:
        cons += condition_texts(_at(bindings, block.where), env, what=what)
    return build_set(params, None, [lp.var.name for lp in loops], cons)


def _function(names: Sequence[str], exprs: Sequence[Expr], params: tuple[str, ...], env: dict[str, str],
              domain: isl.Set) -> isl.Map:
    out = build_map(params, names, [aff_text(x, env, what="a range fact") for x in exprs], [])
    return out.intersect_domain(domain)


def _kernel(f: isl.Map) -> isl.Map:
    """Pairs of points ``f`` maps to the same value."""
    return f.apply_range(f.reverse())


def _same_values(a: Expr, b: Expr, bind_a: dict[str, Expr], bind_b: dict[str, Expr], names: Sequence[str],
                 params: tuple[str, ...], env: dict[str, str], domain: isl.Set) -> bool:
    """Whether ``a`` (in one block's iterations) and ``b`` (in the other's) compute the same value at every
    point of ``domain``: the same operations, and reads of the same tensor elements (access relations)."""
    def same(x: Expr, y: Expr) -> bool:
        return _function(names, [_at(bind_a, x)], params, env, domain).is_equal(
            _function(names, [_at(bind_b, y)], params, env, domain))

    if isinstance(a, Load) or isinstance(b, Load):
        return (isinstance(a, Load) and isinstance(b, Load) and a.tensor == b.tensor
                and len(a.indices) == len(b.indices)
                and all(same(x, y) for x, y in zip(a.indices, b.indices, strict=True)))
    if isinstance(a, Var) or isinstance(b, Var):
        return isinstance(a, Var) and isinstance(b, Var) and same(a, b)
    if type(a) is not type(b):
        return False
    ca, cb = _children(a), _children(b)
    if len(ca) != len(cb) or _shallow(a) != _shallow(b):
        return False
    return all(_same_values(x, y, bind_a, bind_b, names, params, env, domain) for x, y in zip(ca, cb, strict=True))


def _children(e: Expr) -> tuple[Expr, ...]:
    return tuple(children(e))


def _shallow(e: Expr) -> object:
    """``e`` without its operands: its type, operator or function, constant and dtype."""
    return (type(e).__name__, getattr(e, "op", None), getattr(e, "fn", None),
            getattr(e, "value", None) if isinstance(e, Const) else None, e.dtype)


def _complete_before(program: Program, max_block: Block, local: Block, e: Expr) -> bool:
    """Whether ``max_block``'s nest runs to its end before ``local``'s (in the innermost loop both are in, the
    max's statement comes first) and no block between them writes what ``e`` reads."""
    from polyfuse.transforms.tree import loops_of

    loops_m, loops_s = loops_of(program, max_block.name), loops_of(program, local.name)
    shared = 0
    while shared < min(len(loops_m), len(loops_s)) and loops_m[shared] is loops_s[shared]:
        shared += 1
    if shared == len(loops_m) or shared == len(loops_s):
        return False  # (one block inside the other's loop nest: the max is not complete at the sum's points)
    parent = loops_s[shared - 1].body if shared else program.body
    stmts = parent.stmts if isinstance(parent, Seq) else (parent,)
    first_m = next((k for k, s in enumerate(stmts) if s is loops_m[shared]), None)
    first_s = next((k for k, s in enumerate(stmts) if s is loops_s[shared]), None)
    if first_m is None or first_s is None or first_m >= first_s:
        return False
    order = [b.name for b in program.blocks()]
    read = {ld.tensor.name for ld in loads(e)}
    between = program.blocks()[order.index(max_block.name) + 1:order.index(local.name)]
    return not any(b.store.tensor.name in read for b in between)


__all__ = ["SIGNIFICAND_BITS", "ValueRange", "at_most_its_max", "value_ranges"]
