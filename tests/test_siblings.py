"""Horizontal (sibling) fusion: reductions over the same iteration space with no dependence between them share
one pass, alone (``fuse_siblings``) or inside a rolling / split-k fusion; checked on the fused program, its tile
program and the host C++ kernel against the plain program (:func:`polyfuse.differential.check_schedule`) and
NumPy, on rows with leading zeros, ties, ±inf/NaN, huge and tiny magnitudes, of sizes 1 and primes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polyfuse.differential import check_schedule
from polyfuse.errors import IllegalTransform
from polyfuse.ir import ProgramBuilder, exp, interpret, log, maximum, reduce, sqrt
from polyfuse.ir.stmt import Loop
from polyfuse.transforms import Schedule
from polyfuse.transforms.tree import blocks_under, loops_of

BACKENDS = ("fused", "tile", "cpp") if shutil.which("g++") else ("fused", "tile")
EPS = 1e-5


def cosine(n: int, m: int):
    """A dot product next to two norms: three siblings, then an epilogue."""
    p = ProgramBuilder("cosine")
    x, y = p.input("x", (n, m), "f64"), p.input("y", (n, m), "f64")
    nx, ny, d = (p.temp(name, (n,), "f64") for name in ("nx", "ny", "d"))
    out = p.output("out", (n,), "f64")
    with p.nest("s_nx", i=n, j=reduce(m)) as (i, j):
        nx[i] = nx[i] + x[i, j] * x[i, j]
    with p.nest("s_ny", i=n, j=reduce(m)) as (i, j):
        ny[i] = ny[i] + y[i, j] * y[i, j]
    with p.nest("s_d", i=n, j=reduce(m)) as (i, j):
        d[i] = d[i] + x[i, j] * y[i, j]
    with p.nest("s_out", i=n) as (i,):
        out[i] = d[i] / sqrt(nx[i] * ny[i])
    return p.build()


def cosine_ref(x, y):
    return {"out": (x * y).sum(1) / np.sqrt((x * x).sum(1) * (y * y).sum(1))}


def softmax_and_rms(n: int, m: int):
    """A cascade on x (max, sum of exponentials) and one on y (sum of squares, then the max of y normalised
    by it): the second cascade's first reduction is a sibling of the first's."""
    p = ProgramBuilder("softmax_and_rms")
    x, y = p.input("x", (n, m), "f32"), p.input("y", (n, m), "f32")
    mx, sq = p.temp("mx", (n,), "f32"), p.temp("sq", (n,), "f32")
    lse, amax = p.output("lse", (n,), "f32"), p.output("amax", (n,), "f32")
    s = p.temp("s", (n,), "f32")
    with p.nest("s_sq", i=n, j=reduce(m)) as (i, j):  # before the other cascade: fusing moves it later
        sq[i] = sq[i] + y[i, j] * y[i, j]
    with p.nest("s_max", i=n, j=reduce(m)) as (i, j):
        mx[i] = maximum(mx[i], x[i, j])
    with p.nest("s_sum", i=n, j=reduce(m)) as (i, j):
        s[i] = s[i] + exp(x[i, j] - mx[i])
    with p.nest("s_amax", i=n, j=reduce(m)) as (i, j):
        amax[i] = maximum(amax[i], y[i, j] / sqrt(sq[i] / float(m) + EPS))
    with p.nest("s_lse", i=n) as (i,):
        lse[i] = mx[i] + log(s[i])
    return p.build()


def softmax_and_rms_ref(x, y):
    m = x.max(1)
    return {"lse": m + np.log(np.exp(x - m[:, None]).sum(1)),
            "amax": (y / np.sqrt((y * y).mean(1) + EPS)[:, None]).max(1)}


def tile_stats(n: int, m: int, k: int = 3):
    """Statistics of two tensors over a 2-D tile of each row (j and k reduce)."""
    p = ProgramBuilder("tile_stats")
    x, y = p.input("x", (n, m, k), "f64"), p.input("y", (n, m, k), "f64")
    hi, lo, tot = p.output("hi", (n,), "f64"), p.output("lo", (n,), "f64"), p.output("tot", (n,), "f64")
    with p.nest("s_hi", i=n, j=reduce(m), k=reduce(k)) as (i, j, kk):
        hi[i] = maximum(hi[i], abs(x[i, j, kk]))
    with p.nest("s_lo", i=n, j=reduce(m), k=reduce(k)) as (i, j, kk):
        lo[i] = lo[i] + abs(y[i, j, kk])
    with p.nest("s_tot", i=n, j=reduce(m), k=reduce(k)) as (i, j, kk):
        tot[i] = tot[i] + x[i, j, kk] * y[i, j, kk]
    return p.build()


def tile_stats_ref(x, y):
    return {"hi": abs(x).max((1, 2)), "lo": abs(y).sum((1, 2)), "tot": (x * y).sum((1, 2))}


def _row(kind: str, rng: np.random.Generator, size: int) -> np.ndarray:
    v = rng.standard_normal(size)
    if kind == "leading_zeros":
        v[: max(1, size // 2)] = 0.0
    elif kind == "zeros":
        v[:] = 0.0
    elif kind == "ties":
        v = rng.choice([-1.0, 2.0, 2.0], size)
    elif kind == "special":
        v[rng.integers(size)] = rng.choice([np.inf, -np.inf, np.nan])
    elif kind == "huge":
        v = v * 1e30
    elif kind == "tiny":
        v = v * 1e-30
    return v


KINDS = ("normal", "leading_zeros", "zeros", "ties", "special", "huge", "tiny")


def _inputs(program, seed: int, kinds=KINDS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in program.inputs:
        shape = tuple(int(d.value) for d in t.shape)
        per_row = int(np.prod(shape[1:]))
        rows = [_row(kinds[(r + seed) % len(kinds)], rng, per_row) for r in range(shape[0])]
        out[t.name] = np.stack(rows).reshape(shape).astype(t.dtype.numpy)
    return out


def _check(plain, sch: Schedule, reference) -> None:
    sets = [_inputs(plain, seed) for seed in range(3)]
    report = check_schedule(plain, sch.program, sets, backends=BACKENDS)
    assert not report.findings, "\n".join(f.line() for f in report.findings)
    normal = _inputs(plain, 7, kinds=("normal",))
    got, want = interpret(sch.program, normal), reference(*(normal[t.name] for t in plain.inputs))
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-5 if plain.inputs[0].dtype.bits == 32 else 1e-12,
                                   atol=1e-6)


def _one_pass(sch: Schedule, blocks: list[str], loop: str) -> None:
    """Every named block lies under one loop called ``loop``."""
    first = next(lp for lp in loops_of(sch.program, blocks[0]) if lp.var.name == loop)
    under = {b.name for b in blocks_under(first)}
    assert set(blocks) <= under, f"{set(blocks) - under} not under loop {loop!r}"


SIZES = [(1, 1), (2, 7), (3, 13), (2, 32)]


@pytest.mark.parametrize("n, m", SIZES)
def test_cosine_siblings_share_the_row_loop(n, m):
    plain = cosine(n, m)
    sch = Schedule(plain)
    sch.fuse_siblings("s_ny", sch.loop("s_nx", "j"))
    sch.rolling_update("s_d", sch.loop("s_nx", "j"))  # a sibling through the fusion the user asked for
    _one_pass(sch, ["s_nx", "s_ny", "s_d"], "j")
    inner = loops_of(sch.program, "s_nx")[-1]
    assert isinstance(inner, Loop) and {b.name for b in blocks_under(inner)} == {"s_nx", "s_ny", "s_d"}
    assert "sch.fuse_siblings(block='s_ny', loop=sch.loop(\"s_nx\", \"j\"))" in str(sch.trace)
    _check(plain, sch, cosine_ref)


@pytest.mark.parametrize("n, m", SIZES)
@pytest.mark.parametrize("recipe", ["tiles", "split_k"])
def test_cosine_siblings_over_tiles_and_splits(n, m, recipe):
    plain = cosine(n, m)
    sch = Schedule(plain)
    sch.split(sch.loop("s_nx", "j"), [None, 4] if recipe == "tiles" else [3, None])
    fuse = sch.rolling_update if recipe == "tiles" else sch.split_k_update
    for b in ("s_ny", "s_d"):
        fuse(b, sch.loop("s_nx", "j_0"))
    _one_pass(sch, ["s_nx", "s_ny" if recipe == "tiles" else "s_ny_rf", "s_d" if recipe == "tiles" else "s_d_rf"],
              "j_0")
    _check(plain, sch, cosine_ref)


@pytest.mark.parametrize("n, m", SIZES)
@pytest.mark.parametrize("tiled", [False, True])
def test_two_cascades_in_one_pass(n, m, tiled):
    """One pass over the row computes both cascades: the sibling sum of squares is a producer of amax."""
    plain = softmax_and_rms(n, m)
    sch = Schedule(plain)
    loop = "j"
    if tiled:
        sch.split(sch.loop("s_max", "j"), [None, 4])
        loop = "j_0"
    for b in ("s_sum", "s_sq", "s_amax"):
        sch.rolling_update(b, sch.loop("s_max", loop))
    _one_pass(sch, ["s_max", "s_sum", "s_sq", "s_amax"], loop)
    assert sch.fusion("s_sq").repair is None and "sibling of block 's_max'" in sch.fusion("s_sq").notes[0]
    assert sch.fusion("s_amax").producers == ("s_sq",)
    _check(plain, sch, softmax_and_rms_ref)


@pytest.mark.parametrize("n, m", [(1, 1), (2, 5), (3, 11)])
def test_tile_siblings(n, m):
    plain = tile_stats(n, m)
    sch = Schedule(plain)
    for b in ("s_lo", "s_tot"):
        sch.fuse_siblings(b, sch.loop("s_hi", "k"))
    _one_pass(sch, ["s_hi", "s_lo", "s_tot"], "k")
    _check(plain, sch, tile_stats_ref)
    outer = Schedule(plain)
    outer.fuse_siblings("s_lo", outer.loop("s_hi", "i"))  # under the row loop: a j, k nest of its own
    assert [lp.var.name for lp in loops_of(outer.program, "s_lo")] == ["i", "j", "k"]
    _check(plain, outer, tile_stats_ref)


def test_trace_replays_and_prints():
    plain = cosine(2, 7)
    sch = Schedule(plain)
    sch.fuse_siblings("s_ny", sch.loop("s_nx", "j"))
    sch.fuse_siblings("s_d", sch.loop("s_nx", "j"))
    again = Schedule(plain).replay(sch.trace.to_json())
    assert again.program == sch.program
    assert Schedule(plain).exec_python(str(sch.trace)).program == sch.program
    # siblings join in call order, after the anchor
    inner = loops_of(sch.program, "s_nx")[-1]
    assert [b.name for b in blocks_under(inner)] == ["s_nx", "s_ny", "s_d"]


def test_refusal_names_the_producer_and_the_fusion():
    plain = softmax_and_rms(2, 7)
    sch = Schedule(plain)
    with pytest.raises(IllegalTransform, match=r"fuse_siblings of block 's_sum'.*reads 'mx', which block 's_max' "
                                               r"writes under loop 'j'.*sch.rolling_update\('s_sum'"):
        sch.fuse_siblings("s_sum", sch.loop("s_max", "j"))


def test_refusal_different_iteration_space():
    sch = Schedule(cosine(2, 5))
    with pytest.raises(IllegalTransform, match=r"'s_out' and block 's_nx' do not have the same iteration space: "
                                               r"reduce iterations none against j < 5"):
        sch.fuse_siblings("s_out", sch.loop("s_nx", "j"))


def test_refusal_already_under_and_self():
    sch = Schedule(cosine(2, 5))
    with pytest.raises(IllegalTransform, match="not its own sibling"):
        sch.fuse_siblings("s_nx", sch.loop("s_nx", "j"))
    sch.fuse_siblings("s_ny", sch.loop("s_nx", "j"))
    with pytest.raises(IllegalTransform, match="already under loop 'j'"):
        sch.fuse_siblings("s_ny", sch.loop("s_nx", "j"))


def _cuda_or_skip() -> None:
    from polyfuse.errors import BackendUnavailable
    from polyfuse.runtime.loaders import loader

    try:
        loader("cuda")
    except BackendUnavailable as err:
        pytest.skip(str(err))


def _cosine_rolled(n: int, m: int) -> Schedule:
    sch = Schedule(cosine(n, m))
    sch.fuse_siblings("s_ny", sch.loop("s_nx", "j"))
    sch.rolling_update("s_d", sch.loop("s_nx", "j"))
    return sch


def _cascades_tiled(n: int, m: int) -> Schedule:
    sch = Schedule(softmax_and_rms(n, m))
    sch.split(sch.loop("s_max", "j"), [None, 4])
    for b in ("s_sum", "s_sq", "s_amax"):
        sch.rolling_update(b, sch.loop("s_max", "j_0"))
    return sch


def _tile_siblings(n: int, m: int) -> Schedule:
    sch = Schedule(tile_stats(n, m))
    for b in ("s_lo", "s_tot"):
        sch.fuse_siblings(b, sch.loop("s_hi", "k"))
    return sch


@pytest.mark.gpu
@pytest.mark.parametrize("make", [_cosine_rolled, _cascades_tiled, _tile_siblings],
                         ids=["cosine", "two_cascades_tiled", "tile_siblings"])
@pytest.mark.parametrize("n, m", [(1, 1), (3, 13), (5, 37)])
def test_sibling_programs_run_on_the_gpu(make, n, m):
    # The CUDA kernel of each sibling-fused program against the plain program (the differential oracle's rules:
    # within the bounds of both, non-finite classes kept) on every input kind, sizes 1 and primes.
    _cuda_or_skip()
    sch = make(n, m)
    plain = sch.original
    report = check_schedule(plain, sch.program, [_inputs(plain, seed) for seed in range(3)], backends=("tile", "cuda"))
    assert not report.findings, "\n".join(f.line() for f in report.findings)
