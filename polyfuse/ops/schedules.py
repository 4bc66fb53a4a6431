"""Default schedules of the catalog: a few lines each, in Neptune's style.

``default_schedule(name, mode, program)`` returns the :class:`Schedule` after the
operator's steps.  Attention prefill becomes one fused nest per query tile with a
rolling loop over key tiles (FlashAttention); attention decode becomes split-k
partial nests plus combines (FlashDecoding); the other operators fuse their
reduction chains into a single pass where a repair exists — for ``variance``,
``inertia`` and ``layernorm_stats`` a state repair with auxiliary accumulators
(:mod:`~polyfuse.transforms.auxiliary`).  Every schedule ends by compacting the
temporaries to what one iteration uses (no S×S score matrix remains in fused
attention).

GPU targets (``target="cuda"`` or ``"hip"``) get the same fusions with GPU-sized tiles:
32×64 query/key tiles for prefill (one thread block per query tile), 128-key splits for decode
(one block per split, then a combine kernel), and for the other operators a rolling loop over
tiles of ``GPU_ROW_TILE`` elements instead of single elements, with the elementwise consumers of
the fused results moved into the same per-row loop (one block per row, one pass over memory for
the statistics and one for the output).  Where no repair exists (``quant_gemm_fp8``) the fusion step raises
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
GPU_PREFILL_TILE = (32, 64)
"""Query rows × key columns per thread block of fused prefill attention on GPUs.

Measured on the H200 (causal, S=4096, d=128, 8 warps): 32×64 11.9 ms, 16×64 12.3, 64×64 16.8,
32×32 14.4, 32×128 14.0."""
GPU_DECODE_SPLIT = 128
"""Keys per split (one thread block each) of fused decode attention on GPUs."""
GPU_ROW_TILE = 1024
"""Elements per step of the rolling loop of the row reductions on GPUs."""
GPU_TARGETS = ("cuda", "hip")

_Plan = Callable[[Schedule], None]


def _attention_prefill(sch: Schedule, tile: tuple[int, int] = PREFILL_TILE) -> None:
    _, _, i, j, _ = sch.get_loops("qk")
    i0, j0, _, _ = sch.tile([i, j], list(tile))
    sch.reverse_compute_at("score", j0)
    for block in ("row_max", "row_sum", "pv"):
        sch.rolling_update(block, j0)
    sch.reverse_compute_at("out", i0)


def _attention_decode(sch: Schedule, split: list[int | None] | None = None) -> None:
    j = sch.loop("qk", "j")
    j0, _ = sch.split(j, split or [DECODE_SPLITS, None])
    sch.reverse_compute_at("score", j0)
    for block in ("row_sum", "pv"):
        sch.split_k_update(block, j0)


def _rolling(consumers: tuple[str, ...], producer: str, loop: str) -> _Plan:
    """Roll each consumer reduction into the producer's loop ``loop``."""
    def plan(sch: Schedule) -> None:
        for c in consumers:
            sch.rolling_update(c, sch.loop(producer, loop))
    plan.rolling = (consumers, producer, loop)  # type: ignore[attr-defined]
    return plan


def _gpu_rolling(sch: Schedule, consumers: tuple[str, ...], producer: str, loop: str) -> None:
    """The rolling plan over tiles of ``GPU_ROW_TILE`` elements, consumers moved into the row loop."""
    ref = sch.loop(producer, loop)
    extent = _extent(sch, ref)
    if any(len(sch.get_loops(c)) > len(sch.get_loops(producer)) for c in consumers):
        # A consumer with axes of its own (quant_gemm's columns) would turn each step into a
        # tile of those axes times the step: keep the element-wise rolling loop instead.
        raise PolyfuseError(f"row tiling does not apply: a consumer of {producer!r} has more loops than it")
    if extent is not None and extent >= 32:
        ref, _ = sch.split(ref, [None, _fit(GPU_ROW_TILE, extent)])
    for c in consumers:
        sch.rolling_update(c, ref)
    from polyfuse.transforms.tree import loops_of

    if len(sch.get_loops(producer)) < 2:
        return
    row = sch.get_loops(producer)[0]
    for block in [b.name for b in sch.program.blocks()]:
        loops = loops_of(sch.program, block)
        if loops and loops[0] is loops_of(sch.program, producer)[0]:
            continue
        try:
            sch.reverse_compute_at(block, row)
        except PolyfuseError:
            continue


def _fit(tile: int, extent: int | None) -> int:
    """``tile``, shrunk (to a power of two, at least 16) so that ``extent`` spans at least two tiles."""
    while extent is not None and tile > 16 and 2 * tile > extent:
        tile //= 2
    return tile


def _extent(sch: Schedule, ref) -> int | None:
    from polyfuse.ir.expr import Const
    from polyfuse.transforms.tree import loops_of

    for lp in loops_of(sch.program, ref.block):
        if lp.var.name == ref.name and isinstance(lp.extent, Const):
            return int(lp.extent.value)
    return None


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


def _gpu_plan(sch: Schedule, plan: _Plan) -> None:
    if plan is _attention_prefill:
        _, _, i, j, _ = sch.get_loops("qk")
        tile = (_fit(GPU_PREFILL_TILE[0], _extent(sch, i)), _fit(GPU_PREFILL_TILE[1], _extent(sch, j)))
        _attention_prefill(sch, tile)
    elif plan is _attention_decode:
        _attention_decode(sch, [None, _fit(GPU_DECODE_SPLIT, _extent(sch, sch.loop("qk", "j")))])
    else:
        _gpu_rolling(sch, *plan.rolling)  # type: ignore[attr-defined]


def default_schedule(name: str, mode: str, program: Program, target: str = "cpp") -> Schedule:
    """The operator's fused schedule applied to ``program`` (its plain program at some sizes).

    ``target`` (``cpp``, ``cuda``, ``hip``) picks the tile sizes (see the module docstring).
    """
    plan = _PLANS.get((name, mode))
    if plan is None:
        raise PolyfuseError(f"operator {name!r} has no default schedule for mode {mode!r}")
    sch = Schedule(program)
    if target in GPU_TARGETS and (plan in (_attention_prefill, _attention_decode) or hasattr(plan, "rolling")):
        try:
            _gpu_plan(sch, plan)
        except PolyfuseError:
            # The GPU tiling does not apply to this program (e.g. chained consumers that cannot
            # roll over tiles): fall back to the element-wise plan, which fuses the same way.
            if plan in (_attention_prefill, _attention_decode):
                raise
            sch = Schedule(program)
            plan(sch)
    else:
        plan(sch)
    sch.compact_buffers()
    return sch
