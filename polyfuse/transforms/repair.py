"""The repair solver: derive ``h(t, r, r')`` for a consumer ``X = X ⊕f g(r, c)``.

Breaking the temporal dependence of a consumer reduction on its producers
``r`` (Neptune §4.1–4.2) is only legal with a repair ``h`` that satisfies, for
all ``r, r', c, x, y``:

* Eq. 3 — ``h(g(r, c), r, r') = g(r', c)``: h swaps an out-of-date ``r`` for ``r'``;
* Eq. 4 — ``h(x ⊕ y, r, r') = h(x, r, r') ⊕ h(y, r, r')``: h distributes over f,
  so one application fixes a whole partial reduction.

How h is found:

1. Change of variables (Neptune §4.2): every maximal sub-expression of g that
   reads no producer (inputs, masks, biases, casts of inputs) becomes one
   symbol ``c``; constants stay numbers, and with ``reduce_vars`` given, a
   sub-expression that does not vary along the reduction (a size, ``bias[i]``)
   stays as itself, so it may appear in h.
2. With exactly one ``c``: solve ``g0(r, c) = t`` for c and set
   ``h = g0(r', g0⁻¹(r, t))`` (Eq. 5); several solutions must give one h.
3. Otherwise, or if that fails: the separable forms ``h = t·g(r',c)/g(r,c)``
   and ``h = t + (g(r',c) - g(r,c))``, each usable when it does not depend on c
   (RedFuser §4.2's decomposability with ⊗ = × or +).
4. Each candidate must be *proven*: Eq. 3 by sympy simplification and on random
   points in float64; Eq. 4 symbolically — linear and homogeneous in t for +,
   multiplicative for ×, ``a·t + b`` with ``a >= 0`` provable for max/min.

Nothing unproven is returned: the first candidate that passes is the repair.
If none does and f is a sum whose g is a polynomial in r, the repair is a state
repair (:mod:`~polyfuse.transforms.auxiliary`): auxiliary reductions of g's
Taylor coefficients join X and the whole state is repaired by a binomial map.
Otherwise, :class:`~polyfuse.errors.NoRepairFound` lists every route and
the condition that failed.  Refused up front, because no h(t, r, r') can undo
them: a value mixing producers and c that is rounded to a narrower float
(``round_fp8e4m3`` …, see :mod:`polyfuse.symbolic`) or truncated to an integer,
and a condition comparing producers with c.  ``approximate=True`` treats such
roundings as exact (the repaired result then differs from the unfused one by
about the narrow format's rounding error — only on explicit request).  A
rounding or condition of r alone is fine: h computes it too.  A ``select`` on a
producer-free condition (a mask applied after subtracting m) splits g into
branches; h comes from the branch that reads producers and is proven on all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import sympy
from sympy.core.function import AppliedUndef

from polyfuse.errors import NoRepairFound, PolyfuseError
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Cast, Expr, Load, Var, cast, eq, logical_and, logical_not, logical_or, select
from polyfuse.ir.stmt import Reducer
from polyfuse.ir.visit import children, free_vars, walk_expr
from polyfuse.symbolic import SymbolTable, abbreviate, evaluate, from_sympy, is_rounding, rounded_dtype, to_sympy
from polyfuse.transforms.numerics import MapDefinition, Numerics, ProducerFacts, check_numerics

if TYPE_CHECKING:
    from polyfuse.transforms.auxiliary import Auxiliary

__all__ = ["Repair", "reducer_kind", "solve_repair"]

_KIND_OF_OP = {"+": "sum", "*": "prod", "max": "max", "min": "min"}
_OP_OF_KIND = {v: k for k, v in _KIND_OF_OP.items()}
_COMBINE = {"sum": sympy.Add, "prod": sympy.Mul, "max": sympy.Max, "min": sympy.Min}
_SAMPLES = 32
_RTOL, _ATOL = 1e-9, 1e-12


@dataclass(frozen=True)
class Repair:
    """A proven repair ``h(t, r, r')`` of one consumer reduction.

    ``g`` and ``h`` are sympy expressions; ``symbols`` maps every symbol of ``g``
    (producers ``r``, abstracted ``c``'s, loop-invariant leaves) to its IR
    expression; ``old[k]``/``new[k]`` are ``r_k``/``r_k'`` for ``producers[k]``; ``numerics``
    what the floating-point side conditions established (None where the caller described no
    producers, see :func:`solve_repair`).
    """

    reducer: str
    g: sympy.Expr
    h: sympy.Expr
    t: sympy.Symbol
    producers: tuple[Load, ...]
    old: tuple[sympy.Symbol, ...]
    new: tuple[sympy.Symbol, ...]
    abstracted: tuple[sympy.Symbol, ...]
    symbols: tuple[tuple[sympy.Symbol, Expr], ...]
    cases: str
    dtype: DType
    state: tuple[sympy.Symbol, ...] = ()
    auxiliaries: tuple[Auxiliary, ...] = ()
    numerics: Numerics | None = None

    @property
    def mapping(self) -> dict[sympy.Symbol, Expr]:
        return dict(self.symbols)

    @property
    def is_identity(self) -> bool:
        """True when h is ``t``: the consumer does not actually depend on its producers."""
        return self.h == self.t

    @property
    def keeps_identity(self) -> bool:
        """True when h maps the reducer's identity to itself (Eq. 4); a state repair
        (h reads auxiliary accumulators) does not: X = 0 with A ≠ 0 still changes."""
        return not self.state

    def apply(self, t: Expr, old: Mapping[Load, Expr], new: Mapping[Load, Expr], *, guard: bool = True,
              state: Sequence[Expr] = (), keep: Expr | None = None,
              final_identity: Mapping[Load, Expr] | None = None, final: Expr | None = None) -> Expr:
        """IR for ``h(t, r_old, r_new)``, in the reducer's dtype (f32 for non-float reducers).

        With ``guard`` the result is ``select(r_old == r_new, t, h)``.  That is exact —
        Eq. 3 makes h the identity when no producer changed — and it keeps IEEE
        arithmetic out of ``exp(-inf - -inf) = NaN`` while a mask still hides every
        element seen so far (sliding-window or causal tiles), where the unfused
        program is finite.  ``keep`` is one more condition under which t is kept (the
        first step of a rolling loop, where t is the identity and r_old is not a value).
        ``final_identity`` maps producers to their infinite identity: where a new value is final
        (always, or where ``final`` holds: the last step of a rolling loop) and still the
        identity, the producer has seen only ±inf elements, h is applied anyway, and t takes
        the plain program's value for such a row (``0·exp(-inf - -inf)``, NaN).
        """
        mapping: dict[sympy.Symbol, Expr] = {self.t: t}
        used = self.h.free_symbols
        unchanged: list[Expr] = []
        for load, r, r_new in zip(self.producers, self.old, self.new, strict=True):
            if r not in used and r_new not in used:
                continue
            if load not in old or load not in new:
                raise PolyfuseError(
                    f"the repair h = {self.h} needs the previous and the current value of producer {load}; "
                    f"got values for {', '.join(str(k) for k in {*old, *new}) or 'nothing'}"
                )
            mapping[r], mapping[r_new] = old[load], new[load]
            unchanged.append(eq(old[load], new[load]))
        if self.state and len(state) != len(self.state):
            raise PolyfuseError(f"the repair h = {self.h} reads the auxiliary accumulators "
                                f"{', '.join(map(str, self.state))}; got {len(state)} values for them")
        mapping.update(zip(self.state, state, strict=True))
        for sym, leaf in self.symbols:
            mapping.setdefault(sym, leaf)
        h = from_sympy(self.h, mapping, self.dtype, outer=self.t)
        if not guard or not unchanged:
            return h
        cond = functools.reduce(logical_and, unchanged)
        cond = cond if keep is None else logical_or(keep, cond)
        at_identity = [eq(new[ld], identity) for ld, identity in (final_identity or {}).items() if ld in new]
        if at_identity:
            lifted = functools.reduce(logical_or, at_identity)
            cond = logical_and(cond, logical_not(lifted if final is None else logical_and(final, lifted)))
        return select(cond, cast(self.dtype, t), h)

    def describe(self) -> dict[str, str]:
        """Readable f, g, h and where they come from (for ``polyfuse explain``)."""
        leaves = self.mapping
        producers = "; ".join(f"{r} = {load} ({r_new} after the update)"
                              for load, r, r_new in zip(self.producers, self.old, self.new, strict=True))
        cs = "; ".join(f"{c} = {leaves[c]}" for c in self.abstracted)
        aux = "; ".join(a.describe() for a in self.auxiliaries)
        return {
            "f": f"{self.reducer} ({_OP_OF_KIND[self.reducer]})",
            "g": str(self.g),
            "h": str(self.h),
            "producers": producers,
            "c": cs or "(none)",
            "cases": self.cases,
            "auxiliaries": aux or "(none)",
        }


def solve_repair(reducer: Reducer, term: Expr, producers: Sequence[Load], *,
                 nonnegative: Collection[Expr] = (), positive: Collection[Expr] = (),
                 reduce_vars: Collection[Var | str] | None = None, approximate: bool = False,
                 auxiliary: bool = False, facts: Sequence[ProducerFacts] | None = None,
                 signs: Mapping[str, str] | None = None, finite: Collection[str] = (),
                 loops: Sequence[tuple[str, Expr]] = (), maps: Sequence[MapDefinition] = (),
                 ranges: Mapping[str, int] | None = None) -> Repair:
    """Find and prove the repair of ``X = X ⊕ term`` for the given producer loads.

    ``nonnegative`` / ``positive`` name loads (or variables) known to be >= 0 / > 0
    (a max of |x|, a sum of squares, a size).  ``reduce_vars`` are the consumer's
    reduce iteration variables: sub-expressions free of them are loop-invariant and
    may appear in h; without it every non-constant sub-expression without a
    producer is treated as varying.  Results (and refusals) are cached, because
    autotuning asks again and again.  With ``auxiliary``, a sum whose g is a polynomial
    in the producers and has no single repair gets a state repair (auxiliary reductions,
    see :mod:`~polyfuse.transforms.auxiliary`) — the caller must then add those reductions.

    ``facts`` describe the producers' running values (:class:`~polyfuse.transforms.numerics.ProducerFacts`,
    with ``signs`` of other tensors, the ``finite`` ones, the consumer's ``loops`` bindings, the
    elementwise ``maps`` the terms read and the loop variables' ``ranges``): each candidate must then
    also pass the floating-point side conditions of :mod:`~polyfuse.transforms.numerics`, and the
    first that does is the repair.  Without ``facts`` the repair is proven in real arithmetic only,
    which the fusions never accept.  The search stops after ``SOLVER_SECONDS``.
    """
    rv = None if reduce_vars is None else frozenset(v.name if isinstance(v, Var) else v for v in reduce_vars)
    result = _solve_cached(reducer, term, tuple(dict.fromkeys(producers)), frozenset(nonnegative),
                           frozenset(positive), rv, approximate, auxiliary,
                           None if facts is None else tuple(facts), tuple(sorted((signs or {}).items())),
                           frozenset(finite), tuple(loops), tuple(maps), tuple(sorted((ranges or {}).items())))
    if isinstance(result, str):
        raise NoRepairFound(result)
    return result


SOLVER_SECONDS = 20.0
"""How long one repair search may take; sympy's simplification has no bound of its own."""


@functools.lru_cache(maxsize=1024)
def _solve_cached(reducer: Reducer, term: Expr, producers: tuple[Load, ...], nonnegative: frozenset[Expr],
                  positive: frozenset[Expr], reduce_vars: frozenset[str] | None,
                  approximate: bool, auxiliary: bool, facts: tuple[ProducerFacts, ...] | None,
                  signs: tuple[tuple[str, str], ...], finite: frozenset[str], loops: tuple[tuple[str, Expr], ...],
                  maps: tuple[MapDefinition, ...], ranges: tuple[tuple[str, int], ...] = ()) -> Repair | str:
    try:
        with _deadline(SOLVER_SECONDS):
            solver = _Solver(reducer, term, producers, nonnegative, positive, reduce_vars, approximate)
            solver.numerics = None if facts is None else (facts, dict(signs), finite, loops, maps, dict(ranges))
            return solver.solve(auxiliary)
    except NoRepairFound as err:
        return str(err)
    except _OutOfTime:
        return (f"no repair for g = {term}: the search took longer than {SOLVER_SECONDS:g} s and was stopped "
                "(sympy's simplification has no bound of its own)")
    except (TypeError, ValueError, NotImplementedError, RecursionError, ZeroDivisionError, AttributeError) as err:
        return f"the repair solver failed on g = {term}: sympy raised {type(err).__name__}: {err}"


class _OutOfTime(BaseException):
    """The solver's deadline passed inside a sympy call (a BaseException: sympy's own handlers must not
    swallow it)."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Interrupt the block after ``seconds`` with :class:`_OutOfTime`, by SIGALRM where it can (the main
    thread of a POSIX process; elsewhere the solver's own checks between steps are the bound).  An
    interval timer already running (a caller's own deadline) keeps its time and its handler."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_left, outer_every = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()

    def expire(signum, frame):
        if time.monotonic() - started >= seconds - 1e-3 or not callable(outer_handler):
            raise _OutOfTime()
        outer_handler(signum, frame)  # the caller's deadline came first

    signal.signal(signal.SIGALRM, expire)
    # Repeating: an exception raised while a finalizer runs (sympy's caches free objects at any time) is
    # swallowed, so the alarm comes again every 0.5 s until the block has left.
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left > 0 else seconds, 0.5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - started), 1e-3), outer_every)


def reducer_kind(reducer: Reducer) -> str:
    """sum/prod/max/min from the combiner itself, so a custom reducer that is one of them qualifies."""
    def strip(e: Expr) -> Expr:
        return strip(e.value) if isinstance(e, Cast) else e

    comb = strip(reducer.combine)
    if isinstance(comb, BinOp) and comb.op in _KIND_OF_OP and {strip(comb.a), strip(comb.b)} == {reducer.lhs,
                                                                                              reducer.rhs}:
        return _KIND_OF_OP[comb.op]
    raise NoRepairFound(
        f"reducer {reducer.name!r} combines as {reducer.combine}; the repair solver can prove "
        "distributivity (Eq. 4) only for reducers that combine with +, *, max or min"
    )


def _producer_names(producers: tuple[Load, ...]) -> list[str]:
    """The tensor's name, or ``name_<constant indices>`` when one tensor gives several producers."""
    counts: dict[str, int] = {}
    for p in producers:
        counts[p.tensor.name] = counts.get(p.tensor.name, 0) + 1
    names = []
    for p in producers:
        if counts[p.tensor.name] == 1:
            names.append(p.tensor.name)
        else:
            consts = [str(i) for i in p.indices if not free_vars(i)]
            names.append("_".join([p.tensor.name, *consts]))
    return names


class _Solver:
    def __init__(self, reducer: Reducer, term: Expr, producers: tuple[Load, ...], nonnegative: frozenset[Expr],
                 positive: frozenset[Expr], reduce_vars: frozenset[str] | None, approximate: bool):
        self.started = time.monotonic()
        self.numerics: tuple | None = None
        self.kind = reducer_kind(reducer)
        self.dtype = reducer.dtype if reducer.dtype.is_float else dt.f32
        self.term, self.producers, self.reduce_vars = term, producers, reduce_vars
        self.assumed = [f"{e} >= 0" for e in nonnegative] + [f"{e} > 0" for e in positive]
        assume = {e: {"nonnegative": True} for e in nonnegative} | {e: {"positive": True} for e in positive}
        self.table = SymbolTable(reserved=("t",), assume=assume)
        self.t = sympy.Symbol("t", real=True)
        self.old: list[sympy.Symbol] = []
        self.new: list[sympy.Symbol] = []
        for load, name in zip(producers, _producer_names(producers), strict=True):
            flags = {"real": True, **assume.get(load, {})}
            self.old.append(self.table.bind(load, name, **flags))
            self.new.append(sympy.Symbol(self.old[-1].name + "'", **flags))
        self.cs: list[sympy.Symbol] = []
        self._abstract(term)
        g, _ = to_sympy(term, self.table)
        self.g = self._check_rounding(g, approximate)
        self.g_new = self._renew(self.g)
        self.notes = ["approximate: narrowing casts of producer-dependent values treated as exact"] \
            if approximate and g != self.g else []
        # A select on a condition free of producers (a mask applied after subtracting m) splits g into
        # branches; h is derived from the first branch that reads a producer and proven on every branch.
        folded = sympy.piecewise_fold(self.g) if self.g.has(sympy.Piecewise) else self.g
        old = set(self.old)
        if isinstance(folded, sympy.Piecewise) and not any(cond.free_symbols & old for _, cond in folded.args):
            self.branches = [e for e, _ in folded.args]
        else:
            self.branches = [self.g]
        self.main = next((b for b in self.branches if b.free_symbols & old), self.g)
        self.main_new = self._renew(self.main)
        self.main_cs = [c for c in self.cs if c in self.main.free_symbols]

    def _renew(self, e: sympy.Expr) -> sympy.Expr:
        """``e`` with every r replaced by r'."""
        return e.xreplace(dict(zip(self.old, self.new, strict=True)))

    def _checked(self, repair: Repair, reasons: list[str], failing: str) -> Repair | None:
        """``repair`` with its floating-point side conditions proven, or None (the reason appended)."""
        if self.numerics is None:
            return repair
        facts, signs, finite, loops, maps, ranges = self.numerics
        try:
            numerics = check_numerics(repair, self.term, facts, signs=signs, finite=finite, loops=loops, maps=maps,
                                      ranges=ranges)
        except NoRepairFound as err:
            reasons.append(f"{failing} {err}")
            return None
        return dataclasses.replace(repair, numerics=numerics,
                                   cases=f"{repair.cases}; floating point: {numerics.proof or 'nothing singular'}")

    def _in_time(self, reasons: list[str]) -> None:
        if time.monotonic() - self.started > SOLVER_SECONDS:
            raise NoRepairFound(f"the repair search for g = {self.g} took longer than {SOLVER_SECONDS:g} s and "
                                "was stopped; tried: " + ("; ".join(reasons) or "nothing yet"))

    # -- step 1: change of variables ----------------------------------------
    def _reads_producer(self, e: Expr) -> bool:
        return any(n in self.producers for n in walk_expr(e) if isinstance(n, Load))

    def _abstract(self, e: Expr) -> None:
        """Bind every maximal producer-free, non-constant, varying sub-expression to a fresh ``c``."""
        if e in self.producers:
            return
        if isinstance(e, Load) and self._reads_producer(e):
            raise NoRepairFound(f"the load {e} in g = {self.term} is indexed by a producer result; a repair "
                                "cannot be derived through an index")
        if not self._reads_producer(e):
            leaves = [n for n in walk_expr(e) if isinstance(n, (Load, Var))]
            invariant = self.reduce_vars is not None and not (free_vars(e) & self.reduce_vars)
            if leaves and not invariant and self.table.lookup(e) is None:
                inner = e.value if isinstance(e, Cast) else e
                base = inner.tensor.name if isinstance(inner, Load) else inner.name if isinstance(inner, Var) else "c"
                flags = {"real": True} if e.dtype.is_float else {"integer": True} if e.dtype.is_int else {}
                self.cs.append(self.table.bind(e, base, **flags))
            return
        for k in children(e):
            self._abstract(k)

    def _check_rounding(self, g: sympy.Expr, approximate: bool) -> sympy.Expr:
        """Refuse roundings and conditions that mix producers with c; h can replay those of r alone."""
        old, cs = set(self.old), set(self.cs)
        for cond in g.atoms(sympy.core.relational.Relational):
            if cond.free_symbols & old and cond.free_symbols & cs:
                raise NoRepairFound(
                    f"the condition {self._ir_text(cond)} in g = {self.term} compares a producer result with "
                    "values that vary along the reduction; g jumps where that comparison flips, which no "
                    "repair h(t, r, r') can follow"
                )
        dependent = [a for a in g.atoms(AppliedUndef) if a.free_symbols & old and a.free_symbols & cs]
        for a in dependent:
            value = self._ir_text(a.args[0])
            if not is_rounding(a):
                raise NoRepairFound(
                    f"exact fusion is impossible: the producer-dependent value {value} is truncated to "
                    f"{rounded_dtype(a)} in g = {self.term}, and truncation is not invertible"
                )
            if not approximate:
                raise NoRepairFound(
                    f"exact fusion is impossible: the producer-dependent value {value} is rounded to "
                    f"{rounded_dtype(a)} in g = {self.term}, and rounding is not invertible; pass "
                    "approximate=True to fuse anyway, treating the rounding as exact"
                )
        return g.replace(lambda a: a in dependent, lambda a: a.args[0]) if dependent else g

    def _ir_text(self, e: sympy.Expr) -> str:
        """``e`` printed as the IR it came from (the c's expanded), for messages."""
        try:
            return str(from_sympy(e, self.table.mapping, self.dtype))
        except PolyfuseError:
            return str(e)

    # -- steps 2-4 ----------------------------------------------------------------
    def solve(self, auxiliary: bool = False) -> Repair:
        reasons: list[str] = []
        if not (self.g.free_symbols & set(self.old)):
            # symbolically free of the producers (0/(y + r), r - r), but the program still evaluates them
            found = self._checked(self._repair(self.t, "g does not read any producer, so h is the identity"),
                                  reasons, "h = t (g does not depend on the producers),")
            if found is not None:
                return found
            raise NoRepairFound(f"no repair for f = {self.kind}, g = {self.g}: " + "; ".join(reasons))
        tried: list[sympy.Expr] = []

        def consider(h: sympy.Expr, route: str) -> Repair | None:
            self._in_time(reasons)
            h = sympy.powsimp(h)
            if any(_is_zero(h - p) for p in tried):
                return None
            tried.append(h)
            failed = self._prove(h)
            if failed is not None:
                reasons.append(f"{route} gives h = {abbreviate(h)}, but {failed}")
                return None
            return self._checked(self._repair(h, f"{route}; {self._proof_note()}"), reasons,
                                 f"{route} gives h = {abbreviate(h)}, exact in real arithmetic, but")

        for h, route in self._inverse(reasons):
            found = consider(h, route)
            if found is not None:
                return found
        for h, route in self._separable(reasons):
            found = consider(h, route)
            if found is not None:
                return found
        from polyfuse.transforms.auxiliary import polynomial_state

        state = polynomial_state(self, reasons) if auxiliary else None
        if state is not None:
            checked = self._checked(state, reasons, f"the state repair h = {state.h}, exact in real arithmetic,")
            if checked is not None:
                return checked
        names = ", ".join(str(p) for p in self.producers)
        hint = ""
        if self.reduce_vars is None and any(not any(isinstance(n, Load) for n in walk_expr(self.table.leaf(c)))
                                            for c in self.cs):
            hint = ("; if some of these c's do not vary along the reduction, pass reduce_vars= "
                    "so that they may appear in h")
        raise NoRepairFound(f"no repair for f = {self.kind}, g = {self.g} with producer(s) {names}: "
                            + "; ".join(reasons) + hint)

    def _inverse(self, reasons: list[str]) -> list[tuple[sympy.Expr, str]]:
        """Eq. 5 after the change of variables: ``h = g0(r', g0⁻¹(r, t))``."""
        if len(self.main_cs) != 1:
            what = ", ".join(f"{c} = {self.table.leaf(c)}" for c in self.main_cs) or "none"
            reasons.append(f"g cannot be inverted in a single c (the change of variables leaves "
                           f"{len(self.main_cs)}: {what})")
            return []
        (c,) = self.main_cs
        try:
            solutions = sympy.solve(self.main - self.t, c)
        except (NotImplementedError, ValueError, TypeError) as err:
            reasons.append(f"sympy cannot invert g in c ({c}): {err}")
            return []
        if not solutions:
            reasons.append(f"g has no inverse in c: g = {self.main} = t has no solution for {c}")
            return []
        hs = [sympy.powsimp(sympy.simplify(self.main_new.xreplace({c: s}))) for s in solutions]
        for other in hs[1:]:
            if not _is_zero(other - hs[0]):
                listed = ", ".join(f"{c} = {s}" for s in solutions)
                reasons.append(f"g = {self.main} has several inverses that disagree ({listed}): "
                               + " vs ".join(f"h = {abbreviate(h)}" for h in hs))
                return []
        how = "one inverse" if len(solutions) == 1 else f"{len(solutions)} inverses that agree"
        route = f"h = g(r', g⁻¹(r, t)) with {how} in c ({c} = {solutions[0]})"
        # solve() normalises; when t·g(r',c)/g(r,c) is the same function, keep that shape of the program.
        shaped = self.t * sympy.powsimp(sympy.expand_power_exp(self.main_new / self.main))
        if c not in shaped.free_symbols and _is_zero(shaped - hs[0]):
            return [(shaped, route + ", written as t·g(r',c)/g(r,c)")]
        return [(hs[0], route)]

    def _separable(self, reasons: list[str]) -> Iterator[tuple[sympy.Expr, str]]:
        """``t·g(r',c)/g(r,c)`` or ``t + g(r',c) - g(r,c)``, when free of every c (computed lazily)."""
        cs = set(self.main_cs)
        for form, op in (("t·Q", "/"), ("t + D", "-")):
            raw = self.main_new / self.main if op == "/" else self.main_new - self.main
            q = _simplify(raw, cs)
            depends = sorted(str(c) for c in q.free_symbols & cs)
            if q.has(sympy.zoo, sympy.nan):
                reasons.append(f"not separable as {form}: g(r',c) {op} g(r,c) = {q} is undefined")
            elif depends:
                reasons.append(f"not separable as {form}: g(r',c) {op} g(r,c) = {q} depends on c "
                               f"({', '.join(depends)})")
            else:
                h = self.t * q if op == "/" else self.t + q
                yield h, f"h = {form} with {'Q' if op == '/' else 'D'} = g(r',c) {op} g(r,c) free of c"

    # -- proofs -------------------------------------------------------------------
    def _prove(self, h: sympy.Expr) -> str | None:
        """None if h satisfies Eq. 3 and Eq. 4 (symbolically, then numerically), else what failed."""
        for branch in self.branches:
            residue = h.xreplace({self.t: branch}) - self._renew(branch)
            if not _is_zero(residue):
                return f"Eq. 3 fails: h(g(r,c), r, r') - g(r',c) = {abbreviate(sympy.simplify(residue))}, not 0"
        replaced = h.xreplace({self.t: self.g})
        x, y = sympy.Symbol("x_", real=True), sympy.Symbol("y_", real=True)
        combine, op = _COMBINE[self.kind], _OP_OF_KIND[self.kind]
        lhs = h.xreplace({self.t: combine(x, y)})
        rhs = combine(h.xreplace({self.t: x}), h.xreplace({self.t: y}))
        if self.kind in ("sum", "prod"):
            if not _is_zero(lhs - rhs):
                shape = "linear and homogeneous" if self.kind == "sum" else "multiplicative"
                return f"h does not distribute over {op} (Eq. 4): h(x {op} y) != h(x) {op} h(y); h must be {shape} in t"
        else:
            a = sympy.simplify(sympy.diff(h, self.t))
            if self.t in a.free_symbols and not _is_zero(sympy.diff(a, self.t)):
                return f"cannot prove h distributes over {self.kind}: h = {abbreviate(h)} is not of the form a·t + b"
            if not _nonnegative(a):
                assumed = ", ".join(self.assumed) or "none"
                return (f"cannot prove h distributes over {self.kind}: h = a·t + b with a = {abbreviate(a)}, which is "
                        f"not provably >= 0 (assumptions: {assumed})")
        wrong = _numeric_mismatch((replaced, self.g_new), (lhs, rhs))
        return None if wrong is None else f"Eq. 3 or Eq. 4 does not hold numerically: {wrong}"

    def _proof_note(self) -> str:
        eq4 = {"sum": "h is linear and homogeneous in t", "prod": "h is multiplicative in t",
               "max": "h = a·t + b with a >= 0", "min": "h = a·t + b with a >= 0"}[self.kind]
        notes = [f"Eq. 3 proven symbolically and on {_SAMPLES} random points",
                 f"Eq. 4 ({_OP_OF_KIND[self.kind]}): {eq4}"]
        if self.assumed:
            notes.append("assuming " + ", ".join(self.assumed))
        return "; ".join(notes + self.notes)

    def _repair(self, h: sympy.Expr, cases: str, *, g: sympy.Expr | None = None,
                state: tuple[sympy.Symbol, ...] = (), auxiliaries: tuple[Auxiliary, ...] = ()) -> Repair:
        return Repair(self.kind, self.g if g is None else g, h, self.t, self.producers, tuple(self.old),
                      tuple(self.new), tuple(self.cs), tuple(self.table.mapping.items()), cases, self.dtype,
                      state, auxiliaries)


def _simplify(e: sympy.Expr, cs: set[sympy.Symbol]) -> sympy.Expr:
    """Combine exponentials (cheap, keeps the program's shape); full ``simplify`` only if c's remain."""
    cheap = sympy.powsimp(sympy.expand_power_exp(e))
    return cheap if not cheap.free_symbols & cs else sympy.powsimp(sympy.simplify(e))


def _is_zero(e: sympy.Expr) -> bool:
    """A symbolic proof that ``e`` is 0: cheap expansion first, full simplification next."""
    if e == 0:
        return True
    try:
        return sympy.expand(e) == 0 or sympy.simplify(e) == 0 or sympy.expand(sympy.simplify(e)) == 0
    except (TypeError, ValueError, NotImplementedError, RecursionError):
        return False


def _nonnegative(a: sympy.Expr) -> bool:
    """Provably ``a >= 0``: sympy's assumptions, else the structure exp(real)·(non-negative factors)."""
    if a.is_nonnegative:
        return True
    if isinstance(a, (sympy.Mul, sympy.Add)):
        return all(_nonnegative(f) for f in a.args)
    if isinstance(a, sympy.exp):
        return bool(a.args[0].is_extended_real)
    if isinstance(a, sympy.Pow):
        base, e = a.args
        return bool((e.is_integer and e.is_even) or _nonnegative(base))
    if isinstance(a, sympy.Max):
        return any(_nonnegative(f) for f in a.args)
    if isinstance(a, sympy.Min):
        return all(_nonnegative(f) for f in a.args)
    return isinstance(a, sympy.Abs)


def _sample(sym: sympy.Symbol, rng: np.random.Generator) -> np.ndarray:
    """Random values that respect a symbol's assumptions, in a range where exp does not overflow."""
    if sym.is_integer:
        return rng.integers(1, 17, _SAMPLES).astype(np.float64)
    if sym.is_real is None:  # an abstracted condition
        return rng.integers(0, 2, _SAMPLES).astype(bool)
    if sym.is_positive:
        return rng.uniform(0.05, 8.0, _SAMPLES)
    if sym.is_nonnegative:
        return rng.uniform(0.0, 8.0, _SAMPLES)
    return rng.uniform(-8.0, 8.0, _SAMPLES)


def _numeric_mismatch(*pairs: tuple[sympy.Expr, sympy.Expr]) -> str | None:
    """None if ``lhs == rhs`` (rtol 1e-9, float64) on random points for every pair, else a witness."""
    syms = sorted(set().union(*(a.free_symbols | b.free_symbols for a, b in pairs)), key=str)
    rng = np.random.default_rng(0)
    values = [_sample(s, rng) for s in syms]
    point_values = dict(zip(syms, values, strict=True))
    out = [np.broadcast_to(evaluate(side, point_values).astype(np.float64), (_SAMPLES,))
           for pair in pairs for side in pair]
    for (lhs, rhs), left, right in zip(pairs, out[0::2], out[1::2], strict=True):
        finite = np.isfinite(left) & np.isfinite(right)
        if finite.sum() < _SAMPLES // 2:
            return (f"{lhs} = {rhs}: only {int(finite.sum())} of {_SAMPLES} random points give finite values, "
                    "too few to check")
        bad = finite & ~np.isclose(left, right, rtol=_RTOL, atol=_ATOL)
        if bad.any():
            k = int(np.argmax(bad))
            point = ", ".join(f"{s} = {v[k]:.6g}" for s, v in zip(syms, values, strict=True))
            return f"{lhs} = {rhs} fails at {point}: the two sides are {left[k]:.17g} and {right[k]:.17g}"
    return None
