"""hoist_divisor: a sum whose every term is divided by a value that does not change along the sum divides
once, after it.

Why: a rolling update of ``Σ_j (a_j/d)·b_j`` must divide each term by the *running* ``d`` and repair the
sum by ``d_old/d`` (two producers, OPERATORS.md's divide-inside form): one more operation per term and a
repair that waits on the whole step's ``d``.  ``(Σ_j a_j·b_j)/d`` rolls with the one-producer repair of the
plain form, and the readers divide once per element.

Before / after (``hoist_divisor(block="pv")`` on attention's divide-inside form)::

    p_norm[b, h, i, j] = p_exp[b, h, i, j] / row_sum[b, h, i]
    pv[b, h, i, dv] += p_norm[b, h, i, j] * v[b, h, j, dv]
    out[b, h, i, dv] = f16(pv[b, h, i, dv])
        →
    pv[b, h, i, dv] += p_exp[b, h, i, j] * v[b, h, j, dv]
    out[b, h, i, dv] = f16(pv[b, h, i, dv] / row_sum[b, h, i])

(``p_norm`` is inlined into ``pv`` first, and goes when nothing else reads it.)

Preconditions, checked first:
  1. ``block`` is a sum (``+``) from 0, over reduce loops of constant extents >= 1 with no ``where``; its
     store indices are its spatial iteration variables, each once; its tensor is a temporary that only it
     writes;
  2. one factor of its term is ``a / d`` (directly, or in a map temporary the term reads), ``d`` a load
     whose indices use no reduce variable;
  3. ``d``'s tensor is an input no block writes, or has one writer whose nest comes before the sum's; every
     reader of the sum's tensor is a nest after it (the plain program's order: hoist before fusing), so every
     reader sees the ``d`` the sum divided by;
  4. floating point: ``d`` has a proven range (:mod:`~polyfuse.transforms.ranges`) of finite values in
     ``[lo, hi]``, ``lo > 0``, never 0 (its other value is NaN); and the new terms ``a·b`` are bounded by
     ``B`` (an interval bound over their definitions: finite inputs by their dtype, range facts, and
     ``exp(e − max e) <= 1``), with ``n·B·(1 + n·2^-p)·max(1, 1/lo)`` below the sum dtype's largest number
     (``n`` terms, ``p`` its significand bits).

Proof that the result is the plain program's, apart from rounding: where ``d`` is NaN both forms are NaN
(every one of the >= 1 terms of the plain sum is, and the hoisted quotient is); elsewhere ``d`` is finite
and non-zero, so neither form divides by 0 or by ±inf; every term and partial sum of the new form is
bounded by condition 4, so it does not overflow, and the quotient ``|Σ a·b|/d <= n·B·(1+…)/lo`` does not either;
a NaN in any ``a`` or ``b`` makes its term NaN in both forms, and no value is ±inf (bounded), so no
``0·inf`` appears in one form only.  The rounding differs: the plain sum is ``Σ fl(fl(a_j/d)·b_j)``, the
new one ``fl(fl(Σ fl(a_j·b_j))/d)``; each is within ``(n + 2)·u·Σ|a_j·b_j|/d`` of the exact value (``u``
the unit roundoff), the same order, which is what the operators' tolerance notes already count for the sum.
"""

from __future__ import annotations

import math

import numpy as np

from polyfuse.errors import IllegalTransform, PolyfuseError
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var, binop
from polyfuse.ir.stmt import Block, Program, Store
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import free_vars, map_expr, substitute
from polyfuse.transforms.compute_at import body_stmts, own_nest, reads_tensor
from polyfuse.transforms.fusion_common import map_definitions
from polyfuse.transforms.inline import compute_inline
from polyfuse.transforms.numerics import expand_maps
from polyfuse.transforms.ranges import SIGNIFICAND_BITS, ValueRange, at_most_its_max, value_ranges
from polyfuse.transforms.tree import block_path, map_blocks


def hoist_divisor(program: Program, *, block: str) -> Program:
    """Move the division of every term of sum ``block`` by a value invariant along the sum to the readers of
    the sum's result (see the module docstring)."""
    what = f"hoist_divisor of block {block!r}"
    # Step 1. A plain sum from 0 of at least one term per element, its result a temporary of its own.
    _, sum_block = block_path(program, block)
    _require_plain_sum(program, sum_block, what)
    # Step 2. The division: inline the map temporary that holds it, if the term reads one.
    found = _division(program, sum_block)
    if found is None:
        raise IllegalTransform(f"{what}: no factor of its term {sum_block.reduce_term()} is a division by a value "
                               "that does not depend on the reduce loops (" +
                               ", ".join(iv.var.name for iv in sum_block.reduce_iters) + ")")
    holder, _ = found
    if holder is not None:
        program = compute_inline(program, block=holder, into=[block])
        sum_block = program.block(block)
        found = _division(program, sum_block)
        assert found is not None and found[0] is None
    _, (numerator, divisor) = found
    # Step 3. The divisor is final before the sum, and the readers come after it.
    _require_order(program, sum_block, divisor, what)
    # Step 4. Floating point.
    facts = {r.name: r for r in value_ranges(program)}
    fact = facts.get(divisor.tensor.name)
    if fact is None or not fact.nonzero or not fact.lo > 0:
        known = f" (its range: {fact.proof})" if fact is not None else ""
        raise IllegalTransform(
            f"{what}: the divisor {divisor} has no proven range of finite values that are never 0{known}; where it "
            f"can be 0 or ±inf, Σ (a/d)·b and (Σ a·b)/d differ.  A softmax denominator Σ exp(e − max e) "
            "written plainly is such a value")
    term = _replace_factor(sum_block.reduce_term(), numerator)  # type: ignore[arg-type]
    _require_bounded(program, sum_block, term, fact, what)

    # Rewrite: the sum of a·b, and every read of its result divided by d at the reader's element.
    acc = Load(sum_block.store.tensor, sum_block.store.indices)
    new_sum = sum_block.replace(store=Store(sum_block.store.tensor, sum_block.store.indices,
                                            sum_block.reducer.apply(acc, term)))  # type: ignore[union-attr]
    tensor = sum_block.store.tensor.name
    names = [ix.name for ix in sum_block.store.indices]  # type: ignore[attr-defined]

    def divided(e: Expr) -> Expr:
        return map_expr(e, lambda n: binop("/", n, substitute(divisor, dict(zip(names, n.indices, strict=True))))
                        if isinstance(n, Load) and n.tensor.name == tensor else None)

    def rewrite(b: Block) -> Block:
        if b.name == block:
            return new_sum
        if not reads_tensor(b, tensor):
            return b
        return b.replace(store=Store(b.store.tensor, b.store.indices, divided(b.store.value)),
                         init=divided(b.init) if b.init is not None else None)

    return validate(program.replace(body=map_blocks(program.body, rewrite)))


def divided_sums(program: Program) -> list[str]:
    """The sum blocks of ``program`` one of whose term's factors (or a map temporary's they read) is a
    division by a value invariant along the sum: where :func:`hoist_divisor` may apply."""
    from polyfuse.transforms.repair import reducer_kind

    out = []
    for b in program.blocks():
        try:
            summed = b.reducer is not None and reducer_kind(b.reducer) == "sum" and b.reduce_term() is not None
        except PolyfuseError:
            summed = False
        if summed and _division(program, b) is not None:
            out.append(b.name)
    return out


def _require_plain_sum(program: Program, b: Block, what: str) -> None:
    from polyfuse.transforms.repair import reducer_kind

    try:
        kind = reducer_kind(b.reducer) if b.reducer is not None else None
    except PolyfuseError:
        kind = None
    if kind != "sum" or b.reduce_term() is None:
        raise IllegalTransform(f"{what}: {b.name!r} is not a sum X = X + term (a division moves out of a sum only)")
    if b.init is not None and b.init != b.reducer.identity:  # type: ignore[union-attr]
        raise IllegalTransform(f"{what}: the sum starts from {b.init}, not 0; (c + Σ a/d) is not (c + Σ a)/d")
    if b.where is not None or not all(isinstance(iv.extent, Const) and iv.extent.value >= 1 for iv in b.reduce_iters):
        raise IllegalTransform(f"{what}: the sum must have at least one term per element (constant reduce extents "
                               ">= 1, no where), or a NaN divisor would give 0 in the plain program and NaN here")
    st = b.store
    names = [ix.name for ix in st.indices if isinstance(ix, Var)]
    if len(names) != len(st.indices) or sorted(names) != sorted(iv.var.name for iv in b.spatial_iters):
        raise IllegalTransform(f"{what}: {b.name!r} stores {st.tensor.name}{list(st.indices)}; the readers' "
                               "divisor is found through store indices that are its spatial variables, each once")
    writers = [x.name for x in program.blocks() if x.store.tensor == st.tensor]
    if st.tensor.role != "temp" or writers != [b.name]:
        kind = f"written by {', '.join(writers)}" if len(writers) > 1 else f"a program {st.tensor.role}"
        raise IllegalTransform(f"{what}: {st.tensor.name!r} is {kind}; only a temporary that the sum alone writes "
                               "may change its meaning to Σ a·b")


def _factors(e: Expr) -> list[Expr]:
    if isinstance(e, BinOp) and e.op == "*":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _division(program: Program, b: Block) -> tuple[str | None, tuple[Expr, Load]] | None:
    """The sum's factor ``a / d`` with ``d`` invariant along the sum: ``(None, (a, d))`` where the term has it,
    ``(map block, (a, d))`` where a map temporary the term reads does."""
    reduce_vars = {iv.var.name for iv in b.reduce_iters}

    def own(e: Expr) -> tuple[Expr, Load] | None:
        for f in _factors(e):
            if (isinstance(f, BinOp) and f.op == "/" and isinstance(f.b, Load)
                    and not any(free_vars(ix) & reduce_vars for ix in f.b.indices)):
                return f.a, f.b
        return None

    term = b.reduce_term()
    assert term is not None
    found = own(term)
    if found is not None:
        return None, found
    maps = {m.tensor: m for m in map_definitions(program)}
    for f in _factors(term):
        if isinstance(f, Load) and f.tensor in maps:
            found = own(maps[f.tensor].at(f.indices))
            if found is not None:
                writer = next(x for x in program.blocks() if x.store.tensor == f.tensor)
                return writer.name, found
    return None


def _replace_factor(term: Expr, numerator: Expr) -> Expr:
    """``term`` with its (first) division factor ``a / d`` replaced by ``a``."""
    done = [False]

    def go(e: Expr) -> Expr:
        if isinstance(e, BinOp) and e.op == "*":
            return binop("*", go(e.a), go(e.b))
        if not done[0] and isinstance(e, BinOp) and e.op == "/" and e.a == numerator:
            done[0] = True
            return e.a
        return e

    return go(term)


def _require_order(program: Program, sum_block: Block, divisor: Load, what: str) -> None:
    top = body_stmts(program.body)

    def position(name: str) -> int | None:
        nest = own_nest(program, name)
        return next((k for k, s in enumerate(top) if s is nest), None)

    here = position(sum_block.name)
    writers = [x.name for x in program.blocks() if x.store.tensor == divisor.tensor]
    tensor = sum_block.store.tensor.name
    readers = [x.name for x in program.blocks() if x.name != sum_block.name and reads_tensor(x, tensor)]
    at = [position(w) for w in writers]
    final = divisor.tensor.role == "input" and not writers
    if here is None or not final and (len(writers) != 1 or at[0] is None or not at[0] < here):
        raise IllegalTransform(
            f"{what}: the divisor {divisor.tensor.name!r} must be written by one nest of its own before the sum's "
            f"(written by {', '.join(writers) or 'no block'}): hoist the division in the plain program, before fusing")
    late = [r for r in readers if (at_reader := position(r)) is None or at_reader <= here]
    if late:
        raise IllegalTransform(f"{what}: {', '.join(late)} read(s) {tensor!r} from inside or before the sum's nest; "
                               "each reader must be a nest after the sum's to divide what it reads")


def _require_bounded(program: Program, sum_block: Block, term: Expr, fact: ValueRange, what: str) -> None:
    dtype = sum_block.store.tensor.dtype
    if dtype.kind != "float" or dtype.name not in SIGNIFICAND_BITS:
        raise IllegalTransform(f"{what}: the sum is {dtype.name}; only f32 and f64 sums are bounded here")
    maps = {m.tensor: m for m in map_definitions(program)}
    facts = {r.name: r for r in value_ranges(program)}
    bound = _magnitude(program, sum_block, expand_maps(maps, term), facts)
    n = math.prod(int(iv.extent.value) for iv in sum_block.reduce_iters)  # type: ignore[attr-defined]
    largest = float(np.finfo(dtype.numpy).max)
    if bound is None:
        raise IllegalTransform(
            f"{what}: no bound is known for the new term {term}; without one, Σ a·b may overflow where the plain "
            "Σ (a/d)·b does not (bounds come from finite inputs' dtypes, range facts and exp(e − max e) <= 1)")
    worst = n * bound * (1 + n * 2.0 ** -SIGNIFICAND_BITS[dtype.name]) * max(1.0, 1.0 / fact.lo)
    if not worst < largest:
        raise IllegalTransform(f"{what}: {n} terms of up to {bound:g} may reach {worst:g}, past {dtype.name}'s "
                               f"largest number {largest:g}, where the plain sum of the divided terms does not")


def _magnitude(program: Program, block: Block, e: Expr, facts: dict[str, ValueRange]) -> float | None:
    """A bound on ``|e|`` for every value of ``e`` (in ``block``) that is not NaN, or None where unknown."""
    def go(x: Expr) -> float | None:
        if isinstance(x, Const):
            return abs(float(x.value)) if math.isfinite(float(x.value)) else None
        if isinstance(x, Load):
            t = x.tensor
            if t.name in facts:
                return max(abs(facts[t.name].lo), abs(facts[t.name].hi))
            if t.role == "input" and t.finite and t.dtype.kind == "float":
                return float(np.finfo(t.dtype.numpy).max)
            return None
        if isinstance(x, Cast):
            inner = go(x.value)
            fits = x.dtype.kind == "float" and inner is not None and inner <= float(np.finfo(x.dtype.numpy).max)
            return inner if fits else None
        if isinstance(x, Select):
            a, b = go(x.true_value), go(x.false_value)
            return None if a is None or b is None else max(a, b)
        if isinstance(x, Call) and x.fn == "exp" and at_most_its_max(program, block, x.args[0]):
            return 1.0
        if isinstance(x, BinOp) and x.op in ("*", "+", "-"):
            a, b = go(x.a), go(x.b)
            if a is None or b is None:
                return None
            return a * b if x.op == "*" else a + b
        return None

    out = go(e)
    return out if out is not None and math.isfinite(out) else None


__all__ = ["divided_sums", "hoist_divisor"]
