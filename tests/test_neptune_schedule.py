"""Issue acceptance: Neptune's attention schedule (App. A, Fig. 13) minus the fusion steps.

Tile the query and key loops, cache Q in shared memory under the query tile, bind
the outer loops to block indices and compute the score under the key tile, on
``attn_causal`` with sizes the tiles do not divide (S = 48, tiles 32 × 16).  The
scheduled program must interpret equal to the unscheduled one and to the op's
NumPy reference within its tolerance, and its trace must replay (JSON and Python)
to the same program.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse.ops as ops
from polyfuse.ir import interpret
from polyfuse.transforms import Schedule
from polyfuse.transforms.tree import loops_of

MODE = "prefill"
SIZES = {"B": 1, "Hq": 2, "Hkv": 2, "Sq": 48, "Skv": 48, "D": 8, "Dv": 8}
TILES = [32, 16]


def neptune_schedule(sch: Schedule) -> None:
    """Fig. 13 up to ``reverse_compute_at(b1, j0)``, plus the scopes of the two blocks it places."""
    qk = sch.get_block("qk")
    b, h, i, j, _ = sch.get_loops(qk)
    i0, j0, _, _ = sch.tile([i, j], TILES)
    sch.compute_at(sch.cache_read(qk, 0, "shared"), i0)
    for loop, tag in zip([b, h, i0], ["blockIdx.x", "blockIdx.y", "blockIdx.z"], strict=True):
        sch.bind(loop, tag)
    sch.reverse_compute_at(sch.get_block("score"), j0)
    sch.set_scope(qk, "shared")
    sch.set_scope("score", "shared")


@pytest.fixture(scope="module")
def op():
    return ops.get("attn_causal")


@pytest.fixture(scope="module")
def scheduled(op):
    sch = Schedule(op.program(MODE, **SIZES))
    neptune_schedule(sch)
    return sch


def test_schedule_shape(scheduled):
    p = scheduled.program
    assert [lp.var.name for lp in loops_of(p, "q_shared")] == ["b", "h", "i_0", "ax0", "ax1"]
    assert [lp.thread for lp in loops_of(p, "qk")[:3]] == ["blockIdx.x", "blockIdx.y", "blockIdx.z"]
    assert [lp.var.name for lp in loops_of(p, "qk")] == ["b", "h", "i_0", "j_0", "i_1", "j_1", "d"]
    assert [lp.var.name for lp in loops_of(p, "score")] == ["b", "h", "i_0", "j_0", "ax0", "ax1"]
    assert [str(lp.extent) for lp in loops_of(p, "score")[-2:]] == ["32", "16"]
    assert [str(b) for b in p.block("score").bindings][2:] == ["i_0 * 32 + ax0", "j_0 * 16 + ax1"]
    assert [str(b) for b in p.block("q_shared").bindings][2:] == ["i_0 * 32 + ax0", "ax1"]
    assert "cast(\"f32\", q_shared[b, h, i, d])" in str(p)
    assert {t.name: t.scope for t in p.tensors if t.scope != "global"} == {
        "q_shared": "shared", "qk": "shared", "score": "shared"}
    # the q tile is copied inside the query tile, before the key-tile loop that reads it
    i0_body = loops_of(p, "qk")[2].body
    assert [s.var.name for s in i0_body.stmts] == ["ax0", "j_0"]  # type: ignore[attr-defined]


def test_schedule_interprets_equal_to_plain_program_and_reference(op, scheduled):
    sizes = op.sizes(MODE, SIZES)
    inputs = op.inputs(seed=3, mode=MODE, sizes=sizes)
    got = interpret(scheduled.program, inputs)
    want = interpret(scheduled.original, inputs)
    np.testing.assert_array_equal(got["out"], want["out"])
    result = ops.compare(got, op.reference(inputs, MODE, sizes), op.tolerance(MODE, sizes))
    assert result.ok, result.line()


@pytest.mark.slow
def test_trace_replays_from_json_and_python(op, scheduled):
    text = scheduled.trace.python()
    print(text)
    assert text.splitlines()[:3] == [
        "sch.tile(loops=[sch.loop(\"qk\", \"i\"), sch.loop(\"qk\", \"j\")], sizes=[32, 16])",
        "sch.cache_read(block='qk', tensor=0, scope='shared')",
        "sch.compute_at(block='q_shared', loop=sch.loop(\"qk\", \"i_0\"))",
    ]
    plain = op.program(MODE, **SIZES)
    assert Schedule(plain).replay(scheduled.trace.to_json()).program == scheduled.program
    assert Schedule(plain).exec_python(text).program == scheduled.program
