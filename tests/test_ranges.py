"""Range facts (polyfuse/transforms/ranges.py): a sum of exp(e − m), m the max of the same e over the same
elements, lies in [1, n] — in plain programs, rolled over tiles by the fusions, and within a split; and no fact
where the subtracted value is not that max."""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.ir import ProgramBuilder, exp, interpret, maximum, reduce
from polyfuse.ops.schedules import default_schedule
from polyfuse.tiling import to_tiles
from polyfuse.transforms.ranges import value_ranges


def _facts(program) -> dict[str, tuple[float, float]]:
    return {r.name: (r.lo, r.hi) for r in value_ranges(program)}


def _softmax_like(*, max_of: str = "x", max_extent: int = 40, shift: str = "max", scale: float = 1.0):
    """xsum[i] = Σ_j exp(scale·x[i, j] − m[i]), m the max of ``max_of`` over ``max_extent`` keys (or the input c)."""
    p = ProgramBuilder("softmax_like")
    x = p.input("x", (8, 40), "f32")
    y = p.input("y", (8, 40), "f32")
    c = p.input("c", (8,), "f32")
    xmax = p.temp("xmax", (8,), "f32")
    xsum = p.output("xsum", (8,), "f32")
    source = x if max_of == "x" else y
    with p.nest("s_max", i=8, j=reduce(max_extent)) as (i, j):
        xmax[i] = maximum(xmax[i], source[i, j])
    m = xmax if shift == "max" else c
    with p.nest("s_sum", i=8, j=reduce(40)) as (i, j):
        xsum[i] = xsum[i] + exp(x[i, j] * scale - m[i]) if scale != 1.0 else xsum[i] + exp(x[i, j] - m[i])
    return p.build()


def test_a_sum_of_exp_minus_its_max_is_in_one_to_n():
    facts = _facts(_softmax_like())
    assert facts == {"xsum": (1.0, 40.0)}
    (fact,) = value_ranges(_softmax_like())
    assert "exp(0) = 1" in fact.proof and "40 elements" in fact.proof


@pytest.mark.parametrize("kwargs", [
    {"shift": "input"},       # exp(x − c), c an input: not the max of x
    {"max_of": "y"},          # the max of another tensor
    {"max_extent": 20},       # the max over the first 20 keys only, the sum over 40
    {"scale": 2.0},           # exp(2x − max x): terms up to exp(max x)
])
def test_no_fact_where_the_subtracted_value_is_not_the_max_of_the_same_elements(kwargs):
    assert _facts(_softmax_like(**kwargs)) == {}


def test_the_fact_holds_on_data():
    # The bounds on the values the program computes, ties and all-equal rows and one huge element included.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 40)).astype(np.float32) * 30
    x[1] = 5.0
    x[2, 7] = 1e30
    x[3, :] = np.round(x[3, :] / 40) * 40
    out = interpret(_softmax_like(), {"x": x, "y": x, "c": np.zeros(8, np.float32)})["xsum"]
    assert np.all((out >= 1.0) & (out <= 40.0)), out
    assert out[1] == 40.0 and out[2] == 1.0


@pytest.mark.parametrize(("name", "mode", "target", "expected"), [
    ("attn_norm_inside", "prefill", "cpp", {"row_sum": (1.0, 40.0)}),
    ("attn_norm_inside", "prefill", "cuda", {"row_sum": (1.0, 40.0)}),
    ("attn_causal", "prefill", "cuda", {"row_sum": (1.0, 40.0)}),
    ("attn_alibi", "prefill", "cuda", {"row_sum": (1.0, 40.0)}),
    ("attn_window", "prefill", "cuda", {"row_sum": (1.0, 40.0)}),
    ("attn_softcap", "prefill", "cuda", {"row_sum": (1.0, 40.0)}),
    ("attn_global", "decode", "cpp", {"row_sum_rf": (1.0, 10.0)}),  # each split's own sum, over its 10 keys
])
def test_fused_attention_keeps_the_fact(name, mode, target, expected):
    # Rolled over key tiles, the running sum is repaired by exp(m_old − m) with m_old the saved max: still in
    # [1, Skv] (the induction of the module docstring); the plain program has it too.
    op = ops.get(name)
    plain = op.program(mode)
    assert _facts(plain) == {"row_sum": (1.0, 40.0)}
    fused = default_schedule(name, mode, plain, target=target).program
    assert _facts(fused) == expected


def test_the_tile_program_carries_the_facts():
    op = ops.get("attn_norm_inside")
    tiles = to_tiles(default_schedule("attn_norm_inside", "prefill", op.program("prefill"), target="cuda").program)
    assert [(r.name, r.lo, r.hi) for r in tiles.ranges] == [("row_sum", 1.0, 40.0)]


def test_the_fact_holds_on_the_fused_programs_values():
    # The rolled running sum stays in [1, Skv] on every input variant and magnitude (the buffer keeps the last
    # query tile's final sums).
    op = ops.get("attn_norm_inside")
    fused = default_schedule("attn_norm_inside", "prefill", op.program("prefill"), target="cpp").program
    rows = []
    for variant in ("random", "leading_zeros", "ties", "monotone", "special"):
        for magnitude in op.magnitudes:
            inputs = op.inputs(2, "prefill", op.sizes("prefill"), magnitude, variant)
            rows.append(interpret(fused, inputs, return_temps=True)["row_sum"])
    values = np.concatenate([r.ravel() for r in rows])
    assert np.all((values >= 1.0) & (values <= 40.0))
