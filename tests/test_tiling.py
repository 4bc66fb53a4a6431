"""Loop -> tile translation: the catalog through the tile interpreter, the papers' examples, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse import ops, tiling
from polyfuse.cli.stages import Subject, check_backend
from polyfuse.errors import NoRepairFound, UntileableNest
from polyfuse.ir import INF, ProgramBuilder, const, exp, interpret, maximum, reduce, spatial
from polyfuse.ir.expr import BinOp, Expr
from polyfuse.ir.stmt import Loop
from polyfuse.ir.visit import map_expr, map_program_exprs
from polyfuse.tiling import Broadcast, Dot, Permute, Reduce, TileLoad, TileStore, axes_of, to_tiles
from polyfuse.tiling.htile import walk_tile_expr, walk_tile_stmts

SUBJECTS = [(name, mode) for name in ops.names() for mode in ops.get(name).modes]


def _stores(tp: tiling.TileProgram) -> dict[str, TileStore]:
    return {s.block: s for s in walk_tile_stmts(tp.body) if isinstance(s, TileStore)}


def _nodes(e: Expr, kind: type) -> list:
    return [n for n in walk_tile_expr(e) if isinstance(n, kind)]


def _loads(e: Expr) -> dict[str, TileLoad]:
    return {n.tensor.name: n for n in _nodes(e, TileLoad)}


# ------------------------------------------------------------------ the catalog

@pytest.mark.parametrize(("name", "mode"), SUBJECTS, ids=[f"{n}-{m}" for n, m in SUBJECTS])
def test_catalog_tile_backend_matches_reference(name: str, mode: str) -> None:
    subject = Subject.of(name, mode, {})
    try:
        subject.schedule()
    except NoRepairFound as err:
        pytest.skip(f"{name} does not fuse yet: {err}")
    for seed in (0, 1):
        for magnitude in subject.op.magnitudes:
            result = check_backend(subject, "tile", seed=seed, magnitude=magnitude)
            assert result.comparison.ok, f"{name} {mode} seed={seed} magnitude={magnitude}: {result.comparison.line()}"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_fused_attention_uses_dot_and_reduce(mode: str) -> None:
    tp = to_tiles(Subject.of("attn_causal", mode, {}).schedule().program)
    stores = _stores(tp)
    qk = stores["qk"].value
    assert isinstance(qk, Dot) and qk.axis == "d"
    # Q·Kᵀ: k is loaded [j, d] (tensor order) and reconciled to [d, j] for the dot
    (k_load,) = [ld for ld in _nodes(qk.b, TileLoad) if ld.tensor.name == "k"]
    assert axes_of(k_load)[-1] == "d" and axes_of(qk.b)[0] == "d"
    assert _nodes(qk.b, Permute)
    pv = [d for d in _nodes(stores["pv_rf"].value, Dot)]
    assert len(pv) == 1 and "v" in _loads(pv[0].b)
    assert [r.op for r in _nodes(stores["row_max" if mode == "prefill" else "row_max_rf"].value, Reduce)
            if r.op != "or"] == ["max"]
    assert [r.op for r in _nodes(stores["row_sum_rf"].value, Reduce) if r.op != "or"] == ["sum"]
    # no scalar loop inside a tile: every loop left is above the tile statements, none binds a tile axis
    tile_axes = {a for s in stores.values() for ld in _nodes(s.value, TileLoad) for a in axes_of(ld)}
    assert not tile_axes & {s.var.name for s in walk_tile_stmts(tp.body) if isinstance(s, Loop)
                            and not isinstance(s.body, Loop) and s.var.name in {"d", "j_1", "i_1"}}
    text = str(tp)
    assert "dot(" in text and "reduce_max(" in text and "reduce_sum(" in text


def test_stage_text_and_backend_registered() -> None:
    from polyfuse.cli.stages import BACKENDS, STAGES

    text = STAGES["tile"](Subject.of("softmax", None, {}))
    assert "store(" in text and "tile program softmax" in text
    assert "tile" in BACKENDS


# ------------------------------------------------------------------ papers' examples

def _check_against_loops(program, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    inputs = {t.name: rng.standard_normal([int(d.value) for d in t.shape]).astype(np.float32)
              for t in program.inputs}
    want = interpret(program, inputs)
    got = tiling.interpret(to_tiles(program), inputs)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_neptune_fig5_three_nests() -> None:
    """Neptune Fig. 5: elementwise, row reduction, and a nest with a broadcast and a transpose."""
    n, t = 8, 4
    p = ProgramBuilder("fig5")
    x = p.input("x", (n, n), "f32")
    x1d = p.input("x1d", (n // t, t), "f32")
    xtrans = p.input("xtrans", (n, n), "f32")
    y1 = p.output("y1", (n, n), "f32")
    y2 = p.output("y2", (n,), "f32")
    y3 = p.output("y3", (n, n), "f32")
    with p.loop("i0", n // t) as i0, p.loop("j0", n // t) as j0:
        with p.loop("i1", t) as i1, p.loop("j1", t) as j1:
            with p.block("y1", vi=spatial(n, i0 * t + i1), vj=spatial(n, j0 * t + j1)) as (vi, vj):
                y1[vi, vj] = exp(x[vi, vj])
        with p.loop("i1", t) as i1, p.loop("j1", t) as j1:
            with p.block("y2", vi=spatial(n, i0 * t + i1), vj=reduce(n, j0 * t + j1)) as (vi, vj):
                y2[vi] = maximum(y2[vi], x[vi, vj])
        with p.loop("i1", t) as i1, p.loop("j1", t) as j1:
            with p.block("y3", vi=spatial(n, i0 * t + i1), vj=spatial(n, j0 * t + j1)) as (vi, vj):
                y3[vi, vj] = x1d[vi // t, vi % t] * xtrans[vj, vi]  # x1d[i0, i1]
    program = p.build()
    tp = to_tiles(program)
    stores = _stores(tp)
    assert set(stores) == {"y1", "y2", "y3"}
    assert axes_of(stores["y1"].value) == ("i1", "j1")
    (red,) = [r for r in _nodes(stores["y2"].value, Reduce) if r.op == "max"]
    assert red.axis == "j1" and axes_of(red) == ("i1",)
    v3 = stores["y3"].value
    assert isinstance(v3, BinOp) and v3.op == "*"
    assert axes_of(_loads(v3)["xtrans"]) == ("j1", "i1")          # tensor order
    assert isinstance(v3.b, Permute) and v3.b.order == ("i1", "j1")  # reconciled to loop order
    assert isinstance(v3.a, Broadcast) and axes_of(v3.a) == ("i1", "j1")  # x1d[i0, i1]: (None, i1) + new j1
    assert axes_of(_loads(v3)["x1d"]) == ("i1",)
    assert all(isinstance(s, Loop) for s in (tp.body, tp.body.body))  # i0, j0 stay scalar
    _check_against_loops(program)


def test_earlier_fig4_transpose_and_row_max() -> None:
    """Earlier version's Fig. 4: ``exp2d = exp(permute(inp))`` then a row max over the tile."""
    nn, mm, r, c = 2, 3, 4, 2
    p = ProgramBuilder("fig4")
    inp = p.input("inp", (mm * c, nn * r), "f32")
    exp2d = p.temp("exp2d", (nn * r, mm * c), "f32")
    max1d = p.output("max1d", (nn * r,), "f32")
    with p.loop("i", nn) as i, p.loop("j", mm) as j:
        with p.loop("r", r) as rr, p.loop("c", c) as cc:
            with p.block("exp2d", a=spatial(nn * r, i * r + rr), b=spatial(mm * c, j * c + cc)) as (a, b):
                exp2d[a, b] = exp(inp[b, a])
        with p.loop("r", r) as rr, p.loop("c", c) as cc:
            with p.block("max1d", a=spatial(nn * r, i * r + rr), b=reduce(mm * c, j * c + cc)) as (a, b):
                max1d[a] = maximum(max1d[a], exp2d[a, b])
    program = p.build()
    stores = _stores(to_tiles(program))
    e = stores["exp2d"].value
    assert axes_of(e) == ("r", "c") and _nodes(e, Permute)
    assert axes_of(_loads(e)["inp"]) == ("c", "r")
    (red,) = [x for x in _nodes(stores["max1d"].value, Reduce) if x.op == "max"]
    assert red.axis == "c" and axes_of(_loads(red)["exp2d"]) == ("r", "c")
    _check_against_loops(program)


def test_earlier_fig14_privatized_rolling_softmax() -> None:
    """Earlier version's Fig. 14: partial max/sum tiles over j2 inside the scalar rolling loops i, j1."""
    p = ProgramBuilder("fig14")
    inputs = p.input("inputs", (2, 4), "f32")
    xmax_1p = p.temp("xmax_1p", (2, 2), "f32")
    xmax_0 = p.temp("xmax_0", (2,), "f32")
    xmax_1 = p.temp("xmax_1", (2,), "f32")
    xsump = p.temp("xsump", (2, 2), "f32")
    xsum = p.output("xsum", (2,), "f32")
    with p.loop("i", 2) as i:
        with p.block("xmax_0_init", a=spatial(2, i)) as (a,):
            xmax_0[a] = const(-INF, "f32")
        with p.loop("j1", 2) as j1:
            with p.loop("j2", 2) as j2:
                with p.block("xmax_1p", a=spatial(2, i), b=spatial(2, j1), k=reduce(2, j2)) as (a, b, k):
                    xmax_1p[a, b] = maximum(xmax_1p[a, b], inputs[a, b * 2 + k])
            with p.block("xmax_1", a=spatial(2, i), b=reduce(2, j1)) as (a, b):
                xmax_1[a] = maximum(xmax_1[a], xmax_1p[a, b])
            with p.loop("j2", 2) as j2:
                with p.block("xsump", a=spatial(2, i), b=spatial(2, j1), k=reduce(2, j2)) as (a, b, k):
                    xsump[a, b] = xsump[a, b] + exp(inputs[a, b * 2 + k] - xmax_1[a])
            with p.block("xsum", a=spatial(2, i), b=reduce(2, j1), reducer="sum") as (a, b):
                xsum[a] = xsum[a] * exp(xmax_0[a] - xmax_1[a]) + xsump[a, b]
            with p.block("xmax_0", a=spatial(2, i), b=spatial(2, j1)) as (a, b):
                xmax_0[a] = xmax_1[a]
    program = p.build()
    tp = to_tiles(program)
    stores = _stores(tp)
    for name, op in (("xmax_1p", "max"), ("xsump", "sum")):
        (red,) = [x for x in _nodes(stores[name].value, Reduce) if x.op == op]
        assert red.axis == "j2" and axes_of(_loads(red)["inputs"]) == ("j2",)
    for name in ("xmax_0", "xmax_1", "xsum"):
        assert axes_of(stores[name].value) == ()
    assert isinstance(tp.body, Loop) and tp.body.var.name == "i"  # i and j1 stay scalar loops
    assert [s.var.name for s in walk_tile_stmts(tp.body) if isinstance(s, Loop)] == ["i", "j1"]
    _check_against_loops(program)


# ------------------------------------------------------------------ refusals

def _diag_program(kind: str):
    p = ProgramBuilder(f"bad_{kind}")
    x = p.input("x", (16,) if kind == "product" else (4, 4), "f32")
    y = p.output("y", (4, 4), "f32")
    with p.loop("i1", 4) as i1, p.loop("i2", 4) as i2:
        with p.block("bad", a=spatial(4, i1), b=spatial(4, i2)) as (a, b):
            y[a, b] = x[a + b] if kind == "product" else x[a, a]
    program = p.build()
    if kind == "product":  # the builder refuses x[a * b] itself; the translator must too
        def to_product(e: Expr) -> Expr:
            return map_expr(e, lambda n: BinOp("*", n.a, n.b) if isinstance(n, BinOp) and n.op == "+" else None)
        program = map_program_exprs(program, to_product)
    return program


def test_inner_var_used_twice_is_untileable() -> None:
    with pytest.raises(UntileableNest, match=r"block 'bad'.*x\[i1, i1\].*i1 in dimensions 0 and 1"):
        to_tiles(_diag_program("diagonal"))


def test_nonlinear_access_is_untileable() -> None:
    with pytest.raises(UntileableNest, match=r"block 'bad'.*x\[i1 \* i2\].*not affine"):
        to_tiles(_diag_program("product"))
