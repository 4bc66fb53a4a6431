"""The differential oracle: a scheduled program against its plain program, at every stage.

A schedule may only be refused (a :class:`~polyfuse.errors.PolyfuseError` when a step is applied, or
when the program is tiled or compiled) or keep the program's meaning.  :func:`check_schedule` runs the
plain program with :func:`~polyfuse.ir.errorbound.interpret_with_bounds` (values ``p`` and bounds
``E_p`` on their distance to the exact result) and the scheduled one the same way (``f``, ``E_f``), then
its tile program and its host C++ kernel, and reports every difference that rounding cannot explain.

The rule, elementwise, for an output of float dtype with unit roundoff ``u`` and smallest normal number ``τ``:

1. where ``p`` is NaN, +inf or -inf, ``f`` is the same, and where ``p`` is finite, ``f`` is finite, unless
   ``E_p`` is infinite: the plain program overflowed on the way (or divided by a zero it computed), so its
   class says nothing about the exact value, and a schedule that reassociates the reduction (``rfactor``,
   split-k, tiles) overflows at another step (``(a·b)·c`` against ``a·(b·c)``, then ``inf·0``).  Both
   ways: a product that overflowed in the plain order and was then divided into (``x/inf = 0``) is finite
   there, while a partial of the same product that underflowed to 0 before meeting the overflow is NaN.
   A non-finite value that came in with the data is exact (``E_p = 0``) and must be kept;
2. where ``p`` is finite, ``f`` is finite and ``|f - p| <= E_p + E_f``: both programs approximate the
   same exact value (a repair is an identity in real arithmetic), each within its bound;
3. the scheduled program is not intrinsically less accurate: ``E_f <= K·(S + 1)^d·(E_p + u·|p|) + K·τ``,
   with ``S`` the most iterations of a reduce loop of the plain program and ``d`` the output's cascade
   level (below).  Rule 2 alone would accept a
   repair that loses a contribution or overflows and rescales whenever the values happen to agree (its
   bound shows it: an uncertain guard, a rescale by a huge factor).  The factor is derived from what a
   fused step may add.  ``K = ACCURACY_FACTOR`` covers one rescale of the accumulated value per step,
   ``t·h`` with ``h`` a library function of the producers' change: ``2·LIBM_ULPS·u`` for the function,
   ``u`` for the product, ``u`` for the difference inside it, relative to the accumulated value, where the
   plain step's own accumulation rounds by ``u`` relative to it: ``2·LIBM_ULPS + 3`` units of the plain
   program's rounding, and a factor of 1.2 for the second-order terms.  That unit, ``u·|p|`` per step,
   is written out because ``E_p`` holds it only where the plain step does round: a max or a min selects
   exactly, and a term that is exact (a constant it saturates at) leaves ``E_p = 0`` while the repair
   still rounds once per step (``t + g(r') - g(r)``).  ``S + 1``: a repair reads the producers' running
   values (``t - r + r'``, ``t·r/r'``) once per step, and the running-error bound adds their bounds each
   time (it cannot see that the same rounding error cancels between steps); each is at most the plain
   program's bound of the producer, or, where that producer is itself repaired, its fused bound, which
   rule 3 holds to ``(S + 1)`` times that: ``d`` is the number of reductions between the output and the
   first producer of its cascade (1 for ``Σ exp(x - max)``, 2 for a reduction of that sum).  ``K·τ``
   covers errors below the smallest normal number ``τ`` (underflow noise).  Rule 3 does not apply to
   an output whose cascade compares a reduced value (``select(r > c, …)``, ``floor(r)``): such a term
   jumps, the fused program evaluates it at every running value of the producer, and a running value
   near the jump makes the bound cover the jump although the repair telescopes through it (``t +
   g(r') - g(r)`` with the same rounded ``r`` on both sides of a step).  Rules 1 and 2 still hold there.
   Where ``E_p >= |p|`` the plain value has no significant digit its own
   bound vouches for (a product of exponentials of rounded sums): there is no accuracy to keep, and
   rule 3 does not apply;
4. the tile interpreter and the C++ kernel compute the scheduled program: ``|b - f| <= 2·E_f`` plus the
   floor, and rule 1 between them.  (Their order of operations may differ inside a tile, each within
   the scheduled program's bound of the exact value.)  Rule 1 does not hold between them where
   ``E_f`` is infinite: the scheduled program overflowed on the way or divided by a zero, and a backend
   that reduces in another order (tiles) overflows at another step (``(a·b)·c`` against ``a·(b·c)``,
   then ``inf·0``) or flips the sign of a zero (IEEE 754 leaves ``max(-0, +0)`` to the implementation).
   The same holds for the scheduled program with its loops bound to GPU indices run backwards (a GPU runs
   their iterations in no order), on the first input set only: their order matters through which elements
   the iterations write and read, which the values do not change (an input set that hides it, all zeros, is
   not the first one the tests and the fuzzer give).

Where ``E_p`` is infinite (the plain program overflows on the way, or decides on an uncertain
comparison) rules 2 and 3 accept any value and rule 1 any class; :class:`Tally` counts such elements.
"""

from __future__ import annotations

import functools
import re
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from polyfuse.errors import PolyfuseError
from polyfuse.ir.errorbound import LIBM_ULPS, interpret_with_bounds
from polyfuse.ir.expr import COMPARE_OPS, BinOp, Call, Cast, Const, Expr, Load, Var
from polyfuse.ir.interpreter import interpret, prepare
from polyfuse.ir.stmt import BOUND, Loop, Program, Stmt
from polyfuse.ir.visit import map_stmt, walk_expr
from polyfuse.transforms.tree import rebind

ACCURACY_FACTOR = 1.2 * (2 * LIBM_ULPS + 3)
"""``K`` of rule 3 (see the module docstring)."""

REFUSED, WRONG, CRASH = "refused", "wrong", "crash"

Inputs = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Finding:
    """One outcome other than "equal": ``kind`` (refused, wrong, crash), the ``stage`` (a schedule step,
    ``fused``, ``tile``, ``cpp``), the ``reason`` class (for counting) and the ``detail``."""

    kind: str
    stage: str
    reason: str
    detail: str

    def line(self) -> str:
        return f"{self.kind} at {self.stage}: {self.reason}\n{self.detail}"


def refusal_class(err: BaseException) -> str:
    """``err``'s type and first line with names and numbers blanked, to count refusals by kind."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    first = first.rsplit("]: ", 1)[-1] if first.startswith("no repair for") else first
    first = re.sub(r"\b([gh]) = .*? (has|cannot|gives|is|does|but)\b", r"\1 = … \2", first)
    first = re.sub(r"'[^']*'", "'…'", first)
    first = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", first)
    first = re.sub(r"\([^()]*\)", "(…)", first)
    return f"{type(err).__name__}: {first[:110]}"


def _crash(stage: str, err: BaseException) -> Finding:
    frames = traceback.extract_tb(err.__traceback__)
    where = f"{frames[-1].filename.split('polyfuse/')[-1]}:{frames[-1].lineno}" if frames else "?"
    return Finding(CRASH, stage, f"{type(err).__name__} at {where}", f"{type(err).__name__}: {err}")


def guarded(stage: str, fn: Callable[[], object]) -> tuple[object, Finding | None]:
    """``fn()``, or the finding its exception is: a refusal for a PolyfuseError, a crash otherwise."""
    try:
        return fn(), None
    except PolyfuseError as err:
        return None, Finding(REFUSED, stage, refusal_class(err), str(err))
    except Exception as err:  # noqa: BLE001 - any other exception is the finding
        return None, _crash(stage, err)


def apply_step(sch, text: str) -> Finding | None:
    """Run one schedule step given as a line of Python (``sch.rolling_update(...)``) on ``sch``; a refusal
    or crash is the finding (stage: the primitive), and a refused step must leave ``sch`` as it was."""
    stage = text.split("(", 1)[0].removeprefix("sch.")
    before, steps = sch.program, len(sch.trace)
    _, found = guarded(stage, lambda: sch.exec_python(text))
    if found is None:
        return None
    found = Finding(found.kind, stage, found.reason, f"{text}\n{found.detail}")
    if found.kind == REFUSED and (sch.program is not before or len(sch.trace) != steps):
        return Finding(CRASH, stage, "refused step changed the schedule", found.detail)
    return found


# ------------------------------------------------------------------ comparing outputs

def floor(dtype: np.dtype, magnitude: np.ndarray) -> np.ndarray:
    """``K·(u·|magnitude| + τ)`` in ``dtype``: a few roundings of an exact output, and underflow noise."""
    info = ml_dtypes.finfo(dtype)
    return ACCURACY_FACTOR * (float(info.eps) / 2 * np.abs(magnitude) + float(info.tiny))


def _kind(v: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(v), 3, np.where(np.isposinf(v), 1, np.where(np.isneginf(v), 2, 0)))


def mismatch(name: str, want: tuple[np.ndarray, np.ndarray], got: np.ndarray, got_bound: np.ndarray | None,
             *, steps: int = 1, level: int | None = 1, tolerance: np.ndarray | None = None) -> str | None:
    """The first element of output ``name`` where ``got`` breaks rules 1-3 against ``want = (p, E_p)``
    (``steps``: S of rule 3, ``level``: d of rule 3, None where rule 3 does not apply), or with
    ``tolerance`` where ``|got - p| > tolerance`` (rule 4); None if there is none."""
    p, ep = want
    if not np.issubdtype(p.dtype, np.floating):
        bad = got != p
        return _describe(name, "value", bad, p, got, ep, got_bound) if np.any(bad) else None
    pf, gf = p.astype(np.float64), np.asarray(got).astype(np.float64)
    kp, kg = _kind(pf), _kind(gf)
    # where the reference's own bound is infinite, a program that reduces in another order may overflow
    # elsewhere or flip the sign of a zero (rules 1 and 4 of the module docstring)
    vouched = ~np.isinf(ep)
    for label, bad in (("non-finite", (kp == 0) & (kg != 0) & vouched),
                       ("class", (kp != 0) & (kp != kg) & vouched)):
        if np.any(bad):
            return _describe(name, label, bad, p, got, ep, got_bound)
    finite = kp == 0
    with np.errstate(all="ignore"):
        diff = np.abs(gf - pf)
        allowed = tolerance if tolerance is not None else ep + got_bound
        bad = finite & (diff > allowed)
        if np.any(bad):
            return _describe(name, "value", bad, p, got, ep, got_bound)
        # rule 3; a value off by more than the plain bound allows, accepted only because the scheduled
        # program's bound is huge, is named so
        if tolerance is None and got_bound is not None and level is not None:
            info = ml_dtypes.finfo(p.dtype)
            allowed = ACCURACY_FACTOR * ((steps + 1) ** level * (ep + float(info.eps) / 2 * np.abs(pf))
                                         + float(info.tiny))
            bad = finite & (ep < np.abs(pf)) & (got_bound > allowed)
            for label, which in (("inaccurate value", bad & (diff > ep + allowed)),
                                 ("unbounded", bad & np.isinf(got_bound)), ("accuracy", bad)):
                if np.any(which):
                    return _describe(name, label, which, p, got, ep, got_bound)
    return None


def _describe(name: str, label: str, bad: np.ndarray, p: np.ndarray, got: np.ndarray, ep: np.ndarray,
              eg: np.ndarray | None) -> str:
    at = tuple(int(k[0]) for k in np.nonzero(np.broadcast_to(bad, p.shape)))
    bound = "" if eg is None else f" (bound {float(np.broadcast_to(eg, p.shape)[at]):.3g})"
    return (f"{label}: {name}{list(at)} plain {float(p[at])!r} (bound {float(ep[at]):.3g}), "
            f"scheduled {float(np.asarray(got)[at])!r}{bound}; {int(np.sum(bad))} of {p.size} elements")


def _label(text: str) -> str:
    return text.split(":", 1)[0]


# ------------------------------------------------------------------ the check

def reduce_steps(program: Program, inputs: Inputs, sizes: Mapping[str, int] | None) -> int:
    """S of rule 3: the most iterations of one reduce iteration variable in ``program`` on these inputs."""
    bound, _ = prepare(program, inputs, sizes)
    extents = [int(iv.extent.value) for b in bound.blocks() for iv in b.reduce_iters  # type: ignore[attr-defined]
               if isinstance(iv.extent, Const)]
    return max(extents, default=1)


def cascade_levels(program: Program) -> dict[str, int | None]:
    """d of rule 3 for each output of ``program`` (None where rule 3 does not apply): the reductions on
    its longest chain of reductions, less the first producer's, at least 1; None where a block on the
    way compares, floors or divides to an integer a value that a reduction computed (a jump)."""
    depth: dict[str, int] = {}
    jumps: set[str] = set()
    for b in program.blocks():
        name = b.store.tensor.name
        exprs = [b.store.value, *b.store.indices] + [e for e in (b.init, b.where) if e is not None]
        reads = {n.tensor.name for e in exprs for n in walk_expr(e) if isinstance(n, Load)}
        level = max((depth.get(r, 0) for r in reads), default=0) + (1 if b.is_reduction else 0)
        depth[name] = max(depth.get(name, 0), level)
        if reads & jumps or any(_jumps_on(n, depth, name) for e in exprs for n in walk_expr(e)):
            jumps.add(name)
    return {t.name: (None if t.name in jumps else max(1, depth.get(t.name, 0) - 1)) for t in program.outputs}


def _jumps_on(n: Expr, depth: Mapping[str, int], own: str) -> bool:
    """Whether ``n`` is discontinuous in a reduced value other than the accumulator ``own``."""
    if isinstance(n, BinOp) and n.op in (*COMPARE_OPS, "//", "%") or isinstance(n, Call) and n.fn in (
            "floor", "ceil") or isinstance(n, Cast) and not n.dtype.is_float:
        return any(isinstance(ld, Load) and ld.tensor.name != own and depth.get(ld.tensor.name, 0) > 0
                   for ld in walk_expr(n))
    return False


@dataclass
class Report:
    """The outcome of one scheduled program on its input sets: findings, and how many elements the plain
    program's bound left unchecked (infinite)."""

    findings: list[Finding] = field(default_factory=list)
    unchecked: int = 0
    checked: int = 0

    @property
    def wrong(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in (WRONG, CRASH)]


def check_schedule(plain: Program, scheduled: Program, input_sets: Sequence[Inputs], *,
                   sizes: Sequence[Mapping[str, int] | None] | None = None,
                   backends: Sequence[str] = ("fused", "tile", "cpp")) -> Report:
    """Check ``scheduled`` against ``plain`` on every input set (rules 1-4 of the module docstring).

    ``backends`` picks the stages after the scheduled program's interpreter: ``tile`` (translate and run
    the tile program), ``cpp`` (build the host C++ kernel with ``-Werror`` and run it), ``cuda`` (the same
    for the GPU kernel, on a machine with one: its reductions run in another order, which rule 4 covers).
    """
    report = Report()
    sizes = sizes or [None] * len(input_sets)
    runners: dict[str, Callable[[Inputs, Mapping[str, int] | None], dict]] = {}
    backwards = bound_reversed(scheduled)
    if backwards is not None:
        runners[REVERSED] = lambda inputs, sz: interpret(backwards, inputs, sz)
    if "tile" in backends:
        from polyfuse import tiling

        tp, found = guarded("tile", lambda: tiling.to_tiles(scheduled))
        if found:
            report.findings.append(found)
        else:
            runners["tile"] = lambda inputs, sz: tiling.interpret(tp, inputs, sz)
    for backend in ("cpp", "cuda"):
        if backend in backends and "tile" in runners:
            from polyfuse.pipeline import build

            kernel, found = guarded(backend, lambda: build(scheduled, backend, werror=True))  # noqa: B023
            if found:
                report.findings.append(found)
            else:
                runners[backend] = functools.partial(_run, kernel)
    seen: set[str] = set()
    for k, (inputs, sz) in enumerate(zip(input_sets, sizes, strict=True)):
        runs = runners if k == 0 else {stage: run for stage, run in runners.items() if stage != REVERSED}
        if not _check_inputs(report, plain, scheduled, inputs, sz, runs, seen):
            break
    return report


REVERSED = "bound loops reversed"
"""The stage of :func:`check_schedule` that runs the scheduled program with its bound loops backwards
(:func:`bound_reversed`), on the first input set."""


def bound_reversed(program: Program) -> Program | None:
    """``program`` with each loop bound to a GPU index run backwards, or None where it has none.

    A GPU runs a bound loop's iterations at once, in no order (``Schedule.bind`` refuses a loop that carries a
    dependence), so the program must compute the same in any order of them; backwards is the order furthest
    from the interpreters' (the stage :data:`REVERSED` of :func:`check_schedule`)."""
    found = [False]

    def backwards(s: Stmt) -> Stmt | None:
        if not isinstance(s, Loop) or s.kind != BOUND:
            return None
        found[0] = True
        var = s.var.name
        return s.replace(body=map_stmt(rebind(s.body, {var: (s.extent - 1) - Var(var)}), backwards))

    body = map_stmt(program.body, backwards)
    return program.replace(body=body) if found[0] else None


def _run(kernel, inputs: Inputs, sizes: Mapping[str, int] | None) -> dict:
    return kernel.run(inputs, **(sizes or {}))


def _check_inputs(report: Report, plain: Program, scheduled: Program, inputs: Inputs,
                  sizes: Mapping[str, int] | None, runners: Mapping[str, Callable], seen: set[str]) -> bool:
    """Add what one input set finds to ``report`` (one finding per stage: ``seen``); False if the
    interpreters cannot run."""
    want, found = guarded("plain", lambda: interpret_with_bounds(plain, inputs, sizes))
    if found is None:
        got, found = guarded("fused", lambda: interpret_with_bounds(scheduled, inputs, sizes))
    if found is not None:
        report.findings.append(Finding(CRASH, found.stage, found.reason, found.detail))
        return False
    steps = reduce_steps(plain, inputs, sizes)
    levels = cascade_levels(plain)
    for name, (p, ep) in want.items():  # type: ignore[union-attr]
        report.checked += p.size
        report.unchecked += int(np.sum(np.isinf(ep) & np.isfinite(p)))
        f, ef = got[name]  # type: ignore[index]
        text = mismatch(name, (p, ep), f, ef, steps=steps, level=levels.get(name, 1))
        if text and "fused" not in seen:
            seen.add("fused")
            report.findings.append(Finding(WRONG, "fused", _label(text), text))
    for stage, run in runners.items():
        out, found = guarded(stage, lambda: run(inputs, sizes))  # noqa: B023 - called at once
        if found:
            if stage not in seen:
                seen.add(stage)
                report.findings.append(Finding(CRASH, stage, found.reason, f"the {stage} run raised {found.detail}"))
            continue
        for name, (f, ef) in got.items():  # type: ignore[union-attr]
            tol = 2 * ef + floor(f.dtype, f.astype(np.float64)) if np.issubdtype(f.dtype, np.floating) else None
            text = mismatch(name, (f, ef), out[name], None, tolerance=tol)  # type: ignore[index]
            if text and stage not in seen:
                seen.add(stage)
                report.findings.append(Finding(WRONG, stage, f"{_label(text)} vs fused", text))
    return True


# ------------------------------------------------------------------ counting

@dataclass
class Tally:
    """Counts over many checked programs, for the fuzzer's summary.

    A program is *crashed* or *wrong* if any stage was; else *refused* if no schedule step applied; else
    *equal* (its scheduled program checked equal; ``backend_refused`` of those had a tile or C++ stage
    refused).  The fusion fraction is the share of the programs whose schedule asked for a fusion in which
    at least one fusion step applied; ``fusion_steps`` counts the steps asked and applied.
    """

    programs: int = 0
    with_fusion: int = 0
    fused: int = 0
    equal: int = 0
    backend_refused: int = 0
    wrong: int = 0
    crashed: int = 0
    refused_programs: int = 0
    checked: int = 0
    unchecked: int = 0
    fusion_steps: list[int] = field(default_factory=lambda: [0, 0])
    refusals: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)

    def add(self, *, fusion_steps: tuple[int, int], applied: bool, findings: Sequence[Finding],
            report: Report | None) -> None:
        """Count one program: its (asked, applied) fusion steps, whether any step applied, what was found."""
        self.programs += 1
        self.with_fusion += fusion_steps[0] > 0
        self.fused += fusion_steps[1] > 0
        self.fusion_steps = [self.fusion_steps[0] + fusion_steps[0], self.fusion_steps[1] + fusion_steps[1]]
        for f in findings:
            (self.refusals if f.kind == REFUSED else self.failures)[(f.kind, f.stage, f.reason)] += 1
        if report is not None:
            self.checked += report.checked
            self.unchecked += report.unchecked
        kinds = {f.kind for f in findings}
        if CRASH in kinds:
            self.crashed += 1
        elif WRONG in kinds:
            self.wrong += 1
        elif not applied:
            self.refused_programs += 1
        else:
            self.equal += 1
            self.backend_refused += any(f.kind == REFUSED and f.stage in ("tile", "cpp") for f in findings)

    def summary(self) -> str:
        frac = self.fused / self.with_fusion if self.with_fusion else 0.0
        asked, applied = self.fusion_steps
        lines = [f"programs {self.programs}: equal {self.equal} (tile or C++ refused in {self.backend_refused}), "
                 f"refused {self.refused_programs}, wrong {self.wrong}, crashed {self.crashed}",
                 f"programs asking for a fusion {self.with_fusion}, fused {self.fused} (fusion fraction "
                 f"{frac:.1%}); fusion steps asked {asked}, applied {applied}",
                 f"elements checked {self.checked}, unchecked (plain bound infinite) {self.unchecked}"]
        for title, counter in (("failures", self.failures), ("refusals", self.refusals)):
            if counter:
                lines.append(f"{title}:")
                lines += [f"  {n:6d}  {kind} at {stage}: {reason}"
                          for (kind, stage, reason), n in counter.most_common()]
        return "\n".join(lines)
