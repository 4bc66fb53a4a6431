"""Reduction fusion across the catalog: every operator with a repair fuses by its default
schedule and the fused program agrees with NumPy; the repairs are those of OPERATORS.md;
attention is truly fused; operators without a repair are refused with the reason."""

from __future__ import annotations

import functools

import pytest
import sympy

from polyfuse import ops
from polyfuse.errors import NoRepairFound
from polyfuse.ir import interpret
from polyfuse.ir.stmt import Loop, Seq
from polyfuse.ops.schedules import default_schedule
from polyfuse.transforms.tree import loops_of

REFUSED = {"quant_gemm_fp8"}
CASES = [(name, mode) for name in ops.names() for mode in ops.get(name).modes if name not in REFUSED]
ATTENTION = [(n, m) for n, m in CASES if n.startswith("attn")]


@functools.cache
def fused(name: str, mode: str):
    op = ops.get(name)
    return default_schedule(name, mode, op.program(mode))


@pytest.mark.parametrize("name, mode", CASES)
def test_fused_program_agrees_with_numpy(name, mode):
    op = ops.get(name)
    sch = fused(name, mode)
    sizes = op.sizes(mode)
    for seed in (0, 1, 2):
        for magnitude in op.magnitudes:
            inputs = op.inputs(seed, mode, None, magnitude)
            got = interpret(sch.program, inputs)
            result = ops.compare(got, op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
            assert result.ok, f"{name} {mode} seed={seed} magnitude={magnitude}: {result.line()} {result.worst}"


@pytest.mark.parametrize("name, mode", CASES)
def test_fused_equals_unfused_up_to_f32_reassociation(name, mode):
    """The fused program computes what the plain one does: regrouped f32 sums differ by rounding only."""
    op = ops.get(name)
    inputs = op.inputs(0, mode)
    plain = interpret(op.program(mode), inputs)
    got = interpret(fused(name, mode).program, inputs)
    for key, value in plain.items():
        a, b = value.astype("float64"), got[key].astype("float64")
        scale = max(1.0, float(abs(a).max()))
        assert abs(a - b).max() <= 1e-5 * scale, f"{name} {mode} {key}"


def _h(name: str, mode: str, consumer: str):
    for f in fused(name, mode).fusions:
        if f.consumer == consumer:
            return f.repair
    raise AssertionError(f"{name}: no fusion of {consumer}")


def _same(repair, expected) -> bool:
    return sympy.simplify(repair.h - expected) == 0


@pytest.mark.parametrize("name, consumer", [
    ("softmax_sum", "s_sum"), ("softmax", "s_sum"), ("logsumexp", "s_sum"), ("moe_routing", "s_sum"),
])
def test_softmax_family_repair_is_t_exp_of_max_change(name, consumer):
    r = _h(name, "default", consumer)
    (m,), (m2,) = r.old, r.new
    assert _same(r, r.t * sympy.exp(m - m2))


@pytest.mark.parametrize("name", [n for n, m in ATTENTION if n != "attn_norm_inside"])
def test_attention_repairs(name):
    for mode in ops.get(name).modes:
        for consumer in ("row_sum", "pv"):
            r = _h(name, mode, consumer)
            (m,), (m2,) = r.old, r.new
            assert _same(r, r.t * sympy.exp(m - m2)), (name, mode, consumer, r.h)


def test_norm_inside_repair_has_two_producers():
    for mode in ("prefill", "decode"):
        r = _h("attn_norm_inside", mode, "pv")
        olds = dict(zip((ld.tensor.name for ld in r.producers), r.old, strict=True))
        news = dict(zip((ld.tensor.name for ld in r.producers), r.new, strict=True))
        expected = r.t * sympy.exp(olds["row_max"] - news["row_max"]) * olds["row_sum"] / news["row_sum"]
        assert _same(r, expected), r.h


def test_no_identity_guard_where_the_repair_maps_the_identity_to_itself():
    """``G`` (keep X while it is the identity) is left out where the numerics proved h = t·Q with Q in
    [0, 1] and finite at a producer's identity: t·exp(m - m') (exp(-inf - m') = 0), norm_inside's
    t·exp(m - m')·s/s' (s' >= 1 once m is finite: its term is 1 where m is attained), quant_gemm's t·m/m'
    (a max of |A| is never -inf after the first step, where the update keeps t), and rmsnorm_amax's max
    repair t·sqrt(s/M + eps)/sqrt(s'/M + eps) > 0, which maps -inf to -inf."""
    for name, block in (("attn_global", "pv"), ("attn_norm_inside", "pv"), ("quant_gemm", "s_gemm"),
                        ("rmsnorm_amax", "s_amax")):
        program = fused(name, ops.get(name).modes[0]).program
        value = str(program.block(block).store.value)
        x = program.block(block).store.tensor.name
        assert f"eq({x}[" not in value, (name, value)
        assert "_prev[" in value, (name, value)


def test_norm_and_gemm_repairs():
    r = _h("l2norm_stable", "default", "s_ssq")
    assert _same(r, r.t * r.old[0] ** 2 / r.new[0] ** 2)
    r = _h("rmsnorm_amax", "default", "s_amax")
    (s,), (s2,) = r.old, r.new
    m = 40  # M at test sizes
    eps = sympy.nsimplify(sympy.Float(1e-6, 30))
    expected = r.t * sympy.sqrt(s / m + eps) / sympy.sqrt(s2 / m + eps)
    difference = sympy.simplify(r.h.subs(sympy.Symbol("M"), m) - expected)
    assert abs(difference.evalf(subs={s: 3.0, s2: 5.0, r.t: 2.0})) < 1e-6
    r = _h("sum_sum", "default", "s_scaled_dot")
    (m,), (m2,) = r.old, r.new
    assert _same(r, r.t * sympy.sqrt(sympy.Max(m - 10, 1)) / sympy.sqrt(sympy.Max(m2 - 10, 1)))
    r = _h("quant_gemm", "default", "s_gemm")
    assert _same(r, r.t * r.old[0] / r.new[0])


def test_performer_four_fusions():
    sch = fused("performer", "default")
    assert [f.consumer for f in sch.fusions] == ["s_ksum", "s_context", "s_denom", "s_numer"]
    for f in sch.fusions:
        (r,), (r2,) = f.repair.old, f.repair.new
        assert _same(f.repair, f.repair.t * sympy.exp(r - r2))


@pytest.mark.parametrize("name", sorted({n for n, _ in ATTENTION if n != "attn_mla_decode"}))
def test_prefill_attention_is_one_nest_per_query_tile(name):
    program = fused(name, "prefill").program
    top = program.body.stmts if isinstance(program.body, Seq) else (program.body,)
    assert len(top) == 1, "the whole attention is one loop nest"
    query_tile = [lp for lp in loops_of(program, "out") if lp.var.name == "i_0"]
    assert query_tile, "out is computed per query tile"
    inside = {b.name for b in _blocks(query_tile[0])}
    assert {"row_max", "row_sum", "pv", "out"} <= inside
    key_tile = [lp for lp in loops_of(program, "pv") if lp.var.name == "j_0"]
    assert key_tile, "pv's repaired combine runs once per key tile"


@pytest.mark.parametrize("name", sorted({n for n, m in ATTENTION if m == "decode"}))
def test_decode_attention_has_local_and_global_nests(name):
    program = fused(name, "decode").program
    names = {b.name for b in program.blocks()}
    assert {"row_max_rf", "row_sum_rf", "pv_rf", "row_max", "row_sum", "pv"} <= names
    for local in ("row_max_rf", "row_sum_rf", "pv_rf"):
        assert "j_0" in [lp.var.name for lp in loops_of(program, local)], f"{local} runs per split"
    split_loops = {id(lp) for lp in loops_of(program, "pv_rf") if lp.var.name == "j_0"}
    for glob in ("row_max", "row_sum", "pv"):
        assert not split_loops & {id(lp) for lp in loops_of(program, glob)}, f"{glob} combines after the splits"


@pytest.mark.parametrize("name, fragment", [
    ("quant_gemm_fp8", "rounding is not invertible"),
])
def test_operators_without_a_repair_are_refused_with_the_reason(name, fragment):
    op = ops.get(name)
    with pytest.raises(NoRepairFound, match=fragment):
        default_schedule(name, "default", op.program("default"))


def _blocks(loop: Loop):
    from polyfuse.transforms.tree import blocks_under

    return blocks_under(loop)


@pytest.mark.parametrize("name, mode", CASES)
def test_fused_program_prints_as_builder_python_that_rebuilds_it(name, mode):
    from polyfuse.ir.printer import print_program, program_from_source

    program = fused(name, mode).program
    assert program_from_source(print_program(program)) == program


@pytest.mark.parametrize("name, mode", [("softmax_sum", "default"), ("attn_causal", "prefill"),
                                        ("attn_window", "decode")])
def test_fusion_trace_replays_to_the_same_program(name, mode):
    from polyfuse.transforms import Schedule

    sch = fused(name, mode)
    again = Schedule(ops.get(name).program(mode)).replay(sch.trace.to_json())
    assert again.program == sch.program
    assert Schedule(ops.get(name).program(mode)).exec_python(sch.trace.python()).program == sch.program


@pytest.mark.parametrize("name, mode", ATTENTION)
def test_no_query_by_key_intermediate_remains(name, mode):
    op = ops.get(name)
    sizes = op.sizes(mode)
    sq, skv = (1, sizes["Skv"]) if mode == "decode" else (sizes.get("Sq", 1), sizes["Skv"])
    for t in fused(name, mode).program.temps:
        dims = [int(d.value) for d in t.shape]
        assert not (skv in dims and (sq in dims or mode == "decode")), f"{t.name} {dims} is a full score matrix"


@pytest.mark.parametrize("name, consumer, count", [("variance", "s_var", 2), ("layernorm_stats", "s_var", 2),
                                                    ("inertia", "s_inertia", 4)])
def test_polynomial_terms_fuse_with_auxiliary_accumulators(name, consumer, count):
    r = _h(name, "default", consumer)
    assert len(r.auxiliaries) == count and r.state
    fusion = next(f for f in fused(name, "default").fusions if f.consumer == consumer)
    names = {b.name for b in fused(name, "default").program.blocks()}
    assert {f"{consumer}_{a.name}" for a in r.auxiliaries} <= names
    assert {f"{consumer}_{a.name}" for a in r.auxiliaries} <= set(fusion.created)
    program = fused(name, "default").program
    top = program.body.stmts if isinstance(program.body, Seq) else (program.body,)
    assert len([s for s in top if any(b.reducer is not None for b in _blocks_of(s))]) == 1, "one pass"


def test_variance_state_repair_is_welford():
    r = _h("variance", "default", "s_var")
    (m,), (m2,) = r.old, r.new
    a1, a2 = r.state
    assert sympy.expand(r.h - (r.t + a1 * (m2 - m) + a2 * (m2 - m) ** 2)) == 0
    assert sympy.expand(r.auxiliaries[0].repair.h - (r.t + 2 * a2 * (m2 - m))) == 0
    assert r.auxiliaries[1].repair.is_identity


def _blocks_of(stmt):
    from polyfuse.transforms.tree import blocks_under

    return blocks_under(stmt)


def test_a_fusion_is_found_by_its_consumer_block():
    # Recipes fuse in their own order (attention's first fusion is the row max, without a repair): the record
    # of a block's fusion is looked up by the block's name; a block that was not fused is a clear error.
    from ir_programs import softmax_sum

    from polyfuse.errors import IllegalTransform
    from polyfuse.transforms import Schedule

    sch = Schedule(softmax_sum())
    sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    assert str(sch.fusion("s_sum").repair.describe()["h"]) == "t*exp(xmax - xmax')"
    op = ops.get("attn_causal")
    attention = default_schedule("attn_causal", "prefill", op.program("prefill", **op.sizes("prefill")))
    assert attention.fusions[0].consumer == "row_max" and attention.fusions[0].repair is None
    assert attention.fusion("pv").repair is not None and attention.fusion("row_sum").consumer == "row_sum"
    with pytest.raises(IllegalTransform, match=r"block 'score' was not fused .* fused blocks: row_max, row_sum, pv"):
        attention.fusion("score")
    with pytest.raises(IllegalTransform, match="fused blocks: none yet"):
        Schedule(softmax_sum()).fusion("s_sum")
