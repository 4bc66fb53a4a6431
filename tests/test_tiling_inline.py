"""Inlining a dot's temporary into its single reader (polyfuse.tiling.inline), used by the GPU emitters."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.tiling import to_tiles
from polyfuse.ir.expr import BinOp
from polyfuse.ir.stmt import Loop, Seq
from polyfuse.tiling.htile import Dot, TileLoad, TileStore, walk_tile_expr, walk_tile_stmts
from polyfuse.tiling.inline import inline_products
from polyfuse.tiling.interpreter import interpret
from polyfuse.tiling.simplify import simplify_tiles

# Sizes that tile exactly (no ragged tiles, so the stores carry no masks).
CASES = [
    ("attn_causal", "prefill", {"Sq": 128, "Skv": 128}),
    ("attn_norm_inside", "prefill", {"Sq": 128, "Skv": 128}),
    ("attn_gqa", "prefill", {"Sq": 128, "Skv": 128}),
    ("attn_softcap", "prefill", {"Sq": 128, "Skv": 128}),
    ("attn_global", "decode", {"Skv": 512}),
    ("attn_mla_decode", "decode", {"Skv": 256}),
]


def _gpu_tiles(name: str, mode: str, sizes: dict):
    op = ops.get(name)
    sizes = {**op.sizes(mode), **sizes}
    program = default_schedule(name, mode, op.program(mode, **sizes), target="cuda").program
    return op, sizes, simplify_tiles(to_tiles(program))


def _names(tiles) -> set[str]:
    return {t.name for t in tiles.tensors}


@pytest.mark.parametrize(("name", "mode", "sizes"), CASES)
def test_inlining_changes_no_bit_of_the_result(name, mode, sizes):
    op, sizes, tiles = _gpu_tiles(name, mode, sizes)
    inlined = inline_products(tiles)
    for magnitude in (1.0, op.magnitudes[-1]):
        inputs = op.inputs(1, mode, sizes, magnitude)
        before, after = interpret(tiles, inputs), interpret(inlined, inputs)
        for out in before:
            np.testing.assert_array_equal(after[out], before[out])


def test_attention_prefill_keeps_no_product_temporary():
    _, _, tiles = _gpu_tiles("attn_causal", "prefill", {"Sq": 128, "Skv": 128})
    inlined = inline_products(tiles)
    assert _names(tiles) - _names(inlined) == {"qk", "pv_rf"}
    stores = {s.block: s for s in walk_tile_stmts(inlined.body) if isinstance(s, TileStore)}
    assert "qk" not in stores and "pv_rf" not in stores
    # The readers now hold the dots: score = mask(q·kᵀ·scale), pv = pv·exp(m_prev - m) + P·v.
    for block in ("score", "pv"):
        assert sum(isinstance(x, Dot) for x in walk_tile_expr(stores[block].value)) == 1
    assert not any(a[1] in ("qk", "pv_rf") for s in walk_tile_stmts(inlined.body)
                   if hasattr(s, "annotations") for a in s.annotations)


def test_a_temporary_read_twice_stays():
    _, _, tiles = _gpu_tiles("attn_causal", "prefill", {"Sq": 128, "Skv": 128})
    # score reads qk three times now (one more term): inlining would compute the dot thrice, so qk stays.
    stores = [s for s in walk_tile_stmts(tiles.body) if isinstance(s, TileStore)]
    qk_store = next(s for s in stores if s.tensor.name == "qk")
    score = next(s for s in stores if s.block == "score")
    qk_load = next(x for x in walk_tile_expr(score.value) if isinstance(x, TileLoad) and x.tensor.name == "qk")
    twice = dataclasses.replace(score, value=BinOp("+", score.value, BinOp("*", qk_load, qk_load)))
    inlined = inline_products(dataclasses.replace(tiles, body=_replace(tiles.body, score, twice)))
    assert "qk" in _names(inlined)
    assert [s.block for s in walk_tile_stmts(inlined.body) if isinstance(s, TileStore) and s.tensor.name == "qk"] \
        == [qk_store.block]


def test_ragged_tiles_keep_their_masked_temporaries():
    # At Sq = Skv = 40 the last tiles are ragged: the stores are masked and nothing is inlined.
    _, _, tiles = _gpu_tiles("attn_causal", "prefill", {})
    assert inline_products(tiles).tensors == tiles.tensors


def _replace(s, old, new):
    if s is old:
        return new
    if isinstance(s, Loop):
        return s.replace(body=_replace(s.body, old, new))
    if isinstance(s, Seq):
        return s.replace(stmts=tuple(_replace(c, old, new) for c in s.stmts))
    return s
