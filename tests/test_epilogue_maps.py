"""A map read by both a fused consumer and the epilogue (issue 24, "Why": it had to be moved by hand
before the catalog's prefill recipe applied).

Plain attention written in the order of the math, with ``vf = f32(v)`` computed just before the weighted
sum ``o = Σ_j p·vf`` and read again by the epilogue's residual ``out = o / l + vf``: once ``rolling_update``
or ``split_k_update`` moves the consumer into the key loop, the map would run after its reader.  The fusions
move such a map's nest before the loop's where the dependences allow (one computation serves both
readers), else recompute a copy inside the consumer; a map that reads a result computed after the loop is
still refused, naming it.
"""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest

from polyfuse.differential import check_schedule
from polyfuse.errors import IllegalTransform
from polyfuse.ir import ProgramBuilder, exp, interpret, maximum, reduce, spatial
from polyfuse.transforms import Schedule

BACKENDS = ("fused", "tile", "cpp") if shutil.which("g++") else ("fused", "tile")


def attention(S: int = 12, D: int = 4, *, vmap: str = "own_nest", epilogue_reads_map: bool = True):
    """``vmap``: ``own_nest`` (the cast in a nest of its own), ``with_reduction`` (in one loop nest with a column
    sum of v: the nest moves), ``with_row_stat`` (in one loop nest with a copy of the row max, which cannot move
    before the loop that computes it), ``after_stat`` (scaled by a statistic of v computed after the key loop)."""
    p = ProgramBuilder("attention")
    q, k, v = (p.input(n, (S, D), "f32", finite=True) for n in "qkv")
    qk, sc, pe = (p.temp(n, (S, S), "f32") for n in ("qk", "sc", "pe"))
    m, lsum = p.temp("m", (S,), "f32"), p.temp("l", (S,), "f32")
    o, vf = p.temp("o", (S, D), "f32"), p.temp("vf", (S, D), "f32")
    vs = p.temp("vs", (D,), "f32") if vmap != "with_row_stat" else None
    out = p.output("out", (S, D), "f32")
    with p.nest("qk", i=S, j=S, d=reduce(D)) as (i, j, d):
        qk[i, j] = qk[i, j] + q[i, d] * k[j, d]
    with p.nest("score", i=S, j=S) as (i, j):
        sc[i, j] = qk[i, j] * 0.5
    with p.nest("row_max", i=S, j=reduce(S)) as (i, j):
        m[i] = maximum(m[i], sc[i, j])
    with p.nest("p_exp", i=S, j=S) as (i, j):
        pe[i, j] = exp(sc[i, j] - m[i])
    with p.nest("row_sum", i=S, j=reduce(S)) as (i, j):
        lsum[i] = lsum[i] + pe[i, j]
    if vmap == "with_reduction":
        with p.loop("e", D) as e, p.loop("j", S) as j:
            with p.block("vcast", j=spatial(S, j), e=spatial(D, e)) as (jj, ee):
                vf[jj, ee] = v[jj, ee] * 2.0
            with p.block("v_sum", e=spatial(D, e), j=reduce(S, j)) as (ee, jj):
                vs[ee] = vs[ee] + v[jj, ee]
    elif vmap == "with_row_stat":
        mc = p.output("mc", (S,), "f32")
        with p.loop("j", S) as j:
            with p.block("m_copy", j=spatial(S, j)) as (jj,):
                mc[jj] = m[jj] * 1.0
            with p.loop("e", D) as e:
                with p.block("vcast", j=spatial(S, j), e=spatial(D, e)) as (jj, ee):
                    vf[jj, ee] = v[jj, ee] * 2.0
    else:
        with p.nest("v_sum", e=D, j=reduce(S)) as (e, j):
            vs[e] = maximum(vs[e], v[j, e])
        with p.nest("vcast", j=S, e=D) as (j, e):
            vf[j, e] = v[j, e] * (vs[e] if vmap == "after_stat" else 2.0)
    with p.nest("pv", i=S, e=D, j=reduce(S)) as (i, e, j):
        o[i, e] = o[i, e] + pe[i, j] * vf[j, e]
    with p.nest("out", i=S, e=D) as (i, e):
        out[i, e] = o[i, e] / lsum[i] + vf[i, e] if epilogue_reads_map else o[i, e] / lsum[i]
    return p.build()


def reference(inputs: dict, vmap: str, epilogue_reads_map: bool = True) -> np.ndarray:
    q, k, v = (inputs[n].astype(np.float64) for n in "qkv")
    s = q @ k.T * 0.5
    e = np.exp(s - s.max(axis=1, keepdims=True))
    vs = v.sum(axis=0) if vmap == "with_reduction" else v.max(axis=0)
    vf = v * (vs if vmap == "after_stat" else 2.0)
    return e @ vf / e.sum(axis=1, keepdims=True) + (vf if epilogue_reads_map else 0.0)


def prefill(sch: Schedule, epilogue: bool = True) -> None:
    """The catalog's prefill recipe (polyfuse.ops.schedules._attention_prefill) for one head."""
    i, j, _ = sch.get_loops("qk")
    i0, j0, _, _ = sch.tile([i, j], [4, 4])
    sch.reverse_compute_at("score", j0)
    for block in ("row_max", "row_sum", "pv"):
        sch.rolling_update(block, j0)
    if epilogue:
        sch.reverse_compute_at("out", i0)
        sch.compact_buffers()


def decode(sch: Schedule) -> None:
    """The catalog's decode recipe (split-k over the keys)."""
    j0, _ = sch.split(sch.loop("qk", "j"), [3, None])
    sch.reverse_compute_at("score", j0)
    for block in ("row_sum", "pv"):
        sch.split_k_update(block, j0)


def _inputs(S: int, D: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    base = {n: rng.standard_normal((S, D)).astype(np.float32) for n in "qkv"}
    zeros = {n: a.copy() for n, a in base.items()}
    zeros["k"][: S // 2] = 0.0  # leading zero keys: ties in the scores
    huge = dict(base, q=base["q"] * 100.0)  # logits far beyond exp's range without the max
    return [base, zeros, huge]


@pytest.mark.parametrize(("recipe", "vmap"), [
    (prefill, "own_nest"), (decode, "own_nest"), (prefill, "with_reduction"), (decode, "with_reduction"),
    (functools.partial(prefill, epilogue=False), "with_row_stat"), (decode, "with_row_stat")])
def test_a_map_read_by_the_consumer_and_the_epilogue_fuses(recipe, vmap):
    plain = attention(vmap=vmap)
    sch = Schedule(plain)
    recipe(sch)
    pv = [b for b in sch.program.blocks() if b.name in ("pv", "pv_rf") and b.reducer is not None]
    reads = {ld.tensor.name for b in pv for ld in _loads(b)}
    if vmap != "with_row_stat":
        # moved, not copied: one cast serves the fused consumer and the epilogue
        assert "vf" in reads and [b.name for b in sch.program.blocks()][0] in ("v_sum", "vcast")
    else:
        # its nest reads the row max and cannot move before the loop: the consumer recomputes the cast, the
        # epilogue keeps the map
        assert "vf" not in reads and "vcast" in {b.name for b in sch.program.blocks()}
    sets = _inputs(12, 4, 0)
    report = check_schedule(plain, sch.program, sets, backends=BACKENDS)
    assert not report.findings, "\n".join(f.line() for f in report.findings)
    for inputs in sets:
        got = interpret(sch.program, inputs)["out"]
        assert np.allclose(got, reference(inputs, vmap), rtol=1e-4, atol=1e-4)


def test_the_epilogue_alone_keeps_its_map_where_it_was():
    plain = attention(epilogue_reads_map=False)
    sch = Schedule(plain)
    prefill(sch)
    inputs = _inputs(12, 4, 1)[0]
    assert np.allclose(interpret(sch.program, inputs)["out"], reference(inputs, "own_nest", False), rtol=1e-4,
                       atol=1e-4)


def test_a_map_reading_a_statistic_of_a_later_nest_is_refused_naming_it():
    sch = Schedule(attention(vmap="after_stat"))
    i, j, _ = sch.get_loops("qk")
    _, j0, _, _ = sch.tile([i, j], [4, 4])
    sch.reverse_compute_at("score", j0)
    sch.rolling_update("row_max", j0)
    sch.rolling_update("row_sum", j0)
    # v_sum, behind the map, is a reduction the consumer reads per element: a producer that is not fused yet
    with pytest.raises(IllegalTransform, match=r"producer 'v_sum' of block 'pv' is not under loop 'j_0'"):
        sch.rolling_update("pv", j0)


def _loads(block):
    from polyfuse.ir.visit import loads

    return loads(block.store.value)
