"""Refusals that teach (issue 24): a refusal names the primitive the user called, the condition in the user's
terms, and what would make the call legal; long sympy expressions are shortened."""

from __future__ import annotations

import pytest
import sympy

from polyfuse.errors import IllegalTransform, NoRepairFound
from polyfuse.ir import ProgramBuilder, exp, maximum, reduce
from polyfuse.symbolic import abbreviate
from polyfuse.transforms import Schedule


def softmax_max():
    """max, sum of exponentials, then the max of the normalised exponentials (a chain of three)."""
    p = ProgramBuilder("softmax_max")
    n, m = 2, 11
    x = p.input("x", (n, m), "f32", finite=True)
    mx, s, c = p.temp("mx", (n,), "f32"), p.temp("s", (n,), "f32"), p.output("c", (n,), "f32")
    with p.nest("s_max", i=n, j=reduce(m)) as (i, j):
        mx[i] = maximum(mx[i], x[i, j])
    with p.nest("s_sum", i=n, j=reduce(m)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - mx[i])
    with p.nest("s_c", i=n, j=reduce(m)) as (i, j):
        c[i] = maximum(c[i], exp(x[i, j] - mx[i]) / s[i])
    return p.build()


def test_a_chain_fused_out_of_order_names_the_call_to_make_first():
    sch = Schedule(softmax_max())
    with pytest.raises(IllegalTransform, match=r"^rolling_update of block 's_c' under loop 'j' .*producer 's_sum' of "
                                               r"block 's_c' is not under loop 'j' yet.*fuse the producer first, "
                                               r"sch.rolling_update\('s_sum', sch.loop\(\"s_max\", \"j\"\)\)"):
        sch.rolling_update("s_c", sch.loop("s_max", "j"))
    sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    sch.rolling_update("s_c", sch.loop("s_max", "j"))  # in order, it fuses
    assert sch.fusion("s_c").repair is not None


def test_a_repair_refusal_names_the_primitive_call():
    p = ProgramBuilder("ratio")
    n, m = 2, 7
    x = p.input("x", (n, m), "f64")
    r0, r1 = p.temp("r0", (n,), "f64"), p.output("r1", (n,), "f64")
    with p.nest("s0", i=n, j=reduce(m)) as (i, j):
        r0[i] = r0[i] + x[i, j]
    with p.nest("s1", i=n, j=reduce(m)) as (i, j):
        r1[i] = r1[i] + x[i, j] / r0[i]
    sch = Schedule(p.build())
    with pytest.raises(NoRepairFound, match=r"^rolling_update of block 's1' under loop 'j' \(enclosing block 's0'\): "
                                            r"no repair for f = sum"):
        sch.rolling_update("s1", sch.loop("s0", "j"))


def test_abbreviate_keeps_short_text_and_both_ends_of_long_text():
    assert abbreviate(sympy.Symbol("t") * 2) == "2*t"
    long = sum(sympy.Symbol(f"x{k}") ** k for k in range(60))
    text = abbreviate(long, limit=80)
    assert len(text) < 110 and " … " in text and text.endswith(f"({len(str(long))} characters)")
    assert text.startswith(str(long)[:20]) and str(long)[-20:] in text
