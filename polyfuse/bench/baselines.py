"""PyTorch baselines of the operator catalog (OPERATORS.md): what a user would run instead of polyfuse.

For every catalog operator, :func:`eager` is plain PyTorch eager code, written the way a user
writes it, computing the same math as the operator's NumPy reference (``ref_*`` and
``attention.reference`` in ``polyfuse/ops``) and returning ``{output name: tensor}`` with the
polyfuse program's output names, shapes and dtypes.  For attention, :func:`alternatives` adds
``scaled_dot_product_attention`` under each SDPA backend and FlexAttention; for a few other
operators it adds the PyTorch built-in a user would reach for (``torch.var``, ``F.rms_norm`` …).

Precision is the user's, in the inputs' dtypes:

- attention (f16 in, f16 out): f16 tensor-core matmuls for q·kᵀ and p·v, the scores cast to f32
  for the mask, score mod and softmax (as Hugging Face's eager attention does), GQA by repeating
  the kv heads (``repeat_kv``); the operators that divide outside the last reduction do so here
  too (``exp(P - m)·v / Σ exp(P - m)``), ``attn_norm_inside`` uses ``torch.softmax`` and then
  ``p·v``.  The catalog's program keeps q·kᵀ and p·v in f32, so eager results differ from it by
  f16 roundings of the scores and weights;
- everything else is f32 as in the programs; f32 matmuls are true f32 when the caller leaves
  TF32 off (:mod:`polyfuse.bench` does).

Mask and ALiBi tensors are built inside the eager function (as user code does on every call);
SDPA masks and FlexAttention block masks are built once, outside the returned callables.

``torch`` is imported where it is used, so this module imports without PyTorch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from polyfuse import ops
from polyfuse.ops.attention import Dims, Variant, dims_of
from polyfuse.ops.cascades import FP8_MAX, performer_constants
from polyfuse.ops.norms import LAYERNORM_EPS, RMS_EPS, SUM_SUM_THRESHOLD

Tensors = dict[str, Any]
"""{name: torch.Tensor}."""
Sizes = Mapping[str, int]
Prepared = Callable[[Tensors], Tensors]
"""An operator at fixed mode and sizes: inputs by name to outputs by name, nothing but torch inside
(so that ``torch.compile`` traces it without graph breaks)."""

SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
FLEX_LARGE_HEAD_OPTIONS = {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1}
"""FlexAttention tiles for head dims above 256 (with its defaults MLA's 576 is out of shared memory)."""


# ------------------------------------------------------------------ entry points

def eager(name: str, inputs: Tensors, mode: str, sizes: Sizes) -> Tensors:
    """The eager PyTorch result of operator ``name`` on ``inputs`` (CUDA tensors by input name)."""
    return prepare(name, mode, sizes)(inputs)


def prepare(name: str, mode: str, sizes: Sizes) -> Prepared:
    """The eager function of ``name`` with the Python-level setup (sizes, constants) done."""
    if is_attention(name):
        return _prepare_attention(name, mode, sizes)
    try:
        make = _PREPARE[name]
    except KeyError:
        raise KeyError(f"no PyTorch version of operator {name!r}; known: {', '.join(sorted(_PREPARE))}") from None
    return make(sizes)


def alternatives(name: str, inputs: Tensors, mode: str, sizes: Sizes) -> dict[str, Callable[[], Tensors] | str]:
    """Other PyTorch ways to compute ``name``: label -> a no-argument callable returning the
    outputs by name, or a string saying why that way does not apply to this operator."""
    if is_attention(name):
        return {**sdpa_variants(name, inputs, mode, sizes), "flex": flex_variant(name, inputs, mode, sizes)}
    builtin = _BUILTINS.get(name)
    if builtin is None:
        return {}
    label, make = builtin
    fn = make(sizes)
    return {label: lambda: fn(inputs)}


def names() -> list[str]:
    """The operators this module covers (it should be the whole catalog)."""
    return [n for n in ops.names() if is_attention(n) or n in _PREPARE]


# ------------------------------------------------------------------ attention

def is_attention(name: str) -> bool:
    return name.startswith("attn_")


def attention_variant(name: str) -> Variant:
    """The :class:`Variant` the catalog registered ``name`` with (its reference is a partial on it)."""
    reference = ops.get(name).reference
    if isinstance(reference, functools.partial) and len(reference.args) >= 2 and isinstance(reference.args[1], Variant):
        return reference.args[1]
    raise TypeError(f"operator {name!r} is not a catalog attention operator (no Variant on its reference)")


def attention_dims(name: str, mode: str, sizes: Sizes) -> tuple[Variant, Dims]:
    variant = attention_variant(name)
    return variant, dims_of(name, variant, mode, dict(sizes))


def visible_keys(variant: Variant, d: Dims) -> list[tuple[int, int]]:
    """Per query row, the range [lo, hi] of keys it sees (the mask's complement); causal applies
    only with more than one query, as in the program."""
    rows = []
    for i in range(d.Sq):
        pos = i + d.offset
        lo, hi = 0, d.Skv - 1
        if variant.causal and d.Sq > 1:
            hi = min(hi, pos)
        if variant.window:
            lo = max(lo, pos - d.W + 1)
        rows.append((lo, hi))
    return rows


def _alibi_slopes(d: Dims, device: Any) -> Any:
    import torch

    return torch.exp2(torch.arange(1, d.Hq + 1, device=device, dtype=torch.float32) * (-8.0 / d.Hq))


def _hidden(variant: Variant, d: Dims, pos: Any, key: Any) -> Any:
    """Boolean [Sq, Skv] tensor, True where the mask hides key j from query row i (None: no mask)."""
    hidden = None
    if variant.causal and d.Sq > 1:
        hidden = key > pos
    if variant.window:
        outside = (pos - key) >= d.W
        hidden = outside if hidden is None else hidden | outside
    return hidden


def _modify_scores(variant: Variant, d: Dims, scores: Any) -> Any:
    """f32 scores [B, Hq, Sq, Skv] (already scaled) with the score mod and the mask applied."""
    import torch

    if variant.softcap is not None:
        scores = variant.softcap * torch.tanh(scores / variant.softcap)
    pos = torch.arange(d.Sq, device=scores.device)[:, None] + d.offset
    key = torch.arange(d.Skv, device=scores.device)[None, :]
    if variant.alibi:
        slopes = _alibi_slopes(d, scores.device)
        scores = scores + slopes[:, None, None] * (key - pos).to(torch.float32)
    hidden = _hidden(variant, d, pos, key)
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores


def _prepare_attention(name: str, mode: str, sizes: Sizes) -> Prepared:
    variant, d = attention_dims(name, mode, sizes)
    if variant.latent_kv:
        return _prepare_mla(d)

    def attention(inputs: Tensors) -> Tensors:
        import torch

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if d.group > 1:  # GQA: repeat each kv head for its query heads (HF repeat_kv)
            k = k.repeat_interleave(d.group, dim=1)
            v = v.repeat_interleave(d.group, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)).float() * d.scale
        scores = _modify_scores(variant, d, scores)
        if variant.normalise_inside:
            p = torch.softmax(scores, dim=-1)
            return {"out": torch.matmul(p.to(v.dtype), v)}
        m = scores.amax(dim=-1, keepdim=True)
        e = torch.exp(scores - m)
        o = torch.matmul(e.to(v.dtype), v)
        return {"out": (o.float() / e.sum(dim=-1, keepdim=True)).to(q.dtype)}

    return attention


def _prepare_mla(d: Dims) -> Prepared:
    """Absorbed MLA decode: one latent kv cache, heads as the rows of one product (MQA)."""

    def mla(inputs: Tensors) -> Tensors:
        import torch

        q, kv = inputs["q"], inputs["kv"]          # [B, H, 1, D], [B, 1, Skv, D]
        rows = q.transpose(1, 2)                   # [B, 1, H, D]
        scores = torch.matmul(rows, kv.transpose(-2, -1)).float() * d.scale  # [B, 1, H, Skv]
        m = scores.amax(dim=-1, keepdim=True)
        e = torch.exp(scores - m)
        o = torch.matmul(e.to(kv.dtype), kv[..., :d.Dv])                        # [B, 1, H, Dv]
        out = (o.float() / e.sum(dim=-1, keepdim=True)).to(q.dtype)
        return {"out": out.transpose(1, 2).contiguous()}                       # [B, H, 1, Dv]

    return mla


def sdpa_variants(name: str, inputs: Tensors, mode: str, sizes: Sizes) -> dict[str, Callable[[], Tensors] | str]:
    """``F.scaled_dot_product_attention`` under each backend of :data:`SDPA_BACKENDS`, one label
    ``sdpa:BACKEND`` each; a backend that cannot run the case raises when called (the caller
    reports why).  Causal prefill uses ``is_causal``; windows an explicit boolean mask; ALiBi an
    additive f16 mask (the bias rounded to f16, as SDPA wants the query's dtype); GQA
    ``enable_gqa``; MLA puts the heads in the query rows of one kv head."""
    labels = [f"sdpa:{b}" for b in SDPA_BACKENDS]
    variant, d = attention_dims(name, mode, sizes)
    if variant.softcap is not None:
        return dict.fromkeys(labels, "SDPA has no score modification: tanh soft-capping cannot be expressed")
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = inputs["q"]
    device = q.device
    kwargs: dict[str, Any] = {"scale": d.scale}
    if variant.latent_kv:
        q = q.transpose(1, 2)                      # [B, 1, H, D]: heads as query rows
        k = inputs["kv"]
        v = inputs["kv"][..., :d.Dv]
    else:
        k, v = inputs["k"], inputs["v"]
        if d.group > 1:
            kwargs["enable_gqa"] = True
    pos = torch.arange(d.Sq, device=device)[:, None] + d.offset
    key = torch.arange(d.Skv, device=device)[None, :]
    hidden = _hidden(variant, d, pos, key)
    if variant.alibi:
        bias = _alibi_slopes(d, device)[:, None, None] * (key - pos).to(torch.float32)
        if hidden is not None:
            bias = bias.masked_fill(hidden, float("-inf"))
        kwargs["attn_mask"] = bias[None].to(q.dtype)
    elif hidden is not None:
        if variant.causal and not variant.window and d.Sq == d.Skv:
            kwargs["is_causal"] = True
        else:
            kwargs["attn_mask"] = ~hidden

    def make(backend: Any) -> Callable[[], Tensors]:
        def run() -> Tensors:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            if variant.latent_kv:
                out = out.transpose(1, 2)
            return {"out": out}
        return run

    return {label: make(getattr(SDPBackend, b)) for label, b in zip(labels, SDPA_BACKENDS, strict=True)}


@functools.cache
def _compiled_flex() -> Callable[..., Any]:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_variant(name: str, inputs: Tensors, mode: str, sizes: Sizes) -> Callable[[], Tensors] | str:
    """FlexAttention (compiled) with a score_mod for ALiBi / soft-capping and a block mask for the
    causal and window masks (built here, once); GQA with ``enable_gqa``; MLA with the heads as
    query rows of one kv head.  The first call compiles."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    variant, d = attention_dims(name, mode, sizes)
    q = inputs["q"]
    device = q.device
    slopes = _alibi_slopes(d, device) if variant.alibi else None
    cap, offset, window = variant.softcap, d.offset, d.W
    causal = variant.causal and d.Sq > 1

    score_mod = None
    if cap is not None or slopes is not None:
        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            if cap is not None:
                score = cap * torch.tanh(score / cap)
            if slopes is not None:
                score = score + slopes[h] * (kv_idx - q_idx - offset).to(torch.float32)
            return score

    block_mask = None
    if causal or variant.window:
        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            pos = q_idx + offset
            keep = kv_idx <= pos if causal else kv_idx >= 0
            if variant.window:
                keep = keep & (pos - kv_idx < window)
            return keep
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=d.Sq, KV_LEN=d.Skv, device=device)

    kwargs: dict[str, Any] = {"score_mod": score_mod, "block_mask": block_mask, "scale": d.scale}
    if variant.latent_kv:
        q = q.transpose(1, 2)
        k, v = inputs["kv"], inputs["kv"][..., :d.Dv]
    else:
        k, v = inputs["k"], inputs["v"]
        if d.group > 1:
            kwargs["enable_gqa"] = True
    if d.D > 256:  # MLA's 576: the default tiles need more shared memory than the GPU has
        kwargs["kernel_options"] = FLEX_LARGE_HEAD_OPTIONS
    flex = _compiled_flex()

    def run() -> Tensors:
        out = flex(q, k, v, **kwargs)
        return {"out": out.transpose(1, 2) if variant.latent_kv else out}

    return run


# ------------------------------------------------------------------ softmax family

def _softmax_sum(sizes: Sizes) -> Prepared:
    def softmax_sum(inputs: Tensors) -> Tensors:
        import torch

        x = inputs["inp"]
        return {"xsum": torch.exp(x - x.amax(dim=1, keepdim=True)).sum(dim=1)}
    return softmax_sum


def _softmax(sizes: Sizes) -> Prepared:
    def softmax(inputs: Tensors) -> Tensors:
        import torch

        return {"y": torch.softmax(inputs["inp"], dim=1)}
    return softmax


def _logsumexp(sizes: Sizes) -> Prepared:
    def logsumexp(inputs: Tensors) -> Tensors:
        import torch

        return {"out": torch.logsumexp(inputs["inp"], dim=1)}
    return logsumexp


# ------------------------------------------------------------------ norms and statistics

def _l2norm_stable(sizes: Sizes) -> Prepared:
    def l2norm_stable(inputs: Tensors) -> Tensors:
        x = inputs["x"]
        m = x.abs().amax(dim=1, keepdim=True)
        return {"out": m[:, 0] * ((x / m) ** 2).sum(dim=1).sqrt()}
    return l2norm_stable


def _vector_norm(sizes: Sizes) -> Prepared:
    def vector_norm(inputs: Tensors) -> Tensors:
        import torch

        return {"out": torch.linalg.vector_norm(inputs["x"], dim=1)}
    return vector_norm


def _rmsnorm_amax(sizes: Sizes) -> Prepared:
    def rmsnorm_amax(inputs: Tensors) -> Tensors:
        import torch

        x = inputs["x"]
        y = x / torch.sqrt((x * x).mean(dim=1, keepdim=True) + RMS_EPS)
        return {"y": y, "amax": y.amax(dim=1)}
    return rmsnorm_amax


def _rms_norm_builtin(sizes: Sizes) -> Prepared:
    M = sizes["M"]

    def rms_norm(inputs: Tensors) -> Tensors:
        import torch.nn.functional as F

        y = F.rms_norm(inputs["x"], (M,), eps=RMS_EPS)
        return {"y": y, "amax": y.amax(dim=1)}
    return rms_norm


def _sum_sum(sizes: Sizes) -> Prepared:
    def sum_sum(inputs: Tensors) -> Tensors:
        import torch

        x1, x2 = inputs["x1"], inputs["x2"]
        m = (x1 * x1).sum(dim=1)
        return {"s": (x1 * x2).sum(dim=1) / torch.sqrt(torch.clamp(m - SUM_SUM_THRESHOLD, min=1.0))}
    return sum_sum


def _variance(sizes: Sizes) -> Prepared:
    def variance(inputs: Tensors) -> Tensors:
        x = inputs["x"]
        mean = x.mean(dim=1, keepdim=True)
        return {"var": ((x - mean) ** 2).mean(dim=1)}
    return variance


def _var_builtin(sizes: Sizes) -> Prepared:
    def var(inputs: Tensors) -> Tensors:
        import torch

        return {"var": torch.var(inputs["x"], dim=1, correction=0)}
    return var


def _inertia(sizes: Sizes) -> Prepared:
    def inertia(inputs: Tensors) -> Tensors:
        w, x = inputs["w"], inputs["x"]                  # [B, N], [B, N, 3]
        mass = w.sum(dim=1)
        center = (w[..., None] * x).sum(dim=1) / mass[:, None]
        return {"inertia": (w * ((x - center[:, None, :]) ** 2).sum(dim=-1)).sum(dim=1)}
    return inertia


def _layernorm_stats(sizes: Sizes) -> Prepared:
    def layernorm_stats(inputs: Tensors) -> Tensors:
        import torch

        x = inputs["x"]
        mean = x.mean(dim=1)
        centred = x - mean[:, None]
        var = (centred * centred).mean(dim=1)
        return {"mean": mean, "var": var, "y": centred / torch.sqrt(var[:, None] + LAYERNORM_EPS)}
    return layernorm_stats


def _var_mean_builtin(sizes: Sizes) -> Prepared:
    def var_mean(inputs: Tensors) -> Tensors:
        import torch

        x = inputs["x"]
        var, mean = torch.var_mean(x, dim=1, correction=0)
        return {"mean": mean, "var": var, "y": (x - mean[:, None]) * torch.rsqrt(var[:, None] + LAYERNORM_EPS)}
    return var_mean


# ------------------------------------------------------------------ cascades

def _moe_routing(sizes: Sizes) -> Prepared:
    K = sizes["K"]

    def moe_routing(inputs: Tensors) -> Tensors:
        import torch

        z = inputs["x"] @ inputs["w"]                     # [S, E]
        m = z.amax(dim=1, keepdim=True)
        s = torch.exp(z - m).sum(dim=1, keepdim=True)
        # The reference's top-k is a stable descending sort: ties go to the lower expert index
        # (torch.topk leaves the order of ties unspecified).
        top, topi = torch.sort(z, dim=1, descending=True, stable=True)
        return {"probs": torch.exp(top[:, :K] - m) / s, "topi": topi[:, :K].to(torch.int32)}
    return moe_routing


def _quant_gemm(sizes: Sizes) -> Prepared:
    def quant_gemm(inputs: Tensors) -> Tensors:
        a = inputs["A"]
        amax = a.abs().amax(dim=1, keepdim=True)
        return {"C": (FP8_MAX * a / amax) @ inputs["W"]}
    return quant_gemm


def _quant_gemm_fp8(sizes: Sizes) -> Prepared:
    def quant_gemm_fp8(inputs: Tensors) -> Tensors:
        import torch

        a = inputs["A"]
        amax = a.abs().amax(dim=1, keepdim=True)
        quantised = (FP8_MAX * a / amax).to(torch.float8_e4m3fn).to(torch.float32)
        return {"C": quantised @ inputs["W"]}
    return quant_gemm_fp8


def _performer(sizes: Sizes) -> Prepared:
    delta, rho, beta = performer_constants(dict(sizes))

    def performer(inputs: Tensors) -> Tensors:
        import torch

        q, k, v, proj = inputs["q"], inputs["k"], inputs["v"], inputs["proj"]

        def features(x: Any, max_dims: tuple[int, ...]) -> Any:
            dash = torch.matmul(delta * x, proj.t())                  # [B, H, L, F]
            diag = beta * (x * x).sum(dim=-1, keepdim=True)
            return rho * torch.exp(dash - diag - dash.amax(dim=max_dims, keepdim=True))

        qp, kp = features(q, (-1,)), features(k, (-2, -1))
        context = torch.matmul(kp.transpose(-2, -1), v)                # [B, H, F, D]
        denom = torch.matmul(qp, kp.sum(dim=-2)[..., None])            # [B, H, L, 1]
        return {"out": torch.matmul(qp, context) / denom}
    return performer


_PREPARE: dict[str, Callable[[Sizes], Prepared]] = {
    "softmax_sum": _softmax_sum,
    "softmax": _softmax,
    "logsumexp": _logsumexp,
    "l2norm_stable": _l2norm_stable,
    "rmsnorm_amax": _rmsnorm_amax,
    "sum_sum": _sum_sum,
    "variance": _variance,
    "inertia": _inertia,
    "layernorm_stats": _layernorm_stats,
    "moe_routing": _moe_routing,
    "quant_gemm": _quant_gemm,
    "quant_gemm_fp8": _quant_gemm_fp8,
    "performer": _performer,
}

_BUILTINS: dict[str, tuple[str, Callable[[Sizes], Prepared]]] = {
    "l2norm_stable": ("torch.linalg.vector_norm", _vector_norm),
    "rmsnorm_amax": ("F.rms_norm+amax", _rms_norm_builtin),
    "variance": ("torch.var", _var_builtin),
    "layernorm_stats": ("torch.var_mean", _var_mean_builtin),
}


def attention_flops(name: str, mode: str, sizes: Sizes) -> int:
    """2·(D + Dv) flops per visible (query, key) pair and head: q·kᵀ and p·v, the mask's zeros left out."""
    variant, d = attention_dims(name, mode, sizes)
    pairs = sum(hi - lo + 1 for lo, hi in visible_keys(variant, d) if hi >= lo)
    return 2 * d.B * d.Hq * pairs * (d.D + d.Dv)


def flops(name: str, mode: str, sizes: Sizes) -> int | None:
    """Multiply-add work of the operator's products (None for the memory-bound ones)."""
    if is_attention(name):
        return attention_flops(name, mode, sizes)
    if name in ("quant_gemm", "quant_gemm_fp8"):
        return 2 * sizes["M"] * sizes["N"] * sizes["K"]
    if name == "moe_routing":
        return 2 * sizes["S"] * sizes["HD"] * sizes["E"]
    if name == "performer":
        # q·Pᵀ, k·Pᵀ, k'ᵀ·v and q'·(k'ᵀv): four products of L×F×D per head.
        return 8 * sizes["B"] * sizes["H"] * sizes["L"] * sizes["F"] * sizes["D"]
    return None


def describe_sizes(name: str, mode: str, sizes: Sizes) -> str:
    """A short description of a case for tables (attention: B, q/kv heads, Sq, Skv, D, Dv, W)."""
    if not is_attention(name):
        return " ".join(f"{k}={v}" for k, v in sizes.items())
    _, d = attention_dims(name, mode, sizes)
    text = f"B={d.B} H={d.Hq}/{d.Hkv} Sq={d.Sq} Skv={d.Skv} D={d.D}"
    if d.Dv != d.D:
        text += f" Dv={d.Dv}"
    if d.W is not None:
        text += f" W={d.W}"
    return text
