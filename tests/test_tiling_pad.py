"""Padded rows (polyfuse.tiling.pad): the ragged last tile of a parallel axis computed whole on GPUs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.ir.stmt import INPUT, OUTPUT
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.tiling import to_tiles
from polyfuse.tiling.gpu import gpu_stages
from polyfuse.tiling.htile import Reduce, TileLoad, TileStore, tile_expr_str, walk_tile_expr, walk_tile_stmts
from polyfuse.tiling.interpreter import interpret
from polyfuse.tiling.pad import pad_rows

# Sizes whose row tiles are ragged (the last tile holds fewer rows than the tile).
CASES = [
    ("attn_global", "prefill", {"Sq": 40, "Skv": 40}),
    ("attn_causal", "prefill", {"Sq": 40, "Skv": 40}),
    ("attn_norm_inside", "prefill", {"Sq": 72, "Skv": 72}),
    ("attn_window", "prefill", {}),
    ("attn_gqa", "prefill", {"Sq": 40, "Skv": 40}),
    ("attn_global", "decode", {}),
    ("performer", "default", {}),
]


def _tiles(name: str, mode: str, sizes: dict):
    op = ops.get(name)
    sizes = {**op.sizes(mode), **sizes}
    program = default_schedule(name, mode, op.program(mode, **sizes), target="cuda").program
    return op, sizes, to_tiles(program)


def _row_guarded(e) -> bool:
    """Whether ``e`` tests the rows of the query tile ``i_0`` (the keys' tile ``j_0`` may be ragged too)."""
    return e is not None and "(i_0 * " in tile_expr_str(e)


@pytest.mark.parametrize(("name", "mode", "sizes"), CASES)
def test_padded_rows_change_no_bit_of_the_result(name, mode, sizes):
    # Every row the guard admits computes what it computed, on every input variant and magnitude; the
    # extra rows reach no output.
    op, sizes, tiles = _tiles(name, mode, sizes)
    padded = pad_rows(tiles)
    for variant in VARIANTS:
        for magnitude in (1.0, op.magnitudes[-1]):
            inputs = op.inputs(2, mode, sizes, magnitude, variant)
            before, after = interpret(tiles, inputs), interpret(padded, inputs)
            for out in before:
                np.testing.assert_array_equal(after[out], before[out], err_msg=f"{variant}, {magnitude}")


def test_attention_loop_statements_lose_the_row_guard_but_memory_keeps_it():
    _, _, tiles = _tiles("attn_global", "prefill", {"Sq": 40, "Skv": 40})
    padded = pad_rows(tiles)
    roles = {t.name: t.role for t in padded.tensors}
    stores = [s for s in walk_tile_stmts(padded.body) if isinstance(s, TileStore)]
    before = {s.block: s for s in walk_tile_stmts(tiles.body) if isinstance(s, TileStore)}
    assert any(_row_guarded(before[s.block].mask) for s in stores if roles[s.tensor.name] not in (INPUT, OUTPUT))
    for s in stores:
        if roles[s.tensor.name] == OUTPUT:
            assert s == before[s.block]  # out: its store and loads keep the guard
            assert s.mask is not None
            continue
        assert not _row_guarded(s.mask), s.block
        # the guard is left only where q's rows past the end would be read
        q_loads = [n for n in walk_tile_expr(s.value) if isinstance(n, TileLoad) and n.tensor.name == "q"]
        assert all(_row_guarded(n.mask) for n in q_loads)
        guards = sum(tile_expr_str(n.mask).count("(i_0 * ") for n in q_loads)
        assert tile_expr_str(s.value).count("(i_0 * ") == guards, s.block
    # With the guard gone, the GPU stages inline q·kᵀ into the score (one tile in registers, not two).
    inlined = dict(gpu_stages(tiles))["inline"]
    assert "qk" not in {t.name for t in inlined.tensors}


def test_a_statement_reducing_over_its_rows_keeps_the_guard():
    # A statement whose value reads other rows of its tile (here: a sum over the row axis, written into a
    # temporary) would see the extra rows: it keeps its guard, and so does every reader of what it writes.
    _, _, tiles = _tiles("attn_global", "prefill", {"Sq": 40, "Skv": 40})
    stores = [s for s in walk_tile_stmts(tiles.body) if isinstance(s, TileStore)]
    row_max = next(s for s in stores if s.block == "row_max")
    axis = row_max.index[-1].axis
    mixed = dataclasses.replace(row_max, value=Reduce("max", row_max.value, axis))
    tiles = dataclasses.replace(tiles, body=_replace(tiles.body, row_max, mixed))
    padded = pad_rows(tiles)
    after = next(s for s in walk_tile_stmts(padded.body) if isinstance(s, TileStore) and s.block == "row_max")
    assert after == mixed


def _replace(stmt, old, new):
    from polyfuse.ir.stmt import Loop, Seq

    if stmt is old:
        return new
    if isinstance(stmt, Loop):
        return stmt.replace(body=_replace(stmt.body, old, new))
    if isinstance(stmt, Seq):
        return stmt.replace(stmts=tuple(_replace(c, old, new) for c in stmt.stmts))
    return stmt


def test_tiles_that_divide_the_rows_are_left_alone():
    _, _, tiles = _tiles("attn_global", "prefill", {"Sq": 128, "Skv": 128})
    assert pad_rows(tiles) is tiles


@pytest.mark.parametrize(("sizes", "rows"), [
    ({"Sq": 4096, "Skv": 4096}, 192),    # 352 blocks of 192 rows: 3 waves × 192 less 16% against 4 × 128
    ({"Sq": 2048, "Skv": 2048}, 64),     # 2 waves × 192 less 16% > 2 × 128 > 2 waves of two 64-row blocks less 4%
    ({"Sq": 3072, "Skv": 3072}, 192),    # 2 waves × 192 against 3 × 128 (and 3 waves of two 64-row blocks)
    ({"Sq": 16384, "Skv": 16384}, 192),  # 11 × 192 less 16% against 16 × 128
    ({"Sq": 300, "Skv": 300}, 64),       # fewer than two tiles of 192; one wave of 64-row blocks, two per SM
    ({"Sq": 3072, "Skv": 3072, "D": 128, "Dv": 128}, 128),  # a 128-wide value head: two warpgroups only
])
def test_wide_query_tiles_are_taken_by_the_wave_rule(sizes, rows):
    from polyfuse.device import PRESETS

    op = ops.get("attn_global")
    sizes = {**op.presets["prefill"], **sizes}
    program = default_schedule("attn_global", "prefill", op.program("prefill", **sizes), target="cuda",
                               device=PRESETS["sm_90a"]).program
    score = next(t for t in to_tiles(program).tensors if t.name == "score")
    assert score.shape[2].value == rows
    # Without the wide tiles and the paired ones, or on a device without warpgroup products, 128 rows.
    narrow = default_schedule("attn_global", "prefill", op.program("prefill", **sizes), target="cuda",
                              device=PRESETS["sm_90a"],
                              tuning=GpuTuning(prefill_wgmma_rows=(), prefill_pair_rows=None)).program
    assert next(t for t in to_tiles(narrow).tensors if t.name == "score").shape[2].value == 128


def test_a_batch_that_is_a_size_parameter_counts_as_one():
    # The generic kernel (one for every batch, as the benchmark builds it) takes the tile the rule gives B = 1.
    from polyfuse.device import PRESETS

    op = ops.get("attn_global")
    for s, rows in ((4096, 192), (2048, 64)):
        sizes = {**op.presets["prefill"], "Sq": s, "Skv": s}
        program = default_schedule("attn_global", "prefill", op.generic_program("prefill", "cuda", **sizes),
                                   target="cuda", device=PRESETS["sm_90a"]).program
        assert next(t for t in to_tiles(program).tensors if t.name == "score").shape[2].value == rows


def test_the_wider_tile_is_refused_where_it_would_lose_the_late_product():
    # The divide-inside form keeps its late P·V with 128 rows (240 registers per computing thread) but not with
    # 192 (160): there the wave rule's choice is overruled, the overlap being worth more than the tile.
    from polyfuse.device import PRESETS

    op = ops.get("attn_norm_inside")
    sizes = {**op.presets["prefill"], "Sq": 3072, "Skv": 3072}
    program = default_schedule("attn_norm_inside", "prefill", op.program("prefill", **sizes), target="cuda",
                               device=PRESETS["sm_90a"],
                               tuning=GpuTuning(hoist_divisors=False, prefill_pair_rows=None)).program
    assert next(t for t in to_tiles(program).tensors if t.name == "score").shape[2].value == 128
