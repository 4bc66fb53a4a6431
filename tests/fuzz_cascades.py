"""Random cascaded reductions, their inputs and their schedules, for the differential fuzzer.

A *cascade* is a chain of 2-4 reductions over the rows of ``x[N, M]`` (sometimes also ``y[N, M]``; sometimes
over a 2-D tile ``x[N, M, K]``, or with the first reduction's loop running backwards), each
later reduction's term reading earlier results through terms of the shapes real code has (``exp(x - max)``,
``x / sum``, ``(x - mean)²``, ``x / sqrt(ssq/M + eps)``, ``|x| / amax`` …) or random ones; sometimes a map
nest computes the term into a temporary, sometimes the consumer's ``init`` is not the reducer's identity,
sometimes an elementwise epilogue follows (sometimes with a gather ``x[i, g[i]]``); sometimes a later
reduction reads none of the earlier ones (a
*sibling*, fused into the same pass), sometimes an input declares its sign (``sign=``) or that it is finite
(``finite=True``), which its inputs keep; separable terms (``exp(x - m)·(x - m)``, ``select(c, x - m, 0)``)
need auxiliary states.  Inputs mix row kinds (normal, leading zeros, zero rows, ties, monotone, magnitudes up
to 1000, ±inf and NaN entries); schedules are the fusion recipes of
``polyfuse.ops.schedules`` (roll, roll over tiles, split-k, split-k then roll) and random sequences of the
ordinary primitives around them.

Everything is drawn through a :class:`Draw`: :class:`RandomDraw` for the summary script
(``fuzz_run.py``), :class:`HypothesisDraw` in the tests, so that hypothesis can shrink a failure.
Schedule steps are Python lines (``sch.rolling_update(...)``) applied one at a time, so a failing case
replays from its text (``fuzz_corpus``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from polyfuse.ir.visit import loads
from polyfuse.ir import (
    Expr, Program, ProgramBuilder, Tensor, const, eq, exp, log, maximum, minimum, reduce, select, spatial, sqrt,
    tanh,
)

T = TypeVar("T")


class Draw(Protocol):
    def choice(self, options: Sequence[T]) -> T: ...

    def integer(self, lo: int, hi: int) -> int: ...

    def boolean(self, p: float = 0.5) -> bool: ...


class RandomDraw:
    """Draws from a seeded ``random.Random``."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def boolean(self, p: float = 0.5) -> bool:
        return self.rng.random() < p


class HypothesisDraw:
    """Draws through hypothesis' ``data.draw`` (shrinks towards the first option and ``lo``)."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def choice(self, options: Sequence[T]) -> T:
        return self.data.draw(self.st.sampled_from(list(options)))

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def boolean(self, p: float = 0.5) -> bool:
        # false first, so that shrinking removes the optional parts
        return self.data.draw(self.st.integers(0, 999)) >= 1000 * (1 - p)


# ------------------------------------------------------------------ programs

SIZES = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 23, 31, 32)
REDUCERS = ("max", "sum", "min", "prod")
INITS = (1.0, -2.0, 0.5, 3.0)
EPS = 1e-5
SIBLINGS = 0.2
"""How often a later reduction reads no earlier one (a sibling: the statistic of the data beside the cascade)."""
SIGNS = (None,) * 6 + ("nonnegative", "positive")
"""What an input declares about its sign (the generated inputs keep the promise: :func:`row`)."""
FINITE = 0.4
"""How often an input declares itself finite (no ±inf or NaN: :func:`row` keeps the promise), which the
separable states ask for."""
SEPARABLE = {True: 0.4, False: 0.1}
"""How often a summed real-code term is one that needs an auxiliary state (separable in its producer), over
inputs declared finite (where such states can fuse) and over others (where they are refused)."""


@dataclass
class Cascade:
    """A generated program and what its schedules need to know: the reductions in order (the first is
    the producer whose reduce loop ``j`` the fusions roll over), the sizes (ints, or names if symbolic)."""

    program: Program
    reductions: list[str]
    dtype: str
    m: int | str
    symbolic: bool
    consumers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.consumers = self.reductions[1:]


@dataclass
class _Leaves:
    x: Expr
    y: Expr | None
    producers: list[tuple[str, Expr]]  # (reducer, r[i]) of earlier reductions
    m: Expr
    finite: bool = False  # the inputs are declared finite (separable states need it)


def _real_term(draw: Draw, lv: _Leaves, summed: bool = False) -> Expr:
    """A term of the shapes real code has, reading one producer (``summed``: by a sum, which a term separable
    in the producer needs)."""
    red, p = draw.choice(lv.producers)
    xv = lv.x if lv.y is None or draw.boolean(0.7) else lv.y
    mean = p / lv.m
    shapes = [
        lambda: exp(xv - p), lambda: xv / p, lambda: abs(xv) / p, lambda: (xv - mean) * (xv - mean),
        lambda: xv / sqrt(mean + EPS), lambda: xv * p, lambda: tanh(xv - p), lambda: exp(2.0 * (xv - p)),
        lambda: select(eq(p, 0.0), xv, xv / p), lambda: (xv - p) ** 2, lambda: xv * xv / p,
        lambda: exp(xv) / p, lambda: exp(xv - p) * (lv.y if lv.y is not None else xv), lambda: xv - p,
        lambda: abs(xv - mean), lambda: log(abs(xv) + abs(p) + 1.0), lambda: exp(0.5 * xv - p),
    ]
    # separable in the producer: count-based states (a select on a condition free of it) and, behind a max or
    # min, scaled ones (the min's are refused: its scale grows)
    separable = [lambda: select(xv > 0.0, xv - p, 0.0), lambda: select(lv.x > 0.5, xv - mean, 0.0)]
    if red in ("max", "min"):
        shapes += [lambda: exp(xv - p), lambda: exp(xv - p)]  # the softmax family, more often
        separable += [lambda: exp(xv - p) * (xv - p), lambda: exp(xv - p) * (xv - p) * (xv - p)] * 2
    if summed and draw.boolean(SEPARABLE[lv.finite]):
        return draw.choice(separable)()
    return draw.choice(shapes)()


def _random_term(draw: Draw, lv: _Leaves, depth: int) -> Expr:
    if depth == 0 or draw.boolean(0.3):
        kind = draw.choice(["x", "x", "p", "p", "c"] + (["y"] if lv.y is not None else []))
        if kind == "x":
            return lv.x
        if kind == "y":
            return lv.y  # type: ignore[return-value]
        if kind == "p":
            return draw.choice(lv.producers)[1]
        return const(draw.choice([0.5, 2.0, 3.0, -1.0, 1e-3]), lv.x.dtype)
    op = draw.choice(["+", "-", "*", "/", "exp", "log", "sqrt", "tanh", "abs", "max", "min", "pow", "select"])
    a = _random_term(draw, lv, depth - 1)
    if op in ("exp", "log", "sqrt", "tanh", "abs"):
        return {"exp": exp, "log": log, "sqrt": sqrt, "tanh": tanh, "abs": abs}[op](a)  # type: ignore[operator]
    if op == "pow":
        return a ** draw.choice([2, 3, -1])
    b = _random_term(draw, lv, depth - 1)
    if op == "select":
        return select(eq(b, 0.0), a, a / b) if draw.boolean() else select(a > b, a, b - a)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "max": maximum(a, b), "min": minimum(a, b)}[op]


LAYOUTS = ("row",) * 8 + ("reversed", "tile2d")
"""``row``: reductions over ``x[i, j]``; ``reversed``: the first reduction's loop runs backwards (``j = M-1-j'``),
sometimes a consumer's too; ``tile2d``: reductions over a 2-D tile ``x[i, j, k]`` (``j`` and ``k`` reduce)."""


@dataclass
class _Shape:
    """The reduce dimensions of a cascade: ``dims`` (name, extent) after the row ``i``."""

    N: object
    dims: list[tuple[str, object]]

    def reduce(self) -> dict:
        return {d: reduce(e) for d, e in self.dims}

    def spatial(self) -> dict:
        return {d: e for d, e in self.dims}

    @property
    def full(self) -> tuple:
        return (self.N, *(e for _, e in self.dims))

    def count(self, dtype: str) -> Expr:
        """The elements one reduction reduces (the ``M`` of a mean), in ``dtype``."""
        total: object = 1
        for _, e in self.dims:
            total = total * e
        return total.astype(dtype) if isinstance(total, Expr) else const(float(total), dtype)


def cascade(draw: Draw) -> Cascade:
    """A random chain of 2-4 reductions over the rows of ``x`` (see the module docstring)."""
    dtype = draw.choice(["f64", "f32"])
    symbolic = draw.boolean(0.2)
    layout = draw.choice(LAYOUTS)
    p = ProgramBuilder("cascade")
    if symbolic:
        N, M = p.sizes("N", "M")
        m_size: int | str = "M"
    else:
        N, M = draw.choice([1, 2, 3]), draw.choice(SIZES)
        m_size = M
    shape = _Shape(N, [("j", M)] + ([("k", draw.choice([2, 3]))] if layout == "tile2d" else []))
    x = p.input("x", shape.full, dtype, sign=draw.choice(SIGNS), finite=draw.boolean(FINITE))
    y = p.input("y", shape.full, dtype, sign=draw.choice(SIGNS), finite=draw.boolean(FINITE)) \
        if draw.boolean(0.25) else None
    count = draw.integer(2, 4)
    producers: list[tuple[str, Tensor]] = []
    names = []
    for n in range(count):
        red = draw.choice(REDUCERS if n else ("max", "max", "sum", "min", "prod"))
        last = n == count - 1
        r = (p.output if last or draw.boolean() else p.temp)(f"r{n}", (N,), dtype)
        init = draw.choice(INITS) if n and draw.boolean(0.25) else None
        tmp = None
        if n and draw.boolean(0.25):
            tmp = p.temp(f"t{n}", shape.full, dtype)
            with p.nest(f"m{n}", i=N, **shape.spatial()) as idx:
                tmp[idx] = _term(draw, n, x, y, producers, shape, idx, red == "sum")
        kw = {} if init is None else {"init": init}
        if layout == "reversed" and (n == 0 or draw.boolean(0.3)):
            with p.loop("i", N) as li, p.loop("j", M) as lj:
                with p.block(f"s{n}", i=spatial(N, li), j=reduce(M, M - 1 - lj), **kw) as idx:
                    r[idx[0]] = _combine(red, r[idx[0]], tmp[idx] if tmp is not None else
                                         _term(draw, n, x, y, producers, shape, idx, red == "sum"))
        else:
            with p.nest(f"s{n}", i=N, **shape.reduce(), **kw) as idx:
                r[idx[0]] = _combine(red, r[idx[0]], tmp[idx] if tmp is not None else
                                     _term(draw, n, x, y, producers, shape, idx, red == "sum"))
        producers.append((red, r))
        names.append(f"s{n}")
    if draw.boolean(0.3):
        _epilogue(draw, p, x, producers, shape, dtype)
    return Cascade(p.build(), names, dtype, m_size, symbolic)


def _term(draw: Draw, n: int, x: Tensor, y: Tensor | None, producers: list[tuple[str, Tensor]], shape: _Shape,
          idx: tuple, summed: bool = False) -> Expr:
    xv = x[idx]
    if n == 0 or draw.boolean(SIBLINGS):  # the first reduction, or a sibling of the earlier ones
        if n and y is not None and draw.boolean():
            xv = y[idx]
        return xv if draw.boolean(0.7) else draw.choice([lambda: abs(xv), lambda: exp(xv), lambda: xv * xv])()
    lv = _Leaves(xv, None if y is None else y[idx], [(red, r[idx[0]]) for red, r in producers],
                 shape.count(str(x.dtype)), x.finite and (y is None or y.finite))
    if draw.boolean(0.7):
        return _real_term(draw, lv, summed)
    term = _random_term(draw, lv, draw.integer(1, 3))
    producers = {r.tensor.name for _, r in lv.producers}  # type: ignore[attr-defined]
    if not any(ld.tensor.name in producers for ld in loads(term)):  # a consumer reads a producer
        _, p = draw.choice(lv.producers)
        term = draw.choice([lambda: term + p, lambda: term * p, lambda: exp(term - p)])()
    return term


def _combine(red: str, acc: Expr, term: Expr) -> Expr:
    return {"max": maximum, "min": minimum}[red](acc, term) if red in ("max", "min") else (
        acc + term if red == "sum" else acc * term)


def _epilogue(draw: Draw, p: ProgramBuilder, x: Tensor, producers: list[tuple[str, Tensor]], shape: _Shape,
              dtype: str) -> None:
    (_, a), (_, b) = producers[0], producers[-1]
    if draw.boolean():
        out = p.output("out", shape.full, dtype)
        with p.nest("epilogue", i=shape.N, **shape.spatial()) as idx:
            i = idx[0]
            out[idx] = draw.choice([lambda: exp(x[idx] - a[i]) / b[i], lambda: x[idx] / b[i],
                                    lambda: (x[idx] - a[i]) * b[i]])()
    else:
        out = p.output("out", (shape.N,), dtype)
        if len(shape.full) == 2 and draw.boolean(0.3):  # a gather, as in a cross-entropy loss
            g = p.input("g", (shape.N,), "i32")
            with p.nest("epilogue", i=shape.N) as (i,):
                out[i] = log(abs(b[i])) + a[i] - x[i, g[i]]
            return
        with p.nest("epilogue", i=shape.N) as (i,):
            out[i] = draw.choice([lambda: log(b[i]) + a[i], lambda: a[i] / b[i], lambda: sqrt(abs(b[i]))])()


# ------------------------------------------------------------------ inputs

ROW_KINDS = ("normal", "normal", "leading_zeros", "zeros", "ties", "monotone", "large", "special", "positive",
             "offset")


def row(draw: Draw, rng: np.random.Generator, m: int, sign: str | None = None, finite: bool = False) -> np.ndarray:
    """One row of ``m`` values of a drawn kind, kept to a declared ``sign`` (magnitudes; +inf stays, -inf and
    NaN become +inf, and a positive row's zeros the smallest normal number) and to ``finite`` (±inf and NaN
    become ±1000)."""
    kind = draw.choice(ROW_KINDS)
    v = rng.standard_normal(m) * draw.choice([1.0, 3.0])
    if kind == "leading_zeros":
        v[: draw.integer(1, m)] = 0.0
    elif kind == "zeros":
        v[:] = 0.0
    elif kind == "ties":
        v = rng.choice([-1.0, 0.5, 2.0, 2.0], m)
    elif kind == "monotone":
        v = np.sort(v)[:: draw.choice([1, -1])]
    elif kind == "large":
        v = rng.uniform(1.0, 1000.0, m) * rng.choice([-1.0, 1.0], m)
    elif kind == "special":
        v[draw.integer(0, m - 1)] = draw.choice([np.inf, -np.inf, np.nan])
    elif kind == "positive":
        v = np.abs(v) + 0.1
    elif kind == "offset":  # a spread small against the values: a sum of differences cancels
        v = v + draw.choice([1e2, -1e3, 1e4])
    if sign is not None:
        v = np.where(np.isnan(v), np.inf, np.abs(v))
        if sign == "positive":
            v = np.where(v == 0.0, np.finfo(np.float32).tiny, v)
    if finite:
        v = np.where(np.isfinite(v), v, np.where(v < 0, -1000.0, 1000.0))
    return v


def inputs(draw: Draw, c: Cascade, seed: int) -> tuple[dict[str, np.ndarray], dict[str, int] | None]:
    """One input set for ``c`` (and the sizes, when they are symbolic): each row of ``x`` (and ``y``) a drawn
    kind, over all its reduced elements."""
    rng = np.random.default_rng(seed)
    decl = c.program.inputs[0].shape
    if c.symbolic:
        n, m = draw.integer(1, 3), draw.choice(SIZES)
        shape = (n, m, *(int(d.value) for d in decl[2:]))  # type: ignore[attr-defined]
    else:
        shape = tuple(int(d.value) for d in decl)  # type: ignore[attr-defined]
    np_dtype = np.float64 if c.dtype == "f64" else np.float32
    per_row = int(np.prod(shape[1:]))
    data = {t.name: rng.integers(0, shape[1], shape[0]).astype(np.int32) if t.dtype.is_int else  # gather indices
            np.stack([row(draw, rng, per_row, t.sign, t.finite) for _ in range(shape[0])]).reshape(shape)
            .astype(np_dtype)
            for t in c.program.inputs}
    return data, ({"N": shape[0], "M": shape[1]} if c.symbolic else None)
