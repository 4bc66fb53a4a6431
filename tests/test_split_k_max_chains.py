"""Split-k update of a second consumer of a max (issue 24): once the max is privatized, a later consumer is
cut into parts ``j // ⌈E/S⌉`` of its own; that is exact under the max's guard only where the parts are the
max's splits, none empty, which isl proves; otherwise the refusal names what failed."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest

from polyfuse import tiling
from polyfuse.errors import IllegalTransform
from polyfuse.ir import ProgramBuilder, exp, interpret, maximum, reduce
from polyfuse.pipeline import build
from polyfuse.tiling import to_tiles
from polyfuse.transforms import Schedule

ROWS = 5


def _max_chain(name: str, extent: int, consumers, *, extras=(), m_output: bool = False, mask=None):
    """m = max_j x[i, j] (``mask(i, j)`` its where), then each consumer ``(block, output, width, term)``:
    ``output[i(, d)] += term(x, m, extras, i, j, d)`` over j, with ``d`` an extra spatial iteration of
    ``width`` (None for none); ``extras`` name more inputs ``(name, shape)``."""
    p = ProgramBuilder(name)
    x = p.input("x", (ROWS, extent), "f32")
    more = {n: p.input(n, shape, "f32") for n, shape in extras}
    m = p.output("m", (ROWS,), "f32") if m_output else p.temp("m", (ROWS,), "f32")
    outs = {out: p.output(out, (ROWS,) if width is None else (ROWS, width), "f32")
            for _, out, width, _ in consumers}
    with p.nest("s_m", i=ROWS, j=reduce(extent)) as (i, j):
        if mask is not None:
            p.where(mask(i, j))
        m[i] = maximum(m[i], x[i, j])
    for block, out, width, term in consumers:
        if width is None:
            with p.nest(block, i=ROWS, j=reduce(extent)) as (i, j):
                outs[out][i] = outs[out][i] + term(x, m, more, i, j, None)
        else:
            with p.nest(block, i=ROWS, d=width, j=reduce(extent)) as (i, d, j):
                outs[out][i, d] = outs[out][i, d] + term(x, m, more, i, j, d)
    return p.build(), tuple(c[0] for c in consumers)


def _e(x, m, i, j):
    return exp(x[i, j] - m[i])


def _softmax_squares(extent: int):
    """Softmax's denominator and a second consumer Σ exp(x - m)²."""
    return _max_chain("softmax_squares", extent, [
        ("s_s", "s", None, lambda x, m, _, i, j, d: _e(x, m, i, j)),
        ("s_q", "q", None, lambda x, m, _, i, j, d: _e(x, m, i, j) * _e(x, m, i, j))])


def _logsumexp_weighted(extent: int):
    """Logsumexp's sum and a weighted sum Σ y·exp(x - m) (fused first: the sum is the second consumer)."""
    return _max_chain("logsumexp_weighted", extent, [
        ("s_w", "w", None, lambda x, m, more, i, j, d: more["y"][j] * _e(x, m, i, j)),
        ("s_s", "s", None, lambda x, m, _, i, j, d: _e(x, m, i, j))], extras=[("y", (extent,))], m_output=True)


def _decode_pair(extent: int):
    """Attention decode: the row sum, then the output Σ_j exp(s - m)·v[j, d] (one more spatial iteration)."""
    return _max_chain("decode_pair", extent, [
        ("s_s", "s", None, lambda x, m, _, i, j, d: _e(x, m, i, j)),
        ("s_o", "o", 3, lambda x, m, more, i, j, d: _e(x, m, i, j) * more["v"][j, d])], extras=[("v", (extent, 3))])


PROGRAMS = {"softmax_squares": _softmax_squares, "logsumexp_weighted": _logsumexp_weighted,
            "decode_pair": _decode_pair}
CASES = [(name, extent, splits) for name in PROGRAMS for extent, splits in ((10, 3), (13, 2), (13, 4), (7, 3),
                                                                            (12, 5), (3, 2))]


@functools.cache
def _fused(name: str, extent: int, splits: int):
    program, consumers = PROGRAMS[name](extent)
    sch = Schedule(program)
    j0, _ = sch.split(sch.loop("s_m", "j"), [splits, None])
    for consumer in consumers:
        sch.split_k_update(consumer, j0)
    return program, sch.program


def _inputs(name: str, extent: int, seed: int) -> dict[str, np.ndarray]:
    """Rows of plain data, leading zeros, huge and tiny values, -inf elements, a row of -inf, +inf, NaN."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, extent)).astype(np.float32)
    x[1, : extent // 2 + 1] = 0.0
    x[2] *= np.float32(3e4)
    x[2, 0] = np.float32(1e-38)
    x[3, extent - 1] = -np.inf
    if seed == 1:
        x[3] = -np.inf
        x[4, extent // 2] = np.inf
    if seed == 2:
        x[4, 0] = np.nan
    others = {"logsumexp_weighted": {"y": rng.standard_normal(extent).astype(np.float32)},
              "decode_pair": {"v": rng.standard_normal((extent, 3)).astype(np.float32)}}
    return {"x": x, **others.get(name, {})}


def _numpy(name: str, inputs: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each output in f64 with its scale, the same sum of absolute terms (a signed sum may cancel)."""
    x = inputs["x"].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = x.max(axis=1)
        e = np.exp(x - m[:, None])
        out = {"s": (e.sum(axis=1),) * 2}
        if name == "softmax_squares":
            out["q"] = ((e * e).sum(axis=1),) * 2
        if name == "logsumexp_weighted":
            y = inputs["y"].astype(np.float64)
            out |= {"m": (m, np.abs(m)), "w": ((e * y).sum(axis=1), (e * np.abs(y)).sum(axis=1))}
        if name == "decode_pair":
            v = inputs["v"].astype(np.float64)
            out["o"] = (e @ v, e @ np.abs(v))
    return out


def _check(got: dict[str, np.ndarray], plain: dict[str, np.ndarray],
           ref: dict[str, tuple[np.ndarray, np.ndarray]], what: str):
    for key, (want, scale) in ref.items():
        g, u = np.asarray(got[key], np.float64), np.asarray(plain[key], np.float64)
        assert np.array_equal(np.isnan(g), np.isnan(u)) and np.array_equal(np.isinf(g), np.isinf(u)), \
            f"{what} {key}: non-finite values differ from the unfused program:\n{g}\n{u}"
        assert np.array_equal(g[np.isinf(g)], u[np.isinf(u)]), f"{what} {key}: infinities of other signs"
        finite = np.isfinite(u)
        tol = 1e-5 * scale[finite] + 1e-37
        assert np.all(np.abs(g[finite] - u[finite]) <= tol), f"{what} {key}: fused {g} unfused {u}"
        rows = np.isfinite(want)
        assert np.all(np.abs(g[rows] - want[rows]) <= 1e-5 * scale[rows] + 1e-37), \
            f"{what} {key}: fused {g} numpy {want}"


@pytest.mark.parametrize("name, extent, splits", CASES)
def test_second_consumer_of_a_max_matches_numpy_and_the_unfused_program(name, extent, splits):
    program, fused = _fused(name, extent, splits)
    tiles = to_tiles(fused)
    for seed in (0, 1, 2):
        inputs = _inputs(name, extent, seed)
        plain, ref = interpret(program, inputs), _numpy(name, inputs)
        _check(interpret(fused, inputs), plain, ref, f"{name} E={extent} S={splits} seed={seed} fused")
        _check(tiling.interpret(tiles, inputs), plain, ref, f"{name} E={extent} S={splits} seed={seed} tile")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")
@pytest.mark.parametrize("name, extent, splits", [(n, e, s) for n, e, s in CASES if (e, s) in ((13, 4), (12, 5))])
def test_second_consumer_of_a_max_host_cpp_matches(name, extent, splits):
    program, fused = _fused(name, extent, splits)
    kernel = build(fused, werror=True)
    for seed in (0, 1, 2):
        inputs = _inputs(name, extent, seed)
        _check(kernel.run(inputs), interpret(program, inputs), _numpy(name, inputs),
               f"{name} E={extent} S={splits} seed={seed} cpp")


def test_second_consumer_reads_its_split_of_the_max_under_the_guard():
    _, fused = _fused("softmax_squares", 13, 4)
    local = fused.block("s_q_rf")
    text = str(local.store.value)
    assert "m_rf[i, j_0]" in text and "-INF" in text, text


def test_parts_that_are_not_the_splits_are_refused_with_the_reason():
    """9 elements split [None, 4] gives 3 splits of 4, while the consumer's parts j // ⌈9/3⌉ hold 3."""
    program, _ = _softmax_squares(9)
    sch = Schedule(program)
    j0, _ = sch.split(sch.loop("s_m", "j"), [None, 4])
    sch.split_k_update("s_s", j0)
    with pytest.raises(IllegalTransform, match=r"(?s)'s_m' is a max.*x\[i, j\] in the consumer's parts j // "
                                               r"⌈E/3⌉ is not what the producer's splits reduce"):
        sch.split_k_update("s_q", j0)


def test_a_consumer_reading_other_elements_is_refused_with_the_reason():
    program, _ = _max_chain("reversed", 8, [("s_s", "s", None, lambda x, m, _, i, j, d: _e(x, m, i, j)),
                                            ("s_q", "q", None, lambda x, m, _, i, j, d: exp(x[i, 7 - j] - m[i]))])
    sch = Schedule(program)
    j0, _ = sch.split(sch.loop("s_m", "j"), [2, None])
    sch.split_k_update("s_s", j0)
    with pytest.raises(IllegalTransform, match=r"(?s)x\[i, 7 - j\] in the consumer's parts.*could exceed 1"):
        sch.split_k_update("s_q", j0)


def test_a_masked_max_with_empty_splits_is_refused_with_the_reason():
    """A causal mask leaves the later split of the first rows empty: the guard would drop their parts."""
    program, _ = _max_chain("causal", 8, [("s_s", "s", None, lambda x, m, _, i, j, d: _e(x, m, i, j)),
                                          ("s_q", "q", None, lambda x, m, _, i, j, d: _e(x, m, i, j))],
                            mask=lambda i, j: j <= i)
    sch = Schedule(program)
    j0, _ = sch.split(sch.loop("s_m", "j"), [2, None])
    sch.split_k_update("s_s", j0)
    with pytest.raises(IllegalTransform, match=r"(?s)none of them empty.*holds no element.*\(S-1\)·⌈E/S⌉ < E"):
        sch.split_k_update("s_q", j0)
