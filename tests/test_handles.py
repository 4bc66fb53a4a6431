"""Schedules that survive their own steps (issue 24): a loop handle taken before a step that privatizes its block
(split_k_update, rfactor, a rolling update over tiles) follows the block's partial ``B_rf``, predictably, and the
trace records the handle as it was resolved, so the printed trace replays.  A handle no step can carry over
(a loop split replaced, a block a fusion inlined, a loop written by hand under a block that became a combine)
raises IllegalTransform naming the step that changed it and the handle to use now."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polyfuse.differential import check_schedule
from polyfuse.errors import IllegalTransform
from polyfuse.transforms import Schedule
from polyfuse.transforms.schedule import LoopRef
from test_siblings import cosine, softmax_and_rms

BACKENDS = ("fused", "tile", "cpp") if shutil.which("g++") else ("fused", "tile")


def _inputs(program, seed=0):
    rng = np.random.default_rng(seed)
    data = {t.name: rng.standard_normal(tuple(int(d.value) for d in t.shape)).astype(t.dtype.numpy)
            for t in program.inputs}
    data[program.inputs[0].name][0, :3] = 0.0  # leading zeros
    return data


def test_split_k_then_roll_with_handles_taken_before():
    """FlashDecoding with rolling splits, written with the handles split returned."""
    plain = softmax_and_rms(2, 16)
    sch = Schedule(plain)
    splits, steps, _ = sch.split(sch.loop("s_max", "j"), [None, 2, 4])
    for b in ("s_sq", "s_sum"):  # the sibling first: split_k_update of s_sum privatizes s_max
        sch.split_k_update(b, splits)
    sch.rolling_update("s_sum_rf", steps)  # steps was taken as (s_max, j_1); s_max is now the combine
    lines = str(sch.trace).splitlines()
    assert lines[-1] == "sch.rolling_update(block='s_sum_rf', loop=sch.loop(\"s_max_rf\", \"j_1\"))"
    assert Schedule(plain).exec_python(str(sch.trace)).program == sch.program
    assert Schedule(plain).replay(sch.trace.to_json()).program == sch.program
    report = check_schedule(plain, sch.program, [_inputs(plain, k) for k in range(2)], backends=BACKENDS)
    assert not report.wrong, "\n".join(f.line() for f in report.wrong)  # the tile stage may refuse these nests


def test_rfactor_moves_handles_of_the_reduction():
    plain = cosine(2, 12)
    sch = Schedule(plain)
    outer, inner = sch.split(sch.loop("s_nx", "j"), [3, None])
    sch.rfactor(outer)
    sch.unroll(inner)  # (s_nx, j_1) follows the reduction into s_nx_rf: s_nx, the combine, has no j_1
    assert sch.trace.steps[-1].args[0] == ("loop", LoopRef("s_nx_rf", "j_1"))
    report = check_schedule(plain, sch.program, [_inputs(plain)], backends=BACKENDS)
    assert not report.wrong, "\n".join(f.line() for f in report.wrong)  # the tile stage may refuse these nests
    try:
        sch.fuse_siblings("s_ny", inner)
    except Exception as err:  # noqa: BLE001 - the refusal is the point
        assert "'s_nx_rf' holds the partials of a privatized reduction" in str(err)
        assert "fuse the siblings before privatizing it" in str(err)
    else:
        raise AssertionError("a sibling of a partial was placed")


def test_handles_written_by_hand_mean_the_current_program():
    sch = Schedule(cosine(2, 12))
    sch.split(sch.loop("s_nx", "j"), [3, None])
    sch.rfactor(sch.loop("s_nx", "j_0"))
    assert [r.name for r in sch.get_loops("s_nx")] == ["i", "j_0"]  # the combine's own loops
    assert sch.loop("s_nx", "j_0") == LoopRef("s_nx", "j_0")


def _softmax_sum():
    from polyfuse.ir import ProgramBuilder, exp, maximum, reduce

    p = ProgramBuilder("softmax_sum")
    x = p.input("x", (2, 8), "f32")
    m, e, s = p.temp("m", (2,), "f32"), p.temp("e", (2, 8), "f32"), p.output("s", (2,), "f32")
    with p.nest("s_max", i=2, j=reduce(8)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_exp", i=2, j=8) as (i, j):
        e[i, j] = exp(x[i, j] - m[i])
    with p.nest("s_sum", i=2, j=reduce(8)) as (i, j):
        s[i] = s[i] + e[i, j]
    return p.build()


def test_a_loop_written_by_hand_after_split_k_names_the_partial():
    sch = Schedule(softmax_and_rms(2, 16))
    j0, _ = sch.split(sch.loop("s_max", "j"), [2, None])
    for b in ("s_sq", "s_sum"):
        sch.split_k_update(b, j0)
    with pytest.raises(IllegalTransform, match=r"step 3 \(sch\.split_k_update\(block='s_sum'.*privatized block 's_max'"
                       r".*the loop is sch\.loop\(\"s_max_rf\", \"j_1\"\)"):
        sch.loop("s_max", "j_1")
    assert sch.loop("s_max_rf", "j_1") == LoopRef("s_max_rf", "j_1")


def test_a_handle_to_a_loop_that_split_replaced_says_the_new_loops():
    sch = Schedule(cosine(2, 12))
    j = sch.loop("s_nx", "j")
    sch.split(j, [3, None])
    with pytest.raises(IllegalTransform, match=r"sch\.loop\('s_nx', 'j'\), taken after 0 step\(s\), no longer names a "
                       r"loop; step 1 \(sch\.split\(.*replaced it: block 's_nx' is inside loops i, j_0, j_1 since "
                       r"\(new: j_0, j_1\)"):
        sch.unroll(j)
    with pytest.raises(IllegalTransform, match=r"its loops: i, j_0, j_1; step 1 .* replaced it"):
        sch.loop("s_nx", "j")
    assert len(sch.trace) == 1  # the refused step is not recorded


def test_a_block_a_fusion_inlined_says_which_step_removed_it():
    sch = Schedule(_softmax_sum())
    ej = sch.loop("s_exp", "j")
    sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    with pytest.raises(IllegalTransform, match=r"no block 's_exp'.*step 1 \(sch\.rolling_update\(block='s_sum'.*\) "
                       "removed it"):
        sch.get_block("s_exp")
    with pytest.raises(IllegalTransform, match=r"sch\.loop\('s_exp', 'j'\).*no longer names a loop; step 1 .*removed"):
        sch.unroll(ej)
    # the consumer keeps its name and its loop's: it runs under the producer's j
    assert sch.loop("s_sum", "j") == LoopRef("s_sum", "j")


def test_handles_that_stay_valid_across_a_rolling_update_keep_working():
    plain = _softmax_sum()
    sch = Schedule(plain)
    i, j = sch.loop("s_sum", "i"), sch.loop("s_max", "j")
    sch.rolling_update("s_sum", j)
    sch.parallel(i)  # (s_sum, i) is the fused nest's i now: the same name
    assert sch.trace.steps[-1].args[0] == ("loop", LoopRef("s_sum", "i"))
    report = check_schedule(plain, sch.program, [_inputs(plain)], backends=BACKENDS)
    assert not report.wrong, "\n".join(f.line() for f in report.wrong)
