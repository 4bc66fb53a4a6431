"""Sign facts (:mod:`polyfuse.transforms.signs`): inferred through temporaries, inlined maps and fused producers,
declared on inputs (checked at run time on every backend) and promised on fusion calls (traced), and refusals
that say which fact was missing and how to declare it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polyfuse import tiling
from polyfuse.errors import IllegalTransform, NoRepairFound, PolyfuseError
from polyfuse.ir import ProgramBuilder, exp, interpret, maximum, minimum, reduce
from polyfuse.transforms import Schedule
from polyfuse.transforms.signs import value_signs


def softmax_via_temp(m: int = 13):
    """``e = exp(x - max)`` in a temporary, its row sum, and a max of ``y²·s`` (a mass only if s is >= 0)."""
    p = ProgramBuilder("softmax_via_temp")
    n = 2
    x, y = p.input("x", (n, m), "f64"), p.input("y", (n, m), "f64")
    mx, s, q = (p.temp(name, (n,), "f64") for name in ("mx", "s", "q"))
    e = p.temp("e", (n, m), "f64")
    c = p.output("c", (n,), "f64")
    with p.nest("s_max", i=n, j=reduce(m)) as (i, j):
        mx[i] = maximum(x[i, j], mx[i])
    with p.nest("s_exp", i=n, j=m) as (i, j):
        e[i, j] = exp(-mx[i] + x[i, j])
    with p.nest("s_sum", i=n, j=reduce(m)) as (i, j):
        s[i] = s[i] + e[i, j]
    with p.nest("s_q", i=n, j=reduce(m)) as (i, j):
        q[i] = q[i] + y[i, j] * y[i, j] * s[i]
    with p.nest("s_c", i=n, j=reduce(m)) as (i, j):
        c[i] = maximum(c[i], abs(y[i, j]) / q[i])
    return p.build()


def reducers(sign: str | None = None):
    """One reduction of each kind over x (declared ``sign``)."""
    p = ProgramBuilder("reducers")
    n, m = 2, 7
    x = p.input("x", (n, m), "f64", sign=sign)
    out = {name: p.output(name, (n,), "f64") for name in ("prod_exp", "min_abs", "max_sq", "max_x", "sum_x")}
    with p.nest("b_prod", i=n, j=reduce(m)) as (i, j):
        out["prod_exp"][i] = out["prod_exp"][i] * exp(x[i, j])
    with p.nest("b_min", i=n, j=reduce(m)) as (i, j):
        out["min_abs"][i] = minimum(out["min_abs"][i], abs(x[i, j]) + 1.0)
    with p.nest("b_max_sq", i=n, j=reduce(m)) as (i, j):
        out["max_sq"][i] = maximum(out["max_sq"][i], x[i, j] * x[i, j])
    with p.nest("b_max", i=n, j=reduce(m)) as (i, j):
        out["max_x"][i] = maximum(out["max_x"][i], x[i, j])
    with p.nest("b_sum", i=n, j=reduce(m)) as (i, j):
        out["sum_x"][i] = out["sum_x"][i] + x[i, j]
    return p.build()


def max_ratio(sign: str | None = None):
    """A max consumer rescaled by ``r0/r0'``: Eq. 4 needs r0 >= 0."""
    p = ProgramBuilder("max_ratio")
    n, m = 2, 7
    x = p.input("x", (n, m), "f64", sign=sign)
    r0, r1 = p.temp("r0", (n,), "f64"), p.output("r1", (n,), "f64")
    with p.nest("s0", i=n, j=reduce(m)) as (i, j):
        r0[i] = maximum(r0[i], x[i, j])
    with p.nest("s1", i=n, j=reduce(m)) as (i, j):
        r1[i] = maximum(r1[i], x[i, j] / r0[i])
    return p.build()


def test_signs_of_each_reducer():
    assert value_signs(reducers()) == {"prod_exp": "positive", "min_abs": "positive", "max_sq": "nonnegative"}
    declared = value_signs(reducers("positive"))
    assert declared["x"] == "positive" and declared["max_x"] == "positive" and declared["sum_x"] == "positive"
    assert value_signs(reducers("nonnegative"))["sum_x"] == "nonnegative"


def _fused(recipe: str) -> Schedule:
    sch = Schedule(softmax_via_temp())
    loop = "j"
    if recipe == "tiles":
        sch.split(sch.loop("s_max", "j"), [None, 4])
        loop = "j_0"
    if recipe == "split_k":
        sch.split(sch.loop("s_max", "j"), [3, None])
        sch.split_k_update("s_sum", sch.loop("s_max", "j_0"))
    else:
        sch.rolling_update("s_sum", sch.loop("s_max", loop))
    return sch


@pytest.mark.parametrize("recipe", ["plain", "roll", "tiles", "split_k"])
def test_signs_survive_temporaries_and_fusion(recipe):
    """A sum of exponentials read through a temporary is > 0, and stays so once it is rolled (its update is
    repaired, no longer X = X + term), rolled over tiles (a combine of partials) or split (partials)."""
    program = softmax_via_temp() if recipe == "plain" else _fused(recipe).program
    signs = value_signs(program)
    assert signs["s"] == "positive" and signs["q"] == "nonnegative", signs
    if recipe == "plain":
        assert signs["e"] == "positive" and "mx" not in signs
    if recipe in ("tiles", "split_k"):
        assert signs["s_rf"] == "positive"


@pytest.mark.parametrize("recipe", ["roll", "tiles"])
def test_a_fused_producers_sign_reaches_the_proof(recipe):
    """q = Σ y²·s with s rolled: the proof of Eq. 4 for max(|y|/q) has q >= 0 (before, s's sign was lost with its
    reduce term and the refusal was 'not provably >= 0'); what remains is the floating-point condition."""
    sch = _fused(recipe)
    loop = "j" if recipe == "roll" else "j_0"
    if recipe == "tiles":
        with pytest.raises(PolyfuseError):
            sch.rolling_update("s_q", sch.loop("s_max", loop))
        return
    sch.rolling_update("s_q", sch.loop("s_max", loop))
    with pytest.raises(NoRepairFound) as err:
        sch.rolling_update("s_c", sch.loop("s_max", loop))
    assert "not provably >= 0" not in str(err.value) and "exact in real arithmetic" in str(err.value)


def test_refusal_says_which_sign_is_missing_and_how_to_declare_it():
    sch = Schedule(max_ratio())
    with pytest.raises(NoRepairFound) as err:
        sch.rolling_update("s1", sch.loop("s0", "j"))
    msg = str(err.value)
    assert msg.startswith("rolling_update of block 's1' under loop 'j'")
    assert "the sign of r0 (block 's0') is unknown" in msg
    assert "p.input('x', …, sign='nonnegative' or 'positive') (checked at run time)" in msg
    assert "sch.rolling_update('s1', sch.loop(\"s0\", \"j\"), signs={'r0': 'positive'}) (not checked)" in msg
    sch.split(sch.loop("s0", "j"), [3, None])
    with pytest.raises(NoRepairFound, match=r"sch.split_k_update\('s1', sch.loop\(\"s0\", \"j_0\"\), signs="):
        sch.split_k_update("s1", sch.loop("s0", "j_0"))


def test_declared_input_sign_fuses_and_is_checked_on_every_backend():
    plain = max_ratio("positive")
    sch = Schedule(plain)
    sch.rolling_update("s1", sch.loop("s0", "j"))
    rng = np.random.default_rng(0)
    good = {"x": np.abs(rng.standard_normal((2, 7))) + 0.5}
    want = (good["x"] / good["x"].max(1)[:, None]).max(1)
    np.testing.assert_allclose(interpret(sch.program, good)["r1"], want, rtol=1e-12)
    bad = {"x": good["x"].copy()}
    bad["x"][1, 3] = -1.0
    runners = [lambda d: interpret(sch.program, d), lambda d: interpret(plain, d),
               lambda d: tiling.interpret(tiling.to_tiles(sch.program), d)]
    if shutil.which("g++"):
        from polyfuse.pipeline import build

        kernel = build(sch.program, "cpp")
        runners.append(lambda d: kernel.run(d))
    for run in runners:
        np.testing.assert_allclose(run(good)["r1"], want, rtol=1e-12)
        with pytest.raises(PolyfuseError, match=r"input 'x' is declared sign='positive', but its element \[1, 3\]"):
            run(bad)


def test_promises_are_traced_and_checked_for_form():
    plain = softmax_via_temp()
    sch = Schedule(plain)
    sch.rolling_update("s_sum", sch.loop("s_max", "j"), signs={"s": "positive"})
    assert "signs={'s': 'positive'}" in str(sch.trace)
    assert Schedule(plain).replay(sch.trace.to_json()).program == sch.program
    assert Schedule(plain).exec_python(str(sch.trace)).program == sch.program
    for signs, pattern in [({"s": "big"}, "a sign is 'positive' or 'nonnegative'"),
                           ({"nope": "positive"}, "names tensor 'nope', which program"),
                           ({"x": "positive"}, r"names input 'x': declare it on the input instead, "
                                               r"p.input\('x', …, sign='positive'\)")]:
        with pytest.raises(IllegalTransform, match=pattern):
            Schedule(plain).rolling_update("s_sum", Schedule(plain).loop("s_max", "j"), signs=signs)


def _signed_schedules():
    """Three programs whose fusion a sign fact makes legal: q's repair needs the rolled sum s >= 0 (through its
    temporary), the same over splits, and a max consumer rescaled by a declared-positive input's max."""
    rolled = _fused("roll")
    rolled.rolling_update("s_q", rolled.loop("s_max", "j"))
    split = _fused("split_k")
    ratio = Schedule(max_ratio("positive"))
    ratio.rolling_update("s1", ratio.loop("s0", "j"))
    return {"rolled": rolled, "split_k": split, "declared": ratio}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rolled", "split_k", "declared"])
def test_sign_enabled_fusions_run_on_the_gpu(name):
    from polyfuse.differential import check_schedule
    from polyfuse.errors import BackendUnavailable
    from polyfuse.pipeline import build

    sch = _signed_schedules()[name]
    plain = sch.original
    rng = np.random.default_rng(11)
    sets = []
    for scale in (1.0, 1e-30, 1e30):
        inputs = {t.name: rng.standard_normal(tuple(int(d.value) for d in t.shape)) * scale for t in plain.inputs}
        if name == "declared":
            inputs = {k: np.abs(v) + scale for k, v in inputs.items()}
        sets.append(inputs)
    try:
        kernel = build(sch.program, "cuda", werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    report = check_schedule(plain, sch.program, sets, backends=("tile", "cuda"))
    assert not report.findings, "\n".join(f.line() for f in report.findings)
    if name == "declared":
        bad = {"x": sets[0]["x"].copy()}
        bad["x"][1, 3] = -1.0
        with pytest.raises(PolyfuseError, match=r"input 'x' is declared sign='positive', but its element \[1, 3\]"):
            kernel.run(bad)
