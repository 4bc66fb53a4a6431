"""hoist_divisor (polyfuse/transforms/hoist_divisor.py): Σ_j (a_j/d)·b_j → (Σ_j a_j·b_j)/d where d does not
depend on j, only where floating point allows it (d a proven range never 0, the new terms bounded), and the
GPU attention schedules taking it for the divide-inside form."""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.errors import IllegalTransform
from polyfuse.ir import ProgramBuilder, cast, exp, interpret, maximum, reduce
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.transforms.hoist_divisor import divided_sums, hoist_divisor
from polyfuse.transforms.ranges import value_ranges
from polyfuse.transforms.schedule import Schedule


def _weighted(*, v_dtype: str = "f16", v_finite: bool = True, init: float | None = None, max_extent: int = 24,
              divisor: str = "sum", scale: float = 1.0):
    """out[i, c] = Σ_j (a_ij/Σ_j exp(x − max x))·v[j, c], a = exp(x·scale − max of x's first max_extent keys),
    with the knobs the tests turn."""
    p = ProgramBuilder("weighted")
    x = p.input("x", (6, 24), "f32")
    v = p.input("v", (24, 5), v_dtype, finite=v_finite)
    c = p.input("c", (6,), "f32", finite=True)
    m, m_a = p.temp("m", (6,), "f32"), p.temp("m_a", (6,), "f32")
    e, a = p.temp("e", (6, 24), "f32"), p.temp("a", (6, 24), "f32")
    s = p.temp("s", (6,), "f32")
    w = p.temp("w", (6, 24), "f32")
    acc = p.temp("acc", (6, 5), "f32")
    out = p.output("out", (6, 5), "f32")
    with p.nest("s_max", i=6, j=reduce(24)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_exp", i=6, j=24) as (i, j):
        e[i, j] = exp(x[i, j] - m[i])
    with p.nest("s_sum", i=6, j=reduce(24)) as (i, j):
        s[i] = s[i] + e[i, j]
    with p.nest("s_max_a", i=6, j=reduce(max_extent)) as (i, j):
        m_a[i] = maximum(m_a[i], x[i, j])
    with p.nest("s_a", i=6, j=24) as (i, j):
        a[i, j] = exp(x[i, j] * scale - m_a[i]) if scale != 1.0 else exp(x[i, j] - m_a[i])
    d = s if divisor == "sum" else c
    with p.nest("s_w", i=6, j=24) as (i, j):
        w[i, j] = a[i, j] / d[i]
    with p.nest("s_acc", i=6, col=5, j=reduce(24), init=init) as (i, col, j):
        acc[i, col] = acc[i, col] + w[i, j] * cast("f32", v[j, col])
    with p.nest("s_out", i=6, col=5) as (i, col):
        out[i, col] = acc[i, col]
    return p.build()


def _inputs(rng, *, leading_zeros: bool = False):
    x = rng.standard_normal((6, 24)).astype(np.float32) * 30
    if leading_zeros:
        x[:, :7] = 0
    return {"x": x, "v": rng.standard_normal((24, 5)).astype(np.float16), "c": np.full(6, 3.0, np.float32)}


def test_the_division_moves_after_the_sum():
    hoisted = hoist_divisor(_weighted(), block="s_acc")
    names = [b.name for b in hoisted.blocks()]
    assert "s_w" not in names and "w" not in {t.name for t in hoisted.tensors}  # inlined, then unread
    assert str(hoisted.block("s_acc").reduce_term()) == 'a[i, j] * cast("f32", v[j, col])'
    assert str(hoisted.block("s_out").store.value) == "acc[i, col] / s[i]"
    rng = np.random.default_rng(0)
    for zeros in (False, True):
        inputs = _inputs(rng, leading_zeros=zeros)
        plain, new = interpret(_weighted(), inputs)["out"], interpret(hoisted, inputs)["out"]
        ref = (np.exp(inputs["x"].astype(np.float64) - inputs["x"].max(1, keepdims=True))
               @ inputs["v"].astype(np.float64)) / np.exp(
            inputs["x"].astype(np.float64) - inputs["x"].max(1, keepdims=True)).sum(1, keepdims=True)
        # both within (n + 2)·2^-24 relative of Σ|a·b|/d <= max|v| (the module's proof): the same order
        bound = 26 * 2.0 ** -24 * np.abs(inputs["v"]).max()
        assert np.abs(plain - ref).max() <= bound and np.abs(new - ref).max() <= bound


def test_a_nan_divisor_gives_nan_in_both_forms():
    inputs = _inputs(np.random.default_rng(1))
    inputs["x"][2, 5] = np.nan
    plain = interpret(_weighted(), inputs)["out"]
    new = interpret(hoist_divisor(_weighted(), block="s_acc"), inputs)["out"]
    assert np.array_equal(np.isnan(plain), np.isnan(new)) and np.isnan(new[2]).all() and not np.isnan(new[0]).any()


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"init": 1.0}, "starts from"),                              # (1 + Σ a/d) is not (1 + Σ a)/d
    ({"divisor": "input"}, "no proven range"),                   # c may be 0 or inf
    ({"v_finite": False}, "no bound is known"),                  # v may be inf: Σ a·v unbounded
    ({"v_dtype": "f32"}, "past f32's largest number"),           # 24 f32 values near 3.4e38 overflow
    ({"max_extent": 12}, "no bound is known"),                   # the max of half the row: exp(x − m) > 1
    ({"scale": 2.0}, "no bound is known"),                       # exp(2x − max x) is not <= 1
])
def test_refused_where_floating_point_could_differ(kwargs, says):
    with pytest.raises(IllegalTransform, match=says) as err:
        hoist_divisor(_weighted(**kwargs), block="s_acc")
    assert "s_acc" in str(err.value)


def test_refused_without_a_division_or_on_an_output_or_after_fusing():
    with pytest.raises(IllegalTransform, match="no factor of its term"):
        hoist_divisor(_weighted(), block="s_sum")
    quant = ops.get("quant_gemm").program("default")
    (block,) = divided_sums(quant)
    with pytest.raises(IllegalTransform, match="program output"):
        hoist_divisor(quant, block=block)
    sch = Schedule(ops.get("attn_norm_inside").program("prefill"))
    _, _, _, j, _ = sch.get_loops("qk")
    j0, _ = sch.split(j, [5, None])
    sch.reverse_compute_at("score", j0)
    for block in ("row_max", "row_sum", "pv"):
        sch.rolling_update(block, j0)
    with pytest.raises(IllegalTransform):
        sch.hoist_divisor("pv")


def test_a_plain_softmax_denominator_is_never_zero_a_rolled_one_may_be():
    (fact,) = [r for r in value_ranges(ops.get("attn_norm_inside").program("prefill")) if r.name == "row_sum"]
    assert fact.nonzero and "never 0" in fact.proof
    rolled = default_schedule("attn_global", "prefill", ops.get("attn_global").program("prefill")).program
    assert not any(r.nonzero for r in value_ranges(rolled))


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_the_divide_inside_form_becomes_the_plain_form(mode):
    sch = Schedule(ops.get("attn_norm_inside").program(mode))
    assert divided_sums(sch.program) == ["pv"]
    sch.hoist_divisor("pv")
    assert str(sch.program).replace("attn_norm_inside", "attn_global") == str(ops.get("attn_global").program(mode))
    assert sch.trace.python() == "sch.hoist_divisor(block='pv')"
    replayed = Schedule(ops.get("attn_norm_inside").program(mode)).replay(sch.trace)
    assert replayed.program == sch.program


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_gpu_schedules_hoist_where_the_tuning_says(mode):
    op = ops.get("attn_norm_inside")
    program = op.program(mode)
    steps = [s.primitive for s in default_schedule(op.name, mode, program, "cuda").trace.steps]
    assert steps[0] == "hoist_divisor"
    off = default_schedule(op.name, mode, program, "cuda", tuning=GpuTuning(hoist_divisors=False)).trace.steps
    assert "hoist_divisor" not in [s.primitive for s in off]
    assert "hoist_divisor" not in [s.primitive for s in default_schedule(op.name, mode, program).trace.steps]
    with pytest.raises(Exception, match="True or False"):
        GpuTuning(hoist_divisors=1)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_hoisted_program_matches_numpy_on_every_input(mode):
    """The hoisted plain program, run by the interpreter, against the float64 reference within the operator's
    tolerance, on every input variant and magnitude."""
    op = ops.get("attn_norm_inside")
    sizes = op.sizes(mode)
    hoisted = hoist_divisor(op.program(mode), block="pv")
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(3, mode, sizes, magnitude, variant)
            result = ops.compare(interpret(hoisted, inputs), op.reference(inputs, mode, sizes),
                                 op.tolerance(mode, sizes))
            assert result.ok, f"{variant} at {magnitude:g}: {result.line()} {result.worst}"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_hoisted_then_fused_matches_numpy_on_every_input(mode):
    """The GPU plan's fusion order on the host: hoisted, then rolled (prefill) or split (decode) as the catalog
    schedules do, run by the interpreter against the reference on every input variant and magnitude."""
    from polyfuse.ops.schedules import _attention_decode, _attention_prefill

    op = ops.get("attn_norm_inside")
    sizes = op.sizes(mode)
    sch = Schedule(op.program(mode))
    sch.hoist_divisor("pv")
    (_attention_prefill if mode == "prefill" else _attention_decode)(sch)
    assert len(sch.fusions) == (3 if mode == "prefill" else 2)
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(5, mode, sizes, magnitude, variant)
            result = ops.compare(interpret(sch.program, inputs), op.reference(inputs, mode, sizes),
                                 op.tolerance(mode, sizes))
            assert result.ok, f"{variant} at {magnitude:g}: {result.line()} {result.worst}"
