"""The differential oracle: its rules on hand-made values, and on right and wrong fusions."""

from __future__ import annotations

import numpy as np
import pytest

from ir_programs import softmax_sum
from polyfuse.differential import (
    ACCURACY_FACTOR, CRASH, REFUSED, WRONG, Finding, Report, Tally, apply_step, check_schedule, guarded, mismatch,
    refusal_class,
)
from polyfuse.errors import InternalError, NoRepairFound
from polyfuse.ir import ProgramBuilder, exp, maximum, reduce
from polyfuse.transforms import Schedule

U64 = 2.0 ** -53


def _p(*values, bound=1e-15):
    v = np.array(values, np.float64)
    return v, np.full(v.shape, bound)


# ------------------------------------------------------------------ the rules, elementwise

def test_equal_values_within_both_bounds_pass():
    assert mismatch("r", _p(1.0, 2.0), np.array([1.0 + 1e-15, 2.0]), np.full(2, 1e-15)) is None


@pytest.mark.parametrize("got, label", [
    (np.nan, "non-finite"), (np.inf, "non-finite"), (1.0 + 1e-12, "value"),
])
def test_a_finite_plain_value_needs_a_close_finite_one(got, label):
    text = mismatch("r", _p(1.0), np.array([got]), np.array([1e-15]))
    assert text and text.startswith(label) and "r[0]" in text


@pytest.mark.parametrize("plain, got", [(np.nan, 0.0), (np.inf, np.nan), (-np.inf, np.inf), (np.inf, 1e308)])
def test_non_finite_plain_values_must_be_reproduced(plain, got):
    text = mismatch("r", (np.array([plain]), np.array([0.0])), np.array([got]), np.array([0.0]))
    assert text and text.startswith("class")


def test_an_overflowed_plain_value_binds_no_class():
    # Π exp(x) with inf·0 in the tiles of an rfactor but not in the plain order (fuzzer find, seed 801057)
    overflowed = (np.array([np.inf, np.inf]), np.array([np.inf, 0.0]))
    text = mismatch("r", overflowed, np.array([np.nan, np.nan]), np.array([np.inf, np.inf]))
    assert text and text.startswith("class") and "r[1]" in text


def test_an_overflowed_finite_plain_value_binds_no_class():
    # x²/Π exp(x): the plain product overflowed to inf and the quotient is 0; an rfactor's partial of it
    # underflowed to 0 before meeting exp(991) and gave NaN (fuzzer find, seed 237000). A finite value with a
    # finite bound still needs a finite one.
    overflowed = (np.array([0.0, 0.0]), np.array([np.inf, 0.0]))
    text = mismatch("r", overflowed, np.array([np.nan, np.nan]), np.array([np.inf, np.inf]))
    assert text and text.startswith("non-finite") and "r[1]" in text


def test_nan_for_nan_and_inf_for_inf_pass():
    plain = (np.array([np.nan, np.inf, -np.inf]), np.zeros(3))
    assert mismatch("r", plain, np.array([np.nan, np.inf, -np.inf]), np.zeros(3)) is None


def test_a_scheduled_program_less_accurate_than_the_plain_one_is_flagged():
    p = _p(1.0, bound=1e-15)
    assert mismatch("r", p, np.array([1.0]), np.array([ACCURACY_FACTOR * 2 * 1e-15 * 0.9]), steps=1) is None
    text = mismatch("r", p, np.array([1.0]), np.array([1e-9]), steps=1)
    assert text and text.startswith("accuracy")
    text = mismatch("r", p, np.array([1.0]), np.array([np.inf]), steps=1)
    assert text and text.startswith("unbounded")
    # a value the plain bound does not explain, accepted by rule 2 only because the fused bound is huge
    text = mismatch("r", p, np.array([0.5]), np.array([np.inf]), steps=1)
    assert text and text.startswith("inaccurate value")


def test_exact_plain_outputs_allow_a_few_roundings():
    assert mismatch("r", _p(3.0, bound=0.0), np.array([3.0]), np.array([4 * U64 * 3.0])) is None


def test_an_exact_plain_output_allows_one_rescale_per_step():
    # a min consumer of a term saturated at a constant: the plain program selects exactly (E_p = 0), the
    # rolling repair t + g(r') - g(r) rounds once per step (fuzzer find, seed 400498)
    exact = _p(2.0, bound=0.0)
    per_step = 2 * 2 * U64 * 2.0
    assert mismatch("r", exact, np.array([2.0]), np.array([16 * per_step]), steps=16) is None
    text = mismatch("r", exact, np.array([2.0]), np.array([ACCURACY_FACTOR * 18 * U64 * 2.0]), steps=16)
    assert text and text.startswith("accuracy")


def test_a_backend_may_reorder_where_the_scheduled_bound_is_infinite():
    # x / max(x·(-0.0)): the max of +0 and -0 depends on the order of the reduction (fuzzer find, seed
    # 504201); a product that overflowed at one step, then met 0, is NaN in one order and inf in another
    # (seed 601310)
    scheduled = (np.array([-np.inf, np.nan, np.inf]), np.array([np.inf, np.inf, 0.0]))
    assert mismatch("r", scheduled, np.array([np.inf, np.inf, np.inf]), None, tolerance=np.zeros(3)) is None
    text = mismatch("r", scheduled, np.array([-np.inf, np.nan, -np.inf]), None, tolerance=np.zeros(3))
    assert text and text.startswith("class") and "r[2]" in text
    # plain against scheduled: rule 1 as it is, where the plain bound is finite
    text = mismatch("r", scheduled, np.array([np.inf, np.inf, -np.inf]), np.zeros(3))
    assert text and text.startswith("class") and "r[2]" in text


def test_backends_are_compared_with_a_tolerance():
    fused = _p(1.0)
    assert mismatch("r", fused, np.array([1.0 + 1e-16]), None, tolerance=np.array([2e-16])) is None
    text = mismatch("r", fused, np.array([1.0 + 1e-9]), None, tolerance=np.array([2e-16]))
    assert text and text.startswith("value")


# ------------------------------------------------------------------ outcomes of a step

def test_guarded_tells_refusals_from_crashes():
    def refuse():
        raise NoRepairFound("no repair for block 's1' over loop 'j' (3 steps)")

    def crash():
        raise InternalError("an invariant")

    _, found = guarded("rolling_update", refuse)
    assert found.kind == REFUSED and found.reason == "NoRepairFound: no repair for block '…' over loop '…' (…)"
    _, found = guarded("tile", crash)
    assert found.kind == CRASH and found.reason.startswith("InternalError at ")
    _, found = guarded("tile", lambda: {}["missing"])
    assert found.kind == CRASH and found.reason.startswith("KeyError")


def test_refusal_classes_blank_names_and_numbers():
    a = refusal_class(NoRepairFound("block 's1' at loop 'j' of extent 17 has 3 steps"))
    b = refusal_class(NoRepairFound("block 's2' at loop 'k' of extent 5 has 1 steps"))
    assert a == b


def test_a_refused_step_leaves_the_schedule_as_it_was():
    sch = Schedule(softmax_sum(symbolic=False, n=2, m=4))
    found = apply_step(sch, 'sch.split(sch.loop("s_max", "nope"), [None, 2])')
    assert found.kind == REFUSED and found.stage == "split" and "nope" in found.detail
    assert len(sch.trace) == 0
    assert apply_step(sch, 'sch.rolling_update("s_sum", sch.loop("s_max", "j"))') is None
    found = apply_step(sch, "sch.no_such_primitive()")
    assert found.kind == CRASH and "AttributeError" in found.reason


# ------------------------------------------------------------------ whole checks

def _softmax_sum(init=None):
    p = ProgramBuilder("softmax_sum")
    x = p.input("x", (2, 5), "f32")
    m, s = p.temp("m", (2,), "f32"), p.output("s", (2,), "f32")
    with p.nest("s_max", i=2, j=reduce(5)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_sum", i=2, j=reduce(5), **({} if init is None else {"init": init})) as (i, j):
        s[i] = s[i] + exp(x[i, j] - m[i])
    return p.build()


def _inputs():
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    x[1, :2] = 0.0
    return [{"x": x}, {"x": np.where(np.arange(5) == 2, np.inf, x).astype(np.float32)}]


def test_a_right_fusion_is_equal_at_every_stage():
    program = _softmax_sum()
    sch = Schedule(program)
    sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    report = check_schedule(program, sch.program, _inputs(), backends=("fused", "tile"))
    assert report.findings == [] and report.checked == 4


def test_a_wrong_program_is_found():
    # what a fusion that drops the consumer's init computes (issue 20, class 3)
    program, dropped = _softmax_sum(init=1.0), _softmax_sum()
    report = check_schedule(program, dropped, _inputs()[:1], backends=("fused",))
    assert [(f.kind, f.stage, f.reason) for f in report.findings] == [(WRONG, "fused", "value")]
    assert "plain" in report.findings[0].detail and "scheduled" in report.findings[0].detail


def test_a_stage_that_refuses_is_counted_with_its_stage():
    program = _softmax_sum()
    sch = Schedule(program)
    sch.split(sch.loop("s_max", "j"), [None, 1, 2])  # x[i, (j_0 + j_1)·2 + j_2] is not a tile slice
    report = check_schedule(program, sch.program, _inputs()[:1], backends=("fused", "tile"))
    assert report.findings and all(f.kind == REFUSED and f.stage == "tile" for f in report.findings)


def test_tally_counts_outcomes_and_the_fusion_fraction():
    tally = Tally()
    tally.add(fusion_steps=(2, 2), applied=True, findings=[], report=Report(checked=3))
    tally.add(fusion_steps=(1, 0), applied=False, findings=[Finding(REFUSED, "rolling_update", "NoRepairFound", "")],
              report=None)
    tally.add(fusion_steps=(1, 1), applied=True, findings=[Finding(WRONG, "fused", "value", "")], report=None)
    tally.add(fusion_steps=(0, 0), applied=True, findings=[Finding(CRASH, "cpp", "InternalError", "")], report=None)
    assert (tally.programs, tally.equal, tally.refused_programs, tally.wrong, tally.crashed) == (4, 1, 1, 1, 1)
    assert (tally.with_fusion, tally.fused, tally.fusion_steps) == (3, 2, [4, 3])
    text = tally.summary()
    assert "fusion fraction 66.7%" in text and "wrong at fused: value" in text
