"""Floating-point side conditions of a repair: the fused program evaluates nothing the plain one does not.

Eq. 3 and Eq. 4 (:mod:`~polyfuse.transforms.repair`) make the fused program equal to the plain one
in real arithmetic.  In floating point it can still go wrong in ways the algebra does not see, each
found by fuzzing: a repair ``t·r/r'`` divides by a running max that is still 0 (rows that start
with zeros), a term ``exp(x - min)`` overflows where ``exp(x - min_final)`` does not, a first
contribution underflows to 0 and is scaled up again, a term at a masked producer is ``-inf - -inf``.
This module proves, for one candidate repair, the side conditions that rule these out, from what
the program guarantees about its running producer values (:class:`ProducerFacts`):

1. **No singular operation.**  Every division, ``log``, ``sqrt`` and power in the term ``g`` (at
   the producers' current values) and in the repair ``h`` (at previous and current values) has an
   argument proven nonzero / positive / non-negative over the running values.  The one exception
   is a *mass* — a sum or max of non-negative terms — that is still exactly 0: then every term it
   has seen is 0 (or underflowed to 0), and the consumer's terms so far are ``0·(data)``.  Such a
   producer value is replaced, in the consumer, by a *surrogate*: the smallest normal number of its
   dtype while it is 0.  The repair is exact for any reference value (Eq. 3 holds for every r), so a
   surrogate changes nothing in real arithmetic; it only keeps ``0/0`` out.  After the last step
   the real value is used, so a row that stays 0 gives what the plain program gives (its ``0/0``).
2. **Range.**  A repair ``h = t·Q`` (a sum, or a max/min with ``h = a·t``) must *decay*:
   ``0 <= Q <= 1`` over the running values, so the accumulator is only ever scaled down — nothing
   that underflowed is scaled back up, nothing overflows by rescaling.  Then the fused term
   ``g(r_k, c)`` is larger than the plain one ``g(r_final, c)`` by ``1/Q``, so it must be *bounded
   by the producer*: its producer-dependent factor has a finite range when each producer is
   written relative to its own term at the current element (``m = p + δ`` for a max, ``s = p/w``
   with ``w`` in (0, 1] for a mass) — FlashAttention's ``exp(x - m) <= 1`` proven, not assumed.
   What multiplies that factor is data the plain program multiplies too.  A repair that shifts a max or
   min (``h = t + g(r') - g(r)``, a term the producers move) evaluates g at the running values too, in
   the shift and in the fused terms: its term must be bounded by the producers the same way, or the
   shift meets ``inf - inf`` where the plain term at the final values is finite.  State repairs
   (polynomials, :mod:`~polyfuse.transforms.auxiliary`) have no division and work at reference
   points near the data; they need only condition 1.
3. **Infinite identities.**  A max (min) producer is -inf (+inf) while it has seen only -inf
   (+inf) elements (masks).  The fused term there is ``g(-inf)`` = ``exp(-inf - -inf)``, NaN,
   where the plain program has ``g(r_final)``.  The term is replaced by the consumer's identity
   only where that is what the plain program's term is for such an element (``g`` with the
   producer's own term at -inf is the identity, e.g. ``exp(p - m) -> 0``); otherwise the fusion is
   refused.

A candidate failing any condition is refused with the condition, and the solver tries the next
(a decaying ratio, then a state repair).  Everything is decided on sympy expressions with interval
arithmetic (:mod:`~polyfuse.transforms.intervals`): sound, never a range too small.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import sympy

from polyfuse.errors import NonAffineIndex, NoRepairFound, PolyfuseError
from polyfuse.ir.affine import fold_div_mod, linear_form
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Load, Var
from polyfuse.ir.stmt import Tensor
from polyfuse.ir.visit import map_expr, substitute, walk_expr
from polyfuse.symbolic import SymbolTable, to_sympy
from polyfuse.transforms.intervals import Interval, bound

__all__ = ["MapDefinition", "Numerics", "ProducerFacts", "check_numerics", "expand_maps", "in_loops"]

_OPEN_UNIT = Interval(0.0, 1.0, False, True)


@dataclass(frozen=True)
class ProducerFacts:
    """What the program guarantees about one producer value the consumer reads.

    ``kind`` is the producer's reducer (max/min/sum/prod, None for another); ``term`` its term for
    the consumer's current element, in the consumer's variables (None where the two cannot be
    matched); ``mass`` says its terms and init are >= 0 and it is a sum or a max; ``repair`` is
    its own repair when it is itself rescaled as it runs (a rolled chain), else None, and
    ``repair_loops`` the bindings of the variables that repair is written in.  ``reference`` says
    its running value stays near its final one, so that a repair shifting terms from one to the
    other does not cancel catastrophically: a max or min (one of its terms), a sum whose own
    repair decays; not a product, which can overflow or change sign as it runs, nor a plain sum,
    whose partial grows with the elements seen — ``estimate`` says the fusions read it through a
    running estimate instead (``r·N/n``), which they do for a state repair.
    """

    load: Load
    kind: str | None
    term: Expr | None
    mass: bool
    repair: object | None = None
    repair_loops: tuple[tuple[str, Expr], ...] = ()
    reference: bool = False
    estimate: bool = False


@dataclass(frozen=True)
class Numerics:
    """The outcome for an accepted repair: which producer values take a surrogate while 0, whether
    ``h = t·Q`` provably decays, which masked-producer guards are exact, the proof (for
    ``explain``), and whether Q stays finite (positive for a max or min consumer) where previous producer
    values are their identities: where masks or data make them so (``identity_safe``: a decaying h then
    needs no identity guard), and for every producer (``first_safe``: nor a rolling loop's first step)."""

    surrogates: frozenset[Load]
    decays: bool
    guards: frozenset[Load]
    proof: str
    identity_safe: bool = True
    first_safe: bool = True


class _Space:
    """The symbols of one analysis, in loop variables: each producer's current value R (the consumer's
    load), its previous value r (a placeholder load ``<name>__old<k>``), and the accumulator t."""

    def __init__(self, facts: Sequence[ProducerFacts], signs: Mapping[str, str], finite: frozenset[str],
                 loops: Sequence[tuple[str, Expr]], maps: Sequence[MapDefinition],
                 ranges: Mapping[str, int] | None = None):
        self.facts = list(facts)
        self.finite = finite
        self.finite_symbols: set[sympy.Symbol] = set()
        self.loops = tuple(loops)
        self.ranges = dict(ranges or {})
        self.maps = {m.tensor: m for m in maps}
        self.table = SymbolTable(reserved=("t",))
        self.signs = signs
        self.t = self.table.bind(Var("t_acc"), "t", real=True)
        self.new: dict[Load, sympy.Symbol] = {}
        self.old: dict[Load, sympy.Symbol] = {}
        self.old_loads: dict[Load, Load] = {}
        # A split's local nest reads its producers' partials <name>_rf: there, they are the current values.
        self.partials = {f"{f.load.tensor.name}_rf": f.load for f in self.facts}
        for k, f in enumerate(self.facts):
            # a mass, or a producer whose running values have a known sign (>= 0 only: a sum starts at 0)
            flags = {"nonnegative": True} if f.mass or f.load.tensor.name in signs else {"real": True}
            name = f.load.tensor.name
            self.new[f.load] = self.table.bind(self.at(f.load), f"{name}'", **flags)
            old = self.placeholder(k, f.load)
            self.old_loads[f.load] = old
            self.old[f.load] = self.table.bind(self.at(old), name, **flags)

    def bind(self, e: Expr, sym: sympy.Symbol) -> None:
        """Let ``e`` stand for ``sym`` in every conversion."""
        self.table.force(e, sym)

    @staticmethod
    def placeholder(k: int, load: Load) -> Load:
        """The stand-in load for producer k's previous value, at ``load``'s indices."""
        return Load(Tensor(f"{load.tensor.name}__old{k}", load.tensor.shape, load.tensor.dtype), load.indices)

    def at(self, e: Expr, loops: Sequence[tuple[str, Expr]] | None = None) -> Expr:
        """``e`` (in the consumer's variables, or those of ``loops``) in loop variables, with the
        temporaries that map blocks compute elementwise written out (so that ``score`` and its
        definition ``qk·scale`` are one value)."""
        # the ranges are the consumer's loops': a producer's own loops may reuse their names with other extents
        ranges = self.ranges if loops is None else None
        return expand_maps(self.maps, in_loops(self.loops if loops is None else loops, e, ranges), ranges)

    def sym(self, e: Expr, *, loops: Sequence[tuple[str, Expr]] | None = None) -> sympy.Basic:
        """sympy for ``e``, given in the consumer's variables (or those ``loops`` bind)."""
        e = self.at(e, loops)
        for ld in walk_expr(e):
            if isinstance(ld, Load) and self.table.lookup(ld) is None:
                sign = self.signs.get(ld.tensor.name)
                if ld.tensor.name in self.partials:
                    self.table.force(ld, self.new[self.partials[ld.tensor.name]])
                    continue
                sym = self.table.bind(ld, ld.tensor.name, real=True, **({sign: True} if sign else {}))
                if ld.tensor.name in self.finite:
                    self.finite_symbols.add(sym)
        return to_sympy(e, self.table)[0]


@dataclass(frozen=True)
class MapDefinition:
    """A temporary that a map block computes elementwise: ``tensor[iters] = value``."""

    tensor: Tensor
    iters: tuple[str, ...]
    value: Expr

    def at(self, indices: Sequence[Expr]) -> Expr:
        return substitute(self.value, dict(zip(self.iters, indices, strict=True)))


def check_numerics(repair, term: Expr, facts: Sequence[ProducerFacts], *, signs: Mapping[str, str] | None = None,
                   finite: frozenset[str] = frozenset(), loops: Sequence[tuple[str, Expr]] = (),
                   maps: Sequence[MapDefinition] = (), ranges: Mapping[str, int] | None = None) -> Numerics:
    """The side conditions of the module docstring for ``repair`` of a consumer with term ``term``
    reading the producer values of ``facts``; raises :class:`NoRepairFound` with the condition
    that fails.  ``signs`` gives tensors whose values are known "nonnegative" or "positive", ``finite``
    those known to hold no ±inf or NaN;
    ``loops`` the consumer's iteration variables' bindings (the facts' terms are in loop variables),
    ``maps`` the temporaries computed elementwise that the terms read, ``ranges`` the extents of the
    consumer's loop variables (:func:`in_loops`)."""
    space = _Space([f for f in facts if f.load in repair.producers], signs or {}, finite, loops, maps, ranges)
    try:
        return _Checker(space, repair, term).run()
    except (TypeError, ValueError, NotImplementedError, RecursionError, ZeroDivisionError) as err:
        raise NoRepairFound(f"the numerical side conditions of h = {repair.h} could not be decided: {err}") from None


class _Checker:
    def __init__(self, space: _Space, repair, term: Expr):
        self.space, self.repair, self.term = space, repair, term
        self.g = space.sym(term)
        self.p: dict[Load, sympy.Basic | None] = {}
        for f in space.facts:
            try:
                self.p[f.load] = space.sym(f.term, loops=()) if f.term is not None else None
            except PolyfuseError:
                self.p[f.load] = None
        self.notes: list[str] = []
        self.ranges: dict[sympy.Symbol, Interval] = {}
        for f in space.facts:
            floor = self._attained(f)
            if floor is not None:
                self.ranges[space.new[f.load]] = Interval(floor / 2, float("inf"))
                self.notes.append(f"{f.load} >= {floor:g} (its term is {floor:g} at the element where its max "
                                  "producers are attained, and it never loses that element): it is never 0")

    # ------------------------------------------------------------------ the whole check
    def run(self) -> Numerics:
        surrogates: set[Load] = set()
        decays, identity_safe, first_safe = False, True, True
        if not self.repair.is_identity:
            h_ir = self._h_ir()
            q = sympy.cancel(self.space.sym(h_ir) / self.space.t)
            if not self.repair.state and self.space.t not in q.free_symbols:
                self._decay(q)
                self._bounded_term()
                decays = True
                identity_safe, first_safe = self._finite_at_identity(q, False), self._finite_at_identity(q, True)
            else:
                scale = sympy.diff(self.space.sym(h_ir), self.space.t)
                if self.repair.state and scale != 1:
                    # A scaled state repair (softmax-like terms, see auxiliary._scaled_factors) rescales
                    # every accumulator by the same factor: it must decay, like t·Q's.
                    self._decay(scale)
                self._references()
                if not self.repair.state:
                    # A shift t + b (a max or min of a term the producers move) evaluates the term at the
                    # producers' running values, in the shift and in the fused terms: where that is not bounded
                    # by the producers it overflows where the plain term at the final values does not, and the
                    # shift meets inf - inf (exp(min) of a running min of data that starts large).
                    self._bounded_term()
                if self.repair.state:
                    self._selects_see_finite_data()
                # A state repair has no identity guard G: at a rolling loop's first step its state is
                # empty (h is t in real arithmetic), but δ from the saved placeholder can be infinite
                # (a producer overflowed at once) and 0·inf is NaN, so that step keeps t.
                first_safe = not self.repair.state
            surrogates |= self._singular(h_ir, "h", self._step_regions())
        self._data_poles()
        surrogates |= self._singular(self.term, "g", self._term_regions())
        guards = self._guards()
        return Numerics(frozenset(surrogates), decays, frozenset(guards), "; ".join(self.notes), identity_safe,
                        first_safe)

    def _references(self) -> None:
        """A repair that shifts (a state repair's polynomial in r' - r, a max's t + b) works at the
        producers' running values: each must stay near its final value (``ProducerFacts.reference``)."""
        far = [f for f in self.space.facts if not (f.reference or (self.repair.state and f.estimate))]
        if far:
            f = far[0]
            raise NoRepairFound(
                f"h = {self.repair.h} shifts the terms by differences of running producer values, but {f.load} "
                f"(a {f.kind or 'custom'} reduction) can run far from its final value (a product overflows or "
                "changes sign, a partial sum is no estimate of the whole where no auxiliary state reads it through "
                "one): the shift would cancel catastrophically or meet inf - inf")
        self.notes.append("every producer's running value stays near its final one (a max or min, a plain sum "
                          "read through its running estimate, a sum rescaled by a decaying repair)")

    def _selects_see_finite_data(self) -> None:
        """A state repair of a term with a select (``select(c, x - m, 0)``) needs finite data: the plain term
        drops an element where c is false whatever x is, but the count state shifts every counted element by
        ``δ = m' - m``, which is ±inf or NaN once an infinite element reaches a producer (``inf - inf``), and a
        NaN kept out of the plain sum by the select reaches the fused one."""
        if not self.g.has(sympy.Piecewise):
            return
        producers = set(self.space.new.values()) | set(self.space.old.values())
        syms = set(self.g.free_symbols) - producers
        for p in self.p.values():
            syms |= (p.free_symbols - producers) if p is not None else set()
        loose = sorted(str(x) for x in syms - self.space.finite_symbols - _integers(syms))
        if loose:
            raise NoRepairFound(
                f"the state repair of g = {self.g} shifts every element its select counts by the producers' change, "
                f"which is not finite once {' or '.join(loose)} holds ±inf or NaN (the plain select drops such an "
                "element, the shifted count does not); declare the inputs finite=True")
        self.notes.append("the data a select's count state reads are declared finite")

    def _finite_at_identity(self, q: sympy.Basic, everywhere: bool) -> bool:
        """h maps the consumer's identity to itself without a guard: Q is finite (and, for a max or min
        consumer, positive: a·(-inf) is -inf only for a > 0) where previous producer values are their
        identities: where a max/min producer's terms can be ±inf (masks, data), and, ``everywhere``, for
        every producer (a rolling loop's first step, where the saved values are the identities).  For a max
        or min consumer, whose identity is infinite, Q must moreover be a positive constant there: a
        factor like exp(r - r') is positive in real arithmetic but can underflow to 0."""
        at = {self.space.old[f.load]: _number(f.kind) for f in self.space.facts
              if f.kind is not None and (everywhere or self._reaches_identity(f))}
        if not at:
            return True
        value = sympy.simplify(q.xreplace(at))
        if self.repair.reducer in ("max", "min"):
            # Positive in real arithmetic is not enough: exp(r - r') underflows to 0 in floating point,
            # and ±inf·0 is NaN; only a constant factor is known to stay positive.
            return bool(value.is_number and value.is_finite and value.is_positive)
        return bool(value.is_finite) or value == 0

    def _h_ir(self) -> Expr:
        old = {ld: self.space.old_loads[ld] for ld in self.repair.producers}
        new = {ld: ld for ld in self.repair.producers}
        state = [Var(f"{s.name}_state") for s in self.repair.state]
        return self.repair.apply(Var("t_acc"), old=old, new=new, guard=False, state=state)

    def _attained(self, f: ProducerFacts) -> float | None:
        """A floor κ > 0 under a mass sum whose term is κ where its max (min) producers are attained.

        ``s = Σ exp(x - m)`` with ``m = max x``: at the element that set m, the term is exactly
        ``exp(0) = 1``, and every later rescale of that element is by ``exp(m - m) = 1`` until m
        moves to a new element, which then contributes 1 in its place.  So the running sum is >= 1
        (less a rounding or two) whenever m is finite — never 0, even where every other term
        underflows.  While m is still at its infinite identity, the term is guarded to 0 and the
        consumer's term is guarded too (condition 3), so the floor is only needed where it holds.
        """
        p = self.p[f.load]
        if not f.mass or f.kind != "sum" or p is None:
            return None
        tight = {}
        for other in self.space.facts:
            R, q = self.space.new[other.load], self.p[other.load]
            if other is f or R not in p.free_symbols:
                continue
            if other.kind not in ("max", "min") or q is None:
                return None
            tight[R] = q
        if not tight:
            return None
        value = sympy.simplify(p.xreplace(tight))
        if not value.is_number or not value.is_positive:
            return None
        floor = float(value)
        return floor if floor >= 2.0 ** -100 else None

    # ------------------------------------------------------------------ regions
    def _term_regions(self) -> list[dict[sympy.Symbol, sympy.Basic]]:
        """Substitutions writing each current value relative to its term at the current element
        (``R = p + δ`` for a max, ``R = p/w`` for a mass), every combination; each describes all the
        running values (the ratio form where ``p > 0``; ``p = 0`` is the zero state)."""
        choices = []
        for f in self.space.facts:
            R, p = self.space.new[f.load], self.p[f.load]
            options: list[dict] = [{}]
            if p is not None and f.kind in ("max", "min"):
                d = sympy.Symbol(f"delta_{R.name}", nonnegative=True)
                options.append({R: p + d if f.kind == "max" else p - d})
            if p is not None and f.mass:
                w = sympy.Dummy(f"w_{R.name}", positive=True)
                self.ranges[w] = _OPEN_UNIT
                options.append({R: p / w})
            choices.append(options)
        return [dict(itertools.chain.from_iterable(c.items() for c in combo)) for combo in itertools.product(*choices)]

    def _step_regions(self) -> list[dict[sympy.Symbol, sympy.Basic]]:
        """Substitutions writing each previous value relative to the current one: ``r = R - ε`` for a
        max (``R + ε`` for a min), ``r = v·R`` for a mass (v in [0, 1]); a producer rescaled by its own
        repair ``q`` relates through ``q·r`` instead."""
        out: dict[sympy.Symbol, sympy.Basic] = {}
        for f in self.space.facts:
            R, r = self.space.new[f.load], self.space.old[f.load]
            own = self._own_factor(f)
            if own is False:
                continue
            if f.kind == "max" and not f.mass:
                rel = R - sympy.Symbol(f"eps_{R.name}", nonnegative=True)
            elif f.kind == "min":
                rel = R + sympy.Symbol(f"eps_{R.name}", nonnegative=True)
            elif f.mass:
                v = sympy.Symbol(f"v_{R.name}", nonnegative=True)
                self.ranges[v] = Interval(0.0, 1.0)
                rel = v * R
            else:
                continue
            out[r] = rel if own is None else rel / own
        return [out]

    def _own_factor(self, f: ProducerFacts) -> sympy.Basic | None | bool:
        """The producer's own repair factor q (its value is rescaled r -> q·r each step) in this space's
        symbols; None when it is not rescaled; False when it is rescaled in a way not expressible here.

        The producers of that repair are ours: the same value in loop variables, or (a split's local
        nest) the partial ``<ours>_rf`` of one of ours, whose previous value is then ours."""
        own = f.repair
        if own is None or own.is_identity:
            return None
        if own.state:
            return False
        ours = {self.space.at(ld): k for k, ld in enumerate(self.space.new)}
        names = {f"{ld.tensor.name}_rf": k for k, ld in enumerate(self.space.new)}
        loads = list(self.space.new)
        old, new = {}, {}
        for ld in own.producers:
            k = ours.get(self.space.at(ld, f.repair_loops), names.get(ld.tensor.name))
            if k is None:
                return False
            old[ld], new[ld] = Var(f"old__{k}", ld.dtype), Var(f"new__{k}", ld.dtype)
            self.space.bind(old[ld], self.space.old[loads[k]])
            self.space.bind(new[ld], self.space.new[loads[k]])
        t = Var("t_own", own.dtype)
        self.space.bind(t, sympy.Symbol("t_own", real=True))
        h = self.space.sym(own.apply(t, old=old, new=new, guard=False), loops=f.repair_loops)
        q = sympy.cancel(h / self.space.table.lookup(t))
        return False if self.space.table.lookup(t) in q.free_symbols else q

    # ------------------------------------------------------------------ condition 1
    def _singular(self, e: Expr, where: str, regions: list[dict]) -> set[Load]:
        """The producer values that need a surrogate so that no operation of ``e`` is singular;
        NoRepairFound if some operation is singular otherwise."""
        needed: set[Load] = set()
        producers = set(self.space.new) | set(self.space.old_loads.values())
        for op, arg, why, _ in _hazards(e):
            if not any(isinstance(n, Load) and n in producers for n in walk_expr(arg)):
                continue
            s = self.space.sym(arg)
            if any(_safe(op, bound(s.xreplace(reg), self.ranges)) for reg in regions):
                continue
            fix = self._zero_state(op, s, regions)
            if fix is None:
                raise NoRepairFound(
                    f"{where} {why} {arg}, which can be {'0' if op != 'sqrt' else 'negative'} at the running values "
                    f"of the producers although the plain program's value after the last element is not; "
                    "no surrogate makes that exact (it is not a sum or max of non-negative terms at 0)")
            self._terms_vanish(fix)
            needed |= fix
            self.notes.append(f"{arg} in {where} is 0 only while {', '.join(str(x) for x in fix)} is 0 (every term "
                              "seen so far 0): a surrogate value keeps 0/0 out")
        return needed

    def _data_poles(self) -> None:
        """Refuse a term with a pole in the data alone: where ``y`` is 0, ``c/y``, ``log(y)`` and
        ``y ** -1`` are infinite, and what an infinite term makes of the producers' values (``r/0`` is
        NaN at ``r = 0``, +inf at ``r > 0``, -inf at ``r < 0``; ``0·inf`` is NaN) depends on them: the
        fused term reads the running values where the plain one reads the final ones.  A NaN of the data
        alone (``sqrt`` or ``log`` of a negative value) is NaN at any producer value, so only poles count."""
        producers = set(self.space.new) | set(self.space.old_loads.values())
        for _, arg, why, pole in _hazards(self.term):
            if not pole:
                continue
            reads = [ld for ld in walk_expr(arg) if isinstance(ld, Load)]
            if not reads or any(ld in producers for ld in reads):
                continue  # condition 1 proper; or sizes and constants (a loop over a size of 0 never runs)
            if not bound(self.space.sym(arg), self.ranges).may_be_zero():
                continue
            raise NoRepairFound(
                f"g {why} {arg}, which can be 0 (data): the term is then infinite, and whether it is NaN, +inf or "
                "-inf depends on the producers' running values (r/0 is NaN while r is 0), not on their values "
                "after the last element; declare the tensor's sign ('positive' or 'negative') if it is never 0")

    def _terms_vanish(self, masses: set[Load]) -> None:
        """A surrogate for a mass at 0 is exact because every term it has seen is 0 and so is the consumer's
        term for each of those elements (``x/s`` with ``s = Σ x²``): the repair scales zeros.  That needs g
        to vanish wherever the mass's own term p does: each factor of p divides g (``g = x·(...)`` for
        ``p = x²``, ``|A|``, ``exp(x - c)``).  Where the consumer reads data the producer does not see
        (``|y|/max|x|``), a zero row of x leaves ``y/surrogate`` — huge or infinite — where the plain
        program has ``y/0``."""
        producers = set(self.space.new.values()) | set(self.space.old.values())
        for f in self.space.facts:
            if f.load not in masses:
                continue
            p = self.p[f.load]
            bad = "its term is not known" if p is None else None
            if p is not None:
                try:
                    factors = [factor for factor, _ in sympy.factor_list(p)[1]]
                except sympy.PolynomialError:  # exp(x - m): not a polynomial, one factor
                    factors = list(sympy.Mul.make_args(p))
                for factor in factors:
                    while isinstance(factor, sympy.Abs):
                        factor = factor.args[0]
                    if not factor.free_symbols - producers:
                        continue
                    _, den = sympy.fraction(sympy.together(self.g / factor))
                    if den.free_symbols & (factor.free_symbols - producers):
                        bad = f"its term's factor {_readable(factor)} does not divide g"
                        break
            if bad:
                raise NoRepairFound(
                    f"{f.load} is 0 while every term it has seen is 0, and a surrogate value for it is exact only "
                    f"where the consumer's term g = {_readable(self.g)} is then 0 too (the repair scales zeros); "
                    f"here {bad}, so for a row of zeros g at the surrogate (huge, or rounded away) is not the plain "
                    "program's g at 0")

    def _zero_state(self, op: str, s: sympy.Basic, regions: list[dict]) -> set[Load] | None:
        """The masses whose zero state alone makes ``s`` singular: with them positive it is safe."""
        masses = [f.load for f in self.space.facts if f.mass]
        for size in range(1, len(masses) + 1):
            for subset in itertools.combinations(masses, size):
                positive = {}
                for ld in subset:
                    for sym in (self.space.new[ld], self.space.old[ld]):
                        positive[sym] = sympy.Dummy(sym.name, positive=True)
                if any(_safe(op, bound(s.xreplace(reg).xreplace(positive), self.ranges)) for reg in regions):
                    return set(subset)
        return None

    # ------------------------------------------------------------------ condition 2
    def _decay(self, q: sympy.Basic) -> None:
        """``0 <= Q <= 1`` over a step: by intervals, else Q = 1 where nothing changed and Q monotone
        in each change."""
        (region,) = self._step_regions()
        missing = [str(self.space.old[f.load]) for f in self.space.facts
                   if self.space.old[f.load] in q.free_symbols and self.space.old[f.load] not in region]
        if missing:
            raise NoRepairFound(
                f"h = t·Q with Q = {sympy.powsimp(q)} rescales the accumulator by a factor not provably in [0, 1]: "
                "nothing is known "
                f"about how {', '.join(missing)} relates to its next value (only a max, a min, or a sum of "
                "non-negative terms moves one way)")
        qs = q
        for _ in range(len(region) + 1):  # a relation may name another producer's previous value
            qs = qs.xreplace(region)
        qs = sympy.powsimp(qs)
        box = bound(qs, self.ranges)
        relations = _relations(region)
        if box.within(0.0, 1.0):
            self.notes.append(f"Q = {sympy.powsimp(q)} lies in {box} over a step ({relations})")
            return
        slacks = sorted(qs.free_symbols & set(self._slack_symbols(region)), key=str)
        tight = {s: (sympy.Integer(1) if s.name.startswith("v_") else sympy.Integer(0)) for s in slacks}
        at_tight = sympy.simplify(qs.xreplace(tight))
        monotone = all(self._monotone(qs, s) for s in slacks)
        if box.lo >= 0 and at_tight == 1 and monotone:
            self.notes.append(f"Q = {sympy.powsimp(q)} is 1 when no producer changes and shrinks as they change "
                              f"({relations}): in [0, 1]")
            return
        raise NoRepairFound(
            f"h = t·Q with Q = {sympy.powsimp(q)} is not provably in [0, 1] over a step ({relations}; it would scale "
            "the accumulator up: what underflowed is not recovered and what is large overflows where the plain "
            "program does not)")

    def _slack_symbols(self, region: dict) -> list[sympy.Symbol]:
        return [s for e in region.values() for s in e.free_symbols if s.name.startswith(("eps_", "v_"))]

    def _monotone(self, e: sympy.Basic, slack: sympy.Symbol) -> bool:
        """``e`` falls as ``slack`` moves from its tight value (ε grows from 0, v falls from 1)."""
        d = bound(sympy.diff(e, slack), self.ranges)
        return d.hi <= 0 if slack.name.startswith("eps_") else d.lo >= 0

    def _bounded_term(self) -> None:
        """The producer-dependent factor of g at the running values has a finite range."""
        failures = []
        for region in self._term_regions():
            sub = sympy.expand_power_exp(sympy.powsimp(self.g.xreplace(region)))
            dependent, data = _split_factors(sub, set(self.ranges) | _slacks_in(region), set(self.space.new.values()))
            box = bound(dependent, self.ranges)
            bad_data = [d for d in data if not _value_like(d, self.ranges)]
            if box.bounded and not bad_data:
                self.notes.append(f"the term's producer-dependent factor {_readable(dependent)} lies in {box} where "
                                  f"{_relations(region) or 'the producers take any value they can'}")
                return
            extra = f", with unbounded data factor {bad_data[0]}" if bad_data else ""
            failures.append(f"{dependent} in {box}{extra}")
        raise NoRepairFound(
            f"the fused term g = {self.g} is not bounded by its producers: at the running values its "
            f"producer-dependent factor is unbounded ({failures[-1]}); the fused program would compute values the "
            "plain one does not and may overflow (a producer bounds a term like exp(x - m) only when m is the "
            "running max of the same x)")

    # ------------------------------------------------------------------ condition 3
    def _guards(self) -> set[Load]:
        """Max/min producers whose infinite identity is reachable by data, and for which the term at
        such an element is exactly the consumer's identity (guard_term exact); refuse otherwise."""
        out: set[Load] = set()
        identity = _number(self.repair.reducer)
        for f in self.space.facts:
            p = self.p[f.load]
            if p is None or not self._reaches_identity(f):
                continue
            inf = -sympy.oo if f.kind == "max" else sympy.oo
            R = self.space.new[f.load]
            finite = sympy.Symbol(f"{R.name}_final", real=True)
            at = _at_term_value(self.g.xreplace({R: finite}), p, inf)
            if at is not None and at == identity:
                out.add(f.load)
                continue
            raise NoRepairFound(
                f"while {f.load} has seen only {inf} elements it is {inf}, and the fused term g = {self.g} there is "
                f"{self.g.xreplace({R: inf})} where the plain program's term for such an element is "
                f"{at if at is not None else 'not known'}, not the identity {identity}; no guard makes that exact "
                f"(if the data cannot hold ±inf, declare the input finite=True)")
        return out

    def _reaches_identity(self, f: ProducerFacts) -> bool:
        """A max (min) producer whose terms can be -inf (+inf): unbounded below (above) and not finite."""
        if f.kind not in ("max", "min"):
            return False
        p = self.p[f.load]
        if p is None:
            return True
        pb = bound(p, self.ranges)
        bounded = pb.lo > -float("inf") if f.kind == "max" else pb.hi < float("inf")
        return not bounded and not self._finite(p)

    def _finite(self, p: sympy.Basic) -> bool:
        """``p`` is finite in floating point: |affine| of inputs declared finite, coefficients summing to
        at most 1 in magnitude (nothing can overflow)."""
        inner = p.args[0] if isinstance(p, sympy.Abs) else p
        syms = inner.free_symbols
        if not syms or not syms <= self.space.finite_symbols | _integers(syms):
            return False
        if not inner.is_polynomial(*syms) or sympy.Poly(inner, *syms).total_degree() > 1:
            return False
        coeffs = [inner.coeff(x) for x in syms - _integers(syms)]
        return all(c.is_number for c in coeffs) and sum(abs(float(c)) for c in coeffs) <= 1


def in_loops(bindings: Sequence[tuple[str, Expr]], e: Expr, ranges: Mapping[str, int] | None = None) -> Expr:
    """``e`` with a block's iteration variables replaced by their ``bindings`` (loop variables) and
    every affine index in one canonical form, so that two blocks' expressions for one element (a
    consumer's and its producer's) compare equal.  ``ranges`` (loop variable → extent) folds the floor
    divisions and remainders they decide: a producer recomputed per tile of a consumer's loop is read at
    ``dv // 256`` by the consumer, ``(256·dv_0 + dv_1) // 256`` in loop variables, which is ``dv_0``."""
    out = substitute(e, dict(bindings))
    return map_expr(out, lambda n: Load(n.tensor, tuple(_canonical(fold_div_mod(i, ranges or {}))
                                                        for i in n.indices))
                    if isinstance(n, Load) else None)


def expand_maps(maps: Mapping[Tensor, MapDefinition], e: Expr, ranges: Mapping[str, int] | None = None) -> Expr:
    """``e`` (in loop variables) with every read of a temporary of ``maps`` replaced by its definition."""
    for _ in range(len(maps)):
        expanded = map_expr(e, lambda n: maps[n.tensor].at(n.indices) if isinstance(n, Load) and n.tensor in maps
                            else None)
        if expanded == e:
            break
        e = in_loops((), expanded, ranges)
    return e


def _canonical(index: Expr) -> Expr:
    try:
        form = linear_form(index)
    except NonAffineIndex:
        return index
    out: Expr | None = None
    for key in sorted(form, key=lambda k: (k == 1, str(k))):
        c = form[key]
        atom: Expr = Const(c, index.dtype) if key == 1 else (Var(key, index.dtype) if isinstance(key, str) else key)
        if key != 1 and c != 1:
            atom = BinOp("*", Const(c, index.dtype), atom)
        out = atom if out is None else BinOp("+", out, atom)
    return out if out is not None else Const(0, index.dtype)


def _readable(e: sympy.Basic) -> str:
    """``e`` with the slack variables of the regions named as the notes read: δ, ε, v, w."""
    names = {}
    for x in e.free_symbols:
        for prefix, name in (("delta_", "δ"), ("eps_", "ε"), ("v_", "v"), ("w_", "w")):
            if x.name.startswith(prefix) or x.name.startswith("_" + prefix):
                names[x] = sympy.Symbol(name)
    return str(e.xreplace(names))


def _relations(region: Mapping[sympy.Symbol, sympy.Basic]) -> str:
    """The substitutions of a region, as they read: ``m' = x + δ`` (δ >= 0), ``s' = p/w`` (0 < w <= 1)."""
    kinds = {"δ": "δ >= 0", "ε": "ε >= 0", "v": "0 <= v <= 1", "w": "0 < w <= 1"}
    parts = []
    for sym, value in region.items():
        shown = _readable(value)
        used = [k for name, k in kinds.items() if name in shown.replace("Abs", "")]
        parts.append(f"{sym} = {shown}" + (f" with {', '.join(used)}" if used else ""))
    return "; ".join(parts)


def _integers(syms: set[sympy.Symbol]) -> set[sympy.Symbol]:
    return {x for x in syms if x.is_integer}


def _number(reducer: str) -> sympy.Basic:
    return {"sum": sympy.Integer(0), "prod": sympy.Integer(1), "max": -sympy.oo, "min": sympy.oo}[reducer]


def _at_term_value(g: sympy.Basic, p: sympy.Basic, value: sympy.Basic) -> sympy.Basic | None:
    """g where the producer's own term p takes ``value`` (±∞), or None if that cannot be told: p is
    replaced where it occurs whole, else solved for one of its symbols; then the limit.  Where floating
    point evaluates g at ±∞ to NaN (``exp(p - m)·(p - m)``: 0·∞), NaN, whatever the limit: the plain
    program computes that NaN."""
    pi = sympy.Dummy("p", real=True)
    replaced = g.xreplace({p: pi})
    if pi in replaced.free_symbols and not (replaced.free_symbols & p.free_symbols):
        return _ieee_limit(replaced, pi, value)
    for x in sorted(p.free_symbols, key=str):
        solutions = sympy.solve(sympy.Eq(p, pi), x)
        if len(solutions) != 1:
            continue
        at = g.xreplace({x: solutions[0]})
        if x not in at.free_symbols and pi in at.free_symbols:
            return _ieee_limit(at, pi, value)
    return None


def _ieee_limit(g: sympy.Basic, pi: sympy.Symbol, value: sympy.Basic) -> sympy.Basic:
    direct = g.xreplace({pi: value})
    return sympy.nan if direct.has(sympy.nan, sympy.zoo) else sympy.limit(g, pi, value)


def _hazards(e: Expr) -> Iterator[tuple[str, Expr, str, bool]]:
    """The operations of ``e`` that can be singular: (kind, argument, description, whether the argument at 0
    is a pole: ``c/0``, ``log(0)``, ``0 ** -k`` are infinite, ``sqrt(0)`` and ``0 ** k`` are not)."""
    for n in walk_expr(e):
        if isinstance(n, BinOp) and n.op == "/" and n.dtype.is_float:
            yield "div", n.b, "divides by", True
        elif isinstance(n, BinOp) and n.op == "pow":
            yield "pow", n.a, "raises to a power", not (isinstance(n.b, Const) and n.b.value >= 0)
        elif isinstance(n, Call) and n.fn in ("log", "log2"):
            yield "log", n.args[0], "takes the log of", True
        elif isinstance(n, Call) and n.fn == "sqrt":
            yield "sqrt", n.args[0], "takes the square root of", False


def _safe(op: str, box: Interval) -> bool:
    """Whether ``op`` is not singular on any float in ``box`` (a positive value may round to 0)."""
    if op in ("div", "pow", "log"):
        return not box.may_be_zero() and (op != "log" or box.lo > 0)
    return box.lo >= 0


def _slacks_in(region: dict) -> set[sympy.Symbol]:
    return {s for e in region.values() for s in e.free_symbols if s.name.startswith(("delta_", "w_"))
            or isinstance(s, sympy.Dummy)}


def _split_factors(e: sympy.Basic, slacks: set[sympy.Symbol],
                   producers: set[sympy.Symbol]) -> tuple[sympy.Basic, list[sympy.Basic]]:
    """``e`` as (the product of its factors reading a slack or a producer, the other factors)."""
    marked = slacks | producers
    factors = sympy.Mul.make_args(e)
    dependent = [f for f in factors if f.free_symbols & marked]
    return sympy.Mul(*dependent), [f for f in factors if not f.free_symbols & marked]


def _value_like(e: sympy.Basic, ranges: Mapping[sympy.Symbol, Interval]) -> bool:
    """A data factor the plain program's term multiplies too: anything but an exponential that is not
    bounded above (``exp(y - x)``: a max of another tensor does not bound it)."""
    for n in sympy.preorder_traversal(e):
        if isinstance(n, sympy.exp) or (isinstance(n, sympy.Pow) and not n.exp.is_Number):
            if not bound(n, ranges).hi < float("inf"):
                return False
    return True

