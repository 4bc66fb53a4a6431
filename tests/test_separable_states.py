"""Separable auxiliary states (issue 24 item 4) on six programs of different shape, on every host backend.

Scaled states — a term ``exp(x - m)·P(x - m)``, m the running max, whose accumulators every update rescales
by ``exp(m - m')``: ``entropy`` (a softmax's entropy over rows, symbolic sizes), ``tile_moment`` (the second
moment of ``x - max`` over a 2-D tile, f64) and ``weighted_loglik`` (a two-input term next to the plain
softmax sum).  Piecewise-linear terms with a count — ``select(c, x - m, 0)`` with c free of the producer,
whose state is ``Σ select(c, -1, 0)``, minus the count where c holds: ``positive_deviation`` (from the
running mean, symbolic sizes), ``masked_gap`` (to the running max, the condition on a second input) and
``tile_clipped`` (over a 2-D tile, f64).

Each is fused rolling over elements, rolling over tiles (privatized partials, a ragged last tile) and split-k
(partial states combined at split-local references); the fused program, its tile program and the host C++
kernel are checked against the unfused program (:func:`polyfuse.differential.check_schedule`) and NumPy on
random and edge inputs at sizes 1, primes and tile multiples.  CUDA is compiled where nvcc exists and run by
the ``gpu``-marked test.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import polyfuse
from polyfuse.differential import check_schedule
from polyfuse.emit_cpp import CUDA, emit
from polyfuse.errors import BackendUnavailable, NoRepairFound
from polyfuse.ir import ProgramBuilder, exp, interpret, log, maximum, reduce, select
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles
from polyfuse.transforms import Schedule

BACKENDS = ("fused", "tile", "cpp") if shutil.which("g++") else ("fused", "tile")
RECIPES = ("roll", "roll_tiles", "split_k")


def _rows(name: str, sizes, dtype: str = "f32", inputs: str = "x"):
    p = ProgramBuilder(name)
    N, M = p.sizes("N", "M") if sizes is None else sizes
    return p, N, M, [p.input(n, (N, M), dtype, finite=True) for n in inputs]


def entropy(sizes=None):
    """h[i] = log l - Σ_j exp(x - m)·(x - m) / l, the entropy of softmax(x[i, :])."""
    p, N, M, (x,) = _rows("entropy", sizes)
    m, lsum, s = p.temp("m", (N,), "f32"), p.temp("l", (N,), "f32"), p.temp("s", (N,), "f32")
    h = p.output("h", (N,), "f32")
    with p.nest("s_r", i=N, j=reduce(M)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_sum", i=N, j=reduce(M)) as (i, j):
        lsum[i] = lsum[i] + exp(x[i, j] - m[i])
    with p.nest("s_ent", i=N, j=reduce(M)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - m[i]) * (x[i, j] - m[i])
    with p.nest("s_h", i=N) as (i,):
        h[i] = log(lsum[i]) - s[i] / lsum[i]
    return p.build()


def weighted_loglik(sizes=None):
    """out[i] = Σ_j softmax(x[i, :])_j·(x - m)·y[i, j]: the state term reads a second input."""
    p, N, M, (x, y) = _rows("weighted_loglik", sizes or (4, 13), inputs="xy")
    m, z, s = p.temp("m", (N,), "f32"), p.temp("z", (N,), "f32"), p.temp("s", (N,), "f32")
    out = p.output("out", (N,), "f32")
    with p.nest("s_r", i=N, j=reduce(M)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_sum", i=N, j=reduce(M)) as (i, j):
        z[i] = z[i] + exp(x[i, j] - m[i])
    with p.nest("s_ll", i=N, j=reduce(M)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - m[i]) * (x[i, j] - m[i]) * y[i, j]
    with p.nest("s_out", i=N) as (i,):
        out[i] = s[i] / z[i]
    return p.build()


def positive_deviation(sizes=None):
    """d[i] = Σ_j select(x > 0, x - mean, 0), the mean a running sum / M: one count-based state."""
    p, N, M, (x,) = _rows("positive_deviation", sizes)
    mean, d = p.temp("mean", (N,), "f32"), p.output("d", (N,), "f32")
    with p.nest("s_r", i=N, j=reduce(M)) as (i, j):
        mean[i] = mean[i] + x[i, j] / M.astype("f32") if sizes is None else mean[i] + x[i, j] / float(M)
    with p.nest("s_dev", i=N, j=reduce(M)) as (i, j):
        d[i] = d[i] + select(x[i, j] > 0.0, x[i, j] - mean[i], 0.0)
    return p.build()


def masked_gap(sizes=None):
    """g[i] = Σ_j select(w > 0, m - x, 0), m the max of x: the condition reads another input."""
    p, N, M, (x, w) = _rows("masked_gap", sizes or (3, 11), inputs="xw")
    m, g = p.temp("m", (N,), "f32"), p.output("g", (N,), "f32")
    with p.nest("s_r", i=N, j=reduce(M)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_gap", i=N, j=reduce(M)) as (i, j):
        g[i] = g[i] + select(w[i, j] > 0.0, m[i] - x[i, j], 0.0)
    return p.build()


def _tile(name: str, term: Callable, sizes=None):
    n, jn, kn = sizes or (3, 5, 3)
    p = ProgramBuilder(name)
    x = p.input("x", (n, jn, kn), "f64", finite=True)
    m, v = p.temp("m", (n,), "f64"), p.output("v", (n,), "f64")
    with p.nest("s_r", i=n, j=reduce(jn), k=reduce(kn)) as (i, j, k):
        m[i] = maximum(m[i], x[i, j, k])
    with p.nest("s_v", i=n, j=reduce(jn), k=reduce(kn)) as (i, j, k):
        v[i] = v[i] + term(x[i, j, k], x[i, j, k] - m[i])
    return p.build()


def tile_moment(sizes=None):
    """v[i] = Σ_{j,k} exp(x - m)·(x - m)² over the tile x[i, :, :]."""
    return _tile("tile_moment", lambda x, u: exp(u) * u * u, sizes)


def tile_clipped(sizes=None):
    """v[i] = Σ_{j,k} select(x > 0, x - m, 0) over the tile."""
    return _tile("tile_clipped", lambda x, u: select(x > 0.0, u, 0.0), sizes)


def _u(x: np.ndarray, how: str) -> np.ndarray:
    axes = tuple(range(1, x.ndim))
    return x - (x.max(axis=axes, keepdims=True) if how == "max" else x.mean(axis=axes, keepdims=True))


@dataclass(frozen=True)
class Case:
    make: Callable
    consumers: tuple[str, ...]
    symbolic: bool
    reference: Callable[[dict], tuple[dict, float]]
    """NumPy in f64: the outputs, and the magnitude the f32/f64 error is relative to (the terms' sum of
    magnitudes: each state's terms have one sign or are bounded by it)."""


def _entropy_ref(d):
    u = _u(d["x"], "max")
    e = np.exp(u)
    scale = 1.0 + float(np.max((e * (-u + u * u)).sum(1) / e.sum(1)))
    return {"h": np.log(e.sum(1)) - (e * u).sum(1) / e.sum(1)}, scale


def _loglik_ref(d):
    u = _u(d["x"], "max")
    e = np.exp(u)
    return {"out": (e * u * d["y"]).sum(1) / e.sum(1)}, float(np.max((e * -u).sum(1) / e.sum(1))) * np.abs(d["y"]).max()


def _deviation_ref(d):
    x = d["x"]
    u = _u(x, "mean")
    return {"d": np.where(x > 0, u, 0.0).sum(1)}, float(x.shape[1] * np.abs(x).max())


def _gap_ref(d):
    u = _u(d["x"], "max")
    return {"g": np.where(d["w"] > 0, -u, 0.0).sum(1)}, float(d["x"].shape[1] * np.abs(d["x"]).max())


def _moment_ref(d):
    u = _u(d["x"], "max")
    return {"v": (np.exp(u) * u * u).sum((1, 2))}, float(np.max((np.exp(u) * (u * u - u)).sum((1, 2))))


def _clipped_ref(d):
    u = _u(d["x"], "max")
    return {"v": np.where(d["x"] > 0, u, 0.0).sum((1, 2))}, float(d["x"][0].size * np.abs(d["x"]).max())


CASES = {
    "entropy": Case(entropy, ("s_sum", "s_ent"), True, _entropy_ref),
    "weighted_loglik": Case(weighted_loglik, ("s_sum", "s_ll"), False, _loglik_ref),
    "tile_moment": Case(tile_moment, ("s_v",), False, _moment_ref),
    "positive_deviation": Case(positive_deviation, ("s_dev",), True, _deviation_ref),
    "masked_gap": Case(masked_gap, ("s_gap",), False, _gap_ref),
    "tile_clipped": Case(tile_clipped, ("s_v",), False, _clipped_ref),
}
FIXED = (3, 13)
"""The sizes of a symbolic program under split-k: cutting a second consumer into the splits needs constant
extents."""


def scheduled(name: str, recipe: str) -> tuple:
    case = CASES[name]
    program = case.make(FIXED if case.symbolic and recipe == "split_k" else None)
    sch = Schedule(program)
    j = sch.loop("s_r", "j")
    if recipe == "roll":
        loop, fuse = j, sch.rolling_update
    elif recipe == "roll_tiles":
        loop, fuse = sch.split(j, [None, 4])[0], sch.rolling_update
    else:
        loop, fuse = sch.split(j, [3, None])[0], sch.split_k_update
    for block in case.consumers:
        fuse(block, loop)
    return program, sch


def _edge(rng, shape: tuple[int, ...], dtype) -> list[np.ndarray]:
    x = rng.standard_normal(shape)
    lead = x.copy()
    lead[:, : max(1, shape[1] // 2)] = 0.0  # leading zeros
    mono = np.sort(x.reshape(shape[0], -1), axis=1).reshape(shape)  # the max moves at every element
    out = [x, x * 1e4, x * 1e-30, np.abs(x) * 80.0, lead, np.full(shape, 2.5), mono, -np.abs(x) * 1e3,
           np.zeros(shape)]
    return [a.astype(dtype) for a in out]


def _inputs(program, rng) -> tuple[list[dict], list[dict | None]]:
    """Edge input sets; a symbolic program's at sizes 1, primes and a multiple of the tile."""
    first = program.inputs[0]
    dtype = first.dtype.numpy
    if program.params:
        shapes = [((1, 1), {"N": 1, "M": 1}), ((2, 7), {"N": 2, "M": 7}), ((3, 13), {"N": 3, "M": 13}),
                  ((1, 16), {"N": 1, "M": 16})]
    else:
        shapes = [(tuple(int(d.value) for d in first.shape), None)]
    sets, sizes = [], []
    for shape, sz in shapes:
        for x in _edge(rng, shape, dtype):
            extra = {t.name: rng.standard_normal(shape).astype(dtype) for t in program.inputs[1:]}
            sets.append({first.name: x, **extra})
            sizes.append(sz)
    return sets, sizes


def _close(got: dict, inputs: dict, case: Case, what) -> None:
    with np.errstate(all="ignore"):
        want, scale = case.reference({k: v.astype(np.float64) for k, v in inputs.items()})
    for key, ref in want.items():
        eps = np.finfo(got[key].dtype).eps
        # Values that underflow f32 are 0 there: atol holds the smallest normal number too.
        atol = 64 * eps * scale + np.finfo(got[key].dtype).tiny
        assert np.allclose(np.asarray(got[key]), ref, rtol=64 * eps, atol=atol), (what, key, inputs)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", CASES)
def test_separable_states_on_every_host_backend(name, recipe):
    program, sch = scheduled(name, recipe)
    assert any("_aux1" in b.name for b in sch.program.blocks()), f"{name} fused without a state"
    sets, sizes = _inputs(program, np.random.default_rng(sum(map(ord, name + recipe))))
    report = check_schedule(program, sch.program, sets, sizes=sizes, backends=BACKENDS)
    assert not report.findings, "\n".join(f.line() for f in report.findings)
    for inputs, sz in zip(sets, sizes, strict=True):
        _close(interpret(sch.program, inputs, sz), inputs, CASES[name], (name, recipe, sz))


def test_the_count_state_is_a_select_of_minus_one():
    _, sch = scheduled("positive_deviation", "roll")
    aux = sch.program.block("s_dev_aux1")
    assert str(aux.store.value) == 'd_aux1[i] + select(x[i, j] > 0.0, const(-1.0, "f32"), 0.0)'
    assert "Piecewise((-1, c), (0, True))" in sch.fusions[-1].repair.describe()["auxiliaries"]


def test_a_condition_on_the_producer_is_refused():
    # select(x > m, …) moves its partition with m: no fixed count exists
    p, N, M, (x,) = _rows("moving", (2, 5))
    m, s = p.temp("m", (N,), "f32"), p.output("s", (N,), "f32")
    with p.nest("s_r", i=N, j=reduce(M)) as (i, j):
        m[i] = m[i] + x[i, j]
    with p.nest("s_s", i=N, j=reduce(M)) as (i, j):
        s[i] = s[i] + select(x[i, j] > m[i], x[i, j] - m[i], 0.0)
    sch = Schedule(p.build())
    with pytest.raises(NoRepairFound, match="compares a producer result with values that vary"):
        sch.rolling_update("s_s", sch.loop("s_r", "j"))


def test_a_count_state_over_data_that_may_be_infinite_is_refused():
    # the plain select drops an element whatever it holds; the count state shifts it by m' - m, which is inf - inf
    # once an infinite element reached m
    p = ProgramBuilder("gap_any")
    x, w = p.input("x", (2, 5), "f32"), p.input("w", (2, 5), "f32")
    m, g = p.temp("m", (2,), "f32"), p.output("g", (2,), "f32")
    with p.nest("s_r", i=2, j=reduce(5)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_gap", i=2, j=reduce(5)) as (i, j):
        g[i] = g[i] + select(w[i, j] > 0.0, m[i] - x[i, j], 0.0)
    sch = Schedule(p.build())
    with pytest.raises(NoRepairFound, match=r"not finite once w or x holds ±inf or NaN.*declare the inputs finite="):
        sch.rolling_update("s_gap", sch.loop("s_r", "j"))


def test_non_finite_data_is_refused_with_the_declaration_to_make():
    # exp(x - m)·(x - m) at x = -inf is 0·inf = NaN in the plain program (sympy's limit says 0): fused, the
    # element's term would be guarded to 0 while m is still -inf, so the fusion needs finite data.
    p = ProgramBuilder("entropy_any")
    x = p.input("x", (2, 5), "f32")
    m, s = p.temp("m", (2,), "f32"), p.output("s", (2,), "f32")
    with p.nest("s_r", i=2, j=reduce(5)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_ent", i=2, j=reduce(5)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - m[i]) * (x[i, j] - m[i])
    sch = Schedule(p.build())
    with pytest.raises(NoRepairFound, match="finite=True"):
        sch.rolling_update("s_ent", sch.loop("s_r", "j"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", CASES)
def test_separable_state_cuda_compiles(name, recipe):
    _, sch = scheduled(name, recipe)
    source = emit(to_tiles(sch.program), CUDA)
    assert "_aux1" in source.text
    compile_gpu(source.text, name, "cuda", source.target.arch, options=CompileOptions(werror=True),
                compile_only=True)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", CASES)
def test_separable_state_runs_on_the_gpu(name, recipe):
    # The CUDA kernel of each fused program matches NumPy and the unfused interpreter on the edge inputs
    # (f32 arithmetic in another order: the host backends' tolerance, relative to the terms' magnitudes).
    program, sch = scheduled(name, recipe)
    try:
        kernel = polyfuse.build(sch, "cuda", werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    sets, sizes = _inputs(program, np.random.default_rng(7))
    for inputs, sz in zip(sets, sizes, strict=True):
        got = {k: np.asarray(v) for k, v in kernel.run(inputs, **(sz or {})).items()}
        _close(got, inputs, CASES[name], (name, recipe, "cuda", sz))
        with np.errstate(all="ignore"):
            _, scale = CASES[name].reference({k: v.astype(np.float64) for k, v in inputs.items()})
        for key, value in interpret(program, inputs, sz).items():
            eps = np.finfo(value.dtype).eps
            assert np.allclose(got[key], value, rtol=64 * eps, atol=64 * eps * scale + np.finfo(value.dtype).tiny,
                               equal_nan=True), (name, recipe, "cuda vs plain", key, sz)
