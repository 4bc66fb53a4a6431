"""The softmax family (OPERATORS.md §A): Neptune's Figure 1a and two epilogues on it.

All three read the rows of ``inp[N, M]`` (f32) and share Figure 1a's nests, with its
block and tensor names: ``s_max`` (``xmax``), ``s_exp`` (``xexp``), ``s_sum`` (``xsum``).
Both sizes are symbolic in the host kernel (``Operator.symbolic``): one kernel serves every N and M.

Error model used by every tolerance in the catalog's f32 operators: one correctly
rounded operation has relative error at most ``U32 = 2^-24``; NumPy's f32 ``exp`` and
``log`` are within 4 ulp (``FN32 = 8·U32``, measured 2.4 ulp); a sequential sum of n
terms adds at most ``(n - 1)·U32·Σ|terms|``; ``max`` and ``abs`` are exact.

Contracted multiply-adds: a kernel built with ``fp_contract`` (the GPU checks and benchmarks
ask for it; :class:`polyfuse.runtime.compiler.CompileOptions`) may compute ``a·b + c`` as one
fused multiply-add, ``round(a·b + c)`` instead of ``round(round(a·b) + c)``.  In the model each
operation gives its exact result times ``(1 + δ)`` with ``|δ| <= U32``; the FMA is the same
expression with the multiplication's ``δ = 0``.  Every bound here holds for all ``|δ| <= U32``,
so for ``δ = 0`` as well: counting one rounding per operation already covers a contracted one
(and where a product is exact, e.g. on the input grids, its ``δ`` is 0 either way).
"""

from __future__ import annotations

import numpy as np

from polyfuse.ir import ProgramBuilder, exp, log, maximum, reduce
from polyfuse.ir.stmt import Program, Tensor
from polyfuse.ops import register
from polyfuse.ops.base import ROWS_ON_THE_GRID, Arrays, Extent, Operator, Sizes, extents, ieee_reference
from polyfuse.ops.variants import Operand

U32 = 2.0 ** -24
"""Unit roundoff of f32: the relative error of one correctly rounded operation."""
FN32 = 8 * U32
"""Relative error bound of NumPy's f32 exp / log (4 ulp)."""
TINY32 = float(np.finfo(np.float32).tiny)
"""Smallest normal f32: results below it are subnormal or zero, off by less than this."""

CONTRACTED = (" GPU kernels may contract a·b + c into one FMA (one rounding fewer): covered, since every bound "
              "here counts one rounding per operation and holds when one is exact (polyfuse.ops.softmax).")
"""The end of every operator's tolerance note (see the module docstring)."""

MAGNITUDES = (1.0, 1e4)
"""Logit scales: 1e4 makes ``Σ exp(x)`` overflow f32 without the max subtraction."""


def max_exp_sum(p: ProgramBuilder, x: Tensor, rows: Extent, cols: Extent, *,
                names: tuple[str, str, str] = ("xmax", "xexp", "xsum"),
                sum_is_output: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Figure 1a's three nests over the rows of ``x``: the row max (``s_max``), the
    shifted exponentials (``s_exp``) and their row sum (``s_sum``)."""
    max_name, exp_name, sum_name = names
    xmax = p.temp(max_name, (rows,), "f32")
    xexp = p.temp(exp_name, (rows, cols), "f32")
    xsum = (p.output if sum_is_output else p.temp)(sum_name, (rows,), "f32")
    with p.nest("s_max", i=rows, j=reduce(cols)) as (i, j):
        xmax[i] = maximum(xmax[i], x[i, j])
    with p.nest("s_exp", i=rows, j=cols) as (i, j):
        xexp[i, j] = exp(x[i, j] - xmax[i])
    with p.nest("s_sum", i=rows, j=reduce(cols)) as (i, j):
        xsum[i] = xsum[i] + xexp[i, j]
    return xmax, xexp, xsum


def sum_exp_rtol(n: int) -> float:
    """Relative error bound of ``Σ_j exp(x_j - max)`` over n terms in f32.

    A term ``exp(a)``, ``a <= 0``, is off by ``e^a·(|a|·U32 + FN32)`` (``a`` rounded once,
    then exp), at most ``FN32·e^a + U32/e``; the sum is at least 1, so the terms add
    ``FN32 + n·U32/e`` and the summation ``(n - 1)·U32`` relative to it.
    """
    return FN32 + (n / np.e + n - 1) * U32


# ------------------------------------------------------------------ programs

def _begin(name: str, sizes: Sizes) -> tuple[ProgramBuilder, Extent, Extent, Tensor]:
    p = ProgramBuilder(name)
    N, M = extents(p, sizes, "N", "M")
    return p, N, M, p.input("inp", (N, M), "f32")


def build_softmax_sum(mode: str, sizes: Sizes) -> Program:
    p, N, M, inp = _begin("softmax_sum", sizes)
    max_exp_sum(p, inp, N, M, sum_is_output=True)
    return p.build()


def build_softmax(mode: str, sizes: Sizes) -> Program:
    p, N, M, inp = _begin("softmax", sizes)
    xmax, _, xsum = max_exp_sum(p, inp, N, M)
    y = p.output("y", (N, M), "f32")
    with p.nest("s_norm", i=N, j=M) as (i, j):
        y[i, j] = exp(inp[i, j] - xmax[i]) / xsum[i]
    return p.build()


def build_logsumexp(mode: str, sizes: Sizes) -> Program:
    p, N, M, inp = _begin("logsumexp", sizes)
    xmax, _, xsum = max_exp_sum(p, inp, N, M)
    out = p.output("out", (N,), "f32")
    with p.nest("s_lse", i=N) as (i,):
        out[i] = xmax[i] + log(xsum[i])
    return p.build()


# ------------------------------------------------------------------ inputs and references

def make_logits(rng: np.random.Generator, mode: str, sizes: Sizes, magnitude: float) -> Arrays:
    """Standard normal logits times ``magnitude``."""
    x = rng.standard_normal((sizes["N"], sizes["M"])) * magnitude
    return {"inp": x.astype(np.float32)}


def _row_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row max, shifted exponentials and their row sum, in float64."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=1)
    e = np.exp(x - m[:, None])
    return m, e, e.sum(axis=1)


@ieee_reference
def ref_softmax_sum(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    return {"xsum": _row_stats(inputs["inp"])[2]}


@ieee_reference
def ref_softmax(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    _, e, s = _row_stats(inputs["inp"])
    return {"y": e / s[:, None]}


@ieee_reference
def ref_logsumexp(inputs: Arrays, mode: str, sizes: Sizes) -> Arrays:
    m, _, s = _row_stats(inputs["inp"])
    return {"out": m + np.log(s)}


# ------------------------------------------------------------------ tolerances

def tol_softmax_sum(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    return {"xsum": (TINY32, sum_exp_rtol(sizes["M"]))}


def tol_softmax(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    # exp(a) with a rounded: (|a| + 8)·U32, |a| <= 88 while the result is a normal f32
    # (smaller results are covered by atol); then the sum's error and the division (3 + 2^-23 on the GPU:
    # e·rcp_rz(s), counted as 4).
    return {"y": (TINY32, sum_exp_rtol(sizes["M"]) + 88 * U32 + FN32 + 4 * U32)}


def tol_logsumexp(mode: str, sizes: Sizes) -> dict[str, tuple[float, float]]:
    # log s is off by rel(s) + FN32·log(M) absolutely (1 <= s <= M); the final add by U32·|out|.
    return {"out": (sum_exp_rtol(sizes["M"]) + FN32 * np.log(sizes["M"]), U32)}


_SUM_NOTE = ("f32, U32 = 2^-24 per rounding, exp/log <= 4 ulp (8·U32). s = Σ_j exp(x - m) has n = M "
             "non-negative terms and s >= 1: each term is off by <= 8·U32·term + U32/e absolutely and "
             "the sequential sum by (M - 1)·U32·s, so rel(s) <= 8·U32 + (M/e + M - 1)·U32. ")

_LOGITS = (Operand("inp", axis=1, huge=2.0 ** 100, tiny=2.0 ** -100),)
"""Input variants rewrite the rows of ``inp``; a huge logit of 2^100 leaves every other term exp(x - m) = 0."""

_SIZES = {"default": {"N": 8, "M": 40}}
_PRESETS = {"default": {"N": 4096, "M": 4096}}
_SYMBOLIC = ("N", "M")
_GPU_SYMBOLIC = {"default": ("N",)}

register(Operator(
    name="softmax_sum",
    description="Neptune Fig. 1a: xmax = max_j inp, xsum = Σ_j exp(inp - xmax) over rows of inp[N, M]",
    build=build_softmax_sum, make_inputs=make_logits, reference=ref_softmax_sum, tolerance=tol_softmax_sum,
    tolerance_note=_SUM_NOTE + "atol = smallest normal f32." + CONTRACTED,
    defaults=_SIZES, presets=_PRESETS, magnitudes=MAGNITUDES, operands=_LOGITS, symbolic=_SYMBOLIC,
    gpu_symbolic=_GPU_SYMBOLIC, gpu_symbolic_note=ROWS_ON_THE_GRID,
))

register(Operator(
    name="softmax",
    description="row softmax of inp[N, M]: y = exp(inp - xmax) / xsum",
    build=build_softmax, make_inputs=make_logits, reference=ref_softmax, tolerance=tol_softmax,
    tolerance_note=_SUM_NOTE + "y = exp(x - m)/s adds (|x - m| + 8)·U32 for the rounded argument "
               "(|x - m| <= 88 while y is a normal f32; below that atol = smallest normal f32 covers it) "
               "and U32 for the division, or 3·U32 + 2^-47 on the GPU (e·rcp_rz(s), the reciprocal_rows code "
               "generation option), counted as 4·U32." + CONTRACTED,
    defaults=_SIZES, presets=_PRESETS, magnitudes=MAGNITUDES, operands=_LOGITS, symbolic=_SYMBOLIC,
    gpu_symbolic=_GPU_SYMBOLIC, gpu_symbolic_note=ROWS_ON_THE_GRID,
))

register(Operator(
    name="logsumexp",
    description="row log-sum-exp of inp[N, M]: out = xmax + log(xsum)",
    build=build_logsumexp, make_inputs=make_logits, reference=ref_logsumexp, tolerance=tol_logsumexp,
    tolerance_note=_SUM_NOTE + "log s is then off by rel(s) + 8·U32·log(M) absolutely (1 <= s <= M), "
               "which is atol; rtol = U32 for the final addition m + log s." + CONTRACTED,
    defaults=_SIZES, presets=_PRESETS, magnitudes=MAGNITUDES, operands=_LOGITS, symbolic=_SYMBOLIC,
    gpu_symbolic=_GPU_SYMBOLIC, gpu_symbolic_note=ROWS_ON_THE_GRID,
))
