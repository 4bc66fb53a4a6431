"""Scaled state repairs (issue 24 item 4): a term exp(x - m)·P(x - m), P a polynomial, with m the
running max of x, gets auxiliary accumulators Σ exp(x - m)·P^(k)(x - m)/k! that every update
rescales by exp(m - m'), as a softmax's Σ exp(x - m) is; the fused program matches the plain one and
NumPy (interpreter).  Inputs that may hold ±inf are refused (the plain term there is 0·inf = NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse.errors import NoRepairFound
from polyfuse.ir import ProgramBuilder, exp, interpret, maximum, minimum, reduce
from polyfuse.transforms import Schedule


def _program(power: int, n: int, rows: int = 4, finite: bool = True, producer: str = "max"):
    p = ProgramBuilder("moment")
    x = p.input("x", (rows, n), "f32", finite=finite)
    m = p.temp("m", (rows,), "f32")
    s = p.output("s", (rows,), "f32")
    with p.nest("s_m", i=rows, j=reduce(n)) as (i, j):
        m[i] = maximum(m[i], x[i, j]) if producer == "max" else minimum(m[i], x[i, j])
    with p.nest("s_s", i=rows, j=reduce(n)) as (i, j):
        u = x[i, j] - m[i]
        term = u
        for _ in range(power - 1):
            term = term * u
        s[i] = s[i] + exp(u) * term
    return p.build()


def _fused(program):
    sch = Schedule(program)
    sch.rolling_update("s_s", sch.loop("s_m", "j"))
    return sch.program


def _inputs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for scale in (1.0, 30.0, 1e-30, 1e30):
        out.append((rng.standard_normal((4, n)) * scale).astype(np.float32))
    x = rng.standard_normal((4, n)).astype(np.float32)
    x[0, : max(1, n // 2)] = 0.0          # leading zeros
    x[1, :] = 2.5                          # all ties
    x[2, ::2] = x[2].max()                 # ties at the max
    x[3] = np.sort(x[3])                   # the max moves at every step
    out.append(x)
    return out


@pytest.mark.parametrize("power", [1, 2])
@pytest.mark.parametrize("n", [1, 7, 8, 13])
def test_scaled_state_matches_plain_and_numpy(power, n):
    program = _program(power, n)
    fused = _fused(program)
    assert any(b.name == "s_s_aux1" for b in fused.blocks())
    for seed in (0, 1):
        for x in _inputs(n, seed):
            plain = interpret(program, {"x": x})["s"].astype(np.float64)
            got = interpret(fused, {"x": x})["s"].astype(np.float64)
            xd = x.astype(np.float64)
            u = xd - xd.max(axis=1, keepdims=True)
            with np.errstate(over="ignore", invalid="ignore"):
                ref = (np.exp(u) * u ** power).sum(axis=1)
            # Every term of the repair has the sign of the state it updates (u <= 0 at the running max,
            # δ >= 0), so nothing cancels: the operator-style tolerance of an f32 sum of n terms.
            tol = 8 * n * np.finfo(np.float32).eps
            same = np.isnan(plain) == np.isnan(got)
            assert same.all(), (power, n, x, plain, got)
            ok = ~np.isnan(plain) & np.isfinite(ref)
            assert np.all(np.abs(got[ok] - ref[ok]) <= tol * np.abs(ref[ok]) + 1e-30), (power, n, x, got, ref)
            assert np.all(np.abs(got[ok] - plain[ok]) <= 2 * tol * np.abs(plain[ok]) + 1e-30)


def test_auxiliary_terms_keep_their_exponential_whole():
    fused = _fused(_program(1, 8))
    text = str(fused.block("s_s_aux1").store.value)
    assert "exp(x[i, j] - m[i])" in text and "exp(-" not in text.replace("exp(x[i, j] - m[i])", "")


def test_inputs_that_may_be_infinite_are_refused():
    with pytest.raises(NoRepairFound, match="finite=True"):
        _fused(_program(1, 8, finite=False))


def test_a_min_producer_is_refused_because_its_scale_grows():
    with pytest.raises(NoRepairFound, match=r"not provably in \[0, 1\]|not a polynomial"):
        _fused(_program(1, 8, producer="min"))
