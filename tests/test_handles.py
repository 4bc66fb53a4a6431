"""Schedules that survive their own steps (issue 24): a loop handle taken before a step that privatizes its block
(split_k_update, rfactor, a rolling update over tiles) follows the block's partial ``B_rf``, predictably, and the
trace records the handle as it was resolved, so the printed trace replays."""

from __future__ import annotations

import shutil

import numpy as np

from polyfuse.differential import check_schedule
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
