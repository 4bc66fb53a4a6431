"""Sign facts: what is known about the sign of each tensor's values, for the repair proofs.

A repair of a max or min consumer distributes over it only with a factor >= 0 (Eq. 4: ``h = a·t + b``
with ``a >= 0``), and the floating-point side conditions (:mod:`~polyfuse.transforms.numerics`) ask
whether a divisor or the argument of a log can be 0 or negative.  The facts come from:

  1. an input's declaration (``p.input(..., sign="positive")``), a promise the interpreters and kernels
     check on every NumPy array they are given (:func:`polyfuse.ir.interpreter.check_promises`);
  2. a temporary a map block computes elementwise: the sign of its value (``e = exp(x - m)`` is > 0);
  3. a reduction: the sign of its *running* value, from its reducer, its init and the sign of its term
     read through the maps it reads (a sum of exponentials is >= 0, a max of squares >= 0, a product of
     positives from 1 is > 0).  A producer fused earlier keeps the fact: its running value is its term
     reduced over the elements seen so far (Eq. 3), so the term is read from the repaired update, or from
     the local block of a split or of a tile (:func:`~polyfuse.transforms.fusion_common.element_term`);
  4. a promise on the fusion call (``sch.rolling_update(block, loop, signs={"r": "positive"})``) about a
     value the compiler cannot prove: every running value of tensor ``r`` that the repair reads, after
     the first element, has that sign.  It is **not checked** at run time (it is a value computed inside
     the fused kernel); a promise that fails makes the fused result wrong where the factor is negative.
     Prefer declaring the input the value comes from (1), which is checked.

A running value is at the reducer's identity before its first element (``-inf`` for a max); the
fusions guard that step (:func:`~polyfuse.transforms.fusion_common.guard_term`), so the facts describe
the values after it.  ``"positive"`` means > 0, ``"nonnegative"`` >= 0.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyfuse.errors import IllegalTransform, PolyfuseError
from polyfuse.ir.expr import Const, Expr, Load
from polyfuse.ir.stmt import Block, Program
from polyfuse.ir.visit import loads

SIGNS = ("positive", "nonnegative")


def declared_signs(program: Program, signs: Mapping[str, str] | None, what: str) -> dict[str, str]:
    """The promises of a fusion call (fact 4), checked to name tensors of ``program`` and known signs."""
    out = dict(signs or {})
    names = {t.name for t in program.tensors}
    for name, sign in out.items():
        if sign not in SIGNS:
            raise IllegalTransform(f"{what}: signs={{{name!r}: {sign!r}}}: a sign is 'positive' or 'nonnegative'")
        if name not in names:
            raise IllegalTransform(f"{what}: signs= names tensor {name!r}, which program {program.name!r} does not "
                                   f"have; its tensors: {', '.join(sorted(names))}")
        if name in {t.name for t in program.inputs}:
            raise IllegalTransform(f"{what}: signs= names input {name!r}: declare it on the input instead, "
                                   f"p.input({name!r}, …, sign={sign!r}), which the interpreters and kernels check")
    return out


def value_signs(program: Program, declared: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tensors whose every value (every running value, for a reduction) is known > 0 ("positive") or >= 0
    ("nonnegative"): facts 1-4 of the module docstring, in program order."""
    from polyfuse.transforms.fusion_common import map_definitions

    out: dict[str, str] = {t.name: t.sign for t in program.inputs if t.sign is not None}
    maps = {m.tensor.name: m for m in map_definitions(program)}
    for b in program.blocks():
        name = b.store.tensor.name
        if name in out:
            continue
        if b.reducer is not None:
            sign = running_sign(program, b, out)
        elif name in maps:
            sign = sign_of(b.store.value, out)
        else:
            sign = None
        if sign is not None:
            out[name] = sign
    for name, sign in (declared or {}).items():
        out[name] = _stronger(out.get(name), sign)
    return out


def running_sign(program: Program, block: Block, signs: Mapping[str, str]) -> str | None:
    """The sign of reduction ``block``'s running values after its first element (fact 3), or None."""
    from polyfuse.transforms.fusion_common import element_term, map_definitions, unguarded
    from polyfuse.transforms.numerics import expand_maps
    from polyfuse.transforms.repair import reducer_kind

    found = element_term(program, block)
    if found is None or block.reducer is None:
        return None
    try:
        kind = reducer_kind(block.reducer)
    except PolyfuseError:
        return None
    _, term, _ = found
    maps = {m.tensor: m for m in map_definitions(program)}
    term_sign = sign_of(expand_maps(maps, unguarded(term)), signs)
    if term_sign is None:
        return None
    init = block.init
    identity = block.reducer.identity
    if init is None or init == identity:
        init_sign = "positive" if kind == "prod" else ("nonnegative" if kind == "sum" else term_sign)
    elif isinstance(init, Const):
        init_sign = "positive" if init.value > 0 else "nonnegative" if init.value >= 0 else None
    else:
        init_sign = sign_of(init, signs)
    if init_sign is None:
        return None
    if kind in ("sum", "max"):  # a sum adds terms to its init, a max is one of them or the init
        return "positive" if "positive" in (term_sign, init_sign) else "nonnegative"
    return "positive" if term_sign == init_sign == "positive" else "nonnegative"


def sign_of(e: Expr, signs: Mapping[str, str]) -> str | None:
    """"positive", "nonnegative" or None for every value of ``e``, from its structure (sympy's assumptions, then
    interval bounds) and the signs of the tensors it reads.  These are facts of real arithmetic (``exp(x)`` is
    > 0 though it may round to 0): the numerics treat a producer of known sign as >= 0 only."""
    from polyfuse.symbolic import SymbolTable, to_sympy
    from polyfuse.transforms.intervals import bound

    table = SymbolTable()
    for ld in loads(e):
        if ld.tensor.name in signs:
            table.bind(ld, ld.tensor.name, real=True, **{signs[ld.tensor.name]: True})
    try:
        g = to_sympy(e, table)[0]
        b = bound(g)
        positive = g.is_positive  # sympy's assumptions (exp of a real is > 0), as the repair solver reads them
    except (PolyfuseError, TypeError, ValueError, NotImplementedError, RecursionError):
        # (sympy's Piecewise can recurse without end on nested selects, fuzz seed 270041): the sign is unknown
        return None
    if positive:
        return "positive"
    if b.lo > 0 or (b.lo == 0 and not b.lo_in):
        return "positive"
    return "nonnegative" if b.lo >= 0 else None


def missing_signs(program: Program, producers: list[Load], signs: Mapping[str, str], *, primitive: str,
                  block: str, loop: str) -> str:
    """How to supply the sign facts a refusal missed: for each producer value of unknown sign, what it is
    and the two ways to declare it (the input it reads, checked; a promise on this call, not checked)."""
    lines = []
    for ld in dict.fromkeys(producers):
        name = ld.tensor.name
        if name in signs:
            continue
        writer = next((b for b in program.blocks() if b.store.tensor.name == name), None)
        inputs = sorted({x.tensor.name for x in loads(writer.store.value) if x.tensor.role == "input"}
                        if writer is not None else set())
        what = f"{name} (block {writer.name!r})" if writer is not None else name
        via = (f"if {' and '.join(inputs)} cannot be negative, declare it: p.input({inputs[0]!r}, …, "
               "sign='nonnegative' or 'positive') (checked at run time); " if inputs else "")
        lines.append(f"the sign of {what} is unknown: {via}or promise it for this call: "
                     f"sch.{primitive}({block!r}, {loop}, signs={{{name!r}: 'positive'}}) (not checked)")
    return "; ".join(lines)


def _stronger(inferred: str | None, declared: str) -> str:
    return "positive" if "positive" in (inferred, declared) else declared


__all__ = ["SIGNS", "declared_signs", "missing_signs", "running_sign", "sign_of", "value_signs"]
