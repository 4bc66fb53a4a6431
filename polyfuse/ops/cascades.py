"""Other cascaded reductions (OPERATORS.md §D) as plain, unfused programs.

MoE routing (softmax statistics plus a top-k written in plain loops), per-token
quantised GEMM (real-valued and fp8-rounded) and FAVOR+ linear attention (Performer).
The outer sizes (tokens ``S``, rows ``M`` and columns ``N`` of the GEMMs, ``B``, ``H``, ``L`` of
performer) are size parameters of the host kernel (``Operator.symbolic``); the others stay Python ints:
reduced dimensions the tolerances and the GPU GEMM tiles are built from (``HD``, ``E``, ``K``), the top-k
count that shapes moe_routing's loops, and performer's ``D`` and ``F``, whose values are its constants
(δ = D^-1/4, ρ = F^-1/2).  Tolerances follow the f32 error model of :mod:`polyfuse.ops.softmax`.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from polyfuse.ir import ProgramBuilder, cast, eq, exp, maximum, reduce, select
from polyfuse.ir.stmt import Program
from polyfuse.ops import register
from polyfuse.ops.base import Arrays, Operator, Sizes, extents, ieee_reference
from polyfuse.ops.variants import Operand
from polyfuse.ops.softmax import CONTRACTED, FN32, TINY32, U32, max_exp_sum

# ------------------------------------------------------------------ moe_routing

GRID = 4
"""MoE inputs are multiples of 1/GRID in [-1, 1] so that every gate logit is exact in f32."""


def build_moe_routing(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("moe_routing")
    (S,), HD, E, K = extents(p, sizes, "S"), sizes["HD"], sizes["E"], sizes["K"]
    # finite, as a model's are: the GPU kernel multiplies f32 operands split into 16-bit parts
    # (polyfuse.emit_cpp.mma), which equals the program's products only for finite values
    x = p.input("x", (S, HD), "f32", finite=True)
    w = p.input("w", (HD, E), "f32", finite=True)
    z = p.temp("z", (S, E), "f32")
    with p.nest("s_gate", s=S, e=E, h=reduce(HD)) as (s, e, h):
        z[s, e] = z[s, e] + x[s, h] * w[h, e]
    zmax, _, zsum = max_exp_sum(p, z, S, E, names=("zmax", "zexp", "zsum"))
    rank = p.temp("rank", (S, E), "i32")
    topv = p.temp("topv", (S, K), "f32")
    probs = p.output("probs", (S, K), "f32")
    topi = p.output("topi", (S, K), "i32")
    with p.nest("s_rank", s=S, e=E, e2=reduce(E)) as (s, e, e2):
        ahead = (z[s, e2] > z[s, e]) | (eq(z[s, e2], z[s, e]) & (e2 < e))
        rank[s, e] = rank[s, e] + cast("i32", ahead)
    with p.nest("s_topv", s=S, kk=K, e=reduce(E)) as (s, kk, e):
        topv[s, kk] = topv[s, kk] + select(eq(rank[s, e], kk), z[s, e], 0.0)
    with p.nest("s_topi", s=S, kk=K, e=reduce(E)) as (s, kk, e):
        topi[s, kk] = topi[s, kk] + select(eq(rank[s, e], kk), e, 0)
    with p.nest("s_probs", s=S, kk=K) as (s, kk):
        probs[s, kk] = exp(topv[s, kk] - zmax[s]) / zsum[s]
    return p.build()


def make_moe_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """x and w drawn from the multiples of 1/GRID in [-1, 1], w times ``magnitude`` rounded to a
    power of two: logits are then exact in f32 (and ties are real ties, broken by index)."""
    scale = 2.0 ** round(math.log2(magnitude))
    x = rng.integers(-GRID, GRID + 1, (sizes["S"], sizes["HD"])) / GRID
    w = rng.integers(-GRID, GRID + 1, (sizes["HD"], sizes["E"])) / GRID * scale
    return {"x": x.astype(np.float32), "w": w.astype(np.float32)}


@ieee_reference
def ref_moe_routing(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    """Softmax statistics and the top-k by rank, as the program defines them.

    The rank of logit e counts the logits ahead of it (larger, or equal at a lower index): for finite
    logits that is the stable descending order, and slot kk holds the one logit of rank kk.  A NaN logit
    compares false with everything, so ranks repeat (or are missing) and, as in the program, slot kk
    sums the logits and indices of rank kk (0 where none has it).
    """
    z = inputs["x"].astype(np.float64) @ inputs["w"].astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    s = np.exp(z - m).sum(axis=1, keepdims=True)
    experts = np.arange(z.shape[1])
    ahead = (z[:, None, :] > z[:, :, None]) | ((z[:, None, :] == z[:, :, None]) & (experts < experts[:, None]))
    slot = ahead.sum(axis=2)[:, None, :] == np.arange(sizes["K"])[None, :, None]  # [S, K, E]
    topv = np.where(slot, z[:, None, :], 0.0).sum(axis=2)
    return {"probs": np.exp(topv - m) / s, "topi": np.where(slot, experts, 0).sum(axis=2)}


def tol_moe_routing(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    E = sizes["E"]
    # Exact logits: Σ_e exp(z - m) is off by (E - 1)·U32 + FN32, probs add FN32 and the division.
    return {"probs": (TINY32, (E - 1) * U32 + 2 * FN32 + U32), "topi": (0.5, 0.0)}


register(Operator(
    name="moe_routing",
    description="RedFuser A.2.2 MoE router: z = x·w, m = max_e z, s = Σ_e exp(z - m), top-k of z, "
                "probs = exp(topk - m)/s; outputs probs[S, K] and expert indices topi[S, K]",
    build=build_moe_routing, make_inputs=make_moe_inputs, reference=ref_moe_routing, tolerance=tol_moe_routing,
    tolerance_note="Inputs are multiples of 1/4 (w times a power of two), so every logit z, z - m and the top-k "
                   "are exact in f32 and topi must equal the stable descending argsort exactly (atol 0.5 on "
                   "integers). probs: each exp(z - m) is within 8·U32 (4 ulp), their sum of E positive terms adds "
                   "(E - 1)·U32, exp of the top value 8·U32 and the division U32: rtol = (E - 1)·U32 + 16·U32 + "
                   "U32; atol = smallest normal f32 for probabilities that underflow. Input variants keep the "
                   "grid (zeros, repeats, sorting, and the special variant's huge entries 2^10), so logits stay "
                   "exact." + CONTRACTED,
    defaults={"default": {"S": 8, "HD": 24, "E": 12, "K": 2}},
    presets={"default": {"S": 4096, "HD": 4096, "E": 64, "K": 8}},
    magnitudes=(1.0, 1e4), symbolic=("S",),
    gpu_symbolic_note="none: the GPU plan splits the tokens S into tiles of rows (fewer where S is short), so the "
                      "tile and its masks depend on S, and HD is split into steps",
    operands=(Operand("x", axis=1, huge=2.0 ** 10), Operand("w", axis=1, shared=(0,), huge=2.0 ** 10)),
))


# ------------------------------------------------------------------ quant_gemm, quant_gemm_fp8

FP8_MAX = 448.0
"""Largest finite float8 e4m3 (fn) value: the per-row scale maps max|A| to it."""


def _build_quant_gemm(name: str, sizes: Sizes, *, fp8: bool) -> Program:
    p = ProgramBuilder(name)
    M, K, N = *extents(p, sizes, "M"), sizes["K"], *extents(p, sizes, "N")
    a = p.input("A", (M, K), "f32", finite=True)  # finite: split tensor-core products (see moe_routing)
    w = p.input("W", (K, N), "f32", finite=True)
    amax = p.temp("amax", (M,), "f32")
    c = p.output("C", (M, N), "f32")
    with p.nest("s_amax", i=M, k=reduce(K)) as (i, k):
        amax[i] = maximum(amax[i], abs(a[i, k]))
    with p.nest("s_gemm", i=M, n=N, k=reduce(K)) as (i, n, k):
        scaled = FP8_MAX * a[i, k] / amax[i]
        if fp8:
            scaled = cast("f32", cast("fp8e4m3", scaled))
        c[i, n] = c[i, n] + scaled * w[k, n]
    return p.build()


def build_quant_gemm(mode: str, sizes: Sizes) -> Program:
    return _build_quant_gemm("quant_gemm", sizes, fp8=False)


def build_quant_gemm_fp8(mode: str, sizes: Sizes) -> Program:
    return _build_quant_gemm("quant_gemm_fp8", sizes, fp8=True)


def make_quant_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """A ~ U(-1, 1)·magnitude (C does not depend on it), W ~ U(-1, 1)/sqrt(K)."""
    M, K, N = sizes["M"], sizes["K"], sizes["N"]
    a = rng.uniform(-1.0, 1.0, (M, K)) * magnitude
    w = rng.uniform(-1.0, 1.0, (K, N)) / math.sqrt(K)
    return {"A": a.astype(np.float32), "W": w.astype(np.float32)}


@ieee_reference
def ref_quant_gemm(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    a = inputs["A"].astype(np.float64)
    scaled = FP8_MAX * a / np.abs(a).max(axis=1, keepdims=True)
    return {"C": scaled @ inputs["W"].astype(np.float64)}


@ieee_reference
def ref_quant_gemm_fp8(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    """The quantised operand is fp8(f32(448·A) / max|A|), scaled in f32 as a kernel does, then
    rounded to float8 e4m3 by ml_dtypes; the GEMM on it is exact in float64."""
    a = inputs["A"]
    scaled = np.float32(FP8_MAX) * a / np.abs(a).max(axis=1, keepdims=True)
    quantised = scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return {"C": quantised @ inputs["W"].astype(np.float64)}


def _gemm_atol(K: int, roundings_per_term: int) -> float:
    """|error| <= (K - 1 + roundings per term)·U32·Σ_k |q·W|, and Σ_k |q·W| <= 448·K/sqrt(K)."""
    return (K - 1 + roundings_per_term) * U32 * FP8_MAX * math.sqrt(K)


def tol_quant_gemm(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    return {"C": (_gemm_atol(sizes["K"], 3), 0.0)}


def tol_quant_gemm_fp8(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    return {"C": (_gemm_atol(sizes["K"], 1), 0.0)}


_QUANT_SIZES = {"default": {"M": 8, "K": 40, "N": 12}}
_QUANT_SYMBOLIC = ("M", "N")
"""Rows and output columns are symbolic; K, the reduced dimension, stays a number: the tolerance and the
GPU GEMM's k tiles are built from it."""
_QUANT_GPU_NOTE = ("none: the GPU plan tiles the output over M and N (tiles shrunk where a dimension is short) and "
                   "the product over K")
_QUANT_PRESETS = {"default": {"M": 4096, "K": 4096, "N": 4096}}
_QUANT_MAGNITUDES = (1.0, 1e30, 1e-30)
_QUANT_OPERANDS = (Operand("A", axis=1, huge=2.0 ** 100, tiny=2.0 ** -100),)
_QUANT_NOTE = ("C = Σ_k q·W is a sum of K mixed-sign terms with |q| <= 448 and |W| <= 1/sqrt(K), so "
               "Σ_k |q·W| <= 448·sqrt(K) whatever A's magnitude; a sequential f32 sum adds (K - 1)·U32 of it. ")

register(Operator(
    name="quant_gemm",
    description="per-token scaled GEMM (RedFuser §3.4, real-valued): m = max_k |A|, C = Σ_k (448·A/m)·W",
    build=build_quant_gemm, make_inputs=make_quant_inputs, reference=ref_quant_gemm, tolerance=tol_quant_gemm,
    tolerance_note=_QUANT_NOTE + "Each term carries 3 roundings (448·A, /m, ·W): atol = (K + 2)·U32·448·"
                                 "sqrt(K), rtol = 0 (U32 = 2^-24)." + CONTRACTED,
    defaults=_QUANT_SIZES, presets=_QUANT_PRESETS, magnitudes=_QUANT_MAGNITUDES, operands=_QUANT_OPERANDS,
    symbolic=_QUANT_SYMBOLIC, gpu_symbolic_note=_QUANT_GPU_NOTE,
))

register(Operator(
    name="quant_gemm_fp8",
    description="per-token fp8 quantised GEMM: m = max_k |A|, C = Σ_k f32(fp8e4m3(448·A/m))·W",
    build=build_quant_gemm_fp8, make_inputs=make_quant_inputs, reference=ref_quant_gemm_fp8,
    tolerance=tol_quant_gemm_fp8,
    tolerance_note=_QUANT_NOTE + "The reference rounds the same f32 value 448·A/m to fp8 e4m3 (ml_dtypes), so "
                                 "the quantised operands agree exactly; each term then carries one rounding (·W): "
                                 "atol = K·U32·448·sqrt(K), rtol = 0 (U32 = 2^-24)." + CONTRACTED,
    defaults=_QUANT_SIZES, presets=_QUANT_PRESETS, magnitudes=_QUANT_MAGNITUDES, operands=_QUANT_OPERANDS,
    symbolic=_QUANT_SYMBOLIC, gpu_symbolic_note=_QUANT_GPU_NOTE,
))


# ------------------------------------------------------------------ performer

PROJ_SPREAD = math.sqrt(3.0)
"""Projection entries are U(-sqrt 3, sqrt 3)·``projection_scale``: unit variance (before the scale)
like FAVOR+'s Gaussian features, but bounded, so that the tolerance is a hard bound."""

PERFORMER_MAGNITUDES = (1.0, 120.0)
"""About the largest key feature logit δ·k·Pᵀ (the projection is scaled to it: ``projection_scale``).
At 120, exp without the max subtraction overflows f32 (beyond 88.7) while the denominators
q'·Σ_l k' stay normal f32 numbers.  A fixed projection scale lets the logits grow with D and with
the L·F values the key max runs over: at the bench size, scale 40 gave logits of ±320, and the
denominators underflowed to 0 in every f32 program, fused or not (NaN where float64 is finite)."""


def projection_scale(sizes: Sizes, magnitude: float) -> float:
    """Entries of P are U(-sqrt 3, sqrt 3)·scale.  With x ~ U(-1, 1) a feature logit δ·x·Pᵀ has standard
    deviation scale·D^(1/4)/sqrt(3), and the largest of the L·F key logits is about sqrt(2·ln(L·F)) of
    those: the scale makes that the magnitude."""
    spread = math.sqrt(2.0 * math.log(max(sizes["L"] * sizes["F"], 3)))
    return magnitude * PROJ_SPREAD / (sizes["D"] ** 0.25 * spread)


def performer_constants(sizes: Sizes) -> tuple[float, float, float]:
    """FAVOR+'s δ = D^-1/4 (data normaliser), ρ = F^-1/2 (ratio) and β = δ²/2 (diagonal factor)."""
    delta = sizes["D"] ** -0.25
    return delta, sizes["F"] ** -0.5, delta * delta / 2


def build_performer(mode: str, sizes: Sizes) -> Program:
    p = ProgramBuilder("performer")
    B, H, L, D, F = *extents(p, sizes, "B", "H", "L"), sizes["D"], sizes["F"]
    delta, rho, beta = performer_constants(sizes)
    q = p.input("q", (B, H, L, D), "f32", finite=True)  # finite: split tensor-core products (see moe_routing)
    k = p.input("k", (B, H, L, D), "f32", finite=True)
    v = p.input("v", (B, H, L, D), "f32", finite=True)
    proj = p.input("proj", (F, D), "f32", finite=True)
    qdash = p.temp("qdash", (B, H, L, F), "f32")
    qsq = p.temp("qsq", (B, H, L), "f32")
    qmax = p.temp("qmax", (B, H, L), "f32")
    qprime = p.temp("qprime", (B, H, L, F), "f32")
    kdash = p.temp("kdash", (B, H, L, F), "f32")
    ksq = p.temp("ksq", (B, H, L), "f32")
    kmax = p.temp("kmax", (B, H), "f32")
    kprime = p.temp("kprime", (B, H, L, F), "f32")
    ksum = p.temp("ksum", (B, H, F), "f32")
    context = p.temp("context", (B, H, F, D), "f32")
    denom = p.temp("denom", (B, H, L), "f32")
    numer = p.temp("numer", (B, H, L, D), "f32")
    out = p.output("out", (B, H, L, D), "f32")
    # Keys first (FAVOR+ summarises the keys, then queries read the summary).
    # k' = ρ·exp(δ·k·Pᵀ - β·|k|² - max over rows and features)
    with p.nest("s_kdash", b=B, h=H, i=L, f=F, d=reduce(D)) as (b, h, i, f, d):
        kdash[b, h, i, f] = kdash[b, h, i, f] + delta * k[b, h, i, d] * proj[f, d]
    with p.nest("s_ksq", b=B, h=H, i=L, d=reduce(D)) as (b, h, i, d):
        ksq[b, h, i] = ksq[b, h, i] + k[b, h, i, d] * k[b, h, i, d]
    with p.nest("s_kmax", b=B, h=H, i=reduce(L), f=reduce(F)) as (b, h, i, f):
        kmax[b, h] = maximum(kmax[b, h], kdash[b, h, i, f])
    with p.nest("s_kprime", b=B, h=H, i=L, f=F) as (b, h, i, f):
        kprime[b, h, i, f] = rho * exp(kdash[b, h, i, f] - beta * ksq[b, h, i] - kmax[b, h])
    # k'ᵀ·v and Σ_i k'
    with p.nest("s_ksum", b=B, h=H, f=F, i=reduce(L)) as (b, h, f, i):
        ksum[b, h, f] = ksum[b, h, f] + kprime[b, h, i, f]
    with p.nest("s_context", b=B, h=H, f=F, e=D, i=reduce(L)) as (b, h, f, e, i):
        context[b, h, f, e] = context[b, h, f, e] + kprime[b, h, i, f] * v[b, h, i, e]
    # q' = ρ·exp(δ·q·Pᵀ - β·|q|² - max over features)
    with p.nest("s_qdash", b=B, h=H, i=L, f=F, d=reduce(D)) as (b, h, i, f, d):
        qdash[b, h, i, f] = qdash[b, h, i, f] + delta * q[b, h, i, d] * proj[f, d]
    with p.nest("s_qsq", b=B, h=H, i=L, d=reduce(D)) as (b, h, i, d):
        qsq[b, h, i] = qsq[b, h, i] + q[b, h, i, d] * q[b, h, i, d]
    with p.nest("s_qmax", b=B, h=H, i=L, f=reduce(F)) as (b, h, i, f):
        qmax[b, h, i] = maximum(qmax[b, h, i], qdash[b, h, i, f])
    with p.nest("s_qprime", b=B, h=H, i=L, f=F) as (b, h, i, f):
        qprime[b, h, i, f] = rho * exp(qdash[b, h, i, f] - beta * qsq[b, h, i] - qmax[b, h, i])
    # out = q'·(k'ᵀ·v) / (q'·Σ_i k')
    with p.nest("s_denom", b=B, h=H, i=L, f=reduce(F)) as (b, h, i, f):
        denom[b, h, i] = denom[b, h, i] + qprime[b, h, i, f] * ksum[b, h, f]
    with p.nest("s_numer", b=B, h=H, i=L, e=D, f=reduce(F)) as (b, h, i, e, f):
        numer[b, h, i, e] = numer[b, h, i, e] + qprime[b, h, i, f] * context[b, h, f, e]
    with p.nest("s_out", b=B, h=H, i=L, e=D) as (b, h, i, e):
        out[b, h, i, e] = numer[b, h, i, e] / denom[b, h, i]
    return p.build()


def make_performer_inputs(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """q, k, v ~ U(-1, 1); the projection ~ U(-sqrt 3, sqrt 3)·``projection_scale``."""
    B, H, L, D, F = sizes["B"], sizes["H"], sizes["L"], sizes["D"], sizes["F"]
    qkv = {n: rng.uniform(-1.0, 1.0, (B, H, L, D)).astype(np.float32) for n in ("q", "k", "v")}
    proj = rng.uniform(-PROJ_SPREAD, PROJ_SPREAD, (F, D)) * projection_scale(sizes, magnitude)
    return qkv | {"proj": proj.astype(np.float32)}


@ieee_reference
def ref_performer(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    """performer-pytorch's softmax_kernel (eps = 0) and non-causal linear_attention, in float64."""
    q, k, v, proj = (inputs[n].astype(np.float64) for n in ("q", "k", "v", "proj"))
    delta, rho, beta = performer_constants(sizes)

    def features(x: np.ndarray, max_axes: tuple[int, ...]) -> np.ndarray:
        dash = np.einsum("bhld,fd->bhlf", delta * x, proj)
        diag = beta * np.sum(x * x, axis=-1, keepdims=True)
        return rho * np.exp(dash - diag - dash.max(axis=max_axes, keepdims=True))

    qp, kp = features(q, (-1,)), features(k, (-1, -2))
    context = np.einsum("bhlf,bhle->bhfe", kp, v)
    denom = np.einsum("bhlf,bhf->bhl", qp, kp.sum(axis=-2))
    return {"out": np.einsum("bhlf,bhfe->bhle", qp, context) / denom[..., None]}


def tol_performer(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    L, D, F = sizes["L"], sizes["D"], sizes["F"]
    delta, _, beta = performer_constants(sizes)
    dash = delta * D * PROJ_SPREAD * projection_scale(sizes, max(PERFORMER_MAGNITUDES))  # >= Σ_d |δ·x·P|
    exponent = (2 * D + 6) * U32 * dash + (D + 3) * U32 * beta * D  # abs error of the exp argument
    feature = exponent + FN32 + 2 * U32  # rel error of q' and k'
    return {"out": (4 * feature + 2 * (L + F + 1) * U32, 0.0)}


register(Operator(
    name="performer",
    description="FAVOR+ non-causal linear attention (performer-pytorch softmax_kernel, no eps): "
                "q' = ρ·exp(δ·q·Pᵀ - δ²|q|²/2 - max_f), k' likewise with max over (l, f), "
                "out = q'·(k'ᵀv) / (q'·Σ_l k')",
    build=build_performer, make_inputs=make_performer_inputs, reference=ref_performer, tolerance=tol_performer,
    tolerance_note="f32, U32 = 2^-24 per rounding, exp <= 8·U32. With |q|, |k| <= 1 and "
                   "|P| <= sqrt(3)·scale (projection_scale), Σ_d |δ·q·P| <= δ·D·sqrt(3)·scale =: S; a feature "
                   "logit is off by (D + 1)·U32·S, the exp "
                   "argument dash - β|q|² - max by e = (2D + 6)·U32·S + (D + 3)·U32·β·D, so q' and k' are off "
                   "by ε = e + 8·U32 + 2·U32 relatively. out is a convex combination of v rows (|v| <= 1) with "
                   "weights q'·k'/Σ: atol = 4ε + 2(L + F + 1)·U32 (numerator and denominator sums over L and F), "
                   "rtol = 0, at the largest projection magnitude (tolerance does not see the magnitude). Input "
                   "variants add no huge entries (only tiny ones), so the bounds on |q|, |k|, |v| and |P| hold."
                   + CONTRACTED,
    defaults={"default": {"B": 1, "H": 2, "L": 20, "D": 8, "F": 12}},
    presets={"default": {"B": 1, "H": 8, "L": 4096, "D": 64, "F": 256}},
    magnitudes=PERFORMER_MAGNITUDES, symbolic=("B", "H", "L"),
    gpu_symbolic_note="none: the key-side split rule divides the blocks it aims at by B·H (gpu_performer_tiling), "
                      "and L is split into steps and splits",
    operands=(*(Operand(n, axis=2, shared=(3,), tiny=2.0 ** -100) for n in ("q", "k", "v")),
              Operand("proj", axis=0, shared=(1,), tiny=2.0 ** -100)),
))
