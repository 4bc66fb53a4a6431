"""Attention operators of OPERATORS.md B as plain, unfused programs (Neptune Fig. 12).

One builder, :func:`build_attention`, writes every variant with the tensor-expression
layer; a :class:`Variant` says what differs (score mod, mask, kv-head mapping, the
latent kv cache of MLA).  Block names are also tensor names, and schedules use them::

    qk        [B, Hq, Sq, Skv]  f32   Σ_d q·k              (f16 loads cast to f32)
    score     [B, Hq, Sq, Skv]  f32   mod(qk·scale), -inf where masked
    row_max   [B, Hq, Sq]       f32   max_j score
    p_exp     [B, Hq, Sq, Skv]  f32   exp(score - row_max)
    row_sum   [B, Hq, Sq]       f32   Σ_j p_exp
    pv        [B, Hq, Sq, Dv]   f32   Σ_j p_exp·v          (v cast to f32)
    out       [B, Hq, Sq, Dv]   f16   pv / row_sum

``attn_norm_inside`` divides inside the last reduction instead (RedFuser App. A.2.1):
``p_norm = p_exp / row_sum``, ``pv = Σ_j p_norm·v``, ``out = f16(pv)``.

Everything between the f16 inputs and the f16 output is f32, as OPERATORS.md asks.  In
particular the weights are *not* rounded to f16 before the second product: a rounding of
a value that depends on ``row_max`` is not invertible, so a fusion that repairs
``row_max`` could not be exact.  Using f16 tensor-core operands for ``pv`` is a precision
choice of the code generator, made there and accounted for in its tolerance.

Queries are the last ``Sq`` of ``Skv`` positions: query row ``i`` sits at absolute
position ``i + (Skv - Sq)``, so one causal mask ``j > i + (Skv - Sq)`` serves prefill
(``Sq == Skv``) and decode (``Sq == 1``, where it never bites and is left out).

Sizes are Python ints when a program is built, so programs have no size parameters.
A preset key is a mode, optionally with a suffix (``decode_b32`` is a decode shape).

``make_inputs`` puts q, k, v on coarse grids so that the f32 ``qk`` is exact; with the
test sizes' D (16; MLA 64) 1/sqrt(D) is a power of two and the logits are exact too, so
the large magnitude (logits ~1e4) tests overflow, not the f32 rounding of huge logits.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from polyfuse.errors import PolyfuseError
from polyfuse.ir import te
from polyfuse.ir.dtypes import f16, f32
from polyfuse.ir.expr import INF, Expr, cast, exp, logical_or, tanh
from polyfuse.ir.stmt import Program
from polyfuse.ops import register
from polyfuse.ops.base import Arrays, Operator, Sizes, ieee_reference
from polyfuse.ops.softmax import CONTRACTED
from polyfuse.ops.variants import Operand

V_MAX = 1.0
"""``make_inputs`` draws v from U(-V_MAX, V_MAX); the output is a convex combination of v rows."""

QK_BOUND = math.sqrt(3.0)
"""q and k are drawn from U(-QK_BOUND, QK_BOUND)·sqrt(magnitude): unit variance at magnitude 1, so a
logit ``q·k/sqrt(D)`` has standard deviation ``magnitude`` and |logit| <= 3·sqrt(D)·magnitude."""

LARGE_MAGNITUDE = 1e4
"""Logits of about ±1e4: exp overflows f32 (and f64) unless the row max is subtracted.  q and k stay
below 3·sqrt(3)·100 < 65504 in f16 (MLA's latent q part below 3e4), and |q·k| below 2^24 in f32."""

GRID_BITS = 6
"""Inputs are rounded to GRID_BITS bits below their bound's leading bit (see :func:`draw`)."""
DRAW_CHUNK = 1 << 22
"""Values :func:`draw` draws at a time."""


@dataclass(frozen=True)
class Variant:
    """What distinguishes one attention operator from another."""

    causal: bool = False
    alibi: bool = False
    softcap: float | None = None
    window: bool = False
    normalise_inside: bool = False
    latent_kv: bool = False
    """MLA with absorbed projections: one cache ``kv[B, 1, Skv, Dv + Drope]``; k = kv, v = kv[..., :Dv]."""


@dataclass(frozen=True)
class Dims:
    """The sizes of one attention instance, whatever the variant's size names are."""

    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    D: int
    Dv: int
    W: int | None = None

    @property
    def offset(self) -> int:
        """Absolute position of query row 0."""
        return self.Skv - self.Sq

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.Hq // self.Hkv

    @property
    def scale(self) -> float:
        """The logit scale 1/sqrt(D), D the qk dimension."""
        return 1.0 / math.sqrt(self.D)


def dims_of(name: str, variant: Variant, mode: str, sizes: Sizes) -> Dims:
    """Check ``sizes`` for ``mode`` and normalise them (MLA: Hq = H, Hkv = 1, D = Dv + Drope)."""
    if variant.latent_kv:
        d = Dims(sizes["B"], sizes["H"], 1, 1, sizes["Skv"], sizes["Dv"] + sizes["Drope"], sizes["Dv"])
    else:
        d = Dims(sizes["B"], sizes["Hq"], sizes["Hkv"], sizes["Sq"], sizes["Skv"], sizes["D"], sizes["Dv"],
                 sizes.get("W"))
    if d.Hq % d.Hkv:
        raise PolyfuseError(f"operator {name!r}: Hq={d.Hq} is not a multiple of Hkv={d.Hkv}")
    if mode == "decode" and d.Sq != 1:
        raise PolyfuseError(f"operator {name!r}: decode has one query (Sq=1), got Sq={d.Sq}")
    if d.Sq > d.Skv:
        raise PolyfuseError(f"operator {name!r}: Sq={d.Sq} queries but only Skv={d.Skv} keys")
    if variant.window and d.W is None:
        raise PolyfuseError(f"operator {name!r}: a window variant needs the size W")
    return d


# ------------------------------------------------------------------ the program

def build_attention(name: str, variant: Variant, mode: str, sizes: Sizes) -> Program:
    """The plain attention program of ``variant`` (see the module docstring for its blocks)."""
    d = dims_of(name, variant, mode, sizes)
    # The data are declared finite (as attention's are): the GPU kernels multiply P·V with P split into
    # 16-bit parts (polyfuse.emit_cpp.mma), and skip the key tiles a mask hides (polyfuse.tiling.skip);
    # both equal the plain program's products only for finite values (0·inf, inf - inf).
    finite = True
    q = te.placeholder((d.B, d.Hq, d.Sq, d.D), f16, name="q", finite=finite)
    if variant.latent_kv:
        k = v = te.placeholder((d.B, 1, d.Skv, d.D), f16, name="kv", finite=finite)
        inputs = [q, k]
    else:
        k = te.placeholder((d.B, d.Hkv, d.Skv, d.D), f16, name="k", finite=finite)
        v = te.placeholder((d.B, d.Hkv, d.Skv, d.Dv), f16, name="v", finite=finite)
        inputs = [q, k, v]

    def kv_head(h: Expr) -> Expr | int:
        if d.Hkv == 1:
            return 0
        return h if d.group == 1 else h // d.group

    rows, full = (d.B, d.Hq, d.Sq), (d.B, d.Hq, d.Sq, d.Skv)
    d_axis = te.reduce_axis(d.D, name="d")
    j_axis = te.reduce_axis(d.Skv, name="j")
    qk = te.compute(full, lambda b, h, i, j: te.sum(
        cast(f32, q(b, h, i, d_axis)) * cast(f32, k(b, kv_head(h), j, d_axis)), axis=d_axis), name="qk")
    score = te.compute(full, lambda b, h, i, j: _score(variant, d, qk(b, h, i, j), h, i, j), name="score")
    row_max = te.compute(rows, lambda b, h, i: te.max(score(b, h, i, j_axis), axis=j_axis), name="row_max")
    p_exp = te.compute(full, lambda b, h, i, j: exp(score(b, h, i, j) - row_max(b, h, i)), name="p_exp")
    row_sum = te.compute(rows, lambda b, h, i: te.sum(p_exp(b, h, i, j_axis), axis=j_axis), name="row_sum")
    if variant.normalise_inside:
        weights = te.compute(full, lambda b, h, i, j: p_exp(b, h, i, j) / row_sum(b, h, i), name="p_norm")
    else:
        weights = p_exp
    pv = te.compute((*rows, d.Dv), lambda b, h, i, dv: te.sum(
        weights(b, h, i, j_axis) * cast(f32, v(b, kv_head(h), j_axis, dv)), axis=j_axis), name="pv")
    if variant.normalise_inside:
        out = te.compute(pv.shape, lambda b, h, i, dv: cast(f16, pv(b, h, i, dv)), name="out")
    else:
        out = te.compute(pv.shape, lambda b, h, i, dv: cast(f16, pv(b, h, i, dv) / row_sum(b, h, i)), name="out")
    return te.create_program([out], name=name, inputs=inputs)


def _score(variant: Variant, d: Dims, qk: Expr, h: Expr, i: Expr, j: Expr) -> Expr:
    """``qk·scale`` with the variant's score mod, and -inf where its mask hides key ``j``."""
    p = qk * d.scale
    if variant.softcap is not None:
        p = variant.softcap * tanh(p / variant.softcap)
    pos = i + d.offset if d.offset else i
    if variant.alibi:
        slope = 2.0 ** (cast(f32, h + 1) * (-8.0 / d.Hq))
        p = p + slope * cast(f32, j - pos)
    hidden = []
    if variant.causal and d.Sq > 1:
        hidden.append(j > pos)
    if variant.window:
        hidden.append(pos - j >= d.W)
    if not hidden:
        return p
    return te.if_then_else(functools.reduce(logical_or, hidden), -INF, p)


# ------------------------------------------------------------------ NumPy side

@ieee_reference
def reference(name: str, variant: Variant, inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    """Masked, max-subtracted softmax attention in float64, straight from the math: one batch at a time, so that
    the float64 copies are of one batch's cache (decode at B=32, 64 heads, 4096 keys of 128: 8.6 GB for all of
    k)."""
    d = dims_of(name, variant, mode, sizes)
    one = dataclasses.replace(d, B=1)
    return {"out": np.concatenate([_reference_batch(variant, one, {n: a[b:b + 1] for n, a in inputs.items()})
                                   for b in range(d.B)], axis=0)}


def _reference_batch(variant: Variant, d: Dims, inputs: Arrays) -> np.ndarray:
    """:func:`reference`'s output of one batch (``d.B`` is 1)."""
    q = inputs["q"].astype(np.float64)
    if variant.latent_kv:
        k = inputs["kv"].astype(np.float64)
        v = k[..., :d.Dv]
    else:
        k, v = inputs["k"].astype(np.float64), inputs["v"].astype(np.float64)
    # Query head h reads kv head h // group: the heads of a kv head as one more axis (g), so that no copy of the
    # keys per query head is made (MLA's 128 heads of one 32768 x 576 cache would be 19 GB of float64).
    qg = q.reshape(d.B, d.Hkv, d.group, d.Sq, d.D)
    p = np.einsum("bkgid,bkjd->bkgij", qg, k).reshape(d.B, d.Hq, d.Sq, d.Skv) / math.sqrt(d.D)
    if variant.softcap is not None:
        p = variant.softcap * np.tanh(p / variant.softcap)
    pos = (np.arange(d.Sq) + d.offset)[:, None]
    key = np.arange(d.Skv)[None, :]
    if variant.alibi:
        slope = 2.0 ** (-8.0 * (np.arange(d.Hq) + 1) / d.Hq)
        p = p + slope[:, None, None] * (key - pos)
    hidden = np.zeros((d.Sq, d.Skv), dtype=bool)
    if variant.causal:
        hidden |= key > pos
    if variant.window:
        hidden |= pos - key >= d.W
    p = np.where(hidden, -np.inf, p)
    e = np.exp(p - p.max(axis=-1, keepdims=True))
    # A weight below f32's range is 0 in the program (its weights are f32): an infinite value at such a
    # key then gives 0·inf = NaN there, and must here too.
    e = np.where(e.astype(np.float32) == 0, 0.0, e)
    eg = e.reshape(d.B, d.Hkv, d.group, d.Sq, d.Skv)
    out = np.einsum("bkgij,bkjd->bkgid", eg, v).reshape(d.B, d.Hq, d.Sq, -1)
    return out / e.sum(axis=-1)[..., None]


def draw(rng: np.random.Generator, shape: tuple[int, ...], bound: float) -> np.ndarray:
    """f16 values from U(-bound, bound), truncated to the grid ``2^floor(log2 bound) / 2^GRID_BITS``.

    With both factors on such grids every product q_d·k_d is exact in f32 and so is every partial
    sum (at most D·2^(2·GRID_BITS + 2) grid units, below 2^24 for D < 1024): the f32 ``qk`` is exact
    at any magnitude.  When 1/sqrt(D) is a power of two (D = 16, 64, …) the logits are exact too.
    """
    if not bound < np.finfo(np.float16).max:
        raise PolyfuseError(f"attention inputs of bound {bound:g} do not fit f16; use a smaller magnitude")
    step = 2.0 ** (math.floor(math.log2(bound)) - GRID_BITS)
    # In pieces (the generator's stream is the same drawn at once or in pieces): the float64 draws of a whole
    # decode cache at B=32 would take 8.6 GB.
    out = np.empty(shape, dtype=np.float16)
    flat = out.reshape(-1)
    for start in range(0, flat.size, DRAW_CHUNK):
        n = min(DRAW_CHUNK, flat.size - start)
        flat[start:start + n] = np.trunc(rng.uniform(-bound, bound, size=n) / step) * step
    return out


def make_inputs(name: str, variant: Variant, rng: np.random.Generator, mode: str, sizes: Sizes,
                magnitude: float) -> Arrays:
    """f16 q, k (U(±sqrt 3)·sqrt(magnitude): logits of std ``magnitude``) and v (U(±V_MAX)), on grids."""
    d = dims_of(name, variant, mode, sizes)
    spread = QK_BOUND * math.sqrt(magnitude)
    if variant.latent_kv:
        # The latent part of kv doubles as v, so it is drawn at v's scale and q's latent part makes up
        # for it: every product q_d·kv_d has variance magnitude² and |q_d·kv_d| <= 3·magnitude.
        latent_q = 3.0 * magnitude / V_MAX
        rope = d.D - d.Dv
        q = np.concatenate([draw(rng, (d.B, d.Hq, 1, d.Dv), latent_q), draw(rng, (d.B, d.Hq, 1, rope), spread)],
                           axis=-1)
        kv = np.concatenate([draw(rng, (d.B, 1, d.Skv, d.Dv), V_MAX), draw(rng, (d.B, 1, d.Skv, rope), spread)],
                            axis=-1)
        return {"q": q, "kv": kv}
    return {"q": draw(rng, (d.B, d.Hq, d.Sq, d.D), spread),
            "k": draw(rng, (d.B, d.Hkv, d.Skv, d.D), spread),
            "v": draw(rng, (d.B, d.Hkv, d.Skv, d.Dv), V_MAX)}


def tolerance(name: str, variant: Variant, mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    """The error the program's dtypes allow on inputs from ``make_inputs``; see ``TOLERANCE_NOTE``."""
    d = dims_of(name, variant, mode, sizes)
    u16, u32 = 2.0 ** -11, 2.0 ** -24
    max_logit = QK_BOUND ** 2 * math.sqrt(d.D) + (d.Skv * 2.0 ** (-8 / d.Hq) if variant.alibi else 0.0)
    f32_sums = 3 * d.Skv * u32
    f32_logits = 2 * (d.D + 8) * u32 * max_logit
    gpu_exp = 2 * d.Skv * u32
    p_rounded = u16 + d.Skv * 2.0 ** -25
    # the divide-inside form's P = exp(s - m)·(1/ℓ) on the GPU (emit_cpp/reciprocal.py): relative 2^-23 + 2^-48
    reciprocal = (2.0 ** -23 + 2.0 ** -48) * (1 + u16) if variant.normalise_inside else 0.0
    # soft-capping c·tanh(s/c): tanhf's 2 ulp of a value <= 1 (c·2·2^-24 on the logit) and the GPU's s·fl(1/c)
    # for s/c (relative 2^-23 + 2^-48 on tanh's argument, <= that times max_logit on the logit: tanh' <= 1)
    capped = (2 * (2 * u32 * variant.softcap + (2.0 ** -23 + 2.0 ** -48) * max_logit)
              if variant.softcap is not None else 0.0)
    # the GPU's last quotient out = acc·rcp_rz(ℓ), rcp_rz(ℓ) once per row (emit_cpp/reciprocal.py): 2^-23 + 2^-24
    quotient = (2.0 ** -23 + 2.0 ** -24) * (1 + u16)
    return {"out": (V_MAX * (f32_sums + f32_logits + gpu_exp + p_rounded + reciprocal + capped + quotient), u16)}


TOLERANCE_NOTE = (
    "out is f16 (rtol 2^-11); atol, in units of max|v| = V_MAX (out is a convex combination of v rows), is "
    "3·Skv·2^-24 for the f32 sums row_sum and pv and f16-subnormal weights "
    "+ 2·(D+8)·2^-24·max|P| for f32 logits (∂out/∂P_j = p_j·(v_j - out); max|P| = 3·sqrt(D) at magnitude 1, "
    "plus the ALiBi bias) "
    "+ 2·Skv·2^-24 for the GPU's exp, ex2.approx.ftz(x·log2 e) as __expf computes it (the fast_exp code generation "
    "option), off by at most 2 + 1.173·|x| ulp "
    "(CUDA Math API): the 2 ulp as for any f32 exp, and the growing part moves a weight e^x (x <= 0) by at most "
    "1.173·|x|·e^x·2^-23 <= 0.44·2^-23, for a key's rolling rescales too, whose arguments add up to its own "
    "x = s_j - max; with ∂out/∂p_j <= 2·max|v| / Σp and Σp >= 1 that is <= 0.87·Skv·2^-23; "
    "weights under 2^-126 flush to 0, which is far below; "
    "+ (2^-11 + Skv·2^-25) for the GPU's P·V with P rounded once to f16 (the round_operands code generation "
    "option, as FlashAttention, cuDNN and FlexAttention do): each weight p_j <= 1 moves by at most 2^-11·p_j, or "
    "2^-25 where it is an f16 subnormal, the row sum stays the unrounded f32 one (>= 1), so out moves by at most "
    "(2^-11 + N_sub·2^-25)·max|v| with N_sub <= Skv the subnormal weights (the same for the divide-inside form, "
    "whose weights sum to 1); "
    "+ (2^-23 + 2^-48)·(1 + 2^-11) for the divide-inside form only, where the GPU's rounded-once P is "
    "exp(s_j - m)·r with r = fl(1/ℓ) computed once per row (the reciprocal_operands code generation option, taken "
    "only where ℓ is proven in [1, Skv], so r is normal): r = (1/ℓ)(1+δ1), fl(p_j·r) = (p_j/ℓ)(1+δ1)(1+δ2), "
    "|δ| <= 2^-24, a relative 2^-23 + 2^-48 before the f16 rounding, which then scales it by at most 1 + 2^-11; "
    "the weights p_j/ℓ sum to at most 1, so out moves by at most that times max|v| (the default GPU schedules "
    "hoist the division out of the sum, hoist_divisors: out = fl(Σ p_j·v_j)/ℓ as attn_global's, covered by the terms "
    "above and the next); "
    "+ (2^-23 + 2^-24)·(1 + 2^-11) for the GPU's last quotient out = acc/ℓ of a loop in warp fragments, computed as "
    "acc·r with r = rcp_rz(ℓ), 1/ℓ rounded toward zero once per row (the reciprocal_rows code generation option, "
    "taken only where ℓ's finite non-zero values are proven in [1, Skv]; ℓ = 0, inf or NaN give what the division "
    "gives): r = (1/ℓ)(1+δ1) with |δ1| < 2^-23, fl(acc·r) = (acc/ℓ)(1+δ1)(1+δ2), |δ2| <= 2^-24, before the f16 "
    "rounding, which then scales it by at most 1 + 2^-11; |acc/ℓ| <= max|v|; "
    "+ 2·(2·2^-24·c + (2^-23 + 2^-48)·max|s|) for soft-capping c·tanh(s/c) only: tanhf is off by at most 2 ulp "
    "of a value <= 1 (CUDA Math API), c·2·2^-24 on the logit, and the GPU computes s/c as s·fl(1/c) (the "
    "reciprocal_constants code generation option, c = 50 neither a power of two nor <= 1), a relative "
    "2^-23 + 2^-48 on tanh's argument, at most that times max|s| on the logit (tanh' <= 1); a logit moved by δ "
    "moves out by at most 2·δ·max|v| (as for the f32 logits); "
    "at magnitude 1e4 the logits are exact in f32 only "
    "because inputs lie on a grid and the test D makes 1/sqrt(D) a power of two: otherwise f32 rounding of "
    "logits near 1e4 (~1e-3) moves rows whose two largest logits nearly tie by up to ~2e-3·max|v|. "
    "Input variants keep these bounds: v gets no huge entries (|v| <= V_MAX), and the special variant's huge "
    "entries (2^8: one q component, or a whole k vector) keep q·k exact on the grid (at most 21 significant "
    "bits), so its logits near ±100 add no rounding."
) + CONTRACTED


HUGE_QK = 2.0 ** 8
"""The ``special`` variant's huge q entries and k vectors: logits near ±100 (beyond exp's f32 range without
the max subtraction) that stay exact in f32 on the input grid, as the tolerance note asks."""
TINY16 = 2.0 ** -20
"""The ``special`` variant's tiny entries: an f16 subnormal."""


def operands(variant: Variant) -> tuple[Operand, ...]:
    """What input variants rewrite: the components of each query (rows along d), and whole key and value
    vectors along the keys (a zero key is a zero vector).  v gets no huge entries: out's tolerance is in
    units of V_MAX; nor does MLA's kv, whose latent part is v."""
    q = Operand("q", axis=3, huge=HUGE_QK, tiny=TINY16)
    if variant.latent_kv:
        return q, Operand("kv", axis=2, shared=(3,), tiny=TINY16)
    return (q, Operand("k", axis=2, shared=(3,), huge=HUGE_QK, tiny=TINY16),
            Operand("v", axis=2, shared=(3,), tiny=TINY16))


# ------------------------------------------------------------------ the catalog

_MHA = ("B", "Hq", "Hkv", "Sq", "Skv", "D", "Dv")


def _mha(B: int, Hq: int, Hkv: int, Sq: int, Skv: int, D: int, **extra: int) -> Sizes:
    return dict(zip(_MHA, (B, Hq, Hkv, Sq, Skv, D, D), strict=True)) | extra


def _shapes(Hq: int, Hkv: int, D: int, **extra: int) -> dict[str, Sizes]:
    """Benchmark presets of an MHA/GQA model shape: prefill S=4096, decode Skv=32768 (batch 1)."""
    return {"prefill": _mha(1, Hq, Hkv, 4096, 4096, D, **extra), "decode": _mha(1, Hq, Hkv, 1, 32768, D, **extra)}


def _tests(Hq: int = 2, Hkv: int = 2, **extra: int) -> dict[str, Sizes]:
    """Small test sizes: prefill S=40 (batch 1), decode Skv=40 (batch 2), D=16.

    Small, because the interpreter runs each reduction step as one NumPy pass (~0.4 ms); S is not a
    multiple of 32, and D is a power of 4 so that 1/sqrt(D) is a power of two and logits of grid
    inputs are exact (see ``draw``).
    """
    return {"prefill": _mha(1, Hq, Hkv, 40, 40, 16, **extra), "decode": _mha(2, Hq, Hkv, 1, 40, 16, **extra)}


GPU_SYMBOLIC_NOTE = (
    "prefill: B, the batch, only multiplies the grid (one thread block per batch entry, head and query tile); the "
    "heads stay numbers (Hq/Hkv picks a query head's kv head, and ALiBi's slopes divide by Hq), and so do the "
    "sequence lengths (tiled, and the causal mask's offset) and the head dims (the tensor-core products); decode: "
    "none, the split rule (gpu_decode_tiling) divides the blocks it aims at by the batch and the heads")
"""Why attention's GPU kernels take the batch as a size parameter in prefill and no size in decode."""

_LLAMA65B_DECODE_B32 = {"decode_b32": _mha(32, 64, 64, 1, 4096, 128)}
"""RedFuser's batched decode shape (Table 2a, H9): batch 32 × 64 heads × d 128, Skv 4096."""


def _attention(name: str, description: str, variant: Variant, defaults: dict[str, Sizes],
               presets: dict[str, Sizes], modes: tuple[str, ...] = ("prefill", "decode")) -> Operator:
    return register(Operator(
        name=name,
        description=description,
        build=functools.partial(build_attention, name, variant),
        make_inputs=functools.partial(make_inputs, name, variant),
        reference=functools.partial(reference, name, variant),
        tolerance=functools.partial(tolerance, name, variant),
        tolerance_note=TOLERANCE_NOTE,
        defaults=defaults,
        presets=presets,
        modes=modes,
        magnitudes=(1.0, LARGE_MAGNITUDE),
        operands=operands(variant),
        gpu_symbolic={"prefill": ("B",)} if "prefill" in modes else {},
        gpu_symbolic_note=GPU_SYMBOLIC_NOTE,
    ))


attn_global = _attention(
    "attn_global", "softmax(q·kᵀ/sqrt(d))·v, no mask (ViT-L/16)",
    Variant(), _tests(), _shapes(16, 16, 64) | _LLAMA65B_DECODE_B32)
attn_causal = _attention(
    "attn_causal", "attention with the causal mask j > i (GPT3-6.7B)",
    Variant(causal=True), _tests(), _shapes(32, 32, 128))
attn_alibi = _attention(
    "attn_alibi", "causal attention with ALiBi bias slope_h·(j - i), slope_h = 2^(-8(h+1)/H) (MPT-7B)",
    Variant(causal=True, alibi=True), _tests(), _shapes(32, 32, 128))
attn_gqa = _attention(
    "attn_gqa", "causal grouped-query attention, kv head h // (Hq/Hkv) (Llama3-70B)",
    Variant(causal=True), _tests(Hq=4, Hkv=2), _shapes(64, 8, 128))
attn_softcap = _attention(
    "attn_softcap", "causal GQA with logit soft-capping 50·tanh(P/50) (Gemma2-27B)",
    Variant(causal=True, softcap=50.0), _tests(Hq=4, Hkv=2), _shapes(32, 16, 128))
attn_window = _attention(
    "attn_window", "causal sliding-window attention, i - j < W (Gemma2-27B, W=4096)",
    Variant(causal=True, window=True), _tests(W=24), _shapes(32, 32, 128, W=4096))
attn_mla_decode = _attention(
    "attn_mla_decode", "absorbed multi-latent attention decode: one kv cache, qk dim Dv+Drope, v = kv[..., :Dv] "
    "(DeepSeek-R1)",
    Variant(latent_kv=True),
    {"decode": {"B": 2, "H": 4, "Skv": 40, "Dv": 56, "Drope": 8}},
    {"decode": {"B": 1, "H": 128, "Skv": 32768, "Dv": 512, "Drope": 64},
     "decode_b32": {"B": 32, "H": 128, "Skv": 4096, "Dv": 512, "Drope": 64}},
    modes=("decode",))
attn_norm_inside = _attention(
    "attn_norm_inside", "attn_global dividing inside the last reduction: Σ_j (exp(P - m)/s)·v",
    Variant(normalise_inside=True), _tests(), _shapes(16, 16, 64) | _LLAMA65B_DECODE_B32)
