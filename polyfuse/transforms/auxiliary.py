"""Auxiliary accumulators: exact fusion of a sum whose term is a polynomial in its producers (or one
branch by branch of a select, or times a softmax-like exponential).

When no single repair ``h(t, r, r')`` exists (mean → variance: ``g = (c - r)²``
does not distribute over +), a larger state does.  For ``X = Σ g(r, c)`` with g a
polynomial of degree d in the producer results ``r = (r_1 … r_p)`` (after the
change of variables of :mod:`~polyfuse.transforms.repair`), Taylor's formula is
exact::

    g(r', c) = Σ_{|β| <= d} T_β(r, c)·δ^β,   T_β = ∂^β g / β!,   δ = r' - r

so with the auxiliary reductions ``A_β = Σ T_β(r, c)`` (``A_0 = X``) every state
component is repaired by the same triangular, binomial map in δ::

    A_α(r') = Σ_{β >= α} C(β, α)·A_β(r)·δ^(β - α)        (C(β, α) = Π_i C(β_i, α_i))

For ``g = (c - r)²``: ``A_1 = Σ -2(c - r)``, ``A_2 = Σ 1 = n`` and
``X' = X + A_1·δ + A_2·δ²``, ``A_1' = A_1 + 2·A_2·δ`` — Welford's update, and
with partial states relative to split-local r merged into the global r, Chan's
parallel formula.  Coefficients that are identically 0 are dropped, equal ones
share one accumulator (inertia's ``Σ w`` serves all three coordinates).

A select on a condition free of the producers is a polynomial branch by branch, and its Taylor
coefficients are selects too: ``select(c, x - m, 0)`` has ``A_1 = Σ select(c, -1, 0)``, minus the count of
the elements where c holds, and ``X' = X + A_1·δ`` (the identities are proven branch by branch).
:mod:`~polyfuse.transforms.numerics` then asks for finite data: the plain select drops an infinite element,
the shifted count does not.

A term ``E(r, c)·P(r, c)`` whose exponential factor E rescales by a c-free ``φ = E(r', c)/E(r, c)``
(``exp(x - m)·(x - m)``: φ = exp(m - m')) and whose P is a polynomial in r gets the same state with
P's coefficients times E, every component's repair multiplied by φ: the accumulators stay at the
producers' running scale (a max moves them down only; :mod:`~polyfuse.transforms.numerics` proves
0 <= φ <= 1), and nothing is recombined by subtraction (``A - m·S`` would cancel).

Each repair ``h_α(t, A, r, r')`` is a :class:`~polyfuse.transforms.repair.Repair`
whose ``state`` symbols stand for the auxiliary accumulators *before* the update
(the fusions order the updates X, A_1, …, so each reads the higher ones not yet
updated).  The whole map is proven symbolically: every component, summed over a
symbolic sample of three elements, is expanded and compared at r and r' (rolling
update); and partial states of a split sample, each taken at its own reference ρ_s,
shifted to r' and added, equal the whole sample's state at r' (the split-k combine).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from polyfuse.errors import InternalError, PolyfuseError
from polyfuse.ir.expr import Const, Expr, Load, cast, const
from polyfuse.ir.stmt import Block, Program, Store, Tensor
from polyfuse.ir.visit import free_vars, loads, map_expr, seq
from polyfuse.symbolic import from_sympy
from polyfuse.transforms.tree import block_path, replace_node

if TYPE_CHECKING:
    from polyfuse.transforms.repair import Repair

__all__ = ["Auxiliary", "add_auxiliary_blocks", "add_sibling_sums", "estimate", "plain_sum", "polynomial_state",
           "with_references"]

MAX_AUXILIARIES = 12
"""More auxiliary accumulators than this is a sign of a term that should not be fused this way."""
_SAMPLE = 3


@dataclass(frozen=True)
class Auxiliary:
    """One auxiliary reduction ``A = Σ term`` of a state repair, with its own repair."""

    name: str
    term: Expr
    g: sympy.Expr
    why: str
    repair: Repair

    def describe(self) -> str:
        return f"{self.name} = Σ {self.g} ({self.why}; repaired by h = {self.repair.h})"


def polynomial_state(solver, reasons: list[str]) -> Repair | None:
    """The state repair of ``solver``'s sum when its g is a polynomial in the producers, else None
    (with the reason appended to ``reasons``)."""
    if solver.kind != "sum":
        reasons.append(f"no auxiliary accumulators: f is {solver.kind}, not a sum")
        return None
    old, new = list(solver.old), list(solver.new)
    g = solver.g
    scale, e, poly = _scaled_factors(g, old, new, solver.cs)
    degree = _degree(poly, old)
    if degree is None:
        reasons.append(f"no auxiliary accumulators: g = {g} is not a polynomial in {', '.join(map(str, old))}"
                       + ("" if scale == 1 else f" (nor {e} times one)")
                       + (", not even branch by branch of a select on a condition free of them"
                          if g.has(sympy.Piecewise) else ""))
        return None
    classes = [(alphas, e * t) for alphas, t in _taylor_classes(poly, old, degree)]
    if len(classes) > MAX_AUXILIARIES:
        reasons.append(f"no auxiliary accumulators: g has {len(classes)} Taylor coefficients in the producers "
                       f"(more than {MAX_AUXILIARIES})")
        return None
    state = tuple(sympy.Symbol(solver.table.fresh_name(f"A{k + 1}"), real=True) for k in range(len(classes)))
    index = {alpha: k for k, (alphas, _) in enumerate(classes) for alpha in alphas}
    delta = [b - a for a, b in zip(old, new, strict=True)]

    def shifted(alpha: tuple[int, ...]) -> sympy.Expr:
        """Σ_{β > α} C(β, α)·A_β·δ^(β - α), over the coefficients that exist."""
        out = sympy.Integer(0)
        for beta, k in index.items():
            if beta != alpha and all(b >= a for a, b in zip(alpha, beta, strict=True)):
                factor = math.prod(math.comb(b, a) for a, b in zip(alpha, beta, strict=True))
                out += factor * state[k] * math.prod(d ** (b - a) for d, a, b in zip(delta, alpha, beta, strict=True))
        return out

    zero = (0,) * len(old)
    hs = [scale * (solver.t + shifted(zero))] + [scale * (solver.t + shifted(alphas[0])) for alphas, _ in classes]
    terms = [g] + [t for _, t in classes]
    failed = _prove(solver, terms, hs, state)
    if failed is not None:
        reasons.append(f"the auxiliary state does not repair exactly: {failed}")
        return None
    scaled = "" if scale == 1 else (f" times {e}, which every update rescales by {scale} (each accumulator "
                                    "carries the producer's running scale)")
    proof = (f"no single repair ({'; '.join(reasons)}); g is a polynomial of degree {degree} in "
             f"{', '.join(map(str, old))}{scaled}: Taylor's formula is exact, "
             f"so (X, {', '.join(map(str, state))}) transforms by a binomial matrix in δ = r' - r; proven "
             f"symbolically over a sample of {_SAMPLE} elements, and for the split-k combine (partial states at "
             "split-local references, each shifted to r' and added: Chan's parallel formula)")
    auxiliaries = []
    for k, ((alphas, term), h) in enumerate(zip(classes, hs[1:], strict=True)):
        factored = _factored(term)
        try:
            ir = from_sympy(factored, solver.table.mapping, solver.dtype)
        except PolyfuseError as err:
            reasons.append(f"the auxiliary term {term} cannot be written as IR: {err}")
            return None
        aux_repair = solver._repair(h, proof, g=factored, state=state)
        auxiliaries.append(Auxiliary(f"aux{k + 1}", ir, factored, _why(alphas, old), aux_repair))
    return solver._repair(hs[0], proof, state=state, auxiliaries=tuple(auxiliaries))


def _degree(g: sympy.Expr, old: list[sympy.Symbol]) -> int | None:
    """g's total degree in the producers ``old`` where g is a polynomial in them, else None.

    A select on a condition free of the producers is a polynomial branch by branch, and so is its
    Taylor expansion: ``select(c, x - m, 0) = [c]·x - [c]·m`` has the coefficient ``∂g/∂m = select(c, -1, 0)``,
    whose sum is minus the count of the elements where c holds (the count-based state of a piecewise-linear
    term).  Where the condition reads a producer (``select(x > m, …)``) the partition moves with it: None.
    """
    folded = sympy.piecewise_fold(g) if g.has(sympy.Piecewise) else g
    if isinstance(folded, sympy.Piecewise):
        if any(cond.free_symbols & set(old) for _, cond in folded.args):
            return None
        branches = [b for b, _ in folded.args]
    else:
        branches = [folded]
    if any(b.has(sympy.Piecewise) or not b.is_polynomial(*old) for b in branches):
        return None
    return max(sympy.Poly(b, *old).total_degree() if b.free_symbols & set(old) else 0 for b in branches)


def _vanishes(e: sympy.Expr) -> bool:
    """``e`` is 0, branch by branch where it holds selects (each branch expanded)."""
    folded = sympy.piecewise_fold(sympy.expand(e)) if e.has(sympy.Piecewise) else sympy.expand(e)
    if isinstance(folded, sympy.Piecewise):
        return all(sympy.expand(b) == 0 for b, _ in folded.args)
    return folded == 0


def _scaled_factors(g: sympy.Expr, old: list[sympy.Symbol], new: list[sympy.Symbol],
                    cs: list[sympy.Symbol]) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """``(φ, E, P)`` with ``g = E·P``: E the product of g's exponential factors, P the rest, and
    ``E(r', c) = φ·E(r, c)`` with φ free of every c — the running scale of a softmax-like term
    (``exp(x - m)``: φ = exp(m - m')).  ``(1, 1, g)`` where g has no such factor.

    With P a polynomial in r, ``g(r', c) = φ·E(r, c)·P(r', c)`` and Taylor's formula in P gives the
    state repair below, every component multiplied by φ: the accumulators ``Σ E·T_β(P)`` are kept
    at the producers' running scale, as the plain sum ``Σ E`` of a softmax is.
    """
    factors = sympy.Mul.make_args(g)
    exps = [f for f in factors if isinstance(f, sympy.exp) and f.free_symbols & set(old)]
    if not exps:
        return sympy.Integer(1), sympy.Integer(1), g
    e = sympy.Mul(*exps)
    renew = dict(zip(old, new, strict=True))
    scale = sympy.powsimp(sympy.expand_power_exp(e.xreplace(renew) / e))
    scale = sympy.exp(sympy.expand(scale.args[0])) if isinstance(scale, sympy.exp) else scale
    if scale.free_symbols & set(cs):
        return sympy.Integer(1), sympy.Integer(1), g
    return scale, e, sympy.Mul(*[f for f in factors if f not in exps])


def _factored(term: sympy.Expr) -> sympy.Expr:
    """``term`` factored, its exponentials kept whole: ``exp(x - m)``, never ``exp(x)·exp(-m)``,
    which overflows where the plain program does not; and its number coefficient kept outside the
    sum it multiplies: ``-2·(x - m)/7``, never ``2·m/7 - 2·x/7`` (sympy distributes a number over a
    sum when it rebuilds a product).  The difference of the element and its producer is what the
    plain program computes, exactly where the two are close; the distributed form rounds each scaled
    value at their magnitude and subtracts, an error of the offset's size in every element."""
    coeff, rest = sympy.factor(term).as_coeff_Mul()
    rest = sympy.powsimp(rest, combine="exp")
    return rest if coeff == 1 else coeff if rest == 1 else sympy.Mul(coeff, rest, evaluate=False)


def _taylor_classes(g: sympy.Expr, old: list[sympy.Symbol],
                    degree: int) -> list[tuple[list[tuple[int, ...]], sympy.Expr]]:
    """The nonzero coefficients ``T_α = ∂^α g/α!`` (0 < |α| <= degree), equal ones grouped."""
    classes: list[tuple[list[tuple[int, ...]], sympy.Expr]] = []
    for total in range(1, degree + 1):
        for alpha in _multi_indices(len(old), total):
            d = g
            for sym, a in zip(old, alpha, strict=True):
                d = sympy.diff(d, sym, a) if a else d
            term = sympy.expand(d / math.prod(math.factorial(a) for a in alpha))
            if term.has(sympy.Piecewise):
                term = sympy.piecewise_fold(term)
            if _vanishes(term):
                continue
            same = next((c for c in classes if _vanishes(c[1] - term)), None)
            if same is None:
                classes.append(([alpha], term))
            else:
                same[0].append(alpha)
    return classes


def _multi_indices(n: int, total: int):
    return sorted((a for a in itertools.product(range(total + 1), repeat=n) if sum(a) == total), reverse=True)


def _why(alphas: list[tuple[int, ...]], old: list[sympy.Symbol]) -> str:
    def one(alpha: tuple[int, ...]) -> str:
        order = sum(alpha)
        parts = "".join(f"∂{s}" + (f"^{a}" if a > 1 else "") for s, a in zip(old, alpha, strict=True) if a)
        scale = math.prod(math.factorial(a) for a in alpha)
        return f"Σ {'1/' + str(scale) + '·' if scale > 1 else ''}∂^{order}g/{parts}" if order > 1 \
            else f"Σ ∂g/{parts}"
    return "Taylor coefficient " + " = ".join(one(a) for a in alphas)


def _prove(solver, terms: list[sympy.Expr], hs: list[sympy.Expr], state: tuple[sympy.Symbol, ...]) -> str | None:
    """None if, summed over a symbolic sample, every component maps its value at r to its value at r'
    (rolling update), and partial states of a split sample, each at its own reference, shift to r'
    and add up to the whole sample's state (the split-k combine); else what failed."""
    cs = [c for c in solver.cs if any(c in t.free_symbols for t in terms)]
    samples = [{c: sympy.Symbol(f"{c}_{s}", real=True) for c in cs} for s in range(_SAMPLE)]
    renew = dict(zip(solver.old, solver.new, strict=True))

    def total(term: sympy.Expr, part: range = range(_SAMPLE)) -> sympy.Expr:
        return sum((term.xreplace(samples[s]) for s in part), sympy.Integer(0))

    at_old = [total(t) for t in terms]
    values = dict(zip(state, at_old[1:], strict=True))
    for term, value, h in zip(terms, at_old, hs, strict=True):
        residue = h.xreplace({solver.t: value, **values}) - value.xreplace(renew)
        if not _vanishes(residue):
            return f"for the component Σ {term}, h = {h} leaves {residue}"
    # The combine: splits {0, 1} and {2} with references ρ_k of their own.
    parts = (range(0, _SAMPLE - 1), range(_SAMPLE - 1, _SAMPLE))
    refs = [{r: sympy.Symbol(f"{r}_ref{k}", real=True) for r in solver.old} for k in range(len(parts))]
    partial = [[total(t, part).xreplace(ref) for t in terms] for part, ref in zip(parts, refs, strict=True)]
    for k, (term, h) in enumerate(zip(terms, hs, strict=True)):
        combined = sum((h.xreplace({solver.t: p[k], **dict(zip(state, p[1:], strict=True)), **ref})
                        for p, ref in zip(partial, refs, strict=True)), sympy.Integer(0))
        residue = combined - at_old[k].xreplace(renew)
        if not _vanishes(residue):
            return f"combining partial states of Σ {term} at split-local references with h = {h} leaves {residue}"
    return None


def add_auxiliary_blocks(program: Program, block: str, repair: Repair) -> tuple[Program, list[str]]:
    """``block`` followed, in the same loops, by one reduction per auxiliary of ``repair``.

    Each ``<block>_<aux>`` is the consumer with its term replaced by the auxiliary's and its
    store redirected to a new temp ``<X>_<aux>`` of X's shape (see :func:`add_sibling_sums`).
    Placed right after the consumer, the updates run in the order X, A_1, … that the state
    repair relies on.
    """
    return add_sibling_sums(program, block, [(aux.name, aux.term) for aux in repair.auxiliaries])


def add_sibling_sums(program: Program, block: str, terms: list[tuple[str, Expr]]) -> tuple[Program, list[str]]:
    """``block`` followed, in the same loops and over the same instances, by ``<block>_<suffix>``
    reducing ``term`` into a new temp ``<X>_<suffix>`` of X's shape, for each ``(suffix, term)``.

    Preconditions:
      1. ``block`` is a reduction (its reducer combines the new terms too);
      2. each term reads only what ``block``'s iterations and the program's sizes index.

    Each starts at the reducer's identity, whatever X's own init is: it sums coefficients
    (an auxiliary) or counts (the fraction of a split's elements), not X.
    """
    _, b = block_path(program, block)
    if b.reducer is None:
        raise PolyfuseError(f"block {block!r} is not a reduction; it has no auxiliary accumulators")
    names = {iv.var.name for iv in b.iters} | {p.name for p in program.params}
    for suffix, term in terms:
        stray = sorted(free_vars(term) - names)
        if stray:
            raise InternalError(f"the term {term} of {block}_{suffix} uses {', '.join(stray)}, which are not "
                                f"iterations of block {block!r}")
    x = b.store.tensor
    tensors, blocks = [], []
    for suffix, term in terms:
        t = Tensor(f"{x.name}_{suffix}", x.shape, x.dtype, "temp", x.scope)
        acc = Load(t, b.store.indices)
        store = Store(t, b.store.indices, b.reducer.apply(acc, term))
        tensors.append(t)
        blocks.append(b.replace(name=f"{block}_{suffix}", store=store, init=b.reducer.identity))
    body = replace_node(program.body, b, seq(b, *blocks))
    return program.replace(tensors=program.tensors + tuple(tensors), body=body), [a.name for a in blocks]


def plain_sum(program: Program, producer: str) -> bool:
    """True for a producer that is a sum, from 0, of terms reading no other reduction's result.

    Its partial value grows with the elements seen, so as the reference point of a state
    repair it sits far from the data until the very end (a partial ``Σ x/L`` is not a running
    mean), and the terms ``g(r, c)`` cancel catastrophically.  A repaired producer (a centre
    ``Σ w·x/M`` rescaled by ``M/M'``) already is a running estimate.
    """
    b = program.block(producer)
    term = b.reduce_term()
    if term is None or b.init != b.reducer.identity or not _is_sum(b):  # type: ignore[union-attr]
        return False
    reductions = {x.store.tensor.name for x in program.blocks() if x.reducer is not None}
    return not any(ld.tensor.name in reductions for ld in loads(term))


def _is_sum(b: Block) -> bool:
    from polyfuse.transforms.repair import reducer_kind

    try:
        return reducer_kind(b.reducer) == "sum"
    except PolyfuseError:
        return False


def estimate(r: Expr, fraction: tuple[Expr, Expr]) -> Expr:
    """``r / fraction``: a partial sum extrapolated to all elements (``fraction`` = seen/total as
    (seen, total)), the reference point of a state repair.  Any reference is exact — the state
    is repaired from one to the next — so this only decides accuracy; with everything seen the
    factor is exactly 1 and the reference is r itself.

    A division, not ``r·(total/seen)``: a backend may contract ``x - r·q`` into one fused
    multiply-add in some places and not in others, and the reference must be the same value
    wherever it is used (the terms and the repair's δ), or the repair is off by its rounding.
    """
    seen, total = fraction
    if isinstance(seen, Const) and isinstance(total, Const):
        part = const(seen.value / total.value, r.dtype)
    elif isinstance(total, Const) and total.value == 1:
        part = cast(r.dtype, seen)
    else:
        part = cast(r.dtype, seen) / cast(r.dtype, total)
    return r / part


def with_references(block: Block, refs: dict[Load, Expr]) -> Block:
    """``block`` with each producer value in its stored value replaced by its reference point."""
    value = map_expr(block.store.value, lambda n: refs.get(n) if isinstance(n, Load) else None)
    return block.replace(store=Store(block.store.tensor, block.store.indices, value))
