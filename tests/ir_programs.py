"""Small hand-written programs shared by the IR tests."""

from __future__ import annotations

from polyfuse.ir import ProgramBuilder, Program, exp, maximum, reduce, spatial


def softmax_sum(symbolic: bool = True, n: int = 2, m: int = 4, *, layout: str = "plain",
                sizes: tuple[str | int, str | int] | None = None) -> Program:
    """Neptune Fig. 1a (``plain``), its naive fusion Fig. 1b (``naive``: all three blocks under
    loops i, j), ``naive_reversed_max`` (Fig. 1b with s_max's reduce loop run backwards), or ``reversed``
    (Fig. 1a with the reduce loops of s_max and s_sum run backwards: each init, at j = 0, runs last).

    Sizes are ``N, M`` parameters (``symbolic``), the integers ``n, m``, or ``sizes`` mixing both
    (a name is a size parameter)."""
    p = ProgramBuilder("softmax_sum")
    if sizes is None:
        sizes = ("N", "M") if symbolic else (n, m)
    N, M = (p.size(x) if isinstance(x, str) else x for x in sizes)
    inp = p.input("inp", (N, M), "f32")
    xmax = p.temp("xmax", (N,), "f32")
    xexp = p.temp("xexp", (N, M), "f32")
    xsum = p.output("xsum", (N,), "f32")
    if layout == "plain":
        with p.nest("s_max", i=N, j=reduce(M)) as (i, j):
            xmax[i] = maximum(xmax[i], inp[i, j])
        with p.nest("s_exp", i=N, j=M) as (i, j):
            xexp[i, j] = exp(inp[i, j] - xmax[i])
        with p.nest("s_sum", i=N, j=reduce(M)) as (i, j):
            xsum[i] = xsum[i] + xexp[i, j]
        return p.build()
    if layout == "reversed":
        with p.loop("i", N) as li, p.loop("j", M) as lj:
            with p.block("s_max", i=spatial(N, li), j=reduce(M, M - 1 - lj)) as (i, j):
                xmax[i] = maximum(xmax[i], inp[i, j])
        with p.nest("s_exp", i=N, j=M) as (i, j):
            xexp[i, j] = exp(inp[i, j] - xmax[i])
        with p.loop("i", N) as li, p.loop("j", M) as lj:
            with p.block("s_sum", i=spatial(N, li), j=reduce(M, M - 1 - lj)) as (i, j):
                xsum[i] = xsum[i] + xexp[i, j]
        return p.build()
    with p.loop("i", N) as li, p.loop("j", M) as lj:
        jmax = M - 1 - lj if layout == "naive_reversed_max" else lj
        with p.block("s_max", i=spatial(N, li), j=reduce(M, jmax)) as (i, j):
            xmax[i] = maximum(xmax[i], inp[i, j])
        with p.block("s_exp", i=spatial(N, li), j=spatial(M, lj)) as (i, j):
            xexp[i, j] = exp(inp[i, j] - xmax[i])
        with p.block("s_sum", i=spatial(N, li), j=reduce(M, lj)) as (i, j):
            xsum[i] = xsum[i] + xexp[i, j]
    return p.build()


def softmax_sum_split(n: int = 10, m: int = 6, factor: int = 4) -> Program:
    """Fig. 1a with the row loop split by a factor that does not divide it (guarded)."""
    p = ProgramBuilder("softmax_sum_split")
    inp = p.input("inp", (n, m), "f32")
    xmax = p.temp("xmax", (n,), "f32")
    xexp = p.temp("xexp", (n, m), "f32")
    xsum = p.output("xsum", (n,), "f32")
    outer = (n + factor - 1) // factor
    with p.loop("i0", outer) as i0:
        with p.loop("i1", factor) as i1:
            with p.loop("j", m) as j:
                with p.block("s_max", i=spatial(n, i0 * factor + i1), j=reduce(m, j)) as (i, jj):
                    xmax[i] = maximum(xmax[i], inp[i, jj])
            with p.loop("j", m) as j:
                with p.block("s_exp", i=spatial(n, i0 * factor + i1), j=spatial(m, j)) as (i, jj):
                    xexp[i, jj] = exp(inp[i, jj] - xmax[i])
                with p.block("s_sum", i=spatial(n, i0 * factor + i1), j=reduce(m, j)) as (i, jj):
                    xsum[i] = xsum[i] + xexp[i, jj]
    return p.build()


def prefix_sum(n: int = 9) -> Program:
    """y[i] = y[i-1] + x[i]: iterations depend on each other, so the loop must run in order."""
    p = ProgramBuilder("prefix_sum")
    x = p.input("x", (n,), "f32")
    y = p.output("y", (n,), "f32")
    with p.nest("first", i=1) as (i,):
        y[i] = x[i]
    with p.loop("t", n - 1) as t:
        with p.block("scan", i=spatial(n - 1, t)) as (i,):
            y[i + 1] = y[i] + x[i + 1]
    return p.build()


def _sized(p: ProgramBuilder, sizes: tuple[str | int, ...]) -> list:
    """Each size a parameter (a name) or an integer."""
    return [p.size(x) if isinstance(x, str) else x for x in sizes]


def softmax_average(sizes: tuple[str | int, str | int] = ("N", "M")) -> Program:
    """Three chained reductions: the row max m, the sum s = Σ exp(x - m), and the softmax-weighted
    average o = Σ exp(x - m) / s · v (attention's normalisation inside the sum)."""
    p = ProgramBuilder("softmax_average")
    N, M = _sized(p, sizes)
    x = p.input("x", (N, M), "f32")
    v = p.input("v", (N, M), "f32")
    m = p.temp("m", (N,), "f32")
    s = p.temp("s", (N,), "f32")
    o = p.output("o", (N,), "f32")
    with p.nest("s_max", i=N, j=reduce(M)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_sum", i=N, j=reduce(M)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - m[i])
    with p.nest("s_avg", i=N, j=reduce(M)) as (i, j):
        o[i] = o[i] + exp(x[i, j] - m[i]) / s[i] * v[i, j]
    return p.build()


def two_pass_variance(sizes: tuple[str | int, str | int] = ("B", "L")) -> Program:
    """mean = Σ x / L, var = Σ (x - mean)² / L: a state repair (no single h) whose terms read the size L."""
    p = ProgramBuilder("two_pass_variance")
    B, L = _sized(p, sizes)
    x = p.input("x", (B, L), "f32")
    mean = p.temp("mean", (B,), "f32")
    var = p.output("var", (B,), "f32")
    with p.nest("s_mean", b=B, j=reduce(L)) as (b, j):
        mean[b] = mean[b] + x[b, j] / L
    with p.nest("s_var", b=B, j=reduce(L)) as (b, j):
        var[b] = var[b] + (x[b, j] - mean[b]) * (x[b, j] - mean[b]) / L
    return p.build()
