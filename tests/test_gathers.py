"""Gathers (``x[i, target[i]]``): data-dependent reads on a non-reduced dimension.

Three programs of different shape — a cross-entropy loss next to the rolling logsumexp, an embedding row
gathered into an rmsnorm, a routed expert's weight row inside a softmax-weighted sum — run on every host
backend (interpreter, fused interpreter, tile program, host C++) against NumPy and the unfused program,
on random and edge inputs; an index out of its dimension raises GatherOutOfBounds naming the access on
each; CUDA is compiled where nvcc exists.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import polyfuse
from polyfuse.deps import analyze
from polyfuse.emit_cpp import CUDA, emit
from polyfuse.errors import BackendUnavailable, GatherOutOfBounds, NonAffineIndex
from polyfuse.ir import ProgramBuilder, exp, interpret, log, maximum, reduce, sqrt
from polyfuse.ir.printer import program_from_source
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import interpret as interpret_tiles
from polyfuse.tiling import to_tiles
from polyfuse.transforms import Schedule


def cross_entropy():
    """loss[i] = logsumexp(x[i, :]) - x[i, target[i]]; the max and the sum fuse (rolling), the gather stays
    in the elementwise loss, outside the repaired terms."""
    p = ProgramBuilder("cross_entropy")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N, M), "f32")
    target = p.input("target", (N,), "i32")
    m, s = p.temp("m", (N,), "f32"), p.temp("s", (N,), "f32")
    loss = p.output("loss", (N,), "f32")
    with p.nest("s_max", i=N, j=reduce(M)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_sum", i=N, j=reduce(M)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - m[i])
    with p.nest("s_loss", i=N) as (i,):
        loss[i] = m[i] + log(s[i]) - x[i, target[i]]
    program = p.build()
    sch = Schedule(program)
    sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    return program, sch


def cross_entropy_ref(inputs):
    x, t = inputs["x"].astype(np.float64), inputs["target"]
    m = x.max(axis=1)
    with np.errstate(all="ignore"):
        lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
    return {"loss": lse - x[np.arange(len(t)), t]}


def embedding_rmsnorm():
    """out[i, d] = table[ids[i], d] / sqrt(mean_d table[ids[i], d]² + eps): the gather is read twice,
    by the reduction and by the normalisation."""
    p = ProgramBuilder("embedding_rmsnorm")
    N, V, D = p.sizes("N", "V", "D")
    table = p.input("table", (V, D), "f32")
    ids = p.input("ids", (N,), "i64")
    ss = p.temp("ss", (N,), "f32")
    out = p.output("out", (N, D), "f32")
    with p.nest("s_ss", i=N, d=reduce(D)) as (i, d):
        ss[i] = ss[i] + table[ids[i], d] * table[ids[i], d]
    with p.nest("s_norm", i=N, d=D) as (i, d):
        out[i, d] = table[ids[i], d] / sqrt(ss[i] / D + 1e-6)
    return p.build(), None


def embedding_rmsnorm_ref(inputs):
    e = inputs["table"].astype(np.float64)[inputs["ids"]]
    with np.errstate(all="ignore"):
        return {"out": e / np.sqrt((e * e).mean(axis=1, keepdims=True) + 1e-6)}


def routed_softmax():
    """y[i] = Σ_j softmax(x[i, :])_j · w[expert[i], j] and the routed expert's own probability
    p[i] = softmax(x[i, :])[expert[i]]: the weighted sum fuses into the max loop with a proven repair, the
    gathered weight is a term of the consumer (never of the repair)."""
    p = ProgramBuilder("routed_softmax")
    N, M, E = p.sizes("N", "M", "E")
    x = p.input("x", (N, M), "f32")
    w = p.input("w", (E, M), "f32")
    expert = p.input("expert", (N,), "i32")
    m, s, ws = p.temp("m", (N,), "f32"), p.temp("s", (N,), "f32"), p.temp("ws", (N,), "f32")
    y, prob = p.output("y", (N,), "f32"), p.output("prob", (N,), "f32")
    with p.nest("s_max", i=N, j=reduce(M)) as (i, j):
        m[i] = maximum(m[i], x[i, j])
    with p.nest("s_sum", i=N, j=reduce(M)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - m[i])
    with p.nest("s_wsum", i=N, j=reduce(M)) as (i, j):
        ws[i] = ws[i] + exp(x[i, j] - m[i]) * w[expert[i], j]
    with p.nest("s_y", i=N) as (i,):
        y[i] = ws[i] / s[i]
    with p.nest("s_prob", i=N) as (i,):
        prob[i] = exp(x[i, expert[i]] - m[i]) / s[i]
    program = p.build()
    sch = Schedule(program)
    sch.rolling_update("s_sum", sch.loop("s_max", "j"))
    sch.rolling_update("s_wsum", sch.loop("s_max", "j"))
    return program, sch


def routed_softmax_ref(inputs):
    x, w, e = inputs["x"].astype(np.float64), inputs["w"].astype(np.float64), inputs["expert"]
    with np.errstate(all="ignore"):
        z = np.exp(x - x.max(axis=1, keepdims=True))
        sm = z / z.sum(axis=1, keepdims=True)
    return {"y": (sm * w[e]).sum(axis=1), "prob": sm[np.arange(len(e)), e]}


def _inputs(name: str, n: int, m: int, rng, fill=None):
    x = rng.standard_normal((n, m)).astype(np.float32) if fill is None else fill(n, m).astype(np.float32)
    if name == "cross_entropy":
        return {"x": x, "target": rng.integers(0, m, n).astype(np.int32)}
    if name == "embedding_rmsnorm":
        return {"table": x, "ids": rng.integers(0, n, 2 * n + 1).astype(np.int64)}
    w = rng.standard_normal((3, m)).astype(np.float32)
    return {"x": x, "w": w, "expert": rng.integers(0, m if m < 3 else 3, n).astype(np.int32)}


PROGRAMS = {"cross_entropy": (cross_entropy, cross_entropy_ref),
            "embedding_rmsnorm": (embedding_rmsnorm, embedding_rmsnorm_ref),
            "routed_softmax": (routed_softmax, routed_softmax_ref)}
EDGES = {
    "random": None,
    "leading_zeros": lambda n, m: np.concatenate([np.zeros((n, m // 2 + 1)), np.ones((n, m))], axis=1)[:, :m],
    "huge": lambda n, m: np.full((n, m), 3e38) * np.where(np.arange(m) % 2, 1, -1),
    "tiny": lambda n, m: np.full((n, m), 1e-44),
    "neg_inf_row": lambda n, m: np.where(np.arange(m) == 0, -np.inf, 1.0) * np.ones((n, 1)),
    "inf_nan": lambda n, m: np.where(np.arange(m) % 3 == 0, np.inf, np.where(np.arange(m) % 3 == 1, np.nan, 0.5))
    * np.ones((n, 1)),
}


def _runs(program, sch, inputs):
    """The outputs of every host backend: the plain and fused interpreters, the tile program, host C++."""
    final = sch.program if sch is not None else program
    outs = {"plain": interpret(program, inputs), "fused": interpret(final, inputs),
            "tile": interpret_tiles(to_tiles(final), inputs)}
    kernel = polyfuse.build(sch if sch is not None else program)
    outs["cpp"] = kernel.run(inputs)
    return outs


def _close(a, b, rtol):
    return np.allclose(a, b, rtol=rtol, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("shape", [(5, 37), (1, 1)])
def test_gather_backends_agree(name, edge, shape):
    make, ref = PROGRAMS[name]
    program, sch = make()
    inputs = _inputs(name, *shape, np.random.default_rng(hash((name, edge)) % 2**32), EDGES[edge])
    outs = _runs(program, sch, inputs)
    expected = ref(inputs)
    for out, value in expected.items():
        plain = outs["plain"][out]
        for backend in ("fused", "tile", "cpp"):
            assert _close(outs[backend][out], plain, 1e-5), (backend, out)
        if edge not in ("huge", "inf_nan"):  # the float64 reference differs from f32 where f32 overflows
            assert _close(plain, value, 1e-4), out


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("bad", [-1, "extent"])
def test_gather_out_of_bounds_raises_on_every_host_backend(name, bad):
    make, _ = PROGRAMS[name]
    program, sch = make()
    inputs = _inputs(name, 4, 6, np.random.default_rng(1))
    key, tensor, extent = {"cross_entropy": ("target", "x", 6), "embedding_rmsnorm": ("ids", "table", 4),
                           "routed_softmax": ("expert", "w", 3)}[name]
    value = -1 if bad == -1 else extent
    inputs[key] = inputs[key].copy()
    inputs[key][-1] = value
    final = sch.program if sch is not None else program
    runs = {"interpreter": lambda: interpret(final, inputs),
            "tile": lambda: interpret_tiles(to_tiles(final), inputs),
            "cpp": lambda: polyfuse.build(final).run(inputs)}
    for backend, run in runs.items():
        with pytest.raises(GatherOutOfBounds) as err:
            run()
        text = str(err.value)
        assert f"tensor {tensor!r}" in text and f"{key}[i]" in text, backend
        assert f"which read {value}" in text and f"has size {extent}" in text, backend
    kernel = polyfuse.build(final)
    inputs[key][-1] = 0
    assert kernel.run(inputs)  # the fault record starts clean on the next call


def test_gather_is_a_may_read_of_the_whole_dimension():
    p = ProgramBuilder("gather_temp")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N, M), "f32")
    idx = p.input("idx", (N,), "i32")
    t = p.temp("t", (N, M), "f32")
    out = p.output("out", (N,), "f32")
    with p.nest("s_t", i=N, j=M) as (i, j):
        t[i, j] = x[i, j] * 2.0
    with p.nest("s_out", i=N) as (i,):
        out[i] = t[i, idx[i]]
    program = p.build()
    flows = [d for d in analyze(program).flow if d.source == "s_t" and d.sink == "s_out"]
    assert flows, "the gather reads what s_t writes"
    assert "0 <= j < M" in str(flows[0].relation) or "j <= -1 + M" in str(flows[0].relation)
    assert program_from_source(str(program)) == program
    x_val = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = polyfuse.build(program).run({"x": x_val, "idx": np.array([3, 0, 2], np.int32)})["out"]
    assert np.array_equal(got, 2 * x_val[np.arange(3), [3, 0, 2]])


def test_gather_refusals_say_what_a_gather_is():
    p = ProgramBuilder("bad")
    N = p.size("N")
    x = p.input("x", (N,), "f32")
    fidx = p.input("fidx", (N,), "f32")
    idx = p.input("idx", (N,), "i32")
    out = p.output("out", (N,), "f32")
    with pytest.raises(NonAffineIndex, match="bare load of an integer input tensor"):
        with p.nest("s", i=N) as (i,):
            out[i] = x[fidx[i].astype("i32")]
    with pytest.raises(NonAffineIndex, match="scatter"):
        with p.nest("s2", i=N) as (i,):
            out[idx[i]] = x[i]

    def built(index):
        q = ProgramBuilder("bad")
        N = q.size("N")
        x, idx = q.input("x", (N,), "f32"), q.input("idx", (N,), "i32")
        t = q.temp("t", (N,), "i32")
        out = q.output("out", (N,), "f32")
        with q.nest("s_t", i=N) as (i,):
            t[i] = idx[i]
        with q.nest("s_out", i=N) as (i,):
            out[i] = x[index(idx, t, i)]
        return q.build()

    with pytest.raises(NonAffineIndex, match=r"index 0 of the gather index idx\[idx\[i\]\]: .* is not affine"):
        built(lambda idx, t, i: idx[idx[i]])
    with pytest.raises(NonAffineIndex, match=r"t\[i\] is not affine.*bare load of an integer input tensor"):
        built(lambda idx, t, i: t[i])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
@pytest.mark.parametrize("name", PROGRAMS)
def test_gather_cuda_compiles(name):
    program, sch = PROGRAMS[name][0]()
    source = emit(to_tiles(sch.program if sch is not None else program), CUDA)
    assert source.gathers and "pf::gathered(" in source.text and "pf_gather_fault" in source.text
    assert source.args[-1].name == "pf_gather_fault"
    compile_gpu(source.text, name, "cuda", source.target.arch, options=CompileOptions(werror=True),
                compile_only=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", PROGRAMS)
def test_gather_runs_on_the_gpu(name):
    # The CUDA kernel of each fused gather program matches the unfused interpreter on every edge input and at
    # a ragged size, and an index out of its dimension raises GatherOutOfBounds from the device's fault record
    # (the next call starts clean).  Tolerance as the host backends': f32 arithmetic in another order.
    make, _ = PROGRAMS[name]
    program, sch = make()
    try:
        kernel = polyfuse.build(sch if sch is not None else program, "cuda", werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    for edge, fill in EDGES.items():
        for shape in ((5, 37), (1, 1), (130, 257)):
            inputs = _inputs(name, *shape, np.random.default_rng(hash((name, edge)) % 2**32), fill)
            plain, got = interpret(program, inputs), kernel.run(inputs)
            for out, value in plain.items():
                assert _close(np.asarray(got[out]), value, 1e-5), (edge, shape, out)
    key, extent = {"cross_entropy": ("target", 6), "embedding_rmsnorm": ("ids", 4),
                   "routed_softmax": ("expert", 3)}[name]
    inputs = _inputs(name, 4, 6, np.random.default_rng(1))
    inputs[key] = inputs[key].copy()
    inputs[key][-1] = extent
    with pytest.raises(GatherOutOfBounds, match=f"which read {extent}"):
        kernel.run(inputs)
    inputs[key][-1] = 0
    assert kernel.run(inputs)
