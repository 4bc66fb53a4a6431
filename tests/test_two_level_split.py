"""A split-k partial split again: keys in splits of blocks, each split's keys in splits again (the warps of a
block), then rolled over steps.

The second ``split_k_update`` combines partials whose own terms an earlier fusion guarded: the first split's
local term is ``select(row_max_rf == -inf, 0, exp(score - row_max_rf)·v)``, the identity on a split whose keys
are all masked.  A split of such a split whose keys are all masked (a sliding window far from it) is therefore
the identity in the program being transformed, and the inner combine must keep it so; it used to compute
``exp(-inf - -inf)`` there, as for a plain term whose row is all masked (NaN on every output of attn_window).
Checked with the differential oracle (interpreter, tile program, host C++) on random and edge inputs, and on
the structure of the inner combine.
"""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.differential import check_schedule
from polyfuse.ir.expr import Const
from polyfuse.ir.visit import walk_expr
from polyfuse.transforms.schedule import Schedule

VARIANTS = ("random", "leading_zeros", "ties", "special")
DECODE = ("attn_global", "attn_norm_inside", "attn_causal", "attn_window", "attn_alibi", "attn_softcap")


def two_level(name: str, sizes: dict, warps: int = 2, steps: int = 2, tile: int = 16) -> Schedule:
    """``qk``'s keys as splits x warps x steps x tile: split-k over the splits, split-k again over the warps of a
    split, rolling over the steps."""
    op = ops.get(name)
    sch = Schedule(op.program("decode", **sizes))
    _, h, i, j, _ = sch.get_loops("qk")
    split, warp, step, keys = sch.split(j, [None, warps, steps, tile])
    sch.reorder([i, h, split, warp, step, keys])
    sch.reverse_compute_at("score", split)
    sch.split_k_update("row_sum", split)
    sch.split_k_update("pv", split, factor_axis=len(sch.program.tensor("pv").shape) - 1)
    sch.reverse_compute_at("score", sch.loop("qk", warp.name))
    sch.split_k_update("row_sum_rf", sch.loop("qk", warp.name))
    sch.split_k_update("pv_rf", sch.loop("qk", warp.name), factor_axis=len(sch.program.tensor("pv_rf").shape) - 1)
    sch.reverse_compute_at("score", sch.loop("qk", step.name))
    for block in ("row_max_rf_rf", "row_sum_rf_rf", "pv_rf_rf"):
        sch.rolling_update(block, sch.loop("qk", step.name))
    return sch


@pytest.mark.parametrize("name", DECODE)
def test_a_split_split_again_equals_the_plain_program(name):
    op = ops.get(name)
    sizes = op.sizes("decode", {"Skv": 256})  # 4 splits x 2 warps x 2 steps x 16 keys
    sch = two_level(name, sizes)
    inputs = [{k: np.asarray(a) for k, a in op.inputs(0, "decode", sizes, m, v).items()}
              for m in op.magnitudes for v in VARIANTS]
    report = check_schedule(op.program("decode", **sizes), sch.program, inputs, sizes=[None] * len(inputs),
                            backends=("fused", "tile", "cpp"))
    assert not report.wrong, "\n".join(f.line() for f in report.wrong)


def test_the_inner_combine_keeps_a_fully_masked_split_of_a_split():
    # attn_window at 256 keys: its window (W = 24 at the test sizes) leaves whole splits of 32 keys masked. The
    # inner combine's exact branch (the partial's max equals the split's) is not lifted where the split's max is
    # -inf: there every partial is the identity and the sum of them is kept, 0; the outer combine (of the plain
    # term's splits, where a row all masked is NaN in the plain program too) keeps its lift.
    sch = two_level("attn_window", ops.get("attn_window").sizes("decode", {"Skv": 256}))
    inner = sch.program.block("pv_rf").store.value
    outer = sch.program.block("pv").store.value
    def lifts(e) -> bool:
        return any(isinstance(n, Const) and n.value == -np.inf for n in walk_expr(e))
    assert not lifts(inner) and lifts(outer)
