"""Normalisation and statistics (OPERATORS.md §C) as plain, unfused programs.

One loop nest per step of the math.  Every size is a size parameter of the host kernel
(``Operator.symbolic``) except rmsnorm_amax's row length ``M`` (``RMSNORM_SYMBOLIC`` says why).
Tolerances follow the f32 error model of :mod:`polyfuse.ops.softmax` (``U32 = 2^-24``
per rounding, sequential sums add ``(n - 1)·U32·Σ|terms|``).  Where an output cancels
(mixed signs, a subtracted mean) the absolute part of a tolerance bounds ``Σ|terms|``
from how ``make_inputs`` draws values, for every magnitude the operator is tested at:
``tolerance`` does not see the magnitude.
"""

from __future__ import annotations

import math

import numpy as np

from polyfuse.ir import ProgramBuilder, maximum, reduce, sqrt
from polyfuse.ir.expr import Expr
from polyfuse.ir.stmt import Program, Tensor
from polyfuse.ops import register
from polyfuse.ops.base import ROWS_ON_THE_GRID, Arrays, Operator, Sizes, extents, ieee_reference
from polyfuse.ops.variants import Operand
from polyfuse.ops.softmax import CONTRACTED, TINY32, U32

SPREAD = math.sqrt(3.0)
"""Half-width of the unit-variance uniform noise U(-SPREAD, SPREAD) used where bounds must be hard."""

_ROWS = {"default": {"N": 8, "M": 40}}
_ROWS_PRESET = {"default": {"N": 4096, "M": 8192}}


def _normal_rows(rng: np.random.Generator, sizes: Sizes, magnitude: float) -> np.ndarray:
    return (rng.standard_normal((sizes["N"], sizes["M"])) * magnitude).astype(np.float32)


# ------------------------------------------------------------------ l2norm_stable

def build_l2norm_stable(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("l2norm_stable")
    N, M = extents(p, sizes, "N", "M")
    x = p.input("x", (N, M), "f32")
    amax = p.temp("amax", (N,), "f32")
    ssq = p.temp("ssq", (N,), "f32")
    out = p.output("out", (N,), "f32")
    with p.nest("s_amax", i=N, j=reduce(M)) as (i, j):
        amax[i] = maximum(amax[i], abs(x[i, j]))
    with p.nest("s_ssq", i=N, j=reduce(M)) as (i, j):
        ssq[i] = ssq[i] + (x[i, j] / amax[i]) * (x[i, j] / amax[i])
    with p.nest("s_out", i=N) as (i,):
        out[i] = amax[i] * sqrt(ssq[i])
    return p.build()


def make_l2norm_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """Standard normal rows times ``magnitude`` (1e25: x² overflows f32; 1e-30: it underflows)."""
    return {"x": _normal_rows(rng, sizes, magnitude)}


@ieee_reference
def ref_l2norm_stable(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    """The program's formula m·sqrt(Σ (x/m)²) in float64: equal to sqrt(Σ x²) where that is finite, and like the
    program NaN for a row of zeros (0·sqrt(0/0)), or with an infinite entry (inf/inf)."""
    x = inputs["x"].astype(np.float64)
    m = np.max(np.abs(x), axis=1, keepdims=True)
    return {"out": m[:, 0] * np.sqrt(np.sum((x / m) ** 2, axis=1))}


def tol_l2norm_stable(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    # (x/m)²: 3 roundings, 9 on the GPU (x/m is x·rcp_rz(m) there, 3 + 2^-23 counted as 4, twice, and the
    # square); the sum of M positive terms: M - 1; sqrt halves that and adds 1; m·: 1.
    return {"out": (TINY32, ((sizes["M"] + 8) / 2 + 2) * U32)}


register(Operator(
    name="l2norm_stable",
    description="row L2 norm without overflow: m = max_j |x|, s = Σ_j (x/m)², out = m·sqrt(s)",
    build=build_l2norm_stable, make_inputs=make_l2norm_inputs, reference=ref_l2norm_stable,
    tolerance=tol_l2norm_stable,
    tolerance_note="f32, U32 = 2^-24 per rounding; max|x| is exact. Each (x/m)² carries 3 roundings (9 on the "
                   "GPU, where x/m is x·rcp_rz(m), 3·U32 + 2^-47 counted as 4·U32, the reciprocal_rows code "
                   "generation option) and the sum of M positive terms M - 1 more, so rel(s) <= (M + 8)·U32; "
                   "sqrt halves it and adds U32, m·sqrt(s) adds U32: rtol = ((M + 8)/2 + 2)·U32. All values are "
                   "positive, so no cancellation; atol = smallest normal f32." + CONTRACTED,
    defaults=_ROWS, presets=_ROWS_PRESET, magnitudes=(1.0, 1e25, 1e-30), symbolic=("N", "M"),
    gpu_symbolic={"default": ("N",)}, gpu_symbolic_note=ROWS_ON_THE_GRID,
    operands=(Operand("x", axis=1, huge=2.0 ** 100, tiny=2.0 ** -100),),
))


# ------------------------------------------------------------------ rmsnorm_amax

RMS_EPS = 1e-6
RMSNORM_SYMBOLIC = ("N",)
"""Only the rows are symbolic: the rolling repair of ``amax`` over ``y = x / sqrt(ssq/M + eps)`` inverts
``y`` in ``x``, and with M a parameter the repair search finds no inverse it can prove (NoRepairFound);
M stays a number, one kernel per row length."""


def build_rmsnorm_amax(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("rmsnorm_amax")
    N, M = extents(p, sizes, "N", "M")
    x = p.input("x", (N, M), "f32")
    ssq = p.temp("ssq", (N,), "f32")
    y = p.output("y", (N, M), "f32")
    amax = p.output("amax", (N,), "f32")
    with p.nest("s_ssq", i=N, j=reduce(M)) as (i, j):
        ssq[i] = ssq[i] + x[i, j] * x[i, j]
    with p.nest("s_norm", i=N, j=M) as (i, j):
        y[i, j] = x[i, j] / sqrt(ssq[i] / M + RMS_EPS)
    with p.nest("s_amax", i=N, j=reduce(M)) as (i, j):
        amax[i] = maximum(amax[i], y[i, j])
    return p.build()


def make_rmsnorm_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """Standard normal rows times ``magnitude`` (1e-3: eps dominates s/M; 1e15: x² ~ 1e30)."""
    return {"x": _normal_rows(rng, sizes, magnitude)}


@ieee_reference
def ref_rmsnorm_amax(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    x = inputs["x"].astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + RMS_EPS)
    return {"y": y, "amax": y.max(axis=1)}


def tol_rmsnorm_amax(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    # s: M roundings; /M (two on the GPU: s·fl(1/M)), + eps (and eps's own f32 rounding): 3 more; sqrt halves
    # and adds 1; x/: 1, or 3 + 2^-23 on the GPU (x·rcp_rz(d)), counted as 4.
    rtol = ((sizes["M"] + 4) / 2 + 5) * U32
    return {"y": (TINY32, rtol), "amax": (TINY32, rtol)}


register(Operator(
    name="rmsnorm_amax",
    description="RMSNorm and its row max: s = Σ_j x², y = x / sqrt(s/M + eps), amax = max_j y (eps = 1e-6)",
    build=build_rmsnorm_amax, make_inputs=make_rmsnorm_inputs, reference=ref_rmsnorm_amax,
    tolerance=tol_rmsnorm_amax,
    tolerance_note="f32, U32 = 2^-24 per rounding. s = Σ x² (positive terms): rel <= M·U32; s/M + eps adds 3 "
                   "roundings (s/M is s·fl(1/M) on the GPU, the reciprocal_constants code generation option, "
                   "where M is not a power of two) and eps's f32 rounding at most one more; sqrt halves and adds "
                   "U32; the division U32, or 3·U32 + 2^-47 on the GPU (x·rcp_rz(d), the reciprocal_rows code "
                   "generation option), counted as 4·U32: rtol = ((M + 4)/2 + 5)·U32 for y, and for amax (a max "
                   "moves by at most the largest perturbation). No cancellation; atol = smallest normal f32. The "
                   "plain Σx² itself overflows f32 "
                   "for |x| >~ 1e18, so magnitudes stop at 1e15, and the special variant's huge entries are 2^48."
                   + CONTRACTED,
    defaults=_ROWS, presets=_ROWS_PRESET, magnitudes=(1.0, 1e-3, 1e15), symbolic=RMSNORM_SYMBOLIC,
    gpu_symbolic={"default": ("N",)}, gpu_symbolic_note=ROWS_ON_THE_GRID,
    operands=(Operand("x", axis=1, huge=2.0 ** 48, tiny=2.0 ** -100),),
))


# ------------------------------------------------------------------ sum_sum

SUM_SUM_THRESHOLD = 10.0


def build_sum_sum(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("sum_sum")
    N, M = extents(p, sizes, "N", "M")
    x1 = p.input("x1", (N, M), "f32")
    x2 = p.input("x2", (N, M), "f32")
    m = p.temp("m", (N,), "f32")
    s = p.output("s", (N,), "f32")
    with p.nest("s_sumsq", i=N, j=reduce(M)) as (i, j):
        m[i] = m[i] + x1[i, j] * x1[i, j]
    with p.nest("s_scaled_dot", i=N, j=reduce(M)) as (i, j):
        s[i] = s[i] + x1[i, j] * x2[i, j] / sqrt(maximum(m[i] - SUM_SUM_THRESHOLD, 1.0))
    return p.build()


def make_sum_sum_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """x1 standard normal times ``magnitude`` (0.25 puts Σx1² under the threshold 10), x2 ~ U(-1, 1)."""
    shape = (sizes["N"], sizes["M"])
    x1 = rng.standard_normal(shape) * magnitude
    return {"x1": x1.astype(np.float32), "x2": rng.uniform(-1.0, 1.0, shape).astype(np.float32)}


@ieee_reference
def ref_sum_sum(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    x1, x2 = inputs["x1"].astype(np.float64), inputs["x2"].astype(np.float64)
    m = np.sum(x1 * x1, axis=1)
    return {"s": np.sum(x1 * x2, axis=1) / np.sqrt(np.maximum(m - SUM_SUM_THRESHOLD, 1.0))}


def tol_sum_sum(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    M = sizes["M"]
    # Each term is off by (5.5·M + 6.5)·U32 relatively (the division counted as 4: x·rcp_rz(d) on the GPU), the
    # sum adds M - 1; Σ|terms| <= sqrt(11·M).
    return {"s": ((6.5 * M + 5.5) * U32 * math.sqrt(11 * M), 0.0)}


register(Operator(
    name="sum_sum",
    description="RedFuser A.2.3: m = Σ_j x1², s = Σ_j x1·x2 / sqrt(max(m - 10, 1))",
    build=build_sum_sum, make_inputs=make_sum_sum_inputs, reference=ref_sum_sum, tolerance=tol_sum_sum,
    tolerance_note="f32, U32 = 2^-24 per rounding. m = Σ x1² has rel error <= M·U32; max(m - 10, 1) amplifies "
                   "it by at most m/max(m - 10, 1) <= 11, so rel <= (11M + 1)·U32, sqrt halves it; with the "
                   "product and the division (3·U32 + 2^-47 on the GPU, x·rcp_rz(d), the reciprocal_rows code "
                   "generation option: counted as 4·U32) each term of s is off by <= (5.5M + 6.5)·U32 and the "
                   "sum of M "
                   "mixed-sign terms adds (M - 1)·U32·Σ|terms|. By Cauchy-Schwarz Σ|x1·x2|/sqrt(max(m-10, 1)) "
                   "<= sqrt(11)·|x2|_2 <= sqrt(11·M) (|x2| <= 1, any x1 magnitude): atol = (6.5M + 5.5)·U32·"
                   "sqrt(11M), rtol = 0. x1 magnitudes stop at 1e15 because Σx1² overflows f32 beyond ~1e18 "
                   "(the special variant's huge x1 entries are 2^48); x2 gets no huge entries, since |x2| <= 1 "
                   "is part of the bound." + CONTRACTED,
    defaults=_ROWS, presets=_ROWS_PRESET, magnitudes=(1.0, 0.25, 1e15), symbolic=("N", "M"),
    gpu_symbolic={"default": ("N",)}, gpu_symbolic_note=ROWS_ON_THE_GRID,
    operands=(Operand("x1", axis=1, huge=2.0 ** 48, tiny=2.0 ** -100), Operand("x2", axis=1, tiny=2.0 ** -100)),
))


# ------------------------------------------------------------------ variance

VARIANCE_OFFSETS = (1.0, 1e4)
"""Magnitudes of ``variance`` are a common offset of the data (spread 1): at 1e4 the one-pass
E[x²] - E[x]² cancels catastrophically in f32, the two-pass program stays accurate."""


def build_variance(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("variance")
    B, L = extents(p, sizes, "B", "L")
    x = p.input("x", (B, L), "f32")
    mean = p.temp("mean", (B,), "f32")
    var = p.output("var", (B,), "f32")
    with p.nest("s_mean", b=B, j=reduce(L)) as (b, j):
        mean[b] = mean[b] + x[b, j] / L
    with p.nest("s_var", b=B, j=reduce(L)) as (b, j):
        var[b] = var[b] + (x[b, j] - mean[b]) * (x[b, j] - mean[b]) / L
    return p.build()


def make_variance_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """``magnitude`` + U(-sqrt 3, sqrt 3): a common offset with unit variance."""
    x = magnitude + rng.uniform(-SPREAD, SPREAD, (sizes["B"], sizes["L"]))
    return {"x": x.astype(np.float32)}


@ieee_reference
def ref_variance(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    return {"var": np.var(inputs["x"].astype(np.float64), axis=1)}


def _mean_error(n: int, offsets: tuple[float, ...], per_term: int = 1) -> float:
    """Bound on the f32 error of a mean of n values below max(offsets) + SPREAD: n - 1 roundings of the sum and
    ``per_term`` of each term (a mean Σ x/n: two, as the GPU computes x/n as x·fl(1/n), the
    ``reciprocal_constants`` code generation option, where n is not a power of two)."""
    return (n - 1 + per_term) * U32 * (max(offsets) + SPREAD)


def tol_variance(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    L = sizes["L"]
    # var computed = (1 + (L + 4)·U32·θ)·(var + δ²) for a mean off by δ (each term's /L two roundings on the GPU).
    return {"var": (2 * _mean_error(L, VARIANCE_OFFSETS, per_term=2) ** 2, (L + 4) * U32)}


register(Operator(
    name="variance",
    description="two-pass row variance of x[B, L]: mean = Σ_l x / L, var = Σ_l (x - mean)² / L",
    build=build_variance, make_inputs=make_variance_inputs, reference=ref_variance, tolerance=tol_variance,
    tolerance_note="f32, U32 = 2^-24 per rounding. The mean is off by δ <= (L + 1)·U32·max|x| (x/L and the "
                   "sum; x/L is two roundings on the GPU, x·fl(1/L), the reciprocal_constants code generation "
                   "option, where L is not a power of two); "
                   "Σ(x - mean)²/L then equals (var + δ²) up to 5 roundings per term and L - 1 for the sum of "
                   "positive terms: rtol = (L + 4)·U32, atol = 2·δ² with max|x| = max offset (1e4) + sqrt 3 "
                   "(tolerance does not see the magnitude, so it covers the largest; the special variant's huge "
                   "entries, 2^13, are within it)." + CONTRACTED,
    defaults={"default": {"B": 8, "L": 40}}, presets={"default": {"B": 1024, "L": 8192}}, symbolic=("B", "L"),
    gpu_symbolic={"default": ("B",)},
    gpu_symbolic_note="B is the rows, the grid of the GPU kernel; L, the row length, decides rows on chip and the "
                      "tile of the rolling loop",
    magnitudes=VARIANCE_OFFSETS,
    operands=(Operand("x", axis=1, huge=2.0 ** 13, tiny=2.0 ** -100),),
))


# ------------------------------------------------------------------ inertia

INERTIA_OFFSETS = (1.0, 1e3)
"""Magnitudes of ``inertia`` are a common offset of the positions (spread 1): at 1e3 the one-pass
Σ w·|x|² - M·|c|² (~1e8, f32 ulp 8) already loses I (~1e2); the two-pass program stays accurate."""


def build_inertia(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("inertia")
    B, N = extents(p, sizes, "B", "N")
    w = p.input("w", (B, N), "f32", sign="nonnegative")  # masses
    x = p.input("x", (B, N, 3), "f32")
    mass = p.temp("mass", (B,), "f32")
    center = p.temp("center", (B, 3), "f32")
    inertia = p.output("inertia", (B,), "f32")
    with p.nest("s_mass", b=B, n=reduce(N)) as (b, n):
        mass[b] = mass[b] + w[b, n]
    with p.nest("s_center", b=B, c=3, n=reduce(N)) as (b, c, n):
        center[b, c] = center[b, c] + w[b, n] * x[b, n, c] / mass[b]
    with p.nest("s_inertia", b=B, n=reduce(N)) as (b, n):
        inertia[b] = inertia[b] + w[b, n] * _squared_distance(x, center, b, n)
    return p.build()


def _squared_distance(x: Tensor, center: Tensor, b: Expr, n: Expr) -> Expr:
    """|x[b, n, :] - center[b, :]|² written out over the three coordinates."""
    d = [x[b, n, c] - center[b, c] for c in range(3)]
    return d[0] * d[0] + d[1] * d[1] + d[2] * d[2]


def make_inertia_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """Masses U(0.5, 1.5); positions ``magnitude`` + U(-sqrt 3, sqrt 3) per coordinate."""
    B, N = sizes["B"], sizes["N"]
    w = rng.uniform(0.5, 1.5, (B, N))
    x = magnitude + rng.uniform(-SPREAD, SPREAD, (B, N, 3))
    return {"w": w.astype(np.float32), "x": x.astype(np.float32)}


@ieee_reference
def ref_inertia(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    w, x = inputs["w"].astype(np.float64), inputs["x"].astype(np.float64)
    c = np.einsum("bn,bnc->bc", w, x) / w.sum(axis=1)[:, None]
    return {"inertia": np.einsum("bn,bnc->b", w, (x - c[:, None, :]) ** 2)}


def tol_inertia(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    N = sizes["N"]
    # Each centre coordinate is off by <= 2N·U32·max|x|; I gains M·|δc|² <= 1.5N·3·(2N·U32·max|x|)².
    shift = 1.5 * N * 3 * (2 * _mean_error(N, INERTIA_OFFSETS)) ** 2
    return {"inertia": (2 * shift, (N + 5) * U32)}


register(Operator(
    name="inertia",
    description="RedFuser A.6 moment of inertia: M = Σ_n w, c = Σ_n w·x / M, I = Σ_n w·|x - c|² (x[B, N, 3])",
    build=build_inertia, make_inputs=make_inertia_inputs, reference=ref_inertia, tolerance=tol_inertia,
    tolerance_note="f32, U32 = 2^-24 per rounding. M = Σw (positive): rel (N - 1)·U32; each centre coordinate "
                   "Σ w·x/M is off by δ <= 2N·U32·max|x|; Σ w·|x - c_computed|² = I + M·|δc|² exactly (weighted "
                   "parallel axes), computed with 6 roundings per term (a rounded difference counts twice once "
                   "squared, the square, 2 additions, w·) and N - 1 for the positive sum: rtol = (N + 5)·U32, "
                   "atol = 2·M·|δc|² <= 2·1.5N·3·(2N·U32·max|x|)² with max|x| = max offset (1e3) + sqrt 3 "
                   "(tolerance does not see the magnitude, so it covers the largest). Input variants keep both "
                   "bounds: masses only become 0, tiny, +inf or NaN, and the special variant's huge positions "
                   "are 2^9." + CONTRACTED,
    defaults={"default": {"B": 6, "N": 40}}, presets={"default": {"B": 1024, "N": 8192}}, symbolic=("B", "N"),
    gpu_symbolic={"default": ("B",)},
    gpu_symbolic_note="B is the bodies, the grid of both GPU kernels (with the splits); N, the points, is split "
                      "into tiles of points, the partial nests of the split-k plan",
    magnitudes=INERTIA_OFFSETS,
    operands=(Operand("w", axis=1, tiny=2.0 ** -100),
              Operand("x", axis=1, shared=(2,), huge=2.0 ** 9, tiny=2.0 ** -100)),
))


# ------------------------------------------------------------------ layernorm_stats

LAYERNORM_EPS = 1e-5
LAYERNORM_OFFSETS = (1.0, 1e4)
"""Magnitudes of ``layernorm_stats`` are a common offset of the rows (spread 1), as for ``variance``."""


def build_layernorm_stats(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("layernorm_stats")
    N, M = extents(p, sizes, "N", "M")
    x = p.input("x", (N, M), "f32")
    mean = p.output("mean", (N,), "f32")
    var = p.output("var", (N,), "f32")
    y = p.output("y", (N, M), "f32")
    with p.nest("s_mean", i=N, j=reduce(M)) as (i, j):
        mean[i] = mean[i] + x[i, j] / M
    with p.nest("s_var", i=N, j=reduce(M)) as (i, j):
        var[i] = var[i] + (x[i, j] - mean[i]) * (x[i, j] - mean[i]) / M
    with p.nest("s_norm", i=N, j=M) as (i, j):
        y[i, j] = (x[i, j] - mean[i]) / sqrt(var[i] + LAYERNORM_EPS)
    return p.build()


def make_layernorm_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """``magnitude`` + U(-sqrt 3, sqrt 3): a common offset with unit variance."""
    x = magnitude + rng.uniform(-SPREAD, SPREAD, (sizes["N"], sizes["M"]))
    return {"x": x.astype(np.float32)}


@ieee_reference
def ref_layernorm_stats(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    x = inputs["x"].astype(np.float64)
    mean, var = x.mean(axis=1), x.var(axis=1)
    return {"mean": mean, "var": var, "y": (x - mean[:, None]) / np.sqrt(var[:, None] + LAYERNORM_EPS)}


def tol_layernorm_stats(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    M = sizes["M"]
    delta = _mean_error(M, LAYERNORM_OFFSETS, per_term=2)
    # y: x - mean is off by δ (the subtraction itself is exact near the offset), var + eps relatively by
    # (M + 5)·U32 (halved by sqrt, plus sqrt and the division); the sample variance of M >= 8 draws of
    # unit variance is >= 1/4 here, so 1/sqrt(var + eps) <= 2.  Each /M is two roundings on the GPU (x·fl(1/M)),
    # the division by sqrt(var + eps) 3 + 2^-23 (x·rcp_rz(d)), counted as 4.
    return {"mean": (delta, 0.0), "var": (2 * delta ** 2, (M + 4) * U32), "y": (2 * delta, ((M + 5) / 2 + 6) * U32)}


register(Operator(
    name="layernorm_stats",
    description="LayerNorm statistics of x[N, M]: mean = Σ_j x / M, var = Σ_j (x - mean)² / M, "
                "y = (x - mean) / sqrt(var + eps) (eps = 1e-5)",
    build=build_layernorm_stats, make_inputs=make_layernorm_inputs, reference=ref_layernorm_stats,
    tolerance=tol_layernorm_stats,
    tolerance_note="f32, U32 = 2^-24 per rounding. mean: x/M and the sum, off by δ <= (M + 1)·U32·max|x| "
                   "(x/M two roundings on the GPU, x·fl(1/M), the reciprocal_constants code generation option, "
                   "where M is not a power of two; atol δ); "
                   "var as for variance: rtol (M + 4)·U32, atol 2·δ²; y = (x - mean)/sqrt(var + eps): the "
                   "difference is exact up to δ and 1/sqrt(var + eps) <= 2 for these draws (atol 2δ), the "
                   "relative error of var + eps is halved by sqrt, plus sqrt, the division (3·U32 + 2^-47 on the "
                   "GPU, x·rcp_rz(d), the reciprocal_rows code generation option: counted as 4·U32) and the "
                   "subtraction: rtol ((M + 5)/2 + 6)·U32. max|x| = max offset (1e4) + sqrt 3 (tolerance does not "
                   "see the magnitude, so it covers the largest). Input variants: a ties row has variance "
                   "(max - min)²/4, at least its own, monotone rows keep their values, huge entries (2^13) stay "
                   "within max|x|; a zero row is exact, and a row of m values (mean μ) after M - m zeros has a "
                   "mean off by at most m²·U32·max|x|/M against var >= (M - m)·m·μ²/M² (one value x: "
                   "U32·|x|/M against x²/M), so δ_mean/sqrt(var + eps) stays below 2δ while μ is near the "
                   "offset." + CONTRACTED,
    defaults=_ROWS, presets=_ROWS_PRESET, magnitudes=LAYERNORM_OFFSETS, symbolic=("N", "M"),
    gpu_symbolic={"default": ("N",)}, gpu_symbolic_note=ROWS_ON_THE_GRID,
    operands=(Operand("x", axis=1, huge=2.0 ** 13, tiny=2.0 ** -100),),
))
