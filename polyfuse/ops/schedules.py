"""Default schedules of the catalog: a few lines each, in Neptune's style.

``default_schedule(name, mode, program)`` returns the :class:`Schedule` after the
operator's steps.  Attention prefill becomes one fused nest per query tile with a
rolling loop over key tiles (FlashAttention); attention decode becomes split-k
partial nests plus combines (FlashDecoding); the other operators fuse their
reduction chains into a single pass where a repair exists — for ``variance``,
``inertia`` and ``layernorm_stats`` a state repair with auxiliary accumulators
(:mod:`~polyfuse.transforms.auxiliary`).  Every schedule ends by compacting the
temporaries to what one iteration uses (no S×S score matrix remains in fused
attention).  Where no repair exists (``quant_gemm_fp8``) the fusion step raises
``NoRepairFound`` with the failing condition, and nothing is mis-compiled.
"""

from __future__ import annotations

from collections.abc import Callable

from polyfuse.errors import PolyfuseError
from polyfuse.ir.stmt import Program
from polyfuse.transforms.schedule import Schedule

PREFILL_TILE = (16, 16)
"""Query rows × key columns per tile of fused prefill attention."""
DECODE_SPLITS = 4
"""Key splits of fused decode attention (the partial nests run in parallel)."""

_Plan = Callable[[Schedule], None]


def _attention_prefill(sch: Schedule) -> None:
    _, _, i, j, _ = sch.get_loops("qk")
    i0, j0, _, _ = sch.tile([i, j], list(PREFILL_TILE))
    sch.reverse_compute_at("score", j0)
    for block in ("row_max", "row_sum", "pv"):
        sch.rolling_update(block, j0)
    sch.reverse_compute_at("out", i0)


def _attention_decode(sch: Schedule) -> None:
    j = sch.loop("qk", "j")
    j0, _ = sch.split(j, [DECODE_SPLITS, None])
    sch.reverse_compute_at("score", j0)
    for block in ("row_sum", "pv"):
        sch.split_k_update(block, j0)


def _rolling(consumers: tuple[str, ...], producer: str, loop: str) -> _Plan:
    """Roll each consumer reduction into the producer's loop ``loop``."""
    def plan(sch: Schedule) -> None:
        for c in consumers:
            sch.rolling_update(c, sch.loop(producer, loop))
    return plan


def _performer(sch: Schedule) -> None:
    # Neptune App. C: the key-side sums roll over rows with the global key max,
    # the query-side sums roll over features with the per-row query max.
    for c in ("s_ksum", "s_context"):
        sch.rolling_update(c, sch.loop("s_kmax", "i"))
    for c in ("s_denom", "s_numer"):
        sch.rolling_update(c, sch.loop("s_qmax", "f"))


_PLANS: dict[tuple[str, str], _Plan] = {
    ("softmax_sum", "default"): _rolling(("s_sum",), "s_max", "j"),
    ("softmax", "default"): _rolling(("s_sum",), "s_max", "j"),
    ("logsumexp", "default"): _rolling(("s_sum",), "s_max", "j"),
    ("l2norm_stable", "default"): _rolling(("s_ssq",), "s_amax", "j"),
    ("rmsnorm_amax", "default"): _rolling(("s_amax",), "s_ssq", "j"),
    ("sum_sum", "default"): _rolling(("s_scaled_dot",), "s_sumsq", "j"),
    ("variance", "default"): _rolling(("s_var",), "s_mean", "j"),
    ("inertia", "default"): _rolling(("s_center", "s_inertia"), "s_mass", "n"),
    ("layernorm_stats", "default"): _rolling(("s_var",), "s_mean", "j"),
    ("moe_routing", "default"): _rolling(("s_sum",), "s_max", "j"),
    ("quant_gemm", "default"): _rolling(("s_gemm",), "s_amax", "k"),
    ("quant_gemm_fp8", "default"): _rolling(("s_gemm",), "s_amax", "k"),
    ("performer", "default"): _performer,
}
for _name in ("attn_global", "attn_causal", "attn_alibi", "attn_gqa", "attn_softcap", "attn_window",
              "attn_norm_inside"):
    _PLANS[(_name, "prefill")] = _attention_prefill
    _PLANS[(_name, "decode")] = _attention_decode
_PLANS[("attn_mla_decode", "decode")] = _attention_decode


def has_default_schedule(name: str, mode: str) -> bool:
    return (name, mode) in _PLANS


def default_schedule(name: str, mode: str, program: Program) -> Schedule:
    """The operator's fused schedule applied to ``program`` (its plain program at some sizes)."""
    plan = _PLANS.get((name, mode))
    if plan is None:
        raise PolyfuseError(f"operator {name!r} has no default schedule for mode {mode!r}")
    sch = Schedule(program)
    plan(sch)
    sch.compact_buffers()
    return sch
