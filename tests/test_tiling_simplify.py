"""``simplify_tiles``: existential masks (``reduce_or``) become scalar tests, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse import ops, tiling
from polyfuse.ir import dtypes as dt
from polyfuse.ir.affine import linear_form
from polyfuse.ir.expr import BinOp, Const, Var
from polyfuse.ops.schedules import default_schedule, has_default_schedule
from polyfuse.tiling.htile import Broadcast, Iota, Reduce, TileStore, walk_tile_expr, walk_tile_stmts
from polyfuse.tiling.simplify import simplify_tiles

FUSED = [(n, m) for n in ops.names() for m in ops.get(n).modes if has_default_schedule(n, m) and n != "quant_gemm_fp8"]


def _or_reductions(program) -> int:
    found = 0
    for s in walk_tile_stmts(program.body):
        if isinstance(s, TileStore):
            for e in [s.value] + ([s.mask] if s.mask is not None else []):
                found += sum(isinstance(x, Reduce) and x.op == "or" for x in walk_tile_expr(e))
    return found


@pytest.mark.parametrize(("name", "mode"), FUSED)
@pytest.mark.parametrize("target", ["cpp", "cuda"])
def test_simplified_program_is_bitwise_equal(name, mode, target):
    op = ops.get(name)
    sizes = op.sizes(mode)
    program = tiling.to_tiles(default_schedule(name, mode, op.program(mode, **sizes), target=target).program)
    simple = simplify_tiles(program)
    assert _or_reductions(simple) == 0
    inputs = op.inputs(0, mode, sizes, op.magnitudes[-1])
    before, after = tiling.interpret(program, inputs), tiling.interpret(simple, inputs)
    for k in before:
        assert np.array_equal(before[k], after[k], equal_nan=True), k


def test_first_tile_test_becomes_a_loop_variable_test():
    j0 = Var("j_0", dt.i32)
    first = BinOp("==", BinOp("+", BinOp("*", j0, Const(16, dt.i32)), Iota("j_1", 16)), Const(0, dt.i32))
    from polyfuse.tiling.simplify import _rewrite

    out = _rewrite(Reduce("or", first, "j_1"))
    assert isinstance(out, BinOp) and out.op == "==" and out.b == Const(0, dt.i32)
    assert linear_form(out.a) in ({"j_0": 1}, {"j_0": -1})  # exactly "the first key tile"
    assert not any(isinstance(x, (Reduce, Iota)) for x in walk_tile_expr(out))


def test_unsatisfiable_and_trivial_quantifiers():
    from polyfuse.tiling.simplify import _rewrite

    never = BinOp(">", Iota("d", 8), Const(100, dt.i32))
    always = BinOp("<", Iota("d", 8), Const(100, dt.i32))
    assert _rewrite(Reduce("or", never, "d")) == Const(False, dt.bool_)
    assert _rewrite(Reduce("or", always, "d")) == Const(True, dt.bool_)
    rows = Broadcast(BinOp("<", Iota("i", 4), Const(3, dt.i32)), (("i", 4), ("d", 8)))
    kept = _rewrite(Reduce("or", BinOp("and", rows, Broadcast(always, (("i", 4), ("d", 8)))), "d"))
    assert not any(isinstance(x, Reduce) for x in walk_tile_expr(kept))


def test_non_affine_conditions_are_left_alone():
    from polyfuse.tiling.simplify import _rewrite

    square = BinOp("==", BinOp("*", Iota("d", 8), Iota("d", 8)), Const(4, dt.i32))
    assert _rewrite(Reduce("or", square, "d")) is None
