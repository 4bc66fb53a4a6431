"""The per-element rewrites of a fragment loop's values (polyfuse/emit_cpp/fragment_values.py): a positive
constant factor of a tile kept within an iteration moved into its readers, out of a max, and a select on a
condition constant along a reduced axis out of the reduction — each equal to the program in IEEE arithmetic,
checked on NumPy values, and seen in the generated prefill kernels."""

from __future__ import annotations

import dataclasses

import re

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA
from polyfuse.emit_cpp.fragment_values import rewrite, scaled_tiles
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import INF, BinOp, Call, Const, Select, Var
from polyfuse.ir.stmt import Tensor
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import stages
from polyfuse.tiling.htile import Broadcast, Reduce, Slice, TileLoad, TileStore, tile_expr_str


ROW, COL = ("r", 4), ("c", 8)


def _tensor(name: str, *dims: int) -> Tensor:
    return Tensor(name, tuple(Const(d, dt.i32) for d in dims), dt.f32, "temp", "shared")


S, M, X = _tensor("s", 4, 8), _tensor("m", 4), _tensor("x", 4, 8)


def _load(t: Tensor) -> TileLoad:
    axes = (ROW, COL)[:len(t.shape)]
    return TileLoad(t, tuple(Slice(Const(0, dt.i32), size, axis) for axis, size in axes))


def _store(block: str, t: Tensor, value) -> TileStore:
    return TileStore(block, t, _load(t).index, value)


def _c(v: float) -> Const:
    return Const(v, dt.f32)


def _body(scale: float = 0.125, masked: bool = False, running: bool = False):
    """s = x·scale (or select(mask, -inf, x·scale)); m = reduce_max(s) (running: max(m, reduce_max(s)));
    y = Σ select(m == -inf, 0, exp(s - m))."""
    product = BinOp("*", _load(X), _c(scale))
    value = Select(BinOp(">", Var("j", dt.i32), Const(3, dt.i32)), _c(-INF), product) if masked else product
    s = _store("score", S, value)
    tile_max = Reduce("max", _load(S), "c")
    m = _store("row_max", M, BinOp("max", _load(M), tile_max) if running else tile_max)
    dead = Broadcast(BinOp("==", _load(M), _c(-INF)), (ROW, COL))
    shifted = Call("exp", (BinOp("-", _load(S), Broadcast(_load(M), (ROW, COL))),))
    y = _store("row_sum", M, Reduce("sum", Select(dead, Broadcast(_c(0.0), (ROW, COL)), shifted), "c"))
    return s, m, y


@pytest.mark.parametrize("masked", [False, True])
def test_a_positive_factor_moves_into_the_readers_and_out_of_the_max(masked):
    body = _body(masked=masked)
    ((y, c),) = scaled_tiles(body, frozenset({"s"})).values()
    assert c == 0.125 and "*" not in tile_expr_str(y)
    _, values = rewrite(body, "j", set(), frozenset({"s"}))
    text = {k: tile_expr_str(v) for k, v in values.items()}
    assert text["score"] == tile_expr_str(y)
    assert text["row_max"].startswith("(reduce_max(load(s") and text["row_max"].endswith("* 0.125)")
    assert "exp(((load(s[:4@r, :8@c]) * 0.125) - " in text["row_sum"]


def test_the_select_leaves_the_sum_once_per_row():
    _, values = rewrite(_body(), "j", set(), frozenset())
    text = tile_expr_str(values["row_sum"])
    assert text.startswith("select(") and "reduce_sum(exp(" in text


def test_the_guard_moves_onto_a_running_max_taken_over_the_same_tile():
    # m = max(m_old, reduce_max(s)) just before: where m is -inf every s is, exp(s - 0) = +0, the sum +0.
    _, values = rewrite(_body(running=True), "j", set(), frozenset({"s"}))
    text = tile_expr_str(values["row_sum"])
    assert text.startswith("reduce_sum(exp(((load(s[:4@r, :8@c]) * 0.125) - broadcast(select("), text
    # a max over another tile proves nothing about s: the guard stays
    other = _body(running=True)
    elsewhere = dataclasses.replace(other[1], value=BinOp("max", _load(M), Reduce("max", _load(X), "c")))
    _, values = rewrite((other[0], elsewhere, other[2]), "j", set(), frozenset())
    assert tile_expr_str(values["row_sum"]).startswith("select(")


@pytest.mark.parametrize(("scale", "per_iteration", "why"), [
    (-0.5, frozenset({"s"}), "a negative factor would turn the max into a min"),
    (0.125, frozenset(), "a tile that lives past the iteration keeps what memory holds"),
])
def test_left_alone(scale, per_iteration, why):
    assert not scaled_tiles(_body(scale=scale), per_iteration), why


def test_the_rewrites_are_equal_on_ieee_values():
    """max_j fl(c·x_j) = fl(c·max_j x_j) for c > 0, and Σ select(p, 0, x) = select(p, 0, Σ x) — on rows with ±inf,
    NaN, ties, zeros of both signs, subnormals that underflow when scaled, and huge values that overflow."""
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(64).astype(np.float32) * 1e3,
            np.array([-np.inf] * 64, np.float32),
            np.array([1.0, np.nan, 3.0] + [0.0] * 61, np.float32),
            np.array([5.0] * 64, np.float32),
            np.array([-0.0, 0.0] * 32, np.float32),
            np.array([1e-45, -0.0, 2e-45] * 21 + [0.0], np.float32),
            np.array([3e38, -3e38, 1.0] * 21 + [np.inf], np.float32)]
    for c in (np.float32(0.125), np.float32(0.0883883), np.float32(50.0)):
        for x in rows:
            with np.errstate(all="ignore"):
                scaled = (x * c).astype(np.float32)
                before = np.max(scaled) if not np.isnan(scaled).any() else np.float32(np.nan)
                after = np.float32(np.max(x) * c) if not np.isnan(x).any() else np.float32(np.nan)
            assert (np.isnan(before) and np.isnan(after)) or before == after
            for p in (True, False):
                with np.errstate(all="ignore"):
                    inside = np.sum(np.where(p, np.float32(0), np.exp(x - x.max())), dtype=np.float32)
                    outside = np.float32(0) if p else np.sum(np.exp(x - x.max()), dtype=np.float32)
                assert (np.isnan(inside) and np.isnan(outside)) or inside == outside


def _source(name: str, **sizes: int) -> str:
    op = ops.get(name)
    sizes = {**op.presets["prefill"], **sizes}
    sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=PRESETS["sm_90a"])
    return stages(sch, dataclasses.replace(CUDA, device=PRESETS["sm_90a"])).source.text


@pytest.mark.parametrize(("name", "factor"), [("attn_global", "0x1.0000000000000p-3f"),
                                              ("attn_causal", "0x1.6a09e60000000p-4f"),
                                              ("attn_softcap", "0x1.9000000000000p+5f")])
def test_prefill_scores_stay_unscaled_in_registers(name, factor):
    # The score tile holds q·kᵀ (softcap: tanh(q·kᵀ·c/50)); the row max is scaled once per row, each exp's
    # argument is score·c − max (one fused multiply-add where contracted) with the max read as 0 where it is
    # -inf, so neither the row sum nor P·V selects per element.
    lines = _source(name).splitlines()
    stores = [x for x in lines if re.search(r"pf_fr_score_\d+\[pf_nb\]\[pf_q\] = ", x)]
    assert stores and all(factor not in x for x in stores)
    assert any(f"* {factor}))" in x and re.search(r"pf_fr_row_max_\d+\[pf_h\] = ", x) for x in lines)
    assert any(re.search(rf"\(pf_fr_score_\d+\[pf_nb\]\[pf_q\] \* {re.escape(factor)}\) - \(\(pf_fr_row_max_\d+"
                         r"\[pf_h\] == \(-INFINITY\)\) \? 0x0.0p\+0f : pf_fr_row_max", x) for x in lines)
    sums = [x for x in lines if re.search(r"pf_acc\d+\[\(pf_nb \* 2 \+ pf_j\) % 4\] = \(pf_acc", x)]
    assert sums and not any("?" in x for x in sums)
