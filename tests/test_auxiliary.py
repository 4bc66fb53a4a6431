"""State repairs with auxiliary accumulators (issue #9): the polynomial-in-r terms fuse exactly,
keep the two-pass program's accuracy at a large common offset, and non-polynomial terms without
a repair are still refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

from polyfuse import ops
from polyfuse.errors import NoRepairFound
from polyfuse.ir import ProgramBuilder, exp, interpret, reduce
from polyfuse.ir.visit import loads
from polyfuse.ops.schedules import default_schedule
from polyfuse.transforms.repair import solve_repair

OFFSET = 1e6


def _relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref) / np.abs(ref)))


@pytest.mark.parametrize("name, key", [("variance", "var"), ("layernorm_stats", "var"), ("inertia", "inertia")])
def test_fused_keeps_two_pass_accuracy_at_a_large_offset(name, key):
    op = ops.get(name)
    program = op.program("default")
    fused = default_schedule(name, "default", program).program
    for seed in (0, 1):
        inputs = op.inputs(seed, "default", None, OFFSET)
        ref = op.reference(inputs, "default", op.sizes("default"))[key]
        unfused_err = _relative_error(interpret(program, inputs)[key], ref)
        fused_err = _relative_error(interpret(fused, inputs)[key], ref)
        assert fused_err <= 10 * unfused_err, f"{name} seed={seed}: fused {fused_err:.3g}, unfused {unfused_err:.3g}"


def test_one_pass_formula_loses_everything_at_the_offset():
    """What the fusion avoids: E[x²] - E[x]² in f32 at offset 1e6 is off by orders of magnitude."""
    op = ops.get("variance")
    inputs = op.inputs(0, "default", None, OFFSET)
    x = inputs["x"]
    one_pass = (x * x).mean(axis=1, dtype=np.float32) - x.mean(axis=1, dtype=np.float32) ** 2
    ref = op.reference(inputs, "default", op.sizes("default"))["var"]
    assert _relative_error(one_pass, ref) > 10.0


def _solve(block):
    term = block.reduce_term()
    producers = [ld for ld in loads(term) if ld.tensor.name == "m"]
    return solve_repair(block.reducer, term, producers, reduce_vars={iv.var.name for iv in block.reduce_iters},
                        auxiliary=True)


def _chain(consumer_term):
    p = ProgramBuilder("chain")
    x = p.input("x", (4, 8), "f32")
    m = p.temp("m", (4,), "f32")
    s = p.output("s", (4,), "f32")
    with p.nest("s_m", i=4, j=reduce(8)) as (i, j):
        m[i] = m[i] + x[i, j]
    with p.nest("s_s", i=4, j=reduce(8)) as (i, j):
        s[i] = s[i] + consumer_term(x[i, j], m[i])
    return p.build().block("s_s")


def test_cubic_term_gets_three_auxiliaries_with_a_binomial_repair():
    r = _solve(_chain(lambda x, m: (x - m) * (x - m) * (x - m)))
    assert len(r.auxiliaries) == 3
    (m,), (m2,) = r.old, r.new
    a1, a2, a3 = r.state
    d = m2 - m
    assert sympy.expand(r.h - (r.t + a1 * d + a2 * d ** 2 + a3 * d ** 3)) == 0
    assert sympy.expand(r.auxiliaries[0].repair.h - (r.t + 2 * a2 * d + 3 * a3 * d ** 2)) == 0
    assert sympy.expand(r.auxiliaries[1].repair.h - (r.t + 3 * a3 * d)) == 0
    assert "binomial" in r.cases and "no single repair" in r.cases


def test_non_polynomial_term_without_a_repair_is_refused_with_the_reason():
    with pytest.raises(NoRepairFound, match="not a polynomial in m"):
        _solve(_chain(lambda x, m: exp(x * m) + exp(x - m) * x))


def test_explain_lists_the_auxiliary_reductions(capsys):
    from polyfuse.cli.commands import fusion_text
    from polyfuse.cli.stages import Subject

    text = fusion_text(Subject.of("variance", "default", {}))
    assert "auxiliary reductions" in text and "s_var_aux1" in text
    assert "Taylor coefficient" in text and "reference point" in text
